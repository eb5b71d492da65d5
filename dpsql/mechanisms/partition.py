"""Mechanism arithmetic: the partition-selection threshold for the discrete Laplace.

Everything here is exact rational arithmetic, except the threshold's logarithm, which is found
in floating point and then checked with 60-digit decimal arithmetic, rounding up on doubt.
"""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

from dpsql.errors import BoundsError


def laplace_tail_log(scale: Fraction, k: int, ctx: decimal.Context) -> decimal.Decimal:
    """ln P(Z >= k) for the discrete Laplace with ``scale``: ln(q^k / (1 + q)), q = e^(-1/t)."""
    t = decimal.Decimal(scale.numerator) / decimal.Decimal(scale.denominator)
    q = ctx.exp(ctx.divide(decimal.Decimal(-1), t))
    return ctx.subtract(ctx.divide(decimal.Decimal(-k), t), ctx.ln(ctx.add(1, q)))


def partition_threshold(scale: Fraction, max_groups: int, delta: Fraction) -> int:
    """The smallest threshold tau such that max_groups · P(1 + Z >= tau) <= delta.

    A group that only the added unit creates has a true count of 1 distinct unit; it is released
    iff 1 + Z >= tau, Z discrete Laplace with ``scale``. With P(Z >= k) = q^k/(1 + q), the
    condition is tau >= 1 + t·ln(L0 / (delta·(1 + q))) (DESIGN.md section 4). The continuous
    Laplace threshold would understate delta by up to 2x.
    """
    if not 0 < delta < 1:
        raise BoundsError("partition selection needs 0 < delta < 1")
    t = float(scale)
    q = math.exp(-1.0 / t)
    k = max(1, math.ceil(t * math.log(max_groups / (float(delta) * (1 + q)))))
    ctx = decimal.Context(prec=60)
    bound = ctx.ln(decimal.Decimal(delta.numerator) / decimal.Decimal(delta.denominator))
    log_groups = ctx.ln(decimal.Decimal(max_groups))
    # Verify in 60-digit arithmetic and step up while the float estimate was too small.
    while ctx.add(log_groups, laplace_tail_log(scale, k, ctx)) > bound:
        k += 1
    return 1 + k
