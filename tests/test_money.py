"""Money is integers: exact conversions, wire amounts that refuse floats, roots whose sums are exact."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from intellect_protocol.shared.money import (
    CREDIT_DECIMALS,
    TOKEN,
    TokenAmount,
    credit_of,
    format_decimal,
    parse_decimal,
    parse_tokens,
    tokens,
)
from intellect_protocol.shared.settlement import cumulative_amounts

pytestmark = pytest.mark.unit


@given(st.integers(min_value=0, max_value=10**30), st.sampled_from([0, 6, 18]))
def test_format_then_parse_is_the_identity(amount: int, decimals: int) -> None:
    assert parse_decimal(format_decimal(amount, decimals), decimals, allow_zero=True) == amount


@pytest.mark.parametrize("text", ["-1", "0.0000000000000000001", "abc", "NaN", "Infinity", "0", "", "1e400"])
def test_amounts_people_type_are_refused_in_one_sentence(text: str) -> None:
    with pytest.raises(ValueError, match="amount"):
        parse_tokens(text)


def test_a_decimal_amount_is_exact() -> None:
    assert parse_tokens("12.5") == 12 * TOKEN + TOKEN // 2 and tokens(12 * TOKEN + TOKEN // 2) == "12.5"
    assert parse_tokens("0", allow_zero=True) == 0
    # 0.1 of a unit per prompt token, 7 prompt tokens: exactly 0.7 units, not 0.7000000000000001.
    assert (
        credit_of(3, 7, Decimal("0.1")) == 3_700_000 and format_decimal(credit_of(3, 7, Decimal("0.1")), CREDIT_DECIMALS) == "3.7"
    )


class _Body(BaseModel):
    amount: TokenAmount


def test_wire_amounts_are_decimal_strings_and_floats_are_refused() -> None:
    big = 123 * TOKEN + 1  # beyond 2**53: a float would round it
    assert _Body.model_validate({"amount": str(big)}).amount == big
    assert _Body.model_validate({"amount": big}).model_dump(mode="json") == {"amount": str(big)}
    for bad in (1.5, 20.0, True, "-1", "1.5", "1e18", " 1", "9" * 79):
        with pytest.raises(ValidationError):
            _Body.model_validate({"amount": bad})


@given(st.lists(st.integers(min_value=-(10**12), max_value=10**12), min_size=1, max_size=40), st.randoms())
def test_cumulative_amounts_do_not_depend_on_the_order_of_entries(units: list[int], rng) -> None:
    now = datetime.now(UTC)
    entries = [(i + 1, "0x" + f"{i % 3:040x}", u, now) for i, u in enumerate(units)]
    shuffled = list(entries)
    rng.shuffle(shuffled)
    assert cumulative_amounts(entries, len(entries), now) == cumulative_amounts(shuffled, len(entries), now)
