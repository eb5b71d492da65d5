"""Hostile parameter values, generated, through every interface: typed, prompt, and free.

Hypothesis generates values per setting and per interface: numbers whose decimal text expands to
a billion digits (``1e999999999``), ratios over zero, NaN and the infinities, ``-0``, integers of
thousands of digits, other scripts' digits, underscores, empty and megabyte strings, bytes,
booleans, nested lists, denormal floats, signalling NaNs, Fractions of huge terms, and the
valid values around them. Each goes through Python keyword options (``Session.execute`` and
the DB-API cursor), ``SET dpsql.<name>`` (the session, the DB-API and the shell),
``WITH DIFFERENTIAL_PRIVACY OPTIONS(...)``, ``?`` parameters, the command line, and
parameters bound over the wire (``dpsql serve`` and psycopg).

The property is the same everywhere: the statement is answered, or refused with a typed error
of the interface (a ``QueryError``, its PEP 249 class, exit code 2 or 3, a SQLSTATE of class
22 or 42); it happens within ``PROMPT`` seconds (``Fraction("1e999999999")`` takes minutes);
a refusal charges nothing; the ledger verifies afterwards. Values that can never be valid
(not a number, not finite, beyond the bounded range) must be a ``ParameterError`` exactly.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from types import FrameType
from typing import Any

import duckdb
import psycopg
import pytest
from click.testing import CliRunner
from conftest import examples
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from server_fixtures import ServerThread, write_dataset, write_policy, write_users
from server_fixtures import connect as wire_connect

from dpsql import errors
from dpsql.accounting.ledger.ledger import Ledger
from dpsql.accounting.ledger.store import create_ledger
from dpsql.interfaces.cli import main as cli
from dpsql.interfaces.dbapi import connection as dbapi
from dpsql.interfaces.shell.core import Shell
from dpsql.policy import load_policy
from dpsql.session.session import Session
from dpsql.session.settings import NAMES as SETTINGS
from dpsql.sql.options import KEYS

PROMPT = 10  # seconds: far above any honest refusal, far below an expansion of 1e999999999
Q = "SELECT COUNT(*) FROM visits"
GAUSSIAN = {"mechanism": "gaussian", "delta": "1e-9"}  # what rho and sigma need beside them
HOSTILE = settings(
    deadline=None,  # ``prompt`` bounds the time instead, with a signal that can interrupt
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class TooSlowError(Exception):
    """Raised by the alarm of ``prompt``."""


@contextlib.contextmanager
def prompt(seconds: int = PROMPT) -> Iterator[None]:
    def alarm(signum: int, frame: FrameType | None) -> None:
        raise TooSlowError(f"more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- values -----------------------------------------------------------------------------------

EXPONENTS = st.integers(-(10**12), 10**12)
MANTISSAS = st.sampled_from(["1", "-1", "0.5", ".5", "9.99", "0", "-0", "12345678901234567890"])
EXPONENT_TEXT = st.builds(lambda m, e, c: f"{m}{c}{e}", MANTISSAS, EXPONENTS, st.sampled_from("eE"))
HAND_TEXT = [
    "1e999999999", "-1e999999999", "1e-999999999", "1E+999999999", "0e999999999",
    "1/0", "0/0", "-1/0", "1/3", "-1/3", "10/3", "1//3", "1/3/3", "1.5/2",
    "nan", "NaN", "-nan", "sNaN", "inf", "-inf", "+inf", "Infinity", "infinity",
    "-0", "+0", "0", "-0.0", "0.0", "00", "", " ", "\t", "\n", " 0.5 ", "0.5\x00", "\x00",
    "１", "٣", "๑", "1_0", "1_000", "0x10", "0b1", "0o7", "1e", "e1", ".", "-", "+", "--1", "+-1",
    "1.5.5", "½", "⁵", "1e+", "1 0", "1,5", "true", "false", "yes", "on", "laplace",
    "gaussian", "null", "None", "5e-324", "1e-300", "1e-301", "1e300", "1e301",
    "1.7976931348623157e308",
    "20", "20.000001", "0.9999", "0.99991", "0.5", "0.49999", "1000000", "1000001", "2.0", "1e6",
    "0.22360679774997896", "0.2236", "0.224", "10", "10.0000001",
]  # fmt: skip
NUMERIC_TEXT = st.one_of(
    EXPONENT_TEXT,
    st.from_regex(r"\A[+-]?[0-9]{1,40}(\.[0-9]{0,40})?([eE][+-]?[0-9]{1,5})?\Z"),
    st.builds(lambda a, b: f"{a}/{b}", st.integers(-(10**60), 10**60), st.integers(0, 10**60)),
    st.sampled_from(HAND_TEXT),
)
LONG_TEXT = st.builds(
    lambda c, n: c * n, st.sampled_from(["1", "x", "9", " ", "é", "\x00", "'"]),
    st.integers(100, 2_000_000),
)  # fmt: skip
TEXT = st.one_of(NUMERIC_TEXT, st.text(max_size=30), LONG_TEXT)
HUGE_INTS = st.builds(lambda k, s: s * 10**k, st.integers(0, 6000), st.sampled_from([1, -1]))
NUMBERS = st.one_of(
    st.integers(),
    HUGE_INTS,
    st.floats(),
    st.sampled_from([5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -0.0]),
    st.decimals(),
    st.builds(Decimal, EXPONENT_TEXT),
    st.sampled_from([Decimal("sNaN"), Decimal("-sNaN"), Decimal("NaN"), Decimal("-Infinity")]),
    st.fractions(),
    st.builds(Fraction, HUGE_INTS, st.integers(1, 10**6)),
    st.builds(lambda k: Fraction(1, 10**k), st.integers(0, 6000)),
)
NESTED = st.lists(
    st.recursive(st.integers(0, 3), lambda inner: st.lists(inner, max_size=3), max_leaves=6),
    max_size=3,
)
OTHERS = st.one_of(
    st.booleans(),
    st.binary(max_size=12),
    st.lists(st.integers(0, 3), max_size=3),
    NESTED,
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.builds(object),
    st.just(b"0.5"),
    st.just(bytearray(b"1")),
    st.just(complex(1, 0)),
    st.just(dt.date(2026, 1, 1)),
)
VALUES = st.one_of(TEXT, NUMBERS, OTHERS)
# Never valid for a numeric setting: not a number, not finite, or beyond 1e300 in magnitude.
NEVER_NUMBERS = st.one_of(
    OTHERS,
    st.sampled_from(["1e999999999", "-1e999999999", "1e-999999999", "1/0", "nan", "inf",
                     "Infinity", "", " ", "１", "٣", "1_0", "0x10", "1e", "--1", "½", "5e-324",
                     "1e301", "1e-301"]),
    st.builds(lambda k: 10**k, st.integers(301, 6000)),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 5e-324, Decimal("sNaN"),
                     Decimal("NaN"), Decimal("Infinity"), Decimal("1e999999999")]),
    LONG_TEXT,
)  # fmt: skip
NUMERIC_SETTINGS = [
    "epsilon", "delta", "rho", "sigma", "confidence",
    "max_groups_per_unit", "max_rows_per_unit_per_group", "max_rows_per_unit",
]  # fmt: skip


def sql_literal(text: str, quoted: bool) -> str:
    """The text as SQL: a quoted string, or bare (a number token, a word, or anything else)."""
    return "'" + text.replace("'", "''") + "'" if quoted else text


# -- the data, the policy, the ledger ---------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile-parameters") / "visits.parquet"
    con = duckdb.connect()
    con.execute(
        f"""COPY (
            SELECT (i % 40)::BIGINT AS user_id, ['north', 'south'][1 + i % 2] AS region,
                   (18 + i % 60)::INTEGER AS age, (i % 100)::DOUBLE AS spend,
                   DATE '2026-01-01' + (i % 30)::INTEGER AS day
            FROM range(200) r(i)) TO '{path}' (FORMAT parquet)"""
    )
    con.close()
    return path


@pytest.fixture(scope="module")
def policy_path(data: Path) -> Path:
    folder = data.parent
    ledger = folder / "ledger.sqlite"
    path = folder / "policy.toml"
    path.write_text(
        f"""
[dataset]
id = "hostile-parameters"

[data]
tables = {{ visits = "{data}" }}

[ledger]
path = "{ledger}"

[budget]
diagnose = false
epsilon = 1000
delta = 0.001
query_epsilon = 0.001
query_delta = 1e-10

[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_unit_per_group = 5

[tables.visits.columns.age]
lower = 18
upper = 90

[tables.visits.columns.spend]
lower = 0
upper = 200

[tables.visits.columns.region]
public_values = ["north", "south"]
""",
        encoding="utf-8",
    )
    create_ledger(load_policy(path))
    return path


@pytest.fixture(scope="module")
def session(policy_path: Path) -> Iterator[Session]:
    s = Session(policy_path, analyst="mallory")
    yield s
    s.close()


@pytest.fixture(scope="module")
def conn(policy_path: Path) -> Iterator[dbapi.Connection]:
    c = dbapi.connect(policy_path, analyst="mallory")
    yield c
    c.close()


def ledger_state(session: Session) -> tuple[int, int]:
    """How many records and charges the verified ledger holds."""
    store = session.filter.store
    assert isinstance(store, Ledger)
    count = store.verify()
    return count, sum(1 for r in store.records() if r.kind == "charge")


def refused_typed(run: Callable[[], object], *, dbapi_call: bool = False) -> BaseException | None:
    """Run ``run`` promptly; None when it answered, else its error, which must be typed."""
    try:
        with prompt():
            run()
    except TooSlowError:
        raise
    except errors.QueryError as exc:
        if dbapi_call:
            assert isinstance(exc, dbapi.ProgrammingError | dbapi.NotSupportedError), type(exc)
        event(f"refused: {type(exc).__name__}")
        return exc
    event("answered")
    return None


# -- Python keyword options, SET, OPTIONS(...) ------------------------------------------------


@settings(HOSTILE, max_examples=examples(200))
@given(name=st.sampled_from(SETTINGS), value=VALUES)
def test_keyword_option(session: Session, conn: dbapi.Connection, name: str, value: Any) -> None:
    before = ledger_state(session)
    extra = {k: v for k, v in GAUSSIAN.items() if k != name} if name in ("rho", "sigma") else {}
    refused_typed(lambda: session.execute("EXPLAIN " + Q, **extra, **{name: value}))
    refused_typed(
        lambda: conn.cursor().execute("EXPLAIN " + Q, **extra, **{name: value}), dbapi_call=True
    )
    if value is not None:
        refused_typed(lambda: conn.set(name, value), dbapi_call=True)
        conn.set(name, None)
    assert ledger_state(session) == before  # EXPLAIN charges nothing, a refusal neither


@settings(HOSTILE, max_examples=examples(150))
@given(name=st.sampled_from(NUMERIC_SETTINGS), value=NEVER_NUMBERS)
def test_never_valid_number_is_a_parameter_error(
    session: Session, conn: dbapi.Connection, name: str, value: Any
) -> None:
    extra = {k: v for k, v in GAUSSIAN.items() if k != name} if name in ("rho", "sigma") else {}
    error = refused_typed(lambda: session.plan(Q, **extra, **{name: value}))
    assert type(error) is errors.ParameterError, (name, type(error))
    error = refused_typed(lambda: conn.set(name, value), dbapi_call=True)
    assert isinstance(error, dbapi.InvalidParameterError), (name, type(error))
    assert len(str(error)) < 200  # names the setting, never echoes the value


@settings(HOSTILE, max_examples=examples(200))
@given(name=st.sampled_from(SETTINGS), text=TEXT, quoted=st.booleans())
def test_set_statement(
    session: Session, conn: dbapi.Connection, name: str, text: str, quoted: bool
) -> None:
    before = ledger_state(session)
    sql = f"SET dpsql.{name} = {sql_literal(text, quoted)}"
    try:
        refused_typed(lambda: session.execute(sql))
        refused_typed(lambda: conn.cursor().execute(sql), dbapi_call=True)
        with prompt():
            shown = Shell(session).handle(sql + ";")
        assert shown.startswith(("Error: ParameterError", "Error: ParseError", "SET", "Error: "
                                 "UnsupportedQueryError")), shown[:200]  # fmt: skip
        assert "internal error" not in shown
    finally:
        session.set_option(name, None)
        conn.set(name, None)
    assert ledger_state(session) == before


OPTION_KEYS = [*KEYS, "privacy_unit_column"]


@settings(HOSTILE, max_examples=examples(200))
@given(key=st.sampled_from(OPTION_KEYS), text=TEXT, quoted=st.booleans())
def test_options_clause(session: Session, key: str, text: str, quoted: bool) -> None:
    before = ledger_state(session)
    pairs = [f"{key} = {sql_literal(text, quoted)}"]
    if KEYS.get(key) in ("rho", "sigma"):
        pairs += ["mechanism = 'gaussian'", "delta = 1e-9"]
    sql = (
        f"EXPLAIN SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS({', '.join(pairs)}) COUNT(*) FROM visits"
    )
    refused_typed(lambda: session.execute(sql))
    assert ledger_state(session) == before


# -- ? parameters --------------------------------------------------------------------------------

PARAMETER_VALUES = st.one_of(
    VALUES,
    st.none(),
    st.text(),
    st.sampled_from(["\ud800", "x\udfff", "north", "north\x00"]),
    st.dates(),
    st.datetimes(timezones=st.none() | st.timezones()),
    st.times(),
    st.builds(uuid.uuid4),
    st.timedeltas(),
)
TEMPLATES = [
    "SELECT COUNT(*) FROM visits WHERE age > ?",
    "SELECT COUNT(*) FROM visits WHERE region = ?",
    "SELECT COUNT(*) FROM visits WHERE spend BETWEEN ? AND 150",
    "SELECT SUM(spend) FROM visits WHERE day < ?",
    "SELECT AVG(age) FROM visits WHERE ? IS NULL",
    "SELECT COUNT(*) FROM visits WHERE age * ? > 40",
    "SELECT SUM(LEAST(GREATEST(spend * ?, 0), 10)) FROM visits",
]


@settings(HOSTILE, max_examples=examples(150))
@given(sql=st.sampled_from(TEMPLATES), value=PARAMETER_VALUES)
def test_query_parameter(session: Session, conn: dbapi.Connection, sql: str, value: Any) -> None:
    runs = {"session": session.execute, "dbapi": lambda q, p: conn.cursor().execute(q, p)}
    for interface, run in runs.items():
        records, charges = ledger_state(session)
        error = refused_typed(lambda: run(sql, [value]), dbapi_call=interface == "dbapi")  # noqa: B023
        after = ledger_state(session)
        if error is None:  # answered: charged exactly once (a release or a re-serve beside it)
            assert after[1] in (charges, charges + 1) and after[0] > records
        else:
            assert after == (records, charges), type(error)
            assert len(str(error)) < 2_000


@settings(HOSTILE, max_examples=examples(60))
@given(values=st.one_of(st.lists(PARAMETER_VALUES, max_size=4), PARAMETER_VALUES, NESTED))
def test_parameter_sequences(conn: dbapi.Connection, session: Session, values: Any) -> None:
    before = ledger_state(session)
    sql = "EXPLAIN SELECT COUNT(*) FROM visits WHERE age > ? AND region = ?"
    refused_typed(lambda: conn.cursor().execute(sql, values), dbapi_call=True)
    refused_typed(lambda: conn.cursor().executemany(sql, values), dbapi_call=True)
    assert ledger_state(session) == before


# -- the command line ---------------------------------------------------------------------------


def small_budget(folder: Path, data: Path) -> Path:
    """A policy of epsilon 10 with a fresh ledger (what-if's cost grows with the budget left)."""
    folder.mkdir()
    ledger = folder / "ledger.sqlite"
    path = folder / "policy.toml"
    path.write_text(
        f"""
[dataset]
id = "hostile-cli"
[data]
tables = {{ visits = "{data}" }}
[ledger]
path = "{ledger}"
[budget]
diagnose = false
epsilon = 10
delta = 0.000001
[tables.visits]
privacy_unit = "user_id"
max_rows_per_unit_per_group = 5
""",
        encoding="utf-8",
    )
    create_ledger(load_policy(path))
    return path


@pytest.fixture(scope="module")
def whatif_policy(data: Path) -> Path:
    return small_budget(data.parent / "what-if", data)


@pytest.fixture(scope="module")
def owner_policy(data: Path) -> Path:
    return small_budget(data.parent / "owner", data)


CLI_TEXT = st.one_of(
    NUMERIC_TEXT, st.text(max_size=30), LONG_TEXT.filter(lambda t: len(t) < 300_000)
)


def cli_ok(result: Any, codes: tuple[int, ...]) -> None:
    assert result.exit_code in codes, (result.exit_code, result.output[-300:])
    assert "Traceback" not in result.output and "internal error" not in result.output


@settings(HOSTILE, max_examples=examples(80))
@given(option=st.sampled_from(["--epsilon", "--sigma", "--delta"]), text=CLI_TEXT)
def test_cli_what_if_options(whatif_policy: Path, option: str, text: str) -> None:
    head = ["--epsilon", "0.5"] if option == "--delta" else []
    args = ["--policy", str(whatif_policy), "budget", "what-if", *head, option, text]
    with prompt(30):
        cli_ok(CliRunner().invoke(cli.cli, [*args, "--queries", "3"]), (0, 2))


@settings(HOSTILE, max_examples=examples(80))
@given(option=st.sampled_from(["--epsilon", "--delta"]), text=CLI_TEXT)
def test_cli_budget_add_options(owner_policy: Path, option: str, text: str) -> None:
    ledger = Ledger(owner_policy.parent / "ledger.sqlite")
    before = ledger.verify()
    other = "--delta" if option == "--epsilon" else "--epsilon"
    args = ["--policy", str(owner_policy), "--analyst", "owner", "budget", "add"]
    with prompt():
        added = CliRunner().invoke(cli.cli, [*args, option, text, other, "0", "--why", "fuzz"])
    cli_ok(added, (0, 2))
    assert ledger.verify() == before + (1 if added.exit_code == 0 else 0)
    with prompt():
        shared = CliRunner().invoke(
            cli.cli, [*args[:-1], "allocate", "ann", "--epsilon", text, "--why", "fuzz"]
        )
    cli_ok(shared, (0, 2))


@settings(HOSTILE, max_examples=examples(60))
@given(key=st.sampled_from(["epsilon", "delta", "max_groups_contributed", "confidence"]),
       text=TEXT.filter(lambda t: len(t) < 50_000))  # fmt: skip
def test_cli_explain_options(policy_path: Path, key: str, text: str) -> None:
    sql = f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS({key} = {sql_literal(text, True)}) {Q[7:]}"
    with prompt():
        cli_ok(CliRunner().invoke(cli.cli, ["--policy", str(policy_path), "explain", sql]), (0, 3))


# -- over the wire ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wire(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    folder = tmp_path_factory.mktemp("hostile-wire")
    dataset = write_dataset(folder / "data")
    policy, ledger = write_policy(folder, dataset, total=1000, query_epsilon="0.001")
    users = write_users(folder / "users.json")
    with ServerThread(load_policy(policy), users) as server:
        yield server.port, ledger


# Errors a client may get for a bad value: data exceptions (class 22), syntax or access
# (class 42), a feature the server does not take (0A000), or a statement over the server's
# length limit (54000, refused before parsing), or a SET value over the per-connection cap
# (53400, docs/server.md). Never XX000 or 58R01 (the engine after a
# charge), never a protocol violation (the connection must stay).
CLIENT_CLASSES = ("22", "42", "0A", "54000", "53400")


def no_nul(text: str) -> bool:
    return "\x00" not in text  # psycopg refuses it before sending (PostgreSQL text has none)


WIRE_VALUES = st.one_of(
    st.text().filter(no_nul),
    NUMERIC_TEXT.filter(no_nul),
    st.integers(),
    HUGE_INTS.filter(lambda v: abs(v) < 10**4000),
    st.floats(),
    st.decimals(allow_nan=True).filter(lambda d: not d.is_snan()),
    st.builds(Decimal, EXPONENT_TEXT),
    st.booleans(),
    st.binary(max_size=12),
    st.dates(),
    st.datetimes(),
    st.none(),
)


@settings(HOSTILE, max_examples=examples(40))
@given(sql=st.sampled_from(TEMPLATES), value=WIRE_VALUES)
def test_parameter_bound_over_the_wire(wire: tuple[int, Path], sql: str, value: Any) -> None:
    port, ledger = wire
    with wire_connect(port, "alice") as client:
        charges = sum(1 for r in Ledger(ledger).records() if r.kind == "charge")
        try:
            with prompt(30):
                client.execute(sql.replace("?", "%s"), [value]).fetchall()
        except psycopg.Error as exc:
            state = exc.sqlstate or ""
            assert state.startswith(CLIENT_CLASSES), (state, str(exc)[:200])
            assert sum(1 for r in Ledger(ledger).records() if r.kind == "charge") == charges
        assert client.execute("SELECT 1").fetchone() is not None  # the connection still works
    Ledger(ledger).verify()


@settings(HOSTILE, max_examples=examples(40))
@given(name=st.sampled_from(SETTINGS), text=TEXT.filter(lambda t: no_nul(t) and len(t) < 500_000))
def test_set_over_the_wire(wire: tuple[int, Path], name: str, text: str) -> None:
    port, ledger = wire
    with wire_connect(port, "bob") as client:
        try:
            with prompt(30):
                client.execute(f"SET dpsql.{name} = {sql_literal(text, True)}")  # type: ignore[arg-type]
        except psycopg.Error as exc:
            assert (exc.sqlstate or "").startswith(CLIENT_CLASSES), exc.sqlstate
        assert client.execute("SELECT 1").fetchone() is not None
    Ledger(ledger).verify()


# -- regressions: each bug the probing and the generated values found ---------------------------

REGRESSIONS: list[tuple[str, dict[str, Any], type[errors.DpsqlError]]] = [
    # Fraction("1e999999999") ran for minutes: every numeric setting, every exponent sign.
    ("epsilon 1e999999999", {"epsilon": "1e999999999"}, errors.ParameterError),
    ("delta 1e-999999999", {"delta": "1e-999999999"}, errors.ParameterError),
    ("rows Decimal 1e999999999", {"max_rows_per_unit_per_group": Decimal("1e999999999")},
     errors.ParameterError),
    ("sigma 1e-400: OverflowError", {**GAUSSIAN, "sigma": "1e-400"}, errors.ParameterError),
    ("sigma 1e-300: OverflowError", {**GAUSSIAN, "sigma": "1e-300"}, errors.ParameterError),
    ("rho 5e-324: ValueError of the optimizer", {**GAUSSIAN, "rho": 5e-324},
     errors.ParameterError),
    ("confidence 10**5000: OverflowError", {"confidence": 10**5000}, errors.ParameterError),
    ("fresh 10**5000: ValueError of str()", {"fresh": 10**5000}, errors.ParameterError),
    ("mechanism 10**5000: ValueError of str()", {"mechanism": 10**5000}, errors.ParameterError),
    ("full-width digit, read by Fraction", {"epsilon": "１"}, errors.ParameterError),
    ("underscores, read by Fraction", {"max_groups_per_unit": "1_0"}, errors.ParameterError),
]  # fmt: skip


@pytest.mark.parametrize(("case", "options", "error"), REGRESSIONS, ids=[r[0] for r in REGRESSIONS])
def test_regression_setting(
    session: Session, case: str, options: dict[str, Any], error: type[errors.DpsqlError]
) -> None:
    with prompt(5), pytest.raises(error):
        session.plan(Q, **options)


PARAMETER_REGRESSIONS: list[tuple[str, str, object]] = [
    ("int of 5,000 digits: ValueError of str()", "WHERE age > ?", 10**5000),
    ("Decimal 1e131071 expanded by the intervals", "", Decimal("1e131071")),
    ("Decimal 1e999999999", "", Decimal("1e999999999")),
    ("a megabyte string compared with a number: 327 s", "WHERE age > ?", "x" * 10**6),
    ("a lone surrogate", "WHERE region = ?", "\ud800"),
]


@pytest.mark.parametrize(
    ("case", "where", "value"), PARAMETER_REGRESSIONS, ids=[r[0] for r in PARAMETER_REGRESSIONS]
)
def test_regression_parameter(session: Session, case: str, where: str, value: object) -> None:
    sql = f"SELECT COUNT(*) FROM visits {where}" if where else (
        "SELECT SUM(LEAST(GREATEST(spend * ?, 0), 10)) FROM visits"
    )  # fmt: skip
    with prompt(5), pytest.raises(errors.ParameterError) as info:
        session.plan(sql, [value])
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT SUM(spend * 1e999999999) FROM visits",
        "SELECT COUNT(*) FROM visits LIMIT 1" + "0" * 5000,  # ValueError of int()
        "SELECT region, COUNT(*) FROM visits GROUP BY region ORDER BY 1e99999999",  # ValueError
        "SELECT QUANTILE(spend, 0.5e-99999999) FROM visits",
    ],
)
def test_regression_number_literal(session: Session, sql: str) -> None:
    with prompt(5), pytest.raises(errors.ParseError, match="longer than 400 digits"):
        session.plan(sql)


def test_regression_dbapi_misuse(policy_path: Path, conn: dbapi.Connection) -> None:
    with pytest.raises(dbapi.InvalidParameterError):  # TypeError: 'complex' is not iterable
        conn.cursor().executemany(Q, 1 + 0j)  # type: ignore[arg-type]
    with pytest.raises(dbapi.InvalidParameterError):  # AttributeError: no attribute 'lower'
        conn.set(123, 1)  # type: ignore[arg-type]
    cursor = conn.cursor().execute("EXPLAIN " + Q)
    with pytest.raises(dbapi.ProgrammingError):  # TypeError of the slice
        cursor.fetchmany("3")  # type: ignore[arg-type]
    # TypeError at the charge: the ledger could not hold the name as JSON.
    with pytest.raises(dbapi.InvalidParameterError):
        dbapi.connect(policy_path, analyst=object())  # type: ignore[arg-type]
    long = "x" * 90_000
    with pytest.raises(dbapi.InvalidParameterError) as info:
        conn.cursor().execute(
            f"EXPLAIN SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(privacy_unit_column = '{long}') "
            "COUNT(*) FROM visits"
        )
    assert len(str(info.value)) < 300  # the value given is cut short, not echoed whole


def test_regression_what_if_epsilon_without_precision(whatif_policy: Path) -> None:
    # decimal.DivisionByZero in the RDP curve of a scale of 1e300: exit 70 before.
    args = ["--policy", str(whatif_policy), "budget", "what-if", "--queries", "3"]
    result = CliRunner().invoke(cli.cli, [*args, "--epsilon", "1e-300"])
    cli_ok(result, (2,))
    assert "2**-56" in result.output


def test_regression_shell_ledger_count(session: Session) -> None:
    shown = Shell(session).handle("\\ledger " + "9" * 5000)  # ValueError of int() before
    assert shown.startswith("Error: ") and "internal error" not in shown


@pytest.mark.parametrize(
    "position", ["GROUP BY 1.5", "GROUP BY region ORDER BY 1e0", "GROUP BY 0", "GROUP BY 9" * 40]
)
def test_regression_position_that_is_not_an_integer(session: Session, position: str) -> None:
    # int() of the position raised ValueError for a decimal such as 1.5.
    with pytest.raises(errors.QueryError):
        session.plan(f"SELECT region, COUNT(*) FROM visits {position}")
