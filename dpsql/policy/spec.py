"""The policy's sections as frozen pydantic models.

The data set and where its data lives, the budget and the filter that guards it (with the
analysts' shares), what is public about each table and column, the ledger, the engine's
settings, and the whole ``Policy`` with its version. Each model checks its own fields when it
is validated; ``Exact`` fields are exact rationals (``dpsql.policy.numbers``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from fractions import Fraction
from pathlib import Path
from typing import Literal

import sqlglot
from pydantic import Field, field_validator, model_validator
from sqlglot import exp

from dpsql.policy.budget import (
    FILTER_VERSION,
    BudgetSpec,
    DeclaredMechanism,
    FilterVersion,
    Mechanism,
    ShareSpec,
)
from dpsql.policy.engine import EngineSpec
from dpsql.policy.frozen import Frozen as _Frozen
from dpsql.policy.numbers import (
    MAX_ABS_BOUND,
    MAX_CONTRIBUTION_BOUND,
    Exact,
)
from dpsql.policy.paths import MAX_PATH_LINKS, UnitLink
from dpsql.policy.periods import PeriodsSpec

__all__ = [
    "AUTO_BOUNDS",
    "FILTER_VERSION",
    "MAX_DATE_RANGE_DAYS",
    "BudgetSpec",
    "ColumnSpec",
    "DataSpec",
    "DatasetSpec",
    "DeclaredMechanism",
    "FilterVersion",
    "LedgerSpec",
    "Mechanism",
    "Policy",
    "PublicValue",
    "ShareSpec",
    "TableSpec",
    "UnitLink",
]

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CATALOG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}(\.[A-Za-z_][A-Za-z0-9_]{0,127}){0,2}$")

PublicValue = str | int | float | bool | dt.date | dt.datetime | None
MAX_DATE_RANGE_DAYS = 36_600  # a century of days: the largest domain date_trunc('day') gets


def _as_date(value: dt.date) -> dt.date:
    return value.date() if isinstance(value, dt.datetime) else value


class DatasetSpec(_Frozen):
    """Identity of the data set: the budget belongs to ``id``; ``data_version`` keys the cache."""

    id: str = Field(min_length=1, max_length=200)
    data_version: str = Field(default="1", min_length=1, max_length=200)


class BlocksSpec(_Frozen):
    """A table made of blocks: Parquet files the owner registers in the ledger over time
    (``dpsql blocks add``), each holding the rows of one period of the column ``period``."""

    period: str = Field(min_length=1, max_length=200)

    @field_validator("period")
    @classmethod
    def _plain(cls, value: str) -> str:
        if not _IDENTIFIER.match(value):
            raise ValueError("period must name a column (a plain SQL identifier)")
        return value.lower()


class DataSpec(_Frozen):
    """Where the data lives: a DuckDB file, and/or Parquet or CSV files mapped to table names,
    and/or tables made of blocks registered in the ledger."""

    database: Path | None = None
    tables: dict[str, Path] = Field(default_factory=dict)
    # Tables whose files are registered in the ledger block by block (dpsql.session.blocks).
    blocks: dict[str, BlocksSpec] = Field(default_factory=dict, max_length=1000)
    # On Spark: tables of its catalog, by name (catalog.database.table), instead of files.
    catalog: dict[str, str] = Field(default_factory=dict, max_length=1000)
    # CSV files are read one physical line per row, split on this character, without quoting,
    # so a malformed line can only drop itself (DESIGN.md section 5): never sniffed.
    csv_delimiter: str = Field(default=",", min_length=1, max_length=1)

    @field_validator("csv_delimiter")
    @classmethod
    def _delimiter(cls, value: str) -> str:
        if value in ("\n", "\r", '"', "'") or (not value.isprintable() and value != "\t"):
            raise ValueError("csv_delimiter must be one printable character (or a tab)")
        return value

    @model_validator(mode="after")
    def _some_data(self) -> DataSpec:
        if self.database is None and not self.tables and not self.catalog and not self.blocks:
            raise ValueError("give data.database, data.tables or data.blocks")
        for name in self.blocks:
            others = {t.lower() for t in (*self.tables, *self.catalog)}
            if not _IDENTIFIER.match(name) or name.lower() in others:
                raise ValueError(f"data.blocks: {name!r} is not a new plain SQL identifier")
        if self.blocks and self.database is not None:
            # A database file's instance is shared by the process and fixes its readable files
            # when it opens; blocks are bound anew as they are registered.
            raise ValueError("data.blocks cannot be combined with data.database")
        for name, identifier in self.catalog.items():
            if not _IDENTIFIER.match(name) or name.lower() in {t.lower() for t in self.tables}:
                raise ValueError(f"data.catalog: {name!r} is not a new plain SQL identifier")
            if not _CATALOG_NAME.match(identifier):
                raise ValueError(
                    f"data.catalog.{name} must name a table as table, database.table or "
                    "catalog.database.table (plain identifiers)"
                )
        for name, path in self.tables.items():
            if not _IDENTIFIER.match(name):
                raise ValueError(f"data.tables: {name!r} is not a plain SQL identifier")
            if path.suffix.lower() not in {".parquet", ".csv"}:
                raise ValueError(f"data.tables.{name}: only .parquet and .csv files are supported")
        return self


class ColumnSpec(_Frozen):
    """What is public about a column: its clamping bounds and/or its domain of key values."""

    lower: Exact | None = None
    upper: Exact | None = None
    public_values: tuple[PublicValue, ...] | None = None
    public_values_from: str | None = Field(default=None, pattern=r"^[A-Za-z_]\w*\.[A-Za-z_]\w*$")
    # For a DATE or TIMESTAMP column: the public first and last date. GROUP BY date_trunc(...)
    # or year(...) of the column then has a public domain (DESIGN.md section 4).
    date_range: tuple[dt.date, dt.date] | None = None
    # For a column of a CSV table: its DuckDB type. CSV columns are read as text and cast with
    # TRY_CAST when the text matches the type's grammar (dpsql.engine.csv_text; otherwise NULL,
    # never an error); undeclared ones stay VARCHAR: types never come from sniffing the rows.
    type: str | None = Field(default=None, max_length=200)

    @field_validator("type")
    @classmethod
    def _type(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:  # parsed as the target of a cast: a type and nothing else
            cast = sqlglot.parse_one(f"CAST(NULL AS {value})", read="duckdb")
        except (sqlglot.errors.SqlglotError, ValueError, RecursionError):
            cast = None
        parsed = cast.args.get("to") if isinstance(cast, exp.Cast) else None
        if not isinstance(parsed, exp.DataType) or parsed.this == exp.DataType.Type.USERDEFINED:
            raise ValueError(f"{value!r} is not a built-in DuckDB type")
        return parsed.sql(dialect="duckdb")

    @model_validator(mode="after")
    def _valid(self) -> ColumnSpec:
        if (self.lower is None) != (self.upper is None):
            raise ValueError("give both lower and upper, or neither")
        if self.lower is not None and self.upper is not None:
            if not self.lower < self.upper:
                raise ValueError("lower must be below upper")
            if max(abs(self.lower), abs(self.upper)) > MAX_ABS_BOUND:
                raise ValueError("bounds must be within ±2**52")
        if self.public_values is not None and self.public_values_from is not None:
            raise ValueError("give public_values or public_values_from, not both")
        if self.date_range is not None:
            first, last = (_as_date(d) for d in self.date_range)
            if not first <= last:
                raise ValueError("date_range must be [first, last] with first <= last")
            if (last - first).days > MAX_DATE_RANGE_DAYS:
                raise ValueError(f"date_range spans more than {MAX_DATE_RANGE_DAYS} days")
        if self.public_values is not None and len(set(self.public_values)) != len(
            self.public_values
        ):
            raise ValueError("public_values has duplicates")
        return self

    @property
    def bounds(self) -> tuple[Fraction, Fraction] | None:
        if self.lower is None or self.upper is None:
            return None
        return (self.lower, self.upper)


# What a table's ``bounds`` may name: its contribution bounds, and the clamps of its numeric
# columns that declare none.
AUTO_BOUNDS = ("max_rows_per_unit", "max_groups_per_unit", "max_rows_per_unit_per_group", "clamps")


class TableSpec(_Frozen):
    """A private table (with a privacy unit and contribution bounds) or a public table."""

    privacy_unit: str | None = None
    # The unit through foreign keys instead of a column (dpsql.policy.paths), ending at a table
    # with a privacy_unit. Left out of the version when empty.
    unit_path: tuple[UnitLink, ...] = Field(default=(), max_length=MAX_PATH_LINKS)
    public: bool = False
    max_groups_per_unit: int | None = Field(default=None, ge=1, le=MAX_CONTRIBUTION_BOUND)
    max_rows_per_unit_per_group: int | None = Field(default=None, ge=1, le=MAX_CONTRIBUTION_BOUND)
    # R: rows one unit may contribute in total, across groups (DESIGN.md section 3); optional.
    max_rows_per_unit: int | None = Field(default=None, ge=1, le=MAX_CONTRIBUTION_BOUND)
    # Bounds the policy leaves to dpsql, chosen per query under differential privacy at a share
    # of its epsilon (docs/policy.md): "auto" for every bound left unset, or the names of some
    # (AUTO_BOUNDS). None (the default, left out of the version): a missing bound is refused.
    bounds: Literal["auto"] | tuple[str, ...] | None = None
    # Private tables with equal unit_domain hold the same kind of unit (say, one person) under
    # the same identifiers, so they may be joined on their unit columns.
    unit_domain: str | None = Field(default=None, min_length=1, max_length=200)
    columns: dict[str, ColumnSpec] = Field(default_factory=dict)
    # Columns with one value per unit (e.g. a home region): queries filtered to different values
    # touch disjoint units and compose in parallel. Enforced, not trusted: each unit keeps the
    # rows of one value, chosen by keyed hash, in every query that relies on it.
    constant_per_unit: tuple[str, ...] = ()
    # Show columns the policy does not name (None: a DuckDB file's no, a file's yes; not hashed).
    expose_undeclared: bool | None = Field(default=None, exclude=True)

    @field_validator("columns")
    @classmethod
    def _lower(cls, columns: dict[str, ColumnSpec]) -> dict[str, ColumnSpec]:
        # SQL identifiers are case-insensitive in DuckDB; the policy matches them the same way.
        return {name.lower(): spec for name, spec in columns.items()}

    @field_validator("privacy_unit")
    @classmethod
    def _lower_unit(cls, unit: str | None) -> str | None:
        return unit.lower() if unit is not None else None

    @field_validator("constant_per_unit")
    @classmethod
    def _lower_constant(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not _IDENTIFIER.match(name):
                raise ValueError(f"{name!r} is not a plain SQL identifier")
        return tuple(name.lower() for name in names)

    @model_validator(mode="after")
    def _valid(self) -> TableSpec:
        if self.privacy_unit is not None and self.unit_path:
            raise ValueError("a table has a privacy_unit or a unit_path, not both")
        if self.public == self.is_private:
            raise ValueError("a table is either public = true or has a privacy_unit (or unit_path)")
        if self.unit_path and self.unit_domain:
            raise ValueError("a table with a unit_path has the unit_domain of the table it ends at")
        if self.public and (
            self.max_groups_per_unit or self.max_rows_per_unit_per_group or self.max_rows_per_unit
        ):
            raise ValueError("a public table has no contribution bounds")
        if self.public and self.unit_domain:
            raise ValueError("a public table has no unit_domain")
        if self.public and self.constant_per_unit:
            raise ValueError("a public table has no privacy unit to be constant for")
        if self.privacy_unit in self.constant_per_unit:
            raise ValueError("constant_per_unit lists other columns than the privacy unit")
        if self.public and self.bounds is not None:
            raise ValueError("a public table has no bounds to choose")
        if isinstance(self.bounds, tuple):
            for name in self.bounds:
                if name not in AUTO_BOUNDS:
                    raise ValueError(
                        f'bounds lists {name!r}; it takes "auto" or names among '
                        + ", ".join(AUTO_BOUNDS)
                    )
                if name != "clamps" and getattr(self, name) is not None:
                    raise ValueError(f"{name} is declared, so dpsql cannot choose it too")
        return self

    def auto(self, name: str) -> bool:
        """Whether the policy leaves bound ``name`` (or ``clamps``) to dpsql's choice."""
        return self.bounds == "auto" or (isinstance(self.bounds, tuple) and name in self.bounds)

    @property
    def is_private(self) -> bool:
        return self.privacy_unit is not None or bool(self.unit_path)

    @property
    def unit_text(self) -> str:
        """The privacy unit as screens show it: the column, or the path that reaches it."""
        if self.unit_path:
            return "through " + ", then ".join(link.text() for link in self.unit_path)
        return str(self.privacy_unit)


class LedgerSpec(_Frozen):
    """Where the durable ledger lives (created by ``dpsql init``) and its anchor."""

    path: Path
    anchor: Path | None = None  # default: beside the ledger, named <path>.anchor


class ServerSpec(_Frozen):
    """What ``dpsql serve`` sets on every connection: how answers are shown, never an answer."""

    # The ± columns on from the start (``SET dpsql.accuracy_columns``), for clients that send
    # one query and read columns only (pandas.read_sql, BI tools).
    accuracy_columns: bool = False


class Policy(_Frozen):
    """The whole policy. ``base_dir`` resolves relative data paths (it is not part of it)."""

    dataset: DatasetSpec
    data: DataSpec
    budget: BudgetSpec
    tables: dict[str, TableSpec]
    ledger: LedgerSpec | None = None  # without it the budget lives in memory
    engine: EngineSpec = Field(default_factory=EngineSpec)
    server: ServerSpec = Field(default_factory=ServerSpec)
    # A person-within-period unit on a table made of blocks (dpsql.policy.periods); None (the
    # default, left out of the version): every unit is the table's privacy_unit alone.
    periods: PeriodsSpec | None = None
    base_dir: Path = Field(default=Path("."), exclude=True)

    @field_validator("tables")
    @classmethod
    def _names(cls, tables: dict[str, TableSpec]) -> dict[str, TableSpec]:
        for name in tables:
            if not _IDENTIFIER.match(name):
                raise ValueError(f"{name!r} is not a plain SQL identifier")
        return {name.lower(): spec for name, spec in tables.items()}

    @model_validator(mode="after")
    def _catalog_on_spark(self) -> Policy:
        if self.data.catalog and self.engine.name != "spark":
            raise ValueError('data.catalog names tables of Spark\'s catalog: engine.name = "spark"')
        return self

    @model_validator(mode="after")
    def _periods(self) -> Policy:
        periods = self.periods
        if periods is None:
            return self
        table = self.tables.get(periods.table)
        if periods.table not in {t.lower() for t in self.data.blocks} or table is None:
            raise ValueError("periods.table must name a table of data.blocks that the policy lists")
        if table.privacy_unit is None:
            raise ValueError("periods.table must have a privacy_unit (the person) of its own")
        if any(link.table == periods.table for t in self.tables.values() for link in t.unit_path):
            # Another table's rows would be a person's across periods, not a person-period's.
            raise ValueError("no unit_path may lead to periods.table")
        if self.budget.accountant == "pld":
            # The PLD filter's one declared mechanism cannot be a person's k-fold loss.
            raise ValueError("periods need another filter than accountant = 'pld'")
        if self.budget.epsilon is not None and periods.epsilon > self.budget.epsilon:
            raise ValueError("periods.epsilon must lie within the lifetime cap, budget.epsilon")
        if periods.delta > self.budget.delta:
            raise ValueError("periods.delta must lie within the lifetime cap, budget.delta")
        return self

    @model_validator(mode="after")
    def _references(self) -> Policy:
        for tname, table in self.tables.items():
            for cname, col in table.columns.items():
                ref = col.public_values_from
                if ref is None:
                    continue
                other = self.tables.get(ref.split(".")[0].lower())
                if other is None or not other.public:
                    raise ValueError(
                        f"tables.{tname}.columns.{cname}.public_values_from must name a column "
                        "of a public table"
                    )
        return self

    @model_validator(mode="after")
    def _paths(self) -> Policy:
        for tname, table in self.tables.items():
            seen = {tname}
            for i, link in enumerate(table.unit_path):
                parent = self.tables.get(link.table)
                where = f"tables.{tname}.unit_path[{i}] ({link.text()})"
                if parent is None:
                    raise ValueError(f"{where} names table {link.table}, which the policy lacks")
                if link.table in seen:
                    raise ValueError(f"{where} leads back to a table the path has passed")
                last = i == len(table.unit_path) - 1
                if last and parent.privacy_unit is None:
                    raise ValueError(
                        f"{where} must end at a table with a privacy_unit; {link.table} has none"
                    )
                seen.add(link.table)
        return self

    def path_columns(self, name: str) -> set[str]:
        """The columns of table ``name`` that a unit path names (its own links' columns, or a
        key another table's path reaches it by): declared, so never hidden."""
        out: set[str] = set()
        for tname, table in self.tables.items():
            at = tname
            for link in table.unit_path:
                if at == name:
                    out.add(link.column)
                if link.table == name:
                    out.add(link.key)
                at = link.table
        return out

    def unit_table(self, name: str) -> str:
        """The table whose privacy_unit a private table's rows resolve to: itself, or the last
        table of its unit path."""
        path = self.tables[name].unit_path
        return path[-1].table if path else name

    @property
    def version(self) -> str:
        """A hash of the policy's canonical form: any change to it changes the version."""
        # The engine's settings change the speed, the server's the display, never an answer:
        # neither is part of the version; nor is the default diagnosis, which its release's
        # cache key holds (dpsql.cache.keys).
        skip: dict[str, bool | set[str]] = {"engine": True, "server": True}
        skip["budget"] = {"diagnose", "diagnose_share", "require_analyst"}
        body = self.model_dump(mode="json", exclude=skip)
        for table in body["tables"].values():
            # Added after versions were first computed: left out when unset, so that a policy
            # that does not use it keeps its version (and its cached releases).
            if table.get("bounds") is None:
                table.pop("bounds", None)
            if not table.get("unit_path"):
                table.pop("unit_path", None)
        if body.get("periods") is None:
            body.pop("periods", None)
        canonical = json.dumps(body, sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def resolve(self, path: Path) -> Path:
        return path if path.is_absolute() else (self.base_dir / path).resolve()
