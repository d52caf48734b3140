"""Fees charged on transfers."""
from decimal import ROUND_HALF_EVEN, Decimal

FEE_RATES = {"standard": Decimal("0.015"), "premium": Decimal("0.0075")}
MINIMUM_FEE_CENTS = 35


def transfer_fee(plan: str, amount_cents: int) -> int:
    """The fee in cents for moving `amount_cents` under `plan`, never below the minimum."""
    fee = (Decimal(amount_cents) * FEE_RATES[plan]).quantize(Decimal(1), rounding=ROUND_HALF_EVEN)
    return max(int(fee), MINIMUM_FEE_CENTS)
