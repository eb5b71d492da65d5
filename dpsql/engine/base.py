"""The one seam between dpsql and the engine that runs its bounded queries.

Everything above this interface (analysis, planning, accounting, noise, every interface) is the
same whichever engine runs: the bounded query is generated once, in DuckDB's dialect, from a
sqlglot tree, and an engine lowers it to its own dialect (``dpsql.engine.spark.lower`` for
Spark). ``open_engine`` picks the engine the policy names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from dpsql.engine.duckdb.engine import DuckDBEngine
from dpsql.engine.spark.engine import SparkEngine
from dpsql.policy import Policy
from dpsql.policy.blocks import BlockList
from dpsql.policy.files import FileSet

__all__ = ["Engine", "open_engine"]


class Engine(Protocol):
    """What the session asks of an engine. Every method but ``run`` reads no rows of private
    data: their outcome depends on the query and the schema only (DESIGN.md section 4)."""

    name: str
    # Runs a diagnosed query and its diagnosis as one statement (Diagnosis.together_sql).
    shares_rows: bool
    salt: int  # the secret of the keyed hash that picks a unit's groups and rows
    # The data files as the engine bound them (dpsql.policy.files): checked before each charge.
    files: FileSet

    @property
    def catalog(self) -> Mapping[str, Mapping[str, str]]:
        """table -> column -> type, in DuckDB's type names (the analysis reads them)."""

    @property
    def file_catalog(self) -> Mapping[str, Mapping[str, str]]:
        """``catalog`` with the columns the policy hides (``dpsql.policy.exposure``): for the
        owner's check of the policy at connect only, never a query."""

    @property
    def collations(self) -> Mapping[tuple[str, str], str]:
        """(table, column) -> collation; ``?`` where it is unknown."""

    def cell_key(self, table: str, column: str, literal_sql: str) -> str | None:
        """The key of the cell ``column = literal`` pins, or None (``dpsql.analyze.cells``)."""

    def key_domain(self, probe: str) -> list[str | None]:
        """The values of a public key domain, as text (``dpsql.analyze.domains.probe_sql``)."""

    def check(self, sql: str, types: bool = True) -> list[str]:
        """Plan ``sql`` without reading rows, before the charge; its column types."""

    def check_soon(self, sql: str, types: bool = True) -> Callable[[], list[str]]:
        """``check`` started in the background; the function returned waits for it."""

    def describe(self, sql: str) -> list[tuple[str, str]]:
        """The output column names and types of a SELECT, by binding it."""

    def run(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run a bounded query; any failure is the one generic ``EngineError``."""

    def shown_sql(self, sql: str) -> str:
        """The bounded query as this engine runs it, pretty-printed for EXPLAIN, its secrets
        (the salt) as placeholders."""

    def interrupt(self) -> None:
        """Stop the running query; it then fails with an ``EngineError``."""

    def close(self) -> None:
        """Release the engine's connections and files; a second call does nothing."""


def open_engine(
    policy: Policy, salt: int, memory_limit: str | None = None, blocks: BlockList | None = None
) -> Engine:
    """The engine ``[engine] name`` names: DuckDB unless the policy says Spark. ``blocks``: the
    registered blocks of the tables made of blocks (DuckDB only; Spark refuses such tables)."""
    if policy.engine.name == "spark":
        return SparkEngine(policy, salt)  # pyspark is imported only then
    return DuckDBEngine(policy, salt, memory_limit, blocks=blocks)
