"""The session's two phases through `SessionHost`, in process with the real tiny model:
what is answered before and while the model loads, what waits for it, a load that fails,
and a shutdown while loading. A `BackendGate` holds the real `start_backend` until the test
lets it go, so "while loading" is a state the test controls, not a race."""
from __future__ import annotations

import asyncio
import time
import threading
from pathlib import Path

import pytest

from context.errors import AccessDeniedError, ScanStopped
from lsprotocol import types

from engine.errors import ModelNotFoundError
from server.core.backend import start_backend
from server.core.errors import NotReadyError
from server.core.features import ask as ask_feature
from server.core.features import hover as hover_feature
from server.core.features import status as status_feature
from server.core.host import SessionHost
from server.core.session import LoadingSession
from server.core.settings import Settings, parse_settings
from server.lsp.convert import UTF16
from server.lsp.documents import DocumentStore
from tests.server.harness import Gate, default_options, write_sample_workspace


class BackendGate(Gate):
    """`start_backend` that waits until the test opens the gate (and keeps what it started)."""

    backend = None

    def __call__(self, settings: Settings):
        self.hold()
        self.backend = start_backend(settings)
        return self.backend

    async def reached(self) -> None:
        await super().reached("loading never started the backend")


def loading_session(model: Path, root: Path, **overrides) -> LoadingSession:
    settings, problems = parse_settings(default_options(model, **overrides))
    assert problems == []
    return LoadingSession(settings, DocumentStore(UTF16), root)


def status(host: SessionHost) -> dict:
    return status_feature.status(host.base, host.ready_now(), "utf-16", {})


@pytest.fixture()
def repo(tmp_path) -> Path:
    return write_sample_workspace(tmp_path)


async def test_requests_before_while_and_after_loading(tiny_model, repo):
    host = SessionHost(loading_session(tiny_model, repo))
    with pytest.raises(NotReadyError):  # before loading began (LSP: before `initialize`)
        await host.ready()
    gate = BackendGate()
    loading = asyncio.ensure_future(host.load(start=gate))
    await gate.reached()

    # While loading: status answers, a hover-like request gets nothing, an ask waits.
    assert host.ready_now() is None and status(host)["ready"] is False and status(host)["engine"] is None
    waiting = asyncio.ensure_future(host.ready())
    util = repo / "util.py"
    host.base.documents.open(types.TextDocumentItem(uri=util.as_uri(), language_id="python", version=2,
                                                    text="def add(a, b):\n    return b + a  # edited\n"))
    host.changed([util])
    host.focus(util, 2)
    assert not waiting.done() and host.base.prefix_version == 1
    # A hover gets the static card of the buffer's definition at once, saying the model loads;
    # a name not defined in that file, and a file the access policy refuses, get nothing.
    started = time.perf_counter()
    card = host.static_hover("add", util)
    assert time.perf_counter() - started < 0.1
    assert card.source == "signature" and card.markdown.startswith("**add** (function, `util.py:1`)")
    assert "def add(a, b):" in card.markdown and card.markdown.endswith(hover_feature.LOADING_LINE)
    assert host.static_hover("nothing_here", util) is None
    outside = repo.parent / "outside.py"
    outside.write_text("def add(a, b):\n    return 0\n", encoding="utf-8")
    (repo / "linked.py").symlink_to(outside)  # a link out of the workspace: never read
    assert host.static_hover("add", repo / "linked.py") is None
    with pytest.raises(AccessDeniedError):
        host.base.read_text(repo / "linked.py")
    (repo / "linked.py").unlink()

    gate.open.set()
    ready = await waiting
    assert ready is await loading and host.ready_now() is ready
    # The edit made while loading is in the prompt (the built copy and its hot copy), and
    # hover preparation starts where the user was.
    assert [s.key for s in ready.prompt.prefix_segments()].count("util.py") == 2
    assert ready.prefetch.focus == (util, 2) and host.base.dirty == set()

    # After: requests run, status reports the model.
    answer = await ask_feature.ask(ready, "What does add do?", on_text=lambda text: None, max_tokens=2)
    assert answer.metrics["prompt_tokens"] > 0 and answer.finish_reason in ("stop", "length")
    state = status(host)
    assert state["ready"] is True and state["model"] == ready.model_id and state["counters"]["asks"] == 1
    host.close()
    assert ready.backend.stats()["closed"] is True


async def test_a_load_that_fails_is_every_waiters_answer(tmp_path, repo):
    host = SessionHost(loading_session(tmp_path / "no-such-model", repo))
    host.begin()
    waiting = asyncio.ensure_future(host.ready())
    with pytest.raises(ModelNotFoundError):
        await host.load()
    with pytest.raises(ModelNotFoundError):
        await waiting
    with pytest.raises(ModelNotFoundError):  # and every later request
        await host.ready()
    assert host.ready_now() is None and status(host)["ready"] is False
    assert isinstance(host.load_failure(), ModelNotFoundError)  # the status's loadError (LSP: its user message)
    # A hover no longer promises an explanation that will never come ("the model is loading").
    card = host.static_hover("add", repo / "util.py").markdown
    assert hover_feature.NOT_LOADED_LINE in card and hover_feature.LOADING_LINE not in card
    host.changed([repo / "util.py"])  # edits are still taken (nothing to apply them to)
    assert host.base.prefix_version == 1
    host.close()


async def test_shutdown_while_loading_closes_what_loading_starts(tiny_model, repo):
    host = SessionHost(loading_session(tiny_model, repo))
    gate = BackendGate()
    loading = asyncio.ensure_future(host.load(start=gate))
    await gate.reached()
    host.close()
    with pytest.raises(NotReadyError, match="shut down"):
        await host.ready()
    gate.open.set()
    with pytest.raises(NotReadyError):
        await loading
    assert host.ready_now() is None
    assert gate.backend.stats()["closed"] is True  # the engine started after the shutdown is closed


async def test_an_exit_that_cancels_loading_still_closes_the_engine(tiny_model, repo):
    """The language server's `exit` cancels the start-up task and closes the host."""
    host = SessionHost(loading_session(tiny_model, repo))
    gate = BackendGate()
    loading = asyncio.ensure_future(host.load(start=gate))
    await gate.reached()
    loading.cancel()
    host.close()
    with pytest.raises(asyncio.CancelledError):
        await loading
    with pytest.raises(NotReadyError):
        await host.ready()
    gate.open.set()
    await host.wait_closed()
    assert gate.backend.stats()["closed"] is True


class ScanGate:
    """Wraps the host's scan progress: the scan's first report waits until the test lets it go,
    so "while scanning" is a state the test controls; records every report and the stop."""

    def __init__(self, host: SessionHost) -> None:
        self.reports: list[tuple[str, int, int]] = []
        self.scanning, self.go, self.stopped = threading.Event(), threading.Event(), threading.Event()
        real = host._scan_progress

        def gated(stage, stop):
            progress = real(stage, stop)

            def report(step: str, done: int, total: int) -> None:
                self.reports.append((step, done, total))
                if len(self.reports) == 1:
                    self.scanning.set()
                    assert self.go.wait(60), "the test never let the scan go on"
                try:
                    progress(step, done, total)
                except ScanStopped:
                    self.stopped.set()
                    raise

            return report

        host._scan_progress = gated


@pytest.mark.parametrize("how", ["shutdown", "cancel"])
async def test_a_shutdown_or_cancel_while_scanning_stops_the_scan(tiny_model, repo, how):
    """`exit` (the host closed) or a cancelled load progress (the start-up task cancelled) while a
    large repository is scanned: the scan's thread stops at its next file instead of finishing
    (the process's exit waited for it: 8 s on a 600-file repository)."""
    host = SessionHost(loading_session(tiny_model, repo))
    gate, stages = ScanGate(host), []
    loading = asyncio.ensure_future(host.load(stage=stages.append))
    assert await asyncio.to_thread(gate.scanning.wait, 120), "the scan never started"
    if how == "shutdown":
        host.close()
        gate.go.set()
        with pytest.raises(NotReadyError, match="shut down"):  # once the scan's thread has stopped
            await loading
    else:
        loading.cancel()
        with pytest.raises(asyncio.CancelledError):  # at once: the scan's thread still waits in the gate
            await loading
        gate.go.set()
    assert await asyncio.to_thread(gate.stopped.wait, 60)
    assert gate.reports == [("parsing", 1, gate.reports[0][2])]  # stopped at the first file it reported
    assert stages == [f"scanning {repo}"]
    host.close()


async def test_the_scan_reports_its_files_as_load_stages(tiny_model, repo):
    host = SessionHost(loading_session(tiny_model, repo))
    stages: list[str] = []
    ready = await host.load(stage=stages.append)
    files = len(ready.prompt.workspace.layout.rows)
    assert stages[0] == f"scanning {repo}" and f"scanning {repo}: parsing {files}/{files} files" in stages
    reported = list(stages)
    await asyncio.to_thread(ready.prompt.rescan)  # a later build (reindex): the load's progress has ended
    assert stages == reported
    host.close()
