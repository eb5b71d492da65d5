"""What the docs cite exists: every module, name and file of the package, and every test file.

A module moves with the stage it belongs to; a page that still names its old home would send a
reader to nothing. So every dotted name ``dpsql.<stage>....`` in README.md and docs/ resolves
(a module, or a name defined in one), every ``dpsql/<stage>/...`` path and every ``tests/...py``
path exists, and every name docs/python.md shows as ``dpsql.<Name>`` is importable from the
package itself (its public face).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import dpsql
from dpsql.session.settings import NAMES

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
STAGES = sorted(p.name for p in (ROOT / "dpsql").iterdir() if p.is_dir() and p.name[0] != "_")
DOTTED = re.compile(r"\bdpsql(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
PATH = re.compile(r"(?<![\w/])dpsql/[A-Za-z0-9_/]+(?:\.py)?")
TESTS = re.compile(r"(?<![\w/])tests/[A-Za-z0-9_/]+\.py")


def _cited(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    found = set()
    for page in PAGES:
        for match in pattern.findall(page.read_text(encoding="utf-8")):
            found.add((page.name, match.rstrip(".")))
    return sorted(found)


def _resolves(dotted: str) -> bool:
    """A module, or a name defined in one, reached by importing the longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            thing: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(thing, name):
                return False
            thing = getattr(thing, name)
        return True
    return False


STAGE_NAMES = [(page, name) for page, name in _cited(DOTTED) if name.split(".")[1] in STAGES]


@pytest.mark.parametrize(("page", "name"), STAGE_NAMES)
def test_every_module_cited_resolves(page: str, name: str) -> None:
    assert _resolves(name), f"{page} cites {name}, which does not exist"


@pytest.mark.parametrize(
    ("page", "path"), [(p, x) for p, x in _cited(PATH) if x.split("/")[1] in STAGES]
)
def test_every_package_path_cited_exists(page: str, path: str) -> None:
    assert (ROOT / path).exists(), f"{page} cites {path}, which does not exist"


@pytest.mark.parametrize(("page", "path"), _cited(TESTS))
def test_every_test_file_cited_exists(page: str, path: str) -> None:
    assert (ROOT / path).is_file(), f"{page} cites {path}, which does not exist"


def test_the_names_python_md_shows_are_the_package_s() -> None:
    text = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
    shown = {m.split(".")[1] for m in DOTTED.findall(text) if m.count(".") == 1}
    # A setting (dpsql.epsilon) and what SHOW shows besides (dpsql.budget, dpsql.all, and the
    # dpsql.name of the syntax) are named like the package's names, but are SET, not imported.
    commands = {*NAMES, "budget", "all", "name"}
    missing = sorted(name for name in shown - commands if not hasattr(dpsql, name))
    assert missing == []


def test_the_checks_find_what_is_gone() -> None:
    assert _resolves("dpsql.session.pipeline.Pipeline")
    assert not _resolves("dpsql.session.pipeline.NoSuchName")
    assert not _resolves("dpsql.noise.samplers")
    assert STAGE_NAMES, "the docs cite no module: the pattern is wrong"
