"""TPC-H queries through two peers, Qrlew and SmartNoise SQL, beside the true answer.

Runs in a separate environment that holds the peers (they pin versions of numpy and
SQLAlchemy that dpsql's environment does not share); it does not import dpsql:

    python3 -m venv /tmp/peers-venv
    /tmp/peers-venv/bin/pip install pyqrlew==0.9.27 smartnoise-sql==1.0.10 duckdb pandas \
        'pyarrow<18'
    /tmp/peers-venv/bin/python benchmarks/tpch_peers.py             # Q1, Q6, Q13, Q14, 20 runs
    /tmp/peers-venv/bin/python benchmarks/tpch_peers.py --queries 4 5 7 8 9 12 19 --runs 5 \
        --out benchmarks/results/tpch_peers_more_sf1.json        # the TPC-H texts as written

Both peers run offline on the Parquet files that `tpch.py` wrote, each executing its rewritten
SQL on DuckDB (the engine dpsql and the raw query use):

* **Qrlew** (`pyqrlew`) rewrites a query into a differentially private one
  (`Relation.rewrite_with_differential_privacy`) from a `Dataset` that holds the schema (read
  from a SQLite copy of 50 rows of each table: only the types are taken), the policy's value
  bounds (`with_range`) and public values (`with_possible_values`), and the privacy unit as
  foreign-key paths (lineitem -> orders -> customer), the same paths as dpsql's policy. Its
  rewritten text, printed for PostgreSQL, runs on DuckDB on the Parquet files.
* **SmartNoise SQL** (`snsql`) takes one table per query with the unit's column on it: it
  cannot follow a foreign key, so lineitem is denormalised with `o_custkey` (and, for Q14,
  `p_type`), and Q13 reads customer LEFT JOIN orders written out as one table. It refuses
  aggregates over expressions, so the denormalised table carries the products Q1, Q6 and Q14
  sum, with the bounds that follow from the policy's. Its rewritten text runs on DuckDB through
  its PostgreSQL reader; its per-unit reservoir (`ROW_NUMBER() OVER (PARTITION BY unit ORDER
  BY RANDOM())`), which DuckDB refuses (a volatile window order), is ordered by a hash of the
  row salted afresh per answer instead.

Each peer is first given the TPC-H text (`benchmarks/tpch/qNN.sql`); its refusal is recorded
and the adapted text below is run. The true answer is the TPC-H text on raw DuckDB. Errors:
the median, over the runs, the groups both sides have and every aggregate, of |answer - true|
/ |true|, as in `tpch.py`. Times: one answer end to end (rewrite and execution), median over
the runs; the setup (schema, denormalised tables) is timed apart.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import random
import re
import statistics
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import duckdb

try:  # the peers' environment only
    import pyqrlew
    import snsql
    import sqlalchemy
except ImportError:  # pragma: no cover - dpsql's environment imports this module in a test
    pyqrlew = snsql = sqlalchemy = None

HERE = Path(__file__).resolve().parent
TEXTS = HERE / "tpch"
EPSILON, DELTA = 1.0, 1e-8  # dpsql's query_epsilon and query_delta in tpch.py's policy

# dpsql's contract per query (tpch.py): L0 (groups per customer) and C (rows per customer and
# group); SmartNoise has one limit, rows per unit in the table: L0 * C. Q1, Q6, Q13 and Q14 have
# texts adapted to each peer below; the other queries dpsql answers as written (Q5, Q7, Q8,
# Q9, Q12, Q19) or with keys first and no subquery in WHERE (Q4) are given to each peer as
# TPC-H writes them, and to Qrlew also with their dates folded (``folded``).
CONTRACT = {
    1: (4, 64), 4: (4, 4), 5: (1, 4), 6: (4, 4), 7: (4, 4), 8: (4, 4), 9: (4, 4), 12: (2, 4),
    13: (1, 1), 14: (4, 4), 19: (4, 1),
}  # fmt: skip
N_KEYS = {1: 2, 4: 1, 5: 1, 6: 0, 7: 3, 8: 1, 9: 2, 12: 1, 13: 1, 14: 0, 19: 0}
ALL_TABLES = ["customer", "orders", "lineitem", "part", "supplier", "partsupp", "nation", "region"]

# The policy's value bounds (tpch.py's policy_dict) and the bounds of the products SmartNoise
# needs as columns, which follow from them.
BOUNDS = {
    "l_quantity": (0, 50),
    "l_extendedprice": (0, 105000),
    "l_discount": (0, 0.1),
    "l_tax": (0, 0.08),
}
DERIVED = {
    "l_rev": ("l_extendedprice * l_discount", (0, 10500)),
    "l_disc_price": ("l_extendedprice * (1 - l_discount)", (0, 105000)),
    "l_charge": ("l_extendedprice * (1 - l_discount) * (1 + l_tax)", (0, 113400)),
    "l_promo": (
        "CASE WHEN p_type LIKE 'PROMO%' THEN l_extendedprice * (1 - l_discount) ELSE 0 END",
        (0, 105000),
    ),
}
PUBLIC_VALUES = {"l_returnflag": ["A", "N", "R"], "l_linestatus": ["F", "O"]}

# Adapted texts. Qrlew: the TPC-H text with its date arithmetic folded (it refuses INTERVAL).
QRLEW = {
    1: """SELECT l_returnflag, l_linestatus, SUM(l_quantity) AS sum_qty,
       SUM(l_extendedprice) AS sum_base_price,
       SUM(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
       SUM(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
       AVG(l_quantity) AS avg_qty, AVG(l_extendedprice) AS avg_price,
       AVG(l_discount) AS avg_disc, COUNT(*) AS count_order
FROM lineitem WHERE l_shipdate <= '1998-09-02'
GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus""",
    6: """SELECT SUM(l_extendedprice * l_discount) AS revenue FROM lineitem
WHERE l_shipdate >= '1994-01-01' AND l_shipdate < '1995-01-01'
  AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24""",
    13: None,  # the TPC-H text
    14: """SELECT 100.00 * SUM(CASE WHEN p_type LIKE 'PROMO%'
                         THEN l_extendedprice * (1 - l_discount) ELSE 0 END)
       / SUM(l_extendedprice * (1 - l_discount)) AS promo_revenue
FROM lineitem JOIN part ON l_partkey = p_partkey
WHERE l_shipdate >= '1995-09-01' AND l_shipdate < '1995-10-01'""",
}
# Qrlew fails on each comma join tried ("InvalidPath": a column of the WHERE), but answers
# explicit joins: the texts above as TPC-H writes them with JOIN ... ON along the keys, dates
# folded, and Q4's EXISTS as a SEMI JOIN (as dpsql's adapted Q4).
QRLEW_JOINS = {
    4: """SELECT o_orderpriority, COUNT(*) AS order_count
FROM orders SEMI JOIN lineitem ON l_orderkey = o_orderkey AND l_commitdate < l_receiptdate
WHERE o_orderdate >= '1993-07-01' AND o_orderdate < '1993-10-01'
GROUP BY o_orderpriority
ORDER BY o_orderpriority""",
    5: """SELECT n_name, SUM(l_extendedprice * (1 - l_discount)) AS revenue
FROM lineitem JOIN orders ON l_orderkey = o_orderkey JOIN customer ON o_custkey = c_custkey
JOIN supplier ON l_suppkey = s_suppkey AND c_nationkey = s_nationkey
JOIN nation ON s_nationkey = n_nationkey JOIN region ON n_regionkey = r_regionkey
WHERE r_name = 'ASIA' AND o_orderdate >= '1994-01-01' AND o_orderdate < '1995-01-01'
GROUP BY n_name
ORDER BY revenue DESC""",
    7: """SELECT supp_nation, cust_nation, l_year, SUM(volume) AS revenue
FROM (SELECT n1.n_name AS supp_nation, n2.n_name AS cust_nation,
             EXTRACT(year FROM l_shipdate) AS l_year,
             l_extendedprice * (1 - l_discount) AS volume
      FROM lineitem JOIN orders ON o_orderkey = l_orderkey
      JOIN customer ON c_custkey = o_custkey JOIN supplier ON s_suppkey = l_suppkey
      JOIN nation n1 ON s_nationkey = n1.n_nationkey
      JOIN nation n2 ON c_nationkey = n2.n_nationkey
      WHERE ((n1.n_name = 'FRANCE' AND n2.n_name = 'GERMANY')
          OR (n1.n_name = 'GERMANY' AND n2.n_name = 'FRANCE'))
        AND l_shipdate BETWEEN '1995-01-01' AND '1996-12-31') AS shipping
GROUP BY supp_nation, cust_nation, l_year
ORDER BY supp_nation, cust_nation, l_year""",
    8: """SELECT o_year, SUM(CASE WHEN nation = 'BRAZIL' THEN volume ELSE 0 END) / SUM(volume)
         AS mkt_share
FROM (SELECT EXTRACT(year FROM o_orderdate) AS o_year,
             l_extendedprice * (1 - l_discount) AS volume, n2.n_name AS nation
      FROM lineitem JOIN orders ON l_orderkey = o_orderkey
      JOIN customer ON o_custkey = c_custkey JOIN part ON p_partkey = l_partkey
      JOIN supplier ON s_suppkey = l_suppkey JOIN nation n1 ON c_nationkey = n1.n_nationkey
      JOIN region ON n1.n_regionkey = r_regionkey JOIN nation n2 ON s_nationkey = n2.n_nationkey
      WHERE r_name = 'AMERICA' AND o_orderdate BETWEEN '1995-01-01' AND '1996-12-31'
        AND p_type = 'ECONOMY ANODIZED STEEL') AS all_nations
GROUP BY o_year
ORDER BY o_year""",
    9: """SELECT nation, o_year, SUM(amount) AS sum_profit
FROM (SELECT n_name AS nation, EXTRACT(year FROM o_orderdate) AS o_year,
             l_extendedprice * (1 - l_discount) - ps_supplycost * l_quantity AS amount
      FROM lineitem JOIN orders ON o_orderkey = l_orderkey JOIN part ON p_partkey = l_partkey
      JOIN supplier ON s_suppkey = l_suppkey
      JOIN partsupp ON ps_suppkey = l_suppkey AND ps_partkey = l_partkey
      JOIN nation ON s_nationkey = n_nationkey
      WHERE p_name LIKE '%green%') AS profit
GROUP BY nation, o_year
ORDER BY nation, o_year DESC""",
    12: """SELECT l_shipmode,
       SUM(CASE WHEN o_orderpriority = '1-URGENT' OR o_orderpriority = '2-HIGH'
                THEN 1 ELSE 0 END) AS high_line_count,
       SUM(CASE WHEN o_orderpriority <> '1-URGENT' AND o_orderpriority <> '2-HIGH'
                THEN 1 ELSE 0 END) AS low_line_count
FROM lineitem JOIN orders ON o_orderkey = l_orderkey
WHERE l_shipmode IN ('MAIL', 'SHIP') AND l_commitdate < l_receiptdate
  AND l_shipdate < l_commitdate AND l_receiptdate >= '1994-01-01'
  AND l_receiptdate < '1995-01-01'
GROUP BY l_shipmode
ORDER BY l_shipmode""",
}
# Qrlew refuses a ratio of two sums (a panic: "assertion failed: min <= max"): Q14's two sums,
# the ratio taken from the released sums (post-processing).
QRLEW_SUMS_14 = """SELECT SUM(CASE WHEN p_type LIKE 'PROMO%'
                THEN l_extendedprice * (1 - l_discount) ELSE 0 END) AS promo,
       SUM(l_extendedprice * (1 - l_discount)) AS total
FROM lineitem JOIN part ON l_partkey = p_partkey
WHERE l_shipdate >= '1995-09-01' AND l_shipdate < '1995-10-01'"""
# SmartNoise: one table (lineitem with o_custkey and p_type; customer_orders), products as
# columns, dates folded.
SMARTNOISE = {
    1: """SELECT l_returnflag, l_linestatus, SUM(l_quantity) AS sum_qty,
       SUM(l_extendedprice) AS sum_base_price, SUM(l_disc_price) AS sum_disc_price,
       SUM(l_charge) AS sum_charge, AVG(l_quantity) AS avg_qty,
       AVG(l_extendedprice) AS avg_price, AVG(l_discount) AS avg_disc, COUNT(*) AS count_order
FROM lineitem WHERE l_shipdate <= '1998-09-02'
GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus""",
    6: """SELECT SUM(l_rev) AS revenue FROM lineitem
WHERE l_shipdate >= '1994-01-01' AND l_shipdate < '1995-01-01'
  AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24""",
    13: """SELECT c_count, COUNT(*) AS custdist
FROM (SELECT c_custkey, COUNT(o_orderkey) AS c_count FROM customer_orders
      GROUP BY c_custkey) AS c_orders
GROUP BY c_count ORDER BY custdist DESC, c_count DESC""",
    14: """SELECT 100.00 * SUM(l_promo) / SUM(l_disc_price) AS promo_revenue FROM lineitem
WHERE l_shipdate >= '1995-09-01' AND l_shipdate < '1995-10-01'""",
}
# SmartNoise refuses subqueries: Q13's inner query (orders per customer) written out as a
# table, one row per customer.
SMARTNOISE_COUNTS_13 = """SELECT c_count, COUNT(*) AS custdist FROM customer_counts
GROUP BY c_count ORDER BY custdist DESC, c_count DESC"""


def tpch_text(n: int) -> str:
    return (TEXTS / f"q{n:02d}.sql").read_text()


_DATE_PLUS = re.compile(r"DATE '(\d{4}-\d{2}-\d{2})' ([+-]) INTERVAL '(\d+)' (YEAR|MONTH|DAY)")


def folded(sql: str) -> str:
    """``sql`` with each ``DATE 'd' ± INTERVAL 'n' unit`` written as the date it gives, and each
    ``DATE 'd'`` as the string 'd' (Qrlew refuses INTERVAL and reads dates as strings)."""

    def date(m: re.Match[str]) -> str:
        d, sign, n, unit = dt.date.fromisoformat(m[1]), m[2], int(m[3]), m[4]
        n = n if sign == "+" else -n
        if unit == "DAY":
            return f"DATE '{d + dt.timedelta(days=n)}'"
        months = d.year * 12 + d.month - 1 + (n * 12 if unit == "YEAR" else n)
        return f"DATE '{d.replace(year=months // 12, month=months % 12 + 1)}'"

    return re.sub(r"DATE '([0-9-]+)'", r"'\1'", _DATE_PLUS.sub(date, sql))


def plain(v: Any) -> Any:
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def keyed(rows: list[tuple[Any, ...]], n_keys: int) -> dict[str, list[Any]]:
    return {
        "|".join(str(plain(v)) for v in row[:n_keys]): [plain(v) for v in row[n_keys:]]
        for row in rows
    }


def relative_errors(answer: dict[str, list[Any]], truth: dict[str, list[Any]]) -> dict[str, float]:
    """Per group and aggregate ("key#j") both have, with a non-zero true value."""
    out = {}
    for key, values in answer.items():
        for j, (a, t) in enumerate(zip(values, truth.get(key, []), strict=False)):
            if a is None or t is None or t == 0:
                continue
            if isinstance(a, float) and math.isnan(a):
                continue
            out[f"{key}#{j}"] = abs(float(a) - float(t)) / abs(float(t))
    return out


def message(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"


def raw_connection(folder: Path, tables: list[str]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    for t in tables:
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{folder / (t + '.parquet')}')")
    return con


# --- Qrlew -------------------------------------------------------------------------------------


class Qrlew:
    name = "Qrlew 0.9.27"
    TABLES = tuple(ALL_TABLES)
    # The privacy unit as dpsql's policy gives it: customer; orders and lineitem by their keys.
    UNIT: ClassVar[list[Any]] = [
        ("customer", [], "c_custkey"),
        ("orders", [("o_custkey", "customer", "c_custkey")], "c_custkey"),
        (
            "lineitem",
            [("l_orderkey", "orders", "o_orderkey"), ("o_custkey", "customer", "c_custkey")],
            "c_custkey",
        ),
    ]  # the others, left out, are public (Qrlew refuses "_PUBLIC_" on a joined table)

    def __init__(self, folder: Path) -> None:
        self.con = raw_connection(folder, list(self.TABLES))
        engine = sqlalchemy.create_engine("sqlite://")
        for t in self.TABLES:  # 50 rows: the schema's types, nothing of the data
            self.con.execute(f"SELECT * FROM {t} LIMIT 50").df().to_sql(t, engine, index=False)
        ds = self.with_sizes(pyqrlew.Dataset.from_database("tpch", engine))
        for col, (lo, hi) in BOUNDS.items():
            ds = ds.with_range(None, "lineitem", col, lo, hi)
        ds = ds.with_range(None, "partsupp", "ps_supplycost", 0, 1000)  # Q9, as dpsql's policy
        for col, values in PUBLIC_VALUES.items():
            ds = ds.with_possible_values(None, "lineitem", col, values)
        self.dataset = ds

    def with_sizes(self, ds: Any) -> Any:
        """The tables' row counts in place of the sample's 50: Qrlew clamps what it releases
        to the ranges it infers from them (a count to the table's size)."""
        size = json.loads(ds.size)

        def put(node: Any, rows: int) -> None:
            if isinstance(node, dict):
                for k, v in node.items():
                    if k == "size":
                        node[k] = str(rows) if isinstance(v, str) else rows
                    else:
                        put(v, rows)
            elif isinstance(node, list):
                for v in node:
                    put(v, rows)

        for table in size["statistics"]["union"]["fields"]:
            put(table, self.con.execute(f"SELECT COUNT(*) FROM {table['name']}").fetchone()[0])
        dataset = {
            "@type": "sarus_data_spec/sarus_data_spec.Dataset",
            "uuid": size["dataset"],
            "name": "tpch",
            "spec": {"transformed": {"transform": "tpch", "arguments": [], "named_arguments": {}}},
            "properties": {},
            "doc": "TPC-H",
        }
        return pyqrlew.Dataset.from_str(json.dumps(dataset), ds.schema, json.dumps(size))

    def texts(self, n: int) -> list[str]:
        adapted = QRLEW.get(n, folded(tpch_text(n)))
        joins = [QRLEW_JOINS[n]] if n in QRLEW_JOINS else []
        return (
            [tpch_text(n)]
            + ([adapted] if adapted else [])
            + joins
            + ([QRLEW_SUMS_14] if n == 14 else [])
        )

    def answer(self, n: int, sql: str) -> list[tuple[Any, ...]]:
        l0, c = CONTRACT[n]
        relation = self.dataset.relation(sql)
        dp = relation.rewrite_with_differential_privacy(
            self.dataset,
            self.UNIT,
            {"epsilon": EPSILON, "delta": DELTA},
            max_multiplicity=float(c),
            max_privacy_unit_groups=l0,
        )
        text = dp.relation().to_query(pyqrlew.Dialect.PostgreSql)
        rows = self.con.execute(text).fetchall()
        if sql == QRLEW_SUMS_14:
            return [(100.0 * p / t if t else math.nan,) for p, t in rows]
        return rows

    def given(self, n: int) -> str:
        l0, c = CONTRACT[n]
        return f"max_privacy_unit_groups={l0}, max_multiplicity={c}"


# --- SmartNoise SQL ----------------------------------------------------------------------------


class _Cursor:
    """A DB-API cursor on DuckDB as SmartNoise's PostgreSQL reader uses one."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.description: Any = None
        self.rows: list[tuple[Any, ...]] = []

    def execute(self, sql: str) -> None:
        salt = random.getrandbits(62)
        sql = sql.replace("ORDER BY RANDOM ( )", f"ORDER BY hash(clamped, {salt})")
        result = self.con.execute(sql)
        self.description = result.description
        self.rows = result.fetchall() if result.description else []

    def __iter__(self) -> Any:
        return iter(self.rows)


class _Connection:
    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    def cursor(self) -> _Cursor:
        return _Cursor(self.con)

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass


class SmartNoise:
    name = "SmartNoise SQL 1.0.10"

    def __init__(self, folder: Path) -> None:
        self.con = duckdb.connect()
        derived = ", ".join(f"{expr} AS {name}" for name, (expr, _) in DERIVED.items())
        p = {t: f"read_parquet('{folder / (t + '.parquet')}')" for t in ("lineitem", "orders")}
        self.con.execute(
            f"""CREATE TABLE lineitem AS SELECT l.*, o_custkey, p_type, {derived}
            FROM {p["lineitem"]} l JOIN {p["orders"]} ON l_orderkey = o_orderkey
            JOIN read_parquet('{folder / "part.parquet"}') ON l_partkey = p_partkey"""
        )
        self.con.execute(
            f"""CREATE TABLE customer_orders AS SELECT c_custkey, o_orderkey
            FROM read_parquet('{folder / "customer.parquet"}') LEFT JOIN {p["orders"]}
              ON c_custkey = o_custkey AND o_comment NOT LIKE '%special%requests%'"""
        )
        self.con.execute(
            """CREATE TABLE customer_counts AS SELECT c_custkey, COUNT(o_orderkey) AS c_count
            FROM customer_orders GROUP BY c_custkey"""
        )
        self.epsilons: dict[int, tuple[float, tuple[float, float]]] = {}

    def metadata(self, n: int) -> dict[str, Any]:
        floats = {
            col: {"type": "float", "lower": lo, "upper": hi}
            for col, (lo, hi) in [*BOUNDS.items(), *((k, b) for k, (_, b) in DERIVED.items())]
        }
        strings = {col: {"type": "string"} for col in ["l_returnflag", "l_linestatus", "p_type"]}
        lineitem = {
            "max_ids": self.max_ids(n),
            "row_privacy": False,
            "o_custkey": {"type": "int", "private_id": True},
            "l_shipdate": {"type": "datetime"},
            **floats,
            **strings,
        }
        customer_orders = {
            "max_ids": self.max_ids(n),
            "row_privacy": False,
            "c_custkey": {"type": "int", "private_id": True},
            "o_orderkey": {"type": "int"},
        }
        customer_counts = {
            "max_ids": self.max_ids(n),
            "row_privacy": False,
            "c_custkey": {"type": "int", "private_id": True},
            "c_count": {"type": "int"},
        }
        tables = {
            "lineitem": lineitem,
            "customer_orders": customer_orders,
            "customer_counts": customer_counts,
        }
        return {"tpch": {"public": tables}}

    @staticmethod
    def max_ids(n: int) -> int:
        """dpsql's rows per unit: L0 * C for a grouped query, C for one without groups."""
        l0, c = CONTRACT[n]
        return (l0 if N_KEYS[n] else 1) * c

    def reader(self, n: int, epsilon: float) -> Any:
        return snsql.from_connection(
            _Connection(self.con),
            engine="postgres",
            privacy=snsql.Privacy(epsilon=epsilon, delta=DELTA),
            metadata=self.metadata(n),
        )

    def texts(self, n: int) -> list[str]:
        adapted = [SMARTNOISE[n]] if n in SMARTNOISE else []
        return [tpch_text(n), *adapted] + ([SMARTNOISE_COUNTS_13] if n == 13 else [])

    def calibrate(self, n: int, sql: str) -> float:
        """SmartNoise spends its epsilon on each aggregate (and on the hidden unit count it
        thresholds groups with): scale it so that the query's cost is dpsql's, epsilon 1."""
        eps = EPSILON
        for _ in range(3):
            cost = self.reader(n, eps).get_privacy_cost([sql])
            eps *= EPSILON / cost[0]
        cost = self.reader(n, eps).get_privacy_cost([sql])
        self.epsilons[n] = (eps, cost)
        return eps

    def prepare(self, n: int, sql: str) -> None:
        self.calibrate(n, sql)

    def answer(self, n: int, sql: str) -> list[tuple[Any, ...]]:
        rows = self.reader(n, self.epsilons[n][0]).execute(sql)
        return [tuple(r) for r in rows[1:]]

    def given(self, n: int) -> str:
        eps, cost = self.epsilons.get(n, (math.nan, (math.nan, math.nan)))
        return (
            f"max_ids={self.max_ids(n)}, epsilon per mechanism {eps:.3g} (query cost {cost[0]:.3g})"
        )


# --- the run -----------------------------------------------------------------------------------


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def run_peer(peer: Any, n: int, runs: int, truth: dict[str, list[Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"query": f"Q{n}", "peer": peer.name, "refusals": []}
    texts = peer.texts(n)
    for i, sql in enumerate(texts):
        try:
            if hasattr(peer, "prepare"):
                peer.prepare(n, sql)  # untimed: SmartNoise's epsilon per mechanism
            ms, first = timed(lambda sql=sql: peer.answer(n, sql))
        except BaseException as e:  # Qrlew's Rust panics are BaseExceptions
            if isinstance(e, KeyboardInterrupt | SystemExit):
                raise
            label = "tpch" if i == 0 else f"adapted {i}"
            row["refusals"].append({"text": label, "error": message(e)})
            continue
        row["text"] = "tpch" if i == 0 else f"adapted {i}"
        row["sql"] = sql
        times, errors, groups = (
            [ms],
            [relative_errors(keyed(first, N_KEYS[n]), truth)],
            [len(first)],
        )
        for _ in range(runs - 1):
            ms, rows = timed(lambda sql=sql: peer.answer(n, sql))
            times.append(ms)
            errors.append(relative_errors(keyed(rows, N_KEYS[n]), truth))
            groups.append(len(rows))
        flat = [e for run in errors for e in run.values()]
        cells = sorted({c for run in errors for c in run})
        row.update(
            status="ran",
            ms=times,
            median_ms=statistics.median(times),
            error_true=statistics.median(flat) if flat else math.nan,
            error_cells={
                c: statistics.median([run[c] for run in errors if c in run]) for c in cells
            },
            groups={"true": len(truth), "released": statistics.median(groups)},
            given=peer.given(n),
        )
        return row
    row["status"] = "refused"
    return row


def pct(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x * 100:.2g}%"


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| query | peer | status | median ms | groups true/released | error vs true |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        if r["status"] == "ran":
            how = "ran, TPC-H text" if r["text"] == "tpch" else f"ran, {r['text']} text"
            for x in r["refusals"]:
                how += f"; {x['text']} text refused: {x['error'][:110]}"
            g = r["groups"]
            out.append(
                f"| {r['query']} | {r['peer']} | {how} | {r['median_ms']:,.0f} "
                f"| {g['true']}/{g['released']:g} | {pct(r['error_true'])} |"
            )
        else:
            why = "; ".join(f"{x['text']} text: {x['error'][:160]}" for x in r["refusals"])
            out.append(f"| {r['query']} | {r['peer']} | refused or failed: {why} | | | |")
    return out


def main() -> None:
    if pyqrlew is None or snsql is None:
        raise SystemExit("run this in the peers' environment (see the module's docstring)")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=HERE / "results" / "tpch_sf1")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--queries", type=int, nargs="+", default=[1, 6, 13, 14])
    ap.add_argument("--peers", nargs="+", default=["qrlew", "smartnoise"])
    ap.add_argument("--out", type=Path, default=HERE / "results" / "tpch_peers_sf1.json")
    args = ap.parse_args()

    raw = raw_connection(args.data, ALL_TABLES)
    truths = {}
    for n in args.queries:
        truths[n] = keyed(raw.execute(tpch_text(n)).fetchall(), N_KEYS[n])

    classes = {"qrlew": Qrlew, "smartnoise": SmartNoise}
    peers, setup = [], {}
    for name in args.peers:
        ms, peer = timed(lambda cls=classes[name]: cls(args.data))
        setup[peer.name] = ms
        peers.append(peer)
        print(f"{peer.name}: setup {ms:,.0f} ms", flush=True)

    rows = []
    for n in args.queries:
        for peer in peers:
            row = run_peer(peer, n, args.runs, truths[n])
            rows.append(row)
            print(f"  Q{n} {peer.name}: {row['status']}", flush=True)

    print()
    print("\n".join(table(rows)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "date": dt.date.today().isoformat(),
                "data": str(args.data),
                "runs": args.runs,
                "epsilon": EPSILON,
                "delta": DELTA,
                "python": platform.python_version(),
                "duckdb": duckdb.__version__,
                "setup_ms": setup,
                "rows": rows,
            },
            indent=1,
            default=str,
        )
    )
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
