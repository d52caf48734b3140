"""Prepared hover answers one by one against one batch (`engine.batch`): wall time per answer.

Builds the real hover prompts of a real package (`itsdangerous` 2.2.0 by default, as
`bench/lsp_reading.py`): the server core's workspace prompt over the package, its hover
lead-in, and the answer prompts (`hover.answer_request`: lead-in, head, tail; first
sentence, `hover.maxTokens`) of the definitions of its largest module in reading order.
The engine is the one the server starts (`start_backend`: on this CPU the NumPy
forward). After prefilling the lead-in once, for each B it runs B answers one after the
other (`Engine.submit`, PREPARE priority, what `hover.prepareBatch: 1` does) and then the
same B answers as one batch (`Engine.submit_batch`; for B = 1 that is the same single
request, run once). Each B takes definitions of its own, so no run finds an answer head an
earlier one checkpointed (a batch never restores one anyway). Greedy decoding: both runs
give the same answers (the table says whether they did).

    python bench/hover_batch.py [--model smollm2-135m] [--sizes 1,4,8] [--package itsdangerous]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import cpu_ticks, machine, markdown_table, steal_share, write_json  # noqa: E402
from bench.answer_questions import install_package  # noqa: E402
from bench.lsp_reading import largest_module  # noqa: E402
from engine.request import DoneEvent, Priority, Request, SamplingParams  # noqa: E402
from server.core.backend import start_backend  # noqa: E402
from server.core.features import hover  # noqa: E402
from server.core.features.symbols import site_of  # noqa: E402
from server.core.ready import workspace_prompt  # noqa: E402
from server.core.session import LoadingSession, NoBuffers, Session  # noqa: E402
from server.core.settings import parse_settings  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--package", default="itsdangerous")
    parser.add_argument("--version", default="2.2.0")
    parser.add_argument("--sizes", default="1,4,8", help="answers per batch, one run each")
    parser.add_argument("--venvs", type=Path, default=Path(tempfile.gettempdir()) / "codectx-bench-venvs")
    return parser.parse_args(argv)


def hover_requests(session: Session, path: Path) -> list[Request]:
    """The PREPARE answer requests of `path`'s definitions, top to bottom, as hover preparation sends them."""
    cache = hover.HoverCache(lambda p: p.read_text(encoding="utf-8"))
    session.hover_cache = cache  # where `hover.uses` finds the definition index (a ReadySession has one)
    text, definitions = cache.index.definitions(path)
    guard = SamplingParams(loop_guard=session.settings.generation.loop_guard)
    requests, lead = [], hover.lead_in(session)
    for definition in sorted(definitions, key=lambda d: d.line):
        segments, _, stop = hover.answer_request(session, site_of(path, text, definition, definitions), lead)
        requests.append(Request(segments=segments, max_tokens=session.settings.hover.max_tokens, stop=stop,
                                sampling=guard, priority=Priority.PREPARE))
    return requests


def timed(handles) -> tuple[float, list[DoneEvent]]:
    started = time.perf_counter()
    done = [h.result() for h in handles]
    return time.perf_counter() - started, done


def run(engine, requests: list[Request]) -> dict:
    """The answers one by one, then the same answers as one batch (one answer: the same path once)."""
    started, alone = time.perf_counter(), []
    for request in requests:
        alone.append(engine.submit(Request(segments=request.segments, max_tokens=request.max_tokens, stop=request.stop,
                                           sampling=request.sampling, priority=request.priority)).result())
    serial_s = time.perf_counter() - started
    # The serial answers left their heads checkpointed; a batch never restores a head (it starts
    # from the common lead-in), so its time is the same either way.
    batch_s, batched = timed(engine.submit_batch(requests)) if len(requests) > 1 else (serial_s, alone)
    return {"answers": len(requests), "serial_s": serial_s, "batch_s": batch_s,
            "serial_per_answer_s": serial_s / len(requests), "batch_per_answer_s": batch_s / len(requests),
            "ratio": serial_s / batch_s, "same": [a.text for a in alone] == [b.text for b in batched],
            "decode_tokens": [d.metrics.decode_tokens for d in alone],
            "serial_prefill_s": sum(d.metrics.prefill_s for d in alone),
            "batch_prefill_s": max(d.metrics.prefill_s for d in batched),
            "finish": [d.finish_reason for d in batched]}


def main() -> None:
    args = parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    source = install_package(args.package, args.version, args.venvs)
    with tempfile.TemporaryDirectory(prefix="codectx-hover-batch-") as work:
        repo = Path(work) / args.package
        shutil.copytree(source, repo / args.package)
        settings, problems = parse_settings({"model": {"name": args.model}, "memory": {"archiveEnabled": False}})
        if problems:
            raise SystemExit(f"bad settings: {problems}")
        base = LoadingSession(settings, NoBuffers(), repo)
        backend = start_backend(settings)
        session = Session(base, backend, workspace_prompt(base, backend.tokenizer))
        path = largest_module(repo)
        requests = hover_requests(session, path)
        if len(requests) < sum(sizes):
            raise SystemExit(f"{path.name} has {len(requests)} definitions; --sizes needs {sum(sizes)}")
        engine = backend.engine
        lead = hover.lead_in(session)
        started = time.perf_counter()
        engine.submit(Request(segments=lead, max_tokens=0)).result()
        lead_s = time.perf_counter() - started
        ticks, results, offset = cpu_ticks(), [], 0
        for size in sizes:
            results.append(run(engine, requests[offset:offset + size]))
            offset += size
            print(f"B={size}: {results[-1]['serial_per_answer_s']:.2f} s serial, "
                  f"{results[-1]['batch_per_answer_s']:.2f} s batched per answer", file=sys.stderr, flush=True)
        steal = steal_share(ticks, cpu_ticks())
        stats = engine.stats()
        session.close()
    lead_tokens = sum(len(s.token_ids) for s in lead)
    rows = [[r["answers"], r["serial_per_answer_s"], r["batch_per_answer_s"], r["ratio"],
             sum(r["decode_tokens"]) / r["answers"], r["serial_prefill_s"], r["batch_prefill_s"],
             "yes" if r["same"] else "no"] for r in results]
    print(f"{args.package} {args.version}, {path.name}: lead-in {lead_tokens} tokens (prefilled in {lead_s:.1f} s), "
          f"compute {stats['compute']['kind']}, steal {steal if steal is None else f'{steal:.0%}'}\n")
    print(markdown_table(["answers (B)", "serial s/answer", "batched s/answer", "serial ÷ batched",
                          "tokens/answer", "serial prefill s", "batched prefill s", "same answers"], rows))
    payload = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}, "module": path.name,
               "lead_tokens": lead_tokens, "lead_prefill_s": lead_s, "steal": steal,
               "compute": stats["compute"], "results": results}
    print(f"\nwrote {write_json('hover_batch', payload)}", file=sys.stderr)


if __name__ == "__main__":
    main()
