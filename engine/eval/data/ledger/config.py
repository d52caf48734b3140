"""Settings for the ledger service, read once at start-up."""
import os

DEFAULT_PORT = 8731
SESSION_TIMEOUT_SECONDS = 2750
DATA_DIR = os.environ.get("LEDGER_DATA", "/var/lib/ledger")


def port() -> int:
    """The port to listen on: LEDGER_PORT when set, else DEFAULT_PORT."""
    return int(os.environ.get("LEDGER_PORT", DEFAULT_PORT))
