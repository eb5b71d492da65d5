"""Planning is bounded: EXPLAIN is free, so a statement whose planning would take long is refused
on its text before planning (too many distinct aggregates, or too large ones), and the accuracy
target's solver bisects once per distinct figure, not once per aggregate
(``dpsql.plan.targets``; its CPU time is measured in benchmarks/planning.py, never here)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from typing import Any

import pytest
from conftest import TinyPolicy

from dpsql.errors import InputError, ParameterError, UnsupportedQueryError
from dpsql.plan import targets
from dpsql.session import workload_plan
from dpsql.session.session import Session
from dpsql.sql.parse import parse_select
from dpsql.sql.split import split_statements
from dpsql.sql.validate import MAX_AGGREGATE_NODES, MAX_AGGREGATES, MAX_NODES, validate

ROWS = [(u, "north", 18 + u % 70, float(u % 200)) for u in range(200)]
TARGET = "WITH DIFFERENTIAL_PRIVACY OPTIONS(halfwidth = 2000, min_group = 8000)"


def _whens(n: int) -> str:
    return " ".join(f"WHEN age = {i} THEN spend" for i in range(n))


def _select(n: int, form: str, options: str = "") -> str:
    outputs = ", ".join(f"{form.format(i=i)} AS a{i}" for i in range(n))
    return f"SELECT {options} region, {outputs} FROM visits GROUP BY region"


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        (_select(MAX_AGGREGATES + 1, "SUM(spend + {i})"), "distinct aggregates"),
        (_select(MAX_AGGREGATES + 1, "COUNT(DISTINCT age + {i})"), "distinct aggregates"),
        (_select(1, "SUM(CASE " + _whens(MAX_AGGREGATE_NODES // 4) + " END)"), "nodes in all"),
        (
            "SELECT COUNT(*) AS n FROM visits WHERE age IN ("
            + ", ".join(str(i) for i in range(MAX_NODES))
            + ")",
            "more than 4,000 expression nodes",
        ),
    ],
)
def test_a_statement_too_costly_to_plan_is_refused_on_its_text(
    tiny_policy: TinyPolicy, sql: str, named: str
) -> None:
    with pytest.raises(UnsupportedQueryError, match=named):
        validate(parse_select(sql))
    with closing(Session(tiny_policy(ROWS))) as session:
        with pytest.raises(UnsupportedQueryError, match=named):
            session.execute("EXPLAIN " + sql)
        assert [r.kind for r in session.filter.store.records()] == ["budget"]


def test_aggregates_up_to_the_limit_are_planned(tiny_policy: TinyPolicy) -> None:
    """Repeats count once: the limit is on distinct aggregates."""
    with closing(Session(tiny_policy(ROWS))) as session:
        session.execute("EXPLAIN " + _select(MAX_AGGREGATES, "SUM(spend + {i})"))
        session.execute("EXPLAIN " + _select(4 * MAX_AGGREGATES, "COUNT(*)"))


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real: Callable[..., Any] = targets._least

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(targets, "_least", counted)
    return calls


def test_the_target_is_solved_once_per_distinct_figure(
    tiny_policy: TinyPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twenty STDDEVs on bounds shifted by a constant have one ratio figure: one bisection (the
    76 s of CPU of 250 such STDDEVs came from one bisection each). Their budgets are the one
    STDDEV's, each."""
    calls = _counting(monkeypatch)
    with closing(Session(tiny_policy(ROWS, budget={"epsilon": "10000"}))) as session:
        one = session.plan(_select(1, "STDDEV(age)", TARGET))
        assert len(calls) == 1
        calls.clear()
        many = session.plan(_select(20, "STDDEV(age + {i})", TARGET))
        assert len(calls) == 1
    assert one.options.budgets is not None and many.options.budgets is not None
    assert many.options.budgets == one.options.budgets * 20
    assert many.epsilon == 20 * one.epsilon


def test_too_many_distinct_ratio_targets_are_refused_before_any_search(
    tiny_policy: TinyPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _counting(monkeypatch)
    n = targets.MAX_RATIO_TARGETS
    with closing(Session(tiny_policy(ROWS, budget={"epsilon": "10000"}))) as session:
        with pytest.raises(ParameterError, match="min_group binds more than"):
            session.plan(_select(n + 1, "STDDEV(age * {i} + 1)", TARGET))
        assert calls == []
        session.plan(_select(n, "STDDEV(age * {i} + 1)", TARGET))
        assert len(calls) == n
        assert [r.kind for r in session.filter.store.records()] == ["budget"]


def test_a_file_of_too_many_statements_is_refused_before_planning(
    tiny_policy: TinyPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned: list[int] = []
    real = workload_plan._plan_steps
    monkeypatch.setattr(workload_plan, "_plan_steps", lambda *a: planned.append(1) or real(*a))
    n = workload_plan.MAX_STATEMENTS
    with closing(Session(tiny_policy(ROWS))) as session:
        with pytest.raises(InputError, match="more than 20,000 statements"):
            session.plan_workload(split_statements("SHOW dpsql.epsilon;\n" * (n + 1)))
        assert planned == []
        session.plan_workload(split_statements("SHOW dpsql.epsilon;\n" * 3))
        assert planned == [1]
