"""The policy's ``[engine]`` section: which engine runs the bounded queries, and how.

DuckDB, embedded, is the default; Apache Spark takes a master (or a Spark Connect address) and
its settings, except those the guarantees depend on, which dpsql pins (``SPARK_PINNED``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["SPARK_PINNED", "EngineSpec"]

# DuckDB's own size syntax: a number and a unit, or a share of the machine's memory.
_MEMORY = re.compile(r"^[0-9]{1,9}(\.[0-9]{1,3})? ?(B|KB|MB|GB|TB|KIB|MIB|GIB|TIB|%)$", re.I)


# A Spark master URL or Spark Connect address: a scheme and an address, nothing to interpret.
_SPARK_URL = re.compile(r"^(local(\[([0-9]{1,4}|\*)\])?|(spark|yarn|k8s|mesos|sc)(://\S{1,500})?)$")
_SPARK_CONF = re.compile(r"^spark\.[A-Za-z0-9_.\-]{1,200}$")
# Settings the engine pins for the guarantees (docs/engines.md): a policy cannot change them.
SPARK_PINNED = {
    "spark.sql.ansi.enabled": "true",  # overflow raises instead of wrapping silently
    "spark.sql.session.timeZone": "UTC",  # dates and timestamps as DuckDB reads them
    "spark.ui.enabled": "false",  # the UI shows query text: off unless the owner runs one
    # Parquet dates and timestamps before 1582 read as stored (proleptic Gregorian), as DuckDB
    # reads them: EXCEPTION would fail a query on one old value, LEGACY would shift it.
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
    # A Parquet timestamp without a zone stays TIMESTAMP_NTZ, DuckDB's TIMESTAMP.
    "spark.sql.parquet.inferTimestampNTZ.enabled": "true",
    "spark.sql.caseSensitive": "false",  # names resolve as on DuckDB, case-insensitively
}


class EngineSpec(BaseModel):
    """Which engine runs the bounded queries, and how: DuckDB (embedded, the default) with its
    memory cap (beyond it, work spills to disk), spill folder and threads; or Apache Spark with
    its master (or a Spark Connect address) and configuration. Public settings: they change the
    speed, never an answer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Literal["duckdb", "spark"] = "duckdb"
    master: str | None = Field(default=None, max_length=520)  # Spark: local[2], spark://...
    remote: str | None = Field(default=None, max_length=520)  # Spark Connect: sc://host:15002
    conf: dict[str, str] = Field(default_factory=dict, max_length=200)  # Spark settings
    # Half the machine's memory: DuckDB's own default (80%) leaves too little for the rest.
    memory_limit: str = Field(default="50%", max_length=20)
    temp_directory: Path | None = None  # default: a private directory under the system's
    # The most the engine may write to temp_directory (DuckDB's max_temp_directory_size): past
    # it a query fails as past its memory. Default: DuckDB's, 90% of the disk's free space.
    max_spill: str | None = Field(default=None, max_length=20)
    threads: int | None = Field(default=None, ge=1, le=1024)  # default: every core

    @field_validator("memory_limit")
    @classmethod
    def _memory(cls, value: str) -> str:
        match = _MEMORY.match(value.strip())
        if match is None:
            raise ValueError("memory_limit must be a size like '4GB', '512MiB' or '50%'")
        if match.group(2) == "%" and not 0 < float(value.strip()[:-1]) <= 100:
            raise ValueError("a memory_limit share must be above 0% and at most 100%")
        return value.strip()

    @field_validator("max_spill")
    @classmethod
    def _spill(cls, value: str | None) -> str | None:
        if value is None:
            return None
        match = _MEMORY.match(value.strip())
        if match is None or match.group(2) == "%":
            raise ValueError("max_spill must be a size like '100GB' or '512MiB'")
        return value.strip()

    @field_validator("master", "remote")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not _SPARK_URL.match(value):
            raise ValueError("must be a Spark master (local[N], spark://, yarn, k8s://) or sc://")
        return value

    @field_validator("conf")
    @classmethod
    def _conf(cls, conf: dict[str, str]) -> dict[str, str]:
        for key, value in conf.items():
            if not _SPARK_CONF.match(key):
                raise ValueError("keys must be Spark settings (spark.<name>)")
            if key in SPARK_PINNED and value.strip().lower() != SPARK_PINNED[key].lower():
                raise ValueError(f"{key} is pinned to {SPARK_PINNED[key]} by dpsql")
            if len(value) > 1000:
                raise ValueError("values must be at most 1,000 characters")
        return conf

    @model_validator(mode="after")
    def _spark_fields(self) -> EngineSpec:
        spark = (self.master, self.remote, self.conf or None)
        if self.name != "spark" and any(v is not None for v in spark):
            raise ValueError('master, remote and conf apply to name = "spark" only')
        if self.master is not None and self.remote is not None:
            raise ValueError("give master or remote (Spark Connect), not both")
        return self
