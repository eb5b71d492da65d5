"""The allow-list of functions in the free catalog queries of ``dpsql serve``.

A catalog query costs nothing, so a function that makes rows or width out of nothing would let an
analyst fill the server's memory for free. Each amplifier is refused however it is written
(nested, aliased, in a subquery, a CTE, a LATERAL, as a table function, quoted, schema-qualified,
in another case), with a typed error that names the function; the aggregates recorded clients
need are cut to their bounds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from server_fixtures import ServerThread, connect, records, write_dataset, write_policy, write_users

from dpsql import errors
from dpsql.interfaces.pgwire.catalog import Catalog
from dpsql.interfaces.pgwire.catalog_bounds import MAX_ELEMENTS, MAX_TEXT
from dpsql.interfaces.pgwire.catalog_objects import CATALOG_FUNCTIONS
from dpsql.interfaces.pgwire.catalog_rewrite import catalog_sql
from dpsql.interfaces.pgwire.statements import public_settings

SETTINGS = public_settings("alice", "visits")

AMPLIFIERS = [
    ("generate_series", "SELECT generate_series(1, 100000) FROM pg_class"),
    ("generate_series", "SELECT relname FROM pg_class, generate_series(1, 100000) g"),
    ("generate_series", "SELECT * FROM pg_catalog.generate_series(1, 100000) s(n), pg_class"),
    ("generate_series", 'SELECT "generate_series"(1, 1000000) FROM pg_class'),
    ("generate_series", "SELECT PG_CATALOG.GENERATE_SERIES(1, 99999) FROM pg_class"),
    ("generate_series", "SELECT GeNeRaTe_SeRiEs(1, 1601) AS n FROM pg_catalog.pg_type"),
    ("generate_series", "SELECT x FROM pg_class, LATERAL generate_series(1, 10 ^ 6) x"),
    ("generate_series", "SELECT generate_series(1, oid * 1000) FROM pg_class"),
    ("generate_series", "SELECT generate_series(1, (SELECT count(*) FROM pg_proc)) FROM pg_am"),
    ("generate_series", "WITH s AS (SELECT generate_series(1, 100000) n) SELECT n FROM s, pg_am"),
    ("generate_series", "SELECT (SELECT max(g) FROM generate_series(1, 100000) g) FROM pg_am"),
    ("md5", "SELECT md5(relname) FROM pg_class"),
    ("md5", "SELECT m FROM (SELECT pg_catalog.md5(relname) AS m FROM pg_class) t"),
    ("md5", 'SELECT "md5"(version())'),
    ("md5", "SELECT upper(lower(MD5(relname))) FROM pg_catalog.pg_class"),
    ("repeat", "SELECT repeat(relname, 100000) FROM pg_class"),
    ("repeat", "SELECT repeat('x', 1000000), version()"),
    ("lpad", "SELECT lpad(relname, 1000000, 'x') FROM pg_class"),
    ("rpad", "SELECT rpad(relname, 1000000) FROM pg_class"),
    ("range", "SELECT range(1, 1000000) FROM pg_class"),
    ("range", "SELECT relname FROM pg_class WHERE oid IN (SELECT unnest(range(100000)))"),
    ("string_to_array", "SELECT string_to_array(relname, '') FROM pg_class"),
    ("json_agg", "SELECT json_agg(a) FROM pg_attribute a, pg_attribute b"),
    ("list_value", "SELECT list_value(1, 2) FROM pg_am"),
    ("regexp_replace", "SELECT regexp_replace(relname, '.', repeat('x', 9), 'g') FROM pg_class"),
]


@pytest.mark.parametrize(("name", "query"), AMPLIFIERS)
def test_amplifiers_are_refused_by_name(name: str, query: str) -> None:
    with pytest.raises(errors.UnsupportedQueryError) as info:
        catalog_sql(query, SETTINGS)
    assert name in str(info.value)


def test_the_refusal_does_not_depend_on_where_the_catalog_is_named() -> None:
    """The function before the catalog function that makes the query a catalog one."""
    with pytest.raises(errors.UnsupportedQueryError, match="md5"):
        catalog_sql("SELECT md5('a'), version()", SETTINGS)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM pg_catalog.generate_series(1, 32) pos(n), pg_am",  # the JDBC driver's
        "SELECT generate_series(0, pg_catalog.array_upper(indkey::pg_catalog.int2[], 1)) "
        "FROM pg_catalog.pg_index",  # psql's
        "SELECT generate_series(-1600, 1600) FROM pg_am",
    ],
)
def test_bounded_series_are_answered(query: str) -> None:
    assert catalog_sql(query, SETTINGS) is not None


def test_every_function_of_the_allow_list_is_named_for_a_reason() -> None:
    assert all(CATALOG_FUNCTIONS.values())
    for amplifier in ("md5", "repeat", "lpad", "rpad", "range", "json_agg", "pg_sleep"):
        assert amplifier not in CATALOG_FUNCTIONS


def test_aggregates_over_big_inputs_are_cut_to_their_bounds() -> None:
    """array_agg, ARRAY(SELECT ...) and string_agg over a cross join of catalog relations: an
    answer no wider than the bounds, whatever the join."""
    catalog = Catalog({"visits": {f"c{i}": "BIGINT" for i in range(60)}})
    try:
        for query, bound in (
            ("SELECT array_agg(a.attname) FROM pg_attribute a, pg_attribute b", MAX_ELEMENTS),
            ("SELECT ARRAY(SELECT a.attname FROM pg_attribute a, pg_attribute b)", MAX_ELEMENTS),
            ("SELECT cardinality(array_agg(a.attnum)) FROM pg_attribute a, pg_attribute b", None),
            ("SELECT string_agg(a.attname || b.attname, ',') FROM pg_attribute a, "
             "pg_attribute b", MAX_TEXT),
        ):  # fmt: skip
            rewritten = catalog_sql(query, SETTINGS)
            assert rewritten is not None
            _, rows = catalog.answer(rewritten[0], None)
            ((value,),) = rows
            if bound is None:
                assert value <= MAX_ELEMENTS
            else:
                assert 0 < len(value) <= bound
        # Wider still, the catalog connection's memory cap ends it first, with a typed refusal.
        wider = catalog_sql(
            "SELECT string_agg(a.attname || b.attname, ',') FROM pg_attribute a, pg_attribute b, "
            "pg_attribute c",
            SETTINGS,
        )
        assert wider is not None
        with pytest.raises(errors.UnsupportedQueryError, match="Out of Memory"):
            catalog.answer(wider[0], None)
    finally:
        catalog.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    folder = tmp_path_factory.mktemp("allow")
    data = write_dataset(folder / "data", 300)
    policy, _ = write_policy(folder / "policy", data)
    with ServerThread(policy, write_users(folder / "users.json")) as server:
        yield server


@pytest.mark.parametrize(("name", "query"), AMPLIFIERS[::4])
def test_over_the_wire_an_amplifier_is_refused_free(
    served: ServerThread, name: str, query: str
) -> None:
    ledger = Path(served.policy.ledger.path)  # type: ignore[union-attr]
    before = records(ledger)
    with connect(served.port, "alice") as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(query)
        assert info.value.sqlstate == "0A000"
        assert name in (info.value.diag.message_primary or "")
        assert conn.execute("SELECT current_user").fetchone() == ("alice",)
    assert records(ledger) == before
