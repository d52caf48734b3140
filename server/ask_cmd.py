"""`codectx ask`: answer one question about a repository, streaming to stdout.

The answer goes to stdout as it is generated; a metrics footer (prompt,
cached and recomputed tokens, prefill speed, time to first token, decode
speed) goes to stderr, and a progress bar while the prompt is prefilled when
stderr is a terminal. With `--repo` the question runs through the server's
core: the same backend (`start_backend`, disk archive on), workspace prompt,
system prompt and ask feature (tool loop included) as the language server, so
a second ask on an unchanged repository restores the repository prefix from
the archive instead of recomputing it.

Exit status (`server.exit_status`, the same for every command): 0 answered,
1 the run failed (the model cannot be loaded, an engine error, a prompt longer
than the model's context), 2 the command line cannot run as asked (a bad
option, an empty question, a `--repo` that is not a folder, a model that is
not found), 130 interrupted.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Sequence, TextIO

from context.scan import ScanProgress
from server.core.prefix_budget import ASK_MAX_TOKENS
from server.exit_status import FAILED, INTERRUPTED, USAGE, UsageError, check_folder, status_for


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="codectx ask", description=__doc__.splitlines()[0])
    parser.add_argument("question", help="the question to answer")
    parser.add_argument("--repo", type=Path, help="repository whose files become the context")
    parser.add_argument("--model", help="model name, directory, .gguf file or hub id "
                                        "(default: SmolLM2-135M-Instruct)")
    parser.add_argument("--engine-url", default="",
                        help="answer on this OpenAI-compatible engine server (e.g. http://127.0.0.1:8080/v1; "
                             "docs/remote.md) instead of in process; --model names the local tokenizer's model")
    parser.add_argument("--engine-model", default="", help="the model to ask the server for (default: its first)")
    parser.add_argument("--max-tokens", type=int, default=ASK_MAX_TOKENS,
                        help=f"most tokens to generate (default {ASK_MAX_TOKENS})")
    parser.add_argument("--kv-bits", type=int, choices=(8, 16), default=16, help="KV cache precision")
    parser.add_argument("--gguf-bits", type=int, choices=(4, 8, 16), default=None,
                        help="bits a .gguf model is converted to (the model.ggufBits setting; default 4)")
    parser.add_argument("--prefill-chunk", type=int, default=None, help="tokens per prefill step")
    parser.add_argument("--window", default=None, metavar="G,W[,TAIL]",
                        help="windowed prefill: global region G, recent window W, dense tail "
                             "(default 8192,8192,2048; exact on models whose context is <= G + W)")
    parser.add_argument("--no-approximation", action="store_true",
                        help="exact attention everywhere (window.enabled = false)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    parser.add_argument("--no-loop-guard", action="store_true",
                        help="do not stop an answer that repeats itself (generation.loopGuard = false)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0,
                        help="penalize tokens the answer already holds; 1.0 (default) is off")
    return parser


def window_settings(spec: str | None, enabled: bool = True) -> Any:
    """The `window.*` settings for `--window G,W[,TAIL]` (server defaults where not given).

    Raises:
        ValueError: For a malformed spec.
    """
    from server.core.settings import WindowSettings

    if not enabled:
        return WindowSettings(enabled=False)
    if spec is None:
        return WindowSettings()
    parts = [int(x) for x in spec.split(",")]
    if len(parts) not in (2, 3) or min(parts) < 0 or parts[1] < 1:
        raise ValueError(f"expected G,W or G,W,TAIL (W >= 1), got {spec!r}")
    tail = {"dense_tail_tokens": parts[2]} if len(parts) == 3 else {}
    return WindowSettings(global_tokens=parts[0], window_tokens=parts[1], **tail)


def settings_from(args: argparse.Namespace) -> Any:
    """The server's settings tree with the command line's model options over its defaults.

    Raises:
        UsageError: A malformed `--window`, `--prefill-chunk`, `--repetition-penalty` or `--temperature`.
    """
    from server.core.settings import Settings

    defaults = Settings()
    try:
        window = window_settings(args.window, not args.no_approximation)
    except ValueError as err:
        raise UsageError(f"--window: {err}") from err
    if args.prefill_chunk is not None and args.prefill_chunk < 1:
        raise UsageError("--prefill-chunk must be >= 1")
    if not 1.0 <= args.repetition_penalty < float("inf"):
        raise UsageError("--repetition-penalty must be a number >= 1.0")
    if not 0.0 <= args.temperature < float("inf"):  # (nan fails too)
        raise UsageError("--temperature must be a number >= 0 (0 is greedy)")
    model = dataclasses.replace(defaults.model, kv_bits=args.kv_bits,
                                gguf_bits=args.gguf_bits or defaults.model.gguf_bits,
                                prefill_chunk=args.prefill_chunk or defaults.model.prefill_chunk,
                                **({"name": args.model} if args.model else {}))
    generation = dataclasses.replace(defaults.generation, loop_guard=not args.no_loop_guard,
                                     repetition_penalty=args.repetition_penalty)
    engine = dataclasses.replace(defaults.engine, url=args.engine_url, model=args.engine_model)
    return dataclasses.replace(defaults, model=model, window=window, generation=generation, engine=engine)


def build_messages(question: str) -> list[dict[str, str]]:
    """Chat messages without a repository: codectx's one system prompt and the question."""
    from context.prompt import DEFAULT_SYSTEM

    return [{"role": "system", "content": DEFAULT_SYSTEM}, {"role": "user", "content": question}]


LOOP_NOTE = "[stopped: the answer started repeating itself (the loop guard); --no-loop-guard lets it run on]"
"""What stderr says, above the footer, when the loop guard ended the answer."""


def format_footer(metrics: dict, finish_reason: str) -> str:
    """One line of request metrics (`Metrics.as_dict()`, or an ask's summed rounds) for stderr."""
    m = metrics
    return (f"[prompt {m['prompt_tokens']} tok (cached {m['cached_tokens']}, recomputed {m['recomputed_tokens']}) | "
            f"prefill {m['prefill_s']:.2f} s, {m['prefill_tps']:.0f} tok/s | TTFT {m['ttft_s']:.2f} s | "
            f"decode {m['decode_tokens']} tok, {m['decode_tps']:.1f} tok/s | {finish_reason}]")


def prefill_bar(stream: TextIO) -> Callable[[int, int], None] | None:
    """A progress bar of prefilled prompt tokens on `stream` when it is a terminal (None otherwise):
    tokens done / total and the prefill rate (tokens computed since the first report, over the
    time since: restored tokens do not count). It clears itself when the prefill is done, before
    the answer streams."""
    if not stream.isatty():
        return None
    state: dict = {}

    def update(done: int, total: int) -> None:
        if "bar" not in state:
            from tqdm import tqdm

            state["bar"] = tqdm(total=total, initial=done, unit="tok", desc="prefill", file=stream, leave=False,
                                smoothing=0)
        bar = state["bar"]
        bar.total, bar.n = total, done
        bar.refresh()
        if done >= total:
            bar.close()
            state.clear()

    return update


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run `codectx ask`; returns the exit status (module docstring)."""
    args = build_parser().parse_args(argv)
    out, err = out or sys.stdout, err or sys.stderr
    from server.core.question import EmptyQuestionError, check_question

    try:
        try:
            check_question(args.question)
        except EmptyQuestionError as error:
            raise UsageError(str(error)) from error
        if args.max_tokens < 1:
            raise UsageError("--max-tokens must be >= 1")
        if args.repo is not None:
            check_folder("--repo", args.repo)
        settings = settings_from(args)
    except UsageError as error:
        err.write(f"codectx ask: {error}\n")
        return USAGE
    from engine.errors import EngineError
    from server.core.backend import start_backend

    try:
        backend = start_backend(settings, progress=True)
    except EngineError as error:
        err.write(f"codectx ask: {error}\n")
        return status_for(error)
    except KeyboardInterrupt:
        return INTERRUPTED
    try:
        return asyncio.run(_answer(args, settings, backend, out, err))
    finally:
        backend.close()


async def _answer(args: argparse.Namespace, settings: Any, backend: Any, out: TextIO, err: TextIO) -> int:
    """Answers on the running loop; Ctrl-C cancels the request (its footer says "cancelled")."""
    asker = _Asker(args, settings, backend, out, err)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, asker.interrupt)
    try:
        return await asker.run()
    finally:
        loop.remove_signal_handler(signal.SIGINT)


class _Asker:
    """One `codectx ask` on a started backend: with a repository through the core's ask
    feature, without one as a plain chat."""

    def __init__(self, args: argparse.Namespace, settings: Any, backend: Any, out: TextIO, err: TextIO) -> None:
        self.args, self.settings, self.backend, self.out, self.err = args, settings, backend, out, err
        self.interrupted = False
        self._cancel: Callable[[], None] = lambda: None

    def interrupt(self) -> None:
        """Ctrl-C: cancel the running request; the answer so far and its footer are kept."""
        self.interrupted = True
        self._cancel()

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    async def run(self) -> int:
        from engine.errors import EngineError

        try:
            outcome = await (self._plain() if self.args.repo is None else self._with_repo())
        except EngineError as error:
            self.err.write(f"codectx ask: {error}\n")
            return status_for(error)
        if isinstance(outcome, int):
            return outcome
        metrics, finish_reason = outcome
        self.out.write("\n")
        self.out.flush()
        if finish_reason == "repetition":
            self.err.write(LOOP_NOTE + "\n")
        self.err.write(format_footer(metrics, finish_reason) + "\n")
        return INTERRUPTED if self.interrupted else 0

    def _fits(self, prompt_tokens: int) -> bool:
        if prompt_tokens + self.args.max_tokens <= self.backend.context_length:
            return True
        self.err.write(f"codectx ask: prompt ({prompt_tokens} tokens) + --max-tokens exceeds the model's "
                       f"context of {self.backend.context_length} tokens\n")
        return False

    def _sampling(self) -> Any:
        from engine.request import SamplingParams

        return SamplingParams(temperature=self.args.temperature, seed=self.args.seed)

    async def _plain(self) -> tuple[dict, str] | int:
        """The question alone (system prompt + question), straight to the backend."""
        from engine.request import Request

        ids = self.backend.chat_ids(build_messages(self.args.question))
        if not self._fits(len(ids)):
            return FAILED
        request = Request(prompt_ids=ids, max_tokens=self.args.max_tokens, sampling=self._sampling())
        self._cancel = lambda: self.backend.cancel(request.request_id)
        if self.interrupted:
            return INTERRUPTED
        done = await self.backend.generate(request, on_text=self.write, on_prefill=prefill_bar(self.err))
        if done.finish_reason == "error":
            raise done.error
        return done.metrics.as_dict(), done.finish_reason

    async def _with_repo(self) -> tuple[dict, str] | int:
        """The repository through the core: workspace prompt, session and the ask feature."""
        from context.errors import ContextError, ScanStopped
        from server.context_cmd import fit_summary
        from server.core.features.ask import ask, question_fits
        from server.core.prompt_size import PromptTooLongError

        try:  # before the scan: a question that leaves no room for the repository is named as such
            await asyncio.to_thread(question_fits, self.backend.tokenizer, self.backend.context_length,
                                    self.args.question, self.args.max_tokens)
        except PromptTooLongError as error:
            self.err.write(f"codectx ask: {error}\n")
            return FAILED
        try:
            session, tools = await asyncio.to_thread(self._session)
        except ScanStopped:
            return INTERRUPTED
        except ContextError as error:
            self.err.write(f"codectx ask: {error}\n")
            return status_for(error)
        layout = session.prompt.workspace.layout
        self.err.write(f"[repo {self.args.repo}: {fit_summary(layout)}; {len(layout.skipped)} skipped, "
                       f"{layout.tokens} prefix tokens (budget {session.settings.context.budget_tokens}; "
                       f"`codectx context` shows which)]\n")
        self._cancel = session.cancel_all
        if self.interrupted:
            return INTERRUPTED
        try:  # the core refuses a prompt that, with the answer, cannot fit the model's context
            result = await ask(session, self.args.question, on_text=self.write, on_prefill=prefill_bar(self.err),
                               tools=tools, max_tokens=self.args.max_tokens, sampling=self._sampling(),
                               on_focus=lambda focus: self.err.write(f"[{focus.summary()}; `codectx context "
                                                                     f"--question` shows why]\n"))
        except PromptTooLongError as error:
            self.err.write(f"codectx ask: {error}\n")
            return FAILED
        return result.metrics, result.finish_reason

    def _session(self) -> tuple[Any, Any]:
        """The repository's session (scans: on a worker thread); Ctrl-C stops the scan."""
        from context.errors import ScanStopped
        from server.context_cmd import progress_bar

        bar = progress_bar(self.err)

        def progress(stage: str, done: int, total: int) -> None:
            if self.interrupted:
                raise ScanStopped
            bar(stage, done, total)

        return repo_session(self.settings, self.backend, self.args.repo, self.args.question,
                            self.args.max_tokens, progress)


def repo_session(settings: Any, backend: Any, repo: Path, question: str, max_tokens: int,
                 progress: ScanProgress | None = None) -> tuple[Any, Any]:
    """A core session over `repo` with the server's prompt, built as `codectx ask --repo`
    builds it (its prefix budget leaves room for `question` and `max_tokens`), and its tools.
    Scans the repository: call it off the event loop. `progress` is told how the scan goes
    (`server.context_cmd.progress_bar` draws it) and may stop it.

    Raises:
        ContextError: The repository cannot be scanned.
        ScanStopped: `progress` stopped the scan.
    """
    from server.core.prefix_budget import prefix_budget
    from server.core.prompt import WorkspacePrompt
    from server.core.session import LoadingSession, NoBuffers, Session
    from server.core.tools import TOOLS_PROMPT, WorkspaceTools

    # The server's budget, within what the model's context leaves for the question and answer.
    question_tokens = len(backend.tokenizer.encode(question))
    context = settings.context
    budget = prefix_budget(context, backend.context_length, max_tokens, question_tokens)
    settings = dataclasses.replace(settings, context=dataclasses.replace(context, budget_tokens=budget))
    base = LoadingSession(settings, NoBuffers(), repo.resolve())
    prompt = WorkspacePrompt(base.root, backend.tokenizer, base.buffer_text, TOOLS_PROMPT,
                             settings.context, progress=progress)
    session = Session(base, backend, prompt)
    return session, WorkspaceTools(prompt.access, session.read_text, lambda: prompt.files)
