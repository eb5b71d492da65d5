"""The settings are declared once (``dpsql.session.settings.SETTINGS``): everything else that
names them is held to that table here, the docs included."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest
from conftest import TinyPolicy

from dpsql.errors import ParameterError
from dpsql.session.effective import Settings, SetValues, field_names
from dpsql.session.settings import NAMES, SETTINGS, check_setting
from dpsql.sql.options import KEYS

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_table_is_the_settings_table() -> None:
    """docs/sql.md lists every setting, in the table's order, with the table's own words."""
    text = (ROOT / "docs" / "sql.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `dpsql\.\w+` \| .* \|$", text, flags=re.M)
    assert rows == [
        f"| `dpsql.{s.name}` | {s.default_text} | {s.values} | {s.doc} |" for s in SETTINGS
    ]


def test_the_settings_value_has_one_field_per_setting() -> None:
    assert field_names() == NAMES


def test_the_options_clause_sets_exactly_the_settings_that_say_so() -> None:
    assert set(KEYS.values()) == {s.name for s in SETTINGS if s.options}


def test_defaults_come_from_the_table_and_the_policy(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy([(1, "east", 30, 1.0)])
    settings = Settings.resolve(policy, {}, {})
    assert settings.epsilon == policy.budget.query_epsilon
    assert settings.delta == policy.budget.query_delta
    assert settings.mechanism == policy.budget.mechanism
    assert settings.max_groups_per_unit is None and settings.asked == frozenset()
    assert settings["split"] == "min_max_ratio" and settings.diagnose_epsilon is None
    assert settings.diagnose is policy.budget.diagnose  # a share of the query's epsilon


def test_set_values_then_the_statement_s_own_win(tiny_policy: TinyPolicy) -> None:
    policy = tiny_policy([(1, "east", 30, 1.0)])
    values = SetValues()
    values.set("EPSILON", "0.5")
    values.set("split", "even")
    settings = Settings.resolve(policy, values.values(), {"epsilon": "0.25", "rho": None})
    assert settings.epsilon == Fraction(1, 4) and settings.split == "even"
    assert settings.asked == {"epsilon", "split"}  # a None option is not given
    values.set("split", None)
    assert Settings.resolve(policy, values.values(), {}).split == "min_max_ratio"


@pytest.mark.parametrize("name", NAMES)
def test_every_check_refuses_an_object_naming_the_setting_only(name: str) -> None:
    class Hostile:
        def __str__(self) -> str:  # a value's text must never be read, nor shown
            raise AssertionError("str() of a setting's value was taken")

    with pytest.raises(ParameterError) as info:
        check_setting(name, Hostile())
    assert name in str(info.value) or name.split("_", maxsplit=1)[0] in str(info.value)


def test_an_unknown_setting_is_refused_by_name() -> None:
    with pytest.raises(ParameterError, match=r"unknown setting dpsql\.nosuch"):
        check_setting("nosuch", 1)
    with pytest.raises(ParameterError, match=r"unknown setting dpsql\.nosuch"):
        SetValues().set("nosuch", None)
