"""`codectx ask`: answer one question about a repository, streaming to stdout.

The answer goes to stdout as it is generated; a metrics footer (prompt,
cached and recomputed tokens, prefill speed, time to first token, decode
speed) goes to stderr.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Sequence, TextIO

SYSTEM_PROMPT = ("You are codectx, a coding assistant. Answer questions about the code "
                 "below precisely and cite file paths.")
_RESERVED_TOKENS = 64  # slack for the chat template's framing of the question and answer


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="codectx ask", description=__doc__.splitlines()[0])
    parser.add_argument("question", help="the question to answer")
    parser.add_argument("--repo", type=Path, help="repository whose files become the context")
    parser.add_argument("--model", help="model name, directory, .gguf file or hub id "
                                        "(default: SmolLM2-135M-Instruct)")
    parser.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    parser.add_argument("--kv-bits", type=int, choices=(8, 16), default=16, help="KV cache precision")
    parser.add_argument("--prefill-chunk", type=int, default=None, help="tokens per prefill step")
    parser.add_argument("--window", default=None, metavar="G,W[,TAIL]",
                        help="windowed prefill: global region G, recent window W, dense tail "
                             "(default 8192,8192,2048; exact on models whose context is <= G + W)")
    parser.add_argument("--no-approximation", action="store_true",
                        help="exact attention everywhere (approximation.enabled = false)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    return parser


def repo_prompt(root: Path, tokenizer: Any, question: str, budget_tokens: int,
                progress: Any = None) -> tuple[list[Any], Any]:
    """The repository laid out by `context.Workspace`, framed as a chat with `question`.

    Args:
        root: Repository root.
        tokenizer: The model's tokenizer (satisfies `context.tokenizer.TextTokenizer`).
        question: The user's question.
        budget_tokens: Most tokens the repository prefix may take.
        progress: Optional progress(done, total) callback for large repositories.

    Returns:
        (engine prompt segments, the context layout).
    """
    from context.workspace import Workspace
    from engine.request import PromptSegment

    workspace = Workspace(root, tokenizer, budget=budget_tokens, progress=progress)
    layout = workspace.build()
    segments = [PromptSegment(s.kind, s.key, tuple(s.token_ids), s.protected)
                for s in workspace.prompt(question)]
    return segments, layout


def window_policy(spec: str | None, enabled: bool = True) -> Any:
    """The `engine.window.WindowPolicy` for `--window G,W[,TAIL]` (None: exact attention).

    Raises:
        ValueError: For a malformed spec.
    """
    from engine.window import WindowPolicy

    if not enabled:
        return None
    if spec is None:
        return WindowPolicy()
    parts = [int(x) for x in spec.split(",")]
    if len(parts) not in (2, 3):
        raise ValueError(f"expected G,W or G,W,TAIL, got {spec!r}")
    return WindowPolicy(global_tokens=parts[0], window_tokens=parts[1],
                        **({"dense_tail": parts[2]} if len(parts) == 3 else {}))


def build_messages(question: str) -> list[dict[str, str]]:
    """Chat messages without a repository: system instructions and the question."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def format_footer(metrics: Any, finish_reason: str) -> str:
    """One line of request metrics for stderr."""
    m = metrics
    return (f"[prompt {m.prompt_tokens} tok (cached {m.cached_tokens}, recomputed {m.recomputed_tokens}) | "
            f"prefill {m.prefill_s:.2f} s, {m.prefill_tps:.0f} tok/s | TTFT {m.ttft_s:.2f} s | "
            f"decode {m.decode_tokens} tok, {m.decode_tps:.1f} tok/s | {finish_reason}]")


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run `codectx ask`; returns the exit status (0 ok, 1 failed, 130 interrupted)."""
    args = build_parser().parse_args(argv)
    out, err = out or sys.stdout, err or sys.stderr
    if args.max_tokens < 1:
        err.write("codectx ask: --max-tokens must be >= 1\n")
        return 2
    from engine.engine import Engine  # MLX loads here, not at --help
    from engine.errors import EngineError
    from engine.loading import load_model
    from engine.request import Request, SamplingParams, TokenEvent

    # Counting a whole file's tokens is fine here; transformers warns past model_max_length.
    logging.getLogger("transformers.tokenization_utils_base").setLevel(logging.ERROR)
    try:
        loaded = load_model(args.model, progress=True)
    except EngineError as error:
        err.write(f"codectx ask: {error}\n")
        return 1
    try:
        window = window_policy(args.window, not args.no_approximation)
    except ValueError as error:
        err.write(f"codectx ask: --window: {error}\n")
        return 2
    options = {"kv_bits": args.kv_bits, "window": window}
    if args.prefill_chunk:
        options["prefill_chunk"] = args.prefill_chunk
    with Engine(loaded, **options) as engine:
        if args.repo is not None:
            from context.errors import ContextError
            from server.context_cmd import progress_bar

            # Room for the question, its chat framing and the answer.
            question_tokens = len(loaded.tokenizer.encode(args.question))
            budget = loaded.context_length - args.max_tokens - question_tokens - _RESERVED_TOKENS
            try:
                segments, layout = repo_prompt(args.repo, loaded.tokenizer, args.question, max(budget, 0),
                                               progress=progress_bar(err))
            except ContextError as error:
                err.write(f"codectx ask: {error}\n")
                return 1
            files = sum(1 for s in layout.segments if s.kind in ("file", "hot"))
            err.write(f"[repo {args.repo}: {files} files whole, {len(layout.skipped)} skipped, "
                      f"{layout.tokens} prefix tokens (budget {budget})]\n")
            prompt = {"segments": segments}
            prompt_len = sum(len(s.token_ids) for s in segments)
        else:
            ids = engine.chat_ids(build_messages(args.question))
            prompt = {"prompt_ids": ids}
            prompt_len = len(ids)
        if prompt_len + args.max_tokens > loaded.context_length:
            err.write(f"codectx ask: prompt ({prompt_len} tokens) + --max-tokens exceeds the model's "
                      f"context of {loaded.context_length} tokens\n")
            return 1
        request = Request(**prompt, max_tokens=args.max_tokens,
                          sampling=SamplingParams(temperature=args.temperature, seed=args.seed))
        handle = engine.submit(request)
        try:
            for event in handle:
                if isinstance(event, TokenEvent):
                    out.write(event.text)
                    out.flush()
        except KeyboardInterrupt:
            handle.cancel()
            err.write("\n" + format_footer(handle.result().metrics, "cancelled") + "\n")
            return 130
        done = handle.result()
    out.write("\n")
    out.flush()
    err.write(format_footer(done.metrics, done.finish_reason) + "\n")
    if done.finish_reason == "error":
        err.write(f"codectx ask: {done.error}\n")
        return 1
    return 0

