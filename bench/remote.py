"""Remote engine benchmark: codectx on llama.cpp's `llama-server`, against the peers the issue names.

One `llama-server` (built by scripts/build-llama-server.sh; one slot, so every request meets
the same cache) on the default model's GGUF, the repository of a real PyPI package
(`itsdangerous` 2.2.0, as `bench/answers.py`) and `codectx ask`'s core (`repo_session`,
`features.ask.ask`) on a `RemoteBackend`. In order, in one run:

1. team: developer A's first ask on checkout A (cold server), then developer B's first ask on
   checkout B, a copy of the same files at another path; once with four language servers
   (`codectx serve`, two per checkout, warm-up off, a fresh engine server), once with the
   core's sessions. Goal: B's TTFT <= 0.1x A's.
Focus is off (after the prefix the prompt is the hot tail and the question only).

2. edit then ask: a Python file in the middle of the stable prefix gets a line; A asks again (the hot
   tail: the prefix stays, the edited file's current text follows it). Peer: a client that
   sends the repository with the edit in place (a fresh session on an edited copy: what a chat
   client without codectx's layout sends), same server, same question. Goals: codectx's
   recomputed tokens (server-reported) <= the edited file + the question; TTFT >= 5x lower.
3. decode: tokens/s of the answers on the server against the in-process engine on this
   machine (`start_backend`, the same question on checkout A).

Prints a table and writes JSON to bench/results/.

    python bench/remote.py [--max-tokens 48]
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import machine, markdown_table, write_json  # noqa: E402
from bench.answer_questions import install_package  # noqa: E402

QUESTIONS = ("What does the function want_bytes in encoding.py return?",
             "Which class does URLSafeSerializer inherit from?",
             "What does Signer.get_signature return?")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="itsdangerous")
    parser.add_argument("--version", default="2.2.0")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--venvs", type=Path, default=Path(tempfile.gettempdir()) / "codectx-bench-venvs")
    return parser.parse_args(argv)


async def ask_once(settings, backend, repo: Path, question: str, max_tokens: int, edit=None) -> dict:
    """One ask through the core on `repo` (after `edit(session)` when given); its metrics."""
    from server.ask_cmd import repo_session
    from server.core.features.ask import ask

    session, tools = await asyncio.to_thread(repo_session, settings, backend, repo, question, max_tokens)
    if edit is not None:
        edit(session)
    result = await ask(session, question, on_text=lambda _t: None, tools=tools, max_tokens=max_tokens)
    m = result.metrics
    decode_s = m.get("decode_s") or 0.0
    return {"prompt": m["prompt_tokens"], "cached": m["cached_tokens"], "recomputed": m["recomputed_tokens"],
            "ttft_s": m["ttft_s"], "decode_tokens": m["decode_tokens"],
            "decode_tps": m["decode_tokens"] / decode_s if decode_s else None, "finish": result.finish_reason,
            "layout": [(str(s.kind), s.key, len(s.token_ids)) for s in session.prompt.prefix_segments()]}


def middle_file(layout: list[tuple[str, str, int]], most_tokens: int = 800) -> tuple[str, int]:
    """The whole file nearest the middle of the prefix with at most `most_tokens` tokens: (path, tokens)."""
    files = [(key, n) for kind, key, n in layout if kind == "file" and key.endswith(".py") and 100 <= n <= most_tokens]
    return files[len(files) // 2]


def add_line(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    at = len(lines) // 2
    path.write_text("".join(lines[:at] + ["# edited: a line added in the middle of the file\n"] + lines[at:]),
                    encoding="utf-8")


async def team_over_lsp(url: str, model_dir: Path, checkouts: list[Path], work: Path, max_tokens: int) -> dict:
    """Four language servers (`codectx serve`, two per checkout, warm-up off so the first ask
    is cold) on one engine server: each asks once, developer A's first, then B's, then the
    second client of each; metrics from the ask results."""
    from bench.lsp import Client

    options = {"model": {"name": str(model_dir)}, "engine": {"url": url}, "warmup": {"enabled": False},
               "hover": {"prefetch": 0, "prefetchHeads": False}, "memory": {"archiveEnabled": False}}
    clients = [Client(root, options, work / f"lsp-{n}.log") for n, root in enumerate(checkouts)]
    rows = {}
    try:
        for client in clients:
            await client.start()
        names = ("A, client 1 (cold server)", "B, client 1 (other checkout)", "A, client 2", "B, client 2")
        for name, client, question in zip(names, (clients[0], clients[2], clients[1], clients[3]),
                                          (*QUESTIONS, QUESTIONS[0])):
            result = await client.command("codectx.ask", question=question, maxTokens=max_tokens)
            m = result["metrics"]
            rows[f"team over LSP: {name}"] = {
                "prompt": m["prompt_tokens"], "cached": m["cached_tokens"], "recomputed": m["recomputed_tokens"],
                "ttft_s": m["ttft_s"], "decode_tokens": m["decode_tokens"], "decode_tps": m.get("decode_tps"),
                "finish": result["finishReason"], "layout": []}
    finally:
        for client in clients:
            await client.close()
    return rows


async def run(args: argparse.Namespace) -> dict:
    from engine.default_model import GGUF_NAME, ensure_default_model
    from server.core.backend import start_backend
    from server.core.settings import Settings
    from tests.server.remote_servers import start_llama_server

    source = install_package(args.package, args.version, args.venvs)
    model_dir = ensure_default_model(progress=True).directory
    work = Path(tempfile.mkdtemp(prefix="codectx-remote-"))
    checkouts = {}
    for name in ("alice/src/a", "bob/b", "peer/c"):
        checkouts[name] = work / name / args.package
        shutil.copytree(source, checkouts[name] / source.name)
    a, b, c = checkouts.values()
    rows: dict[str, dict] = {}
    process, url = start_llama_server(model_dir / GGUF_NAME, context=8192, slots=1)
    try:
        rows.update(await team_over_lsp(url, model_dir, [a, a, b, b], work, args.max_tokens))
    finally:
        process.kill()
        process.wait(timeout=30)
    process, url = start_llama_server(model_dir / GGUF_NAME, context=8192, slots=1)
    try:
        base = Settings()
        # Focus off: after the prefix, the prompt is the hot tail and the question only.
        settings = dataclasses.replace(base, engine=dataclasses.replace(base.engine, url=url),
                                       focus=dataclasses.replace(base.focus, enabled=False))
        remote = await asyncio.to_thread(start_backend, settings)
        try:
            q1, q2, q3 = QUESTIONS
            rows["team: A first ask (cold server)"] = await ask_once(settings, remote, a, q1, args.max_tokens)
            rows["team: B first ask (other checkout)"] = await ask_once(settings, remote, b, q2, args.max_tokens)
            edited, file_tokens = middle_file(rows["team: A first ask (cold server)"]["layout"])

            def edit(session) -> None:
                add_line(a / edited)
                session.prompt.mark_dirty(a / edited)

            rows["edit then ask: codectx (hot tail)"] = await ask_once(settings, remote, a, q3, args.max_tokens, edit)
            add_line(c / edited)
            rows["edit then ask: peer (edit in place)"] = await ask_once(settings, remote, c, q3, args.max_tokens)
        finally:
            remote.close()
    finally:
        process.kill()
        process.wait(timeout=30)
    local_settings = dataclasses.replace(settings, engine=Settings().engine)
    local = await asyncio.to_thread(start_backend, local_settings)
    try:
        rows["decode: in-process engine"] = await ask_once(local_settings, local, b, q2, args.max_tokens)
    finally:
        local.close()
    question_tokens = len(local.tokenizer.encode(q3))
    return {"machine": machine(), "package": f"{args.package}=={args.version}", "server": "llama-server "
            "(llama-cpp-python 0.3.36's llama.cpp), one slot", "edited_file": edited,
            "edited_file_tokens": file_tokens, "question_tokens": question_tokens, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = asyncio.run(run(args))
    rows = result["rows"]
    table = [[name, r["prompt"], r["cached"], r["recomputed"], r["ttft_s"] * 1000, r["decode_tokens"],
              r["decode_tps"], r["finish"]] for name, r in rows.items()]
    print(markdown_table(["case", "prompt tok", "cached", "recomputed", "TTFT ms", "decoded", "decode tok/s",
                          "finish"], table))
    team = rows["team: B first ask (other checkout)"]["ttft_s"] / rows["team: A first ask (cold server)"]["ttft_s"]
    lsp_team = (rows["team over LSP: B, client 1 (other checkout)"]["ttft_s"]
                / rows["team over LSP: A, client 1 (cold server)"]["ttft_s"])
    ours, peer = rows["edit then ask: codectx (hot tail)"], rows["edit then ask: peer (edit in place)"]
    server_tps = rows["team: B first ask (other checkout)"]["decode_tps"]
    local_tps = rows["decode: in-process engine"]["decode_tps"]
    print(f"\nteam: B's first TTFT / A's cold TTFT = {team:.3f} (core sessions), {lsp_team:.3f} (four LSP clients; "
          "goal <= 0.1)")
    print(f"edit ({result['edited_file']}, {result['edited_file_tokens']} tokens; question "
          f"{result['question_tokens']}): codectx recomputed {ours['recomputed']} (goal <= "
          f"{result['edited_file_tokens'] + result['question_tokens']} + framing), peer {peer['recomputed']}; "
          f"TTFT peer / codectx = {peer['ttft_s'] / ours['ttft_s']:.1f}x (goal >= 5x)")
    print(f"decode: server {server_tps:.1f} tok/s, in-process {local_tps:.1f} tok/s "
          f"({server_tps / local_tps:.1f}x)" if server_tps and local_tps else "decode: not measured")
    for r in rows.values():
        r.pop("layout")
    print(f"wrote {write_json('remote', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
