"""Accountant decision time, incremental as in the proxy, beside dp_accounting in the same run.

For each accountant: the history is charged up to a checkpoint (100, 1,000, 10,000 events; not
timed, it fills the incremental caches), then the decision for each of the next ``--repeats``
events is timed and the median reported in ms. A *filter* decision is ``admits(history, [new])``;
an *odometer* figure (fixed in advance, never an admission rule) is ``epsilon(history + [new],
1e-6)``. dp_accounting's ``RdpAccountant`` and ``PLDAccountant`` are incremental by design: one
``compose(event)`` and one ``get_epsilon(1e-6)`` per decision.

Histories: "gaussian" repeats a continuous Gaussian (sigma 40, L2 1; calibrated pair at delta
1e-9 for the (epsilon, delta) theorems); "mixed" cycles that Gaussian, a discrete Laplace of
epsilon 0.01 and a pure epsilon 0.02 event (dp_accounting gets a continuous Laplace for the
discrete one). Caps are large (epsilon 1000, delta 1e-5) so that no filter stops early.

    python benchmarks/accountants.py [--repeats 10] [--readme]
"""

from __future__ import annotations

import argparse
import importlib
import math
import statistics
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from dp_accounting import dp_event, rdp
from dp_accounting.pld import pld_privacy_accountant
from scipy.optimize import brentq
from scipy.stats import norm

from dpsql.accounting.theorems.advanced import AdvancedAccountant, AdvancedFilter
from dpsql.accounting.theorems.optimal import OptimalAccountant
from dpsql.accounting.theorems.pld import PldAccountant
from dpsql.accounting.theorems.pld_filter import PldFilter
from dpsql.mechanisms.events import Event
from dpsql.mechanisms.gaussian_events import Gaussian
from dpsql.mechanisms.laplace_events import DiscreteLaplace
from dpsql.mechanisms.stated_events import PureDP

CHECKPOINTS = (100, 1_000, 10_000)
EPS_CAP, DELTA_CAP, DELTA = Fraction(1000), Fraction(1, 10**5), 1e-6
Decision = Callable[[Sequence[Event], Event], object]


def _gaussian() -> Gaussian:
    mu = 1 / 40

    def excess(e: float) -> float:
        return float(norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2)) - 1e-9

    eps = brentq(excess, 0.0, 10.0, xtol=1e-15)
    return Gaussian(40.0, 1.0, Fraction(math.ceil(eps * 1e6), 10**6), Fraction(1, 10**9))


def histories(n: int) -> dict[str, list[Event]]:
    g = _gaussian()
    cycle: list[Event] = [g, DiscreteLaplace(Fraction(100), Fraction(1)), PureDP(Fraction(1, 50))]
    return {"gaussian": [g] * n, "mixed": [cycle[i % 3] for i in range(n)]}


def _filter(cls: Any, **kwargs: Any) -> Callable[[], Decision]:
    def make() -> Decision:
        filt = cls(EPS_CAP, DELTA_CAP, **kwargs)
        return lambda history, new: filt.admits(history, [new])

    return make


def _figure(cls: Any, **kwargs: Any) -> Callable[[], Decision]:
    def make() -> Decision:
        acc = cls(**kwargs)
        return lambda history, new: acc.epsilon([*history, new], DELTA)

    return make


def _pld_decision() -> Decision:
    """The PLD filter on the Gaussian family; on a mixed history, the PLD figure's delta."""
    filt = PldFilter(EPS_CAP, DELTA_CAP, "gaussian")
    acc = PldAccountant()

    def decide(history: Sequence[Event], new: Event) -> object:
        if isinstance(new, Gaussian) and all(isinstance(e, Gaussian) for e in history[-1:]):
            return filt.admits(history, [new])
        return acc.delta([*history, new], float(EPS_CAP)) <= float(DELTA_CAP)

    return decide


def _reference_event(event: Event) -> dp_event.DpEvent:
    if isinstance(event, Gaussian):
        return dp_event.GaussianDpEvent(event.sigma / event.sensitivity)
    if isinstance(event, DiscreteLaplace):
        return dp_event.LaplaceDpEvent(float(event.scale / event.sensitivity))
    # pure epsilon: a Laplace with that epsilon is the closest dp_event
    return dp_event.LaplaceDpEvent(1 / float(event.epsilon))


def _reference(make_acc: Callable[[], Any]) -> Callable[[], Decision]:
    def make() -> Decision:
        state: dict[str, Any] = {"acc": make_acc(), "n": 0}

        def decide(history: Sequence[Event], new: Event) -> object:
            acc = state["acc"]
            counts: dict[Event, int] = {}
            for event in history[state["n"] :]:
                counts[event] = counts.get(event, 0) + 1
            for event, m in counts.items():  # catch up (the warm-up), grouped
                acc.compose(dp_event.SelfComposedDpEvent(_reference_event(event), m))
            acc.compose(_reference_event(new))
            state["n"] = len(history) + 1
            return acc.get_epsilon(DELTA)

        return decide

    return make


def contenders() -> tuple[dict[str, Callable[[], Decision]], list[str]]:
    found: dict[str, Callable[[], Decision]] = {
        "advanced filter (WRRW)": _filter(AdvancedFilter, delta_prime=Fraction(1, 10**6)),
        "advanced figure (KOV 3.5)*": _figure(AdvancedAccountant),
        "optimal figure (KOV/MV)*": _figure(OptimalAccountant),
        "pld filter / figure*": _pld_decision,
    }
    notes = []
    for module, filt, acc in [
        ("basic", "BasicFilter", "BasicAccountant"),
        ("rdp", "RdpFilter", "RdpAccountant"),
        ("zcdp", "ZcdpFilter", "ZcdpAccountant"),
        ("gdp", "GdpFilter", "GdpAccountant"),
    ]:
        try:
            mod = importlib.import_module(f"dpsql.accounting.{module}")
            found[f"{module} filter"] = _filter(getattr(mod, filt))
            found[f"{module} figure"] = _figure(getattr(mod, acc))
        except (ImportError, AttributeError) as exc:
            notes.append(f"{module}: skipped ({exc})")
    found["dp_accounting RDP (ref)"] = _reference(rdp.RdpAccountant)
    found["dp_accounting PLD (ref)"] = _reference(pld_privacy_accountant.PLDAccountant)
    return found, notes


def time_decisions(make: Callable[[], Decision], history: list[Event], repeats: int) -> list[Any]:
    """Median ms per decision after each checkpoint, or the error that stopped it."""
    row: list[Any] = []
    decide = make()
    for c in CHECKPOINTS:
        try:
            decide(history[: c - 1], history[c - 1])  # warm-up: charge up to the checkpoint
            samples = []
            for i in range(c, c + repeats):
                start = time.perf_counter()
                decide(history[:i], history[i])
                samples.append((time.perf_counter() - start) * 1e3)
            row.append(statistics.median(samples))
        except Exception as exc:  # a contender's failure is a result, not a crash
            row.append(f"error: {type(exc).__name__}")
    return row


def table(repeats: int) -> str:
    found, notes = contenders()
    hist = histories(max(CHECKPOINTS) + repeats + 1)
    head = f"{'accountant':30} | {'history':8} | " + " | ".join(f"{c:>9,}" for c in CHECKPOINTS)
    lines = [head, "-" * len(head)]
    for name, make in found.items():
        for kind, history in hist.items():
            row = time_decisions(make, history, repeats)
            cells = " | ".join(f"{x:9.3f}" if isinstance(x, float) else f"{x:>9}" for x in row)
            lines.append(f"{name:30} | {kind:8} | {cells}")
            print(lines[-1], flush=True)
    lines += ["", "ms per decision (median); * = odometer figure, valid as if fixed in advance"]
    return "\n".join(lines + notes)


def write_readme(text: str, repeats: int) -> None:
    path = Path(__file__).with_name("README.md")
    body = path.read_text()
    marker = "\n## `accountants.py`"
    section = SECTION.format(repeats=repeats, table=text)
    if marker not in body:
        path.write_text(body.rstrip("\n") + "\n" + section)
        return
    # Replace this section only: the sections after it are other benchmarks'.
    start = body.index(marker)
    after = body.find("\n## ", start + len(marker))
    rest = "" if after < 0 else body[after:]
    path.write_text(body[:start].rstrip("\n") + "\n" + section + rest)


SECTION = """
## `accountants.py`: accountant decision time

```
python benchmarks/accountants.py --repeats {repeats} --readme
```

Incremental use as in the proxy: the history is charged up to each checkpoint, then the
decision for each next event is timed (median of {repeats}). Filters decide with `admits`;
figures marked * are odometer readings valid only as if fixed in advance. On the Gaussian history
the PLD row is the natural PLD filter over the declared Gaussian family; on the mixed history it
is the PLD figure (the natural filter is invalid for a free mix). dp_accounting's RDP and PLD
accountants run beside them in the same process (`compose` + `get_epsilon` per decision).

```
{table}
```
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--readme", action="store_true", help="write the README section")
    args = parser.parse_args()
    text = table(args.repeats)
    print(text)
    if args.readme:
        write_readme(text, args.repeats)


if __name__ == "__main__":
    main()
