"""Benchmark of the language server through a real LSP client over stdio.

Starts `codectx serve` (the default model unless --model) on a generated
fixture repository (a small package plus one 300-line module) and measures:

* ask cold vs warm: time to first token (first `codectx/stream` delta, at the
  client) of the first ask on a fresh server (warm-up off, no disk archive)
  and of later asks that reuse the prefix;
* hover on a warm prefix: first token (server side, from the hover request's
  arrival: `codectx.status` → `lastHover`; hovers do not stream), the engine's
  own TTFT (submit to first token) and the client's total, for model answers
  and for cached answers;
* edit a 300-line file, then hover at once (before warm-up) with
  `hover.useWarmPrefix` on (the default) and off; then after warm-up;
* hovers on definitions prepared in the background (`hover.prefetch`) after
  the file was opened (the other sessions run with `hover.prefetch` 0);
* the peer, in the same run: warm hovers on the same server, MLX end to end
  (the setting `compute.attention: "mlx"`: neither `engine.cpu_attention` nor `engine.cpu_forward`).

Each session also records the share of CPU time the hypervisor took (steal,
from /proc/stat): on a shared host the same work is slower when it is high.

Goals on this CPU: warm hover first token < 300 ms; hover first token after an
edit of a 300-line file < 1.5 s. Prints a table and writes JSON to bench/results/.

    python bench/lsp.py [--model smollm2-135m] [--hover-tokens 96] [--ask-tokens 32] [--no-peer]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import cpu_ticks, machine, markdown_table, steal_share, write_json  # noqa: E402

MODULES = 4
FUNCTIONS_PER_MODULE = 6
BIG_LINES = 300


def module_text(index: int) -> str:
    """A module of small functions, each calling one of the previous module."""
    lines = [f'"""Module {index}: arithmetic helpers for stage {index}."""', ""]
    if index:
        lines += [f"from pkg import mod{index - 1}", ""]
    for f in range(FUNCTIONS_PER_MODULE):
        call = f"mod{index - 1}.step{index - 1}_{f}(value)" if index else "value"
        lines += ["", f"def step{index}_{f}(value: int) -> int:",
                  f'    """Stage {index}, step {f}: scales and offsets the value."""',
                  f"    base = {call}", f"    return base * {f + 2} + {index}", ""]
    return "\n".join(lines) + "\n"


def big_text() -> str:
    """A 300-line module: a class with many short methods (~8 tokens a line)."""
    lines = ['"""Inventory records: a 300-line module for the edit benchmark."""', "",
             "", "class Inventory:", '    """Items and their counts."""', "",
             "    def __init__(self):", "        self.items = {}", ""]
    n = 0
    while len(lines) < BIG_LINES - 6:
        lines += [f"    def add_{n}(self, name):", f'        """Adds {n % 10}."""',
                  "        count = self.items.get(name, 0)", f"        self.items[name] = count + {n % 10}",
                  "        return self.items[name]", ""]
        n += 1
    lines += ["# (padding)"] * (BIG_LINES - 1 - len(lines))
    lines = lines[:BIG_LINES - 1] + ["# end of inventory"]
    return "\n".join(lines) + "\n"


def write_fixture(root: Path) -> Path:
    """Writes the fixture repository under `root`; returns the 300-line file."""
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text('"""The benchmark package."""\n', encoding="utf-8")
    for i in range(MODULES):
        (root / "pkg" / f"mod{i}.py").write_text(module_text(i), encoding="utf-8")
    big = root / "pkg" / "inventory.py"
    big.write_text(big_text(), encoding="utf-8")
    (root / "README.md").write_text("# bench fixture\n\nStages of arithmetic and an inventory.\n",
                                    encoding="utf-8")
    return big


class Client:
    """One `codectx serve` process and the notifications it sent."""

    def __init__(self, root: Path, options: dict, log: Path, env: dict | None = None) -> None:
        self.root, self.options, self.log, self.env = root, options, log, env
        self.lsp = LanguageClient("codectx-bench", "0.1")
        self.streams: list[tuple[float, dict]] = []
        self.warmth: list = []
        self.warm_event = asyncio.Event()
        self.prepared_event = asyncio.Event()
        self.prepared_target = 0
        self.heads_event = asyncio.Event()
        self.heads_target = 0
        self.hover_hits = 0

        @self.lsp.feature("codectx/stream")
        def on_stream(params):
            self.streams.append((time.perf_counter(), params))

        @self.lsp.feature("codectx/warmth")
        def on_warmth(params):
            self.warmth.append(params)
            if not hasattr(params, "prefilled") and params.warm:
                self.warm_event.set()
            prefetch = getattr(params, "hoverPrefetch", None)
            if self.prepared_target and prefetch is not None and prefetch.prepared >= self.prepared_target:
                self.prepared_event.set()
            if self.heads_target and prefetch is not None and prefetch.startsPrepared >= self.heads_target:
                self.heads_event.set()

        @self.lsp.feature(types.WINDOW_SHOW_MESSAGE)
        def on_message(params):
            print(f"server says: {params.message}", file=sys.stderr)

    async def start(self) -> float:
        started = time.perf_counter()
        await self.lsp.start_io(sys.executable, "-m", "server.serve_cmd", "--log-file", str(self.log), cwd=str(ROOT),
                                env=None if self.env is None else {**os.environ, **self.env})
        await self.lsp.initialize_async(types.InitializeParams(
            capabilities=types.ClientCapabilities(), root_uri=self.root.as_uri(),
            initialization_options=self.options))
        self.lsp.initialized(types.InitializedParams())
        await self.command("codectx.showContext")  # waits for the model load and the scan
        return time.perf_counter() - started

    async def command(self, name: str, **arguments):
        return await self.lsp.workspace_execute_command_async(
            types.ExecuteCommandParams(command=name, arguments=[arguments]))

    async def ask(self, question: str, max_tokens: int) -> dict:
        """Client-side first-token time and total of one ask, plus the engine metrics."""
        self.streams.clear()
        started = time.perf_counter()
        result = await self.command("codectx.ask", question=question, maxTokens=max_tokens, tools=False)
        total = time.perf_counter() - started
        first = next((t for t, p in self.streams if p.text), None)
        return row("ask", question, result["metrics"], total, None if first is None else first - started)

    def open(self, path: Path) -> str:
        self.lsp.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
            uri=path.as_uri(), language_id="python", version=1, text=path.read_text(encoding="utf-8"))))
        return path.as_uri()

    async def hover(self, kind: str, path: Path, name: str) -> dict:
        text = path.read_text(encoding="utf-8").splitlines()
        line = next(i for i, t in enumerate(text) if f"def {name}(" in t)
        position = types.Position(line, text[line].index(name) + 1)
        started = time.perf_counter()
        await self.lsp.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=path.as_uri()), position=position))
        total = time.perf_counter() - started
        state = await self.command("codectx.status")
        cached = state["counters"]["hoverCacheHits"] > self.hover_hits
        self.hover_hits = state["counters"]["hoverCacheHits"]
        if cached:
            return row(kind, name, None, total, None)
        return row(kind, name, state["lastMetrics"], total, state["lastHover"]["firstTokenS"])

    async def close(self) -> None:
        await self.lsp.shutdown_async(None)
        self.lsp.exit(None)
        await self.lsp.stop()


def row(kind: str, what: str, metrics: dict | None, total: float, first_token: float | None) -> dict:
    metrics = metrics or {}
    return {"case": kind, "what": what, "engine_ttft_ms": 1000 * metrics["ttft_s"] if metrics else None,
            "first_token_ms": None if first_token is None else 1000 * first_token,
            "total_ms": 1000 * total, "cached_tokens": metrics.get("cached_tokens"),
            "recomputed_tokens": metrics.get("recomputed_tokens"), "decode_tokens": metrics.get("decode_tokens"),
            "miss_reason": metrics.get("miss_reason")}


def options(args, warmup: bool, warm_prefix: bool = True, prefetch: int = 0, heads: bool = False) -> dict:
    return {"model": {"name": args.model}, "memory": {"archiveEnabled": False},
            "warmup": {"enabled": warmup, "debounceMs": args.debounce_ms},
            "hover": {"maxTokens": args.hover_tokens, "latencyBudgetMs": 600000, "useWarmPrefix": warm_prefix,
                      "prefetch": prefetch, "prefetchHeads": heads},
            "ask": {"maxTokens": args.ask_tokens}}


def edit(client: Client, uri: str, version: int, line: int) -> None:
    at = types.Position(line, 0)
    client.lsp.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=at, end=at), text=f"    # note {version}\n")]))


async def asks(args, root: Path, work: Path) -> tuple[list[dict], float]:
    client = Client(root, options(args, warmup=False), work / "asks.log")
    start_s = await client.start()
    rows = [await client.ask("What does step3_0 compute?", args.ask_tokens)]
    rows[0]["case"] = "ask (cold prefix)"
    for question in ("What does Inventory.add_3 return?", "Which module does mod3 import?"):
        rows.append(dict(await client.ask(question, args.ask_tokens), case="ask (warm prefix)"))
    await client.close()
    return rows, start_s


async def peer_hovers(args, root: Path, work: Path) -> list[dict]:
    """The peer: warm hovers on the same server, MLX end to end (`compute.attention: "mlx"`, which
    also turns `engine.cpu_forward` off). The case keeps its name for comparisons with older runs."""
    peer = {**options(args, warmup=True), "compute": {"attention": "mlx"}}
    client = Client(root, peer, work / "hover-peer.log")
    await client.start()
    await client.warm_event.wait()
    mod = root / "pkg" / f"mod{MODULES - 1}.py"
    client.open(mod)
    rows = [await client.hover("hover (warm prefix, MLX attention peer)", mod, name)
            for name in ("step3_1", "step3_2", "step3_3")]
    await client.close()
    return rows


async def prepared_hovers(args, root: Path, work: Path) -> tuple[list[dict], dict]:
    """Hovers on definitions the server prepared in the background (`hover.prefetch`) after
    the file was opened: the time until the user hovers is spent generating answers."""
    client = Client(root, options(args, warmup=True, prefetch=3), work / "hover-prepared.log")
    await client.start()
    await client.warm_event.wait()
    mod = root / "pkg" / f"mod{MODULES - 1}.py"
    client.prepared_target = 3
    opened = time.perf_counter()
    client.open(mod)
    await client.prepared_event.wait()
    prepared_s = time.perf_counter() - opened
    rows = [await client.hover("hover (prepared in the background)", mod, name)
            for name in ("step3_0", "step3_1", "step3_2")]
    await client.close()
    return rows, {"three_prepared_after_open_s": prepared_s}


async def head_hovers(args, root: Path, work: Path) -> tuple[list[dict], dict]:
    """Hovers on definitions whose answer heads were prefilled in the background
    (`hover.prefetchHeads` on, `hover.prefetch` 0: no answers are prepared)."""
    client = Client(root, options(args, warmup=True, heads=True), work / "hover-heads.log")
    await client.start()
    await client.warm_event.wait()
    mod = root / "pkg" / f"mod{MODULES - 1}.py"
    client.heads_target = FUNCTIONS_PER_MODULE
    opened = time.perf_counter()
    client.open(mod)
    await client.heads_event.wait()
    heads_s = time.perf_counter() - opened
    rows = [await client.hover("hover (answer head prepared)", mod, name) for name in ("step3_1", "step3_3", "step3_5")]
    await client.close()
    return rows, {"heads_prepared_after_open_s": heads_s}


async def hovers(args, root: Path, big: Path, work: Path, warm_prefix: bool, tag: str) -> tuple[list[dict], dict]:
    client = Client(root, options(args, warmup=True, warm_prefix=warm_prefix), work / f"hover-{tag}.log")
    started = time.perf_counter()
    await client.start()
    await client.warm_event.wait()
    ready_s = time.perf_counter() - started
    first_warmup = client.warmth[-1]
    mod = root / "pkg" / f"mod{MODULES - 1}.py"
    client.open(mod)
    uri = client.open(big)
    rows = []
    if warm_prefix:
        for name in ("step3_1", "step3_2", "step3_3"):
            rows.append(await client.hover("hover (warm prefix)", mod, name))
        rows.append(await client.hover("hover (cached answer)", mod, "step3_1"))
    client.warm_event.clear()
    edit(client, uri, 2, BIG_LINES // 2)
    label = "useWarmPrefix" if warm_prefix else "exact prefix"
    rows.append(await client.hover(f"edit 300 lines, hover at once ({label})", mod, "step3_4"))
    await client.warm_event.wait()
    after_edit = client.warmth[-1]
    rows.append(await client.hover("hover after the edit's warm-up", mod, "step3_5"))
    await client.close()
    info = {"ready_s": ready_s, "prefix_tokens": first_warmup.prefixTokens,
            "startup_warmup": vars_of(first_warmup.lastRun), "edit_warmup": vars_of(after_edit.lastRun)}
    return rows, info


def vars_of(value) -> dict:
    return value._asdict() if hasattr(value, "_asdict") else dict(value or {})


def median_of(rows: list[dict], case: str, key: str) -> float | None:
    values = [r[key] for r in rows if r["case"] == case and r[key] is not None]
    return statistics.median(values) if values else None


async def main_async(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="codectx-bench-lsp-") as tmp:
        work = Path(tmp)
        roots = {}
        for name in ("asks", "warm", "exact", "peer", "prepared", "heads"):  # one copy each: a workspace's state outlives its server
            roots[name] = work / f"repo-{name}"
            roots[name].mkdir()
            write_fixture(roots[name])
        big = Path("pkg") / "inventory.py"
        run = set(args.sessions.split(","))
        steal: dict[str, float | None] = {}

        async def session(name: str, coro, skipped):
            if name not in run:
                coro.close()
                return skipped
            before = cpu_ticks()
            result = await coro
            steal[name] = steal_share(before, cpu_ticks())
            return result

        ask_rows, start_s = await session("asks", asks(args, roots["asks"], work), ([], None))
        hover_rows, hover_info = await session(
            "warm", hovers(args, roots["warm"], roots["warm"] / big, work, True, "warm"), ([], None))
        exact_rows, exact_info = await session(
            "exact", hovers(args, roots["exact"], roots["exact"] / big, work, False, "exact"), ([], None))
        peer_rows = await session("peer", peer_hovers(args, roots["peer"], work), []) if args.peer else []
        prepared_rows, prepared_info = await session("prepared", prepared_hovers(args, roots["prepared"], work),
                                                     ([], None))
        head_rows, head_info = await session("heads", head_hovers(args, roots["heads"], work), ([], None))
    rows = ask_rows + hover_rows + exact_rows + peer_rows + prepared_rows + head_rows
    goals = {
        "warm_hover_first_token_ms": median_of(rows, "hover (warm prefix)", "first_token_ms"),
        "peer_warm_hover_first_token_ms": median_of(rows, "hover (warm prefix, MLX attention peer)", "first_token_ms"),
        "prepared_hover_total_ms": median_of(rows, "hover (prepared in the background)", "total_ms"),
        "head_prepared_hover_first_token_ms": median_of(rows, "hover (answer head prepared)", "first_token_ms"),
        "edit_then_hover_first_token_ms": median_of(
            rows, "edit 300 lines, hover at once (useWarmPrefix)", "first_token_ms"),
    }
    return {"machine": machine(), "args": vars(args), "server_start_s": start_s, "rows": rows,
            "hover_session": hover_info, "exact_session": exact_info, "prepared_session": prepared_info,
            "heads_session": head_info, "cpu_steal": steal,
            "goals": goals}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--hover-tokens", type=int, default=96)
    parser.add_argument("--ask-tokens", type=int, default=32)
    parser.add_argument("--debounce-ms", type=int, default=750)
    parser.add_argument("--sessions", default="asks,warm,exact,peer,prepared,heads",
                        help="which server sessions to run (comma-separated)")
    parser.add_argument("--no-peer", dest="peer", action="store_false",
                        help="skip the peer session (warm hovers, MLX end to end: compute.attention mlx)")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    headers = ["case", "what", "first token ms", "engine TTFT ms", "total ms", "cached tok", "recomputed tok",
               "decoded"]
    keys = ["case", "what", "first_token_ms", "engine_ttft_ms", "total_ms", "cached_tokens",
            "recomputed_tokens", "decode_tokens"]
    print(markdown_table(headers, [[r[k] for k in keys] for r in result["rows"]]))
    for name in ("hover_session", "exact_session"):
        info = result[name]
        if info is None:
            continue
        print(f"\n{name}: ready (load + scan + first warm-up) {info['ready_s']:.1f} s, prefix "
              f"{info['prefix_tokens']} tokens; start-up warm-up {info['startup_warmup']}; "
              f"warm-up after the edit {info['edit_warmup']}")
    if result["prepared_session"] is not None:
        print(f"\nprepared_session: {result['prepared_session']}")
    if result["heads_session"] is not None:
        print(f"heads_session: {result['heads_session']}")
    print("\nCPU time taken by the hypervisor (steal) per session: " + ", ".join(
        f"{name} {'–' if share is None else f'{100 * share:.0f}%'}" for name, share in result["cpu_steal"].items()))
    print(f"\ngoals: {result['goals']} (targets: warm hover < 300 ms, after an edit < 1500 ms)")
    print(f"wrote {write_json('lsp', result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
