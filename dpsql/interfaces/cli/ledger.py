"""``dpsql init`` and ``dpsql ledger``: the ledger a policy names, created, verified, exported.

``init`` creates the ledger, its first record pinning the policy's budget; ``ledger verify``
checks the whole chain against the anchor, ``ledger export`` writes every record with its chain,
and ``ledger pin-budget`` records the budget in a ledger created before ledgers pinned it. The
commands open the ledger through ``open_ledger`` (verified, and checked to be the policy's data
set's; the web console's owner page too) and write files through ``_write``, which the budget
and report commands of ``cli.py`` use too.
These are click commands for the ``dpsql`` group (``cli.py`` registers them); they read the
group's ``Config`` (``context.py``) and never import ``cli`` (no import cycle).
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import click

from dpsql.accounting.ledger.chain import GENESIS, Record
from dpsql.accounting.ledger.ledger import BUDGET_RECORD, Ledger
from dpsql.accounting.ledger.store import budget_caps, create_ledger
from dpsql.errors import LedgerError, OutputError
from dpsql.interfaces.cli.context import Config, pass_config
from dpsql.interfaces.cli.params import EPSILON, TEXT, _decimal
from dpsql.interfaces.cli.setup_bounds import setup_statements
from dpsql.policy import Policy
from dpsql.policy.numbers import decimal_text
from dpsql.session.session import Session

__all__ = ["export", "init", "ledger", "open_ledger", "pin_budget", "verify"]


def _paths(policy: Policy) -> tuple[Path, Path | None]:
    assert policy.ledger is not None  # Config.policy checked it
    anchor = policy.resolve(policy.ledger.anchor) if policy.ledger.anchor is not None else None
    return policy.resolve(policy.ledger.path), anchor


def open_ledger(policy: Policy) -> Ledger:
    """The policy's ledger, verified against its anchor and checked to be this data set's."""
    ledger = Ledger(*_paths(policy))
    if ledger.identity.get("dataset") != policy.dataset.id:
        ledger.close()
        raise LedgerError("the ledger belongs to another data set than the policy names")
    return ledger


def _write(text: str, output: Path | None) -> None:
    """Write a report or an export to ``output`` (or standard output); a file that cannot be
    written (a full disk, a folder that is not one) is an ``OutputError`` naming it."""
    try:
        if output is None:
            click.echo(text, nl=False)
        else:
            output.write_text(text, encoding="utf-8")
    except OSError as exc:
        where = "standard output" if output is None else str(output)
        reason = exc.strerror.lower() if exc.strerror else "failed"
        raise OutputError(f"cannot write {where}: {reason}") from None


@click.command()
@click.option(
    "--estimate-bounds",
    "estimate",
    type=EPSILON,
    default=None,
    help="Then spend this epsilon estimating the bounds the policy leaves unset.",
)
@click.option(
    "--for-epsilon",
    "target",
    type=EPSILON,
    default=None,
    help="The epsilon of the queries those bounds are for (default: budget.query_epsilon).",
)
@pass_config
def init(config: Config, estimate: Fraction | None, target: Fraction | None) -> None:
    """Create the ledger named by the policy's [ledger] section (refuses to overwrite).

    Its first record pins the policy's budget: the caps, the deciding filter and its fixed
    parameters, the analysts' shares. Sessions refuse a policy that disagrees with it. With
    --estimate-bounds, the bounds the policy leaves unset are then estimated (ESTIMATE BOUNDS,
    charged to the new ledger, aimed at queries at --for-epsilon).
    """
    policy = config.policy()
    ledger = create_ledger(policy, config.analyst)
    click.echo(f"created ledger {ledger.identity['ledger_id']} for data set {policy.dataset.id}")
    budget = policy.budget
    cap = (
        f"epsilon {_decimal(budget.epsilon)}"
        if budget.epsilon is not None
        else f"rho {_decimal(budget.rho)}"
    )
    click.echo(f"budget: {cap}, delta {_decimal(budget.delta)}, {budget.accountant} filter")
    click.echo(f"ledger: {ledger.path}")
    click.echo(f"anchor: {ledger.anchor}")
    ledger.close()  # the connection is not left to the garbage collector
    if estimate is not None:
        _estimate(config, estimate, target or policy.budget.query_epsilon)


def _estimate(config: Config, epsilon: Fraction, target: Fraction) -> None:
    """``init --estimate-bounds``: each statement of ``setup_statements`` at an equal part of
    ``epsilon``, charged as the owner; each estimate printed with what it cuts."""
    session = Session(config.policy(), config.analyst)
    try:
        statements = setup_statements(session.policy, session.engine.catalog, target)
        if not statements:
            click.echo("bounds: the policy declares every bound; nothing estimated")
            return
        each = epsilon / len(statements)
        for sql in statements:
            result = session.execute(sql, epsilon=each)
            for row in result.rows:
                click.echo("estimated " + " ".join(str(v) for v in row))
            click.echo(f"  {result.bounds_note}")
        spent = decimal_text(each * len(statements))
        click.echo(f"bounds: {len(statements)} estimate(s), epsilon {spent} charged in all")
    finally:
        session.close()


@click.group()
def ledger() -> None:
    """Verify or export the ledger."""


@ledger.command()
@pass_config
def verify(config: Config) -> None:
    """Verify the whole chain against the anchor; print the record count and the head."""
    opened = open_ledger(config.policy())
    try:
        records = opened.records()
        count = opened.verify()
    finally:
        opened.close()
    head = records[-1].hash if records else GENESIS
    click.echo(f"ledger {opened.identity['ledger_id']} ({opened.identity['dataset']}): ok")
    click.echo(f"records: {count}")
    click.echo(f"head: {head}")


@ledger.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "json"]),
    default="jsonl",
    show_default=True,
    help="One record per line, or one JSON document with the ledger's identity.",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write to this file instead of standard output.",
)
@pass_config
def export(config: Config, fmt: str, output: Path | None) -> None:
    """Every record with its chain (seq, time, kind, analyst, payload, prev, hash)."""
    opened = open_ledger(config.policy())
    records = list(opened.export())
    if fmt == "jsonl":
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    else:
        # The salt of the group-selection hash stays private: it is not part of the history.
        identity = {k: v for k, v in opened.identity.items() if k != "salt"}
        text = json.dumps({"ledger": identity, "records": records}, indent=2) + "\n"
    _write(text, output)


@ledger.command("pin-budget")
@click.option("--by", type=TEXT, help="Who pins the budget (default: --analyst).")
@click.option("--why", type=TEXT, required=True, help="Why (kept in the ledger).")
@pass_config
def pin_budget(config: Config, by: str | None, why: str) -> None:
    """Record the policy's budget in a ledger created before ledgers pinned it (once)."""
    by = config.actor(by)
    policy = config.policy()
    opened = open_ledger(policy)

    def once(records: list[Record]) -> None:  # decided inside the append's transaction
        if any(r.kind == BUDGET_RECORD for r in records):
            raise LedgerError("the ledger already records its budget; it cannot be pinned again")

    # A ledger from before the budget was pinned was decided by version 1 of the filters'
    # defaults: pinning a later one would choose the filter after the history.
    payload = {**budget_caps(policy.budget, filter_version=1), "why": why}
    record = opened.append(BUDGET_RECORD, payload, by, once)
    click.echo(f"record {record.seq}: the ledger's budget is now the policy's")
