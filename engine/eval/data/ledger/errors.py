"""Errors raised by the ledger package."""


class LedgerError(Exception):
    """Base class of every ledger error."""


class InsufficientFundsError(LedgerError):
    """A withdrawal or transfer asked for more than the balance holds."""


class FrozenAccountError(LedgerError):
    """The account is frozen by an administrator; no money may leave it."""
