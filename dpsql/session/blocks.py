"""Tables made of blocks: registering a block, and the blocks a plan reads.

``register`` is the owner's act (``dpsql blocks add`` and ``replace``): it checks a block's files
(regular Parquet files, their columns as their footers declare them: never a row), its period
and id, and appends its ledger record (``dpsql.accounting.ledger.blocks``); every session sees
it before its next plan (``Session``). ``blocks_read`` is what a plan reads of each table made
of blocks: its active blocks, less those whose period the query's WHERE excludes (its tests of
the period column, where the relation passes that column through from the table's only scan).
It decides only the release's key (``dpsql.cache.keys.data_key``): the engine reads the table's
view, whose rows each lie within their block's period (``dpsql.engine.duckdb.views.
block_source``), so a block whose period the WHERE excludes gives the query no row, and what the
query measures is the same with or without it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from pathlib import Path

import sqlglot
from sqlglot import exp

from dpsql.accounting.ledger.blocks import BLOCK_KINDS, BLOCK_RECORD, BLOCK_REMOVAL, block_list
from dpsql.accounting.ledger.chain import Record
from dpsql.accounting.ledger.store import Store
from dpsql.analyze.analysis import Analysis
from dpsql.engine.duckdb.blocks import parquet_columns
from dpsql.engine.duckdb.views import BLOCK_FILE
from dpsql.errors import ParameterError, PolicyError
from dpsql.plan.plans import Plan
from dpsql.policy import PERIOD_COLUMN, Policy
from dpsql.policy.blocks import BLOCK_ID, Block, BlockList, iso_date
from dpsql.policy.files import identify, regular_file

__all__ = ["blocks_read", "register", "remove"]

# The period column's types: a DATE, or a TIMESTAMP compared with a date at its midnight (a
# TIMESTAMP WITH TIME ZONE would depend on the session's time zone).
PERIOD_TYPES = ("DATE", "TIMESTAMP")
MAX_FILES = 10_000  # files of one block


def _decide(block: Block) -> Callable[[list[Record]], None]:
    """The checks against the ledger, made under its lock as the record is appended (two owners
    registering at once cannot both pass them): a new id, a replaced block that is active, a
    period that overlaps no other active block, the columns of the table's other blocks."""

    def decide(records: list[Record]) -> None:
        blocks = block_list(records)
        table, active = block.table, blocks.active(block.table)
        if any(b.table == table and b.id == block.id for b in blocks.registered):
            raise ParameterError(f"table {table} already has a block {block.id}")
        if block.replaces is not None and all(b.id != block.replaces for b in active):
            raise ParameterError(f"table {table} has no active block {block.replaces} to replace")
        others = [b for b in active if b.id != block.replaces]
        held = {(f.device, f.inode): b.id for b in others for f in b.files}
        again = next((f for f in block.files if (f.device, f.inode) in held), None)
        if again is not None:
            # One file in two blocks would be read twice, its rows kept against either period.
            raise ParameterError(
                f"the file {again.path} is already a file of block "
                f"{held[(again.device, again.inode)]} of table {table}"
            )
        if len({(f.device, f.inode) for f in block.files}) != len(block.files):
            raise ParameterError(f"block {block.id} lists one file twice")
        clash = next((b for b in others if b.overlaps(block)), None)
        if clash is not None:
            raise ParameterError(
                f"the period of block {block.id} overlaps that of block {clash.id} of table "
                f"{table}; a correction replaces the block it corrects"
            )
        if others and set(others[0].columns) != set(block.columns):
            raise PolicyError(
                f"block {block.id} declares other columns than the blocks of table {table}"
            )

    return decide


def register(
    policy: Policy,
    store: Store,
    table: str,
    block_id: str,
    *,
    period: tuple[str, str],
    paths: Sequence[Path],
    replaces: str | None = None,
    by: str | None = None,
) -> Block:
    """Register a block of ``table`` (its files, its period [start, end)); with ``replaces``,
    as the correction of that active block. Nothing of the files is read but their footers.
    A relative path is the policy folder's (``dpsql blocks`` passes absolute ones)."""
    name = table.lower()
    spec = policy.data.blocks.get(name)
    if spec is None:
        raise ParameterError(f"data.blocks names no table {table}")
    if not BLOCK_ID.match(block_id):
        raise ParameterError(
            "a block id is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    first, last = iso_date(period[0]), iso_date(period[1])
    if first is None or last is None or first >= last:
        raise ParameterError("a block's period is two dates YYYY-MM-DD, the start before the end")
    if not paths or len(paths) > MAX_FILES:
        raise ParameterError(f"a block has 1 to {MAX_FILES} files")
    files = []
    for path in paths:
        resolved = policy.resolve(Path(path))
        if resolved.suffix.lower() != ".parquet":
            raise ParameterError(f"a block's files are Parquet files (.parquet): {path}")
        info = regular_file(resolved, f"a file of block {block_id}")
        files.append(identify(name, resolved.resolve(), info))
    columns = parquet_columns([f.path for f in files], name)
    types = dict(columns)
    for kept in (BLOCK_FILE, PERIOD_COLUMN):
        if kept in {c.lower() for c in types}:
            raise PolicyError(f"the block's files have a column {kept}, a name dpsql keeps")
    if types.get(spec.period) not in PERIOD_TYPES:
        raise PolicyError(
            f"data.blocks.{name}.period: the block's files have no column {spec.period} of type "
            "DATE or TIMESTAMP"
        )
    declared = policy.tables.get(name)
    for column in declared.columns if declared is not None else {}:
        if column.lower() not in types:
            raise PolicyError(
                f"tables.{name}.columns.{column}: the block's files have no such column"
            )
    block = Block(name, block_id, first, last, tuple(files), columns, replaces)
    record = store.append(BLOCK_RECORD, block.payload(), by, _decide(block))
    return Block.of(record.payload, record.seq)


def remove(policy: Policy, store: Store, table: str, block_id: str, by: str | None = None) -> int:
    """Remove the active block ``block_id`` of ``table`` without a replacement (the owner no
    longer keeps its data): no later plan reads it, and every release that read it is retired.
    Its files may then be deleted. The ledger record's sequence number."""
    name = table.lower()
    if name not in policy.data.blocks:
        raise ParameterError(f"data.blocks names no table {table}")

    def decide(records: list[Record]) -> None:
        if all(b.id != block_id for b in block_list(records).active(name)):
            raise ParameterError(f"table {table} has no active block {block_id} to remove")

    return store.append(BLOCK_REMOVAL, {"table": name, "id": block_id}, by, decide).seq


# -- the blocks a plan reads -----------------------------------------------------------------------


def _date(node: exp.Expression) -> dt.date | None:
    """A date constant written DATE 'YYYY-MM-DD', CAST('YYYY-MM-DD' AS DATE) or 'YYYY-MM-DD'
    (which DuckDB casts to the column's DATE alike); anything else is not read."""
    if isinstance(node, exp.Cast) and node.to.this == exp.DataType.Type.DATE:
        node = node.this
    if isinstance(node, exp.Literal) and node.is_string:
        return iso_date(node.this)
    return None


# A test column OP constant excludes block [start, end) when: (start and end are midnights; a
# row's value v lies in [start, end), a DATE or a TIMESTAMP, and a date d is its midnight)
_EXCLUDES: dict[type[exp.Binary], Callable[[dt.date, dt.date, dt.date], bool]] = {
    exp.GTE: lambda d, s, e: d >= e,  # v >= d: none when d >= end
    exp.GT: lambda d, s, e: d >= e,  # v > d: none when d >= end (a TIMESTAMP may pass d)
    exp.LT: lambda d, s, e: d <= s,  # v < d: none when d <= start
    exp.LTE: lambda d, s, e: d < s,  # v <= d: none when d < start
    exp.EQ: lambda d, s, e: d < s or d >= e,
}
_FLIP: dict[type[exp.Binary], type[exp.Binary]] = {
    exp.GTE: exp.LTE, exp.GT: exp.LT, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.EQ: exp.EQ
}  # fmt: skip
Test = tuple[type[exp.Binary], dt.date]


def _tests(where: exp.Expression | None, column: str) -> list[Test]:
    """The tests ``column OP date`` among WHERE's top-level AND terms: each holds on every row
    the query keeps (a row WHERE keeps makes each AND term TRUE)."""
    if where is None:
        return []
    out: list[Test] = []
    terms = list(where.flatten()) if isinstance(where, exp.And) else [where]
    for found in terms:
        term = found.unnest() if isinstance(found, exp.Paren) else found
        if isinstance(term, exp.Between) and _is(term.this, column):
            low, high = _date(term.args["low"]), _date(term.args["high"])
            out += [(exp.GTE, low)] if low is not None else []
            out += [(exp.LTE, high)] if high is not None else []
        elif isinstance(term, exp.Binary) and type(term) in _EXCLUDES:
            left, right = term.this, term.expression
            if _is(left, column) and (d := _date(right)) is not None:
                out.append((type(term), d))
            elif _is(right, column) and (d := _date(left)) is not None:
                out.append((_FLIP[type(term)], d))
    return out


def _is(node: exp.Expression, column: str) -> bool:
    return isinstance(node, exp.Column) and not node.table and node.name.lower() == column


def _passed_through(a: Analysis, table: str, period: str) -> str | None:
    """The name the relation gives ``table``'s period column when it passes it through
    unchanged from the table's only scan: then a row the WHERE keeps came from a row of the
    table whose period value passes the WHERE's tests, and every other row of the table
    (another block's) is in no row the WHERE keeps. None where that is not plain: the table
    read twice (a self-join: its other scan's rows join those kept), a relation that groups,
    aggregates, ranks or removes duplicates (a row kept may summarise rows of other blocks), a
    set operation, or a column renamed by an expression."""
    if a.base:
        return period if a.source == '"' + table + '"' and a.table == table else None
    try:
        tree = sqlglot.parse_one(f"SELECT * FROM {a.source}", read="duckdb")
    except sqlglot.errors.ParseError:
        return None
    scans = [t for t in tree.find_all(exp.Table) if t.name.lower() == table]
    from_ = tree.args.get("from_")
    source = from_.this if isinstance(from_, exp.From) else None
    if len(scans) != 1 or not isinstance(source, exp.Subquery):
        return None
    select = source.this
    if not isinstance(select, exp.Select) or any(
        select.args.get(k) for k in ("group", "having", "distinct", "qualify", "limit")
    ):
        return None
    if any(select.find_all(exp.AggFunc, exp.Window)):
        return None
    scan = scans[0]
    joins = select.args.get("joins") or []
    if scan.parent not in (select.args.get("from_"), *joins):
        return None  # the table is read inside a nested relation
    for item in select.expressions:
        inner = item.this if isinstance(item, exp.Alias) else item
        if not isinstance(inner, exp.Column) or inner.name.lower() != period:
            continue
        if inner.table == scan.alias_or_name or (not inner.table and not joins):
            return str(item.alias_or_name).lower()
    return None


def blocks_read(
    plan: Plan, blocks: BlockList, policy: Policy
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Each table made of blocks that ``plan`` reads, with the ids of its active blocks the
    query's WHERE does not exclude: its tests of the table's period column (``_tests``), where
    the relation passes that column through unchanged (``_passed_through``); else every active
    block."""
    a = plan.analysis
    read = []
    for table in sorted({a.table, *a.tables} & set(policy.data.blocks)):
        column = _passed_through(a, table, policy.data.blocks[table].period)
        tests = _tests(a.where, column) if column is not None else []
        ids = tuple(
            b.id
            for b in blocks.active(table)
            if not any(_EXCLUDES[op](d, b.start, b.end) for op, d in tests)
        )
        read.append((table, ids))
    return tuple(read)


class Registered:
    """The blocks a session's engine binds, and how far it has read the ledger for more."""

    def __init__(self, policy: Policy, store: Store):
        self.tables = tuple(policy.data.blocks)
        records = store.records() if self.tables else []
        self._seen = len(records)
        self.blocks = block_list(records)

    def token(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        return self.blocks.token(self.tables)

    def moved(self, store: Store) -> tuple[BlockList, int] | None:
        """The blocks registered now and how many records that read, if any block was
        registered since the last ``commit``; None if none was."""
        if not self.tables:
            return None
        new = store.records_since(self._seen)
        if not any(r.kind in BLOCK_KINDS for r in new):
            self._seen += len(new)
            return None
        records = store.records()
        return block_list(records), len(records)

    def commit(self, blocks: BlockList, seen: int) -> None:
        """The engine now binds ``blocks``: plans read them (until then, the old list, which
        the engine still binds; ``moved`` offers the new one again)."""
        self.blocks, self._seen = blocks, seen
