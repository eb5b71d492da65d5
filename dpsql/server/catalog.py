"""A synthetic PostgreSQL catalog for the clients of ``dpsql serve``, built from the policy alone.

SQLAlchemy, pandas, psql's ``\\d`` and BI tools ask the server about itself before they ask
anything else: ``select pg_catalog.version()``, ``pg_class`` joined with ``pg_attribute``,
``information_schema.columns``. dpsql answers these from a DuckDB connection of its own that
holds one **empty** table per table of the policy, with the columns and types the engine reads
from the files' schemas or the policy's declared types (never from rows), and nothing else: no
data attached, no file readable (``enable_external_access = false``), its configuration locked.
DuckDB's own ``pg_catalog`` and ``information_schema`` views over that connection are the answer;
size and statistics fields are those of empty tables (``reltuples = 0``, no ``pg_stats`` rows,
``pg_*_size() = 0``), constants whatever the data.

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
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError as GlotParseError
from sqlglot.errors import TokenError

from dpsql import errors
from dpsql.server import protocol as pg

CATALOG_SCHEMAS = frozenset({"pg_catalog", "information_schema"})
# DuckDB's catalog relations, and the PostgreSQL ones it lacks, answered as empty relations of
# PostgreSQL's columns (what clients select from them) or as constants.
_EMPTY_RELATIONS: Mapping[str, tuple[tuple[str, str], ...]] = {
    name: tuple(tuple(c.split(":")) for c in columns.split())  # type: ignore[misc]
    for name, columns in {
        "pg_stats": "schemaname:VARCHAR tablename:VARCHAR attname:VARCHAR inherited:BOOLEAN "
        "null_frac:REAL avg_width:INTEGER n_distinct:REAL most_common_vals:VARCHAR "
        "most_common_freqs:REAL[] histogram_bounds:VARCHAR correlation:REAL",
        "pg_inherits": "inhrelid:BIGINT inhparent:BIGINT inhseqno:INTEGER inhdetachpending:BOOLEAN",
        "pg_partitioned_table": "partrelid:BIGINT partstrat:VARCHAR partnatts:SMALLINT "
        "partdefid:BIGINT partattrs:SMALLINT[] partclass:BIGINT[] partcollation:BIGINT[] "
        "partexprs:VARCHAR",
        "pg_foreign_table": "ftrelid:BIGINT ftserver:BIGINT ftoptions:VARCHAR[]",
        "pg_trigger": "oid:BIGINT tgrelid:BIGINT tgparentid:BIGINT tgname:VARCHAR "
        "tgfoid:BIGINT tgtype:SMALLINT tgenabled:VARCHAR tgisinternal:BOOLEAN "
        "tgconstrrelid:BIGINT tgconstrindid:BIGINT tgconstraint:BIGINT tgdeferrable:BOOLEAN "
        "tginitdeferred:BOOLEAN tgnargs:SMALLINT tgattr:SMALLINT[] tgargs:BLOB "
        "tgqual:VARCHAR tgoldtable:VARCHAR tgnewtable:VARCHAR",
        "pg_policy": "oid:BIGINT polname:VARCHAR polrelid:BIGINT polcmd:VARCHAR "
        "polpermissive:BOOLEAN polroles:BIGINT[] polqual:VARCHAR polwithcheck:VARCHAR",
        "pg_rewrite": "oid:BIGINT rulename:VARCHAR ev_class:BIGINT ev_type:VARCHAR "
        "ev_enabled:VARCHAR is_instead:BOOLEAN ev_qual:VARCHAR ev_action:VARCHAR",
        "pg_statistic_ext": "oid:BIGINT stxrelid:BIGINT stxname:VARCHAR stxnamespace:BIGINT "
        "stxowner:BIGINT stxstattarget:INTEGER stxkeys:SMALLINT[] stxkind:VARCHAR[] "
        "stxexprs:VARCHAR",
        "pg_publication": "oid:BIGINT pubname:VARCHAR pubowner:BIGINT puballtables:BOOLEAN "
        "pubinsert:BOOLEAN pubupdate:BOOLEAN pubdelete:BOOLEAN pubtruncate:BOOLEAN "
        "pubviaroot:BOOLEAN",
        "pg_publication_rel": "oid:BIGINT prpubid:BIGINT prrelid:BIGINT prqual:VARCHAR "
        "prattrs:SMALLINT[]",
        "pg_publication_namespace": "oid:BIGINT pnpubid:BIGINT pnnspid:BIGINT",
        "pg_extension": "oid:BIGINT extname:VARCHAR extowner:BIGINT extnamespace:BIGINT "
        "extrelocatable:BOOLEAN extversion:VARCHAR",
        "pg_matviews": "schemaname:VARCHAR matviewname:VARCHAR matviewowner:VARCHAR "
        "tablespace:VARCHAR hasindexes:BOOLEAN ispopulated:BOOLEAN definition:VARCHAR",
        "pg_opclass": "oid:BIGINT opcmethod:BIGINT opcname:VARCHAR opcnamespace:BIGINT "
        "opcowner:BIGINT opcfamily:BIGINT opcintype:BIGINT opcdefault:BOOLEAN "
        "opckeytype:BIGINT",
        "pg_event_trigger": "oid:BIGINT evtname:VARCHAR evtevent:VARCHAR evtowner:BIGINT "
        "evtfoid:BIGINT evtenabled:VARCHAR evttags:VARCHAR[]",
        "pg_auth_members": "oid:BIGINT roleid:BIGINT member:BIGINT grantor:BIGINT "
        "admin_option:BOOLEAN",
        # DuckDB's pg_collation has two of PostgreSQL's columns; no column has a collation.
        "pg_collation": "oid:BIGINT collname:VARCHAR collnamespace:BIGINT collowner:BIGINT "
        "collprovider:VARCHAR collisdeterministic:BOOLEAN collencoding:INTEGER "
        "collcollate:VARCHAR collctype:VARCHAR colliculocale:VARCHAR collversion:VARCHAR",
        "pg_operator": "oid:BIGINT oprname:VARCHAR oprnamespace:BIGINT oprowner:BIGINT "
        "oprkind:VARCHAR oprleft:BIGINT oprright:BIGINT oprresult:BIGINT oprcode:VARCHAR",
        "pg_aggregate": "aggfnoid:BIGINT aggkind:VARCHAR",
        "pg_language": "oid:BIGINT lanname:VARCHAR",
        "pg_foreign_server": "oid:BIGINT srvname:VARCHAR",
        "pg_foreign_data_wrapper": "oid:BIGINT fdwname:VARCHAR",
        "pg_conversion": "oid:BIGINT conname:VARCHAR connamespace:BIGINT conowner:BIGINT "
        "conforencoding:INTEGER contoencoding:INTEGER conproc:VARCHAR condefault:BOOLEAN",
        "pg_cast": "oid:BIGINT castsource:BIGINT casttarget:BIGINT",
        # No index exists here; DuckDB's pg_index lacks PostgreSQL 15's columns.
        "pg_index": "indexrelid:BIGINT indrelid:BIGINT indnatts:SMALLINT indnkeyatts:SMALLINT "
        "indisunique:BOOLEAN indnullsnotdistinct:BOOLEAN indisprimary:BOOLEAN "
        "indisexclusion:BOOLEAN indimmediate:BOOLEAN indisclustered:BOOLEAN indisvalid:BOOLEAN "
        "indcheckxmin:BOOLEAN indisready:BOOLEAN indislive:BOOLEAN indisreplident:BOOLEAN "
        "indkey:SMALLINT[] indcollation:BIGINT[] indclass:BIGINT[] indoption:SMALLINT[] "
        "indexprs:VARCHAR indpred:VARCHAR",
    }.items()
}
_DUCKDB_RELATIONS = frozenset(
    {
        "pg_am", "pg_attrdef", "pg_attribute", "pg_class", "pg_constraint",
        "pg_depend", "pg_description", "pg_enum", "pg_indexes",
        "pg_namespace", "pg_proc", "pg_sequence", "pg_sequences", "pg_settings", "pg_tables",
        "pg_tablespace", "pg_type", "pg_views",
    }
)  # fmt: skip
# DuckDB relations that lack columns PostgreSQL clients read: the columns added, as constants.
_AUGMENTED: Mapping[str, str] = {
    "pg_class": "* REPLACE (CAST(NULL AS VARCHAR[]) AS reloptions, "
    "CAST(NULL AS VARCHAR[]) AS relacl), false AS relforcerowsecurity",
}
_INFORMATION_SCHEMA = frozenset(
    {
        "tables", "columns", "schemata", "views", "table_constraints", "key_column_usage",
        "referential_constraints", "constraint_column_usage", "character_sets",
    }
)  # fmt: skip
# Catalog functions (DuckDB's pg_catalog macros, less pg_sleep and the connection's addresses)
# and plain scalar functions, by the lower-case name sqlglot gives them.
_FUNCTIONS = frozenset(
    {
        # catalog
        "col_description", "current_database", "current_schema", "current_schemas",
        "format_pg_type", "format_type", "has_any_column_privilege", "has_column_privilege",
        "has_database_privilege", "has_function_privilege", "has_schema_privilege",
        "has_sequence_privilege", "has_table_privilege", "has_tablespace_privilege",
        "obj_description", "pg_collation_is_visible", "pg_function_is_visible",
        "pg_get_constraintdef", "pg_get_expr", "pg_get_viewdef", "pg_has_role",
        "pg_is_other_temp_schema", "pg_my_temp_schema", "pg_table_is_visible",
        "pg_type_is_visible", "pg_typeof", "shobj_description", "version", "pg_get_userbyid",
        "pg_get_indexdef", "pg_get_serial_sequence", "pg_encoding_to_char", "pg_size_pretty",
        "pg_relation_size", "pg_total_relation_size", "pg_table_size", "pg_indexes_size",
        "pg_database_size", "pg_get_partkeydef", "pg_get_statisticsobjdef_columns",
        "pg_backend_pid", "quote_ident", "current_user", "session_user", "user",
        "to_regtype", "to_regclass", "pg_relation_is_publishable", "pg_conversion_is_visible",
        "pg_operator_is_visible", "pg_opfamily_is_visible", "pg_opclass_is_visible",
        "pg_ts_config_is_visible", "pg_ts_dict_is_visible", "pg_ts_parser_is_visible",
        "pg_ts_template_is_visible", "pg_tablespace_location", "pg_get_function_result",
        "pg_get_function_arguments", "pg_get_triggerdef", "pg_get_ruledef",
        "pg_get_function_identity_arguments", "json_build_object", "json_agg", "json_object",
        # scalar and aggregate
        "lower", "upper", "coalesce", "nullif", "concat", "concat_ws", "substring", "substr",
        "length", "char_length", "trim", "ltrim", "rtrim", "replace", "left", "right",
        "position", "strpos", "split_part", "string_agg", "array_agg", "array_to_string",
        "array_length", "array_upper", "array_lower", "cardinality", "unnest",
        "generate_subscripts", "generate_series", "count", "min", "max", "sum", "avg", "abs",
        "round", "greatest", "least", "regexp_replace", "regexp_matches", "starts_with",
        "to_char", "now", "current_timestamp", "current_date", "bool_and", "bool_or",
        "row_number", "rank", "any_value", "first", "last", "cast", "try_cast", "if",
        "array", "list", "list_value", "contains", "array_contains", "list_contains",
        "string_to_array", "md5", "ifnull", "nvl", "isnull", "case", "any", "all",
        "extract", "date_trunc", "to_timestamp", "array_position", "logical_and", "logical_or",
    }
)  # fmt: skip
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
    exp.GenerateSeries: "generate_series",
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
# Definitions of objects the catalog never has (its tables have no defaults, constraints,
# indexes, partitions or sequences, and there are no views): NULL text.
_NO_DEFINITIONS = frozenset(
    {
        "pg_get_expr", "pg_get_constraintdef", "pg_get_indexdef", "pg_get_viewdef",
        "pg_get_partkeydef", "pg_get_statisticsobjdef_columns", "pg_get_serial_sequence",
        "pg_get_function_result", "pg_get_function_arguments", "pg_get_triggerdef",
        "pg_get_ruledef", "pg_get_function_identity_arguments",
    }
)  # fmt: skip
_SET_FUNCTIONS = frozenset({"unnest", "generate_series", "generate_subscripts"})
_MEMORY = "64MB"  # a catalog of empty tables needs little; a hostile join gets no more


class NotCatalog(Exception):  # noqa: N818 - control flow: the statement is not a catalog one
    """The statement reads something that is not a catalog relation."""


def catalog_sql(text: str, settings: Mapping[str, str]) -> tuple[str, list[int]] | None:
    """The DuckDB SQL that answers ``text`` from the synthetic catalog, and for each of its
    ``$k`` the 0-based index of the ``$n`` of ``text`` it stands for (a rewrite may drop a
    parameter: the argument of a definition the catalog never has); or None when ``text`` is
    not a catalog query (it then goes to the DP pipeline). Raises ``UnsupportedQueryError`` for
    a catalog query dpsql cannot answer (a catalog relation or function it does not provide)."""
    lowered = text.lower()
    if not any(word in lowered for word in ("pg_", "information_schema", "version", "current_")):
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
    for node in tree.find_all(exp.Func):
        if isinstance(node, exp.Binary | exp.Unary | exp.Connector | exp.Predicate):
            continue  # an operator (AND, COLLATE, ~, EXISTS): sqlglot types some as functions
        name = _function_name(node)
        if name.startswith("pg_") or name in ("version", "current_database", "format_type"):
            catalog = True
        if name not in _FUNCTIONS:
            if catalog or name.startswith("pg_"):
                raise errors.UnsupportedQueryError(
                    f"the catalog function {name} is not available from dpsql serve"
                )
            raise NotCatalog
    for column in tree.find_all(exp.Column):  # current_user, current_schema written bare
        if not column.table and column.name.lower() in ("current_user", "session_user", "user"):
            catalog = True
    if not catalog:
        raise NotCatalog


def _function_name(node: exp.Func) -> str:
    """The lower-case SQL name of a function node (sqlglot's typed nodes by their SQL name)."""
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    for cls, name in _NODE_NAMES.items():
        if isinstance(node, cls):
            return name
    return str(node.sql_name()).lower()


def _rewrite(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    user = settings["session_authorization"]
    constants: dict[str, str] = {
        "version": f"PostgreSQL {settings['server_version']}",
        "current_database": settings["database"],
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
            if name in constants:
                return exp.Literal.string(constants[name])
            if name in ("pg_relation_size", "pg_total_relation_size", "pg_table_size",
                        "pg_indexes_size", "pg_database_size"):  # fmt: skip
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
            return _table(node, settings["database"], user)
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


def _table(node: exp.Table, database: str, user: str) -> exp.Expression:
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


_STAT_TABLES = (
    "SELECT c.oid AS relid, n.nspname AS schemaname, c.relname AS relname, 0 AS seq_scan, "
    "0 AS n_live_tup, 0 AS n_dead_tup, 0 AS n_tup_ins FROM pg_catalog.pg_class c "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r'"
)
_ROLES = (
    "SELECT 10 AS oid, {user} AS rolname, {user} AS usename, 10 AS usesysid, false AS rolsuper, "
    "false AS usesuper, true AS rolinherit, false AS rolcreaterole, false AS rolcreatedb, "
    "true AS rolcanlogin, false AS rolreplication, -1 AS rolconnlimit, "
    "CAST(NULL AS VARCHAR) AS rolpassword, CAST(NULL AS TIMESTAMPTZ) AS rolvaliduntil, "
    "false AS rolbypassrls, CAST(NULL AS VARCHAR[]) AS rolconfig"
)
_DATABASE = (
    "SELECT 1 AS oid, {name} AS datname, 10 AS datdba, 6 AS encoding, 'C' AS datcollate, "
    "'C' AS datctype, CAST(NULL AS VARCHAR) AS daticulocale, 'c' AS datlocprovider, "
    "true AS datallowconn, false AS datistemplate, CAST(NULL AS VARCHAR[]) AS datacl, "
    "0 AS dattablespace"
)
_CONSTANT_RELATIONS: Mapping[str, str] = {
    "pg_stat_user_tables": _STAT_TABLES,
    "pg_stat_all_tables": _STAT_TABLES,
    "pg_roles": _ROLES,
    "pg_user": _ROLES,
    "pg_authid": _ROLES,
}


def wire_type(duckdb_type: str) -> str:
    """The DuckDB type whose PostgreSQL type is the one ``dpsql serve`` sends for values of
    ``duckdb_type`` (``protocol.pg_type``): the catalog describes columns as they arrive.

    >>> [wire_type(t) for t in ("UTINYINT", "HUGEINT", "DECIMAL(18,3)", "INTEGER[]", "JSON")]
    ['SMALLINT', 'DECIMAL(38,0)', 'DECIMAL(18,3)', 'VARCHAR', 'VARCHAR']
    """
    name = " ".join(duckdb_type.upper().split())
    if name.startswith(("DECIMAL", "NUMERIC")) and "(" in name:
        return name
    oid, _ = pg.pg_type(name)
    return _WIRE_TYPES.get(oid, "VARCHAR")


_WIRE_TYPES = {
    16: "BOOLEAN", 17: "BLOB", 20: "BIGINT", 21: "SMALLINT", 23: "INTEGER", 25: "VARCHAR",
    700: "REAL", 701: "DOUBLE", 1082: "DATE", 1083: "TIME", 1114: "TIMESTAMP",
    1184: "TIMESTAMPTZ", 1186: "INTERVAL", 1266: "TIMETZ", 1700: "DECIMAL(38,0)", 2950: "UUID",
}  # fmt: skip
# PostgreSQL's names for the types above (DuckDB's format_type gives its own, e.g. int8);
# DuckDB's typmod of a DECIMAL(p, s) is p * 1000 + s.
_FORMAT_TYPE = """
CREATE TEMP MACRO dpsql_format_type(t, m) AS CASE t
    WHEN 16 THEN 'boolean' WHEN 17 THEN 'bytea' WHEN 20 THEN 'bigint' WHEN 21 THEN 'smallint'
    WHEN 23 THEN 'integer' WHEN 25 THEN 'text' WHEN 700 THEN 'real'
    WHEN 701 THEN 'double precision' WHEN 1043 THEN 'character varying' WHEN 1082 THEN 'date'
    WHEN 1083 THEN 'time without time zone' WHEN 1114 THEN 'timestamp without time zone'
    WHEN 1184 THEN 'timestamp with time zone' WHEN 1186 THEN 'interval'
    WHEN 1266 THEN 'time with time zone' WHEN 2950 THEN 'uuid'
    WHEN 1700 THEN CASE WHEN m IS NULL OR m < 0 THEN 'numeric'
        ELSE 'numeric(' || (m // 1000) || ',' || (m % 1000) || ')' END
    ELSE format_type(t, m) END
"""


class Catalog:
    """The empty tables of a policy in a DuckDB connection of their own, answering catalog
    queries; ``tables`` maps each exposed table to its columns and DuckDB types."""

    def __init__(self, tables: Mapping[str, Mapping[str, str]]):
        self._lock = threading.Lock()
        self._con = duckdb.connect(
            ":memory:",
            config={
                "enable_external_access": False,
                "autoload_known_extensions": False,
                "autoinstall_known_extensions": False,
                "memory_limit": _MEMORY,
                "threads": 1,
            },
        )
        for table, columns in tables.items():
            body = ", ".join(f"{_quote(c)} {wire_type(t)}" for c, t in columns.items())
            self._con.execute(f"CREATE TABLE main.{_quote(table)} ({body})")
        self._con.execute(_FORMAT_TYPE)
        self._con.execute("SET lock_configuration = true")

    def answer(
        self, sql: str, params: Sequence[object] | None
    ) -> tuple[list[tuple[str, str]], list[tuple[Any, ...]]]:
        """The columns (name, DuckDB type) and rows of a catalog query."""
        with self._lock:
            try:
                cursor = self._con.execute(sql, list(params) if params else None)
                columns = [(str(d[0]), str(d[1])) for d in cursor.description or []]
                return columns, cursor.fetchmany(_MAX_ROWS)
            except duckdb.InterruptException:
                raise errors.UnsupportedQueryError("the catalog query was interrupted") from None
            except duckdb.Error as exc:
                # The catalog holds no data: its messages quote only the query and the schema.
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise errors.UnsupportedQueryError(f"catalog query: {first[:300]}") from None

    def interrupt(self) -> None:
        """Takes no lock: a running query holds it."""
        with contextlib.suppress(duckdb.Error):
            self._con.interrupt()

    def close(self) -> None:
        with self._lock:
            self._con.close()


_MAX_ROWS = 100_000  # a catalog answer is small; a cross join of catalog views is cut here


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


__all__ = ["Catalog", "catalog_sql"]
