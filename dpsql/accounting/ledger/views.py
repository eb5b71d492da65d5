"""Continual-release views in the ledger: the record that declares one, and those of its values.

A view (``VIEW_RECORD``) is a query on the table of a person-within-period unit, answered
period by period over a calendar of ``horizon`` periods from ``start`` (each a day, a week or a
month); its cost was reserved by the charge it names, for every period of the calendar
(``dpsql.session.views``). Each released value (``VIEW_VALUE``) is one node of its mechanism
(``dpsql.plan.views``): a range of periods [start, end), the group keys and, per measurement,
the noisy totals in the keys' order. Released values are public; everything read from them is
post-processing.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from dpsql.accounting.ledger.chain import Record

__all__ = ["VIEW_NAME", "VIEW_RECORD", "VIEW_VALUE", "Calendar", "View", "view_values", "views"]

VIEW_RECORD = "view"
VIEW_VALUE = "view_value"
VIEW_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
Every = Literal["day", "week", "month"]


@dataclass(frozen=True)
class Calendar:
    """``horizon`` periods from ``start``, each a day, a week or a calendar month long."""

    start: dt.date
    every: Every
    horizon: int

    def bounds(self, i: int) -> tuple[dt.date, dt.date]:
        """Period i's [start, end)."""
        return self._at(i), self._at(i + 1)

    def _at(self, i: int) -> dt.date:
        if self.every == "day":
            return self.start + dt.timedelta(days=i)
        if self.every == "week":
            return self.start + dt.timedelta(weeks=i)
        month = self.start.month - 1 + i
        return self.start.replace(year=self.start.year + month // 12, month=month % 12 + 1)

    def reserved(self) -> list[list[str]]:
        """Every period as a reservation names it in a charge's details: [id, start, end], the
        id its start (``dpsql.session.periods.Persons.read``)."""
        return [[a.isoformat(), a.isoformat(), b.isoformat()]
                for a, b in map(self.bounds, range(self.horizon))]  # fmt: skip


@dataclass(frozen=True)
class View:
    """A declared view: its name, query, calendar, mechanism, the epsilon and delta each period
    pays per person-period, the charge that reserved them, and who declared it."""

    name: str
    sql: str
    table: str
    calendar: Calendar
    mechanism: str
    epsilon: Fraction
    delta: Fraction
    charge: int
    by: str
    seq: int = 0

    def payload(self) -> dict[str, Any]:
        return {
            "name": self.name, "sql": self.sql, "table": self.table,
            "start": self.calendar.start.isoformat(), "every": self.calendar.every,
            "horizon": self.calendar.horizon, "mechanism": self.mechanism,
            "epsilon": str(self.epsilon), "delta": str(self.delta), "charge": self.charge,
            "by": self.by,
        }  # fmt: skip

    @classmethod
    def of(cls, p: Mapping[str, Any], seq: int) -> View:
        every = str(p["every"])
        assert every in ("day", "week", "month")  # written by ``payload``
        calendar = Calendar(dt.date.fromisoformat(str(p["start"])), every, int(p["horizon"]))  # type: ignore[arg-type]
        return cls(str(p["name"]), str(p["sql"]), str(p["table"]), calendar,
                   str(p["mechanism"]), Fraction(str(p["epsilon"])), Fraction(str(p["delta"])),
                   int(p["charge"]), str(p["by"]), seq)  # fmt: skip


def views(records: Sequence[Record]) -> dict[str, View]:
    """Every declared view, by name."""
    return {str(r.payload["name"]): View.of(r.payload, r.seq)
            for r in records if r.kind == VIEW_RECORD}  # fmt: skip


def view_values(records: Sequence[Record], name: str) -> dict[tuple[int, int], dict[str, Any]]:
    """A view's released values by node [start, end): {"keys": ..., "values": ...}."""
    out = {}
    for r in records:
        if r.kind == VIEW_VALUE and r.payload["view"] == name:
            out[(int(r.payload["start"]), int(r.payload["end"]))] = dict(r.payload)
    return out
