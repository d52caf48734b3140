"""`codectx serve` options: TCP binds loopback, and only loopback (the language server has no key)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from server.serve_cmd import LOOPBACK, _host_port, add_arguments

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_tcp_defaults_to_loopback():
    assert _host_port("9000") == (LOOPBACK, 9000)
    assert _host_port(":9000") == (LOOPBACK, 9000)
    assert _host_port("0.0.0.0:7") == ("0.0.0.0", 7)


def test_bad_port_is_rejected():
    with pytest.raises(argparse.ArgumentTypeError):
        _host_port("localhost:http")


def test_stdio_is_the_default():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    assert args.tcp is None and args.log_file is None


@pytest.mark.parametrize("address", ["0.0.0.0:9000", "[::]:9000", "192.0.2.2:9000", "example.org:9000"])
def test_tcp_on_an_address_other_machines_reach_is_refused(address, tmp_path):
    """Whoever connects to the language server is its editor: it picks the workspace, the engine URL and the
    key file sent there. With no key to ask for, `--tcp` takes loopback hosts only."""
    result = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--tcp", address], capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), CODECTX_HOME=str(tmp_path)))
    assert result.returncode == 2 and "loopback only" in result.stderr and "SSH" in result.stderr


@pytest.mark.parametrize("address, expected", [("9000", (LOOPBACK, 9000)), ("localhost:9000", ("localhost", 9000)),
                                               ("127.0.0.2:9000", ("127.0.0.2", 9000)), ("[::1]:9000", ("::1", 9000))])
def test_tcp_on_loopback_is_accepted(address, expected):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--tcp", address]).tcp == expected
