"""The per-query settings, declared once: ``SETTINGS``, a table of ``Setting``.

Each row is one setting of a statement: its name (``SET dpsql.<name> = value``, the keyword
``name=value`` of ``Session.execute`` and ``cursor.execute``, and, where ``options`` says so, a
key of ``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(...)``, ``dpsql.sql.options.KEYS``), the check
that validates and normalises a value from any of those, its default (most come from the
policy), and its line in docs/sql.md's table (``default_text``, ``values``, ``doc``: the docs
test compares the page with this table). What a statement runs with is a frozen ``Settings``
(``dpsql.session.effective``), built from this table alone.

Every check refuses a value on its form alone, before anything is charged, and reads only a
word, a number or a short text: ``str()`` of an arbitrary object is never taken (a 5,000-digit
integer is refused unexpanded by ``to_fraction``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dpsql.errors import ParameterError
from dpsql.policy import Policy
from dpsql.session import setting_checks as checks

__all__ = ["NAMES", "SETTINGS", "Setting", "check_setting"]


@dataclass(frozen=True)
class Setting:
    """One per-query setting: how a value of it is checked, its default, and its docs."""

    name: str
    check: Callable[[object], object]  # validates and normalises a given value
    default: Callable[[Policy], object]  # its value when none is given
    default_text: str  # docs/sql.md's columns: the default, the valid values, the meaning
    values: str
    doc: str
    # Settable in SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(...): it changes the measurement, not
    # how an answer is served (fresh, share and accuracy_columns are connection choices).
    options: bool = True


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "epsilon",
        checks.epsilon,
        lambda p: p.budget.query_epsilon,
        default_text="`budget.query_epsilon`",
        values="0 < ε ≤ 20, exact decimal",
        doc=(
            "the query's total epsilon, split across its measurements by `dpsql.split`; replaced by"
            " the solved one under an accuracy target"
        ),
    ),
    Setting(
        "delta",
        checks.delta,
        lambda p: p.budget.query_delta,
        default_text="`budget.query_delta`",
        values="0 ≤ δ < 1, exact decimal",
        doc=(
            "the query's delta: with the Laplace, spent only by partition selection (private-key "
            "`GROUP BY`); with the Gaussian, by its measurements too (half to selection when there "
            "is one)"
        ),
    ),
    Setting(
        "max_groups_per_unit",
        checks.bound("max_groups_per_unit"),
        checks.none,
        default_text="the table's policy value",
        values="integer 1 to 1,000,000",
        doc="L0, replacing the policy's value",
    ),
    Setting(
        "max_rows_per_unit_per_group",
        checks.bound("max_rows_per_unit_per_group"),
        checks.none,
        default_text="the table's policy value",
        values="integer 1 to 1,000,000",
        doc="C, replacing the policy's value",
    ),
    Setting(
        "max_rows_per_unit",
        checks.bound("max_rows_per_unit"),
        checks.none,
        default_text="the table's policy value (none: no total cap)",
        values="integer 1 to 1,000,000",
        doc=(
            "R, the rows one unit contributes in total, replacing the policy's value "
            "([above](#the-total-row-cap-r))"
        ),
    ),
    Setting(
        "bounds",
        checks.bounds,
        lambda p: "declared",
        default_text="`declared` (a table's policy `bounds` opts it in)",
        values="`declared` or `auto`",
        doc=(
            "`auto`: the contribution bounds and clamps the query needs that nothing declares "
            "(policy, SET, estimate) are chosen privately for this query at "
            "`dpsql.bounds_share` of its epsilon ([below](#bounds-chosen-per-query)); "
            "`declared`: such a bound is refused unless the table's policy says `bounds`"
        ),
    ),
    Setting(
        "bounds_share",
        checks.bounds_share,
        lambda p: checks.DEFAULT_BOUNDS_SHARE,
        default_text="0.25",
        values="0 < s ≤ 0.5, exact decimal",
        doc=(
            "under `auto`, the share of the query's epsilon spent choosing its bounds, split "
            "evenly among the choices; the rest answers the query"
        ),
    ),
    Setting(
        "confidence",
        checks.confidence,
        lambda p: checks.DEFAULT_CONFIDENCE,
        default_text="0.95",
        values="0.5 to 0.9999",
        doc=(
            "the confidence of the accuracy half-widths (no privacy cost), and the coverage a "
            "quantile's interval is drawn at (another confidence is another release)"
        ),
    ),
    Setting(
        "mechanism",
        checks.mechanism,
        lambda p: p.budget.mechanism,
        default_text="`budget.mechanism`",
        values="`laplace` or `gaussian`",
        doc=(
            "the noise of the query's measurements: the discrete Laplace (pure epsilon) or the "
            "discrete Gaussian (needs delta > 0); partition selection always uses the discrete "
            "Laplace, quantiles the exponential mechanism"
        ),
    ),
    Setting(
        "rho",
        checks.rho,
        checks.none,
        default_text="none",
        values="0 < ρ ≤ 10, exact decimal",
        doc=(
            "with the Gaussian: the query's zCDP rho, instead of calibrating to (epsilon, delta); "
            "the charge is then the epsilon rho certifies at the query's delta"
        ),
    ),
    Setting(
        "sigma",
        checks.sigma,
        checks.none,
        default_text="none",
        values="0 < σ ≤ 10⁶, exact decimal",
        doc=(
            "with the Gaussian: a noise multiplier, so each measurement's noise has standard "
            "deviation σ times its L2 sensitivity and is 1/(2σ²)-zCDP; the charge is the epsilon "
            "the summed rho certifies at the query's delta; not together with `dpsql.rho`"
        ),
    ),
    Setting(
        "fresh",
        checks.boolean("fresh"),
        lambda p: False,
        default_text="`false`",
        values="`true` or `false`",
        doc=(
            "`true`: answer afresh (charged) instead of serving a released answer from the cache "
            "(see [cache.md](cache.md))"
        ),
        options=False,
    ),
    Setting(
        "share",
        checks.boolean("share"),
        lambda p: True,
        default_text="`true`",
        values="`true`/`on` or `false`/`off`",
        doc=(
            "`false`: in a file planned as one workload, the statement is planned and bounded on "
            "its own, never answered with a family bounded at a finer grouping (where L0 may cut "
            "more of a unit's rows); it is still charged with the file, and a released answer still"
            " serves it ([workload.md](workload.md))"
        ),
        options=False,
    ),
    Setting(
        "accuracy_columns",
        checks.boolean("accuracy_columns"),
        lambda p: False,
        default_text="`false`",
        values="`true`/`on` or `false`/`off`",
        doc=(
            "`true`: after each output that is an aggregate, a column `<name> ±` (DOUBLE) with the "
            "half-width of that value at `dpsql.confidence` (noise only; a quantile's "
            "`<name> interval`, VARCHAR `[lo, hi]`) and a column "
            "`<name> noise` (BOOLEAN), true where the value is mostly noise, for clients that "
            "show columns only (psql, BI tools); a name that would repeat a result column's, in "
            "any letter case, takes the first free number (`<name> ± 2`, `<name> noise 2`). On "
            "for every connection of `dpsql serve` with the policy's `server.accuracy_columns`, "
            "or a client's `options=-c dpsql.accuracy_columns=on`. Post-processing: a released "
            "answer is served again with or without them, free"
        ),
        options=False,
    ),
    Setting(
        "other_group",
        checks.boolean("other_group"),
        lambda p: False,
        default_text="`false`",
        values="`true`/`on` or `false`/`off`",
        doc=(
            "`true`: each public `GROUP BY` key releases one more group, its **other group**, "
            "holding the rows whose key is outside the domain (and NULL keys, unless the domain "
            "lists NULL), instead of dropping them ([The other group](#the-other-group))"
        ),
    ),
    Setting(
        "other_label",
        checks.label,
        checks.none,
        default_text="none (the other group's key is NULL)",
        values="a string of at most 256 characters",
        doc=(
            "the other group's key, cast to each key's type; refused (`ParameterError`) when it is "
            "not a value of that type or equals a value of the domain as the engine compares keys; "
            "needed when a domain lists NULL. Used only with `dpsql.other_group`"
        ),
    ),
    Setting(
        "diagnose",
        checks.boolean("diagnose"),
        lambda p: p.budget.diagnose,
        default_text="the policy's `budget.diagnose` (`true` unless the owner turns it off)",
        values="`true`/`on` or `false`/`off`",
        doc=(
            "`true`: each query on bounds dpsql did not choose also releases the fraction of its "
            "units that its bounds cut ([below](#the-diagnosis-of-the-bounds)), charged with the "
            "query as a line of its own; a sampled query is not diagnosed unless asked (then "
            "refused)"
        ),
    ),
    Setting(
        "diagnose_epsilon",
        checks.diagnose_epsilon,
        checks.none,
        default_text="the policy's `budget.diagnose_share` (0.1) of the query's epsilon",
        values="0 < ε ≤ 20, exact decimal",
        doc=(
            "the epsilon of that diagnosis (a discrete Laplace of scale 1/ε on each cell of its "
            "histogram), charged on top of the query's; set, a fixed figure, so what a diagnosis "
            "costs depends on this setting alone"
        ),
    ),
    Setting(
        "split",
        checks.split,
        lambda p: "min_max_ratio",
        default_text="`min_max_ratio`",
        values="`min_max_ratio`, `min_total_variance` (old name `optimal`) or `even`",
        doc=(
            "how the query's budget is split across its measurements: so that no estimate's "
            "variance is more than needed times its variance asked alone, to minimise the summed "
            "variance of what it releases, or equally ([below](#the-split-of-a-querys-budget)); "
            "the charged total is the same"
        ),
    ),
    Setting(
        "moments",
        checks.moments,
        lambda p: "joint",
        default_text="`joint`",
        values="`joint` or `separate`",
        doc=(
            "how a VARIANCE or STDDEV measures its value under the Laplace: `joint`, one vector "
            "of three Bernstein coordinates at one share of the budget (about half the error), "
            "or `separate`, its centred sum of squares, centred sum and count at a share each "
            "([below](#variance-and-standard-deviation)); the Gaussian, an accuracy target, a "
            "sample, and a value another aggregate of the query reads too are always `separate`"
        ),
    ),
    Setting(
        "halfwidth",
        checks.halfwidth,
        checks.none,
        default_text="none",
        values="0 < h ≤ 2^52, exact decimal",
        doc=(
            "an accuracy target: the query is charged the cheapest epsilon whose noise half-width, "
            "at `dpsql.confidence`, is at most h for every count, sum and ratio it releases "
            "([below](#accuracy-targets))"
        ),
    ),
    Setting(
        "rank_error",
        checks.rank_error,
        checks.none,
        default_text="none",
        values="integer 1 to 1,000,000",
        doc=(
            "an accuracy target for quantiles: the cheapest epsilon at which each released "
            "quantile's rank is within this many rows of the asked rank, with probability at least "
            "`dpsql.confidence`"
        ),
    ),
    Setting(
        "min_group",
        checks.min_group,
        checks.none,
        default_text="none",
        values="integer 1 to 2^63 - 1",
        doc=(
            "a group size the analyst states: with `dpsql.halfwidth`, the target binds an AVG's, "
            "VARIANCE's or STDDEV's own ± in groups of at least this many units; without it, each "
            "of their measurements. Not a target alone"
        ),
    ),
    Setting(
        "sample_rate",
        checks.rate,
        checks.none,
        default_text="none (every unit)",
        values="0 < q ≤ 1, exact decimal",
        doc=(
            "run the query on a unit-level Poisson sample that keeps each unit with probability q, "
            "charged the amplified loss ([below](#samples-tablesample)); a query's own "
            "`TABLESAMPLE` clause wins; 1 samples nothing"
        ),
    ),
    Setting(
        "sample_scale",
        checks.boolean("sample_scale"),
        lambda p: False,
        default_text="`false`",
        values="`true`/`on` or `false`/`off`",
        doc=(
            "on a sample: release each COUNT and SUM, and its ±, times 1/q, an estimate of the "
            "whole table's total (post-processing: a released sample answer is served again scaled "
            "or not, free)"
        ),
    ),
)

NAMES: tuple[str, ...] = tuple(s.name for s in SETTINGS)
BY_NAME = {s.name: s for s in SETTINGS}


def setting_name(name: object) -> str:
    """A setting's name as a message may show it: the user's text, cut short."""
    text = name if isinstance(name, str) else type(name).__name__
    return text if len(text) <= 64 else text[:61] + "..."


def check_setting(name: str, value: object) -> object:
    """Validate one per-query setting; returns its normalised value."""
    setting = BY_NAME.get(name) if isinstance(name, str) else None
    if setting is None:
        raise ParameterError(
            f"unknown setting dpsql.{setting_name(name)}; known: {', '.join(NAMES)}"
        )
    return setting.check(value)
