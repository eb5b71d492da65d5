"""Calibration to the policy's declared mechanism, under the PLD filter (``accountant = "pld"``).

The natural PLD filter is valid only for a family of mechanisms totally ordered under
composition and fixed before the first query (Regehr et al. 2026, arXiv 2602.15815). dpsql's
family is one mechanism, declared in the policy (``budget.declared_mechanism``) and pinned in
the ledger: a discrete Laplace of scale t, or a discrete Gaussian of sigma, on one coordinate
moved by at most Delta. Every measurement of a query is exactly that mechanism, so a query of k
measurements is k of them (k-fold self-composition, totally ordered in k):

* its noise is the declared scale or sigma, whatever the query's epsilon;
* a measurement that one unit moves by s <= Delta on one coordinate is the declared mechanism
  (its sensitivity is an upper bound, and the shift Delta dominates every smaller one,
  ``dpsql.mechanisms.pld_lattice``): it is charged as it, sensitivity Delta;
* anything else is refused before the charge (``UndeclaredMechanismError``, naming the
  construct): partition selection and quantiles (other mechanisms), a GROUP BY with L0 > 1 (a
  shift spread over coordinates, for which no dominance is proven), a larger sensitivity;
* a setting the analyst gave (``SET``, ``OPTIONS(...)``, a keyword) must ask for this noise:
  ``dpsql.mechanism`` its kind, ``dpsql.epsilon`` the query's k Delta/t (Laplace),
  ``dpsql.sigma`` sigma/Delta or ``dpsql.rho`` k Delta^2/(2 sigma^2) (Gaussian); another value
  is refused rather than silently ignored. The policy's defaults (``budget.query_epsilon``,
  ``budget.mechanism``) are not asked for and do not count.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from dpsql.errors import InternalError, UndeclaredMechanismError
from dpsql.mechanisms.event_kinds import declared_event
from dpsql.mechanisms.events import Composite
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.plan import calibration
from dpsql.plan.estimates import _Builder
from dpsql.plan.plans import Measurement, QueryOptions
from dpsql.plan.sensitivity import Calibrated, _measurement
from dpsql.policy import DeclaredMechanism
from dpsql.policy.numbers import decimal_text

__all__ = ["check_declared", "declared_calibration", "refuse_sample", "refuse_selection"]

_WHY = (
    "the natural PLD filter is valid only for a family of mechanisms totally ordered under "
    "composition and fixed before the first query (Regehr et al. 2026); a broader family needs "
    "a proof of that order"
)


def _name(declared: DeclaredMechanism) -> str:
    noise = (
        f"scale {decimal_text(declared.scale)}"
        if declared.scale is not None
        else f"sigma {decimal_text(declared.sigma or Fraction(0))}"
    )
    return f"{declared.kind} of {noise} on sensitivity {declared.sensitivity}"


def _refuse(declared: DeclaredMechanism, what: str, hint: str = "") -> UndeclaredMechanismError:
    tail = f"; {hint}" if hint else ""
    return UndeclaredMechanismError(
        f"{what}, and the pld filter admits only its declared mechanism ({_name(declared)}): "
        f"{_WHY}{tail}"
    )


def refuse_selection(declared: DeclaredMechanism) -> UndeclaredMechanismError:
    """The refusal of a GROUP BY that needs partition selection."""
    return _refuse(
        declared,
        "a GROUP BY on a key without a public domain needs partition selection",
        "declare public_values for the key",
    )


def refuse_sample(declared: DeclaredMechanism) -> UndeclaredMechanismError:
    """The refusal of a sampled query: its amplified event is another mechanism."""
    return _refuse(
        declared,
        "a query on a sample is charged as the subsampled mechanism",
        "drop TABLESAMPLE and dpsql.sample_rate",
    )


def _check_measurement(declared: DeclaredMechanism, m: Measurement) -> None:
    if m.exponential:
        raise _refuse(declared, f"{m.label} uses the exponential mechanism")
    if m.groups > 1:
        raise _refuse(
            declared,
            f"{m.label} with GROUP BY moves up to {m.groups} groups per unit (a shift spread "
            "over coordinates, for which the one-coordinate PLD is not proven to dominate)",
            "SET dpsql.max_groups_per_unit = 1",
        )
    if m.sensitivity > declared.sensitivity:
        raise _refuse(
            declared,
            f"one unit moves {m.label} by up to {m.sensitivity} of its units, more than the "
            f"declared sensitivity",
        )


def _check_settings(declared: DeclaredMechanism, options: QueryOptions, k: int) -> None:
    """A setting the analyst gave must ask for the declared noise (module docstring)."""
    asked = options.asked
    if "mechanism" in asked and options.mechanism != declared.mechanism:
        raise _refuse(declared, f"dpsql.mechanism = '{options.mechanism}' asks for other noise")
    shift = Fraction(declared.sensitivity)
    if declared.scale is not None:
        wanted = k * shift / declared.scale
        if "epsilon" in asked and options.epsilon != wanted:
            raise _refuse(
                declared,
                f"dpsql.epsilon = {decimal_text(options.epsilon)} asks for other noise than "
                f"this query's {k} declared measurement(s), epsilon {decimal_text(wanted)}",
                f"SET dpsql.epsilon = {decimal_text(wanted)}, or RESET it",
            )
        return
    assert declared.sigma is not None  # policy-validated
    multiplier, rho = declared.sigma / shift, k * shift**2 / (2 * declared.sigma**2)
    hint = f"SET dpsql.sigma = {decimal_text(multiplier)}, or RESET it"
    if "sigma" in asked and options.sigma != multiplier:
        raise _refuse(
            declared,
            f"dpsql.sigma = {decimal_text(options.sigma or Fraction(0))} asks for other noise "
            f"than the declared sigma/sensitivity = {decimal_text(multiplier)}",
            hint,
        )
    if "rho" in asked and options.rho != rho:
        raise _refuse(
            declared,
            f"dpsql.rho = {decimal_text(options.rho or Fraction(0))} asks for other noise than "
            f"this query's {k} declared measurement(s), rho {decimal_text(rho)}",
            hint,
        )
    if "epsilon" in asked and not {"sigma", "rho"} & asked:
        raise _refuse(
            declared,
            "dpsql.epsilon would calibrate the discrete Gaussian's noise to the query's epsilon",
            hint + " and RESET dpsql.epsilon",
        )


def declared_calibration(
    builder: _Builder, l0: int, c: int, options: QueryOptions, declared: DeclaredMechanism
) -> Calibrated:
    """Every measurement gets the declared noise and is charged as the declared mechanism."""
    k = len(builder.specs)
    base = [_measurement(builder, spec, l0, c, options.max_rows_per_unit) for spec in builder.specs]
    for m in base:
        _check_measurement(declared, m)
    _check_settings(declared, options, k)
    event = declared_event(declared)
    if isinstance(event, DiscreteLaplace):
        # The declared scale on a shift of at most Delta: the declared mechanism (pld_lattice).
        measurements = [replace(m, scale=event.scale) for m in base]
        return measurements, [replace(event, label=m.label) for m in base], None
    measurements = [replace(m, sigma2=event.sigma2) for m in base]
    # The query's (epsilon, delta) for the figures that read pairs: its summed rho through the
    # CKS conversion (Canonne, Kamath, Steinke 2020, Corollary 13), as SET dpsql.sigma charges.
    epsilon = calibration.epsilon_for(k * event.rho, options.delta)
    return measurements, [replace(event, label=m.label) for m in base], (epsilon, options.delta)


def check_declared(event: Composite, declared: DeclaredMechanism) -> None:
    """After planning: every event is the declared mechanism, else a planner bug (nothing may
    be charged on a wrong event)."""
    expected = declared_event(declared)
    if any(e != expected for e in event.events):
        raise InternalError("a planned event is not the declared mechanism")
    if expected.targeted and event.certified is None:
        raise InternalError("a declared discrete Gaussian query has no certified pair")
    if expected.pure and event.epsilon != len(event.events) * expected.epsilon:
        raise InternalError("the planned epsilon is not the declared mechanism's")
