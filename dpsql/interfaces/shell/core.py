"""``Shell``: one shell over a ``Session``, one complete input at a time.

``Shell.handle`` takes a statement ended by ``;`` or a backslash meta-command and returns the
text to show (rich tables rendered to text), so the shell's whole behaviour is testable without
a terminal; ``prompt`` and ``toolbar`` show the budget as last read from the ledger. The
meta-commands (``\\budget``, ``\\ledger``, ``\\explain``, ``\\tables``, ``\\describe``,
``\\cache``, ``\\diagnose``, ``\\help``) are its methods; none of them charges anything
(``\\diagnose`` only turns ``dpsql.diagnose`` on or off for the queries that follow). The
loops that feed it and the ``dpsql shell`` command are in ``shell.py``.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import Any

import click
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from dpsql.accounting.budget.report import (
    cap_text,
    figure_left,
    figure_value,
    left_text,
    spent_text,
)
from dpsql.errors import DpsqlError
from dpsql.interfaces.cli.budget_view import compare_line
from dpsql.interfaces.report.audit import overrides_of
from dpsql.interfaces.report.report import iso_time
from dpsql.interfaces.shell.input import DEFAULT_LEDGER_ROWS, META, SqlCompleter, split_statements
from dpsql.plan.explain import explain
from dpsql.policy.numbers import exact
from dpsql.release.cells import Accuracy, accuracy_forms
from dpsql.release.result import (
    INTERVALS_COVER,
    Result,
    cell,
    covers,
    intervals_confidence,
    shown_rows,
)
from dpsql.session.overrides import override_text
from dpsql.session.session import Session

__all__ = ["Shell"]


def _num(value: Fraction | float) -> str:
    """An epsilon or delta for people: exact when short, else six significant digits."""
    if isinstance(value, Fraction):
        text = exact(value) or ""
        return text if len(text) <= 10 else f"{float(value):.6g}"
    return f"{value:.6g}"


def _stored(payload: dict[str, Any], key: str) -> str:
    """A ledger record's exact number (kept as ``p/q`` text) as a decimal people read."""
    try:
        return _num(Fraction(str(payload.get(key))))
    except (ValueError, ZeroDivisionError):
        return str(payload.get(key))


def _error(message: str) -> str:
    return "Error: " + " ".join(message.split()) + "\n"


def _cell(value: Any, width: Accuracy, noise: bool = False) -> str:
    """``value ± half-width`` as every text interface prints it (``cell``), marked when it is
    mostly noise."""
    return cell(value, width, noise)


class Shell:
    """One shell over a session: ``handle`` an input, read the ``prompt`` and ``toolbar``."""

    def __init__(self, session: Session, *, width: int = 100, color: bool = False):
        self.session = session
        self.width, self.color = width, color
        self.finished = False
        # The first error an input met (a refusal, a bad query): a piped shell exits with its
        # code once its input is done (``dpsql.interfaces.shell.shell``).
        self.error: DpsqlError | None = None
        catalog = session.engine.catalog
        tables = sorted(set(session.policy.tables) | set(catalog))
        self.completer = SqlCompleter(tables, {t: sorted(catalog.get(t, {})) for t in tables})
        self.report = session.budget()

    # -- what is always visible ---------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the budget from the ledger (after every input, not on every keystroke)."""
        self.report = self.session.budget()

    def prompt(self) -> str:
        r = self.report
        return f"dpsql (eps {spent_text(r.epsilon_spent)}/{cap_text(r.epsilon_total)})> "

    def toolbar(self) -> str:
        r = self.report
        return (
            f"epsilon {spent_text(r.epsilon_spent)} spent of {cap_text(r.epsilon_total)} "
            f"({left_text(r.epsilon_remaining)} left) | delta {spent_text(r.delta_spent)} of "
            f"{cap_text(r.delta_total)} | {r.accountant} decides | {r.queries} charged queries"
        )

    # -- one input ------------------------------------------------------------------------------
    def handle(self, text: str) -> str:
        """The text to show for one complete input; never raises a dpsql or internal error."""
        shown = self._handle(text.strip())
        try:
            self.refresh()
        except DpsqlError as exc:  # the ledger became unreadable: say so, keep the old figures
            shown += _error(f"{type(exc).__name__}: {exc}")
        return shown

    def _handle(self, text: str) -> str:
        try:
            if not text:
                return ""
            if text.startswith("\\"):
                return self._meta(text)
            if text.rstrip(";").strip().lower() in ("quit", "exit"):
                self.finished = True
                return ""
            statements = split_statements(text)
            if len(statements) > 1:
                # Several statements at once: planned and charged as one workload.
                results = self.session.run_script(text)
                return "".join(self._render(r) for _, r in results if r is not None)
            return "".join(self._render(self.session.execute(s)) for s in statements)
        except DpsqlError as exc:
            self.error = self.error or exc
            return _error(f"{type(exc).__name__}: {exc}")
        except click.ClickException as exc:  # a misused meta-command
            return _error(exc.format_message())
        except Exception as exc:
            # Only the class: the message of an unexpected error might quote data.
            return f"Error: internal error ({type(exc).__name__}); please report this dpsql bug\n"

    def _meta(self, text: str) -> str:
        command, argument = [*text.split(None, 1), ""][:2]
        command, argument = command.lower(), argument.strip().rstrip(";").strip()
        if command in ("\\quit", "\\q"):
            self.finished = True
            return ""
        handlers = {
            "\\budget": self._budget, "\\ledger": self._ledger, "\\explain": self._explain,
            "\\tables": self._tables, "\\describe": self._describe, "\\cache": self._cache,
            "\\diagnose": self._diagnose, "\\help": self._help, "\\?": self._help,
        }  # fmt: skip
        handler = handlers.get(command)
        if handler is None:
            raise click.UsageError(f"unknown meta-command {command}; try \\help")
        return handler(argument)

    def _show(self, *items: RenderableType) -> str:
        buffer = io.StringIO()
        console = Console(
            file=buffer, width=self.width, force_terminal=self.color, no_color=not self.color,
            color_system="standard" if self.color else None, highlight=False, soft_wrap=False,
        )  # fmt: skip
        for item in items:
            console.print(item)
        return buffer.getvalue()

    def _render(self, result: Result) -> str:
        if not result.columns:
            return self._show(result.message or "ok")
        if result.columns == ("plan",) and result.charge is None and result.cached_from is None:
            return "\n".join([*(str(row[0]) for row in result.rows), "nothing was charged", ""])
        table = Table()
        numeric = [
            t.upper() not in ("VARCHAR", "DATE", "BOOLEAN", "TIMESTAMP") for t in result.types
        ]
        for name, right in zip(result.columns, numeric, strict=True):
            table.add_column(name, justify="right" if right else "left")
        for i, row in enumerate(shown_rows(result)):
            widths = result.accuracy[i] if i < len(result.accuracy) else ()
            flags = result.noise[i] if i < len(result.noise) else ()
            cells = [
                _cell(v, widths[j] if j < len(widths) else None, j < len(flags) and flags[j])
                for j, v in enumerate(row)
            ]
            table.add_row(*(Text(c) for c in cells))
        if result.plan is None:  # SHOW: a setting, nothing released
            return self._show(table)
        shown: list[RenderableType] = [table, Text(self._caption(result))]
        if (
            result.diagnosis is not None
            or result.bounds_note
            or any(w is not None for r in result.accuracy for w in r)
        ):
            shown.append(Text(self._covers(result)))
        return self._show(*shown)

    @staticmethod
    def _caption(result: Result) -> str:
        rows = f"{len(result.rows)} row(s)"
        if result.cached_from is not None:
            return f"{rows}; served from the cache (release #{result.cached_from}), no charge"
        if result.charge is None:
            return f"{rows}; nothing was charged"
        charge = result.charge
        cost = f"charged epsilon {_num(charge.epsilon)}, delta {_num(charge.delta)}"
        widths, intervals = accuracy_forms(result.accuracy)
        confidence = ""
        if result.confidence and widths:
            confidence += f"; ± at {result.confidence:.4g} confidence"
        if result.confidence and intervals:
            confidence += f"; [lo, hi] at {intervals_confidence(result):.4g} confidence"
        return f"{rows}{confidence}; {cost} (ledger record #{charge.seq})"

    @staticmethod
    def _covers(result: Result) -> str:
        """What the ± and the intervals cover, and with a diagnosis its every figure."""
        widths, intervals = accuracy_forms(result.accuracy)
        lines = [f"±: {covers(result)}"] if widths or not intervals else []
        if intervals:
            lines.append(f"[lo, hi]: {INTERVALS_COVER}")
        line = "\n".join(lines)
        if result.diagnosis is not None:
            line += f"\ndiagnosis: {result.diagnosis.describe()}"
        if result.bounds_note:
            line += f"\n{result.bounds_note}"
        return line

    # -- meta-commands --------------------------------------------------------------------------
    def _budget(self, argument: str) -> str:
        report = self.report = self.session.budget()
        if argument.strip().lower() not in ("", "compare"):
            raise click.UsageError("\\budget takes nothing, or compare (every theorem)")
        if not argument.strip():  # the lead line; the other theorems fold under one line
            return self._show(Text(str(report)), Text(compare_line(report, "\\budget compare")))
        left = f"left of {cap_text(report.epsilon_total)}"
        table = Table("accountant", f"epsilon at delta {_num(report.delta_total)}", left, "note")
        for figure in report.figures:
            shown = figure_left(figure, report.epsilon_total)
            spent = spent_text(figure_value(figure.epsilon))
            table.add_row(figure.accountant, spent, shown, figure.note)
        return self._show(Text(str(report)), table)

    def _ledger(self, argument: str) -> str:
        # ASCII digits, a few of them: int() of other scripts' digits works, of 4,300 fails.
        if argument and not (argument.isascii() and argument.isdigit() and len(argument) <= 9):
            raise click.UsageError("\\ledger takes a number of records, e.g. \\ledger 5")
        count = int(argument) if argument else DEFAULT_LEDGER_ROWS
        records = self.session.filter.store.records()
        table = Table("seq", "time", "kind", "analyst", "query / epsilon")
        note = f"last {min(count, len(records))} of {len(records)} ledger record(s)"
        for record in records[-count:] if count else []:
            p = dict(record.payload)
            if record.kind == "charge":
                cost = f"epsilon {_stored(p, 'epsilon')}, delta {_stored(p, 'delta')}"
                what = f"{cost}: {p.get('query')}"
                changed = overrides_of(p)  # bounds other than the policy's, for the record
                if changed:
                    what += "; differs from the policy: " + "; ".join(map(override_text, changed))
            elif record.kind == "release":
                what = f"release of charge #{p.get('charge')}"
            elif record.kind == "reserve":
                what = f"served from release #{p.get('release')}: {p.get('query')}"
            elif record.kind == "failure":  # the cause is the owner's to read (dpsql report)
                what = f"charge #{p.get('charge')} failed in the engine; its charge stands"
            elif record.kind in ("budget_add", "allocate"):
                who = f"{p['analyst']}: " if "analyst" in p else "+"
                what = (
                    f"{who}epsilon {_stored(p, 'epsilon')}, delta {_stored(p, 'delta')} "
                    f"({p.get('why')})"
                )
            else:
                what = ""
            analyst = record.analyst or p.get("by") or ""
            when = iso_time(record.time)[:19] + "Z"  # to the second
            table.add_row(str(record.seq), when, record.kind, analyst, what)
        return self._show(table, Text(note))

    def _explain(self, argument: str) -> str:
        if not argument:
            raise click.UsageError("\\explain needs a query, e.g. \\explain SELECT COUNT(*) FROM t")
        words = argument.split(None, 1)
        verbose = words[0].upper() == "VERBOSE"
        if verbose:
            if len(words) < 2:
                raise click.UsageError("\\explain VERBOSE needs a query")
            argument = words[1]
        plan = self.session.plan(argument)
        shared = bool(self.session.settings()["share"])
        hit = self.session.served_from(plan, shared)
        cost = f"epsilon {_num(plan.event.epsilon)}, delta {_num(plan.event.delta)}"
        if hit is not None:
            verdict = f"would be served from the cache (release #{hit.release_seq}), no charge"
        else:
            verdict = f"would charge {cost}"
        lines = [*explain(plan, verbose), f"{verdict}; nothing was charged"]
        return "\n".join(lines) + "\n"

    def _tables(self, _: str) -> str:
        table = Table("table", "privacy unit", "L0 groups/unit", "C rows/unit/group", "columns")
        catalog = self.session.engine.catalog
        for name, spec in sorted(self.session.policy.tables.items()):
            unit = "(public table)" if spec.public else spec.unit_text
            l0, c = spec.max_groups_per_unit, spec.max_rows_per_unit_per_group
            table.add_row(name, unit, str(l0 or ""), str(c or ""), str(len(catalog.get(name, {}))))
        return self._show(table)

    def _describe(self, argument: str) -> str:
        name = argument.lower()
        spec = self.session.policy.tables.get(name)
        if not name or spec is None:
            known = ", ".join(sorted(self.session.policy.tables))
            raise click.UsageError(f"\\describe needs a table of the policy: {known}")
        table = Table("column", "type", "bounds", "public domain")
        note = "public table" if spec.public else f"{name}: privacy unit {spec.unit_text}"
        for column, dtype in self.session.engine.catalog.get(name, {}).items():
            col = spec.columns.get(column)
            bounds, domain = "", ""
            if col is not None and (col.lower is not None or col.upper is not None):
                bounds = f"[{exact(col.lower) or '-inf'}, {exact(col.upper) or 'inf'}]"
            if col is not None and col.public_values is not None:
                domain = ", ".join(str(v) for v in col.public_values)
            elif col is not None and col.public_values_from is not None:
                domain = f"from {col.public_values_from}"
            if column == spec.privacy_unit:
                domain = "(privacy unit)"
            table.add_row(column, dtype, bounds, domain)
        return self._show(table, Text(note))

    def _cache(self, _: str) -> str:
        releases = [r for r in self.session.filter.store.records() if r.kind == "release"]
        table = Table("release", "charge", "key", "query")
        note = f"{len(releases)} cached release(s); served again at no charge"
        for record in releases[-5:]:
            p = dict(record.payload)
            table.add_row(str(record.seq), str(p.get("charge")), str(p.get("key"))[:12],
                          str(p.get("query")))  # fmt: skip
        return self._show(table, Text(note))

    def _diagnose(self, argument: str) -> str:
        """``\\diagnose [on|off]``: toggle ``dpsql.diagnose``, like ``SET dpsql.diagnose``."""
        word = argument.lower()
        if word not in ("", "on", "off"):
            raise click.UsageError("\\diagnose takes on or off, or nothing to toggle")
        now = bool(self.session.settings()["diagnose"])
        wanted = not now if not word else word == "on"
        self.session.set_option("diagnose", wanted)
        if not wanted:
            return "diagnosis off\n"
        epsilon = self.session.settings()["diagnose_epsilon"]
        if isinstance(epsilon, Fraction):
            more = f"epsilon {_num(epsilon)} more (dpsql.diagnose_epsilon)"
        else:
            share = self.session.policy.budget.diagnose_share
            more = f"{_num(share)} of its epsilon more (the policy's budget.diagnose_share)"
        return (
            "diagnosis on: each query also releases the share of units its bounds cut, at "
            f"{more}, shown by EXPLAIN first\n"
        )

    def _help(self, _: str) -> str:
        lines = ["End a statement with ';' (it may span lines). Ctrl-C cancels the input, "
                 "Ctrl-D leaves.", "SET dpsql.<setting> = value; SHOW dpsql.budget;"]  # fmt: skip
        lines += [f"  {name} {args}".ljust(22) + text for name, (args, text) in META.items()]
        return "\n".join(lines) + "\n"
