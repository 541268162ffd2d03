"""How the ledger stores what SQL has no type for: aware UTC times, token amounts wider than any
SQL integer, and the ledger's vocabularies (:mod:`shared.states`)."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, Enum, String, TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every backend (SQLite keeps no zone, so store naive UTC)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, _dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the ledger; use datetime.now(UTC)")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, _dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


def states_type(states: type[enum.StrEnum]) -> Enum:
    """A column of one of the ledger's vocabularies (:mod:`shared.states`): VARCHAR(16) holding the
    value, as the plain string columns before it did (no data change), read back as the enum member;
    writing a string outside the vocabulary fails."""
    return Enum(states, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e], validate_strings=True)


class TokenAmount(TypeDecorator[int]):
    """Token base units: integers beyond any SQL integer type (18 decimals), kept as decimal text."""

    impl = String(80)
    cache_ok = True

    def process_bind_param(self, value: int | None, _dialect: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"a token amount is a non-negative integer of base units, not {value!r}")
        return str(value)

    def process_result_value(self, value: str | None, _dialect: Any) -> int | None:
        return None if value is None else int(value)
