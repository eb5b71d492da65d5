"""Every dpsql error has its three faces, and the docs say so.

The walk starts at ``DpsqlError`` and follows ``__subclasses__()`` after importing every dpsql
module, so an error class added anywhere fails here until it has a PEP 249 class
(``dbapi._MAPPING``), an exit code (``EXIT_CODES``), a SQLSTATE (``statements._ERROR_CODES``
or ``sqlstate``) and a row in docs/errors.md, each given explicitly rather than by a fallback
(``DatabaseError``, exit code 70, ``XX000``) that would hide a forgotten class.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import dpsql
from dpsql import errors
from dpsql.interfaces.cli import main as cli
from dpsql.interfaces.cli.context import EXIT_CODES
from dpsql.interfaces.dbapi import errors as dbapi
from dpsql.interfaces.pgwire import statements

DOC = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text(encoding="utf-8")
WIRE = DOC[DOC.index("## SQLSTATEs over the wire") :]
SERVER_DOC = (Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text(
    encoding="utf-8"
)
# Conditions of the server: raised only while answering a wire-protocol statement, so they have
# a SQLSTATE (and a row in the server's table) but never reach the DB-API or the command line.
SERVER_ONLY = {
    statements.InFailedTransaction,
    statements.InsufficientPrivilege,
    statements.ConnectionLimitExceeded,
    statements.AnswerTooLarge,
}


def _tree() -> list[type[errors.DpsqlError]]:
    for module in pkgutil.walk_packages(dpsql.__path__, "dpsql."):
        importlib.import_module(module.name)
    found: list[type[errors.DpsqlError]] = []
    todo: list[type[errors.DpsqlError]] = [errors.DpsqlError]
    while todo:
        cls = todo.pop()
        # The PEP 249 classes are the DB-API's faces of the tree, not nodes of it.
        if cls in found or issubclass(cls, dbapi.Error):
            continue
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: c.__name__)


TREE = _tree()
LEAVES = [c for c in TREE if not any(s in TREE for s in c.__subclasses__())]
DPSQL_LEAVES = [c for c in LEAVES if c not in SERVER_ONLY]


def test_the_walk_finds_the_whole_tree() -> None:
    names = {c.__name__ for c in TREE}
    assert {"DpsqlError", "QueryError", "ParameterError", "EngineError", "OutputError"} <= names
    assert {"InFailedTransaction", "InsufficientPrivilege"} <= names
    # Every class of the documented tree is one of dpsql.errors' public names.
    assert {c.__name__ for c in TREE if c.__module__ == errors.__name__} == set(errors.__all__)
    # Nothing else in dpsql defines a dpsql error outside errors.py, the DB-API and the server.
    assert {c for c in TREE if c.__module__ != errors.__name__} == SERVER_ONLY


@pytest.mark.parametrize("cls", DPSQL_LEAVES, ids=lambda c: c.__name__)
def test_leaf_has_its_pep249_class(cls: type[errors.DpsqlError]) -> None:
    targets = [target for source, target in dbapi._MAPPING if source is cls]
    assert targets, f"{cls.__name__} has no PEP 249 class of its own in dbapi._MAPPING"
    mapped = dbapi._translate(cls("message"))
    assert type(mapped) is targets[0]
    assert isinstance(mapped, cls) and isinstance(
        mapped, dbapi.DatabaseError | dbapi.InterfaceError
    )
    assert str(mapped) == "message"


@pytest.mark.parametrize("cls", DPSQL_LEAVES, ids=lambda c: c.__name__)
def test_leaf_has_its_exit_code(cls: type[errors.DpsqlError]) -> None:
    # Its own entry or a parent's, but never the root's fallback for unexpected exceptions.
    assert any(parent in EXIT_CODES for parent in cls.__mro__), cls.__name__
    code = cli.exit_code(cls("message"))
    assert code != cli.EXIT_INTERNAL or cls is errors.InternalError
    assert code != cli.EXIT_OK


@pytest.mark.parametrize("cls", LEAVES, ids=lambda c: c.__name__)
def test_leaf_has_its_sqlstate(cls: type[errors.DpsqlError]) -> None:
    code = statements.sqlstate(cls("message"))
    assert re.fullmatch(r"[0-9A-Z]{5}", code)
    if cls in SERVER_ONLY:
        assert code != "XX000"
        return
    explicit = [c for source, c in statements._ERROR_CODES if source is cls]
    assert explicit == [code], f"{cls.__name__} has no SQLSTATE of its own in _ERROR_CODES"
    # XX000 says "a dpsql bug"; an engine failure after the charge is not one.
    assert code != "XX000" or cls is errors.InternalError


def test_engine_failure_has_dpsql_s_own_sqlstate() -> None:
    assert statements.sqlstate(errors.EngineError()) == statements.ENGINE_FAILED == "58R01"
    assert "58R01" in SERVER_DOC


@pytest.mark.parametrize("cls", TREE, ids=lambda c: c.__name__)
def test_class_is_documented_with_its_codes(cls: type[errors.DpsqlError]) -> None:
    code = statements.sqlstate(cls("message"))
    rows = [
        line for line in WIRE.splitlines() if line.startswith("|") and f"`{cls.__name__}`" in line
    ]
    if cls in SERVER_ONLY:
        assert rows and all(f"`{code}`" in row for row in rows), cls.__name__
        return
    assert re.search(rf"^\| `dpsql\.errors\.{cls.__name__}` \|", DOC, re.M), (
        f"docs/errors.md has no row for dpsql.errors.{cls.__name__}"
    )
    if cls in LEAVES:
        assert rows, f"docs/errors.md's SQLSTATE table has no row for {cls.__name__}"
        assert any(f"`{code}`" in row for row in rows), f"{cls.__name__}: {code} not documented"
        pep249 = next(t for s, t in dbapi._MAPPING if s is cls).__name__
        assert re.search(rf"^\| `{pep249}` \|.*`dpsql\.errors\.{cls.__name__}`", DOC, re.M), (
            f"docs/errors.md does not pair {pep249} with {cls.__name__}"
        )
