"""Where the API key comes from: ``CODECTX_API_KEY``, a key file, or (warned about) the command line.

``--api-key VALUE`` shows the key to every user of the machine in the process
list, so it still works but logs a warning; the environment variable or a
file only its owner can read (``--api-key-file``) keep it out of sight. A
world-readable key file is refused, as ssh refuses such private keys. The key
itself is never logged.
"""
from __future__ import annotations

import logging
import stat
from pathlib import Path

from .config import API_KEY_ENV, HttpConfigError, key_from_env

logger = logging.getLogger(__name__)


def read_key_file(path: Path) -> str:
    """The API key in `path`, without its trailing newline.

    Raises:
        HttpConfigError: The file is missing, not a regular file, readable or
            writable by every user (the key would not be secret), empty, or
            longer than one line.
    """
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise HttpConfigError(f"--api-key-file {path} is not a regular file")
        if info.st_mode & (stat.S_IROTH | stat.S_IWOTH):
            raise HttpConfigError(f"--api-key-file {path} is readable or writable by every user of this machine "
                                  f"(mode {stat.S_IMODE(info.st_mode):o}); run: chmod 600 {path}")
        key = path.read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as err:
        raise HttpConfigError(f"cannot read --api-key-file {path}: {err}") from err
    if not key.strip():
        raise HttpConfigError(f"--api-key-file {path} is empty")
    if any(c in key for c in "\r\n"):
        raise HttpConfigError(f"--api-key-file {path} holds more than one line; put the key alone on one line")
    return key


def resolve_api_key(option: str | None, key_file: Path | None) -> str | None:
    """The API key from ``--api-key-file``, ``--api-key`` (warned about) or ``CODECTX_API_KEY``.

    Raises:
        HttpConfigError: Both options given, or an unusable key file.
    """
    if option and key_file:
        raise HttpConfigError("pass either --api-key or --api-key-file, not both")
    if key_file is not None:
        return read_key_file(key_file)
    if option:
        logger.warning("--api-key is visible to every user of this machine in the process list; "
                       "set %s or use --api-key-file instead", API_KEY_ENV)
    return key_from_env(option)
