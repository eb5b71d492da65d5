"""How many identical queries fit a budget of (epsilon 1, delta 1e-6) under each filter.

One COUNT with C = 10 and no GROUP BY, charged repeatedly until the filter refuses it: as a
discrete Laplace of epsilon e, or as a discrete Gaussian calibrated by dpsql to (e, 1e-9). The
advanced filter fixes delta' = 5e-7. Prints the Markdown table of docs/accounting.md.

    python benchmarks/fit_table.py
"""

from __future__ import annotations

from fractions import Fraction

from dpsql.accounting.events import Composite, DiscreteGaussian, DiscreteLaplace
from dpsql.accounting.filter import budget_for
from dpsql.errors import BudgetExceededError
from dpsql.plan import calibration
from dpsql.policy import BudgetSpec

LIMIT = 20_000
QUERY_DELTA = Fraction(1, 10**9)


def fitting(spec: BudgetSpec, event: Composite) -> str:
    budget = budget_for("fit", spec)
    for n in range(LIMIT):
        try:
            budget.charge(event, "q", None)
        except BudgetExceededError:
            return str(n)
    return f">{LIMIT}"


def queries(epsilon: Fraction) -> dict[str, Composite]:
    sigma2 = calibration.single_sigma2(10, epsilon, QUERY_DELTA)
    return {
        "discrete Laplace": Composite((DiscreteLaplace(10 / epsilon, Fraction(10)),)),
        "discrete Gaussian": Composite(
            (DiscreteGaussian(sigma2, Fraction(10)),), certified=(epsilon, QUERY_DELTA)
        ),
    }


FILTERS = ("basic", "advanced", "rdp", "zcdp")


def main() -> None:
    print("| query epsilon | mechanism | " + " | ".join(FILTERS) + " |")
    print("|---|---|" + "---|" * len(FILTERS))
    for epsilon in (Fraction(1, 10), Fraction(1, 100)):
        for mechanism, event in queries(epsilon).items():
            counts = [fitting(BudgetSpec(**_spec(name)), event) for name in FILTERS]
            print(f"| {float(epsilon)} | {mechanism} | " + " | ".join(counts) + " |")


def _spec(name: str) -> dict[str, str]:
    spec = {"epsilon": "1", "delta": "0.000001", "accountant": name}
    if name == "advanced":
        spec["advanced_delta_prime"] = "0.0000005"
    return spec


if __name__ == "__main__":
    main()
