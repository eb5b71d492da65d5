"""A linear estimate's floats are the exact rationals' correctly rounded values.

``linear`` turns each noisy integer total ``v`` into ``v · factor · unit`` (unit: the value of
one grid step, e.g. 1/16). It computes ``v·p / q`` with Python's int division, one correctly
rounded operation, where it used to build a Fraction per value: the released float must be the
same bit for bit, or a redesign would move released values.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.bound.specs import MeasurementSpec
from dpsql.plan.aggregates.totals import linear
from dpsql.plan.plans import Estimate, Measurement

# Denominators of grids (powers of two) and of a workload's factors; numerators past 2^53 too.
units = st.builds(
    Fraction, st.integers(1, 2**70), st.sampled_from([1, 2, 3, 7, 16, 1024, 2**40, 10**9])
)
factors = st.builds(Fraction, st.integers(-(2**20), 2**20).filter(bool), st.integers(1, 2**12))
totals = st.lists(st.integers(-(2**80), 2**80) | st.integers(-(2**20), 2**20), max_size=30)


@settings(max_examples=examples(300), deadline=None)
@given(unit=units, factor=factors, raw=totals)
def test_each_float_is_the_exact_value_rounded(
    unit: Fraction, factor: Fraction, raw: list[int]
) -> None:
    if unit == 1 and factor.denominator == 1:
        factor += Fraction(1, 2)  # the integer path is another test's
    m = Measurement(MeasurementSpec("sum", 0), "s", 1, 1, unit, scale=Fraction(3))
    est = Estimate("sum", (0,), None)  # type: ignore[arg-type]
    try:
        expected = [float(Fraction(v) * factor * unit) for v in raw]
    except OverflowError:
        return  # past the float range either way (the same error: int / int)
    value, width = linear(factor)(est, [m], [raw], 0.95)
    assert value.dtype == np.float64
    assert [float(v) for v in value] == expected
    assert len(width) == len(raw)
