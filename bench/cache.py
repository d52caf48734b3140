"""Checkpointed prefix cache vs mlx_lm.server's prompt cache, step by step, in one run.

Scenario on a repository prefix (codectx's own `context/` and `engine/` at a
pinned commit, laid out by `context.Workspace` under a token budget): cold ask ->
follow-up question -> edit a file in the middle -> ask -> restart -> ask. For
each step and each system: prompt tokens, tokens restored from cache, tokens
recomputed, time to first token. codectx runs in process (`Engine` with the disk
archive on; the restart is a new `Engine` and a new `Workspace` over the same
CODECTX_HOME). mlx_lm.server runs as a subprocess on loopback with the same
weights, the same optimized BLAS and its OpenAI API (`/v1/completions`,
streaming) and gets the same prompt text; after the edit it is also asked with
the edit in place (the prompt a client without codectx's layout would send).

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

from _common import blas_arguments, machine, preload_blas  # noqa: E402

preload_blas()  # before MLX is imported

PINNED_SOURCE = "954d1b43c48b65a62168f8f7a562fedec3d13cd9"
"""The commit whose context/ and engine/ packages are the benchmark's repository."""
HOT_SHARE = 0.15
"""`Workspace.hot_share`: the budget is chosen so the stable prefix is about --prefix-tokens."""
EDITED_SHARE = 0.5
"""The edited file: the first from the middle of the prefix on whose hot copy fits in this part
of the hot tail's room (a larger one would fold the tail back into place at once)."""

QUESTIONS = ("What does the code in this repository do? Answer briefly.",
             "Which function should I read first?",
             "What changed in the edited file?")


def source_tree(dest: Path) -> Path:
    """context/ and engine/ at `PINNED_SOURCE` in a private git work tree (edits stay in the copy)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", PINNED_SOURCE, "context", "engine"], cwd=ROOT,
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "--exclude=*.scm"], cwd=dest, input=archive, check=True)
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


class Peer:
    """mlx_lm.server as a subprocess on 127.0.0.1."""

    def __init__(self, model_dir: Path, chunk: int) -> None:
        self.model_dir, self.chunk, self.proc = model_dir, chunk, None

    def start(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        argv = ["mlx_lm.server", "--model", str(self.model_dir), "--host", "127.0.0.1", "--port",
                str(self.port), "--prefill-step-size", str(self.chunk), "--log-level", "WARNING"]
        # The same BLAS as codectx (engine/blas.py), preloaded before mlx_lm imports MLX.
        from engine import blas

        chosen = blas.describe()
        code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import runpy, engine.blas; "
                f"engine.blas.preload({chosen['choice']!r}, {chosen['threads'] or 0}); "
                f"sys.argv = {argv!r}; runpy.run_module('mlx_lm.server', run_name='__main__')")
        self.proc = subprocess.Popen([sys.executable, "-c", code],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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


STEPS = (("cold ask", QUESTIONS[0]), ("follow-up", QUESTIONS[1]),
         ("edit mid file + ask", QUESTIONS[2]), ("restart + ask", QUESTIONS[2]))
"""The scenario: (step, question asked at that step)."""


def prepare_model(args, work: Path) -> tuple[Path, str]:
    """The benchmark's model directory and its name in the results; moves CODECTX_HOME under `work`.

    Args:
        args: The parsed command line (``--tiny``, ``--random-like``).
        work: The run's private folder (random weights, the tiny model, CODECTX_HOME).

    Returns:
        The model directory and the name the results carry.
    """
    default_dir = None
    if not (args.random_like or args.tiny):  # the user's converted default model, not a new copy
        from engine.default_model import ensure_default_model

        default_dir = ensure_default_model(progress=False).directory
    os.environ["CODECTX_HOME"] = str(work / "home")  # archive, token caches, workspace state
    if args.random_like:
        return random_like(Path(args.random_like), work / "random"), Path(args.random_like).name + "-random"
    if args.tiny:
        from tiny_models import build_tiny_model

        model_dir = build_tiny_model(work / "tiny", "llama", hidden_size=256, num_hidden_layers=4,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     max_position_embeddings=65536)
        return model_dir, "tiny"
    return default_dir, Path(default_dir).name


def edited_file(ws, budget: int) -> str:
    """The key of the file the scenario edits (see `EDITED_SHARE`)."""
    from engine.request import SegmentKind

    files = [s for s in ws.layout.segments if s.kind == SegmentKind.FILE]
    middle = files[len(files) // 2:]
    return next((s for s in middle if len(s) <= budget * HOT_SHARE * EDITED_SHARE), middle[0]).key


class Scenario:
    """codectx (an `Engine` and a `Workspace`) and, when compared, mlx_lm.server through the steps."""

    def __init__(self, args, loaded, tree: Path, tokenizer, peer: Peer | None) -> None:
        self.args, self.loaded, self.tree, self.tokenizer, self.peer = args, loaded, tree, tokenizer, peer
        self.budget = int(args.prefix_tokens / (1 - HOT_SHARE))
        self.ws = self.new_workspace()
        self.target = edited_file(self.ws, self.budget)
        self.prefix_tokens = self.ws.layout.tokens
        self.eng = None

    def new_workspace(self):
        """A workspace over the tree, built (from disk and the persisted hot tail after a restart)."""
        from context.workspace import Workspace

        ws = Workspace(self.tree, self.tokenizer, budget=self.budget, hot_share=HOT_SHARE)
        ws.build()
        return ws

    def new_engine(self):
        """An engine on the loaded model with the disk archive on."""
        from engine.engine import Engine

        return Engine(self.loaded, prefill_chunk=self.args.chunk, archive_bytes=self.args.archive_bytes)

    def start(self) -> None:
        """Start both systems and warm them up."""
        self.eng = self.new_engine()
        if self.peer:
            self.peer.start()
        warm_up(self.eng, self.peer, self.loaded.tokenizer)

    def edit(self) -> None:
        """Append two lines to the edited file and tell the workspace."""
        path = self.tree / self.target
        path.write_text(path.read_text() + "\n# edited by the benchmark\nEDITED = True\n")
        self.ws.update(path, path.read_text())

    def restart(self) -> None:
        """A new engine and workspace (a new process's), and a restarted mlx_lm.server."""
        self.eng.close()
        before = self.ws.layout.segments
        self.ws = self.new_workspace()  # a new process would rebuild from disk + the persisted hot tail
        if [x.hash for x in self.ws.layout.segments] != [x.hash for x in before]:
            raise RuntimeError("the restarted workspace laid the prefix out differently")
        self.eng = self.new_engine()
        if self.peer:
            self.peer.stop()
            self.peer.start()
        warm_up(self.eng, self.peer, self.loaded.tokenizer)

    def ask(self, step: str, question: str) -> dict:
        """Ask `question` of both systems; the step's row of the results."""
        from engine.request import Request

        segments = self.ws.prompt(question)
        done = self.eng.submit(Request(segments=segments, max_tokens=self.args.max_tokens)).result()
        m = done.metrics
        row = {"step": step, "codectx": {"prompt": m.prompt_tokens, "restored": m.cached_tokens,
                                         "recomputed": m.recomputed_tokens, "ttft_s": m.ttft_s,
                                         "miss": m.miss_reason}}
        if step.startswith("edit"):
            row.update(self.edit_sizes(segments))
        if self.peer:
            row["mlx_lm.server"] = self.peer.ask("".join(s.text for s in segments), self.args.max_tokens)
            if step.startswith("edit"):
                row["mlx_lm.server, edit in place"] = self.peer.ask(self.edit_in_place(segments),
                                                                    self.args.max_tokens)
        return row

    def edit_sizes(self, segments) -> dict:
        """The edited file's tokens, whether the edit folded the hot tail, and the question's tokens."""
        from engine.request import SegmentKind

        # Its hot copy, or (when the edit folded the tail) its segment in place.
        edited = [s for s in segments if s.key == self.target and s.kind in (SegmentKind.HOT, SegmentKind.FILE)]
        return {"edited_file_tokens": len(edited[-1]),
                "folded": not any(s.kind == SegmentKind.HOT for s in edited),
                "question_tokens": sum(len(s) for s in segments
                                       if s.kind in (SegmentKind.QUESTION, SegmentKind.HEADER))}

    def edit_in_place(self, segments) -> str:
        """The prompt text a client without codectx's layout sends: the edit in place, no hot tail."""
        from context.segments import file_text
        from engine.request import SegmentKind

        current = self.ws._files[self.target]
        return "".join(file_text(self.target, current.language, current.text) if s.kind == SegmentKind.FILE
                       and s.key == self.target else s.text for s in segments if s.kind != SegmentKind.HOT)

    def close(self) -> None:
        """Stop both systems."""
        self.eng.close()
        if self.peer:
            self.peer.stop()


def run_steps(scenario: Scenario) -> list[dict]:
    """The scenario's rows, step by step (each also written to stderr as progress)."""
    rows = []
    scenario.start()
    try:
        for step, question in STEPS:
            if step.startswith("edit"):
                scenario.edit()
            if step.startswith("restart"):
                scenario.restart()
            row = scenario.ask(step, question)
            rows.append(row)
            sys.stderr.write(json.dumps(row) + "\n")  # progress, step by step
    finally:
        scenario.close()
    return rows


def run(args) -> dict:
    """Run the scenario on codectx (and mlx_lm.server unless ``--no-peer``).

    Args:
        args: The parsed command line.

    Returns:
        The results: the model, the prefix, one row per step, the goals and the cache's statistics.
    """
    from context.hf_tokenizer import HFTokenizer
    from engine.loading import load_model

    work = Path(tempfile.mkdtemp(prefix="codectx-bench-cache-"))
    model_dir, name = prepare_model(args, work)
    loaded = load_model(str(model_dir), progress=False)
    tree = source_tree(work / "repo")
    peer = Peer(Path(model_dir), args.chunk) if args.peer else None
    scenario = Scenario(args, loaded, tree, HFTokenizer.from_dir(model_dir), peer)
    rows = run_steps(scenario)
    return {"model": name, "prefix_tokens": scenario.prefix_tokens, "budget": scenario.budget, "chunk": args.chunk,
            "source": PINNED_SOURCE, "edited_file": scenario.target, "machine": machine(), "steps": rows,
            "goals": goals(rows),
            "cache_stats": {k: v for k, v in scenario.eng.stats()["cache"].items() if k != "checkpoint_list"}}


def goals(rows: list[dict]) -> dict:
    """The issue's three goals, computed from the rows."""
    by = {r["step"]: r for r in rows}
    edit, cold, restart = by["edit mid file + ask"], by["cold ask"], by["restart + ask"]
    out = {"edit_recomputed": edit["codectx"]["recomputed"],
           "edit_file_plus_question": edit["edited_file_tokens"] + edit["question_tokens"],
           "restart_ttft_over_cold": restart["codectx"]["ttft_s"] / cold["codectx"]["ttft_s"]}
    out["edit_recomputed_ok"] = out["edit_recomputed"] <= out["edit_file_plus_question"]
    out["restart_ok"] = out["restart_ttft_over_cold"] <= 0.2
    for peer in ("mlx_lm.server", "mlx_lm.server, edit in place"):
        if peer in edit and edit[peer]["ttft_s"]:
            out[f"edit_ttft_speedup_vs_{peer}"] = edit[peer]["ttft_s"] / edit["codectx"]["ttft_s"]
    return out


def warm_up(eng, peer, tokenizer) -> None:
    """One short unrelated request per system, so kernel compilation is not timed."""
    from engine.request import Request

    text = "Warm-up: say hello."
    eng.submit(Request(prompt_ids=tokenizer.encode(text), max_tokens=2)).result()
    if peer:
        peer.ask(text, 2)


def table(result: dict) -> str:
    head = ("| step | system | prompt | restored | recomputed | TTFT s |\n"
            "|---|---|---:|---:|---:|---:|")
    lines = [head]
    for row in result["steps"]:
        for system in ("codectx", "mlx_lm.server", "mlx_lm.server, edit in place"):
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
    blas_arguments(p)
    args = p.parse_args()
    result = run(args)
    out = args.json or ROOT / "bench" / "results" / f"cache-{result['model']}-{args.prefix_tokens}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    sys.stdout.write(table(result) + f"\n\nprefix {result['prefix_tokens']} tokens; goals {result['goals']}; "
                     f"JSON: {out}\n")


if __name__ == "__main__":
    main()
