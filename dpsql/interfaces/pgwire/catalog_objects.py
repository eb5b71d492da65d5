"""What the synthetic catalog of ``dpsql serve`` holds: its relations and its functions.

Relations: DuckDB's own ``pg_catalog`` views (``pg_class`` with the columns clients read that
DuckDB lacks, added as constants); empty relations of PostgreSQL's columns, for the relations
DuckDB lacks and for a few whose DuckDB columns fall short; the ``information_schema`` views
provided; and relations of constant rows (the one database, the connected user as the one
role). Functions: the catalog and plain scalar functions a catalog query may call, those that
give the definition of an object the catalog never has, and the set-returning ones allowed in
FROM. ``dpsql.interfaces.pgwire.catalog_rewrite`` classifies and rewrites statements by these
tables.
"""

from __future__ import annotations

from collections.abc import Mapping

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
        "extrelocatable:BOOLEAN extversion:VARCHAR extconfig:BIGINT[] extcondition:VARCHAR[]",
        # DBeaver: the database's and roles' descriptions, a table's policies, the extensions
        # available (none: the catalog has no shared object, policy or extension)
        "pg_shdescription": "objoid:BIGINT classoid:BIGINT description:VARCHAR",
        "pg_policies": "schemaname:VARCHAR tablename:VARCHAR policyname:VARCHAR "
        "permissive:VARCHAR roles:VARCHAR[] cmd:VARCHAR qual:VARCHAR with_check:VARCHAR",
        "pg_available_extensions": "name:VARCHAR default_version:VARCHAR "
        "installed_version:VARCHAR comment:VARCHAR",
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
        "pg_foreign_data_wrapper": "oid:BIGINT fdwname:VARCHAR fdwowner:BIGINT "
        "fdwhandler:BIGINT fdwvalidator:BIGINT fdwacl:VARCHAR[] fdwoptions:VARCHAR[]",
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
        "pg_namespace", "pg_proc", "pg_sequence", "pg_sequences", "pg_tables",
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
# The allow-list of functions a catalog query may call, by the lower-case SQL name (sqlglot's typed
# nodes by their SQL name), each with the recorded client sessions that call it
# (tests/interfaces/fixtures/catalog_sessions/: psql, SQLAlchemy and pandas over psycopg, the
# JDBC driver of DBeaver and Metabase, DBeaver's navigator, Metabase's own sync). A catalog query
# is free, so nothing here may make an answer larger than the catalog it reads: no row generator
# with bounds of the query's choosing (generate_series is checked, ``catalog_bounds``), no width
# amplifier (repeat, lpad, md5 ...); the aggregates and string builders clients need are capped
# by the rewrite.
_PSQL, _SA, _JDBC, _MB, _DBV = "psql", "sqlalchemy", "jdbc", "metabase", "dbeaver"
_SIZES = "answered 0: psql's \\d+ and BI tools' size probes"
_SCALAR = "plain scalar or aggregate, output no larger than its input"
CATALOG_FUNCTIONS: Mapping[str, str] = {
    **{name: _PSQL for name in (
        "pg_encoding_to_char", "pg_function_is_visible", "pg_get_function_arguments",
        "pg_get_statisticsobjdef_columns", "pg_get_userbyid", "pg_relation_is_publishable",
        "current_user", "array_to_string", "string_agg",
        # psql's tab completion (tab-complete.c): quote_ident over names, substring to match
        "quote_ident", "substring",
    )},
    **{name: f"{_PSQL}, {_SA}" for name in ("array", "pg_table_is_visible", "unnest", "version")},
    **{name: _SA for name in (
        "array_agg", "current_schema", "generate_subscripts", "json_build_object",
        "logical_and", "pg_collation_is_visible", "pg_get_constraintdef",
        "pg_get_serial_sequence", "to_regtype", "current_setting",
    )},
    **{name: _JDBC for name in (
        "current_catalog", "current_database", "current_schemas", "nullif", "obj_description",
        "replace", "row_number",
    )},
    **{name: f"{_PSQL}, {_JDBC}" for name in (
        "array_upper", "pg_get_function_result", "generate_series",
    )},
    **{name: f"{_PSQL}, {_SA}, {_JDBC}" for name in ("format_type",)},
    **{name: f"{_PSQL}, {_MB}" for name in ("col_description",)},
    **{name: f"{_JDBC}, {_MB}" for name in ("trim",)},
    **{name: _MB for name in ("format",)},
    # DBeaver's navigator, the indexes of a table or schema: an index's scan count, a number per
    # index, and the catalog has no index (answered 0, as the relation sizes)
    **{name: _DBV for name in ("pg_stat_get_numscans",)},
    # the JDBC driver's primary keys and index columns, Metabase's indexes: unnest with positions
    **{name: f"{_JDBC}, {_MB}" for name in ("_pg_expandarray",)},
    **{name: f"{_PSQL}, {_MB}" for name in ("lower",)},  # psql: its tab completion
    **{name: f"{_JDBC}, {_MB}, {_SA}" for name in ("pg_get_indexdef",)},
    **{name: f"{_PSQL}, {_SA}, {_JDBC}, {_MB}" for name in ("case", "cast", "if", "pg_get_expr")},
    **{name: _SIZES for name in (
        "pg_relation_size", "pg_total_relation_size", "pg_table_size", "pg_indexes_size",
        "pg_database_size", "pg_size_pretty",
    )},
    **{name: _SCALAR for name in (
        "coalesce", "upper", "length", "char_length", "ltrim", "rtrim", "left", "right",
        "position", "strpos", "split_part", "starts_with", "array_length", "array_lower",
        "cardinality", "count", "min", "max", "sum", "avg", "abs", "round", "greatest", "least",
        "bool_and", "bool_or", "logical_or", "rank", "try_cast", "any", "all", "any_value",
        "now", "current_timestamp", "current_date", "session_user", "user", "to_regclass",
        "pg_typeof", "pg_backend_pid", "regexp_matches", "array_position", "contains",
        "array_contains", "list_contains", "concat", "concat_ws", "ifnull",
    )},
    # catalog predicates and lookups: a boolean, a name or NULL (DuckDB's pg_catalog macros)
    **{name: "catalog lookup, constant-size output" for name in (
        "has_any_column_privilege", "has_column_privilege", "has_database_privilege",
        "has_function_privilege", "has_schema_privilege", "has_sequence_privilege",
        "has_table_privilege", "has_tablespace_privilege", "pg_has_role",
        "pg_is_other_temp_schema", "pg_my_temp_schema", "pg_type_is_visible",
        "shobj_description", "pg_get_viewdef", "pg_get_partkeydef", "pg_get_triggerdef",
        "pg_get_ruledef", "pg_get_function_identity_arguments", "pg_conversion_is_visible",
        "pg_operator_is_visible", "pg_opfamily_is_visible", "pg_opclass_is_visible",
        "pg_ts_config_is_visible", "pg_ts_dict_is_visible", "pg_ts_parser_is_visible",
        "pg_ts_template_is_visible", "pg_tablespace_location", "format_pg_type",
    )},
}  # fmt: skip
_FUNCTIONS = frozenset(CATALOG_FUNCTIONS)
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
# Relations of constant rows: ``{name}`` is the connected database, ``{user}`` the connected user.
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
# PostgreSQL's pg_settings columns, one row per public setting of the server (never DuckDB's own
# settings: their temp_directory, home_directory and extension paths name the server machine).
SETTINGS_COLUMNS = (
    "name", "setting", "unit", "category", "short_desc", "extra_desc", "context", "vartype",
    "source", "min_val", "max_val", "enumvals", "boot_val", "reset_val", "sourcefile",
    "sourceline", "pending_restart",
)  # fmt: skip
_CONSTANT_RELATIONS: Mapping[str, str] = {
    "pg_stat_user_tables": _STAT_TABLES,
    "pg_stat_all_tables": _STAT_TABLES,
    "pg_roles": _ROLES,
    "pg_user": _ROLES,
    "pg_authid": _ROLES,
}
