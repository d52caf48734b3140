"""Where the HTTP server listens and what it accepts: one typed, defaulted dataclass."""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"
API_KEY_ENV = "CODECTX_API_KEY"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


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
    """

    host: str = LOOPBACK
    port: int = 8765
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_prompt_tokens: int | None = None
    recent_requests: int = 50

    def validate(self) -> None:
        """Raises:
            HttpConfigError: A non-loopback address without an API key, or bad limits.
        """
        if not is_loopback(self.host) and not self.api_key:
            raise HttpConfigError(
                f"refusing to listen on {self.host} without an API key: pass --api-key or set "
                f"{API_KEY_ENV} (loopback addresses need none)")
        if self.max_body_bytes < 1024:
            raise HttpConfigError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise HttpConfigError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost"."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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
