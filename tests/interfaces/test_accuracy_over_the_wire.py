"""The ± columns over the wire with no SET beforehand: the policy's ``server.accuracy_columns``
for every connection, or a client's startup ``options=-c dpsql.accuracy_columns=on`` (one
``pandas.read_sql`` then gets them); and the parsing of that startup parameter.

What must hold:

- with either, a single ``read_sql`` through SQLAlchemy returns ``<name> ±`` columns, and the
  value columns are the release's (the cache serves the same answer with and without them);
- a client's option wins over the policy's (``=off``), per connection;
- a malformed option or a bad value refuses the connection with SQLSTATE 22023 and a message
  that names the setting, never its value, and nothing is charged; options for settings
  dpsql does not have (a driver's ``search_path``) are ignored;
- the option parser reads PostgreSQL's forms (``-c a=b``, ``-ca=b``, ``--a=b``, backslash
  escapes), for generated names and values.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg
import pytest
import sqlalchemy
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from server_fixtures import (
    PASSWORDS,
    ServerThread,
    connect,
    records,
    write_dataset,
    write_policy,
    write_users,
)

from dpsql.errors import ParameterError
from dpsql.interfaces.pgwire.worker_process import startup_settings

GROUPED = "SELECT region, COUNT(*) AS n FROM visits WHERE age > 40 GROUP BY region"


def _engine(server: ServerThread, user: str, options: str | None = None) -> Any:
    url = f"postgresql+psycopg://{user}:{PASSWORDS[user]}@127.0.0.1:{server.port}/visits"
    args = {"sslmode": "disable"}
    if options is not None:
        args["options"] = options
    return sqlalchemy.create_engine(url, connect_args=args)


def _serve(tmp_path: Path, policy_extra: str = "") -> ServerThread:
    dataset = write_dataset(tmp_path / "data")
    users = write_users(tmp_path / "users.json")
    policy, _ = write_policy(tmp_path / "server", dataset)
    if policy_extra:
        policy.write_text(policy.read_text(encoding="utf-8") + policy_extra, encoding="utf-8")
    return ServerThread(policy, users)


def test_a_startup_option_gives_read_sql_its_accuracy_columns(tmp_path: Path) -> None:
    with _serve(tmp_path) as server:
        engine = _engine(server, "bob", "-c dpsql.accuracy_columns=on -c search_path=public")
        plain = _engine(server, "alice")
        try:
            frame = pd.read_sql(GROUPED, engine)
            bare = pd.read_sql(GROUPED, plain)
        finally:
            engine.dispose()
            plain.dispose()
    assert list(frame.columns) == ["region", "n", "n ±", "n noise"]
    assert (frame["n ±"] > 0).all() and frame["n noise"].dtype == bool
    assert list(bare.columns) == ["region", "n"]
    # The same release, served again to the other connection: equal values.
    assert list(frame["n"]) == list(bare["n"])


def test_the_policy_turns_them_on_and_a_client_turns_them_off(tmp_path: Path) -> None:
    with _serve(tmp_path, "\n[server]\naccuracy_columns = true\n") as server:
        engine = _engine(server, "bob")
        off = _engine(server, "alice", "--dpsql.accuracy_columns=off")
        try:
            frame = pd.read_sql(GROUPED, engine)
            bare = pd.read_sql(GROUPED, off)
        finally:
            engine.dispose()
            off.dispose()
    assert list(frame.columns) == ["region", "n", "n ±", "n noise"]
    assert list(bare.columns) == ["region", "n"]


@pytest.mark.parametrize(
    "options",
    [
        "-c dpsql.accuracy_columns=maybe",
        "-c dpsql.no_such_setting=1",
        "-c",
        "dpsql.accuracy_columns=on",
        "-c dpsql.epsilon=99999",
    ],
)
def test_a_bad_option_refuses_the_connection_and_charges_nothing(
    tmp_path: Path, options: str
) -> None:
    with _serve(tmp_path) as server:
        ledger = Path(server.policy.ledger.path)  # type: ignore[union-attr]
        before = len(records(ledger))
        with pytest.raises(psycopg.OperationalError) as caught:
            connect(server.port, "bob", options=options).close()
        assert len(records(ledger)) == before
        with connect(server.port, "bob") as conn:  # the server still serves
            assert conn.execute("SELECT current_user").fetchone() == ("bob",)
    text = str(caught.value)
    assert "FATAL:" in text and ("startup option" in text or "dpsql." in text or "must" in text)
    for secret in ("maybe", "99999"):
        assert secret not in text


words = st.text(
    alphabet=st.characters(codec="ascii", categories=("L", "N")) | st.sampled_from("_-.,'"),
    min_size=1,
    max_size=12,
)


@settings(max_examples=examples(200))
@given(
    pairs=st.lists(st.tuples(words, st.text(max_size=12)), max_size=4),
    form=st.sampled_from(["-c ", "-c", "--"]),
)
def test_the_option_parser_reads_postgres_forms(pairs: list[tuple[str, str]], form: str) -> None:
    def escape(text: str) -> str:
        return re.sub(r"(\s|\\)", r"\\\1", text)

    names = [("dpsql." + n if i % 2 == 0 else n) for i, (n, _) in enumerate(pairs)]
    names = [n for n in names if "=" not in n]
    kept = [(n, v) for n, (_, v) in zip(names, pairs, strict=False)]
    options = " ".join(f"{form}{escape(n)}={escape(v)}" for n, v in kept)
    if form == "--":
        kept = [(n, v) for n, v in kept if not n.startswith("-")]
        options = " ".join(f"--{escape(n)}={escape(v)}" for n, v in kept)
    if form == "-c":
        kept = [(n, v) for n, v in kept if not n.startswith("-")]
        options = " ".join(f"-c{escape(n)}={escape(v)}" for n, v in kept)
    want = tuple(
        (n.lower().replace("-", "_")[len("dpsql.") :], v)
        for n, v in kept
        if n.lower().replace("-", "_").startswith("dpsql.")
    )
    assert startup_settings(options) == want


def test_the_option_parser_refuses_what_is_not_an_option() -> None:
    for bad in ("-c", "accuracy_columns=on", "-c novalue", "-c x=1 \\"):
        with pytest.raises(ParameterError) as caught:
            startup_settings(bad)
        assert "novalue" not in str(caught.value)
    assert startup_settings("") == ()
    assert startup_settings("  -c  dpsql.Accuracy-Columns=on  ") == (("accuracy_columns", "on"),)
