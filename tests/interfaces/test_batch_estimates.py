"""``ESTIMATE BOUNDS`` in a ``dpsql run`` file, end to end with a durable ledger: asked again at
the same epsilon it is served free from the first one's estimate (as docs/sql.md promises), and
at an epsilon whose noise cannot be sampled it is refused before the charge, the ledger file
byte for byte unchanged, in the plan too."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_batch import charges, invoke, policy, sql_file  # noqa: F401 - policy is a fixture

from dpsql.accounting.ledger.ledger import Ledger

REPEATED = """\
SET dpsql.epsilon = 0.1;
ESTIMATE BOUNDS FOR visits.age;
SELECT COUNT(*) AS n FROM visits;
ESTIMATE BOUNDS FOR visits.age;
ESTIMATE BOUNDS FOR visits GROUP BY region;
ESTIMATE BOUNDS FOR visits GROUP BY region;
SET dpsql.epsilon = 0.2;
ESTIMATE BOUNDS FOR visits.age;
"""


def _records(at: Path) -> list[tuple[str, dict[str, object]]]:
    return [(r.kind, dict(r.payload)) for r in Ledger(at.parent / "visits.ledger").records()]


def test_an_estimate_repeated_in_a_file_is_charged_once(policy: Path, tmp_path: Path) -> None:  # noqa: F811
    path = sql_file(tmp_path, REPEATED)
    planned = invoke(policy, "run", "--plan", str(path))
    assert planned.exit_code == 0, planned.output
    assert "cache (statement 2)" in planned.output and "cache (statement 5)" in planned.output
    done = invoke(policy, "run", str(path))
    assert done.exit_code == 0, done.output
    # One charge for the file: the first estimate of each key, the query, and the estimate at
    # another epsilon (a new release); the repeats are served from the recorded estimates.
    assert charges(policy) == ["0.5"]  # 0.1 + the query's 0.1 + 0.1 + 0.2
    records = _records(policy)
    estimates = [p for k, p in records if k in ("bounds", "contribution_bounds")]
    assert len(estimates) == 3
    # The repeats read the same released estimate: the same bounds printed twice.
    blocks = done.output.split("-- statement ")
    assert blocks[1].split("\n", 1)[1] == blocks[3].split("\n", 1)[1]
    assert blocks[4].split("\n", 1)[1] == blocks[5].split("\n", 1)[1]
    # Run again, the whole file is served: nothing more is charged.
    again = invoke(policy, "run", str(path))
    assert again.exit_code == 0, again.output
    assert charges(policy) == ["0.5"]


@pytest.mark.parametrize(
    "statement", ["ESTIMATE BOUNDS FOR visits.age", "ESTIMATE BOUNDS FOR visits GROUP BY region"]
)
@pytest.mark.parametrize("epsilon", ["1e-30", "1e-17"])
def test_an_estimate_whose_noise_cannot_be_sampled_is_refused_before_the_charge(
    policy: Path,  # noqa: F811
    tmp_path: Path,
    statement: str,
    epsilon: str,
) -> None:
    ledger = policy.parent / "visits.ledger"
    before = ledger.read_bytes()
    path = sql_file(tmp_path, f"SET dpsql.epsilon = {epsilon};\n{statement};\n")
    for args in (["run", "--plan", str(path)], ["run", str(path)]):
        result = invoke(policy, *args)
        assert result.exit_code == 3, result.output
        assert "BoundsError" in result.output and "too large to sample" in result.output
        assert ledger.read_bytes() == before
