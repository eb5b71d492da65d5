"""The public facts every step of the bounded query reads (:class:`Shape`), derived once from
the analysis and the bounding: the keys' names, the values whose centred squares are summed,
the number of public key combinations and whether R's window ranks weighted copies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dpsql.analyze.analysis import Analysis, GroupKey
from dpsql.bound.specs import Bounding, MeasurementSpec


def public_size(keys: Sequence[GroupKey]) -> int | None:
    """The number of public key combinations, when there are keys and every one lists its
    domain (rows outside it are dropped before bounding, or kept in the key's other group,
    one more value of the key: every group a unit can touch is one of these)."""
    if not keys or not all(k.domain is not None for k in keys):
        return None
    return math.prod(len(k.domain or ()) + k.other for k in keys)


@dataclass(frozen=True)
class Shape:
    """What the steps of one bounded query share; every field is public (the query, the policy
    and the plan's numbers), so every choice between two forms of a step is too."""

    analysis: Analysis
    bounding: Bounding
    keys: tuple[str, ...]  # the keys' columns: _k0, _k1, ...
    # The pairs of values whose centred products are summed: (i, i) a square (VAR, STDDEV),
    # (i, j) a product (COVAR, CORR, REGR_).
    squared: tuple[tuple[int, int], ...]
    size: int | None  # the public key combinations (``public_size``)
    # R's window ranks (unit, keys) rows with their number of copies ``_w`` (``caps``).
    weighted: bool

    @classmethod
    def of(cls, analysis: Analysis, bounding: Bounding) -> Shape:
        squared = sorted(
            {
                (m.value, m.value if m.other is None else m.other)
                for m in bounding.measurements
                if m.kind in ("centred_squares", "centred_products", "bernstein")
                and m.value is not None
            }
        )
        size = public_size(analysis.keys)
        r = bounding.max_total_rows
        # Without values and with at most R key combinations, copies of a (unit, keys) row are
        # common: R's window then runs on those rows with their number of copies, _w. (A choice
        # of speed on public numbers only; the totals are the same either way.)
        weighted = r is not None and not bounding.values and (size is not None and size <= r)
        keys = tuple(f"_k{i}" for i in range(len(analysis.keys)))
        return cls(analysis, bounding, keys, tuple(squared), size, weighted)

    @property
    def listed(self) -> dict[int, MeasurementSpec]:
        """The measurements read from listed values (a quantile's histogram, distinct values),
        by their index: each has a CTE ``_x<j>`` of its own."""
        return {
            j: m
            for j, m in enumerate(self.bounding.measurements)
            if m.kind in ("quantile", "distinct")
        }

    @property
    def row_columns(self) -> list[str]:
        """A row's columns that a measurement reads besides the unit: the keys, the raw values."""
        return [*self.keys, *(f"_x{i}" for i in range(len(self.bounding.values)))]


__all__ = ["Shape", "public_size"]
