"""Periods: a person-within-period unit under a lifetime cap, a dashboard refreshed each period,
a year-to-date total from a continual-release view, and one ad-hoc query a period.

    python benchmarks/growing.py --run periods [--months 24] [--noise gaussian|laplace]

(``growing.py`` writes the monthly files and calls ``run`` here.) The policy is growing.py's
with a ``periods`` section: ``visits``' unit is (user_id, month); each month's budget is
``--period-epsilon`` (default 2); the lifetime cap per person is ``--lifetime`` (default 60):
the budget.

Each month k, after its block is registered:

* the **dashboard**: growing.py's three panels over month k and over the last three months
  (a person in three months pays three times for those);
* the **year-to-date** total: ``VIEW ytd FROM '<Jan 1 of k's year>' TO '<month k+1>'``, a
  view of visits by region declared at month 1 over a horizon of every month (its mechanism
  chosen by the smallest mean ±: plain under Laplace noise, the factorization under Gaussian
  noise at 24 months), read free;
* one **ad-hoc** query: the average age by region of month k.

Per month: what month k's period budget has spent and has left, the least left of any month,
the lifetime figure (the deciding filter's epsilon for one person in every month: the
guarantee) and what is left of the cap, and the sum of the months' own spends, which a product
renewing budgets per period would report instead (never the guarantee). Then the YTD estimate
of central's visits, its ±, the ± that the plan gives for that range, the bounded count before
noise (what the ± covers) and the true count (raw DuckDB; the example policy's L0 = 2 cuts
about 40% of a month's rows: a bias the ± does not cover, which the diagnosis reports).

Then, for every horizon T <= the months: each mechanism's mean ± over the ranges of T periods
in units of one period's noise, the mechanism chosen and its ratio to plain answers (at most 1),
and range by range: how many ranges the chosen mechanism answers with a smaller ± than plain
answers, and the best and worst ratio (short ranges are answered less well by a tree or a
factorization than by plain answers: the choice is by the mean).
"""

from __future__ import annotations

import datetime as dt
import time
from contextlib import closing
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from dpsql.accounting.ledger.views import view_values
from dpsql.plan.views import Reading, _range_variances, mean_half_widths
from dpsql.policy import load_policy
from dpsql.session import views
from dpsql.session.blocks import register
from dpsql.session.session import Session

PANELS = {
    "count_by_region": "SELECT region, COUNT(*) AS visits FROM visits{where} GROUP BY region",
    "spend_by_region": "SELECT region, SUM(spend) AS spend FROM visits{where} GROUP BY region",
    "avg_spend": "SELECT AVG(spend) AS avg_spend FROM visits{where}",
}
YTD = "SELECT region, COUNT(*) AS visits FROM visits GROUP BY region"
AD_HOC = "SELECT region, AVG(age) AS age FROM visits{where} GROUP BY region"


def _policy(raw: dict[str, Any], noise: str, lifetime: str, period: str) -> dict[str, Any]:
    raw["periods"] = {"table": "visits", "epsilon": period, "delta": "1e-6"}
    raw["budget"] = {**raw["budget"], "epsilon": lifetime, "delta": "1e-5"}
    if noise == "gaussian":
        raw["budget"] |= {"mechanism": "gaussian", "accountant": "zcdp"}
    return raw


def _window(first: dt.date, end: dt.date) -> str:
    return f" WHERE day >= DATE '{first}' AND day < DATE '{end}'"


def run(  # noqa: PLR0917 - the benchmark's settings
    folder: Path,
    files: list[Path],
    month_start: Any,
    raw: dict[str, Any],
    epsilon: str,
    noise: str = "gaussian",
    lifetime: str = "60",
    period: str = "2",
) -> None:
    """The periods run (module docstring), printed."""
    months = len(files)
    policy = load_policy(_policy(raw, noise, lifetime, period), base_dir=folder)
    truth = duckdb.connect()
    head = (f"{'month':<7} | {'this month spent/left':>21} | {'least left':>10} | "
            f"{'lifetime':>8} | {'left':>6} | {'sum of months':>13} | {'YTD central':>11} | "
            f"{'±':>7} | {'plan ±':>7} | {'bounded':>7} | {'true':>6} | {'s':>5}")  # fmt: skip
    print(f"\nperiods: {months} months, unit (user_id, month), each month's budget {period}, "
          f"lifetime cap {lifetime} ({noise} noise, statements at {epsilon})\n")  # fmt: skip
    print(head)
    print("-" * len(head))
    with closing(Session(policy)) as session:
        for k, path in enumerate(files, start=1):
            start = time.perf_counter()
            first, end = month_start(k), month_start(k + 1)
            register(session.policy, session.filter.store, "visits", f"{first:%Y-%m}",
                     period=(str(first), str(end)), paths=[path])  # fmt: skip
            if k == 1:
                views.declare(session, "ytd", YTD, start=str(first), every="month",
                              horizon=months, epsilon=Fraction(epsilon), by="owner")  # fmt: skip
            last3 = _window(month_start(max(1, k - 2)), end)
            for where in (_window(first, end), last3):
                for sql in PANELS.values():
                    session.execute(sql.format(where=where), epsilon=epsilon)
            session.execute(AD_HOC.format(where=_window(first, end)), epsilon=epsilon)
            year = dt.date(first.year, 1, 1)
            ytd = session.execute(f"VIEW ytd FROM '{year}' TO '{end}'")
            central = next(r for r in ytd.rows if r[2] == "central")
            plan_width = _plan_width(session, year, end)
            bounded = _bounded(session, year, end)
            seconds = time.perf_counter() - start
            listed = ", ".join(f"'{p}'" for p in files[:k])
            true = truth.execute(
                f"SELECT COUNT(*) FROM read_parquet([{listed}]) WHERE region = 'central' "
                f"AND day >= DATE '{year}'"
            ).fetchone()
            active = session.registered.blocks.active("visits")
            rows = session.filter.period_rows([(b.id, b.start, b.end) for b in active])
            mine = rows[-1]
            least = min(r["epsilon_left"] for r in rows)
            summed = sum(r["epsilon"] for r in rows)
            life = session.budget()
            spent, left = float(mine["epsilon"]), float(mine["epsilon_left"])
            print(f"{first:%Y-%m} | {spent:>9.2f}/{left:<11.2f} | "
                  f"{float(least):>10.2f} | {float(life.epsilon_spent):>8.2f} | "
                  f"{float(life.epsilon_remaining):>6.2f} | {float(summed):>13.2f} | "
                  f"{central[3]:>11.0f} | {central[4]:>7.0f} | {plan_width:>7.0f} | {bounded:>7} | "
                  f"{true[0] if true else 0:>6} | {seconds:>5.2f}")  # fmt: skip
        chosen = views.views_of(session)["ytd"].mechanism
    print(f"\nthe YTD view's mechanism: {chosen}.")
    horizons(months, noise == "gaussian")


def horizons(months: int, gaussian: bool) -> None:
    """For every horizon T up to ``months``: each mechanism's mean ± over the ranges of T
    periods, in units of one period's noise, the choice, and range by range against plain."""
    print("Mean ± of a range of periods, in units of one period's noise, by horizon T:\n")
    head = (f"{'T':>3} | {'plain':>7} | {'tree':>7} | {'factorization':>13} | chosen        | "
            f"ratio | {'ranges better':>13} | {'best':>5} | {'worst':>5}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for t in range(1, months + 1):
        widths = mean_half_widths(t, gaussian)
        best = min(widths, key=lambda m: (widths[m], m != "plain"))
        fact = f"{widths['factorization']:>13.3f}" if "factorization" in widths else f"{'-':>13}"
        # Range by range: the chosen mechanism's ± over plain answers' (ranges of T periods).
        a, b = np.triu_indices(t)
        ratio = np.sqrt(_range_variances(best, t, gaussian)[a, b]
                        / _range_variances("plain", t, gaussian)[a, b])  # fmt: skip
        better = int(np.sum(ratio < 1 - 1e-9))
        print(f"{t:>3} | {widths['plain']:>7.3f} | {widths['tree']:>7.3f} | {fact} | "
              f"{best:<13} | {widths[best] / widths['plain']:.3f} | "
              f"{better:>5} of {len(ratio):<5} | {ratio.min():.2f} | "
              f"{ratio.max():.2f}")  # fmt: skip


def _bounded(session: Session, year: dt.date, end: dt.date) -> int:
    """The bounded count of central over the range, before noise (what the ± covers; the rest
    of the gap to the true count is what the example policy's bounds cut)."""
    plan = session.plan(YTD.replace(" GROUP BY", f"{_window(year, end)} GROUP BY"), epsilon="0.1")
    _, rows = session.engine.run(plan.engine_sql)
    return int(next(r[1] for r in rows if r[0] == "central"))


def _plan_width(session: Session, year: dt.date, end: dt.date) -> float:
    """The ± the view's plan gives the YTD range for central, from its design alone (no value
    read): what the released answer must show."""
    view = views.views_of(session)["ytd"]
    base, design = views.plan_view(session, view.sql, horizon=view.calendar.horizon,
                                   epsilon=view.epsilon, mechanism=view.mechanism)  # fmt: skip
    found = view_values(session.filter.store.records(), "ytd")
    released = tuple(sorted(found, key=lambda n: (n[1], n[1] - n[0])))
    reading = Reading.of(design, released)
    a = next(i for i in range(view.calendar.horizon) if view.calendar.bounds(i)[0] == year)
    b = next(i for i in range(view.calendar.horizon + 1) if view.calendar.bounds(i)[0] == end)
    _, width = reading.estimate([0] * len(released), a, b, design.noises[0],
                                session.settings().confidence)  # fmt: skip
    return width * float(base.measurements[0].unit)
