"""dpsql's fixed cost per query, stage by stage, beside the engine time of the same bounded SQL.

For each query of ``queries.QUERIES`` on the 100k-row data of ``run.py``, ``Session.execute(sql,
fresh=True)`` runs with every pipeline stage wrapped in a timer (the real code path: the
functions the session calls are wrapped where it looks them up). Two cases:

* **first**: the first execution of the query text in the session (its plans and the engine's
  key-domain probes are cleared before each sample);
* **repeat**: a repeated fresh execution of the same text (the session reuses the plan; the
  filter check, the charge and the noise run again).

Stages: ``parse`` (statement), ``analyze`` (bind parameters, validate, analyze, with the
engine's schema binds of joins and subqueries), ``probes`` (key domains and cell keys in the
engine), ``plan`` (planner and bounded SQL), ``bind checks`` (sampler limits, the engine's
DESCRIBE/EXPLAIN of the bounded SQL, the post-processing bind), ``keys`` (cache keys and the
ledger details), ``lookup`` (plan key, release-cache lookup), ``charge`` (filter check and
ledger append), ``engine`` (the bounded SQL in DuckDB), ``noise`` (samplers, partition
selection), ``publish`` (post-processing), ``record`` (the release record); ``other`` is the
rest of ``execute``. **overhead** = total - engine. Beside them, in the same run: ``engine
alone`` (the same bounded SQL through the engine, outside dpsql) and ``raw`` (the analyst's SQL
on a plain DuckDB connection). Medians over ``--repeats`` samples, after one warm-up.

    python benchmarks/overhead.py [--repeats 15] [--durable]

``--durable`` charges into a durable ledger (``dpsql init`` in a temporary folder: every charge
and release record is an fsync'd SQLite transaction) instead of the in-memory one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

import dpsql.cache.keys
import dpsql.session.pipeline
import dpsql.session.planning
import dpsql.session.session
from dpsql.accounting.ledger.store import create_ledger
from dpsql.policy import load_policy
from dpsql.session.session import Session

sys.path.insert(0, str(Path(__file__).resolve().parent))
from queries import QUERIES, policy_dict
from run import HERE, data_file, write_results

STAGES = ("parse", "analyze", "probes", "plan", "bind checks", "keys", "lookup", "charge",
          "engine", "noise", "publish", "record")  # fmt: skip
# (module, function) -> stage: the names the session's modules look up at call time.
MODULE_STAGES = {
    (dpsql.session.session, "parse_statement"): "parse",
    (dpsql.session.planning, "bind_parameters"): "analyze",
    (dpsql.session.planning, "validate"): "analyze",
    (dpsql.session.planning, "analyze"): "analyze",
    (dpsql.session.planning, "plan_query"): "plan",
    (dpsql.session.planning, "check_samplable"): "bind checks",
    (dpsql.session.planning, "check_post_processing"): "bind checks",
    (dpsql.session.pipeline, "measure"): "noise",
    (dpsql.session.pipeline, "publish"): "publish",
    (dpsql.cache.keys, "keys"): "keys",
}


class Timers:
    """Seconds per stage of the current sample."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)

    def wrap(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[stage] += time.perf_counter() - start

        return timed


@contextmanager
def instrumented(session: Session, timers: Timers) -> Iterator[None]:
    saved = [(module, name, getattr(module, name)) for module, name in MODULE_STAGES]
    for (module, name), stage in MODULE_STAGES.items():
        setattr(module, name, timers.wrap(stage, getattr(module, name)))
    objects = {
        (session.probes, "engine_values"): "probes",
        (session, "details"): "keys",
        (session, "plan_key"): "lookup",
        (session.cache, "lookup"): "lookup",
        (session.engine, "check"): "bind checks",
        (session.engine, "run"): "engine",
        (session.pipeline, "charge"): "charge",
        (session.cache, "record"): "record",
    }
    # (A dpsql without a plan cache has no plan_key: the same table measures it.)
    objects = {(o, n): stage for (o, n), stage in objects.items() if hasattr(o, n)}
    for (owner, name), stage in objects.items():
        setattr(owner, name, timers.wrap(stage, getattr(owner, name)))
    try:
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)
        for owner, name in objects:
            delattr(owner, name)  # the instance attribute hid the class's method


def sample(session: Session, timers: Timers, sql: str, first: bool) -> dict[str, float]:
    if first:  # a first execution, as in a new session
        if hasattr(session, "_plans"):
            session._plans.clear()
        session.engine._domains.clear()
    timers.spent.clear()
    start = time.perf_counter()
    result = session.execute(sql, fresh=True)
    total = time.perf_counter() - start
    assert result.charge is not None and result.cached_from is None
    row = {stage: timers.spent.get(stage, 0.0) for stage in STAGES}
    row["other"] = total - sum(row.values())
    row["total"] = total
    row["overhead"] = total - row["engine"]
    return row


def bench(session: Session, raw: duckdb.DuckDBPyConnection, repeats: int) -> list[dict[str, Any]]:
    timers = Timers()
    results = []
    for q in QUERIES:
        plan = session.plan(q.sql)
        samples: dict[str, list[dict[str, float]]] = {"first": [], "repeat": []}
        alone: list[float] = []
        plain: list[float] = []
        for i in range(repeats + 1):  # the first round warms up
            with instrumented(session, timers):
                first = sample(session, timers, q.sql, True)
                repeat = sample(session, timers, q.sql, False)
            start = time.perf_counter()
            session.engine.run(plan.engine_sql)
            engine_alone = time.perf_counter() - start
            start = time.perf_counter()
            raw.execute(q.sql).fetchall()
            raw_alone = time.perf_counter() - start
            if i:
                samples["first"].append(first)
                samples["repeat"].append(repeat)
                alone.append(engine_alone)
                plain.append(raw_alone)
        for case, rows in samples.items():
            med = {k: statistics.median(r[k] for r in rows) * 1e3 for k in rows[0]}
            med["engine alone"] = statistics.median(alone) * 1e3
            med["raw"] = statistics.median(plain) * 1e3
            results.append({"query": q.name, "case": case, **med})
    return results


def print_table(results: list[dict[str, Any]], ledger: str) -> None:
    columns = (*STAGES, "other", "overhead", "total", "engine alone", "raw")
    short = {"bind checks": "checks", "engine alone": "eng.alone", "overhead": "OVERHEAD"}
    names = [short.get(c, c) for c in columns]
    head = f"{'query':<20} | {'case':<6} | " + " | ".join(f"{n:>8}" for n in names)
    print(f"\nms per query at 100k rows, {ledger} ledger (median)\n{head}\n{'-' * len(head)}")
    for r in results:
        cells = " | ".join(f"{r[c]:>8.2f}" for c in columns)
        print(f"{r['query']:<20} | {r['case']:<6} | {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--durable", action="store_true", help="a durable ledger")
    parser.add_argument("--data-dir", type=Path, default=HERE / "data")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    args = parser.parse_args()
    path = data_file(args.data_dir, 100_000)
    started = dt.datetime.now(dt.UTC)
    raw = duckdb.connect(":memory:")
    raw.execute(f"CREATE VIEW visits AS SELECT * FROM read_parquet('{path}')")
    with tempfile.TemporaryDirectory() as folder:
        spec = policy_dict(path)
        if args.durable:
            spec["ledger"] = {"path": str(Path(folder) / "bench.ledger")}
        policy = load_policy(spec)
        if args.durable:
            create_ledger(policy)
        session = Session(policy)
        try:
            results = bench(session, raw, args.repeats)
        finally:
            session.close()
    ledger = "durable" if args.durable else "memory"
    print_table(results, ledger)
    name = f"overhead-{ledger}"
    write_results(args.results_dir, name, started, args.repeats, results, ledger=ledger)


if __name__ == "__main__":
    main()
