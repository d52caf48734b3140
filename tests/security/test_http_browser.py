"""A real browser (headless Chromium) on a hostile page cannot use the loopback API.

Two attacks, each against the real server process:

* **Cross-origin**: a page from another origin (a stand-in for a web site we
  do not own: a static file server on another loopback port) sends the blind
  ``text/plain`` POST, a JSON POST and a read of /monitor/state.
* **DNS rebinding**: Chromium resolves ``rebind.test`` to 127.0.0.1
  (``--host-resolver-rules``), which is where a rebinding attack ends: the
  attacker's name, now pointing at the server, so the browser thinks it is
  same-origin and sends ``Host: rebind.test:PORT``.

The page's view is read from its DOM; the server's view from /metrics
(`codectx_http_refused_requests_total`) and /monitor/state (no request ever
reached the engine).
"""
from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from tests.security.http_process import HttpProcess

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--virtual-time-budget=5000",
         "--dump-dom"]
ATTACK = """<!doctype html><html><body><pre id="out">pending</pre><script>
const api = %(api)s, body = JSON.stringify(%(body)s), out = document.getElementById("out");
Promise.allSettled([
  fetch(api + "/v1/chat/completions", {method: "POST", mode: "no-cors", body,
                                       headers: {"Content-Type": "text/plain"}}).then(r => "blind post " + r.type),
  fetch(api + "/v1/chat/completions", {method: "POST", body, headers: {"Content-Type": "application/json"}})
    .then(r => r.text()),
  fetch(api + "/monitor/state").then(r => r.text()),
]).then(results => { out.textContent = JSON.stringify(results.map(r => r.status + ": " + (r.value || r.reason))); });
</script></body></html>"""


@pytest.fixture(scope="module")
def server(security_model, tmp_path_factory):
    running = HttpProcess.start(security_model, tmp_path_factory.mktemp("home"))
    yield running
    assert running.stop() == 0


def _chromium(url: str, profile: Path, *args: str) -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "chromium is missing: scripts/dev-setup.sh installs it"
    result = subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", *args, url],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _refused(server: HttpProcess, code: str) -> float:
    return server.metrics().get(f'codectx_http_refused_requests_total{{code="{code}"}}', 0.0)


@pytest.fixture()
def attacker_site(tmp_path, server):
    """The hostile page, served from another loopback port (another origin)."""
    body = {"model": server.model_id, "max_tokens": 2, "messages": [{"role": "user", "content": "Print the secret"}]}
    (tmp_path / "index.html").write_text(ATTACK % {"api": json.dumps(server.url), "body": json.dumps(body)})
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{site.server_address[1]}/index.html"
    site.shutdown()
    site.server_close()


def test_a_cross_origin_page_cannot_reach_the_model_or_read_state(server, attacker_site, tmp_path):
    before = httpx.get(server.url + "/monitor/state", timeout=30).json()["totals"]
    refused_before = _refused(server, "origin_not_allowed")
    dom = _chromium(attacker_site, tmp_path / "profile")
    results = json.loads(dom.split('<pre id="out">', 1)[1].split("</pre>", 1)[0].replace("&quot;", '"'))
    assert results[0] == "fulfilled: blind post opaque"  # the browser sent it; the page sees nothing
    assert all(r.startswith("rejected: TypeError") for r in results[1:]), results  # CORS: no allowance
    after = httpx.get(server.url + "/monitor/state", timeout=30).json()["totals"]
    assert after["requests"] == before["requests"] and after["prompt_tokens"] == before["prompt_tokens"]
    # Refused at the server: the blind POST, the JSON POST's preflight and the state read.
    assert _refused(server, "origin_not_allowed") >= refused_before + 3
    server.assert_answers()


def test_a_rebound_name_gets_403_instead_of_the_monitor(server, tmp_path):
    refused_before = _refused(server, "host_not_allowed")
    url = server.url.replace("127.0.0.1", "rebind.test") + "/monitor/state"
    dom = _chromium(url, tmp_path / "profile", "--host-resolver-rules=MAP rebind.test 127.0.0.1")
    assert "host_not_allowed" in dom and "--allow-host rebind.test" in dom
    assert '"model"' not in dom and "totals" not in dom
    assert _refused(server, "host_not_allowed") >= refused_before + 1
    server.assert_answers()
