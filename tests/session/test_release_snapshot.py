"""Every released value and every charged cost, pinned under a deterministic bit source.

A corpus of statements covering every aggregate kind, both mechanisms, every filter, the
cache (re-serves, derived and assembled answers), bounds estimates, diagnoses, samples,
accuracy targets, partition selection and workloads runs through the public API with the
operating system's randomness replaced by a fixed SHAKE-256 stream (``os.urandom``) and fixed
salts (``secrets``). What it releases (rows, half-widths, notes), what it charges (exact
fractions) and what the budget reports are compared with ``golden/releases.json``.

So a change that moves code without meaning to change behaviour is checked here against the
very numbers an analyst saw before it: a different noise draw, a different split of epsilon, a
different bounded total or a different charge fails the test. Regenerate only for a change
that means to release something else: ``DPSQL_REGENERATE=1 pytest tests/...this file``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
from collections.abc import Iterator
from datetime import date, datetime
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import write_parquet

from dpsql.policy import Policy, load_policy
from dpsql.release.result import Result
from dpsql.session.session import Session
from dpsql.session.workloads import run_script

GOLDEN = Path(__file__).parent / "golden" / "releases.json"

SCHEMA = (
    ("user_id", "BIGINT"),
    ("region", "VARCHAR"),
    ("age", "INTEGER"),
    ("spend", "DOUBLE"),
    ("home", "VARCHAR"),
    ("day", "DATE"),
)
REGIONS = ("central", "east", "north", "south", "west")


def _rows() -> list[tuple[Any, ...]]:
    """Skewed test data (not noise): a few heavy units, some values outside the bounds."""
    out = []
    for u in range(1, 2001):
        n = 1 + (u * 7) % 5 + (25 if u % 97 == 0 else 0)
        home = REGIONS[u % 5]
        for j in range(n):
            region = REGIONS[(u + j) % 5] if u % 3 else home
            if u % 41 == 0 and j == 0:
                region = "elsewhere"
            spend = float((u * 13 + j * 29) % 230) + 0.25 * (j % 4)
            age = 15 + (u * 3 + j) % 80
            day = date(2026, 1 + (u + j) % 12, 1 + (u * j) % 28)
            out.append((u, region, age, spend if (u + j) % 17 else None, home, day))
    return out


def _policy(path: Path, budget: dict[str, Any], **table: Any) -> Policy:
    return load_policy(
        {
            "dataset": {"id": "snapshot", "data_version": "1"},
            "data": {"tables": {"visits": str(path)}},
            # One thread: the engine's order of groups, in which noise is drawn, is then fixed.
            "engine": {"threads": 1},
            "budget": budget,
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 2,
                    "max_rows_per_unit_per_group": 5,
                    "constant_per_unit": ["home"],
                    "columns": {
                        "age": {"lower": 18, "upper": 90},
                        "spend": {"lower": 0, "upper": 200},
                        "region": {"public_values": list(REGIONS)},
                        "home": {"public_values": list(REGIONS)},
                        "day": {"date_range": ["2026-01-01", "2026-12-31"]},
                    },
                    **table,
                }
            },
        },
        base_dir=path.parent,
    )


BASIC = {
    "diagnose": False,  # the diagnosis's own tests pin it (tests/plan/test_diagnosis*.py)
    "epsilon": "200",
    "delta": "0.00001",
    "query_epsilon": "1",
    "query_delta": "0.0000001",
}

# Statements run in order on one session of the basic filter.
BASIC_STATEMENTS: tuple[str | tuple[str, dict[str, Any]], ...] = (
    "SELECT COUNT(*) FROM visits",
    "SELECT region, COUNT(*), SUM(spend), AVG(age) FROM visits GROUP BY region",
    "SELECT region, VARIANCE(spend), STDDEV_POP(age) FROM visits GROUP BY region",
    "SELECT region, VAR_POP(spend), STDDEV(spend) FROM visits GROUP BY region ORDER BY region",
    "SELECT MEDIAN(age), QUANTILE_CONT(spend, 0.9), MIN(age), MAX(spend) FROM visits",
    "SELECT COUNT(DISTINCT user_id), COUNT(DISTINCT region), COUNT(spend) FROM visits",
    "SELECT age, COUNT(*) FROM visits GROUP BY age",
    "SELECT date_trunc('month', day) AS m, COUNT(*) AS n FROM visits GROUP BY m ORDER BY m",
    "SELECT CASE WHEN age < 40 THEN 'young' ELSE 'old' END AS band, AVG(spend) FROM visits "
    "GROUP BY band",
    "SELECT region, COUNT(*) AS n FROM visits GROUP BY region HAVING COUNT(*) > 10 "
    "ORDER BY n DESC LIMIT 3",
    "SELECT COUNT(*) FROM visits WHERE home = 'east'",
    "SELECT COUNT(*) FROM visits WHERE home = 'west'",
    "SELECT SUM(spend * 2) / COUNT(*) AS ratio FROM visits WHERE age > 30",
    # The cache: the same release served again, an AVG derived from its SUM and COUNT.
    "SELECT COUNT(*) FROM visits",
    "select count(*) from VISITS",
    "SELECT region, SUM(spend), COUNT(spend) FROM visits GROUP BY region",
    "SELECT region, AVG(spend) FROM visits GROUP BY region",
    ("SELECT COUNT(*) FROM visits", {"fresh": True}),
    ("SELECT COUNT(*) FROM visits", {"fresh": True, "epsilon": 2}),
    ("SELECT region, COUNT(*) FROM visits GROUP BY region", {"split": "even"}),
    ("SELECT region, AVG(spend) FROM visits GROUP BY region", {"max_rows_per_unit": 3}),
    ("SELECT region, COUNT(*) FROM visits GROUP BY region", {"max_groups_per_unit": 1}),
    ("SELECT region, COUNT(*) FROM visits GROUP BY region", {"other_group": True}),
    (
        "SELECT region, COUNT(*) FROM visits GROUP BY region",
        {"other_group": True, "other_label": "other", "fresh": True},
    ),
    ("SELECT region, AVG(spend) FROM visits GROUP BY region", {"diagnose": True}),
    ("SELECT COUNT(*), SUM(spend) FROM visits", {"sample_rate": "0.5", "sample_scale": True}),
    ("SELECT region, SUM(spend) FROM visits GROUP BY region", {"halfwidth": 800}),
    ("SELECT MEDIAN(spend) FROM visits", {"rank_error": 40}),
    (
        "SELECT region, AVG(spend) FROM visits GROUP BY region",
        {"halfwidth": 40, "min_group": 50, "fresh": True},
    ),
    ("SELECT region, COUNT(*) FROM visits GROUP BY region", {"accuracy_columns": True}),
    # The Gaussian mechanism: (epsilon, delta), rho, sigma, one and several measurements.
    ("SELECT COUNT(*) FROM visits", {"mechanism": "gaussian", "delta": "0.000001"}),
    (
        "SELECT region, COUNT(*), AVG(spend) FROM visits GROUP BY region",
        {"mechanism": "gaussian", "delta": "0.000001"},
    ),
    (
        "SELECT region, SUM(age) FROM visits GROUP BY region",
        {"mechanism": "gaussian", "delta": "0.000001", "rho": "0.05"},
    ),
    (
        "SELECT STDDEV(spend) FROM visits",
        {"mechanism": "gaussian", "delta": "0.000001", "sigma": "3"},
    ),
    # Private keys: partition selection, with each mechanism.
    "SELECT spend, COUNT(*) FROM visits GROUP BY spend",
    (
        "SELECT age, COUNT(*), SUM(spend) FROM visits GROUP BY age",
        {"mechanism": "gaussian", "delta": "0.000001"},
    ),
    "SELECT region, age, COUNT(*) FROM visits GROUP BY region, age",
    # Bounds estimated from the data, then used and served again.
    "ESTIMATE BOUNDS FOR visits.age",
    "ESTIMATE BOUNDS FOR visits GROUP BY region AT QUANTILE 0.95",
    "ESTIMATE BOUNDS FOR visits.age",
    "EXPLAIN VERBOSE SELECT region, AVG(spend) FROM visits GROUP BY region",
    "SHOW dpsql.budget",
)

WORKLOAD = """
SET dpsql.other_group = on;
SELECT region, COUNT(*) FROM visits GROUP BY region;
SELECT region, home, COUNT(*) FROM visits GROUP BY region, home;
SELECT COUNT(*) FROM visits;
SELECT region, SUM(spend) FROM visits GROUP BY region;
SELECT MEDIAN(age) FROM visits;
"""

# Other filters: (budget, statements).
FILTERS: tuple[tuple[str, dict[str, Any], tuple[str | tuple[str, dict[str, Any]], ...]], ...] = (
    (
        "advanced",
        {**BASIC, "accountant": "advanced", "advanced_delta_prime": "0.000005"},
        (
            "SELECT region, COUNT(*) FROM visits GROUP BY region",
            "SELECT AVG(spend) FROM visits",
            "SELECT spend, COUNT(*) FROM visits GROUP BY spend",
        ),
    ),
    (
        "rdp",
        {**BASIC, "accountant": "rdp"},
        (
            "SELECT region, COUNT(*) FROM visits GROUP BY region",
            ("SELECT AVG(spend) FROM visits", {"mechanism": "gaussian", "delta": "0.000001"}),
            "SELECT age, COUNT(*) FROM visits GROUP BY age",
            ("SELECT COUNT(*) FROM visits", {"sample_rate": "0.25"}),
        ),
    ),
    (
        "zcdp",
        {
            "diagnose": False,
            "rho": "2",
            "delta": "0.00001",
            "query_epsilon": "1",
            "query_delta": "0.0000001",
            "accountant": "zcdp",
        },
        (
            (
                "SELECT region, SUM(spend) FROM visits GROUP BY region",
                {"mechanism": "gaussian", "delta": "0.000001"},
            ),
            "SELECT MEDIAN(spend) FROM visits",
            ("SELECT COUNT(*) FROM visits", {"mechanism": "gaussian", "rho": "0.01"}),
        ),
    ),
    (
        "pld-laplace",
        {
            **BASIC,
            "accountant": "pld",
            "declared_mechanism": {"kind": "discrete_laplace", "sensitivity": 10, "scale": "20"},
        },
        (
            "SELECT COUNT(*) FROM visits",
            "SELECT region, COUNT(*) FROM visits GROUP BY region",
            ("SELECT region, COUNT(*) FROM visits GROUP BY region", {"max_groups_per_unit": 1}),
        ),
    ),
    (
        "pld-gaussian",
        {
            **BASIC,
            "accountant": "pld",
            "query_delta": "0.000001",
            "declared_mechanism": {"kind": "discrete_gaussian", "sensitivity": 10, "sigma": "20"},
        },
        (
            "SELECT COUNT(*) FROM visits",
            ("SELECT COUNT(*), COUNT(spend) FROM visits", {"diagnose": True}),
        ),
    ),
    (
        "shares",
        {**BASIC, "analysts": {"ana": {"epsilon": "3", "delta": "0.000001"}}},
        ("SELECT COUNT(*) FROM visits", "SELECT region, COUNT(*) FROM visits GROUP BY region"),
    ),
)


@pytest.fixture
def fixed_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operating system's randomness replaced by one SHAKE-256 stream, and fixed salts."""
    state = {"counter": 0}

    def urandom(n: int) -> bytes:
        state["counter"] += 1
        return hashlib.shake_256(f"dpsql-snapshot-{state['counter']}".encode()).digest(n)

    monkeypatch.setattr(os, "urandom", urandom)
    monkeypatch.setattr(secrets, "randbits", lambda k: 0x1234_5678_9ABC_DEF0 % (1 << k))
    monkeypatch.setattr(secrets, "token_hex", lambda n=16: "ab" * n)


def _value(value: Any) -> Any:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    if isinstance(value, Fraction | Decimal):
        return str(value)
    if isinstance(value, date | datetime):
        return value.isoformat()
    if isinstance(value, int | str | bool) or value is None:
        return value
    return repr(value)


def _record(result: Result) -> dict[str, Any]:
    """What an analyst sees of a result, and what it cost (no SQL text: only its meaning)."""
    out: dict[str, Any] = {
        "columns": list(result.columns),
        "types": list(result.types),
        "rows": [[_value(v) for v in row] for row in result.rows],
        "accuracy": [[_value(v) for v in row] for row in result.accuracy],
        "cached_from": result.cached_from,
        "note": result.note,
    }
    if result.columns == ("plan",):
        # EXPLAIN: its lines up to the bounded SQL, whose text may change with its meaning kept.
        lines = [r[0] for r in result.rows]
        out["rows"] = lines[: lines.index("bounded SQL:")]
    if result.charge is not None:
        out["charged"] = [str(result.charge.epsilon), str(result.charge.delta)]
        out["events"] = result.charge.event.describe()
    if result.plan is not None:
        out["planned"] = [str(result.plan.epsilon), str(result.plan.delta)]
    return out


def _run(session: Session, statements: Any) -> Iterator[dict[str, Any]]:
    for item in statements:
        sql, options = (item, {}) if isinstance(item, str) else item
        try:
            result = session.execute(sql, **options)
        except Exception as exc:  # a refusal is part of the snapshot too
            yield {"sql": sql, "options": _value(options), "error": type(exc).__name__}
            continue
        yield {"sql": sql, "options": {k: _value(v) for k, v in options.items()},
               **_record(result)}  # fmt: skip


def _report(session: Session) -> dict[str, Any]:
    report = session.budget()
    return {
        "text": str(report),
        "spent": [_value(report.epsilon_spent), str(report.delta_spent)],
        "figures": [
            [f.accountant, _figure(f.accountant, f.epsilon), f.note] for f in report.figures
        ],
    }


def _figure(accountant: str, epsilon: float) -> Any:
    """An odometer's figure. The PLD accountant's comes from FFT convolutions, whose last digits
    depend on the CPU's vector instructions (numpy's pocketfft): ten significant digits."""
    if accountant == "pld" and math.isfinite(epsilon):
        return f"{epsilon:.10g}"
    return _value(epsilon)


def snapshot(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "visits.parquet"
    write_parquet(path, _rows(), SCHEMA)
    out: dict[str, Any] = {}
    session = Session(_policy(path, BASIC))
    try:
        out["basic"] = list(_run(session, BASIC_STATEMENTS))
        out["basic_report"] = _report(session)
    finally:
        session.close()
    session = Session(_policy(path, {**BASIC, "epsilon": "6"}))
    try:
        # A file planned as one workload, then served again from its releases.
        for part in ("workload", "workload_again"):
            out[part] = [
                {"statement": step.piece.text, "source": step.source,
                 **(_record(result) if result is not None else {"result": None})}
                for step, result in run_script(session, WORKLOAD)
            ]  # fmt: skip
        out["workload_report"] = _report(session)
    finally:
        session.close()
    for name, budget, statements in FILTERS:
        analyst = "ana" if "analysts" in budget else None
        session = Session(_policy(path, budget), analyst=analyst)
        try:
            out[name] = list(_run(session, statements))
            out[name + "_report"] = _report(session)
        finally:
            session.close()
    return out


def test_every_release_and_charge_is_unchanged(tmp_path: Path, fixed_bits: None) -> None:
    got = json.loads(json.dumps(snapshot(tmp_path)))
    if os.environ.get("DPSQL_REGENERATE"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    for part in want:
        assert len(got[part]) == len(want[part]), part
        if isinstance(want[part], list):
            for i, (g, w) in enumerate(zip(got[part], want[part], strict=True)):
                assert g == w, f"{part}[{i}]"
        else:
            assert got[part] == want[part], part


def test_the_stream_is_what_is_pinned(tmp_path: Path, fixed_bits: None) -> None:
    """The fixed bits reach the noise: two runs agree, and a real run would not."""
    assert os.urandom(4) == hashlib.shake_256(b"dpsql-snapshot-1").digest(4)
