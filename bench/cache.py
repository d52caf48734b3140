"""Checkpointed prefix cache vs mlx_lm.server's prompt cache, step by step, in one run.

Scenario on a repository prefix (a copy of a source tree laid out by
`context.Workspace` under a token budget): cold ask -> follow-up question ->
edit a file in the middle -> ask -> restart -> ask. For each step and each
system: prompt tokens, tokens restored from cache, tokens recomputed, time to
first token. codectx runs in process (`Engine` with the disk archive on);
mlx_lm.server runs as a subprocess on loopback with the same weights and its
OpenAI API (`/v1/completions`, streaming; the prompt is the same text).

    python bench/cache.py                                  # default model, ~6k-token prefix
    python bench/cache.py --tiny --prefix-tokens 30000     # tiny random long-context model
    python bench/cache.py --random-like ~/.cache/codectx/models/smollm2-135m   # same shape, random
    python bench/cache.py --no-peer                        # codectx only

Prints a Markdown table and writes JSON (default bench/results/cache-<model>-<tokens>.json).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "engine"))

import engine  # noqa: E402,F401  (optimized BLAS before MLX on Linux CPUs)

QUESTIONS = ("What does the code in this repository do? Answer briefly.",
             "Which function should I read first?",
             "What changed in the edited file?")


def source_tree(dest: Path) -> Path:
    """A private copy of codectx's own context/ and engine/ packages (edits stay in the copy)."""
    for pkg in ("context", "engine"):
        shutil.copytree(ROOT / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.scm"))
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    return dest


def random_like(source: Path, dest: Path) -> Path:
    """A model directory with `source`'s config and tokenizer and random float32 weights."""
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    dest.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, dest / name)
    config = json.loads((source / "config.json").read_text())
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(0)
    model = module.Model(module.ModelArgs.from_dict(config))
    weights = {k: v.astype(mx.float32) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(dest / "model.safetensors"), weights, metadata={"format": "mlx"})
    return dest


def to_request_segments(segments):
    from engine.request import PromptSegment

    return [PromptSegment(s.kind, s.key, tuple(s.token_ids), protected=s.protected) for s in segments]


class Peer:
    """mlx_lm.server as a subprocess on 127.0.0.1."""

    def __init__(self, model_dir: Path, chunk: int) -> None:
        self.model_dir, self.chunk, self.proc = model_dir, chunk, None

    def start(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlx_lm.server", "--model", str(self.model_dir), "--host",
             "127.0.0.1", "--port", str(self.port), "--prefill-step-size", str(self.chunk),
             "--log-level", "WARNING"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 300
        while time.time() < deadline:  # readiness: the port answers
            if self.proc.poll() is not None:
                raise RuntimeError("mlx_lm.server exited during start-up")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=2).read()
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("mlx_lm.server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=60)
            self.proc = None

    def ask(self, prompt: str, max_tokens: int) -> dict:
        body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                           "stream": True, "stream_options": {"include_usage": True}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        start, ttft, usage = time.perf_counter(), None, {}
        with urllib.request.urlopen(req, timeout=3600) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                data = json.loads(line[5:])
                if ttft is None and data.get("choices"):
                    ttft = time.perf_counter() - start
                usage = data.get("usage") or usage
        prompt_tokens = usage.get("prompt_tokens", 0)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return {"prompt": prompt_tokens, "restored": cached, "recomputed": prompt_tokens - cached,
                "ttft_s": ttft}


def run(args) -> dict:
    from context.hf_tokenizer import HFTokenizer
    from context.workspace import Workspace
    from engine.engine import Engine
    from engine.loading import load_model

    work = Path(tempfile.mkdtemp(prefix="codectx-bench-cache-"))
    os.environ["CODECTX_HOME"] = str(work / "home")
    if args.random_like:
        model_dir = random_like(Path(args.random_like), work / "random")
        spec, name = str(model_dir), Path(args.random_like).name + "-random"
    elif args.tiny:
        from tiny_models import build_tiny_model

        model_dir = build_tiny_model(work / "tiny", "llama", hidden_size=256, num_hidden_layers=4,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     max_position_embeddings=65536)
        spec, name = str(model_dir), "tiny"
    else:
        loaded = load_model(None, progress=False)
        model_dir, spec, name = loaded.path, None, loaded.model_id
    loaded = load_model(spec, progress=False)
    tree = source_tree(work / "repo")
    ws = Workspace(tree, HFTokenizer.from_dir(model_dir), budget=args.prefix_tokens, persist=False)
    ws.build()
    files = [s for s in ws.layout.segments if s.kind == "file"]
    target = files[len(files) // 2].key
    prefix_tokens = sum(len(s) for s in ws.layout.segments)

    def new_engine():
        return Engine(loaded, prefill_chunk=args.chunk, archive_bytes=args.archive_bytes)

    rows = []
    peer = Peer(Path(model_dir), args.chunk) if args.peer else None
    eng = new_engine()
    if peer:
        peer.start()
    warm_up(eng, peer, loaded.tokenizer)
    try:
        steps = [("cold ask", QUESTIONS[0]), ("follow-up", QUESTIONS[1]),
                 ("edit mid file + ask", QUESTIONS[2]), ("restart + ask", QUESTIONS[2])]
        for step, question in steps:
            if step.startswith("edit"):
                path = tree / target
                path.write_text(path.read_text() + "\n# edited by the benchmark\nEDITED = True\n")
                ws.update(path, path.read_text())
            if step.startswith("restart"):
                eng.close()
                eng = new_engine()
                if peer:
                    peer.stop()
                    peer.start()
                warm_up(eng, peer, loaded.tokenizer)
            segments = ws.prompt(question)
            done = eng.submit(_request(segments, args.max_tokens)).result()
            m = done.metrics
            row = {"step": step, "codectx": {"prompt": m.prompt_tokens, "restored": m.cached_tokens,
                                             "recomputed": m.recomputed_tokens, "ttft_s": m.ttft_s,
                                             "miss": m.miss_reason}}
            if step.startswith("edit"):
                edited = next(s for s in segments if s.key == target)
                row["edited_file_tokens"] = len(edited)
                row["question_tokens"] = sum(len(s) for s in segments if s.kind in ("question", "header"))
                row["tokens_after_edit_point"] = m.prompt_tokens - m.cached_tokens
            if peer:
                row["mlx_lm.server"] = peer.ask("".join(s.text for s in segments), args.max_tokens)
            rows.append(row)
            sys.stderr.write(json.dumps(row) + "\n")  # progress, step by step
    finally:
        eng.close()
        if peer:
            peer.stop()
    return {"model": name, "prefix_tokens": prefix_tokens, "chunk": args.chunk,
            "edited_file": target, "machine": platform.machine(), "steps": rows,
            "cache_stats": {k: v for k, v in eng.stats()["cache"].items() if k != "checkpoint_list"}}


def warm_up(eng, peer, tokenizer) -> None:
    """One short unrelated request per system, so kernel compilation is not timed."""
    from engine.request import Request

    text = "Warm-up: say hello."
    eng.submit(Request(prompt_ids=tokenizer.encode(text), max_tokens=2)).result()
    if peer:
        peer.ask(text, 2)


def _request(segments, max_tokens):
    from engine.request import Request

    return Request(segments=to_request_segments(segments), max_tokens=max_tokens)


def table(result: dict) -> str:
    head = ("| step | system | prompt | restored | recomputed | TTFT s |\n"
            "|---|---|---:|---:|---:|---:|")
    lines = [head]
    for row in result["steps"]:
        for system in ("codectx", "mlx_lm.server"):
            r = row.get(system)
            if r:
                ttft = f"{r['ttft_s']:.2f}" if r["ttft_s"] is not None else "-"
                lines.append(f"| {row['step']} | {system} | {r['prompt']} | {r['restored']} | "
                             f"{r['recomputed']} | {ttft} |")
    return "\n".join(lines)


def main() -> None:
    # A SIGTERM (e.g. `timeout`) unwinds like Ctrl-C so the mlx_lm.server child is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny random-weight llama instead of the default model")
    p.add_argument("--random-like", metavar="DIR",
                   help="random weights with DIR's config.json and tokenizer (e.g. the default model's)")
    p.add_argument("--prefix-tokens", type=int, default=6000, help="repository prefix budget")
    p.add_argument("--chunk", type=int, default=256, help="prefill chunk (both systems)")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--archive-bytes", type=int, default=2 << 30)
    p.add_argument("--no-peer", dest="peer", action="store_false")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    result = run(args)
    out = args.json or ROOT / "bench" / "results" / f"cache-{result['model']}-{args.prefix_tokens}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    sys.stdout.write(table(result) + f"\n\nprefix {result['prefix_tokens']} tokens; JSON: {out}\n")


if __name__ == "__main__":
    main()
