"""The views of parallel composition (``dpsql.accounting.budget.parallel``), checked against the
definition: a unit holds one cell per family, so its history is the unpinned queries plus one
cell's queries of each family, for some choice of cells."""

from __future__ import annotations

import itertools
from fractions import Fraction

from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.accounting.budget import parallel
from dpsql.accounting.budget.parallel import Cell

CELLS = st.one_of(
    st.none(),
    st.tuples(
        st.sampled_from(["visits.region@1", "visits.home@1", "sales.region@1"]),
        st.sampled_from(["a", "b", "c"]),
    ),
)
HISTORY = st.lists(st.tuples(CELLS, st.integers(1, 9).map(Fraction)), max_size=14)


def _unit_histories(items: list[tuple[Cell | None, Fraction]]) -> list[list[int]]:
    """Every history a unit can have, as indices: the definition, by brute force over one
    cell (or none) per family."""
    families = sorted({c[0] for c, _ in items if c is not None})
    keys = sorted({c[1] for c, _ in items if c is not None})
    out = []
    for choice in itertools.product(*[[None, *keys] for _ in families]):
        chosen = dict(zip(families, choice, strict=True))
        out.append([i for i, (c, _) in enumerate(items) if c is None or chosen.get(c[0]) == c[1]])
    return out


@settings(max_examples=examples(300), deadline=None)
@given(items=HISTORY)
def test_every_unit_history_lies_in_a_view_and_the_closed_form_is_the_worst(
    items: list[tuple[Cell | None, Fraction]],
) -> None:
    indexed = list(enumerate(items))
    views = [{i for i, _ in v} for v in parallel.views(indexed, lambda x: x[1][0])]
    for history in _unit_histories(items):
        assert any(set(history) <= view for view in views)
    exact = max(sum((items[i][1] for i in h), Fraction(0)) for h in _unit_histories(items))
    last = list(parallel.running_worst(items))[-1] if items else Fraction(0)
    assert last == exact
    # No view joins two cells of one family: none is looser than some unit's history.
    for view in views:
        pinned = [items[i][0] for i in view if items[i][0] is not None]
        assert all(a == b for a in pinned for b in pinned if a is not None and b is not None
                   and a[0] == b[0])  # fmt: skip


@settings(max_examples=examples(100), deadline=None)
@given(items=HISTORY)
def test_beyond_the_view_limit_each_view_holds_a_whole_exact_view(
    items: list[tuple[Cell | None, Fraction]],
) -> None:
    cells = [c for c, _ in items if c is not None]
    exact = parallel.choices(cells)
    limit, parallel.MAX_VIEWS = parallel.MAX_VIEWS, 1
    try:
        coarse = parallel.choices(cells)
    finally:
        parallel.MAX_VIEWS = limit
    # Each coarse view fixes one family and admits every cell of the others: a superset.
    for view in exact:
        assert any(all(parallel.member(c, w) for c in view.values()) for w in coarse) or not view
