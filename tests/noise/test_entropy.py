"""No seed, no fallback: without secure randomness every noisy query fails closed.

Fail-closed keeps the charge: the budget admitted the query and the engine ran before the
noise was drawn, so the bounded totals were computed; refunding the charge would make the
spent budget depend on whether the randomness source failed after the data was touched, and a
crash after the charge must lose budget, never privacy (DESIGN.md section 2).
"""

from __future__ import annotations

import inspect
import os
import secrets
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import pytest

import dpsql as dbapi
from dpsql import errors
from dpsql.mechanisms import gaussian as gaussian_maths
from dpsql.mechanisms import laplace as laplace_maths
from dpsql.mechanisms.gaussian import discrete_gaussian_half_width
from dpsql.mechanisms.laplace import discrete_laplace_half_width
from dpsql.noise import bits, gaussian, laplace
from dpsql.noise.bits import uniform_integers
from dpsql.noise.gaussian import discrete_gaussian
from dpsql.noise.laplace import discrete_laplace
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session

REGIONS = ["east", "west"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("entropy") / "visits.parquet"
    con = duckdb.connect()
    con.execute(
        f"""COPY (SELECT (i % 100)::BIGINT AS user_id, {REGIONS}[1 + i % 2] AS region,
            (18 + i % 60)::INTEGER AS age, (i % 100)::DOUBLE AS spend
            FROM range(500) r(i)) TO '{path}' (FORMAT parquet)"""
    )
    con.close()
    return path


def raw(data: Path) -> dict[str, Any]:
    return {
        "dataset": {"id": "entropy"},
        "data": {"tables": {"visits": str(data)}},
        "budget": {
            "diagnose": False,
            "epsilon": "10",
            "delta": "1e-6",
            "query_epsilon": "0.5",
            "query_delta": "1e-8",
        },
        "tables": {
            "visits": {
                "privacy_unit": "user_id",
                "max_groups_per_unit": 1,
                "max_rows_per_unit_per_group": 5,
                "columns": {
                    "age": {"lower": 18, "upper": 90},
                    "spend": {"lower": 0, "upper": 200},
                    "region": {"public_values": REGIONS},
                },
            }
        },
    }


@pytest.fixture
def policy(data: Path) -> Policy:
    return load_policy(raw(data), base_dir=data.parent)


class NoEntropyError(OSError):
    pass


def _fail(*args: object, **kwargs: object) -> Any:
    raise NoEntropyError("no randomness")


@pytest.fixture
def no_entropy(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call it to take away every source of randomness dpsql could reach."""

    def cut() -> None:
        monkeypatch.setattr(os, "urandom", _fail)
        for name in ("token_bytes", "token_hex", "token_urlsafe", "randbits", "randbelow"):
            monkeypatch.setattr(secrets, name, _fail)
        monkeypatch.setattr(secrets, "choice", _fail)
        monkeypatch.setattr(secrets.SystemRandom, "random", _fail)
        monkeypatch.setattr(secrets.SystemRandom, "getrandbits", _fail)

    return cut


NOISY = [
    "SELECT COUNT(*) FROM visits",
    "SELECT SUM(spend) FROM visits",
    "SELECT AVG(age) FROM visits WHERE spend > 10",
    "SELECT COUNT(DISTINCT user_id) FROM visits",
    "SELECT region, COUNT(*), AVG(spend) FROM visits GROUP BY region",
    "SELECT age, COUNT(*) FROM visits GROUP BY age",  # private keys: partition selection
]


@pytest.fixture
def session(policy: Policy) -> Iterator[Session]:
    s = Session(policy)
    yield s
    s.close()


@pytest.mark.parametrize("sql", NOISY)
def test_noisy_query_fails_closed_and_keeps_the_charge(
    session: Session, no_entropy: Callable[[], None], sql: str
) -> None:
    plan = session.plan(sql)
    no_entropy()
    with pytest.raises(errors.EntropyError) as info:
        session.execute(sql)
    assert type(info.value) is errors.EntropyError
    assert info.value.__cause__ is None
    report = session.budget()
    assert report.queries == 1
    assert report.epsilon_spent == plan.epsilon == Fraction(1, 2)
    assert report.delta_spent == plan.delta


@pytest.mark.parametrize("sql", NOISY[:3])
def test_noisy_query_fails_closed_through_the_dbapi(
    policy: Policy, no_entropy: Callable[[], None], sql: str
) -> None:
    conn = dbapi.connect(policy)
    cursor = conn.cursor()
    cursor.execute("SELECT COUNT(*) FROM visits")  # randomness works: a result is held
    no_entropy()
    with pytest.raises(dbapi.OperationalError) as info:
        cursor.execute(sql, fresh=True)  # a repeat would be served from the cache, noise-free
    assert type(info.value) is dbapi.EntropyFailure
    assert isinstance(info.value, errors.EntropyError)
    # No rows: the previous result is gone too.
    assert cursor.description is None
    with pytest.raises(dbapi.ProgrammingError):
        cursor.fetchall()
    assert conn.budget().epsilon_spent == 1  # both charges stand
    assert conn.budget().queries == 2


def test_a_later_query_fails_closed_again(session: Session, no_entropy: Callable[[], None]) -> None:
    no_entropy()
    for _ in range(3):
        with pytest.raises(errors.EntropyError):
            session.execute("SELECT COUNT(*) FROM visits")
    assert session.budget().epsilon_spent == Fraction(3, 2)


def test_noise_free_statements_work_without_entropy(
    session: Session, no_entropy: Callable[[], None]
) -> None:
    no_entropy()
    result = session.execute("EXPLAIN SELECT SUM(spend) FROM visits")
    assert result.rows
    session.execute("SET dpsql.epsilon = 0.25")
    assert session.execute("SHOW dpsql.epsilon").rows == (("0.25",),)
    assert session.budget().queries == 0


def test_session_needs_entropy_to_open(policy: Policy, no_entropy: Callable[[], None]) -> None:
    no_entropy()
    with pytest.raises(errors.EntropyError):
        Session(policy)
    with pytest.raises(dbapi.EntropyFailure):
        dbapi.connect(policy)


def test_sampler_fails_closed(no_entropy: Callable[[], None]) -> None:
    no_entropy()
    with pytest.raises(errors.EntropyError):
        discrete_laplace(Fraction(3), 5)


def test_short_read_fails_closed(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.urandom
    monkeypatch.setattr(os, "urandom", lambda n: real(max(n - 1, 0)))
    with pytest.raises(errors.EntropyError):
        session.execute("SELECT COUNT(*) FROM visits")


def test_numpy_and_random_generators_are_not_used(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only os.urandom may feed the noise: break every other generator and query normally.
    import random

    import numpy as np

    monkeypatch.setattr(np.random, "default_rng", _fail)
    monkeypatch.setattr(np.random, "laplace", _fail)
    monkeypatch.setattr(np.random, "random", _fail)
    monkeypatch.setattr(random, "random", _fail)
    monkeypatch.setattr(random, "getrandbits", _fail)
    monkeypatch.setattr(random, "randint", _fail)
    result = session.execute("SELECT region, COUNT(*), AVG(spend) FROM visits GROUP BY region")
    assert len(result.rows) == len(REGIONS)


# -- no seed anywhere --------------------------------------------------------------------------

SEEDLIKE = ("seed", "rng", "random_state", "randomstate", "generator", "entropy")


def _seedlike(fn: Callable[..., Any]) -> list[str]:
    names = inspect.signature(fn).parameters
    return [n for n in names if any(word in n.lower() for word in SEEDLIKE)]


@pytest.mark.parametrize(
    "fn",
    [
        dbapi.connect,
        dbapi.Connection.__init__,
        dbapi.Connection.cursor,
        dbapi.Cursor.execute,
        dbapi.Cursor.executemany,
        Session.__init__,
        Session.execute,
        Session.plan,
        Session.set_option,
        discrete_laplace,
        discrete_laplace_half_width,
        discrete_gaussian,
        discrete_gaussian_half_width,
        uniform_integers,
        load_policy,
    ],
    ids=lambda fn: fn.__qualname__,
)
def test_no_api_accepts_a_seed(fn: Callable[..., Any]) -> None:
    assert _seedlike(fn) == []


def test_no_seed_in_module_state() -> None:
    for module in (bits, laplace, gaussian, laplace_maths, gaussian_maths):
        names = [n for n in vars(module) if any(w in n.lower() for w in ("seed", "rng"))]
        assert names == []


@pytest.mark.parametrize("key", ["seed", "random_seed", "rng"])
def test_policy_with_a_seed_is_rejected(data: Path, key: str) -> None:
    for where in ("top", "budget", "table"):
        policy = raw(data)
        target = {"top": policy, "budget": policy["budget"], "table": policy["tables"]["visits"]}
        target[where][key] = 42
        with pytest.raises(errors.PolicyError, match=key):
            load_policy(policy, base_dir=data.parent)


@pytest.mark.parametrize(
    "statement",
    ["SET dpsql.seed = 42", "SET dpsql.seed TO 42", "SET dpsql.random_seed = 1", "SET seed = 1"],
)
def test_set_seed_is_rejected(session: Session, statement: str) -> None:
    with pytest.raises((errors.ParameterError, errors.UnsupportedQueryError)):
        session.execute(statement)
    with pytest.raises(errors.ParameterError):
        session.set_option("seed", 42)
    with pytest.raises(errors.ParameterError):
        session.execute("SELECT COUNT(*) FROM visits", seed=42)
    assert session.budget().queries == 0


def test_set_seed_through_the_dbapi(policy: Policy) -> None:
    with dbapi.connect(policy) as conn:
        with pytest.raises(dbapi.InvalidParameterError):
            conn.cursor().execute("SET dpsql.seed = 42")
        with pytest.raises(dbapi.InvalidParameterError):
            conn.set("seed", 42)
        with pytest.raises(dbapi.InvalidParameterError):
            conn.cursor().execute("SELECT COUNT(*) FROM visits", seed=42)


def test_no_seed_environment_variable(
    session: Session, monkeypatch: pytest.MonkeyPatch, no_entropy: Callable[[], None]
) -> None:
    for name in ("DPSQL_SEED", "PYTHONHASHSEED", "DPSQL_RANDOM_SEED"):
        monkeypatch.setenv(name, "0")
    no_entropy()
    with pytest.raises(errors.EntropyError):
        session.execute("SELECT COUNT(*) FROM visits")
