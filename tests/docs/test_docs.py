"""The docs keep up with the code: every policy field, session setting, error class and
allow-listed function is documented, the README's quick start is exactly two commands, and the
README's Python example runs against the example data.

Each check walks the code (the pydantic models, ``SETTINGS``, the exception classes, the
allow-list), so a new field, setting or error fails here until it is written down.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel
from sqlglot import exp

import dpsql as dbapi
from dpsql import errors, policy
from dpsql.session.settings import NAMES as SETTINGS
from dpsql.sql import validate

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
EXPECTED_PAGES = (
    "index.md",
    "quickstart.md",
    "policy.md",
    "sql.md",
    "privacy.md",
    "python.md",
    "errors.md",
    "design.md",
)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _all_docs() -> str:
    return "\n".join(_read(p) for p in sorted(DOCS.glob("*.md")))


def _models(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models inside a field annotation (``dict[str, TableSpec]`` and the like)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _policy_fields(model: type[BaseModel], prefix: str) -> list[str]:
    """Dotted names of every policy field; dict-valued sections get a ``<name>`` placeholder."""
    names = []
    for name, info in model.model_fields.items():
        if info.exclude:  # base_dir: where the file was read from, not part of the policy
            continue
        path = f"{prefix}{name}"
        nested = _models(info.annotation)
        if not nested:
            names.append(path)
        is_mapping = typing.get_origin(info.annotation) is dict
        for sub in nested:
            placeholder = {"tables": "<t>", "columns": "<c>"}.get(name, "<name>")
            sub_prefix = f"{path}.{placeholder}." if is_mapping else f"{path}."
            names.extend(_policy_fields(sub, sub_prefix))
    return names


POLICY_FIELDS = _policy_fields(policy.Policy, "")


def test_policy_fields_are_walked() -> None:
    # Guard against a walk that finds nothing (and so checks nothing).
    assert "budget.query_epsilon" in POLICY_FIELDS
    assert "tables.<t>.columns.<c>.public_values_from" in POLICY_FIELDS
    assert "data.tables" in POLICY_FIELDS
    assert not any("base_dir" in f for f in POLICY_FIELDS)


@pytest.mark.parametrize("field", POLICY_FIELDS)
def test_policy_field_is_documented(field: str) -> None:
    text = _read(DOCS / "policy.md")
    # Each field has its own heading or table row naming its full dotted path in backticks.
    assert f"`{field}`" in text, f"docs/policy.md does not document `{field}`"


@pytest.mark.parametrize("name", SETTINGS)
def test_session_setting_is_documented(name: str) -> None:
    for page in ("sql.md", "python.md"):
        assert f"dpsql.{name}" in _read(DOCS / page), f"docs/{page} lacks dpsql.{name}"


def _error_classes() -> list[str]:
    names = set(errors.__all__)
    for name, obj in vars(dbapi).items():
        if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == dbapi.__name__:
            names.add(name)
    return sorted(names)


def test_error_classes_are_found() -> None:
    found = _error_classes()
    assert {"BudgetExceededError", "ProgrammingError", "Warning", "PolicyFailure"} <= set(found)


@pytest.mark.parametrize("name", _error_classes())
def test_error_class_is_documented(name: str) -> None:
    assert re.search(rf"`(dpsql\.(errors\.)?)?{name}`", _read(DOCS / "errors.md")), (
        f"docs/errors.md does not document {name}"
    )


def _function_names() -> list[str]:
    """The SQL name of every allow-listed function (and function-like operator)."""
    return [cls.sql_names()[0] for cls in validate.ALLOWED if issubclass(cls, exp.Func)]


def test_allow_listed_functions_are_documented() -> None:
    names = _function_names()
    assert "COALESCE" in names and "COUNT" in names
    text = _read(DOCS / "sql.md")
    missing = [n for n in names if not re.search(rf"\b{n}\b", text)]
    assert not missing, f"docs/sql.md does not list {missing}"


def test_every_page_exists_and_links_resolve() -> None:
    for page in EXPECTED_PAGES:
        assert (DOCS / page).is_file(), page
    for source in [README, *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", _read(source)):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            assert (source.parent / target).exists(), f"{source.name} links to missing {target}"


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {title}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def test_readme_quick_start_is_exactly_two_commands() -> None:
    section = _section(_read(README), "Quick start")
    blocks = re.findall(r"```[a-z]*\n(.*?)```", section, re.S)
    commands = [line.strip() for b in blocks for line in b.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]


def test_readme_states_the_budget_and_trust_limits() -> None:
    text = " ".join(_read(README).split()).lower()
    assert "in memory" in text and "resets when the process ends" in text
    assert "data file" in text


def test_readme_python_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", _read(README), re.S)
    assert blocks, "README has no Python example"
    data = ROOT / "examples" / "data" / "visits.parquet"
    assert data.exists(), "run `make demo` (or examples/make_data.py) to create the example data"
    # A fresh interpreter in the repository root, as a reader would run it.
    done = subprocess.run(
        [sys.executable, "-c", blocks[0]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "±" in done.stdout


# -- documented SQL semantics (docs/sql.md) that the code must keep ---------------------------


def _near_exact(tiny_policy: typing.Any, rows: list[tuple[typing.Any, ...]]) -> typing.Any:
    """A cursor whose answers are almost noiseless: epsilon 20, one row and group per unit."""
    budget = {"epsilon": "20", "query_epsilon": "20"}
    policy = tiny_policy(rows, max_groups=1, max_rows=1, budget=budget)
    return dbapi.connect(policy).cursor()


def test_nulls_and_nan_are_skipped_by_aggregates(tiny_policy: typing.Any) -> None:
    # docs/sql.md: SUM, AVG and COUNT(x) skip NULL, and NaN counts as NULL. Checked on the
    # pre-noise totals of the bounded query, which are exact.
    rows = [(i, "east", 30, [1.0, None, float("nan")][i % 3]) for i in range(3000)]
    session = _near_exact(tiny_policy, rows).connection.session
    plan = session.plan("SELECT COUNT(spend) AS n, AVG(spend) AS mean FROM visits")
    _, (totals,) = session.engine.run(plan.bounded_sql)
    by_label = {m.label: (int(t), m) for t, m in zip(totals, plan.measurements, strict=True)}
    ((count, _),) = [v for k, v in by_label.items() if k.startswith("COUNT(")]
    assert count == 1000
    ((centred, m),) = [v for k, v in by_label.items() if k.startswith("SUM(")]
    grid = plan.estimates[1].grid
    assert grid is not None
    assert grid.centre + centred * m.unit / count == 1


def test_offset_runs_on_noisy_rows(tiny_policy: typing.Any) -> None:
    # docs/sql.md: LIMIT and OFFSET (integer literals) run on the released rows.
    rows = [(i, ["east", "west"][i % 2], 30, 1.0) for i in range(100)]
    cur = _near_exact(tiny_policy, rows)
    cur.execute("SELECT region, COUNT(*) FROM visits GROUP BY region LIMIT 2 OFFSET 1")
    assert [r[0] for r in cur.fetchall()] == ["east", "north"]
