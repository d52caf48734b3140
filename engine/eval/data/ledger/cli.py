"""Command line of the ledger service."""
import argparse

from ledger.config import port


def format_currency(cents: int) -> str:
    """Cents as text, e.g. 123456 -> '1,234.56'."""
    return f"{cents // 100:,}.{cents % 100:02d}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ledger-admin")
    parser.add_argument("--port", type=int, default=port())
    parser.add_argument("--dry-run", action="store_true", help="print what would change")
    return parser
