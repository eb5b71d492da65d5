"""Growing data: the budget a monthly dashboard spends with blocks against data versions.

    python benchmarks/growing.py [--months 24] [--epsilon 0.1] [--seed 7] [--all-panels through]
        [--run versions|periods|all] [--noise gaussian|laplace] [--lifetime 60]
        [--period-epsilon 2]

``--run periods`` (and ``all``, the default, first) runs the person-within-period run of
``benchmarks/periods.py``: a lifetime cap per person, month budgets, a year-to-date view.

Data: the example's visits (examples/data/visits.parquet, 378,910 rows of 50,000 users) shuffled
with a seeded generator and cut into 24 equal slices; slice k is month k (2025-01 .. 2026-12),
each row's ``day`` rewritten into that month (same day of the month, the last day when the month
is shorter), one Parquet file a month. ``--months N`` uses the first N months (each keeps 1/24 of
the rows, so a month's size does not depend on N). The policy is examples/policy.toml (age 18-90,
spend 0-200, the public regions, L0 = 2, C = 10) with a budget large enough that nothing is
refused.

The dashboard has six panels, the three statements of ``PANELS`` over two windows:

* **last 3 months**: ``WHERE day >= DATE '<first day of month k-2>' AND day < DATE '<first day
  of month k+1>'`` (months 1..k while k < 3);
* **all months**: with ``--all-panels through`` (default), ``WHERE day < DATE '<first day of
  month k+1>'``: every month up to k, the panel as it stood at month k, which at month k reads
  what a query without WHERE reads; with ``--all-panels open``, no WHERE on ``day``: the same
  text every month, so the history's all-months panels all show the latest month's figure.

At month m the dashboard shows its history: the six panels of every month k <= m (6m
statements), each at ``--epsilon``. Two strategies, in one run:

1. **blocks**: one session over a policy whose ``visits`` is made of blocks
   (``data.blocks``, in-memory ledger). Each month its file is registered as block ``YYYY-MM``
   (``dpsql.session.blocks.register``), then the history runs. A release is keyed by the blocks
   it reads, so a panel of an earlier month reads the same blocks as when it was first released
   and is served again free: only month m's six panels are charged. Figure: the session's
   cumulative epsilon spent after month m.
2. **data versions**: each month a new policy with ``data_version = str(m)`` and one table file
   holding every month so far (the union file, written that month), a fresh session with its
   own in-memory ledger, and the same history. The new data version keys every release anew, so
   all 6m panels are charged. Figure: the sum over months 1..m of each month's session's spend
   (in-memory ledgers, one a month, added up).

Each statement's charge is checked against what the strategy should charge (blocks: a panel of
month m only; data versions: each distinct statement once); a statement charged or served
otherwise is counted and listed. Per month: the blocks read by month m's panels, the cumulative
spend of each strategy, their ratio, and each strategy's wall time that month (data versions:
writing its union file and opening its session included); then each strategy's wall time over
all months and the median time of one ``Session.execute``, charged and free. Writing the monthly
files (common to both) is not timed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
import tomllib
from contextlib import closing
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import periods
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dpsql.policy import Policy, load_policy
from dpsql.session.blocks import register
from dpsql.session.session import Session

ROOT = Path(__file__).resolve().parent.parent
VISITS = ROOT / "examples" / "data" / "visits.parquet"
SLICES = 24  # the example's rows are cut into this many months whatever --months says
FIRST = dt.date(2025, 1, 1)
PANELS = {
    "count_by_region": "SELECT region, COUNT(*) AS visits FROM visits{where} GROUP BY region",
    "spend_by_region": "SELECT region, SUM(spend) AS spend FROM visits{where} GROUP BY region",
    "avg_spend": "SELECT AVG(spend) AS avg_spend FROM visits{where}",
}


def month_start(k: int) -> dt.date:
    """The first day of month k (month 1 is 2025-01)."""
    months = FIRST.month - 1 + k - 1
    return dt.date(FIRST.year + months // 12, months % 12 + 1, 1)


def write_months(folder: Path, months: int, seed: int) -> list[Path]:
    """Month k's file (k = 1..months): slice k of the shuffled example rows, days moved into
    that month."""
    table = pq.read_table(VISITS)
    order = np.random.default_rng(seed).permutation(table.num_rows)
    paths = []
    for k, rows in enumerate(np.array_split(order, SLICES)[:months], start=1):
        part = table.take(pa.array(np.sort(rows)))
        start, end = month_start(k), month_start(k + 1)
        last = (end - start).days - 1
        offset = np.minimum(pc.day(part["day"]).to_numpy() - 1, last)
        days = np.datetime64(start, "D") + offset.astype("timedelta64[D]")
        part = part.set_column(
            part.schema.get_field_index("day"), "day", pa.array(days, pa.date32())
        )
        path = folder / f"{start:%Y-%m}.parquet"
        pq.write_table(part, path)
        paths.append(path)
    return paths


def policy(folder: Path, table: Path | None, version: str) -> Policy:
    """The example policy with a large budget; ``visits`` made of blocks (``table`` None) or
    the one file ``table`` under data version ``version``."""
    return load_policy(raw_policy(table, version), base_dir=folder)


def raw_policy(table: Path | None, version: str) -> dict[str, Any]:
    """``policy``'s text as data."""
    raw: dict[str, Any] = tomllib.loads(
        (ROOT / "examples" / "policy.toml").read_text(), parse_float=Decimal
    )
    raw["dataset"]["data_version"] = version
    if table is None:
        raw["data"] = {"blocks": {"visits": {"period": "day"}}}
    else:
        raw["data"] = {"tables": {"visits": str(table)}}
    raw["budget"] = {
        "epsilon": "1000",
        "delta": "1e-6",
        "query_epsilon": "0.1",
        "query_delta": "1e-8",
        "diagnose": False,
    }
    raw["tables"]["visits"]["columns"]["day"]["date_range"] = [
        month_start(1),
        month_start(SLICES + 1) - dt.timedelta(days=1),
    ]
    return raw


@dataclass(frozen=True)
class Dashboard:
    """The panels and each statement's epsilon."""

    epsilon: str
    all_panels: str  # "through" or "open"

    def panels(self, k: int) -> list[str]:
        """Month k's six statements: ``PANELS`` over the last 3 months, then over all months."""
        end = month_start(k + 1)
        window = f" WHERE day >= DATE '{month_start(max(1, k - 2))}' AND day < DATE '{end}'"
        total = f" WHERE day < DATE '{end}'" if self.all_panels == "through" else ""
        return [sql.format(where=where) for where in (window, total) for sql in PANELS.values()]


@dataclass
class Strategy:
    """One strategy's cumulative spend, wall time and statements charged, month by month, and
    the statements whose charge was not the one expected."""

    name: str
    spent: list[Fraction] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    charged: list[int] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    # Seconds in Session.execute and statements, charged ones and free ones, over all months.
    timing: dict[bool, list[float]] = field(default_factory=lambda: {True: [], False: []})

    def history(self, run: Session, m: int, board: Dashboard, fresh: set[str]) -> None:
        """Run the dashboard's history at month m. A statement should be charged the first
        time its text is met if it is in ``fresh``, and served free otherwise."""
        charged = 0
        for k in range(1, m + 1):
            for sql in board.panels(k):
                start = time.perf_counter()
                result = run.execute(sql, epsilon=board.epsilon)
                self.timing[result.charge is not None].append(time.perf_counter() - start)
                expected = sql in fresh
                fresh.discard(sql)
                if (result.charge is not None) != expected:
                    state = "charged" if result.charge is not None else "free"
                    self.unexpected.append(f"month {m}, panel of month {k}: {state}: {sql}")
                charged += result.charge is not None
        self.charged.append(charged)


def blocks(folder: Path, files: list[Path], board: Dashboard) -> tuple[Strategy, list[str]]:
    """One session; each month registers its block, then runs the history. Also returns, per
    month, the blocks month m's two windows read (first..last, how many)."""
    out, read = Strategy("blocks"), []
    with closing(Session(policy(folder, None, "1"))) as run:
        for m, path in enumerate(files, start=1):
            start = time.perf_counter()
            period = (str(month_start(m)), str(month_start(m + 1)))
            block = f"{month_start(m):%Y-%m}"
            register(run.policy, run.filter.store, "visits", block, period=period, paths=[path])
            now = board.panels(m)
            out.history(run, m, board, set(now))
            out.seconds.append(time.perf_counter() - start)
            out.spent.append(run.budget().epsilon_spent)
            spans = []
            for sql in (now[0], now[-1]):
                ((_, ids),) = run.plan(sql).blocks
                spans.append(f"{ids[0]}..{ids[-1]} ({len(ids)})")
            read.append(", ".join(spans))
    return out, read


def versions(folder: Path, files: list[Path], board: Dashboard) -> Strategy:
    """Each month: the union file, a new policy with data_version m, a fresh session."""
    out, total = Strategy("data versions"), Fraction(0)
    for m in range(1, len(files) + 1):
        start = time.perf_counter()
        union = folder / f"union-{m:02d}.parquet"
        pq.write_table(pa.concat_tables([pq.read_table(p) for p in files[:m]]), union)
        with closing(Session(policy(folder, union, str(m)))) as run:
            every = {sql for k in range(1, m + 1) for sql in board.panels(k)}
            out.history(run, m, board, every)
            total += run.budget().epsilon_spent
        out.seconds.append(time.perf_counter() - start)
        out.spent.append(total)
        union.unlink()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--months", type=int, default=24, help=f"1 to {SLICES} (default 24)")
    parser.add_argument("--epsilon", default="0.1", help="each statement's epsilon")
    parser.add_argument("--seed", type=int, default=7, help="the shuffle of the rows")
    parser.add_argument("--run", choices=["versions", "periods", "all"], default="all",
                        help="blocks against data versions, the periods run, or both")  # fmt: skip
    parser.add_argument("--noise", choices=["gaussian", "laplace"], default="gaussian",
                        help="the periods run's noise")  # fmt: skip
    parser.add_argument("--lifetime", default="60", help="the periods run's lifetime cap")
    parser.add_argument("--period-epsilon", default="2", help="each month's budget (periods)")
    parser.add_argument(
        "--all-panels",
        choices=["through", "open"],
        default="through",
        help="the all-months panels: WHERE day < the end of month k, or no WHERE",
    )
    args = parser.parse_args()
    if not 1 <= args.months <= SLICES:
        parser.error(f"--months is 1 to {SLICES}")
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        files = write_months(folder, args.months, args.seed)
        rows = [pq.ParquetFile(p).metadata.num_rows for p in files]
        print(f"{args.months} months of {min(rows):,}-{max(rows):,} rows, 6 panels a month at "
              f"epsilon {args.epsilon}, all-months panels: {args.all_panels}\n")  # fmt: skip
        if args.run in ("periods", "all"):
            periods.run(folder, files, month_start, raw_policy(None, "1"), args.epsilon,
                        args.noise, args.lifetime, args.period_epsilon)  # fmt: skip
        if args.run == "periods":
            return
        start = time.perf_counter()
        board = Dashboard(args.epsilon, args.all_panels)
        made, read = blocks(folder, files, board)
        made_s = time.perf_counter() - start
        start = time.perf_counter()
        versioned = versions(folder, files, board)
        versioned_s = time.perf_counter() - start
    head = (f"{'month':<7} | {'blocks read (last 3, all)':<44} | {'stmts':>5} | "
            f"{'charged b/v':>11} | {'blocks eps':>10} | {'versions eps':>12} | {'ratio':>6} | "
            f"{'blocks s':>8} | {'versions s':>10}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for m in range(1, args.months + 1):
        b, v = made.spent[m - 1], versioned.spent[m - 1]
        print(f"{month_start(m):%Y-%m} | {read[m - 1]:<44} | {6 * m:>5} | "
              f"{made.charged[m - 1]:>5}/{versioned.charged[m - 1]:<5} | {float(b):>10.1f} | "
              f"{float(v):>12.1f} | {float(v / b):>5.2f}x | {made.seconds[m - 1]:>8.2f} | "
              f"{versioned.seconds[m - 1]:>10.2f}")  # fmt: skip
    print(f"\nwall time: blocks {made_s:.1f} s, data versions {versioned_s:.1f} s")
    for strategy in (made, versioned):
        for charged, what in ((True, "charged"), (False, "free")):
            times = strategy.timing[charged]
            if times:
                print(f"{strategy.name}: {len(times)} {what} statements, median "
                      f"{statistics.median(times) * 1000:.1f} ms")  # fmt: skip
    for strategy in (made, versioned):
        if strategy.unexpected:
            print(f"\n{strategy.name}: {len(strategy.unexpected)} statement(s) not charged as "
                  "expected:")  # fmt: skip
            for line in strategy.unexpected[:20]:
                print(f"  {line}")
        else:
            print(f"{strategy.name}: every statement charged or served as expected")


if __name__ == "__main__":
    main()
