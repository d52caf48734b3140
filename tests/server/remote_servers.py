"""Engine servers started by the tests on loopback (mlx_lm.server, llama.cpp's llama-server)
and `codectx ask` run in process against them."""
from __future__ import annotations

import io
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench._common import llama_tools_folder
from server import ask_cmd
from tests.http.http_harness import free_port  # noqa: F401 - the remote tests take it from here

START_TIMEOUT_S = 120


def wait_for_line(process: subprocess.Popen, marker: bytes) -> None:
    """Reads the process's stderr until a line holds `marker` (fails if it exits or takes too
    long). A thread reads the lines: a buffered pipe may hold several while the descriptor
    shows none left."""
    lines: queue.Queue[bytes | None] = queue.Queue()

    def read() -> None:
        for line in iter(process.stderr.readline, b""):
            lines.put(line)
        lines.put(None)  # end of stderr: the process is gone (or closed it)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    seen = b""
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            status = process.wait(timeout=5)
            raise AssertionError(f"the server exited before it started (status {status}): {seen[-2000:]!r}")
        seen += line
        if marker in line:
            return
    raise AssertionError(f"the server did not start in {START_TIMEOUT_S} s: {seen[-2000:]!r}")


def ask(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = ask_cmd.main(list(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def footer(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("[prompt "))


def prompt_and_cached(footer_line: str) -> tuple[int, int]:
    """(prompt tokens, cached tokens) of an ask footer."""
    prompt = int(footer_line.split("[prompt ")[1].split(" ")[0])
    return prompt, int(footer_line.split("(cached ")[1].split(",")[0])


def llama_server_dir() -> Path:
    """Where scripts/build-llama-server.sh put `llama-server` and its libraries (dev-setup builds it)."""
    folder = llama_tools_folder()
    assert (folder / "llama-server").is_file(), f"no llama-server in {folder}: run scripts/dev-setup.sh"
    return folder


def start_llama_server(gguf: Path, context: int = 4096, slots: int | None = None) -> tuple[subprocess.Popen, str]:
    """llama.cpp's server on `gguf`, on a free loopback port; (process, API root) once it listens."""
    folder, port = llama_server_dir(), free_port()
    parallel = ["-np", str(slots)] if slots else []
    return _start([str(folder / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                   "-c", str(context), "-t", "2", *parallel], port, b"listening on http",
                  env={**os.environ, "LD_LIBRARY_PATH": str(folder)})


def start_mlx_server(model: Path, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """`mlx_lm.server` on `model`, on loopback (a free port unless given); (process, API root) once it listens."""
    port = port or free_port()
    return _start([sys.executable, "-m", "mlx_lm.server", "--model", str(model), "--host", "127.0.0.1",
                   "--port", str(port)], port, b"Starting httpd")


def _start(argv: list[str], port: int, ready_line: bytes, env: dict[str, str] | None = None,
           ) -> tuple[subprocess.Popen, str]:
    """Start a server; (process, API root) once its stderr prints `ready_line` (killed if it never does)."""
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
    try:
        wait_for_line(process, ready_line)
    except AssertionError:
        process.kill()
        raise
    return process, f"http://127.0.0.1:{port}/v1"
