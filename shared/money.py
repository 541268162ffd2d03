"""Money is integers: credit and tokens in base units everywhere (ledger, wire, page, CLI).

- **Credit** is counted in micro-units: one generated token earns :data:`CREDIT_PER_UNIT` (a
  million) of them, so a weighted prompt token (0.1 of a unit by default) is a whole number too.
- **Tokens** (stakes, claims, slashes) are counted in the reward token's base units
  (:data:`TOKEN_DECIMALS` decimals). One whole unit of final credit pays one whole token.

People type and read amounts as exact decimals ("12.5" tokens); :func:`parse_decimal` and
:func:`format_decimal` convert without ever passing through a float.
"""

from __future__ import annotations

from decimal import Context, Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema

CREDIT_DECIMALS = 6
CREDIT_PER_UNIT = 10**CREDIT_DECIMALS
"""Credit base units (micro-units) per work unit: one generated token."""
TOKEN_DECIMALS = 18
TOKEN = 10**TOKEN_DECIMALS
"""Token base units per whole token."""
TOKEN_BASE_PER_CREDIT = TOKEN // CREDIT_PER_UNIT
"""Token base units paid per credit micro-unit (a unit of final credit pays one token)."""


def _whole_base_units(value: Any) -> int:
    # JSON numbers past 2**53 are not exact in every client: amounts travel as decimal strings,
    # and a float (or a bool) is refused rather than rounded.
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("an amount is a whole number of base units, as a decimal string")
    if isinstance(value, str) and not (value.isascii() and value.isdigit() and len(value) <= 78):
        raise ValueError("an amount is a whole number of base units, as a decimal string")
    return int(value)


TokenAmount = Annotated[
    int,
    BeforeValidator(_whole_base_units),
    Field(ge=0, lt=2**256),
    PlainSerializer(str, return_type=str),
    WithJsonSchema({"type": "string", "pattern": "^[0-9]{1,78}$", "description": "token base units (18 decimals)"}),
]
"""Token base units on the wire: a decimal string (an int is accepted), never a float."""


_MOST_DIGITS = 77
"""Digits of the largest amount (below 2**256, what the contracts hold)."""
_EXACT = Context(prec=_MOST_DIGITS + 40, traps=[InvalidOperation])


def parse_decimal(text: str, decimals: int, *, allow_zero: bool = False) -> int:
    """``"12.5"`` as base units of ``decimals`` places; ValueError (one sentence) for anything that is
    not a non-negative decimal with at most that many places (or is zero, unless ``allow_zero``)."""
    try:
        exact = Decimal(text.strip()).scaleb(decimals, _EXACT)
    except (InvalidOperation, AttributeError):
        raise ValueError(f"{text!r} is not an amount") from None
    if not exact.is_finite() or exact.adjusted() >= _MOST_DIGITS:
        raise ValueError(f"{text!r} is not an amount this network can hold")
    if exact < 0 or exact != exact.to_integral_value() or (exact == 0 and not allow_zero):
        raise ValueError(
            f"{text!r}: give a {'non-negative' if allow_zero else 'positive'} amount with at most {decimals} decimals"
        )
    return int(exact)


def format_decimal(amount: int, decimals: int) -> str:
    """Base units as an exact decimal, trailing zeros dropped: ``12500000, 6 -> "12.5"``."""
    sign = "-" if amount < 0 else ""
    whole, frac = divmod(abs(amount), 10**decimals)
    digits = f"{frac:0{decimals}d}".rstrip("0")
    return f"{sign}{whole}.{digits}" if digits else f"{sign}{whole}"


def tokens(amount: int) -> str:
    """Token base units as whole tokens, exactly."""
    return format_decimal(amount, TOKEN_DECIMALS)


def parse_tokens(text: str, *, allow_zero: bool = False) -> int:
    return parse_decimal(text, TOKEN_DECIMALS, allow_zero=allow_zero)


def credit(amount: int) -> str:
    """Credit micro-units as work units, exactly."""
    return format_decimal(amount, CREDIT_DECIMALS)


def credit_of(tokens_generated: int, prompt_tokens: int, prompt_token_weight: Decimal) -> int:
    """Credit micro-units for accepted work: each generated token one unit, each prompt token
    ``prompt_token_weight`` of one (rounded down to a micro-unit, the same on every replica)."""
    return int(tokens_generated * CREDIT_PER_UNIT) + int(prompt_token_weight * prompt_tokens * CREDIT_PER_UNIT)
