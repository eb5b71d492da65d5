"""The arithmetic of ``dpsql budget what-if``: N identical hypothetical queries, per theorem.

``Query`` is the hypothetical query, a discrete Laplace of epsilon E or a Gaussian of noise
multiplier S; a Gaussian has no single (epsilon, delta) of its own, so where a theorem needs one
(one that composes pairs: ``Registration.pairs``) it is read at the (epsilon_0, delta_0) its
exact curve gives for a delta_0. The theorems are the accountants registered for what-if
(``dpsql.accounting.registry``), in its order. ``whatif_fits`` says, per theorem, whether an
(epsilon, delta) budget holds k such queries, ``fit_count`` how many it holds (at most
``MAX_FIT``), and ``after_n`` each theorem's epsilon after n of them; ``whatif_label`` labels
each. Nothing here reads or writes a ledger; ``dpsql.interfaces.cli.budget_view`` prints and
charts these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from dpsql.accounting import registry
from dpsql.accounting.theorems.base import Accountant
from dpsql.accounting.theorems.pld import PldAccountant
from dpsql.mechanisms.events import Event
from dpsql.mechanisms.gaussian_events import Gaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.policy.numbers import decimal_text

__all__ = ["MAX_FIT", "Query", "after_n", "fit_count", "whatif_fits", "whatif_label"]

MAX_FIT = 100_000  # what-if counts stop here ("at least")
# What-if's own reading of a theorem, beside its validity: advanced composition keeps half the
# remaining delta for its delta' (the text under the table says so).
NOTES = {"advanced": " (delta' below)"}


@dataclass(frozen=True)
class Query:
    """The hypothetical query: a discrete Laplace of epsilon E or a Gaussian of multiplier S."""

    epsilon: Fraction | None = None
    sigma: Fraction | None = None

    def describe(self) -> str:
        if self.epsilon is not None:
            return f"discrete Laplace of epsilon {decimal_text(self.epsilon)} (sensitivity 1)"
        assert self.sigma is not None
        return f"Gaussian of noise multiplier sigma {decimal_text(self.sigma)} (sensitivity 1)"

    def event(self, delta0: float = 0.0) -> Event:
        """The query's event; a Gaussian read at (epsilon_0, delta_0) when delta_0 > 0."""
        if self.epsilon is not None:
            return DiscreteLaplace(scale=1 / self.epsilon, sensitivity=Fraction(1))
        assert self.sigma is not None
        plain = Gaussian(sigma=float(self.sigma), sensitivity=1.0)
        if delta0 <= 0:
            return plain
        eps0 = PldAccountant().epsilon([plain], delta0)  # exact curve, bisected from above
        return Gaussian(float(self.sigma), 1.0, Fraction(repr(eps0)), Fraction(repr(delta0)))

    def pure(self) -> bool:
        return self.epsilon is not None


def _readers() -> dict[str, Accountant]:
    return {r.name: r.odometer() for r in registry.entries() if r.whatif}


def whatif_label(name: str) -> str:
    """A theorem's label in what-if, as ``dpsql budget show`` labels the odometers
    (``Accountant.fixed_in_advance`` says why)."""
    return registry.get(name).validity + NOTES.get(name, "")


def whatif_fits(
    query: Query, epsilon: Fraction, delta: Fraction
) -> dict[str, Callable[[int], bool]]:
    """Per theorem: does the (epsilon, delta) budget hold k such queries?

    basic: k epsilon_1 <= epsilon exactly (a Gaussian: k epsilon_G(delta/k)). advanced: what
    basic admits, or KOV with delta' = delta/2, the other half shared by the queries' own deltas.
    Every other theorem (rdp, zcdp, pld): its accountant at delta, a Gaussian read at
    delta_0 = delta/(2k) by those that compose pairs.
    """
    readers, cap, total = _readers(), float(epsilon), float(delta)

    def basic(k: int) -> bool:
        if query.epsilon is not None:
            return k * query.epsilon <= epsilon
        return total > 0 and k * float(query.event(total / k).epsilon) <= cap

    def advanced(k: int) -> bool:
        # Basic composition is the theorem's own fallback (its k delta + delta' term aside),
        # exact here where the accountant's floats are nudged up.
        if total <= 0 or basic(k):
            return basic(k)
        if query.pure():
            return readers["advanced"].epsilon([query.event()] * k, total / 2) <= cap
        return readers["advanced"].epsilon([query.event(total / (2 * k))] * k, total) <= cap

    def reading(name: str) -> Callable[[int], bool]:
        pairs = registry.get(name).pairs
        return lambda k: (
            readers[name].epsilon([query.event(total / (2 * k) if pairs else 0.0)] * k, total)
            <= cap
        )

    special = {"basic": basic, "advanced": advanced}
    return {name: special.get(name) or reading(name) for name in readers}


def fit_count(fits: Callable[[int], bool], most: int = MAX_FIT) -> int:
    """The largest k <= most with fits(k) (fits is monotone: more queries never cost less)."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= most and fits(hi):
        lo, hi = hi, 2 * hi
    if hi > most:
        if fits(most):
            return most
        hi = most
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def after_n(query: Query, n: int, delta: float) -> dict[str, float]:
    """Each theorem's epsilon after n such queries at ``delta`` (the curves' last point); the
    theorems that compose pairs read a Gaussian at delta_0 = delta/(2n)."""
    paired = [query.event(delta / (2 * n) if not query.pure() else 0.0)] * n
    plain = [query.event()] * n
    return {
        name: reader.epsilon(paired if registry.get(name).pairs else plain, delta)
        for name, reader in _readers().items()
    }
