"""Policy validation: every invalid policy is refused with a PolicyError that names the field."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import pytest

import dpsql as dbapi
from dpsql.errors import PolicyError
from dpsql.policy import Policy, load_policy
from dpsql.session.session import Session

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "policy.toml"

Raw = dict[str, Any]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("policy")
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE t AS SELECT (i % 10)::BIGINT AS user_id, (18 + i % 50)::INTEGER AS age, "
        "['a', 'b'][1 + i % 2] AS region FROM range(100) r(i)"
    )
    con.execute(f"COPY t TO '{path / 'v.parquet'}' (FORMAT parquet)")
    con.execute("CREATE TABLE r AS SELECT 'a' AS region UNION ALL SELECT 'b'")
    con.execute(f"COPY r TO '{path / 'regions.parquet'}' (FORMAT parquet)")
    con.close()
    return path


def valid() -> Raw:
    return {
        "dataset": {"id": "test", "data_version": "1"},
        "data": {"tables": {"visits": "v.parquet", "regions": "regions.parquet"}},
        "budget": {
            "diagnose": False,
            "epsilon": "1",
            "delta": "1e-6",
            "query_epsilon": "0.1",
            "query_delta": "1e-9",
        },
        "tables": {
            "visits": {
                "privacy_unit": "user_id",
                "max_groups_per_unit": 1,
                "max_rows_per_unit_per_group": 5,
                "columns": {
                    "age": {"lower": 18, "upper": 90},
                    "region": {"public_values_from": "regions.region"},
                },
            },
            "regions": {"public": True},
        },
    }


def load(raw: Raw, base: Path) -> Policy:
    return load_policy(raw, base_dir=base)


def test_valid_policy_loads_and_serves(data_dir: Path) -> None:
    policy = load(valid(), data_dir)
    assert policy.tables["visits"].privacy_unit == "user_id"
    session = Session(policy)
    try:
        assert session.execute("SELECT COUNT(*) FROM visits", epsilon=1).rows
    finally:
        session.close()


def _set(path: str, value: object) -> Callable[[Raw], None]:
    def mutate(raw: Raw) -> None:
        *parents, leaf = path.split(".")
        node = raw
        for part in parents:
            node = node[part]
        node[leaf] = value

    return mutate


def _drop(path: str) -> Callable[[Raw], None]:
    def mutate(raw: Raw) -> None:
        *parents, leaf = path.split(".")
        node = raw
        for part in parents:
            node = node[part]
        del node[leaf]

    return mutate


AGE = "tables.visits.columns.age"
INVALID: list[tuple[str, Callable[[Raw], None], str]] = [
    ("missing dataset", _drop("dataset"), "dataset"),
    ("missing budget", _drop("budget"), "budget"),
    ("missing dataset id", _drop("dataset.id"), "dataset.id"),
    ("lower above upper", _set(AGE, {"lower": 90, "upper": 18}), AGE),
    ("lower equal upper", _set(AGE, {"lower": 5, "upper": 5}), AGE),
    ("only lower", _set(AGE, {"lower": 18}), AGE),
    ("only upper", _set(AGE, {"upper": 90}), AGE),
    ("bound not a number", _set(AGE, {"lower": "low", "upper": 90}), f"{AGE}.lower"),
    ("bound too large", _set(AGE, {"lower": 0, "upper": 2**60}), AGE),
    ("unit and public", _set("tables.visits.public", True), "tables.visits"),
    ("neither unit nor public", _drop("tables.visits.privacy_unit"), "tables.visits"),
    (
        "public table with bounds",
        _set("tables.regions", {"public": True, "max_groups_per_unit": 2}),
        "tables.regions",
    ),
    ("negative delta", _set("budget.delta", "-0.1"), "budget"),
    ("delta one", _set("budget.delta", 1), "budget"),
    ("negative query delta", _set("budget.query_delta", -1e-9), "budget"),
    ("zero epsilon", _set("budget.epsilon", 0), "budget"),
    ("negative epsilon", _set("budget.epsilon", "-1"), "budget"),
    ("nan epsilon", _set("budget.epsilon", float("nan")), "budget"),
    ("boolean epsilon", _set("budget.epsilon", True), "budget"),
    ("absurd query epsilon", _set("budget.query_epsilon", 21), "budget"),
    ("zero max groups", _set("tables.visits.max_groups_per_unit", 0), "max_groups_per_unit"),
    (
        "huge max rows",
        _set("tables.visits.max_rows_per_unit_per_group", 10**9),
        "max_rows_per_unit_per_group",
    ),
    ("bad table name", _set("tables.bad-name", {"public": True}), "bad-name"),
    ("bad data table name", _set("data.tables", {"v;drop": "v.parquet"}), "data"),
    ("bad data suffix", _set("data.tables", {"visits": "v.json"}), "data"),
    ("no data", _set("data", {}), "data"),
    (
        "public_values_from a private table",
        _set(f"{AGE}", {"public_values_from": "visits.age"}),
        "public_values_from",
    ),
    (
        "public_values_from an unknown table",
        _set(f"{AGE}", {"public_values_from": "nowhere.age"}),
        "public_values_from",
    ),
    (
        "public_values and public_values_from",
        _set(f"{AGE}", {"public_values": [1], "public_values_from": "regions.region"}),
        AGE,
    ),
    ("duplicate public values", _set(f"{AGE}", {"public_values": [1, 1]}), AGE),
    ("unknown top-level key", _set("seed", 1), "seed"),
    ("unknown budget key", _set("budget.seed", 1), "budget.seed"),
    ("unknown table key", _set("tables.visits.max_rows", 3), "tables.visits.max_rows"),
    ("unknown column key", _set(f"{AGE}.clamp", True), f"{AGE}.clamp"),
    ("unknown dataset key", _set("dataset.owner", "x"), "dataset.owner"),
]


@pytest.mark.parametrize(
    ("mutate", "field"), [(m, f) for _, m, f in INVALID], ids=[name for name, _, _ in INVALID]
)
def test_invalid_policy_is_rejected_naming_the_field(
    data_dir: Path, mutate: Callable[[Raw], None], field: str
) -> None:
    raw = copy.deepcopy(valid())
    mutate(raw)
    with pytest.raises(PolicyError) as info:
        load(raw, data_dir)
    assert field in str(info.value)
    # Through the DB-API the same error is a PolicyFailure, an InterfaceError.
    with pytest.raises(dbapi.PolicyFailure) as failure:
        dbapi.connect({**raw})
    assert isinstance(failure.value, dbapi.InterfaceError)
    assert isinstance(failure.value, PolicyError)


def test_missing_data_file_is_rejected_naming_the_table(data_dir: Path) -> None:
    raw = valid()
    raw["data"]["tables"]["visits"] = "missing.parquet"
    policy = load(raw, data_dir)  # the file is looked for when the data is opened
    with pytest.raises(PolicyError, match=r"data\.tables\.visits"):
        Session(policy)
    with pytest.raises(dbapi.PolicyFailure, match=r"data\.tables\.visits"):
        dbapi.connect(policy)


def test_missing_database_file_is_rejected(data_dir: Path) -> None:
    raw = valid()
    raw["data"] = {"database": "missing.duckdb"}
    with pytest.raises(PolicyError, match=r"data\.database"):
        Session(load(raw, data_dir))


def test_unreadable_policy_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[dataset\nid = 1", encoding="utf-8")
    with pytest.raises(PolicyError, match="TOML"):
        load_policy(bad)


def test_decimal_text_is_parsed_exactly(data_dir: Path) -> None:
    raw = valid()
    raw["budget"].update(epsilon="0.01", query_epsilon="0.01", delta="1e-6")
    policy = load(raw, data_dir)
    assert policy.budget.epsilon == Fraction(1, 100)
    assert policy.budget.query_epsilon == Fraction(1, 100)
    assert policy.budget.delta == Fraction(1, 10**6)
    # A Python float goes through its shortest decimal text, not the binary double.
    raw["budget"].update(epsilon=0.01, query_epsilon=0.01)
    policy = load(raw, data_dir)
    assert policy.budget.epsilon == Fraction(1, 100)
    assert Fraction(0.01) != Fraction(1, 100)  # the trap being avoided


def test_toml_floats_are_parsed_exactly(data_dir: Path, tmp_path: Path) -> None:
    text = f"""
[dataset]
id = "toml"
[data]
tables = {{ visits = "{(data_dir / "v.parquet").as_posix()}" }}
[budget]
diagnose = false
epsilon = 0.01
delta = 1e-6
query_epsilon = 0.01
query_delta = 0.1e-8
[tables.visits]
privacy_unit = "user_id"
[tables.visits.columns.age]
lower = 0.1
upper = 90.3
"""
    path = tmp_path / "policy.toml"
    path.write_text(text, encoding="utf-8")
    policy = load_policy(path)
    assert policy.budget.epsilon == Fraction(1, 100)
    assert policy.budget.query_epsilon == Fraction(1, 100)
    assert policy.budget.delta == Fraction(1, 10**6)
    assert policy.budget.query_delta == Fraction(1, 10**9)
    assert policy.tables["visits"].columns["age"].bounds == (Fraction(1, 10), Fraction(903, 10))


def test_example_policy_loads() -> None:
    policy = load_policy(EXAMPLE)
    assert policy.dataset.id == "visits-example"
    assert policy.budget.epsilon == 10
    assert policy.budget.delta == Fraction(1, 10**6)
    assert policy.budget.query_epsilon == Fraction(1, 2)
    visits = policy.tables["visits"]
    assert visits.privacy_unit == "user_id"
    assert visits.max_groups_per_unit == 2
    assert visits.max_rows_per_unit_per_group == 10
    assert visits.columns["spend"].bounds == (0, 200)
    assert visits.columns["region"].public_values == ("central", "east", "north", "south", "west")
    assert policy.resolve(policy.data.tables["visits"]).exists()


def test_policy_is_frozen(data_dir: Path) -> None:
    policy = load(valid(), data_dir)
    with pytest.raises(Exception, match="frozen"):
        policy.budget.epsilon = Fraction(100)  # type: ignore[misc]


VERSION_CHANGES: list[tuple[str, object]] = [
    ("dataset.id", "other"),
    ("dataset.data_version", "2"),
    ("data.tables", {"visits": "v.parquet", "regions": "regions.parquet", "x": "v.parquet"}),
    ("budget.epsilon", "2"),
    ("budget.delta", "1e-7"),
    ("budget.query_epsilon", "0.2"),
    ("budget.query_delta", "1e-10"),
    ("tables.visits.privacy_unit", "age"),
    ("tables.visits.max_groups_per_unit", 2),
    ("tables.visits.max_rows_per_unit_per_group", 6),
    (f"{AGE}.lower", 17),
    (f"{AGE}.upper", 91),
    ("tables.visits.columns.region", {"public_values": ["a", "b"]}),
    ("tables.visits.columns.spend", {"lower": 0, "upper": 1}),
]


@pytest.mark.parametrize(("path", "value"), VERSION_CHANGES, ids=[p for p, _ in VERSION_CHANGES])
def test_version_changes_when_any_field_changes(data_dir: Path, path: str, value: object) -> None:
    before = load(valid(), data_dir)
    raw = copy.deepcopy(valid())
    _set(path, value)(raw)
    after = load(raw, data_dir)
    assert after.version != before.version


def test_version_is_stable(data_dir: Path, tmp_path: Path) -> None:
    first = load(valid(), data_dir)
    second = load(copy.deepcopy(valid()), data_dir)
    assert first.version == second.version
    # base_dir only resolves paths; it is not part of the policy.
    assert load(valid(), tmp_path).version == first.version
    # The same number written differently is the same policy.
    raw = valid()
    raw["budget"]["epsilon"] = 1
    assert load(raw, data_dir).version == first.version


def _docs_engine_block() -> Raw:
    """The ``[engine]`` example of docs/policy.md, as the data owner would paste it."""
    import re
    import tomllib

    text = (Path(__file__).resolve().parents[2] / "docs" / "policy.md").read_text()
    section = text.split("## `[engine]`", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```toml\n(.*?)```", section, re.S)
    return tomllib.loads(block)


def test_the_engine_section_of_the_docs_runs(data_dir: Path, tmp_path: Path) -> None:
    """The documented block loads, and the engine runs with its cap, its spill directory and its
    threads; none of them is part of the policy's version (they never change an answer)."""
    raw = valid()
    raw.update(_docs_engine_block())
    assert raw["engine"]["memory_limit"] == "8GB"
    raw["engine"]["temp_directory"] = str(tmp_path / "spill")
    policy = load(raw, data_dir)
    assert policy.version == load(valid(), data_dir).version
    session = Session(policy)
    try:
        settings = session.engine._con.execute(  # the engine's own view of its settings
            "SELECT current_setting('memory_limit'), current_setting('temp_directory'), "
            "current_setting('threads'), current_setting('max_temp_directory_size')"
        ).fetchone()
        assert settings is not None
        assert settings[0].startswith("7.4 GiB") and settings[2] == 2
        assert settings[3].startswith("93.1 GiB")  # 100 GB
        # No progress bar on the terminal, on the engine's connection or its cursors.
        for con in (session.engine._con, session.engine._con.cursor()):
            row = con.execute("SELECT current_setting('enable_progress_bar')").fetchone()
            assert row == (False,)
        assert settings[1] == str(tmp_path / "spill")
        assert session.execute("SELECT COUNT(*) FROM visits").rows
    finally:
        session.close()


def test_the_default_engine_spills_outside_the_working_directory(data_dir: Path) -> None:
    session = Session(load(valid(), data_dir))
    try:
        row = session.engine._con.execute("SELECT current_setting('temp_directory')").fetchone()
        assert row is not None and Path(row[0]).is_absolute()
        folder = Path(row[0])
        assert folder.name == str(os.getpid()) and folder.parent.name.startswith("dpsql-spill-")
        assert folder.parent.stat().st_mode & 0o077 == 0  # private to the user
    finally:
        session.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memory_limit", "lots"),
        ("memory_limit", "0%"),
        ("memory_limit", "150%"),
        ("memory_limit", "4GB; SET x = 1"),
        ("max_spill", "50%"),
        ("max_spill", "a lot"),
        ("threads", 0),
        ("name", "postgres"),
        ("surprise", 1),
    ],
)
def test_a_bad_engine_setting_is_refused(data_dir: Path, field: str, value: object) -> None:
    raw = valid()
    raw["engine"] = {field: value}
    with pytest.raises(PolicyError, match=f"engine.{field}"):
        load(raw, data_dir)
