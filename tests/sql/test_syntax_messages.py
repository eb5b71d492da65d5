"""Syntax errors say where, in PostgreSQL's words (``syntax error at or near "x"``), with what
was expected when that is clear, and never the parser's internals: generated from truncations
and token drops of valid queries."""

from __future__ import annotations

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.errors import ParseError, UnsupportedQueryError
from dpsql.sql.parse import parse_statement

VALID = [
    "SELECT region, COUNT(*) AS n FROM visits WHERE age > 30 GROUP BY region ORDER BY n",
    "SELECT CASE WHEN age < 30 THEN 'young' ELSE 'old' END AS b, AVG(spend) FROM visits GROUP BY b",
    "WITH u AS (SELECT user_id, SUM(spend) AS s FROM visits GROUP BY user_id) SELECT COUNT(*) "
    "FROM u WHERE s BETWEEN 1 AND 10",
    "SELECT COUNT(DISTINCT user_id) FROM visits v JOIN regions r ON v.region = r.name",
]
INTERNALS = ("<class", "sqlglot", "Expr", "expressions.", "Required keyword", "Invalid expression")


@settings(max_examples=examples(200), deadline=None)
@given(query=st.sampled_from(VALID), data=st.data())
def test_a_broken_query_is_a_plain_syntax_error(query: str, data: st.DataObject) -> None:
    words = query.split()
    cut = data.draw(st.integers(1, len(words) - 1))
    drop = data.draw(st.integers(0, len(words) - 1))
    for text in (" ".join(words[:cut]), " ".join(w for i, w in enumerate(words) if i != drop)):
        try:
            parse_statement(text)
        except ParseError as exc:
            message = str(exc)
            assert message.startswith(("syntax error", "cannot read", "send exactly")), message
            assert not any(word in message for word in INTERNALS), message
        except UnsupportedQueryError:
            pass  # valid SQL dpsql does not answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SELECT COUNT(* FROM visits", 'syntax error at or near "FROM"; expected )'),
        ("SELECT a != FROM t", 'at or near "FROM"; the comparison is incomplete'),
        ("SELECT * FROM visits WHERE", "the WHERE clause is incomplete"),
        ("SELECT CASE WHEN x THEN 1 FROM t", "expected END after CASE"),
    ],
)
def test_known_mistakes_say_what_is_missing(text: str, expected: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_statement(text)
    assert expected in str(info.value)
    assert info.value.line == 1 and info.value.column is not None
