"""Key values as the ledger stores them: JSON that reads back to the same Python value and
type (a date stays a date, a Decimal a Decimal), so a released group's key is served exactly."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

__all__ = ["plain", "typed"]


def plain(value: Any) -> Any:
    """``value`` as JSON; a type that would not read back exactly raises TypeError."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dt.datetime):
        return {"datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"date": value.isoformat()}
    if isinstance(value, Decimal):
        return {"decimal": str(value)}
    raise TypeError("a key value of this type is not cached")


def typed(value: Any) -> Any:
    """The value ``plain`` stored."""
    if isinstance(value, dict):
        if "datetime" in value:
            return dt.datetime.fromisoformat(value["datetime"])
        if "date" in value:
            return dt.date.fromisoformat(value["date"])
        if "decimal" in value:
            return Decimal(value["decimal"])
    return value
