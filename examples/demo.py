"""dpsql demo: differentially private answers over the example `visits` data (`make demo`).

Every answer is a noisy aggregate, printed with the half-width of its noise interval at the
session's confidence (95% unless `SET dpsql.confidence`). Each query is charged to the data set's
budget before it runs; the last query asks for more epsilon than remains and is refused.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run from a source checkout: this checkout's dpsql comes first, installed or not.
sys.path.insert(0, str(HERE.parent))

import dpsql  # noqa: E402
from dpsql.accounting.budget.report import (  # noqa: E402
    cap_text,
    figure_left,
    figure_value,
    left_text,
    spent_text,
)

POLICY = HERE / "policy.toml"

QUERIES: tuple[tuple[str, str], ...] = (
    (
        "Visits and average spend per region (public keys: the policy lists the regions)",
        "SELECT region, COUNT(*) AS visits, AVG(spend) AS avg_spend "
        "FROM visits GROUP BY region ORDER BY region",
    ),
    (
        "Visits per age bucket (public keys: the CASE literals)",
        "SELECT CASE WHEN age < 30 THEN 'under 30' WHEN age < 50 THEN '30-49' "
        "ELSE '50 and over' END AS age_bucket, COUNT(*) AS visits "
        "FROM visits GROUP BY age_bucket",
    ),
    (
        "Distinct users, and their total spend in the east",
        "SELECT COUNT(DISTINCT user_id) AS users, SUM(spend) AS spend FROM visits WHERE region = ?",
    ),
    (
        "Visits per age decade (private keys: released by partition selection, costs delta)",
        "SELECT age // 10 * 10 AS decade, COUNT(*) AS visits FROM visits GROUP BY age // 10 * 10",
    ),
    (
        "Visits and total spend per region with the discrete Gaussian (mechanism='gaussian')",
        "SELECT region, COUNT(*) AS visits, SUM(spend) AS spend FROM visits GROUP BY region",
    ),
    (
        "Median and 90th percentile of spend per quarter (exponential mechanism; the policy's "
        "date_range makes the quarters public)",
        "SELECT date_trunc('quarter', day) AS quarter, MEDIAN(spend) AS median_spend, "
        "QUANTILE_CONT(spend, 0.9) AS p90_spend FROM visits GROUP BY 1 ORDER BY 1",
    ),
    (
        "Users with more than 5 visits to a region (a per-user CTE, bounded after it)",
        "WITH per_user AS (SELECT user_id, region, COUNT(*) AS n FROM visits "
        "GROUP BY user_id, region) "
        "SELECT region, COUNT(*) AS frequent_users FROM per_user WHERE n > 5 GROUP BY region",
    ),
)
PARAMETERS: dict[int, tuple[object, ...]] = {2: ("east",)}
OPTIONS: dict[int, dict[str, object]] = {4: {"mechanism": "gaussian", "delta": "1e-7"}}


def _number(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "NULL" if value is None else str(value)


def _cell(value: object, accuracy: float | tuple[float, float] | None) -> str:
    if accuracy is None:
        return _number(value)
    if isinstance(accuracy, tuple):  # a quantile's interval: asymmetric, never a ±
        low, high = accuracy
        return f"{_number(value)} in [{_number(low)}, {_number(high)}]"
    width = int(accuracy) if float(accuracy).is_integer() else accuracy
    return f"{_number(value)} ± {_number(width)}"


def table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """An aligned text table: text columns left-aligned, numbers right-aligned."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    numeric = [
        all(r[i][:1].isdigit() or r[i][:1] == "-" for r in rows) for i in range(len(columns))
    ]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(cells, widths, numeric, strict=True)
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(columns), rule, *(line(r) for r in rows)])


def run(
    cursor: dpsql.Cursor,
    title: str,
    sql: str,
    params: Sequence[object] | None,
    options: dict[str, object],
) -> None:
    cursor.execute(sql, params, **options)
    result = cursor.result
    assert result is not None and result.charge is not None
    columns = [d[0] for d in cursor.description or ()]
    rows = [
        [_cell(v, hw) for v, hw in zip(row, accuracy, strict=True)]
        for row, accuracy in zip(cursor.fetchall(), cursor.accuracy, strict=True)
    ]
    cost = f"epsilon {spent_text(result.charge.epsilon)}, delta {spent_text(result.charge.delta)}"
    print(f"\n## {title}\n   {sql}" + (f"   -- parameters {tuple(params)}" if params else ""))
    intervals = any(isinstance(a, tuple) for row in cursor.accuracy for a in row)
    said = "; [lo, hi] holds the quantile of the kept rows" if intervals else ""
    print(f"   cost: {cost}; ± is the {cursor.confidence:.0%} noise half-width{said}\n")
    print(table(columns, rows) if rows else "(no group passed partition selection)")
    if result.diagnosis is not None:
        # The ± covers the noise; what the bounds cut is said beside it (docs/reading.md).
        print(f"± covers {cursor.covers}")


def explain(cursor: dpsql.Cursor, sql: str) -> None:
    cursor.execute("EXPLAIN " + sql)
    lines = [row[0] for row in cursor.fetchall()]
    shown = lines[: lines.index("bounded SQL:")] if "bounded SQL:" in lines else lines
    print(f"\n## EXPLAIN {sql}\n   (plans only: nothing runs, nothing is charged)\n")
    print("\n".join("   " + line for line in shown))
    print(f"   ... and {len(lines) - len(shown)} lines of bounded SQL")


def main(policy: Path = POLICY) -> None:
    inside = policy.is_relative_to(HERE.parent)
    shown = policy.relative_to(HERE.parent) if inside else policy
    print(f"dpsql {dpsql.__version__} demo; policy {shown}")
    with dpsql.connect(policy) as conn:
        cursor = conn.cursor()
        for index, (title, sql) in enumerate(QUERIES):
            run(cursor, title, sql, PARAMETERS.get(index), OPTIONS.get(index, {}))
        explain(cursor, QUERIES[0][1])

        report = conn.budget()
        print(f"\n## Budget of data set {report.dataset} ({report.accountant} composition)\n")
        print(
            table(
                ["", "total", "spent", "left"],
                [
                    [name, cap_text(total), spent_text(spent), left_text(left)]
                    for name, total, spent, left in (
                        (
                            "epsilon",
                            report.epsilon_total,
                            report.epsilon_spent,
                            report.epsilon_remaining,
                        ),
                        ("delta", report.delta_total, report.delta_spent, report.delta_remaining),
                    )
                ],
            )
        )
        print("\nThe same history read by every accountant (epsilon at the budget's delta):\n")
        print(
            table(
                ["accountant", "epsilon", "left of the cap", "status"],
                [
                    [
                        f.accountant,
                        spent_text(figure_value(f.epsilon)) if math.isfinite(f.epsilon) else "n/a",
                        figure_left(f, report.epsilon_total),
                        f.note,
                    ]
                    for f in report.figures
                ],
            )
        )
        print(
            f"\n{report.queries} queries charged. This policy has no [ledger], so the budget lives"
        )
        print("in memory and resets when the process ends. examples/durable.toml is the same data")
        print("with a durable ledger (`make demo` created it with `dpsql init`): try")
        print("`.venv/bin/dpsql --policy examples/durable.toml shell`.")
        print("In-process use trusts the analyst not to open the data file directly.")

        too_much = report.epsilon_remaining + Fraction(1, 2)
        print(f"\n## A query asking for epsilon {float(too_much):g}, more than is left")
        try:
            cursor.execute("SELECT COUNT(*) FROM visits", epsilon=too_much)
        except dpsql.BudgetExceededError as exc:
            print(f"   refused ({type(exc).__name__}): {exc}")
        after = conn.budget()
        print(f"   spent after the refusal: epsilon {float(after.epsilon_spent):g} (unchanged)")


if __name__ == "__main__":
    # `make demo-spark` passes examples/spark.toml: the same queries on Apache Spark.
    main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else POLICY)
