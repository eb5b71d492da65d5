"""Which statements ``dpsql serve`` answers from its synthetic catalog, rewritten for DuckDB.

A statement is a catalog query only if every relation it reads is a catalog one (``pg_catalog``,
``information_schema``, an unqualified ``pg_*`` name, or its own CTE) and every function it calls
is a catalog or plain scalar function (``_FUNCTIONS``; no table functions, no ``pg_sleep``).
Anything that names a policy table, or any other relation, is not: it goes to the DP pipeline,
which answers it with noise or refuses it. The PostgreSQL spellings clients use are rewritten
for DuckDB on the AST (``OPERATOR(pg_catalog.~)``, ``COLLATE pg_catalog.default``, ``::regclass``,
schema-qualified function names); ``version()``, ``current_user`` and ``current_database()`` give
the server's public settings.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError as GlotParseError
from sqlglot.errors import TokenError

from dpsql import errors
from dpsql.interfaces.pgwire.catalog_bounds import (
    capped,
    check_series,
    format_call,
    setting_call,
)
from dpsql.interfaces.pgwire.catalog_objects import (
    _AUGMENTED,
    _CONSTANT_RELATIONS,
    _DATABASE,
    _DUCKDB_RELATIONS,
    _EMPTY_RELATIONS,
    _FUNCTIONS,
    _INFORMATION_SCHEMA,
    _NO_DEFINITIONS,
    _SET_FUNCTIONS,
    CATALOG_SCHEMAS,
    SETTINGS_COLUMNS,
)
from dpsql.sql.parse import MAX_QUERY_LENGTH

# sqlglot parses these to typed nodes whose names differ from the SQL's: their SQL names.
_NODE_NAMES: Mapping[type[exp.Expression], str] = {
    exp.ArrayAgg: "array_agg", exp.GroupConcat: "string_agg", exp.ArrayToString: "array_to_string",
    exp.StrPosition: "position", exp.ArraySize: "array_length", exp.CurrentTimestamp: "now",
    exp.CurrentDate: "current_date", exp.CurrentSchema: "current_schema",
    exp.CurrentUser: "current_user", exp.RegexpLike: "regexp_matches", exp.Explode: "unnest",
    exp.Unnest: "unnest", exp.RowNumber: "row_number", exp.If: "if",
    exp.Cast: "cast", exp.TryCast: "try_cast", exp.Array: "array", exp.Coalesce: "coalesce",
    exp.Nullif: "nullif", exp.RegexpILike: "regexp_matches", exp.StrPosition: "position",
    exp.Case: "case", exp.ExplodingGenerateSeries: "generate_series",
    exp.GenerateSeries: "generate_series", exp.CurrentVersion: "version",
    exp.CurrentCatalog: "current_catalog", exp.MD5: "md5", exp.Repeat: "repeat",
}  # fmt: skip
_OPERATORS: Mapping[str, Callable[[exp.Expression, exp.Expression], exp.Expression]] = {
    "~": lambda a, b: exp.RegexpLike(this=a, expression=b),
    "!~": lambda a, b: exp.Not(this=exp.RegexpLike(this=a, expression=b)),
    "~*": lambda a, b: exp.RegexpILike(this=a, expression=b),
    "!~*": lambda a, b: exp.Not(this=exp.RegexpILike(this=a, expression=b)),
    "~~": lambda a, b: exp.Like(this=a, expression=b),
    "!~~": lambda a, b: exp.Not(this=exp.Like(this=a, expression=b)),
    "=": lambda a, b: exp.EQ(this=a, expression=b),
    "<>": lambda a, b: exp.NEQ(this=a, expression=b),
}


_BOUNDED = frozenset({"string_agg", "array_to_string", "replace", "concat", "concat_ws",
                      "array_agg", "array"})  # fmt: skip


class NotCatalog(Exception):  # noqa: N818 - control flow: the statement is not a catalog one
    """The statement reads something that is not a catalog relation."""


def catalog_sql(text: str, settings: Mapping[str, str]) -> tuple[str, list[int]] | None:
    """The DuckDB SQL that answers ``text`` from the synthetic catalog, and for each of its
    ``$k`` the 0-based index of the ``$n`` of ``text`` it stands for (a rewrite may drop a
    parameter: the argument of a definition the catalog never has); or None when ``text`` is
    not a catalog query (it then goes to the DP pipeline). Raises ``UnsupportedQueryError`` for
    a catalog query dpsql cannot answer (a catalog relation or function it does not provide)."""
    if len(text) > MAX_QUERY_LENGTH:
        return None  # the pipeline refuses it unparsed, whatever it names
    lowered = text.lower()
    if not any(
        word in lowered
        for word in ("pg_", "information_schema", "version", "current_", "session_user")
    ):
        return None  # cheap: an ordinary query never parses twice
    try:
        tree = sqlglot.parse_one(text, read="postgres")
    except (GlotParseError, TokenError, RecursionError, ValueError):
        return None
    if not isinstance(tree, exp.Query):
        return None
    try:
        _classify(tree)
        rewritten = _rewrite(tree, settings)
        used = _renumber(rewritten)
        return rewritten.sql(dialect="duckdb"), used
    except NotCatalog:
        return None
    except RecursionError:
        raise errors.UnsupportedQueryError("the catalog query is nested too deeply") from None


def _renumber(tree: exp.Expr) -> list[int]:
    """Number the ``$n`` left in ``tree`` 1, 2, ... in order; the original index of each."""
    used: list[int] = []
    for node in tree.find_all(exp.Parameter):
        if isinstance(node.this, exp.Literal) and not node.this.is_string:
            used.append(int(node.this.name) - 1)
            node.set("this", exp.Literal.number(len(used)))
    return used


def _classify(tree: exp.Expr) -> None:
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    catalog = False
    for table in tree.find_all(exp.Table):
        name, schema = table.name.lower(), table.db.lower()
        if isinstance(table.this, exp.Func) and _function_name(table.this) in _SET_FUNCTIONS:
            continue  # unnest(...) of a catalog array: its values come from the query
        if not name or not isinstance(table.this, exp.Identifier):
            raise NotCatalog  # another table function, or an expression in FROM
        if table.catalog:
            raise NotCatalog
        if not schema and name in ctes:
            continue
        if schema in CATALOG_SCHEMAS or (not schema and name.startswith("pg_")):
            catalog = True
            continue
        raise NotCatalog
    calls = [
        (node, _function_name(node))
        for node in tree.find_all(exp.Func)
        if not isinstance(node, exp.Binary | exp.Unary | exp.Connector | exp.Predicate)
    ]  # an operator (AND, COLLATE, ~, EXISTS): sqlglot types some as functions
    catalog = catalog or any(
        name.startswith("pg_") or name in _CATALOG_MARKERS for _, name in calls
    )
    for column in tree.find_all(exp.Column):  # current_user, current_schema written bare
        if not column.table and column.name.lower() in ("current_user", "session_user", "user"):
            catalog = True
    if not catalog:
        raise NotCatalog
    for node, name in calls:
        # A catalog query is free: a function off the allow-list could make its answer as large
        # as the analyst likes (generate_series, repeat, md5 of many rows). Named, never a value.
        if name not in _FUNCTIONS:
            written = node.sql(dialect="postgres").split("(")[0].split(".")[-1].strip('"')
            raise errors.UnsupportedQueryError(
                f"the function {written.lower() or name} is not allowed in a catalog query of "
                "dpsql serve"
            )
        if name == "generate_series":
            check_series(node, _function_name)


# DBeaver's first statement on a connection is ``SELECT current_schema(),session_user``.
_CATALOG_MARKERS = frozenset({"version", "current_database", "current_catalog", "format_type",
                              "current_setting", "current_schema", "current_user",
                              "session_user"})  # fmt: skip


def _function_name(node: exp.Func) -> str:
    """The lower-case SQL name of a function node (sqlglot's typed nodes by their SQL name)."""
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    if isinstance(node, exp.Pad):
        return "lpad" if node.args.get("is_left") else "rpad"
    for cls, name in _NODE_NAMES.items():
        if isinstance(node, cls):
            return name
    return str(node.sql_name()).lower()


def _named(tree: exp.Expr) -> None:
    """Name each unnamed function call of a select list as PostgreSQL does (by the function's
    name), before the rewrite replaces it by a constant or a macro of another name."""
    for select in tree.find_all(exp.Select):
        named = []
        for item in select.expressions:
            call = item.expression if isinstance(item, exp.Dot) else item
            if isinstance(call, exp.Func) and not isinstance(call, exp.Binary | exp.Connector):
                named.append(exp.alias_(item, _function_name(call), quoted=True))
            else:
                named.append(item)
        select.set("expressions", named)


def _rewrite(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    _named(tree)
    user = settings["session_authorization"]
    constants: dict[str, str] = {
        "version": f"PostgreSQL {settings['server_version']}",
        "current_database": settings["database"],
        "current_catalog": settings["database"],
        "current_user": user,
        "session_user": user,
        "user": user,
    }

    def fix(node: Any) -> Any:
        if (
            isinstance(node, exp.Dot)
            and isinstance(node.this, exp.Identifier)
            and node.this.name.lower() in CATALOG_SCHEMAS
            and not isinstance(node.expression, exp.Identifier)
        ):
            return node.expression  # pg_catalog.f(...) -> f(...), rewritten already
        if isinstance(node, exp.Operator):
            op = str(node.args.get("operator", "")).split(".")[-1]
            make = _OPERATORS.get(op)
            if make is None:
                raise errors.UnsupportedQueryError(f"the operator {op} is not available")
            return make(node.this, node.expression)
        if isinstance(node, exp.Collate):
            return node.this
        if isinstance(node, exp.Cast):
            return _cast(node)
        if isinstance(node, exp.Func):
            name = _function_name(node)
            if name == "format":
                return capped(format_call(node), name)
            if name == "current_setting":
                return setting_call(node, settings)
            if name == "_pg_expandarray":  # a row per element of an array the query names
                expanded = exp.Anonymous(this="dpsql_expandarray", expressions=node.expressions)
                return exp.Anonymous(this="unnest", expressions=[expanded])
            if name in _BOUNDED:
                return capped(node, name)
            if name in constants:
                return exp.Literal.string(constants[name])
            if name in ("pg_relation_size", "pg_total_relation_size", "pg_table_size",
                        "pg_indexes_size", "pg_database_size", "pg_stat_get_numscans"):  # fmt: skip
                return exp.Literal.number(0)
            if name in ("to_regtype", "to_regclass") and node.expressions:
                table, column = ("pg_type", "typname") if name == "to_regtype" else (
                    "pg_class", "relname"
                )  # fmt: skip
                return exp.select("oid").from_(f"pg_catalog.{table}").where(
                    exp.EQ(this=exp.column(column), expression=node.expressions[0])
                ).limit(1).subquery()  # fmt: skip
            if name == "format_type":
                return exp.Anonymous(this="dpsql_format_type", expressions=node.expressions)
            if name == "pg_table_is_visible" and node.expressions:
                # Visible on the search path (main): not DuckDB's own catalog views.
                visible = sqlglot.parse_one(
                    "SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE n.nspname = 'main'",
                    read="duckdb",
                )
                return exp.In(this=node.expressions[0], query=exp.Subquery(this=visible))
            if name == "quote_ident":
                return exp.Anonymous(this="dpsql_quote_ident", expressions=node.expressions)
            if name == "json_build_object":  # DuckDB's name for it
                return exp.Anonymous(this="json_object", expressions=node.expressions)
            if name in _NO_DEFINITIONS:  # no default, constraint, index, view or sequence
                return exp.cast(exp.Null(), exp.DataType.Type.VARCHAR)
            if name == "pg_get_userbyid":
                return exp.Literal.string(user)
            if name == "pg_relation_is_publishable":
                return exp.false()
            if name == "pg_conversion_is_visible":
                return exp.true()
            if name == "pg_tablespace_location":
                return exp.Literal.string("")
            if name in ("array_upper", "array_lower") and node.expressions:
                # PostgreSQL arrays here start at 1 and have one dimension.
                first = node.expressions[0]
                if name == "array_lower":
                    return exp.If(this=first.is_(exp.null()).not_(), true=exp.Literal.number(1))
                return exp.Anonymous(this="array_length", expressions=[first])
            if name == "pg_encoding_to_char":
                return exp.Literal.string("UTF8")
            if name == "pg_backend_pid":
                return exp.Literal.number(0)
        if (
            isinstance(node, exp.Column)
            and not node.table
            and node.name.lower() in ("current_user", "session_user", "user")
        ):
            return exp.Literal.string(user)
        if isinstance(node, exp.Column) and node.args.get("db") is not None:
            # pg_catalog.t.c -> t.c: DuckDB does not resolve a schema-qualified column in a
            # correlated subquery with a join, and the bare table name means the same here.
            node.set("db", None)
            node.set("catalog", None)
        if isinstance(node, exp.Table):
            return _table(node, settings)
        return node

    fixed: exp.Expr = _bottom_up(tree, fix)
    return fixed


def _bottom_up(node: Any, fix: Callable[[Any], Any]) -> Any:
    """``fix`` applied to every node, children first (a cast of a cast is rewritten inside out;
    sqlglot's ``transform`` does not descend into a node it replaced)."""
    for key, value in list(node.args.items()):
        if isinstance(value, exp.Expr):
            node.set(key, _bottom_up(value, fix))
        elif isinstance(value, list):
            node.set(key, [_bottom_up(v, fix) if isinstance(v, exp.Expr) else v for v in value])
    return fix(node)


def _cast(node: exp.Cast) -> exp.Expression:
    written = node.to.sql(dialect="postgres").lower()
    to = written.split(".")[-1]
    if "." in written:  # pg_catalog.int2[] -> int2[]
        with contextlib.suppress(GlotParseError, TokenError, ValueError):
            node.set("to", exp.DataType.build(to, dialect="postgres"))
    if to == "regclass":
        # A regclass is an oid: a name (text) is looked up; an oid stays the number it is.
        value = node.this
        textual = (isinstance(value, exp.Literal) and value.is_string) or (
            isinstance(value, exp.Cast) and value.to.is_type(*exp.DataType.TEXT_TYPES)
        )
        if isinstance(value, exp.Placeholder | exp.Parameter):
            # A bound value: a name (text) or an oid (a number), known only when it is bound.
            name = exp.Lower(this=exp.RegexpReplace(
                this=exp.cast(value.copy(), exp.DataType.Type.VARCHAR),
                expression=exp.Literal.string("^.*\\."), replacement=exp.Literal.string(""),
            ))  # fmt: skip
            lookup = exp.select("oid").from_("pg_catalog.pg_class").where(
                exp.EQ(this=exp.column("relname"), expression=name)
            ).limit(1).subquery()  # fmt: skip
            number = exp.TryCast(this=value.copy(), to=exp.DataType.build("BIGINT"))
            return exp.Coalesce(this=number, expressions=[lookup])
        if not textual:
            return exp.cast(value, exp.DataType.Type.BIGINT)
        if isinstance(value, exp.Literal):
            value = exp.Literal.string(value.name.split(".")[-1].strip('"').lower())
        return exp.select("oid").from_("pg_catalog.pg_class").where(
            exp.EQ(this=exp.column("relname"), expression=value)
        ).limit(1).subquery()  # fmt: skip
    if to == "regtype":
        return exp.Anonymous(this="format_type", expressions=[node.this, exp.Null()])
    if to in ("oid", "regproc", "regnamespace", "xid", "regrole"):
        return exp.cast(node.this, exp.DataType.Type.BIGINT)
    if to in ("name", "text", "char", '"char"'):
        return exp.cast(node.this, exp.DataType.Type.VARCHAR)
    return node


def _literal(text: str) -> str:
    return exp.Literal.string(text).sql(dialect="duckdb")


def _settings(settings: Mapping[str, str]) -> str:
    """pg_settings as constant rows of the server's public settings (SHOW's)."""
    rows = []
    for key, value in settings.items():
        if key == "database":
            continue  # not a PostgreSQL setting: the connection's dbname, kept for SHOW
        values = [_literal(key), _literal(value)] + ["CAST(NULL AS VARCHAR)"] * (
            len(SETTINGS_COLUMNS) - 2
        )
        rows.append("(" + ", ".join(values) + ")")
    body = ", ".join(rows)
    columns = ", ".join(SETTINGS_COLUMNS)
    return (
        "SELECT * REPLACE (CAST(sourceline AS INTEGER) AS sourceline, "
        f"CAST(pending_restart AS BOOLEAN) AS pending_restart) FROM (VALUES {body}) AS s({columns})"
    )


def _table(node: exp.Table, settings: Mapping[str, str]) -> exp.Expression:
    database, user = settings["database"], settings["session_authorization"]
    if isinstance(node.this, exp.Func):  # pg_catalog.unnest(...) in FROM
        node.set("db", None)
        return node
    name, schema = node.name.lower(), node.db.lower()
    if schema not in CATALOG_SCHEMAS and not name.startswith("pg_"):
        return node  # a CTE
    alias = node.args.get("alias")
    if schema == "information_schema":
        if name not in _INFORMATION_SCHEMA:
            raise errors.UnsupportedQueryError(
                f"the catalog relation information_schema.{name} is not available"
            )
        return node
    if name == "pg_database":  # the one database the client connected to
        text = _DATABASE.replace("{name}", _literal(database))
    elif name == "pg_settings":
        text = _settings(settings)
    elif name in _DUCKDB_RELATIONS and name not in _AUGMENTED:
        return exp.table_(name, db="pg_catalog", alias=alias.name if alias else None)
    elif name in _AUGMENTED:
        text = f"SELECT {_AUGMENTED[name]} FROM pg_catalog.{name}"
    elif name in _EMPTY_RELATIONS:
        columns = ", ".join(f"CAST(NULL AS {t}) AS {c}" for c, t in _EMPTY_RELATIONS[name])
        text = f"SELECT {columns} WHERE false"
    elif name in _CONSTANT_RELATIONS:  # the connected user is the one role
        text = _CONSTANT_RELATIONS[name].replace("{user}", _literal(user))
    else:
        raise errors.UnsupportedQueryError(f"the catalog relation {name} is not available")
    # Under the name it had (a column may be qualified by the table's own name).
    named = alias or exp.TableAlias(this=exp.to_identifier(name))
    return exp.Subquery(this=sqlglot.parse_one(text, read="duckdb"), alias=named)
