"""Every allow-listed row-level function and operator is total (issue 6): applied in WHERE and
inside COUNT and SUM arguments over an adversarial corpus (NULL, NaN, infinities, zeros,
extremes of INTEGER, BIGINT and DOUBLE, empty, non-ASCII and very long strings, extreme dates),
the engine never raises; a hypothesis test nests them at random.

The function list mirrors ``_FUNCTIONS`` and ``_OPERATORS`` of ``dpsql/sql/validate.py``; a test
checks that every class there is exercised here.
"""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpsql import errors
from dpsql.policy import load_policy
from dpsql.session import Session
from dpsql.sql import validate as allow
from dpsql.sql.parse import DIALECT

# The adversarial corpus, one unit per row plus ordinary rows.
CORPUS = """
SELECT * FROM (VALUES
  (1, NULL::INTEGER, NULL::BIGINT, NULL::DOUBLE, NULL::VARCHAR, NULL::DATE),
  (2, 0, 0, 'nan'::DOUBLE, '', DATE '0001-01-01'),
  (3, 2147483647, 9223372036854775807, 'inf'::DOUBLE, 'é漢字🙂', DATE '5881580-07-10'),
  (4, -2147483648, -9223372036854775808, '-inf'::DOUBLE, repeat('x', 100000),
      DATE '-5877641-06-25'),
  (5, -1, -1, -0.0::DOUBLE, '%_\\''', DATE 'infinity'),
  (6, 1, 1, 1.7976931348623157e308, ' 12 ', DATE '-infinity'),
  (7, 2147483646, -9223372036854775807, -1.7976931348623157e308, 'NaN', DATE '1970-01-01'),
  (8, 42, 4611686018427387904, 5e-324, '2147483648', DATE '2000-02-29'),
  (9, -42, 3037000500, -5e-324, 'inf', DATE '9999-12-31'),
  (10, 7, 7, 0.0, repeat('é', 5000), DATE '2026-01-01')
) v(user_id, i, b, d, s, t)
"""


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    root = tmp_path_factory.mktemp("function_totality")
    path = root / "corpus.parquet"
    con = duckdb.connect()
    con.execute(
        f"""COPY (SELECT user_id::BIGINT AS user_id, i, b, d, s, t FROM ({CORPUS})
            UNION ALL
            SELECT (100 + k)::BIGINT, (k % 50)::INTEGER, (k * 1000)::BIGINT, k / 7.0,
                   (k % 9)::VARCHAR, DATE '2026-01-01' + (k % 30)::INTEGER
            FROM range(200) r(k)) TO '{path}' (FORMAT parquet)"""
    )
    con.close()
    policy = load_policy(
        {
            "dataset": {"id": "function-totality"},
            "data": {"tables": {"visits": str(path)}},
            "budget": {
                "epsilon": "10000",
                "delta": "0.5",
                "query_epsilon": "1",
                "query_delta": "1e-9",
            },
            "tables": {
                "visits": {
                    "privacy_unit": "user_id",
                    "max_groups_per_unit": 2,
                    "max_rows_per_unit_per_group": 10,
                    "columns": {
                        "i": {"lower": -100, "upper": 100},
                        "b": {"lower": -100, "upper": 100},
                        "d": {"lower": -100, "upper": 100},
                    },
                }
            },
        },
        base_dir=root,
    )
    made = Session(policy)
    yield made
    made.close()


NUMERIC = ("i", "b", "d")
# Each template is one allow-listed construct; {x} and {y} are numeric, {s} a string and {t} a
# date. The value is the class it exercises.
NUMERIC_TEMPLATES: dict[str, type[exp.Expression]] = {
    "coalesce({x}, {y})": exp.Coalesce,
    "nullif({x}, {y})": exp.Nullif,
    "abs({x})": exp.Abs,
    "round({x})": exp.Round,
    "round({x}, 2)": exp.Round,
    "round({x}, {y})": exp.Round,
    "floor({x})": exp.Floor,
    "ceil({x})": exp.Ceil,
    "sign({x})": exp.Sign,
    "trunc({x})": exp.Trunc,
    "least({x}, {y})": exp.Least,
    "greatest({x}, {y})": exp.Greatest,
    "ln({x})": exp.Ln,
    "log({x})": exp.Log,
    "log(2, {x})": exp.Log,
    "sqrt({x})": exp.Sqrt,
    "exp({x})": exp.Exp,
    "pow({x}, {y})": exp.Pow,
    "{x} ^ 2": exp.Pow,
    "-({x})": exp.Neg,
    "{x} + {y}": exp.Add,
    "{x} - {y}": exp.Sub,
    "{x} * {y}": exp.Mul,
    "{x} / {y}": exp.Div,
    "{x} // {y}": exp.IntDiv,
    "{x} % {y}": exp.Mod,
    "CASE WHEN {x} > {y} THEN {x} ELSE {y} END": exp.Case,
    "CASE {x} WHEN 0 THEN 1 ELSE {y} END": exp.Case,
    "if({x} > 0, {x}, {y})": exp.If,
    "CAST({x} AS INTEGER)": exp.Cast,
    "CAST({x} AS SMALLINT)": exp.Cast,
    "CAST({x} AS TINYINT)": exp.Cast,
    "CAST({x} AS BIGINT)": exp.Cast,
    "CAST({x} AS DOUBLE)": exp.Cast,
    "CAST({x} AS DECIMAL(4, 1))": exp.Cast,
    "{x}::INTEGER": exp.Cast,
    "TRY_CAST({x} AS INTEGER)": exp.TryCast,
    "length({s})": exp.Length,
    "CAST({s} AS INTEGER)": exp.Cast,
    "CAST({s} AS DOUBLE)": exp.Cast,
    "year({t})": exp.Year,
    "month({t})": exp.Month,
    "day({t})": exp.Day,
    "dayofweek({t})": exp.DayOfWeek,
    "EXTRACT(YEAR FROM {t})": exp.Extract,
    "EXTRACT(EPOCH FROM {t})": exp.Extract,
}
PREDICATE_TEMPLATES: dict[str, type[exp.Expression]] = {
    "{x} = {y}": exp.EQ,
    "{x} <> {y}": exp.NEQ,
    "{x} > {y}": exp.GT,
    "{x} >= {y}": exp.GTE,
    "{x} < {y}": exp.LT,
    "{x} <= {y}": exp.LTE,
    "{x} IS NULL": exp.Is,
    "{x} IN (0, 1, {y})": exp.In,
    "{x} BETWEEN {y} AND 10": exp.Between,
    "NOT ({x} > 0)": exp.Not,
    "{x} > 0 AND {y} > 0": exp.And,
    "{x} > 0 OR {y} > 0": exp.Or,
    "TRUE AND {x} IS NOT NULL": exp.Boolean,
    "isnan({x})": exp.IsNan,
    "isinf({x})": exp.IsInf,
    "{s} LIKE '%x%'": exp.Like,
    "{s} LIKE {s}": exp.Like,
    "{s} ILIKE '%É%'": exp.ILike,
    "lower({s}) = 'nan'": exp.Lower,
    "upper({s}) = 'NAN'": exp.Upper,
    "substring({s}, 2, 3) = 'x'": exp.Substring,
    "substring({s}, {x}) = 'x'": exp.Substring,
    "substring({s}, {x}, {y}) = 'x'": exp.Substring,
    "trim({s}) = '12'": exp.Trim,
    "concat({s}, {s}, {x}) <> ''": exp.Concat,
    "({s} || {s}) <> ''": exp.DPipe,
    "starts_with({s}, 'é')": exp.StartsWith,
    "contains({s}, '漢')": exp.Contains,
    "{t} > DATE '2000-01-01'": exp.GT,
    "CAST({s} AS DATE) IS NULL": exp.Cast,
    "CAST({x} AS VARCHAR) = '0'": exp.Cast,
    "TRY_CAST({s} AS BIGINT) > 0": exp.TryCast,
}


def _instances(template: str) -> list[str]:
    """The template over every pair of numeric columns (and the string and date columns)."""
    if "{y}" in template:
        pairs = [(x, y) for x in NUMERIC for y in NUMERIC]
    elif "{x}" in template:
        pairs = [(x, "i") for x in NUMERIC]
    else:
        pairs = [("i", "i")]
    return sorted({template.format(x=x, y=y, s="s", t="t") for x, y in pairs})


def _numeric_uses_string(template: str) -> bool:
    return "{s}" in template or "{t}" in template


CASES = sorted(
    {
        f"SELECT COUNT(*) FROM visits WHERE ({e}) IS NOT NULL"
        for t in NUMERIC_TEMPLATES
        for e in _instances(t)
    }
    | {f"SELECT COUNT({e}) FROM visits" for t in NUMERIC_TEMPLATES for e in _instances(t)}
    | {
        f"SELECT SUM(LEAST(GREATEST({e}, -10), 10)) FROM visits"
        for t in NUMERIC_TEMPLATES
        if not _numeric_uses_string(t)
        for e in _instances(t)
    }
    | {f"SELECT COUNT(*) FROM visits WHERE {e}" for t in PREDICATE_TEMPLATES for e in _instances(t)}
    | {
        f"SELECT COUNT(CASE WHEN {e} THEN 1 END) FROM visits"
        for t in PREDICATE_TEMPLATES
        for e in _instances(t)
    }
    | {
        f"SELECT SUM(CASE WHEN {e} THEN 1 ELSE 0 END) FROM visits"
        for t in PREDICATE_TEMPLATES
        if "{s}" not in t and "{t}" not in t
        for e in _instances(t)
    }
)


def test_every_allow_listed_function_and_operator_is_exercised() -> None:
    covered = set(NUMERIC_TEMPLATES.values()) | set(PREDICATE_TEMPLATES.values())
    # Literals, NULL, Var (EXTRACT's part name) and TryCast appear inside the templates.
    covered |= {exp.Literal, exp.Null, exp.Var}
    for sql in CASES:
        covered |= {type(node) for node in sqlglot.parse_one(sql, read=DIALECT).walk()}
    missing = {c.__name__ for c in allow._FUNCTIONS + allow._OPERATORS} - {
        c.__name__ for c in covered
    }
    assert not missing


def test_the_corpus_queries_are_allowed(session: Session) -> None:
    # Every case must pass validation and analysis; a rejection would hide a totality bug.
    # The only rejections allowed are DuckDB's binder refusing an argument type on the schema
    # alone (round(x, <double>), substring(s, <double>)); they are data-independent.
    rejected = []
    for sql in CASES:
        try:
            session.plan(sql)
        except errors.QueryError as exc:
            binder = "round(" in sql or "substring(" in sql
            if not binder or "type-check" not in str(exc):
                rejected.append((sql, str(exc)))
    assert not rejected


def _answer(session: Session, sql: str) -> None:
    try:
        result = session.execute(sql, fresh=True)
    except errors.QueryError:
        return  # rejected on the schema alone (checked separately above): never data-dependent
    assert result.cached_from is None
    assert len(result.rows) == 1


@pytest.mark.parametrize("chunk", range(8))
def test_every_function_answers_on_the_adversarial_corpus(session: Session, chunk: int) -> None:
    # Chunked so that a failure names a small set; fresh=True makes the engine run each one.
    failures = []
    for sql in CASES[chunk::8]:
        try:
            _answer(session, sql)
        except errors.EngineError:
            failures.append(sql)
    assert not failures


# -- nested expressions ------------------------------------------------------------------------

NUM_LEAVES = st.one_of(
    st.sampled_from(NUMERIC),
    st.sampled_from(["0", "-1", "2147483647", "9223372036854775807", "1e308", "-0.0", "NULL"]),
    st.sampled_from(["length(s)", "year(t)", "dayofweek(t)", "EXTRACT(EPOCH FROM t)"]),
)
NUM_UNARY = [t for t in NUMERIC_TEMPLATES if "{y}" not in t and "{x}" in t]
NUM_BINARY = [t for t in NUMERIC_TEMPLATES if "{y}" in t]
PRED_UNARY = [t for t in PREDICATE_TEMPLATES if "{y}" not in t and "{x}" in t]
PRED_BINARY = [t for t in PREDICATE_TEMPLATES if "{y}" in t]
PRED_STRING = [t for t in PREDICATE_TEMPLATES if "{x}" not in t]
STRINGS = st.sampled_from(["s", "lower(s)", "upper(s)", "trim(s)", "concat(s, i)", "s || s", "''"])


def _fill(template: str, x: str, y: str = "i", s: str = "s") -> str:
    return template.format(x=f"({x})", y=f"({y})", s=f"({s})", t="t")


def _nested(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(st.sampled_from(NUM_UNARY), children, STRINGS).map(
            lambda a: _fill(a[0], a[1], s=a[2])
        ),
        st.tuples(st.sampled_from(NUM_BINARY), children, children).map(
            lambda a: _fill(a[0], a[1], a[2])
        ),
    )


NUM_EXPR = st.recursive(NUM_LEAVES, _nested, max_leaves=5)
PREDICATE = st.one_of(
    st.tuples(st.sampled_from(PRED_UNARY), NUM_EXPR, STRINGS).map(
        lambda a: _fill(a[0], a[1], s=a[2])
    ),
    st.tuples(st.sampled_from(PRED_BINARY), NUM_EXPR, NUM_EXPR).map(
        lambda a: _fill(a[0], a[1], a[2])
    ),
    st.tuples(st.sampled_from(PRED_STRING), STRINGS).map(lambda a: _fill(a[0], "i", s=a[1])),
)


@st.composite
def nested_query(draw: st.DrawFn) -> str:
    shape = draw(st.integers(0, 2))
    where = f" WHERE {draw(PREDICATE)}" if draw(st.booleans()) else ""
    if shape == 0:
        return f"SELECT COUNT({draw(NUM_EXPR)}) FROM visits{where}"
    if shape == 1:
        lo, hi = draw(st.integers(-100, 0)), draw(st.integers(1, 100))
        return f"SELECT SUM(LEAST(GREATEST({draw(NUM_EXPR)}, {lo}), {hi})) FROM visits{where}"
    return f"SELECT COUNT(*) FROM visits WHERE {draw(PREDICATE)}"


@settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sql=nested_query())
def test_nested_expressions_never_raise_in_the_engine(session: Session, sql: str) -> None:
    try:
        plan = session.plan(sql)
    except errors.QueryError:
        return  # rejected before any charge on the query and schema alone
    _names, rows = session.engine.run(plan.engine_sql)  # an EngineError here is a dpsql bug
    assert len(rows) == 1
