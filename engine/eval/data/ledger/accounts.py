"""Accounts and the movements of money between them."""
from dataclasses import dataclass, field

from ledger.errors import FrozenAccountError, InsufficientFundsError


def record_audit_entry(trail: list, kind: str, amount: int) -> None:
    """Append one entry to an account's audit trail."""
    trail.append((kind, amount))


@dataclass
class Account:
    owner: str
    balance: int = 0
    frozen: bool = False
    trail: list = field(default_factory=list)

    def deposit(self, amount: int) -> None:
        self.balance += amount
        record_audit_entry(self.trail, "deposit", amount)

    def withdraw(self, amount: int) -> None:
        if self.frozen:
            raise FrozenAccountError(self.owner)
        if amount > self.balance:
            raise InsufficientFundsError(f"{self.owner} has {self.balance}, asked {amount}")
        self.balance -= amount
        record_audit_entry(self.trail, "withdraw", amount)
