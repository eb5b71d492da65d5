"""Contribution bounds against an oracle: the relative error of dpsql's answers under the bounds
it runs with (estimated by ``ESTIMATE BOUNDS``, the example policy's fixed ones, or chosen
privately per query by ``dpsql.bounds = auto``) beside an oracle that picks the best bound
knowing the data.

    python benchmarks/bounds.py              # 50 seeds, 3 epsilons, 5 generators: about 40 min
    python benchmarks/bounds.py --quick      # 5 seeds, epsilon 1: about 25 s
    python benchmarks/bounds.py --seeds 20 --epsilons 0.5 1 --generators heavy_zipf

Generators (data set ``s`` of a generator numbered ``k`` is drawn from numpy's
``default_rng([seed + s, k])``, ``--seed`` the base, default 0): 10,000 units (``user_id``, the
policy's privacy unit), a public key ``grp`` of 8 values ``g0`` .. ``g7`` (declared as the
column's ``public_values``), and ``amount``, log-normal (log-mean 3, log-sd 1: median 20)
clipped to [0, 100] when generated and declared with ``lower = 0``, ``upper = 100`` (no value
lies outside them: the bias measured is that of the contribution bounds alone), but for
``auto_clamps``, which leaves them undeclared for dpsql to choose. A unit's rows
are ``floor(X)`` for X Pareto with minimum 1 and index alpha (``P(rows >= k) = k^-alpha``),
capped at 2^16 rows (seeds 0-49: the cap reached by one unit of ``heavy``, three of
``heavy_zipf``):

* ``heavy``: alpha = 1.2, each row's group uniform over the 8 groups (seeds 0-49: 39,149 to
  106,444 rows per data set, median 48,500; the largest unit a median 3,005 rows);
* ``light``: alpha = 2, groups uniform (15,831 to 17,239 rows, median 16,386; the largest unit
  110);
* ``heavy_zipf``: alpha = 1.2, each row's group Zipf(1.1) over the 8 groups (P(g_i) proportional
  to (i + 1)^-1.1: g0 40%, g7 4%; 39,905 to 179,174 rows, median 49,114);
* held out (no parameter of dpsql's choice was set on them): ``lognormal``, rows per unit
  ceil(log-normal(0.5, 1.5)) and groups Zipf(2); ``bimodal``, 95% of units with 1-5 rows and 5%
  with 31-150 (the shape of the report that opened the issue), groups uniform;
* held out a second time (added after the trade-off walks' threshold share and one-rung
  overshoot were set, with the earlier generators in view, and first run for the table they
  appear in): ``geometric``, rows per unit geometric with mean 5 and groups Zipf(1.5);
  ``weibull``, rows per unit ceil(3·W), W Weibull of shape 0.5 (a stretched-exponential tail),
  groups uniform.

Queries: ``COUNT(*)``, ``SUM(amount)`` and ``COUNT(DISTINCT user_id)``, each in total and
``GROUP BY grp``; epsilon 0.1, 0.5 and 1 (``--epsilons``). The metric, per output (the total, or
one group): |estimate - truth| / max(truth, 1), truth the unbounded answer computed with numpy
on the generated rows; the median over the seeds (``--seeds``, default 50), then the median over
the query's outputs. Every route answers every (data set, query, epsilon) once.

Routes (the columns; each is a ``Route``: given a data set, a query and epsilon, the released
value of each output and the bounds it ran with; a future route plugs in beside them):

* ``oracle`` spends the whole epsilon on the answer with the bound that minimises the metric,
  chosen per (generator, query, epsilon) knowing the data: for every candidate bound it computes
  each data set's bounded exact totals with numpy, as dpsql bounds them (R: a uniformly random R
  of each unit's rows; L0: a uniformly random L0 of each unit's groups, where dpsql ranks them by
  a salted hash; C: a count keeps min(n, C) of a unit's n rows in a group, a sum is scaled to
  S·C/n when n > C), and the sensitivity dpsql's planner gives them (docs/sql.md): a total
  COUNT under R alone (C = R, L0 = 1) has L1 sensitivity R, a total SUM 100·R; a grouped COUNT
  under (L0, C) has min(L0, 8)·C (L0 is capped by the 8 public groups), a grouped SUM
  100·min(L0, 8)·C; COUNT(DISTINCT user_id) has 1 per group, so min(L0, 8) grouped and 1 in
  total, where no bound changes anything (the oracle has nothing to choose: "none"). Candidates
  are the powers of 2 from 1 to 2^16: 17 values of R for the totals, the 17 × 17 grid of (L0, C)
  for the grouped COUNT and SUM, 17 values of L0 for the grouped COUNT(DISTINCT). The choice:
  ``--draws`` (default 100) Laplace noises of scale 1 per data set and output, shared by every
  candidate (common random numbers) and scaled by its sensitivity / epsilon; the candidate of
  the least metric over all of them (per output the median over seeds × draws, then the median
  over outputs; ties to the smallest bound) wins. Its reported error then comes from one fresh,
  independent draw per data set (as every other route's), so the figure is not selected on its
  own noise: a discrete Laplace (numpy, the difference of two geometric variables) of scale
  sensitivity / epsilon on the counts, as dpsql draws, and a continuous Laplace on the sums
  (dpsql's discrete Laplace on a grid of 2^-14 is that, to within the grid).
* ``estimate_bounds`` is dpsql with no contribution bounds in the policy, estimated: a new
  ``Session`` per (data set, query, epsilon), ``SET dpsql.fresh = on``, then ``ESTIMATE BOUNDS
  FOR visits`` (R, for a total) or ``ESTIMATE BOUNDS FOR visits GROUP BY grp`` (L0 and C, for a
  grouped query), charged at ``--estimate-share`` (default 0.1) of the query's epsilon on top
  of it (the route spends 1.1 epsilon in all), then the query at epsilon through dpsql. With R
  alone dpsql takes C = L0 = R (a total's sensitivity R); with L0 and C the planner's min(L0,
  8)·C. dpsql's own noise.
  It sets each bound at the 95% quantile (``AT QUANTILE 0.95``), the rule ``ESTIMATE BOUNDS``
  had before it took the trade-off as its default.
* ``estimate_tradeoff``: the same with ``ESTIMATE BOUNDS ... FOR EPSILON e``, e the query's
  epsilon: the bounds set by the bias-noise trade-off of ``auto`` (below), estimated once at
  the extra ``--estimate-share`` instead of chosen within the query's epsilon.
* ``example_policy``: the contribution bounds of ``examples/policy.toml`` (its
  ``max_groups_per_unit``, ``max_rows_per_unit_per_group`` and ``max_rows_per_unit`` if any:
  L0 = 2, C = 10, no R) declared for the generated table, the query through dpsql at epsilon
  (one ``Session`` per data set, ``SET dpsql.fresh = on``). The example's column bounds are for
  its own columns (spend, age); ``amount`` keeps its declared [0, 100] in every route but
  ``auto_clamps``.
* ``auto``: dpsql choosing the bounds itself, no contribution bounds in the policy and
  ``amount`` declared [0, 100]: a new ``Session`` per (data set, query, epsilon), ``SET
  dpsql.fresh = on``, ``SET dpsql.bounds = auto``, then the query at epsilon. dpsql spends
  ``dpsql.bounds_share`` (its default, 0.25) of that epsilon choosing R (a total), or C
  (grouped: L0 is the 8 public groups, free) by a sparse-vector walk up its ladder (1, 2, 3, 4,
  6, 8, 12, ... 2^16), and answers at the rest: the whole epsilon, the choice inside it (unlike
  ``estimate_bounds``, which spends 1.1 epsilon). A total COUNT(DISTINCT user_id) needs no bound
  and is answered at the whole epsilon. The bounds column: the median over the seeds of each
  bound of the answer's plan (``result.plan``), as for the other dpsql routes.
* ``auto_clamps``: ``auto`` with ``amount``'s clamps left undeclared too, so dpsql chooses its
  lower and upper (from 0 and ±m·2^e) beside R or C within the same share, split evenly
  among the walks (R's or C's gets half of it); the SUM queries only (no other query
  aggregates ``amount``: the others would be ``auto`` again). Its bounds column adds the median
  over the seeds of the clamps the answer ran with (the plan's analysis of ``amount``), as
  ``amount in [lower, upper]``. No value lies outside [0, 100], so clamps wider than that cut
  nothing and cost noise only; an upper below 100 or a lower above 0 is bias.

Targets for ``auto`` and ``auto_clamps`` (checked per (generator, query, epsilon) cell on the
median errors): at most 2x the oracle's error at epsilon 0.5 and above, 4x below (epsilon 0.1),
and at most ``estimate_bounds``'s and ``example_policy``'s at every epsilon (where they ran).
Each auto route's column "targets" says ``ok`` or ``miss:`` and the targets missed; after the
generators a table per auto route, generator and query gives, per epsilon, its error ÷ the
oracle's, ÷ ``estimate_bounds``'s and ÷ ``example_policy``'s, and the same check. A cell whose
errors are at the discrete noise's quantum (the total COUNT(DISTINCT user_id), no bound binds)
can miss on one draw against another.

Simulated candidate routes (``bounds_routes.py``; ``--routes`` picks the routes beside the
oracle, every one by default): numpy simulations of mechanisms that could choose a bound
privately per query, not dpsql features. Each spends a share s (0.1 or 0.25, both run as
variants) of epsilon choosing R (totals) or C under L0 = 8 (grouped) from the powers of 2 with
a differentially private mechanism on a rank statistic, then answers at (1 - s)·epsilon from the
oracle's exact bounded totals with dpsql's sensitivity and noise: ``em_rank``, ``em_overshoot``,
``svt_down``, ``svt_up``, ``r2t`` (the totals), ``all_groups_em`` and ``all_groups_svt_up``
(grouped; the grouped COUNT(DISTINCT) under L0 = 8 as ``all_groups``). After the generators
come every variant's ratio to the oracle and a table per (generator, epsilon) with, per route,
the variant of the least geometric mean ratio over the whole run.

dpsql runs under a policy of total epsilon 10,000 (the most a policy accepts) with the default
diagnosis off (``budget.diagnose = false``: it is charged beside the query and changes no
released value). Printed: a Markdown table per (generator, epsilon), one row per query: each
route's median relative error, its ratio to the oracle's and the bounds it ran with (the median
over the seeds of each bound dpsql's plan used; for the oracle, its choice) and, for the auto
routes, the targets. Cells a route could not answer count as refusals, shown in the cell.
Written as JSON into ``benchmarks/results/`` (per output medians, the oracle's metric for every
candidate, the refusals' messages, the auto routes' clamps and missed targets).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import statistics
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bounds_routes import MECHANISMS, ROUTES, Mechanism, geometric_mean, stats  # noqa: E402
from run import HERE, write_results  # noqa: E402

from dpsql.errors import DpsqlError  # noqa: E402
from dpsql.policy import Policy, load_policy  # noqa: E402
from dpsql.release.result import Result  # noqa: E402
from dpsql.session.session import Session  # noqa: E402

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

UNITS = 10_000
GROUPS = tuple(f"g{i}" for i in range(8))
ROW_CAP = 2**16  # the most rows one unit has
LOWER, UPPER = 0, 100  # amount's declared bounds; its values are clipped to them
POWERS = tuple(2**k for k in range(17))  # the oracle's candidates, 1 .. 2^16
EPSILONS = ("0.1", "0.5", "1")
QUICK_EPSILONS = ("1",)
BUDGET = "10000"  # the largest total epsilon a policy accepts
EXAMPLE_POLICY = ROOT / "examples" / "policy.toml"


# -- data --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Generator:
    name: str
    number: int  # mixed into every data set's seed
    alpha: float  # Pareto index of the rows per unit (or the log-normal's sigma)
    zipf: float | None  # Zipf exponent of a row's group; None: uniform
    about: str
    # How rows per unit are drawn: "pareto" (the three), or the held-out families no
    # choice in dpsql was tuned on: "lognormal" (ceil of a log-normal, log-mean 0.5, sigma
    # alpha), "bimodal" (95% of units 1-5 rows, 5% 31-150, uniform), "geometric" (mean alpha)
    # and "weibull" (ceil of 3 times a Weibull of shape alpha: a stretched-exponential tail).
    rows: str = "pareto"
    # "home": each unit has one group, uniform, holding 70% of its rows in expectation; its other
    # rows fall uniformly (groups concentrated within units, uniform over them).
    groups: str = "rows"

    def draw(self, seed: int) -> tuple[IntArray, IntArray, FloatArray]:
        """(unit, group, amount) per row, the units 0 .. UNITS - 1 in order, each with >= 1 row."""
        rng = np.random.default_rng([seed, self.number])
        if self.rows == "lognormal":
            x = np.minimum(np.ceil(rng.lognormal(0.5, self.alpha, UNITS)), float(ROW_CAP))
        elif self.rows == "bimodal":
            heavy = rng.random(UNITS) < 0.05
            x = np.where(heavy, rng.integers(31, 151, UNITS), rng.integers(1, 6, UNITS))
        elif self.rows == "geometric":
            x = rng.geometric(1.0 / self.alpha, UNITS).astype(np.float64)
        elif self.rows == "weibull":
            x = np.minimum(np.ceil(3.0 * rng.weibull(self.alpha, UNITS)), float(ROW_CAP))
        elif self.rows == "negbin":
            # 1 + a negative binomial of shape 0.5 and mean alpha (an over-dispersed Poisson).
            x = 1.0 + rng.negative_binomial(0.5, 0.5 / (0.5 + self.alpha), UNITS)
        elif self.rows == "loguniform":
            x = np.floor(np.exp(rng.uniform(0.0, math.log(self.alpha), UNITS)))
        else:
            # numpy's pareto is Lomax: 1 + it is Pareto with minimum 1, P(X >= k) = k^-alpha.
            x = np.minimum(1.0 + rng.pareto(self.alpha, UNITS), float(ROW_CAP))
        rows = np.maximum(np.floor(x), 1).astype(np.int64)
        unit = np.repeat(np.arange(UNITS, dtype=np.int64), rows)
        n = len(unit)
        if self.groups == "home":
            home = rng.integers(0, len(GROUPS), UNITS)[unit]
            other = rng.integers(0, len(GROUPS), n)
            group = np.where(rng.random(n) < 0.7, home, other).astype(np.int64)
        elif self.zipf is None:
            group = rng.integers(0, len(GROUPS), n).astype(np.int64)
        else:
            p = np.arange(1, len(GROUPS) + 1, dtype=np.float64) ** -self.zipf
            group = rng.choice(len(GROUPS), n, p=p / p.sum()).astype(np.int64)
        amount = np.clip(rng.lognormal(3.0, 1.0, n), LOWER, UPPER)
        return unit, group, amount


GENERATORS = {
    g.name: g
    for g in (
        Generator("heavy", 1, 1.2, None, "rows per unit Pareto(1.2), groups uniform"),
        Generator("light", 2, 2.0, None, "rows per unit Pareto(2), groups uniform"),
        Generator("heavy_zipf", 3, 1.2, 1.1, "rows per unit Pareto(1.2), groups Zipf(1.1)"),
        # Held out: no parameter of dpsql's choice was tuned on these.
        Generator(
            "lognormal",
            4,
            1.5,
            2.0,
            "held out: rows per unit ceil(log-normal(0.5, 1.5)), groups Zipf(2)",
            rows="lognormal",
        ),
        Generator(
            "bimodal",
            5,
            0.0,
            None,
            "held out: 95% of units 1-5 rows, 5% 31-150, groups uniform",
            rows="bimodal",
        ),
        # Held out a second time: added after the walks' threshold share and overshoot were
        # set, and first run for the table they appear in.
        Generator(
            "geometric",
            6,
            5.0,
            1.5,
            "held out: rows per unit geometric (mean 5), groups Zipf(1.5)",
            rows="geometric",
        ),
        Generator(
            "weibull",
            7,
            0.5,
            None,
            "held out: rows per unit ceil(3 Weibull(0.5)), groups uniform",
            rows="weibull",
        ),
        # Held out a third time: added after C's walk took group weights (grouped queries),
        # with the seven above in view, and first run for the table they appear in.
        Generator(
            "negbin",
            8,
            8.0,
            1.3,
            "held out: rows per unit 1 + negative binomial (shape 0.5, mean 8), groups Zipf(1.3)",
            rows="negbin",
        ),
        Generator(
            "loguniform",
            9,
            100.0,
            None,
            "held out: rows per unit log-uniform on [1, 100), each unit's rows 70% in a home group",
            rows="loguniform",
            groups="home",
        ),
    )
}


@dataclass
class DataSet:
    """One generated table, its Parquet file (written when a dpsql route first asks), and what
    routes keep per data set (sessions, the oracle's bounded totals), dropped by ``close``."""

    generator: Generator
    seed: int
    folder: Path
    unit: IntArray
    group: IntArray
    amount: FloatArray
    sessions: dict[str, Session] = field(default_factory=dict)
    kept: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return len(self.unit)

    @property
    def path(self) -> Path:
        path = self.folder / f"{self.generator.name}-{self.seed}.parquet"
        if not path.exists():
            table = pa.table(
                {
                    "user_id": pa.array(self.unit, type=pa.int64()),
                    "grp": pa.array(np.asarray(GROUPS)[self.group], type=pa.string()),
                    "amount": pa.array(self.amount, type=pa.float64()),
                }
            )
            pq.write_table(table, path)
        return path

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()
        self.sessions.clear()
        self.kept.clear()
        self.path.unlink(missing_ok=True)


# -- queries -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    aggregate: str  # as written in SQL
    kind: str  # "rows", "sum" or "units"
    grouped: bool

    @property
    def name(self) -> str:
        return f"{self.aggregate}{' by grp' if self.grouped else ''}"

    @property
    def sql(self) -> str:
        if self.grouped:
            return f"SELECT grp, {self.aggregate} FROM visits GROUP BY grp"
        return f"SELECT {self.aggregate} FROM visits"

    def truth(self, data: DataSet) -> FloatArray:
        """The unbounded answer, one value per output (the total, or g0 .. g7)."""
        if not self.grouped:
            if self.kind == "rows":
                return np.array([float(data.rows)])
            if self.kind == "sum":
                return np.array([float(data.amount.sum())])
            return np.array([float(len(np.unique(data.unit)))])
        k = len(GROUPS)
        if self.kind == "rows":
            return np.bincount(data.group, minlength=k).astype(np.float64)
        if self.kind == "sum":
            return np.bincount(data.group, weights=data.amount, minlength=k).astype(np.float64)
        pairs = np.unique(data.unit * k + data.group)
        return np.bincount(pairs % k, minlength=k).astype(np.float64)


QUERIES = tuple(
    Query(aggregate, kind, grouped)
    for grouped in (False, True)
    for aggregate, kind in (
        ("COUNT(*)", "rows"),
        ("SUM(amount)", "sum"),
        ("COUNT(DISTINCT user_id)", "units"),
    )
)


# -- routes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """A route's answer to one query: the released value per output (None: refused, with the
    reason), the bounds it ran with (L0, C, R), and amount's clamps where the query clamps it."""

    values: tuple[float, ...] | None
    bounds: dict[str, int]
    refused: str | None = None
    clamps: tuple[float, float] | None = None


class Route(Protocol):
    name: str

    def prepare(
        self, datasets: Sequence[DataSet], queries: Sequence[Query], epsilons: Sequence[str]
    ) -> None:
        """Called once per generator with its data sets, before any ``release``."""

    def release(self, data: DataSet, query: Query, epsilon: str) -> Release:
        """The released value of each of the query's outputs at ``epsilon``."""


def _policy(data: DataSet, bounds: dict[str, int], clamps: bool = True) -> Policy:
    """A policy over the data set's file, with these contribution bounds (none: {}), and
    amount's clamps [0, 100] declared (``clamps``) or left undeclared."""
    amount = {"lower": LOWER, "upper": UPPER} if clamps else {}
    return load_policy(
        {
            "dataset": {"id": f"bounds-{data.generator.name}-{data.seed}", "data_version": "1"},
            "data": {"tables": {"visits": str(data.path)}},
            "budget": {
                "epsilon": BUDGET,
                "delta": "0.000001",
                "query_epsilon": "1",
                "query_delta": "0.00000001",
                "diagnose": False,
            },
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    **bounds,
                    "columns": {
                        "amount": amount,
                        "grp": {"public_values": list(GROUPS)},
                    },
                }
            },
        },
        base_dir=data.folder,
    )


def _released(result: Result, query: Query) -> Release:
    plan = result.plan
    assert plan is not None
    bounds = {"L0": plan.max_groups, "C": plan.max_rows}
    if plan.options.max_rows_per_unit is not None:
        bounds["R"] = plan.options.max_rows_per_unit
    clamp = plan.analysis.bounds.get("amount")  # the clamps the answer ran with, if any
    clamps = None if clamp is None else (float(clamp[0]), float(clamp[1]))
    if not query.grouped:
        value = result.rows[0][0]
        return Release((math.nan if value is None else float(value),), bounds, clamps=clamps)
    by_key = {r[0]: r[1] for r in result.rows}
    values = tuple(math.nan if by_key.get(g) is None else float(by_key[g]) for g in GROUPS)
    return Release(values, bounds, clamps=clamps)


def _fresh_session(
    policy: Policy, first: Sequence[tuple[str, str | None]], query: Query, epsilon: str
) -> Release:
    """A new ``Session`` with ``SET dpsql.fresh = on``, the statements ``first`` (each at its
    epsilon, or the session's), then the query at ``epsilon``; a refusal is the release."""
    s = Session(policy)
    try:
        s.execute("SET dpsql.fresh = on")
        for statement, at in first:
            s.execute(statement, epsilon=at)
        return _released(s.execute(query.sql, epsilon=epsilon), query)
    except DpsqlError as e:
        return Release(None, {}, f"{type(e).__name__}: {e}")
    finally:
        s.close()


class EstimateBounds:
    """dpsql with no contribution bounds in the policy: ESTIMATE BOUNDS, then the query; at
    the 95% quantile (``estimate_bounds``, the rule before the trade-off) or by the trade-off
    for the query's epsilon (``estimate_tradeoff``, ``FOR EPSILON``)."""

    def __init__(self, share: Decimal, tradeoff: bool = False) -> None:
        self.share = share
        self.tradeoff = tradeoff
        self.name = "estimate_tradeoff" if tradeoff else "estimate_bounds"

    def prepare(
        self, datasets: Sequence[DataSet], queries: Sequence[Query], epsilons: Sequence[str]
    ) -> None:
        pass

    def release(self, data: DataSet, query: Query, epsilon: str) -> Release:
        statement = "ESTIMATE BOUNDS FOR visits" + (" GROUP BY grp" if query.grouped else "")
        statement += f" FOR EPSILON {epsilon}" if self.tradeoff else " AT QUANTILE 0.95"
        first = (statement, str(Decimal(epsilon) * self.share))
        return _fresh_session(_policy(data, {}), [first], query, epsilon)


def example_bounds() -> dict[str, int]:
    """The contribution bounds examples/policy.toml declares for its table."""
    table = tomllib.loads(EXAMPLE_POLICY.read_text())["tables"]["visits"]
    names = ("max_groups_per_unit", "max_rows_per_unit_per_group", "max_rows_per_unit")
    return {k: int(table[k]) for k in names if k in table}


class ExamplePolicy:
    """The example policy's fixed contribution bounds, declared for the generated table."""

    name = "example_policy"

    def __init__(self) -> None:
        self.bounds = example_bounds()

    def prepare(
        self, datasets: Sequence[DataSet], queries: Sequence[Query], epsilons: Sequence[str]
    ) -> None:
        pass

    def release(self, data: DataSet, query: Query, epsilon: str) -> Release:
        s = data.sessions.get(self.name)
        if s is None:
            s = data.sessions[self.name] = Session(_policy(data, self.bounds))
            s.execute("SET dpsql.fresh = on")
        try:
            return _released(s.execute(query.sql, epsilon=epsilon), query)
        except DpsqlError as e:
            return Release(None, {}, f"{type(e).__name__}: {e}")


class Auto:
    """dpsql choosing the query's bounds privately inside its epsilon (``dpsql.bounds =
    auto``): no contribution bounds in the policy and, with ``clamps``, amount's clamps left
    undeclared too (then only the SUM queries run: nothing else aggregates amount)."""

    def __init__(self, clamps: bool) -> None:
        self.clamps = clamps
        self.name = "auto_clamps" if clamps else "auto"

    def prepare(
        self, datasets: Sequence[DataSet], queries: Sequence[Query], epsilons: Sequence[str]
    ) -> None:
        pass

    def applies(self, query: Query) -> bool:
        return query.kind == "sum" or not self.clamps

    def release(self, data: DataSet, query: Query, epsilon: str) -> Release:
        first = [("SET dpsql.bounds = auto", None)]
        return _fresh_session(_policy(data, {}, clamps=not self.clamps), first, query, epsilon)


@dataclass(frozen=True)
class Candidates:
    """The oracle's candidate bounds for one query on one data set: their bounds, L1
    sensitivity (value units) and the exact bounded totals, one row per candidate."""

    bounds: tuple[dict[str, int], ...]
    sensitivity: FloatArray  # (candidates,)
    bounded: FloatArray  # (candidates, outputs)


def _label(bounds: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in bounds.items()) or "none"


def _ranks(owner: IntArray, rng: np.random.Generator) -> IntArray:
    """Each item's rank, uniformly random, among the items of its owner (owners sorted)."""
    order = np.lexsort((rng.random(len(owner)), owner))
    counts = np.bincount(owner)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    ranks = np.empty(len(owner), dtype=np.int64)
    ranks[order] = np.arange(len(owner)) - starts
    return ranks


def candidates(data: DataSet) -> dict[Query, Candidates]:
    """The candidates of every query on ``data``: R for the totals, (L0, C) grouped."""
    rng = np.random.default_rng([data.seed, data.generator.number, 1])
    k = len(GROUPS)
    out: dict[Query, Candidates] = {}
    # Totals under R alone (C = R, L0 = 1): a random R of each unit's rows.
    rank = _ranks(data.unit, rng)
    sums = np.cumsum(np.bincount(rank, weights=data.amount))
    counts = np.cumsum(np.bincount(rank))
    at = np.minimum(np.array(POWERS), len(sums)) - 1
    rs = tuple({"R": r} for r in POWERS)
    powers = np.array(POWERS, dtype=np.float64)
    by = {q.kind: q for q in QUERIES if not q.grouped}
    out[by["rows"]] = Candidates(rs, powers, counts[at].astype(np.float64)[:, None])
    out[by["sum"]] = Candidates(rs, UPPER * powers, sums[at][:, None])
    units = float(len(np.unique(data.unit)))
    out[by["units"]] = Candidates(({},), np.array([1.0]), np.array([[units]]))
    # Grouped under (L0, C): a random L0 of each unit's groups, min(n, C) rows, sums scaled.
    pairs, inverse, n = np.unique(data.unit * k + data.group, return_inverse=True,
                                  return_counts=True)  # fmt: skip
    s = np.bincount(inverse, weights=data.amount)
    owner, group = pairs // k, pairs % k
    group_rank = _ranks(owner, rng)
    l0s = [min(l0, k) for l0 in POWERS]  # L0 is capped by the public groups
    grid_count = np.empty((len(POWERS), len(POWERS), k))
    grid_sum = np.empty_like(grid_count)
    grid_units = np.empty((len(POWERS), k))
    for i, l0 in enumerate(l0s):
        if i and l0 == l0s[i - 1]:  # L0 >= 8 keeps every group, as L0 = 8 does
            grid_count[i] = grid_count[i - 1]
            grid_sum[i] = grid_sum[i - 1]
            grid_units[i] = grid_units[i - 1]
            continue
        keep = group_rank < l0
        g, nk, sk = group[keep], n[keep], s[keep]
        grid_units[i] = np.bincount(g, minlength=k)
        for j, c in enumerate(POWERS):
            grid_count[i, j] = np.bincount(g, weights=np.minimum(nk, c), minlength=k)
            scaled = np.where(nk <= c, sk, sk * c / nk)
            grid_sum[i, j] = np.bincount(g, weights=scaled, minlength=k)
    by = {q.kind: q for q in QUERIES if q.grouped}
    lc = tuple({"L0": a, "C": c} for a in POWERS for c in POWERS)
    rows = np.array([min(a, k) * c for a in POWERS for c in POWERS], dtype=np.float64)
    size = len(POWERS) ** 2
    out[by["rows"]] = Candidates(lc, rows, grid_count.reshape(size, k))
    out[by["sum"]] = Candidates(lc, UPPER * rows, grid_sum.reshape(size, k))
    l0_only = tuple({"L0": a} for a in POWERS)
    out[by["units"]] = Candidates(l0_only, np.array(l0s, dtype=np.float64), grid_units)
    return out


def discrete_laplace(scale: float, size: int, rng: np.random.Generator) -> FloatArray:
    """P(x) proportional to exp(-|x| / scale) on the integers: the difference of two geometric
    variables of p = 1 - exp(-1/scale)."""
    p = -math.expm1(-1.0 / scale)
    return (rng.geometric(p, size) - rng.geometric(p, size)).astype(np.float64)


def _micro(epsilon: str) -> int:
    """Epsilon in millionths, for a seed."""
    return int(Decimal(epsilon) * 10**6)


@dataclass
class Choice:
    index: int
    bounds: dict[str, int]
    objective: dict[str, float]  # the selection metric of every candidate, by its label


class Oracle:
    """The bound of least error per (generator, query, epsilon), knowing the data."""

    name = "oracle"

    def __init__(self, draws: int) -> None:
        self.draws = draws
        self.choices: dict[tuple[str, Query, str], Choice] = {}

    @staticmethod
    def _candidates(data: DataSet) -> dict[Query, Candidates]:
        if "oracle" not in data.kept:
            data.kept["oracle"] = candidates(data)
        found: dict[Query, Candidates] = data.kept["oracle"]
        return found

    def prepare(
        self, datasets: Sequence[DataSet], queries: Sequence[Query], epsilons: Sequence[str]
    ) -> None:
        generator = datasets[0].generator
        for qi, query in enumerate(queries):
            grids = [self._candidates(d)[query] for d in datasets]
            truth = np.stack([query.truth(d) for d in datasets])  # (seeds, outputs)
            bounded = np.stack([g.bounded for g in grids])  # (seeds, candidates, outputs)
            seeds, outputs = truth.shape
            denominator = np.maximum(truth, 1.0)[:, None, :]
            for epsilon in epsilons:
                rng = np.random.default_rng(
                    [generator.number, qi, _micro(epsilon), datasets[0].seed, 2]
                )
                z = rng.laplace(size=(seeds, self.draws, outputs))
                objective = np.empty(len(grids[0].bounds))
                for c in range(len(objective)):
                    scale = grids[0].sensitivity[c] / float(epsilon)
                    bias = (bounded[:, c, :] - truth)[:, None, :]
                    error = np.abs(bias + scale * z) / denominator
                    per_output = np.median(error.reshape(seeds * self.draws, outputs), axis=0)
                    objective[c] = float(np.median(per_output))
                best = int(np.argmin(objective))  # the first of equals: the smallest bound
                self.choices[(generator.name, query, epsilon)] = Choice(
                    best,
                    grids[0].bounds[best],
                    {_label(b): float(v) for b, v in zip(grids[0].bounds, objective, strict=True)},
                )

    def release(self, data: DataSet, query: Query, epsilon: str) -> Release:
        choice = self.choices[(data.generator.name, query, epsilon)]
        grid = self._candidates(data)[query]
        scale = float(grid.sensitivity[choice.index]) / float(epsilon)
        rng = np.random.default_rng(
            [data.seed, data.generator.number, QUERIES.index(query), _micro(epsilon), 3]
        )
        exact = grid.bounded[choice.index]
        if query.kind == "sum":
            noise = rng.laplace(scale=scale, size=len(exact))
        else:
            noise = discrete_laplace(scale, len(exact), rng)
        return Release(tuple(float(v) for v in exact + noise), dict(choice.bounds))


class Simulated:
    """A simulated candidate mechanism of ``bounds_routes`` (numpy; not a dpsql feature): the
    oracle's exact bounded totals, the bound chosen privately at a share of epsilon."""

    def __init__(self, mechanism: Mechanism) -> None:
        self.mechanism = mechanism
        self.name = mechanism.name

    def prepare(
        self, datasets: Sequence[DataSet], queries: Sequence[Query], epsilons: Sequence[str]
    ) -> None:
        pass

    def applies(self, query: Query) -> bool:
        return self.mechanism.applies(query.kind, query.grouped)

    def release(self, data: DataSet, query: Query, epsilon: str) -> Release:
        if "sim" not in data.kept:
            data.kept["sim"] = stats(data.unit, data.group, data.amount)
        bounded = Oracle._candidates(data)[query].bounded
        if query.grouped and query.kind == "units":
            bounded = bounded[3:4]  # L0 = 8
        elif query.grouped:
            bounded = bounded[3 * len(POWERS) : 4 * len(POWERS)]  # L0 = 8, C on the ladder
        rng = np.random.default_rng(
            [data.seed, data.generator.number, QUERIES.index(query), _micro(epsilon), 4,
             self.mechanism.seed()]
        )  # fmt: skip
        values, bounds = self.mechanism.answer(
            data.kept["sim"], query.kind, bounded, float(epsilon), rng
        )
        return Release(tuple(float(v) for v in values), bounds)


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Cell:
    """One route's answers to one (generator, query, epsilon): relative errors per seed and
    output (NaN where refused), the bounds per seed (and amount's clamps), the refusals."""

    errors: list[FloatArray] = field(default_factory=list)
    bounds: list[dict[str, int]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    clamps: list[tuple[float, float]] = field(default_factory=list)

    def per_output(self) -> list[float]:
        stacked = np.stack(self.errors)  # (seeds, outputs)
        out = []
        for col in stacked.T:
            known = col[~np.isnan(col)]
            out.append(float(np.median(known)) if len(known) else math.nan)
        return out

    def error(self) -> float:
        known = [e for e in self.per_output() if not math.isnan(e)]
        return statistics.median(known) if known else math.nan

    def median_bounds(self) -> dict[str, float]:
        names = [n for n in ("L0", "C", "R") if any(n in b for b in self.bounds)]
        return {n: float(statistics.median([b[n] for b in self.bounds if n in b])) for n in names}

    def median_clamps(self) -> tuple[float, float] | None:
        """The median over the seeds of amount's lower and of its upper clamp (None: none)."""
        if not self.clamps:
            return None
        lows, highs = zip(*self.clamps, strict=True)
        return float(statistics.median(lows)), float(statistics.median(highs))


def shown_bounds(
    query: Query,
    bounds: dict[str, float],
    oracle: bool,
    clamps: tuple[float, float] | None = None,
) -> str:
    """The bounds that can change the query's answer, as ``L0=2, C=10`` (and amount's clamps
    where given, as ``amount in [0.875, 112]``)."""
    if not bounds:
        return "none"
    if not query.grouped:
        names = ["R"] if "R" in bounds else ["C"]
        if query.kind == "units":
            return "none" if oracle else "(none binds)"
    else:
        names = ["L0", "C", "R"] if query.kind != "units" else ["L0"]
    text = ", ".join(f"{n}={bounds[n]:g}" for n in names if n in bounds)
    if clamps is not None:
        text += f", amount in [{clamps[0]:g}, {clamps[1]:g}]"
    return text


def _answers(route: Route, query: Query) -> bool:
    """Whether the route answers the query (a simulated route or ``auto_clamps`` some only)."""
    return not isinstance(route, Simulated | Auto) or route.applies(query)


def run_generator(
    generator: Generator,
    seeds: Sequence[int],
    epsilons: Sequence[str],
    routes: Sequence[Route],
    folder: Path,
) -> tuple[dict[tuple[Query, str, str], Cell], list[int]]:
    datasets = []
    for seed in seeds:
        unit, group, amount = generator.draw(seed)
        datasets.append(DataSet(generator, seed, folder, unit, group, amount))
    cells: dict[tuple[Query, str, str], Cell] = {}
    for route in routes:
        route.prepare(datasets, QUERIES, epsilons)
    for data in datasets:
        truths = {q: q.truth(data) for q in QUERIES}
        for epsilon in epsilons:
            for query in QUERIES:
                truth = truths[query]
                for route in routes:
                    if not _answers(route, query):
                        continue
                    cell = cells.setdefault((query, epsilon, route.name), Cell())
                    released = route.release(data, query, epsilon)
                    if released.values is None:
                        cell.errors.append(np.full(len(truth), math.nan))
                        cell.refused.append(released.refused or "refused")
                        continue
                    values = np.array(released.values)
                    if np.isnan(values).any():  # an output released as NULL: a miss
                        cell.refused.append("an output without a value")
                    cell.errors.append(np.abs(values - truth) / np.maximum(truth, 1.0))
                    cell.bounds.append(released.bounds)
                    if released.clamps is not None:
                        cell.clamps.append(released.clamps)
        data.close()
    return cells, [d.rows for d in datasets]


def table(
    generator: Generator,
    epsilon: str,
    cells: dict[tuple[Query, str, str], Cell],
    routes: Sequence[Route],
    oracle: Oracle,
) -> list[str]:
    others = [r for r in routes if r.name != "oracle" and not isinstance(r, Simulated)]
    head = ["query", "oracle", "oracle's bounds"]
    for r in others:
        head += [r.name, "÷ oracle", f"{r.name} bounds"]
        if isinstance(r, Auto):
            head.append(f"{r.name} targets")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for query in QUERIES:
        best = cells[(query, epsilon, "oracle")].error()
        choice = oracle.choices[(generator.name, query, epsilon)]
        row = [query.name, f"{best:.3g}", shown_bounds(query, dict(choice.bounds), True)]
        for r in others:
            cell = cells.get((query, epsilon, r.name))
            if cell is None:  # a query the route does not answer
                row += ["", "", ""] + ([""] if isinstance(r, Auto) else [])
                continue
            err = cell.error()
            text = f"{err:.3g}"
            if cell.refused:
                text += f" ({len(cell.refused)}/{len(cell.errors)} refused)"
            ratio = f"{err / best:.2f}x" if best > 0 else "-"  # an exact oracle: no ratio
            clamps = cell.median_clamps() if isinstance(r, Auto) and r.clamps else None
            row += [text, ratio, shown_bounds(query, cell.median_bounds(), False, clamps)]
            if isinstance(r, Auto):
                row.append(checked(missed(cells, query, epsilon, r.name)))
        lines.append("| " + " | ".join(row) + " |")
    return lines


Cells = dict[tuple[Query, str, str], Cell]
COMPARED = ("estimate_bounds", "example_policy")  # an auto route is to be no worse than these


def oracle_factor(epsilon: str) -> int:
    """The target on an auto route's error over the oracle's: 2x at epsilon 0.5 and above, 4x
    below (epsilon 0.1)."""
    return 2 if Decimal(epsilon) >= Decimal("0.5") else 4


def missed(cells: Cells, query: Query, epsilon: str, name: str) -> list[str]:
    """The targets route ``name`` misses on the cell: its median error at most
    ``oracle_factor`` times the oracle's, and at most each of ``COMPARED``'s (where they ran).
    A NaN error (every answer refused) misses each."""
    err = cells[(query, epsilon, name)].error()
    best = cells[(query, epsilon, "oracle")].error()
    factor = oracle_factor(epsilon)
    out = [] if err <= factor * best else [f">{factor}x oracle"]
    for other in COMPARED:
        if (query, epsilon, other) in cells and not err <= cells[(query, epsilon, other)].error():
            out.append(f">{other}")
    return out


def checked(misses: list[str]) -> str:
    return "miss: " + ", ".join(misses) if misses else "ok"


def targets_table(
    runs: dict[str, Cells], autos: Sequence[Auto], epsilons: Sequence[str]
) -> list[str]:
    """Per auto route, generator and query, per epsilon: the route's error ÷ the oracle's,
    ÷ estimate_bounds's and ÷ example_policy's (where they ran), and the targets missed."""
    ran = {n for cells in runs.values() for (_, _, n) in cells}
    compared = [c for c in COMPARED if c in ran]
    what = "÷ oracle" + "".join(f" / ÷ {c}" for c in compared)
    head = ["route", "generator", "query"] + [f"ε={e}: {what}" for e in epsilons]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for auto in autos:
        for name, cells in runs.items():
            for query in QUERIES:
                if (query, epsilons[0], auto.name) not in cells:
                    continue
                row = [auto.name, name, query.name]
                for e in epsilons:
                    err = cells[(query, e, auto.name)].error()
                    ratios = [_ratio(cells, query, e, auto.name)]
                    for c in compared:
                        other = cells[(query, e, c)].error()
                        ratios.append(err / other if other > 0 else math.nan)
                    shown = " / ".join("-" if math.isnan(r) else f"{r:.2f}x" for r in ratios)
                    row.append(f"{shown} {checked(missed(cells, query, e, auto.name))}")
                lines.append("| " + " | ".join(row) + " |")
    return lines


def _ratio(cells: Cells, query: Query, epsilon: str, name: str) -> float:
    best = cells[(query, epsilon, "oracle")].error()
    return cells[(query, epsilon, name)].error() / best if best > 0 else math.nan


def pick_variants(runs: dict[str, Cells], simulated: Sequence[Simulated]) -> dict[str, Simulated]:
    """Per candidate route, its variant of the least geometric mean ratio to the oracle over
    every cell of the run it answers (one setting per route, not one per cell)."""
    scores: dict[str, list[tuple[float, Simulated]]] = {}
    for sim in simulated:
        ratios = [
            _ratio(cells, q, e, sim.name) for cells in runs.values() for (q, e, n) in cells
            if n == sim.name
        ]  # fmt: skip
        scores.setdefault(sim.mechanism.route, []).append((geometric_mean(ratios), sim))
    return {route: min(found, key=lambda x: x[0])[1] for route, found in scores.items()}


def simulated_table(
    generator: Generator, epsilon: str, cells: Cells, chosen: dict[str, Simulated], oracle: Oracle
) -> list[str]:
    head = ["query", "oracle", "oracle's bounds"]
    for route in chosen:
        head += [route, "÷ oracle", "bounds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for query in QUERIES:
        best = cells[(query, epsilon, "oracle")].error()
        choice = oracle.choices[(generator.name, query, epsilon)]
        row = [query.name, f"{best:.3g}", shown_bounds(query, dict(choice.bounds), True)]
        for sim in chosen.values():
            cell = cells.get((query, epsilon, sim.name))
            if cell is None:
                row += ["", "", ""]
                continue
            ratio = _ratio(cells, query, epsilon, sim.name)
            shown = shown_bounds(query, cell.median_bounds(), True)
            if query.kind == "units":
                shown += " (all_groups)"
            row += [f"{cell.error():.3g}", f"{ratio:.2f}x", shown]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def variants_table(
    runs: dict[str, Cells], simulated: Sequence[Simulated], epsilons: Sequence[str]
) -> list[str]:
    """Every variant's ratio to the oracle, the geometric mean over the generators, per (query,
    epsilon); the last column over every cell (the figure a route's variant is picked by)."""
    queries = [q for q in QUERIES if q.kind != "units"]
    head = ["variant"] + [f"{q.name} ε={e}" for q in queries for e in epsilons] + ["all"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for sim in simulated:
        row, every = [sim.name], []
        for q in queries:
            for e in epsilons:
                ratios = [_ratio(c, q, e, sim.name) for c in runs.values() if (q, e, sim.name) in c]
                every += ratios
                row.append(f"{geometric_mean(ratios):.2f}" if ratios else "")
        row.append(f"{geometric_mean(every):.2f}")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50, help="data sets per generator")
    parser.add_argument("--seed", type=int, default=0, help="the first data set's seed")
    parser.add_argument("--epsilons", nargs="+", default=list(EPSILONS))
    parser.add_argument("--generators", nargs="+", choices=list(GENERATORS),
                        default=list(GENERATORS))  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="5 seeds, epsilon 1")
    parser.add_argument("--estimate-share", type=Decimal, default=Decimal("0.1"),
                        help="ESTIMATE BOUNDS's epsilon, a share of the query's")  # fmt: skip
    parser.add_argument("--draws", type=int, default=100, help="the oracle's noises per seed")
    names = ["estimate_bounds", "estimate_tradeoff", "example_policy", "auto", "auto_clamps",
             *ROUTES]  # fmt: skip
    parser.add_argument("--routes", nargs="+", choices=names, default=names,
                        help="the routes beside the oracle (simulated: " + ", ".join(ROUTES)
                        + ")")  # fmt: skip
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    args = parser.parse_args()
    seeds = 5 if args.quick else args.seeds
    epsilons = list(QUICK_EPSILONS) if args.quick else [str(Decimal(e)) for e in args.epsilons]
    started = dt.datetime.now(dt.UTC)
    start = time.perf_counter()
    oracle = Oracle(args.draws)
    routes: list[Route] = [oracle]
    if "estimate_bounds" in args.routes:
        routes.append(EstimateBounds(args.estimate_share))
    if "estimate_tradeoff" in args.routes:
        routes.append(EstimateBounds(args.estimate_share, tradeoff=True))
    if "example_policy" in args.routes:
        routes.append(ExamplePolicy())
    autos = [Auto(clamps) for clamps in (False, True) if Auto(clamps).name in args.routes]
    routes += autos
    simulated = [Simulated(m) for m in MECHANISMS if m.route in args.routes]
    routes += simulated
    runs: dict[str, Cells] = {}
    dpsql_routes = any(not isinstance(r, Simulated) for r in routes[1:])
    print(
        f"{seeds} seeds from {args.seed}, epsilons {', '.join(epsilons)}, "
        f"ESTIMATE BOUNDS at {args.estimate_share} of epsilon, example bounds {example_bounds()}"
    )
    results: list[dict[str, Any]] = []
    rows_per_set: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.generators:
            generator = GENERATORS[name]
            began = time.perf_counter()
            cells, rows = run_generator(
                generator, range(args.seed, args.seed + seeds), epsilons, routes, Path(tmp)
            )
            rows_per_set[name] = rows
            runs[name] = cells
            seconds = time.perf_counter() - began
            for epsilon in epsilons:
                if dpsql_routes:
                    print(
                        f"\n### {name} ({generator.about}), epsilon {epsilon}\n\n"
                        f"{seeds} data sets of {min(rows):,} to {max(rows):,} rows (median "
                        f"{statistics.median(rows):,.0f}); {seconds:.0f} s for the generator\n"
                    )
                    print("\n".join(table(generator, epsilon, cells, routes, oracle)))
                for query in QUERIES:
                    choice = oracle.choices[(name, query, epsilon)]
                    entry: dict[str, Any] = {
                        "generator": name,
                        "epsilon": epsilon,
                        "query": query.name,
                        "sql": query.sql,
                        "oracle_bounds": choice.bounds,
                        "oracle_objective": choice.objective,
                    }
                    best = cells[(query, epsilon, "oracle")].error()
                    for route in routes:
                        if (query, epsilon, route.name) not in cells:
                            continue
                        cell = cells[(query, epsilon, route.name)]
                        entry[route.name] = {
                            "error": cell.error(),
                            "ratio": cell.error() / best if best > 0 else math.nan,
                            "per_output": cell.per_output(),
                            "bounds": cell.median_bounds(),
                            "refused": len(cell.refused),
                            "messages": sorted(set(cell.refused)),
                        }
                        if isinstance(route, Auto):
                            entry[route.name]["clamps"] = cell.median_clamps()
                            entry[route.name]["missed"] = missed(cells, query, epsilon, route.name)
                    results.append(entry)
    if autos:
        print(
            "\n## Targets of the auto routes\n\nPer epsilon the route's median error ÷ the "
            "oracle's and the other routes' (\"-\": theirs is 0); the targets: at most "
            "2x the oracle at epsilon >= 0.5, 4x below, and at most each other route's.\n"
        )
        print("\n".join(targets_table(runs, autos, epsilons)))
    chosen = pick_variants(runs, simulated)
    if simulated:
        print("\n## Candidate selection mechanisms (simulated: numpy, not dpsql features)")
        print("\nEach variant's error ÷ the oracle's (geometric mean over the generators):\n")
        print("\n".join(variants_table(runs, simulated, epsilons)))
        print("\nPer route the variant of the least 'all': " + ", ".join(
            s.name for s in chosen.values()))  # fmt: skip
        for name, cells in runs.items():
            for epsilon in epsilons:
                print(f"\n**{name}, epsilon {epsilon}**\n")
                print("\n".join(simulated_table(GENERATORS[name], epsilon, cells, chosen, oracle)))
    elapsed = time.perf_counter() - start
    print(f"\n({elapsed:.0f} s)")
    write_results(
        args.results_dir,
        "bounds",
        started,
        seeds,
        results,
        seed=args.seed,
        epsilons=epsilons,
        generators={n: GENERATORS[n].about for n in args.generators},
        rows_per_data_set=rows_per_set,
        estimate_share=str(args.estimate_share),
        oracle_draws=args.draws,
        example_bounds=example_bounds(),
        seconds=round(elapsed, 1),
        routes=[r.name for r in routes],
        simulated_chosen={route: s.name for route, s in chosen.items()},
    )


if __name__ == "__main__":
    main()
