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
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlglot import exp

from dpsql.errors import ParameterError
from dpsql.policy.engine import EngineSpec
from dpsql.policy.numbers import (
    MAX_ABS_BOUND,
    MAX_CONTRIBUTION_BOUND,
    MAX_QUERY_EPSILON,
    MAX_TOTAL_EPSILON,
    Exact,
    check_delta,
    check_epsilon,
)

__all__ = [
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
]

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CATALOG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}(\.[A-Za-z_][A-Za-z0-9_]{0,127}){0,2}$")

PublicValue = str | int | float | bool | dt.date | dt.datetime | None
MAX_DATE_RANGE_DAYS = 36_600  # a century of days: the largest domain date_trunc('day') gets


def _as_date(value: dt.date) -> dt.date:
    return value.date() if isinstance(value, dt.datetime) else value


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class DatasetSpec(_Frozen):
    """Identity of the data set: the budget belongs to ``id``; ``data_version`` keys the cache."""

    id: str = Field(min_length=1, max_length=200)
    data_version: str = Field(default="1", min_length=1, max_length=200)


class DataSpec(_Frozen):
    """Where the data lives: a DuckDB file, and/or Parquet or CSV files mapped to table names."""

    database: Path | None = None
    tables: dict[str, Path] = Field(default_factory=dict)
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
        if self.database is None and not self.tables and not self.catalog:
            raise ValueError("give data.database or data.tables")
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


Mechanism = Literal["laplace", "gaussian"]
# Versions of the fixed parameters the rdp and zcdp filters take where the policy states none
# (the grid of orders, the split of delta across it, the selection reserve): 1 the first, 2
# the current (docs/accounting.md). A ledger pins the version it was created with.
FilterVersion = Literal[1, 2]
FILTER_VERSION: FilterVersion = 2
# The largest sigma of a declared discrete Gaussian: its PLD sums the pmf point by point over
# 22 sigma (dpsql.mechanisms.pld_lattice.MAX_SIGMA2).
MAX_DECLARED_SIGMA = 10**5
MAX_DECLARED_SENSITIVITY = 10**6


class DeclaredMechanism(_Frozen):
    """The one mechanism of the PLD filter (``accountant = "pld"``), in grid units: every
    measurement is a discrete Laplace of ``scale`` (or a discrete Gaussian of ``sigma``) on one
    coordinate that one unit shifts by at most ``sensitivity``. One mechanism repeated is the
    totally ordered family of the natural PLD filter (Regehr et al. 2026)."""

    kind: Literal["discrete_laplace", "discrete_gaussian"]
    sensitivity: int = Field(ge=1, le=MAX_DECLARED_SENSITIVITY)
    scale: Exact | None = None
    sigma: Exact | None = None

    @model_validator(mode="after")
    def _valid(self) -> DeclaredMechanism:
        laplace = self.kind == "discrete_laplace"
        noise, other = ("scale", "sigma") if laplace else ("sigma", "scale")
        value = self.scale if laplace else self.sigma
        if value is None or getattr(self, other) is not None:
            raise ValueError(f"a declared {self.kind} takes {noise} (and not {other})")
        if laplace and not 0 < self.sensitivity <= MAX_QUERY_EPSILON * value:
            raise ValueError("declared_mechanism: epsilon = sensitivity/scale must be in (0, 20]")
        # rho = sensitivity^2/(2 sigma^2) <= 10, the largest per-query rho a setting may ask.
        if not laplace and not 20 * value**2 >= self.sensitivity**2:
            raise ValueError("declared_mechanism: sigma must be at least sensitivity/sqrt(20)")
        if not laplace and value > MAX_DECLARED_SIGMA:
            raise ValueError(f"declared_mechanism: sigma must be at most {MAX_DECLARED_SIGMA}")
        return self

    @property
    def mechanism(self) -> Mechanism:
        """The session's name of its noise."""
        return "laplace" if self.kind == "discrete_laplace" else "gaussian"


class ShareSpec(_Frozen):
    """An analyst's share of the data set's budget, under the same filter."""

    epsilon: Exact
    delta: Exact = Fraction(0)


class BudgetSpec(_Frozen):
    """The total budget of the data set, the filter that guards it, per-query defaults."""

    epsilon: Exact | None = None
    delta: Exact = Fraction(0)
    # A zCDP budget instead of epsilon (with accountant = "zcdp"): the filter caps the summed
    # rho, and the epsilon it certifies at delta is the report's total.
    rho: Exact | None = None
    query_epsilon: Exact = Fraction(1, 10)
    query_delta: Exact = Fraction(0)
    mechanism: Mechanism = "laplace"
    # The filter that decides admission, valid under fully adaptive composition: the name of a
    # registered accountant that is a filter (basic, advanced, rdp, zcdp, pld), checked where
    # the budget is built (dpsql.accounting.registry), a later stage than the policy.
    accountant: str = Field(default="basic", pattern=r"^[a-z][a-z0-9_]*$", max_length=64)
    advanced_delta_prime: Exact | None = None
    rdp_order: float | None = Field(default=None, gt=1, le=1024)
    # Under the rdp and zcdp filters: the part of delta reserved for the additive deltas of
    # partition selection (approximate RDP / zCDP); the rest goes to the conversion.
    selection_delta: Exact | None = None
    # Under the rdp and zcdp filters: the version of their defaults; None is the current one
    # when a ledger is created, and the ledger's own when it is opened (store.pinned_spec).
    filter_version: FilterVersion | None = None
    # Under accountant = "pld": the one mechanism every measurement must be (the filter's
    # totally ordered family, fixed before the first query).
    declared_mechanism: DeclaredMechanism | None = None
    analysts: dict[str, ShareSpec] = Field(default_factory=dict)
    # A query on bounds dpsql did not choose also releases what they cut, at this share of the
    # query's epsilon more (dpsql.plan.diagnosis); off: only when an analyst asks for it.
    diagnose: bool = True
    diagnose_share: Exact = Fraction(1, 10)

    @model_validator(mode="after")
    def _valid(self) -> BudgetSpec:
        if (self.epsilon is None) == (self.rho is None):
            raise ValueError("give budget.epsilon, or budget.rho with accountant = 'zcdp'")
        if self.rho is not None and self.accountant != "zcdp":
            raise ValueError("budget.rho needs accountant = 'zcdp'")
        try:
            if self.epsilon is not None:
                check_epsilon(self.epsilon, "budget.epsilon", MAX_TOTAL_EPSILON)
            if self.rho is not None:
                check_epsilon(self.rho, "budget.rho", MAX_TOTAL_EPSILON)
            check_epsilon(self.query_epsilon, "budget.query_epsilon", MAX_QUERY_EPSILON)
            check_delta(self.delta, "budget.delta")
            check_delta(self.query_delta, "budget.query_delta")
            check_epsilon(self.diagnose_share, "budget.diagnose_share", Fraction(1))
        except ParameterError as exc:
            raise ValueError(str(exc)) from None
        if self.mechanism == "gaussian" and (self.delta == 0 or self.query_delta == 0):
            raise ValueError("the gaussian mechanism needs delta > 0 and query_delta > 0")
        if self.accountant == "advanced":
            prime = self.advanced_delta_prime
            if prime is None or not 0 < prime < self.delta:
                raise ValueError("the advanced filter needs 0 < advanced_delta_prime < delta")
        elif self.advanced_delta_prime is not None:
            raise ValueError("advanced_delta_prime is only used by accountant = 'advanced'")
        if self.rdp_order is not None and self.accountant != "rdp":
            raise ValueError("rdp_order is only used by accountant = 'rdp'")
        if self.selection_delta is not None and (
            self.accountant not in ("rdp", "zcdp") or not 0 <= self.selection_delta < self.delta
        ):
            raise ValueError("selection_delta needs accountant rdp or zcdp and 0 <= it < delta")
        if self.filter_version is not None and self.accountant not in ("rdp", "zcdp"):
            raise ValueError("filter_version is only used by accountant 'rdp' or 'zcdp'")
        if self.accountant in ("rdp", "zcdp") and self.delta == 0:
            raise ValueError(f"the {self.accountant} filter needs delta > 0")
        self._declared()
        for name, share in self.analysts.items():
            within = self.epsilon is None or share.epsilon <= self.epsilon
            if not (share.epsilon > 0 and within and 0 <= share.delta <= self.delta):
                raise ValueError(f"analysts.{name}: a share must lie within the total budget")
            if self.needs_delta and share.delta == 0:
                raise ValueError(f"analysts.{name}: the {self.accountant} filter needs delta > 0")
        return self

    @property
    def needs_delta(self) -> bool:
        """Whether the filter admits nothing at delta 0 (RDP and zCDP conversions, and the
        discrete Gaussian's PLD, have delta(epsilon) > 0 at every epsilon)."""
        gaussian = self.declared_mechanism is not None and self.declared_mechanism.kind != (
            "discrete_laplace"
        )
        return self.accountant in ("rdp", "zcdp") or gaussian

    def _declared(self) -> None:
        if (self.accountant == "pld") != (self.declared_mechanism is not None):
            raise ValueError("accountant = 'pld' goes with budget.declared_mechanism, and only it")
        declared = self.declared_mechanism
        gaussian = declared is not None and declared.kind == "discrete_gaussian"
        # query_delta: the delta at which a declared Gaussian query's charged epsilon is stated.
        if gaussian and (self.delta == 0 or self.query_delta == 0):
            raise ValueError("a declared discrete_gaussian needs delta > 0 and query_delta > 0")


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


class TableSpec(_Frozen):
    """A private table (with a privacy unit and contribution bounds) or a public table."""

    privacy_unit: str | None = None
    public: bool = False
    max_groups_per_unit: int | None = Field(default=None, ge=1, le=MAX_CONTRIBUTION_BOUND)
    max_rows_per_unit_per_group: int | None = Field(default=None, ge=1, le=MAX_CONTRIBUTION_BOUND)
    # R: rows one unit may contribute in total, across groups (DESIGN.md section 3); optional.
    max_rows_per_unit: int | None = Field(default=None, ge=1, le=MAX_CONTRIBUTION_BOUND)
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
        if self.public == (self.privacy_unit is not None):
            raise ValueError("a table is either public = true or has a privacy_unit")
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
        return self

    @property
    def is_private(self) -> bool:
        return self.privacy_unit is not None


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

    @property
    def version(self) -> str:
        """A hash of the policy's canonical form: any change to it changes the version."""
        # The engine's settings change the speed, the server's the display, never an answer:
        # neither is part of the version; nor is the default diagnosis, which its release's
        # cache key holds (dpsql.cache.keys).
        skip: dict[str, bool | set[str]] = {"engine": True, "server": True}
        skip["budget"] = {"diagnose", "diagnose_share"}
        body = self.model_dump(mode="json", exclude=skip)
        canonical = json.dumps(body, sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def resolve(self, path: Path) -> Path:
        return path if path.is_absolute() else (self.base_dir / path).resolve()
