"""The privacy report as one self-contained HTML page: inline CSS, the chart as inline SVG.

The page is the Markdown report (``report.render_markdown``) rendered to HTML, so the three
formats always say the same thing: every heading, paragraph, list and table of the Markdown is
here, nothing else is computed from the data except the chart. The converter reads only the
subset ``render_markdown`` writes: ``#``/``##``/``###`` headings, paragraphs, ``- `` lists and
pipe tables whose cells escape ``|`` as ``\\|``. Table cells are text (a query's ``COUNT(*)`` is
no emphasis); elsewhere `` `code` ``, ``**strong**`` and ``*em*`` are honoured. Every piece of
text is HTML-escaped.

The chart goes after the accountants: the curves of the actual history when the caller gives
them (``charts.history_curves(budget)``), else basic composition drawn from the report's own
release schedule (exact: the sums of the charged epsilons, the worst cell where queries were
pinned to cells). The page loads nothing: no scripts, fonts, styles or images from anywhere.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

from dpsql.accounting.budget.parallel import Cell, running_worst
from dpsql.interfaces.report.charts import Curves, inline_svg, points
from dpsql.interfaces.report.markdown import render_markdown

__all__ = ["render_html", "schedule_curves"]

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 72rem; padding: 0 1rem; color: #1b1f24; line-height: 1.45; }
h1 { font-size: 1.6rem; border-bottom: 2px solid #d0d7de; padding-bottom: .3rem; }
h2 { font-size: 1.25rem; margin-top: 2rem; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 1.05rem; }
table { border-collapse: collapse; margin: .6rem 0; font-size: .9rem; }
th, td { border: 1px solid #d0d7de; padding: .25rem .55rem; text-align: left;
         vertical-align: top; }
th { background: #f6f8fa; }
tr:nth-child(even) td { background: #fbfcfd; }
code { background: #f2f4f7; padding: 0 .2rem; border-radius: 3px; font-size: .9em; }
figure { margin: 1rem 0; }
figcaption { font-size: .85rem; color: #57606a; }
svg { max-width: 100%; height: auto; }
"""
CHART_SECTION = "Composition chart"
_HEADING = re.compile(r"^(#{1,3}) (.*)$")


def _inline(text: str) -> str:
    """Escaped text with `code`, **strong** and *em* (never inside code)."""
    parts = text.split("`")
    out = []
    for i, part in enumerate(parts):
        escaped = html.escape(part)
        if i % 2 == 1 and i < len(parts) - 1:
            out.append(f"<code>{escaped}</code>")
            continue
        if i % 2 == 1:  # an unpaired backtick: keep it as text
            escaped = "`" + escaped
        escaped = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)
        out.append(re.sub(r"\*(\S(?:.*?\S)?)\*", r"<em>\1</em>", escaped))
    return "".join(out)


def _cells(line: str) -> list[str]:
    """The cells of a pipe-table row, ``\\|`` unescaped."""
    inner = line.strip()[1:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def _table(lines: list[str]) -> str:
    header, rows = _cells(lines[0]), [_cells(line) for line in lines[2:]]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _blocks(markdown: str) -> Iterator[list[str]]:
    """Runs of non-blank lines."""
    block: list[str] = []
    for line in markdown.splitlines():
        if line.strip():
            block.append(line)
        elif block:
            yield block
            block = []
    if block:
        yield block


def markdown_to_html(markdown: str) -> list[str]:
    """The HTML elements of the report's Markdown subset (module docstring)."""
    out = []
    for block in _blocks(markdown):
        first = block[0]
        heading = _HEADING.match(first)
        if heading and len(block) == 1:
            level = len(heading.group(1))
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif first.startswith("|"):
            out.append(_table(block))
        elif first.startswith("- "):
            items = "".join(f"<li>{_inline(line[2:])}</li>" for line in block)
            out.append(f"<ul>{items}</ul>")
        else:
            out.append(f"<p>{_inline(' '.join(block))}</p>")
    return out


def _cell(value: object) -> Cell | None:
    return (str(value[0]), str(value[1])) if isinstance(value, list) and len(value) == 2 else None


def schedule_curves(data: dict[str, Any]) -> Curves:
    """Basic composition of the report's release schedule, with the budget's epsilon cap."""
    charges = [e for e in data["schedule"] if e["kind"] == "charge"]
    pinned = [
        (_cell(entry.get("cell")), Fraction(entry["epsilon"])) for entry in charges
    ]  # the worst view of each prefix, as the budget reads it (dpsql.accounting.budget.parallel)
    readings = [0.0, *(float(worst) for worst in running_worst(pinned))]
    xs = points(len(charges))
    cap = float(Fraction(data["budget"]["epsilon"]["total"]))
    delta = float(Fraction(data["accounting"]["delta"]))
    return Curves(
        tuple(xs),
        {"basic": tuple(readings[k] for k in xs)},
        delta,
        cap,
        f"budget cap ε = {cap:g}",
        f"Data set {data['dataset']['id']}: ε of the release schedule",
    )


def _chart(curves: Curves) -> str:
    caption = (
        "Cumulative epsilon against the number of charged queries, with the budget's cap. "
        "Curves labelled “as if fixed in advance” hold only if every query had been fixed "
        "before any answer."
    )
    return (
        f"<h2>{CHART_SECTION}</h2><figure>{inline_svg(curves)}"
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def render_html(data: dict[str, Any], curves: Curves | None = None) -> str:
    """The report built by ``report.build_report`` as one self-contained HTML page.

    ``curves``: the chart's curves (``charts.history_curves(budget)`` for every accountant);
    by default basic composition of the report's own release schedule.
    """
    elements = markdown_to_html(render_markdown(data))
    chart = _chart(curves if curves is not None else schedule_curves(data))
    # The chart goes right after the accountants' section, before the release schedule.
    at = next(
        (i for i, e in enumerate(elements) if e == "<h2>Release schedule</h2>"), len(elements)
    )
    elements.insert(at, chart)
    title = html.escape(f"Privacy report: data set {data['dataset']['id']}")
    body = "\n".join(elements)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{title}</title>\n<style>{CSS}</style>\n</head>\n"
        f"<body>\n{body}\n</body>\n</html>\n"
    )
