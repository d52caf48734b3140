"""`codectx serve` options: TCP binds loopback unless a host is given."""
from __future__ import annotations

import argparse

import pytest

from server.serve_cmd import LOOPBACK, _host_port, add_arguments


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
