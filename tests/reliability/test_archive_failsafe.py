"""The disk archive fails safe in the real language server (`codectx serve` over stdio).

An archive folder that cannot be written, or a disk that refuses a write, turns the
archive off with exactly one warning while every request still answers; a crafted
index never reaches a file outside the archive; a lowered cap applies at start.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from lsprotocol import types
from pytest_lsp import ClientServerConfig

from tests.server.harness import build_server_test_model, command, default_options, start, write_sample_workspace

REPO_ROOT = Path(__file__).resolve().parents[2]
ARCHIVE_BYTES = 64 << 20
OFF = "archive off:"
# Starts the server with a file-size limit: a write past it fails with EFBIG, as on a full
# disk, whatever the user's privileges (root ignores a read-only mode, not this limit).
LIMITED_SERVE = ("import resource, runpy, sys; n = int(sys.argv.pop(1)); "
                 "resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
                 "runpy.run_module('server.serve_cmd', run_name='__main__', alter_sys=True)")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_server_test_model(tmp_path_factory.mktemp("model"))


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def workspace(tmp_path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return write_sample_workspace(root)


@contextlib.asynccontextmanager
async def served(home: Path, workspace: Path, model: Path, log: Path, archive_bytes: int = ARCHIVE_BYTES,
                 file_limit: int | None = None):
    """The real server with the archive on, logging warnings to `log`; shut down on exit."""
    serve = ["-m", "server.serve_cmd"] if file_limit is None else ["-c", LIMITED_SERVE, str(file_limit)]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), CODECTX_HOME=str(home))
    config = ClientServerConfig(server_command=[sys.executable, *serve, "--log-level", "WARNING",
                                                "--log-file", str(log)], server_env=env)
    client = await config.start()
    options = default_options(model, memory={"archiveEnabled": True, "archiveBytes": archive_bytes})
    await start(client, "vscode", workspace, options)
    try:
        await command(client, "codectx.showContext")  # answers once the model is loaded
        yield client
    finally:
        await client.shutdown_session()


async def ask_ok(client, question: str = "What does add do?") -> dict:
    result = await command(client, "codectx.ask", question=question, maxTokens=6)
    assert result["text"] and result["finishReason"] in ("length", "stop"), result
    return result


def off_warnings(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if OFF in line]


def block_archive_folder(home: Path) -> tuple[str, ...]:
    """Make ``home/archive`` unwritable: read-only, or for root a file in its place.

    Returns:
        The errors a write into it can meet (as `strerror` words them).
    """
    folder = home / "archive"
    folder.mkdir(parents=True)
    folder.chmod(0o555)
    try:
        (folder / "probe").write_bytes(b"")  # succeeds only where permissions do not bind (root)
    except PermissionError:
        return ("Permission denied",)
    (folder / "probe").unlink()
    folder.chmod(0o755)
    folder.rmdir()
    folder.write_text("a file where the archive folder should be")
    return ("Not a directory", "File exists")


async def test_unwritable_archive_folder_is_switched_off_and_requests_answer(home, workspace, tiny_model,
                                                                          tmp_path):
    causes = block_archive_folder(home)
    log = tmp_path / "server.log"
    try:
        async with served(home, workspace, tiny_model, log) as client:
            first = await ask_ok(client)
            second = await ask_ok(client)  # served from in-memory checkpoints
            state = (await command(client, "codectx.status"))["engine"]
            shown = [m.message for m in client.messages if "checkpoint archive off" in m.message]
    finally:
        (home / "archive").chmod(0o755)
    assert len(shown) == 1 and "answers still work" in shown[0]  # the editor tells the user, once
    assert second["metrics"]["cached_tokens"] > 0 and second["text"] == first["text"]
    assert state["archive"].startswith("off: cannot write") and any(c in state["archive"] for c in causes)
    assert state["requests_failed"] == 0
    warnings = off_warnings(log)
    assert len(warnings) == 1 and "WARNING engine.archive" in warnings[0] and state["archive"][5:] in warnings[0]


def test_doctor_reports_the_archive_off_and_stays_ready(home):
    causes = block_archive_folder(home)
    try:
        result = subprocess.run([sys.executable, "-m", "server.cli", "doctor"], capture_output=True, text=True,
                                env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), CODECTX_HOME=str(home)),
                                timeout=120, stdin=subprocess.DEVNULL)
    finally:
        (home / "archive").chmod(0o755)
    lines = result.stdout.splitlines()
    archive = [line for line in lines if line.startswith(("ok    archive", "warn  archive"))]
    assert archive and archive[0].startswith("warn  archive: archive off: cannot write")
    assert any(c in archive[0] for c in causes)
    assert result.returncode == 0 and lines[-1] == "ready: true"


async def test_write_failures_on_a_full_disk_switch_the_archive_off_once(home, workspace, tiny_model, tmp_path):
    log = tmp_path / "server.log"
    async with served(home, workspace, tiny_model, log, file_limit=4096) as client:
        before = (await command(client, "codectx.status"))["engine"]["archive"]
        await ask_ok(client)  # its checkpoints (8 KiB and more) cannot be written
        await ask_ok(client, "Explain greet.")
        while not any(OFF in m.message for m in client.log_messages):  # the writer thread's first failed write
            await client.wait_for_notification(types.WINDOW_LOG_MESSAGE)
        state = (await command(client, "codectx.status"))["engine"]
    assert before == "on"
    assert state["archive"].startswith("off: cannot write") and "File too large" in state["archive"]
    assert state["requests_failed"] == 0 and state["cache"]["archive_entries"] == 0
    assert len(off_warnings(log)) == 1


async def test_restart_over_an_archive_that_can_no_longer_be_written(home, workspace, tiny_model, tmp_path):
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    async with served(home, workspace, tiny_model, first_log) as client:
        reference = await ask_ok(client)
    (index,) = (home / "archive").glob("*/index.msgpack")
    limit = 1024
    assert index.stat().st_size > limit  # rewriting the index at start fails
    async with served(home, workspace, tiny_model, second_log, file_limit=limit) as client:
        state = (await command(client, "codectx.status"))["engine"]
        again = await ask_ok(client)
    assert state["archive"].startswith("off: cannot write") and "File too large" in state["archive"]
    assert again["text"] == reference["text"]
    assert len(off_warnings(second_log)) == 1 and off_warnings(first_log) == []


async def test_crafted_index_cannot_reach_outside_and_a_lowered_cap_applies_at_start(home, workspace,
                                                                                    tiny_model, tmp_path):
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    async with served(home, workspace, tiny_model, first_log) as client:
        await ask_ok(client)
        policy = (await command(client, "codectx.status"))["engine"]["cache"]["policy"]
    folder = home / "archive" / policy
    index = msgpack.unpackb((folder / "index.msgpack").read_bytes(), raw=False)
    real = {k: dict(row) for k, row in index["entries"].items()}
    assert len(real) >= 3
    # Files the old code would have unlinked when evicting these (oldest) rows.
    victims = [home / "victim.safetensors", tmp_path / "outside" / "victim.safetensors"]
    victims[1].parent.mkdir()
    template = next(iter(real.values()))
    for victim, key in zip(victims, ["../../victim", str(victims[1].with_suffix(""))]):
        victim.write_bytes(b"keep me" * 100)
        index["entries"][key] = dict(template, key=key, size=victim.stat().st_size, last_used=0.0)
    (folder / "index.msgpack").write_bytes(msgpack.packb(index, use_bin_type=True))
    cap = sum(row["size"] for row in real.values()) // 2
    async with served(home, workspace, tiny_model, second_log, archive_bytes=cap) as client:
        at_start = (await command(client, "codectx.status"))["engine"]
        on_disk = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        await ask_ok(client, "Explain greet.")
        after = (await command(client, "codectx.status"))["engine"]
    assert at_start["archive"] == "on" and 0 < at_start["cache"]["archive_entries"] < len(real)
    assert on_disk <= cap and at_start["cache"]["archive_bytes"] <= cap  # before any write
    assert after["archive"] == "on" and after["requests_failed"] == 0
    assert all(v.read_bytes() == b"keep me" * 100 for v in victims)
    assert "dropping 2 archive index entries that are not plain archive names" in second_log.read_text()
    assert sum(p.stat().st_size for p in folder.glob("*.safetensors")) <= cap
