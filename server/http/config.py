"""Where the HTTP server listens and what it accepts: one typed, defaulted dataclass."""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

LOOPBACK = "127.0.0.1"
WILDCARD_HOSTS = ("0.0.0.0", "::")
"""Addresses that bind every interface."""
API_KEY_ENV = "CODECTX_API_KEY"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_CONNECTIONS = 65_536
"""Most connections (and prompt workers) a server takes: above it a listen backlog overflows the socket call."""


class HttpConfigError(ValueError):
    """A listen address or option the server refuses to start with."""


@dataclass(frozen=True)
class HttpConfig:
    """HTTP server options.

    Attributes:
        host: Address to bind; loopback unless asked otherwise.
        port: TCP port (0 picks a free one).
        api_key: Required on every endpoint when set; mandatory off loopback.
        max_body_bytes: Larger request bodies are refused with 413.
        max_prompt_tokens: Longer prompts are refused with 400 (None: the
            model's context length).
        recent_requests: Completed requests the monitor keeps.
        allowed_hosts: Host names accepted in the ``Host`` header besides
            loopback names and the bound address (DNS-rebinding guard).
        allowed_origins: Browser origins (``scheme://host[:port]``) allowed to
            call the API cross-origin; every other foreign origin gets 403.
        max_connections: Open connections served at once; more get 503.
        idle_timeout_s: A connection that sends nothing for this long while no
            request is in progress is closed.
        request_timeout_s: Time a client has to send a whole request (head and
            body) once it has started one; slower clients get 408.
        prompt_workers: Threads that parse bodies and tokenize prompts.
    """

    host: str = LOOPBACK
    port: int = 8765
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_prompt_tokens: int | None = None
    recent_requests: int = 50
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    max_connections: int = 64
    idle_timeout_s: float = 5.0
    request_timeout_s: float = 30.0
    prompt_workers: int = 2

    def validate(self) -> None:
        """Raises:
            HttpConfigError: A non-loopback address without an API key, bad limits,
                or a malformed host name or origin.
        """
        if not is_loopback(self.host) and not self.api_key:
            raise HttpConfigError(
                f"refusing to listen on {self.host} without an API key: set {API_KEY_ENV} or pass "
                f"--api-key-file (loopback addresses need none)")
        if self.max_body_bytes < 1024:
            raise HttpConfigError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise HttpConfigError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        if not (1 <= self.max_connections <= MAX_CONNECTIONS and 1 <= self.prompt_workers <= MAX_CONNECTIONS):
            raise HttpConfigError(f"max_connections and prompt_workers must be 1 to {MAX_CONNECTIONS}")
        if not (0 < self.idle_timeout_s and 0 < self.request_timeout_s):
            raise HttpConfigError("idle_timeout_s and request_timeout_s must be > 0")
        for name in self.allowed_hosts:
            normalize_host_name(name)
        for origin in self.allowed_origins:
            normalize_origin(origin)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost"."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def normalize_host_name(name: str) -> str:
    """A configured host name, lower-cased, without brackets or a trailing dot.

    Raises:
        HttpConfigError: The name carries a port, a scheme or a path.
    """
    value = name.strip().lower().rstrip(".")
    bare = value.strip("[]")
    if not bare or any(c in value for c in "/@ ") or (":" in bare and not is_ip_literal(bare)):
        raise HttpConfigError(f"--allow-host takes a host name or address without a port, got {name!r}")
    return bare


def normalize_origin(origin: str) -> str:
    """A configured origin as browsers send it: ``scheme://host[:port]``, lower-case, no path.

    Raises:
        HttpConfigError: Not an http(s) origin, or "*".
    """
    value = origin.strip().lower().rstrip("/")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as err:
        raise HttpConfigError(f"--allow-origin: cannot parse {origin!r}") from err
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query \
            or parts.username is not None:
        raise HttpConfigError(f"--allow-origin takes an origin such as http://localhost:3000 (no path, "
                              f"no wildcard), got {origin!r}")
    return value


def is_ip_literal(value: str) -> bool:
    """True for an IPv4 or IPv6 address (without brackets)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def parse_listen(value: str) -> tuple[str, int]:
    """`[HOST:]PORT` -> (host, port); the host defaults to loopback.

    Raises:
        HttpConfigError: The port is not a number in 0..65535.
    """
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = LOOPBACK, value
    if not port.isdigit() or int(port) > 65535:
        raise HttpConfigError(f"expected [HOST:]PORT, got {value!r}")
    return host.strip("[]") or LOOPBACK, int(port)


def key_from_env(option: str | None) -> str | None:
    """The API key from the option, else from ``CODECTX_API_KEY`` (empty means none)."""
    return option or os.environ.get(API_KEY_ENV) or None
