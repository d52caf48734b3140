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
_RESERVED_TOKENS = 32  # slack for the template's own tokens around the repository text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="codectx ask", description=__doc__.splitlines()[0])
    parser.add_argument("question", help="the question to answer")
    parser.add_argument("--repo", type=Path, help="repository whose files become the context")
    parser.add_argument("--model", help="model name, directory, .gguf file or hub id "
                                        "(default: SmolLM2-135M-Instruct)")
    parser.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    parser.add_argument("--kv-bits", type=int, choices=(8, 16), default=16, help="KV cache precision")
    parser.add_argument("--prefill-chunk", type=int, default=None, help="tokens per prefill step")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    return parser


def repo_context(root: Path, count_tokens: Any, budget_tokens: int) -> tuple[str, int, int]:
    """The repository's text files, in path order, as long as they fit the budget.

    A file that does not fit is left out and later (smaller) files may still
    go in. The context layer's `Workspace` will replace this.

    Args:
        root: Repository root.
        count_tokens: Maps text to its token count.
        budget_tokens: Most tokens the returned text may take.

    Returns:
        (text, files included, files left out for the budget).
    """
    from context.scan import ScanRules, scan

    blocks, used, left_out = [], 0, 0
    for source in scan(root, ScanRules()).files:
        block = f"<file path=\"{source.path}\">\n{source.text}\n</file>\n"
        cost = count_tokens(block)
        if used + cost > budget_tokens:
            left_out += 1
            continue
        blocks.append(block)
        used += cost
    return "".join(blocks), len(blocks), left_out


def build_messages(question: str, repo_text: str | None) -> list[dict[str, str]]:
    """Chat messages: system instructions (with the repository, if any) and the question."""
    system = SYSTEM_PROMPT if not repo_text else f"{SYSTEM_PROMPT}\n\n{repo_text}"
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


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
    options = {"kv_bits": args.kv_bits}
    if args.prefill_chunk:
        options["prefill_chunk"] = args.prefill_chunk
    with Engine(loaded, **options) as engine:
        repo_text = None
        if args.repo is not None:
            fixed = len(engine.chat_ids(build_messages(args.question, None)))
            budget = loaded.context_length - args.max_tokens - fixed - _RESERVED_TOKENS
            repo_text, included, left_out = repo_context(
                args.repo, lambda text: len(loaded.tokenizer.encode(text)), max(budget, 0))
            err.write(f"[repo {args.repo}: {included} files in context, {left_out} left out for the budget]\n")
        ids = engine.chat_ids(build_messages(args.question, repo_text))
        if len(ids) + args.max_tokens > loaded.context_length:
            err.write(f"codectx ask: prompt ({len(ids)} tokens) + --max-tokens exceeds the model's "
                      f"context of {loaded.context_length} tokens\n")
            return 1
        request = Request(prompt_ids=ids, max_tokens=args.max_tokens,
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
