"""Soak: one `codectx serve --stdio --http` process under mixed LSP and HTTP load, clean then abusive.

The server is the real one (LSP over stdio, the HTTP API on loopback, one engine) with a
tiny random-weight model by default, so the load is about the server's machinery, not the
model's speed. Two phases run back to back against the same process:

* clean: hovers, edits, asks and status over LSP; chat completions (plain and streamed)
  and /health over HTTP;
* abusive: the same, plus asks cancelled mid-flight, streams dropped after their first
  chunk, broken LSP frames, invalid params and impossible edit ranges, malformed and
  non-JSON HTTP bodies, foreign Host and Origin headers, and half-open connections.

The clean phase is the peer of the abusive one: the table compares their throughput and
latency, and reports the server's RSS, open file descriptors and threads at the start and end
of each phase. An *unexpected* outcome is a valid request that got no answer in time, a
JSON-RPC -32603, an HTTP 5xx other than the connection cap's 503, or a dropped connection.
Bounded in time and in requests; loopback only.

    python bench/soak.py [--seconds 90] [--max-requests 40000] [--model PATH|smollm2-135m] [--seed 0]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.soak_lsp import LspPeer  # noqa: E402
from bench.soak_report import Tally, percentile, report  # noqa: E402
from bench.lsp_wire import frame  # noqa: E402

TIMEOUT_S = 60.0
LISTENING = re.compile(r"codectx HTTP API on (http://\S+)")
MODULE = '''"""Stage {i}: helpers."""


def scale_{i}(value: int) -> int:
    """Scales a value for stage {i}."""
    return value * {f}


def offset_{i}(value: int) -> int:
    return scale_{i}(value) + {i}
'''


def write_workspace(root: Path, modules: int = 6) -> list[Path]:
    (root / "pkg").mkdir(parents=True)
    paths = []
    for i in range(modules):
        path = root / "pkg" / f"stage{i}.py"
        path.write_text(MODULE.format(i=i, f=i + 2), encoding="utf-8")
        paths.append(path)
    return paths


def process_sample(pid: int) -> dict[str, int]:
    """RSS (KiB), open file descriptors and threads of `pid`, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_kib": int(fields["VmRSS"].split()[0]), "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": int(fields["Threads"])}


# ----- LSP workers ------------------------------------------------------------------------------

async def lsp_valid(peer: LspPeer, tally: Tally, kind: str, method: str, params: Any) -> None:
    started = time.perf_counter()
    try:
        reply = await peer.call(method, params, TIMEOUT_S)
    except asyncio.TimeoutError:
        tally.add(kind, "unexpected: no answer")
        return
    error = reply.get("error")
    if error is None:
        tally.add(kind, "ok", time.perf_counter() - started)
    elif error["code"] == -32603:
        tally.add(kind, "unexpected: -32603")
    else:
        tally.add(kind, f"error {error['code']}")


async def lsp_ask(peer: LspPeer, tally: Tally, rng: random.Random, cancel: bool) -> None:
    params = {"command": "codectx.ask", "arguments": [{"question": "What does scale_1 do?", "maxTokens": 8,
                                                        "tools": False}]}
    if not cancel:
        await lsp_valid(peer, tally, "lsp ask", "workspace/executeCommand", params)
        return
    msg_id = await peer.request("workspace/executeCommand", params)
    await asyncio.sleep(rng.uniform(0.0, 0.3))  # a user pressing Stop after a random moment
    await peer.notify("$/cancelRequest", {"id": msg_id})
    try:
        reply = await peer.response(msg_id, TIMEOUT_S)
    except asyncio.TimeoutError:
        tally.add("lsp ask+cancel", "unexpected: no answer")
        return
    code = (reply.get("error") or {}).get("code")
    tally.add("lsp ask+cancel", "unexpected: -32603" if code == -32603 else
              ("cancelled" if code == -32800 else ("ok" if code is None else f"error {code}")))


BAD_FRAMES = {
    "length too short": lambda body: b"Content-Length: %d\r\n\r\n" % (len(body) - 5) + body,
    "length too long": lambda body: b"Content-Length: %d\r\n\r\n" % (len(body) + 7) + body,
    "garbage header": lambda body: b"Hello there\r\n\r\n" + frame(json.loads(body)),
    "no length": lambda body: b"Content-Type: x\r\n\r\n" + body,
    "absurd length": lambda body: b"Content-Length: 99999999999\r\n\r\n",
    "not json": lambda body: frame(b"{not json"),
}


async def lsp_abuse(peer: LspPeer, tally: Tally, rng: random.Random, uri: str) -> None:
    choice = rng.randrange(3)
    if choice == 0:
        name = rng.choice(sorted(BAD_FRAMES))
        body = json.dumps({"jsonrpc": "2.0", "method": "$/noop", "params": {}}).encode()
        await peer.send_raw(BAD_FRAMES[name](body))
        tally.add(f"lsp bad frame: {name}", "sent")
        return
    if choice == 1:
        bad = rng.choice([{"line": -1, "character": 0}, {"line": "x", "character": 0}, None,
                          {"line": 10**9, "character": 10**9}])
        started = time.perf_counter()
        msg_id = await peer.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": bad})
        try:
            reply = await peer.response(msg_id, TIMEOUT_S)
        except asyncio.TimeoutError:
            tally.add("lsp invalid params", f"unexpected: no answer (position {bad})")
            print(f"no answer to request {msg_id}; log lines naming it:",
                  [line for line in peer.stderr_tail(2000) if f"request {msg_id} " in line], file=sys.stderr)
            return
        code = (reply.get("error") or {}).get("code")
        tally.add("lsp invalid params", "unexpected: -32603" if code == -32603 else
                  ("answered" if code is None else f"error {code}"), time.perf_counter() - started)
        return
    await peer.notify("textDocument/didChange", {
        "textDocument": {"uri": uri, "version": 10**6},
        "contentChanges": [{"range": {"start": {"line": 3, "character": 5}, "end": {"line": 1, "character": 0}},
                            "text": "x"}]})
    tally.add("lsp impossible edit range", "sent")


# ----- HTTP workers -----------------------------------------------------------------------------

async def http_chat(client: httpx.AsyncClient, tally: Tally, stream: bool, drop: bool) -> None:
    body = {"model": "codectx", "messages": [{"role": "user", "content": "What does offset_2 do?"}],
            "max_tokens": 8, "stream": stream}
    kind = "http chat" + (" stream" if stream else "") + (" dropped" if drop else "")  # drop: streams only
    started = time.perf_counter()
    try:
        if not stream:
            response = await client.post("/v1/chat/completions", json=body, timeout=TIMEOUT_S)
            tally.add(kind, _http_outcome(response.status_code), time.perf_counter() - started)
            return
        async with client.stream("POST", "/v1/chat/completions", json=body, timeout=TIMEOUT_S) as response:
            async for _ in response.aiter_bytes():
                if drop:
                    break  # closing the stream early: the server must cancel the generation
            tally.add(kind, _http_outcome(response.status_code), time.perf_counter() - started)
    except httpx.HTTPError as err:
        tally.add(kind, f"unexpected: {type(err).__name__}")


def _http_outcome(status: int) -> str:
    if status == 200:
        return "ok"
    if status >= 500 and status != 503:
        return f"unexpected: {status}"
    return f"status {status}"


async def http_abuse(client: httpx.AsyncClient, tally: Tally, rng: random.Random, host: str, port: int) -> None:
    cases = [
        ("http invalid json", dict(content=b"{nope", headers={"Content-Type": "application/json"})),
        ("http text/plain", dict(content=b'{"model": "codectx"}', headers={"Content-Type": "text/plain"})),
        ("http deep nesting", dict(content=b"[" * 100_000 + b"]" * 100_000,
                                   headers={"Content-Type": "application/json"})),
        ("http foreign host", dict(json={"model": "codectx", "messages": []}, headers={"Host": "evil.example"})),
        ("http foreign origin", dict(json={"model": "codectx", "messages": []},
                                     headers={"Origin": "https://evil.example"})),
    ]
    kind, extra = rng.choice(cases)
    try:
        response = await client.post("/v1/chat/completions", timeout=TIMEOUT_S, **extra)
        tally.add(kind, _http_outcome(response.status_code))
    except httpx.HTTPError as err:
        tally.add(kind, f"unexpected: {type(err).__name__}")


async def half_open(host: str, port: int, tally: Tally) -> None:
    """A connection that sends part of a request head and waits; the server must cut it off."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    await writer.drain()
    started = time.perf_counter()
    try:
        await asyncio.wait_for(reader.read(), TIMEOUT_S)
        tally.add("http half-open", "closed by server", time.perf_counter() - started)
    except asyncio.TimeoutError:
        tally.add("http half-open", "unexpected: still open")
    finally:
        writer.close()


# ----- the run ----------------------------------------------------------------------------------

async def worker(deadline: float, tally: Tally, budget: list[int], action, pause: float) -> None:
    """Runs `action` one after another, `pause` seconds apart, until the phase ends."""
    while time.monotonic() < deadline and budget[0] > 0:
        budget[0] -= 1
        tally.sent += 1
        await action()
        await asyncio.sleep(pause)  # pacing: the same offered load in both phases


async def run_phase(phase: str, seconds: float, budget: list[int], peer: LspPeer, client: httpx.AsyncClient,
                    tally: Tally, rng: random.Random, uris: list[str], url: str) -> dict:
    tally.phase = phase
    abusive = phase == "abusive"
    deadline = time.monotonic() + seconds
    host, port = url.split("//")[1].split(":")
    hover = lambda: lsp_valid(peer, tally, "lsp hover", "textDocument/hover", {  # noqa: E731
        "textDocument": {"uri": rng.choice(uris)}, "position": {"line": rng.randrange(4, 10), "character": 6}})
    status = lambda: lsp_valid(peer, tally, "lsp status", "workspace/executeCommand",  # noqa: E731
                               {"command": "codectx.status", "arguments": []})
    ask = lambda: lsp_ask(peer, tally, rng, cancel=abusive and rng.random() < 0.5)  # noqa: E731
    async def chat() -> None:
        stream = rng.random() < 0.5
        await http_chat(client, tally, stream, drop=stream and abusive and rng.random() < 0.5)

    async def health() -> None:
        started = time.perf_counter()
        try:
            response = await client.get("/health", timeout=TIMEOUT_S)
            tally.add("http health", _http_outcome(response.status_code), time.perf_counter() - started)
        except httpx.HTTPError as err:
            tally.add("http health", f"unexpected: {type(err).__name__}")

    async def edit() -> None:
        uri = rng.choice(uris)
        await peer.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": peer.next_version(uri)},
                                                     "contentChanges": [{"range": {"start": {"line": 1, "character": 0},
                                                                                   "end": {"line": 1, "character": 0}},
                                                                         "text": "\n"}]})
        tally.add("lsp edit", "sent")

    # (action, pause in seconds): an editor's typing, hovering and status polling, a chat client,
    # a health check; in the abusive phase a hostile LSP client and a hostile web client besides.
    actions = [(hover, 0.02), (status, 0.1), (ask, 0.0), (chat, 0.0), (health, 0.2), (edit, 0.5)]
    if abusive:
        actions += [(lambda: lsp_abuse(peer, tally, rng, rng.choice(uris)), 0.02),
                    (lambda: http_abuse(client, tally, rng, host, int(port)), 0.05)]
        # Half-open connections hold until the server cuts them off: eight at a time.
        actions += [(lambda: half_open(host, int(port), tally), 0.5)] * 8
    before, started = process_sample(peer.pid), time.monotonic()
    samples: list[dict] = []
    sampler = asyncio.ensure_future(sample(peer, samples, started))
    await asyncio.gather(*(worker(deadline, tally, budget, action, pause) for action, pause in actions))
    sampler.cancel()
    after = process_sample(peer.pid)
    latencies = tally.latencies(phase)
    return {"phase": phase, "seconds": time.monotonic() - started, "before": before, "after": after,
            "p50_ms": percentile(latencies, 0.5), "p95_ms": percentile(latencies, 0.95),
            "answered_valid": len(latencies), "samples": samples}


async def sample(peer: LspPeer, samples: list[dict], started: float, every: float = 5.0) -> None:
    """Every `every` seconds: the server's RSS, descriptors and threads, and what its engine says
    its checkpoints hold (growth there is bounded by `memory.checkpointBytes`, not a leak)."""
    while True:
        row = {"t": round(time.monotonic() - started, 1), **process_sample(peer.pid)}
        try:
            reply = await peer.call("workspace/executeCommand", {"command": "codectx.status", "arguments": []}, 10)
            engine = (reply.get("result") or {}).get("engine") or {}
            cache, mlx = engine.get("cache") or {}, engine.get("mlx_memory") or {}
            row.update(checkpoint_kib=cache.get("checkpoint_bytes", 0) // 1024,
                       live_cache_kib=cache.get("live_cache_bytes", 0) // 1024,
                       mlx_active_kib=mlx.get("active_bytes", 0) // 1024, mlx_cache_kib=mlx.get("cache_bytes", 0) // 1024)
        except asyncio.TimeoutError:
            pass
        samples.append(row)
        await asyncio.sleep(every)


async def main_async(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="codectx-soak-") as tmp:
        tmp_path = Path(tmp)
        home = tmp_path / "home"
        home.mkdir(mode=0o700)
        model = args.model or str(build_model(tmp_path / "model"))
        files = write_workspace(tmp_path / "ws")
        peer = await LspPeer.start(home, ["--stdio", "--http", "127.0.0.1:0", "--log-level", "INFO"])
        try:
            url = await peer.wait_stderr(LISTENING, TIMEOUT_S)
            await peer.initialize(tmp_path / "ws", {
                "model": {"name": model, "prefillChunk": 64}, "ask": {"maxTokens": 8},
                "hover": {"maxTokens": 8, "prefetch": 0, "prefetchHeads": False},
                "warmup": {"debounceMs": 200},
                # A small checkpoint budget, reached within the first minute: after that, growth
                # of the process's memory is not the cache filling up.
                "memory": {"checkpointBytes": args.checkpoint_mib << 20}})
            await peer.wait_ready(300)
            uris = [await peer.open(path) for path in files]
            tally = Tally()
            async with httpx.AsyncClient(base_url=url) as client:
                phases = [await run_phase(phase, args.seconds, [args.max_requests // 2], peer, client, tally, rng,
                                          uris, url) for phase in ("clean", "abusive")]
                alive = await peer.call("workspace/executeCommand", {"command": "codectx.status", "arguments": []},
                                        TIMEOUT_S)
                health = (await client.get("/health", timeout=TIMEOUT_S)).status_code
        except (asyncio.TimeoutError, RuntimeError):
            print("the soak stopped early; the server's last log lines:", *peer.stderr_tail(40), sep="\n",
                  file=sys.stderr)
            raise
        finally:
            exit_code = await peer.shutdown()
    report(phases, tally, args, alive="result" in alive and health == 200, exit_code=exit_code,
           unreadable=peer.unreadable_frames)
    return 0


def build_model(directory: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.server.harness import build_server_test_model

    return build_server_test_model(directory)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90, help="length of each phase")
    parser.add_argument("--max-requests", type=int, default=40000, help="requests over both phases, at most "
                                                                        "(half each)")
    parser.add_argument("--model", help="model name or directory (default: a tiny random-weight llama)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-mib", type=int, default=8, help="the server's checkpoint memory budget")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
