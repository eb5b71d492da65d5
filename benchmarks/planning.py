"""CPU time of a free EXPLAIN against the number of aggregates in the statement, up to the limits
(``dpsql.sql.validate.MAX_AGGREGATES``, ``MAX_AGGREGATE_NODES``; ``dpsql.plan.targets.
MAX_RATIO_TARGETS``), beside a one-aggregate EXPLAIN in the same run (the baseline).

Each aggregate has its own text (``SUM(spend + i)``, ``COUNT(DISTINCT spend * i + age)``...), so
none is deduplicated. The accuracy-target rows (``halfwidth``, ``min_group``) are measured with
the solver's memo, and every form also "before" in the same run (the limits lifted and every
check bisected, as before this change): STDDEVs on bounds shifted by a constant share one
figure, STDDEVs on scaled bounds do not. Each
figure is the median process CPU time (``time.process_time``, the engine's threads included)
of ``--repeats`` EXPLAINs on one session (a plan is never reused: each run changes a constant).

    python benchmarks/planning.py [--repeats 5] [--sizes 1 6 12 24 48]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import HERE, write_results

from dpsql.plan import targets
from dpsql.policy.load import load_policy
from dpsql.session.session import Session
from dpsql.sql import validate

POLICY = Path(__file__).resolve().parents[1] / "examples" / "policy.toml"
TARGET = "WITH DIFFERENTIAL_PRIVACY OPTIONS(halfwidth = 2000, min_group = 8000)"
FORMS = {
    "SUM(spend + i)": ("SUM(spend + {i})", ""),
    "COUNT(DISTINCT spend * i + age)": ("COUNT(DISTINCT spend * {i} + age)", ""),
    "QUANTILE_CONT(spend * i + age, 0.5)": ("QUANTILE_CONT(spend * {i} + age, 0.5)", ""),
    "STDDEV(age + i), target": ("STDDEV(age + {i})", TARGET),
    "STDDEV(age * i + 1), target": ("STDDEV(age * {i} + 1)", TARGET),
}


def _select(n: int, form: str, options: str, run: int) -> str:
    outputs = ", ".join(f"{form.format(i=i + 1)} AS a{i}" for i in range(n))
    # A constant of its own per run: the session's plan cache never serves it.
    where = f"WHERE age > {run}"
    return f"SELECT {options} region, {outputs} FROM visits {where} GROUP BY region"


@contextmanager
def _before() -> Iterator[None]:
    """Planning as before this change: no limit on the aggregates, and the solver without its
    memo (each check's signature is its own)."""
    real: Callable[..., Any] = targets._Budgets._signature
    counter = iter(range(10**9))
    limits = (validate.MAX_AGGREGATES, validate.MAX_AGGREGATE_NODES, targets.MAX_RATIO_TARGETS)
    targets._Budgets._signature = lambda self, check, *parts: (  # type: ignore[method-assign]
        *real(self, check, *parts),
        next(counter),
    )
    validate.MAX_AGGREGATES = validate.MAX_AGGREGATE_NODES = targets.MAX_RATIO_TARGETS = 10**9
    try:
        yield
    finally:
        targets._Budgets._signature = real  # type: ignore[method-assign]
        validate.MAX_AGGREGATES, validate.MAX_AGGREGATE_NODES, targets.MAX_RATIO_TARGETS = limits


def _cpu(
    session: Session, n: int, form: str, options: str, *, repeats: int, first: int = 0
) -> float | str:
    times = []
    for run in range(first, first + repeats):
        sql = _select(n, form, options, run)
        start = time.process_time()
        try:
            session.execute("EXPLAIN " + sql)
        except Exception as exc:  # a refusal is a figure here
            return f"refused ({type(exc).__name__})"
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1, 6, 12, validate.MAX_AGGREGATES, 48]
    )
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    args = parser.parse_args()
    started = dt.datetime.now(dt.UTC)
    results = []
    print(f"{'aggregates':>10} | {'form':<37} | {'before: CPU s':>22} | {'after: CPU s':>22}")
    with closing(Session(load_policy(POLICY))) as session:
        base = _cpu(session, 1, "COUNT(*)", "", repeats=args.repeats)
        print(f"{1:>10} | {'COUNT(*) (baseline)':<37} | {base:>22.3f} | {base:>22.3f}")
        for name, (form, options) in FORMS.items():
            for n in args.sizes:
                after = _cpu(session, n, form, options, repeats=args.repeats)
                with _before():
                    before = _cpu(
                        session, n, form, options, repeats=args.repeats, first=args.repeats
                    )
                shown = [f"{c:.3f}" if isinstance(c, float) else c for c in (before, after)]
                print(f"{n:>10} | {name:<37} | {shown[0]:>22} | {shown[1]:>22}")
                results.append({"aggregates": n, "form": name, "before_cpu_s": before,
                                "after_cpu_s": after})  # fmt: skip
    write_results(args.results_dir, "planning", started, args.repeats, results)


if __name__ == "__main__":
    main()
