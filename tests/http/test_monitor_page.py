"""/monitor rendered by headless Chromium: its numbers equal /metrics, live requests show up.

The screenshot is kept as a test artifact in test-artifacts/http/ (ignored by git).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from html.parser import HTMLParser
from pathlib import Path

import pytest

from engine.request import Request
from tests.polling import wait_until

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "http"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--virtual-time-budget=3000"]


class MonitorDom(HTMLParser):
    """Collects `data-metric` texts and raw values, table rows (`data-id` rows, `data-field` cells)
    and the body's `data-*` attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: dict[str, str] = {}
        self.values: dict[str, str] = {}
        self.body: dict[str, str] = {}
        self.rows: dict[str, list[dict[str, str]]] = {"active": [], "recent": [], "outcomes": []}
        self._table: str | None = None
        self._target: tuple[dict, str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if "data-metric" in a and "data-value" in a:
            self.values[a["data-metric"]] = a["data-value"]
        if tag == "table" and a.get("id") in self.rows:
            self._table = a["id"]
        elif tag == "tr" and self._table and "data-id" in a:
            self.rows[self._table].append({"data-id": a["data-id"]})
        elif tag == "td" and self._table and "data-field" in a and self.rows[self._table]:
            self._target = (self.rows[self._table][-1], a["data-field"])
        elif "data-metric" in a:
            self._target = (self.metrics, a["data-metric"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        if tag in ("td", "div"):
            self._target = None

    def handle_data(self, data: str) -> None:
        if self._target is not None:
            store, key = self._target
            store[key] = store.get(key, "") + data.strip()


def chromium(url: str, tmp_path: Path, *args: str, width: int = 1400) -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "chromium is missing: scripts/dev-setup.sh installs it"
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    result = subprocess.run([binary, *CHROMIUM_FLAGS, f"--window-size={width},1000", f"--user-data-dir={profile}",
                             *args, url],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def rendered(api, tmp_path: Path, width: int = 1400) -> MonitorDom:
    dom = MonitorDom()
    dom.feed(chromium(api.url + "/monitor", tmp_path, "--dump-dom", width=width))
    return dom


def _chat(api, content: str, **extra) -> dict:
    with api.client() as http:
        return http.post("/v1/chat/completions", json={
            "model": api.model_id, "max_tokens": 6, **extra,
            "messages": [{"role": "system", "content": "Monitor test. " * 20}, {"role": "user", "content": content}]}).json()


def test_page_numbers_match_metrics(api, tmp_path):
    _chat(api, "first")
    second = _chat(api, "second")
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    with api.client() as http:
        assert http.post("/v1/chat/completions", content=b"not json",
                         headers={"Content-Type": "application/json"}).status_code == 400
    dom = rendered(api, tmp_path)
    metrics = api.metrics()
    assert len(dom.metrics) >= 15
    for name, text in dom.metrics.items():
        assert name in metrics, name
        assert int(dom.values[name]) == metrics[name], name
        if name.endswith("_bytes"):  # shown in KiB/MiB/GiB (test_bytes_are_shown_in_binary_units)
            assert re.fullmatch(r"\d+ B|\d+\.\d (KiB|MiB|GiB|TiB)", text), (name, text)
        else:
            assert int(text) == metrics[name], name
    recent = {row["data-id"]: row for row in dom.rows["recent"]}
    row = recent[second["id"]]
    assert row["id"] == second["id"]
    assert int(row["cached_tokens"]) == second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert int(row["prompt_tokens"]) == second["usage"]["prompt_tokens"]
    assert int(row["recomputed_tokens"]) == second["codectx"]["recomputed_tokens"]
    assert row["finish_reason"] in ("stop", "length") and row["miss_reason"] == second["codectx"]["miss_reason"]
    assert float(row["prefill_tps"]) == pytest.approx(second["codectx"]["prefill_tps"], abs=0.06)
    shown = {row["data-id"]: int(row["count"]) for row in dom.rows["outcomes"]}
    counted = {f"{kind}/{outcome}": value for name, value in metrics.items()
               if (m := re.fullmatch(r'codectx_requests_total\{kind="(\w+)",outcome="(\w+)"\}', name))
               for kind, outcome in [m.groups()]}
    assert shown == counted and sum(v for k, v in shown.items() if k.startswith("http/")) >= 2
    for field in ("prompt_tokens", "cached_tokens", "recomputed_tokens", "decode_tokens"):
        total = "codectx_http_completion_tokens_total" if field == "decode_tokens" else f"codectx_http_{field}_total"
        assert sum(int(r[field]) for r in dom.rows["recent"]) == metrics[total], field


def test_live_request_is_shown_and_screenshot_saved(api, tmp_path):
    """A request waiting behind a held engine worker is live on the page (deterministically)."""
    served = api.source.current()
    gate, held = threading.Event(), threading.Event()

    def hold(done: int, total: int) -> None:  # runs on the engine's worker thread
        held.set()
        gate.wait(60)

    blocker = served.backend.submit(Request(prompt_ids=served.tokenizer.encode("hold the worker " * 8), max_tokens=0),
                                    on_progress=hold)
    body = {"model": api.model_id, "max_tokens": 4, "stream": True,
            "messages": [{"role": "user", "content": "A question shown live on the monitor"}]}
    try:
        assert held.wait(60)
        with api.client() as http, http.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            request_id = json.loads(next(lines)[len("data: "):])["id"]
            dom = rendered(api, tmp_path)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shot = ARTIFACTS / "monitor.png"
            shot.unlink(missing_ok=True)
            chromium(api.url + "/monitor", tmp_path, f"--screenshot={shot}")
            gate.set()
            text = "".join(lines)
    finally:
        gate.set()
        blocker.result(60)
    print(f"monitor screenshot: {shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    active = [r for r in dom.rows["active"] if r["data-id"] == request_id]
    assert active and active[0]["phase"] == "queued" and active[0]["preview"].startswith("A question shown live")
    assert int(dom.metrics["codectx_http_active_requests"]) == 1
    assert "[DONE]" in text
    done = wait_until(lambda: next((r for r in api.state()["recent"] if r["id"] == request_id), None),
                      what="the live request to complete")
    assert done["queue_s"] > 0 and done["finish_reason"] in ("stop", "length")


def test_tables_fit_a_1280_pixel_window(api, tmp_path):
    """Long ids, model names and questions are cut with an ellipsis: nothing scrolls sideways."""
    for i in range(3):
        _chat(api, f"question {i}: " + "a_rather_long_identifier_without_spaces_" * 4)
    dom = rendered(api, tmp_path, width=1280)
    assert len(dom.rows["recent"]) >= 3
    scroll, client = int(dom.body["data-scroll-width"]), int(dom.body["data-client-width"])
    assert 1200 <= client <= 1280 and scroll <= client, (scroll, client)


BYTES = [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (5 * 1024**2, "5.0 MiB"),
         (2147483648, "2.0 GiB"), (3 * 1024**4, "3.0 TiB"), (5 * 1024**5, "5120.0 TiB")]


def test_bytes_are_shown_in_binary_units(tmp_path):
    """The page's one byte formatter (`formatBytes`, taken from the served page), run by Chromium."""
    from server.http.monitor import PAGE

    page = PAGE.read_text(encoding="utf-8")
    units = re.search(r"^const BYTE_UNITS = .*?;$", page, re.M).group(0)
    function = re.search(r"^function formatBytes\(bytes\) \{.*?^\}$", page, re.M | re.S).group(0)
    probe = tmp_path / "bytes.html"
    probe.write_text(f"<!doctype html><body><script>{units}\n{function}\n"
                     f"document.body.dataset.out = JSON.stringify({json.dumps([b for b, _ in BYTES])}.map(formatBytes));"
                     "</script></body>", encoding="utf-8")
    dom = MonitorDom()
    dom.feed(chromium(probe.as_uri(), tmp_path, "--dump-dom"))
    assert json.loads(dom.body["data-out"]) == [text for _, text in BYTES]
