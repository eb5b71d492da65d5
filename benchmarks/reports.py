"""Report time against the history's length: ``budget()``, its deciding figure, the full report.

For each length (100, 1,000, 10,000 charges) and history ("gaussian": one calibrated discrete
Gaussian repeated; "mixed": that Gaussian, a discrete Laplace of epsilon 0.01, an exponential
mechanism of epsilon 0.02 and a partition selection in turn), a durable ledger is filled
(``charges.fill``, in ``--dir``) and a ``Budget`` with the RDP filter folds it. Then, ``--repeats``
times: one more charge (untimed), ``budget.report()`` timed (spent and remaining budget and the
deciding filter's figure: what ``budget()`` and the budget view read), then its ``figures``
timed (every accountant: basic, advanced, optimal, rdp, zcdp, gdp, pld). Medians in ms.

Beside them, in the same run: dp_accounting's RDP and PLD accountants composing the same
history from scratch (grouped, ``SelfComposedDpEvent``) and reading epsilon at 1e-6, the cost of
a fresh reading with Google's library (discrete events mapped to their continuous counterparts).

    python benchmarks/reports.py [--repeats 5] [--dir PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from charges import fill
from dp_accounting import dp_event, rdp
from dp_accounting.pld import pld_privacy_accountant

from dpsql.accounting.budget.build import budget_for
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import budget_caps
from dpsql.mechanisms.events import Composite, Event
from dpsql.mechanisms.gaussian_events import DiscreteGaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.mechanisms.selection_events import Exponential, LaplacePartitionSelection
from dpsql.policy import BudgetSpec

LENGTHS = (100, 1_000, 10_000)
F = Fraction
GAUSSIAN = Composite((DiscreteGaussian(F(1600), F(1), F(1, 10), F(1, 10**9)),))
HISTORIES: dict[str, tuple[Composite, ...]] = {
    "gaussian": (GAUSSIAN,),
    "mixed": (
        GAUSSIAN,
        Composite((DiscreteLaplace(F(100), F(1)),)),
        Composite((Exponential(F(1, 50)),)),
        Composite((LaplacePartitionSelection(F(100), F(1), 2000, F(1, 10**10)),)),
    ),
}
SPEC = BudgetSpec(epsilon=F(10_000), delta=F(1, 10**5), accountant="rdp")


def _median(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def dpsql_rows(folder: Path, kind: str, n: int, repeats: int) -> tuple[float, float]:
    path = folder / f"{kind}-{n}.db"
    Ledger.create(path, "bench", budget=budget_caps(SPEC))
    fill(path, n, "rdp", HISTORIES[kind])
    budget = budget_for("bench", SPEC, Ledger(path))
    assert budget.report().figures  # warm-up: the odometers' caches see the history once
    quick, full = [], []
    for i in range(repeats):
        budget.charge(HISTORIES[kind][i % len(HISTORIES[kind])], f"SELECT {i}", "bench")
        began = time.perf_counter()
        report = budget.report()
        quick.append(time.perf_counter() - began)
        began = time.perf_counter()
        figures = report.figures
        full.append(time.perf_counter() - began)
        assert len(figures) == 7 and all(f.epsilon >= 0 for f in figures)
    return _median(quick), _median(full)


def _reference_event(event: Event) -> dp_event.DpEvent:
    if isinstance(event, DiscreteGaussian):
        return dp_event.GaussianDpEvent(float(event.sigma2) ** 0.5 / float(event.sensitivity))
    return dp_event.LaplaceDpEvent(1 / float(event.epsilon))


def reference(make: Callable[[], object], kind: str, n: int, repeats: int) -> float:
    cycle = HISTORIES[kind]
    counts = Counter(e for i in range(n) for e in cycle[i % len(cycle)].events)
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        acc = make()
        for event, m in counts.items():
            acc.compose(dp_event.SelfComposedDpEvent(_reference_event(event), m))  # type: ignore[attr-defined]
        acc.get_epsilon(1e-6)  # type: ignore[attr-defined]
        samples.append(time.perf_counter() - began)
    return _median(samples)


def table(folder: Path, repeats: int) -> str:
    rows: dict[str, list[float]] = {}
    for kind in HISTORIES:
        measured = [dpsql_rows(folder, kind, n, repeats) for n in LENGTHS]
        rows[f"budget() + deciding figure | {kind}"] = [q for q, _ in measured]
        rows[f"full report (7 figures)    | {kind}"] = [f for _, f in measured]
        rows[f"dp_accounting RDP (ref)    | {kind}"] = [
            reference(rdp.RdpAccountant, kind, n, repeats) for n in LENGTHS
        ]
        rows[f"dp_accounting PLD (ref)    | {kind}"] = [
            reference(pld_privacy_accountant.PLDAccountant, kind, n, repeats) for n in LENGTHS
        ]
    head = f"{'ms (median)':<27} | {'history':8} | " + " | ".join(f"{n:>9,}" for n in LENGTHS)
    lines = [head, "-" * len(head)]
    for name, values in sorted(rows.items(), key=lambda kv: kv[0].split("|")[1]):
        label, kind = (part.strip() for part in name.split("|"))
        lines.append(f"{label:<27} | {kind:8} | " + " | ".join(f"{v:9.3f}" for v in values))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir or Path(__file__).parent) as folder:
        text = table(Path(folder), args.repeats)
    where = f" --dir {args.dir}" if args.dir else ""
    command = f"python benchmarks/reports.py --repeats {args.repeats}{where}"
    print(f"{dt.date.today().isoformat()}, {command}")
    print(text)


if __name__ == "__main__":
    main()
