"""The diagnosis of the bounds as released: fractions of units each flag marks, with their ±.

Post-processing of the noisy histogram (``dpsql.noise.measure.measure_diagnosis``) only: a
flag's fraction is the sum of the cells whose pattern has the flag over the sum of all cells
(each sum floored at 0, as a true count is), and "any" takes every cell but the unflagged one.

The ± of a fraction covers the noise of the histogram: every cell is within its exact noise
half-width h at confidence c^(1/K) (K cells, independent noises, so all of them are at once with
probability at least c), and the fraction's interval is its range over that box: with A the
flagged cells and B the others, A/(A + B) rises with A and falls with B, so its ends are
A_lo/(A_lo + B_hi) and A_hi/(A_hi + B_lo). The fractions themselves are exact counts of the
relation's units, so this ± is a confidence interval for the true fraction (at least c).
"""

from __future__ import annotations

from dataclasses import dataclass

from dpsql.plan.estimators import half_width
from dpsql.plan.plans import Diagnosis, Plan

__all__ = ["BOUND_OF_FLAG", "NOTABLE", "Diagnosed", "covers", "diagnose"]

# A flag that marks at least this fraction of the units is named, with the bound to raise and the
# estimate to run; below it the cut is said in one figure only.
NOTABLE = 0.05
# The setting (and policy field) each contribution flag compares with.
BOUND_OF_FLAG = {
    "L0": "max_groups_per_unit",
    "C": "max_rows_per_unit_per_group",
    "R": "max_rows_per_unit",
}


@dataclass(frozen=True)
class Diagnosed:
    """A released diagnosis: per flag the fraction of units it marks and its half-width."""

    flags: tuple[str, ...]
    limits: tuple[tuple[str, int], ...]
    cells: tuple[int, ...]  # the noisy histogram, one count per flag pattern
    units: int  # the noisy number of units (the sum of the cells, at least 0)
    fractions: tuple[tuple[str, float, float], ...]  # (flag, fraction, half-width)
    cut: tuple[float, float]  # the fraction of units any flag marks, and its half-width
    confidence: float
    table: str = ""  # the table whose bounds cut (what ESTIMATE BOUNDS would read)
    keys: tuple[str, ...] = ()  # the query's GROUP BY columns (L0 and C are per key)

    def fraction(self, flag: str) -> float:
        """The fraction of units ``flag`` marks ("any": any flag)."""
        if flag == "any":
            return self.cut[0]
        return next(f for name, f, _ in self.fractions if name == flag)

    def summary(self) -> str:
        """What the contribution bounds and clamps cut, in a few words with its ± (``bounds
        cut ~8% of units (± 1%)``: a small epsilon makes the figure itself noise, and says so),
        and where a flag marks at least 5% of them, which bound to raise and the estimate to
        run: ``bounds cut ~30% of units (± 2%; C: 30%); raise max_rows_per_unit_per_group, or
        run ESTIMATE BOUNDS FOR visits GROUP BY ward``."""
        text = f"bounds cut ~{_percent(self.cut[0])} of units (± {_percent(self.cut[1])}"
        notable = self.notable()
        if not notable:
            return text + ")"
        shares = ", ".join(f"{name}: {_percent(self.fraction(name))}" for name in notable)
        return f"{text}; {shares}); {self.advice(notable)}"

    def notable(self) -> list[str]:
        """The flags that mark at least ``NOTABLE`` of the units."""
        return [name for name, f, _ in self.fractions if f >= NOTABLE]

    def advice(self, notable: list[str]) -> str:
        """What to do about the flags ``notable``: the bounds to raise, the estimate to run."""
        raised = [BOUND_OF_FLAG[name] for name in notable if name in BOUND_OF_FLAG]
        todo, estimates = [], []
        if raised:
            todo.append("raise " + " and ".join(raised))
            per_key = any(name in ("L0", "C") for name in notable) and self.keys
            by = f" GROUP BY {', '.join(self.keys)}" if per_key else ""
            estimates.append(f"ESTIMATE BOUNDS FOR {self.table}{by}")
        if "clamped" in notable:
            todo.append("widen the bounds of the aggregated columns")
            estimates.append(f"ESTIMATE BOUNDS FOR {self.table}.<column>")
        return f"{', '.join(todo)}, or run {' and '.join(estimates)}"

    def describe(self) -> str:
        """One line with every flag's fraction and ±, then the advice: what ``\\diagnose`` and
        NOTICEs show."""
        parts = ", ".join(f"{name} {_percent(f)} ± {_percent(w)}" for name, f, w in self.fractions)
        notable = self.notable()
        advice = f"; {self.advice(notable)}" if notable else ""
        return (
            f"bounds cut ~{_percent(self.cut[0])} of units (± {_percent(self.cut[1])}): {parts}; "
            f"of ~{self.units} units, at {self.confidence:.4g} confidence{advice}"
        )

    def as_dict(self) -> dict[str, object]:
        """A plain form for JSON output and the DB-API's ``cursor.diagnostics``."""
        return {
            "units": self.units,
            "cut": {"fraction": self.cut[0], "half_width": self.cut[1]},
            "flags": {
                name: {"fraction": f, "half_width": w, "limit": dict(self.limits).get(name)}
                for name, f, w in self.fractions
            },
            "confidence": self.confidence,
            "cells": list(self.cells),
        }


def covers(diagnosis: Diagnosed | None, plan: Plan | None = None) -> str:
    """What a result's ± covers, as every interface says it: the noise only, and with a
    diagnosis how much the bounds cut, which the ± does not cover (``noise only; bounds cut
    ~8% of units``); on a sample, that the answers are the sample's (or its totals scaled by
    1/q) and the sampling error is not covered. Never a confidence interval of the true value."""
    text = "noise only" if diagnosis is None else f"noise only; {diagnosis.summary()}"
    if plan is not None and plan.sample is not None:
        rate = f"{float(plan.sample.rate):.4g}"
        if plan.options.sample_scale:
            text += f"; on a sample of the units at q = {rate}, COUNT and SUM scaled by 1/q"
        else:
            text += f"; on a sample of the units at q = {rate}, not scaled"
        text += " (sampling error not covered)"
    return text


def _percent(x: float) -> str:
    if x == 0:
        return "0%"
    if x >= 0.1:
        return f"{100 * x:.0f}%"
    return f"{100 * x:.1f}%" if x >= 0.001 else f"{100 * x:.1g}%"


def _ratio(a: int, b: int) -> float:
    return a / (a + b) if a + b > 0 else 0.0


def _fraction(cells: tuple[int, ...], flagged: list[int], h: int) -> tuple[float, float]:
    """The fraction of the flagged cells and its half-width over the box of ± h per cell."""
    rest = [p for p in range(len(cells)) if p not in flagged]
    a = max(sum(cells[p] for p in flagged), 0)
    b = max(sum(cells[p] for p in rest), 0)
    value = _ratio(a, b)
    a_lo, a_hi = max(a - len(flagged) * h, 0), a + len(flagged) * h
    b_lo, b_hi = max(b - len(rest) * h, 0), b + len(rest) * h
    low = _ratio(a_lo, b_hi)
    high = _ratio(a_hi, b_lo) if a_hi + b_lo > 0 else 1.0
    return value, max(value - low, high - value)


def diagnose(diagnosis: Diagnosis, cells: tuple[int, ...], confidence: float) -> Diagnosed:
    """The released diagnosis from its noisy histogram (post-processing only)."""
    h = half_width(diagnosis.measurement, confidence ** (1 / len(cells)))
    fractions = tuple(
        (flag, *_fraction(cells, [p for p in range(len(cells)) if p >> j & 1], h))
        for j, flag in enumerate(diagnosis.flags)
    )
    cut = _fraction(cells, list(range(1, len(cells))), h)
    return Diagnosed(
        diagnosis.flags,
        diagnosis.limits,
        cells,
        max(sum(cells), 0),
        fractions,
        cut,
        confidence,
        diagnosis.table,
        diagnosis.keys,
    )
