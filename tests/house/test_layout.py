"""The house pinned: the package's folders are the pipeline's stages, and imports flow one way.

The contract (docs/design.md, "The tree"): every module under ``dpsql/<stage>/`` imports only
modules of its own stage or of an earlier one, in the order of ``STAGES``; ``errors`` and
``policy`` come first, since every stage reads them. On top of the order, the rules DESIGN.md
section 8 states outright: neither ``noise`` nor ``accounting`` imports ``engine`` (the charge is
decided from public information only), ``engine`` imports neither ``accounting`` nor ``noise``,
and nothing below ``interfaces`` imports an interface. No two modules import each other, however
indirectly, and every import counts: at the top of a module, inside a function, or under
``TYPE_CHECKING``. The package root holds at most three modules, no module holds more than 450
lines, and exactly one module outside ``accounting/`` charges the budget.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dpsql"

# The stages in pipeline order (docs/design.md draws them): a module may import its own stage
# and the stages before it.
STAGES = (
    "errors",
    "policy",
    "sql",
    "analyze",
    "bound",
    "mechanisms",
    "plan",
    "accounting",
    "engine",
    "noise",
    "release",
    "cache",
    "session",
    "interfaces",
)
# Imports the order allows that DESIGN.md section 8 forbids all the same.
FORBIDDEN = {
    ("noise", "engine"),
    ("noise", "accounting"),
    ("accounting", "engine"),
    ("engine", "accounting"),
    ("engine", "noise"),
}
MAX_LINES = 450
MAX_ROOT_MODULES = 3


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module an imported dotted name lives in (a name imported from a module is the
    module's)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path) -> set[str]:
    """Every dpsql module ``module`` imports, wherever the import statement stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            # ``from package import module`` imports the module, not the package's face.
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            names = subs if len(subs) == len(node.names) else [base, *subs]
        for name in names:
            target = _resolve(name) if name.startswith("dpsql") else None
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _stage(module: str) -> str | None:
    """The stage of a module: the first folder under dpsql, or ``errors``; None for the
    package's own ``__init__`` (its public face, which may import anything)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_folder_of_the_package_is_a_stage() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(STAGES) - {"errors"}


def test_imports_point_to_earlier_stages_only() -> None:
    rank = {stage: i for i, stage in enumerate(STAGES)}
    later = []
    for module, targets in GRAPH.items():
        stage = _stage(module)
        if stage is None:
            continue
        for target in targets:
            other = _stage(target)
            if other is None:
                later.append(f"{module} imports the package root")
            elif rank[other] > rank[stage]:
                later.append(f"{module} ({stage}) imports {target} ({other}), a later stage")
            elif (stage, other) in FORBIDDEN:
                later.append(f"{module} ({stage}) imports {target} ({other}): forbidden")
    assert later == []


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(GRAPH)))
    try:
        for v in sorted(GRAPH):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def test_no_module_imports_itself_through_others() -> None:
    assert _cycles() == []


def test_the_contract_catches_what_it_forbids() -> None:
    """The checks above would fail on a later-stage import and on a cycle."""
    GRAPH["dpsql.sql.parse"].add("dpsql.session.session")
    GRAPH["dpsql.session.session"].add("dpsql.sql.parse")
    try:
        with pytest.raises(AssertionError):
            test_imports_point_to_earlier_stages_only()
        with pytest.raises(AssertionError):
            test_no_module_imports_itself_through_others()
    finally:
        GRAPH["dpsql.sql.parse"] = _imports("dpsql.sql.parse", MODULES["dpsql.sql.parse"])
        GRAPH["dpsql.session.session"] = _imports(
            "dpsql.session.session", MODULES["dpsql.session.session"]
        )
    test_imports_point_to_earlier_stages_only()


def test_the_package_root_holds_few_modules() -> None:
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_450_lines(module: str) -> None:
    lines = MODULES[module].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{module} has {lines} lines"


def test_packages_inside_are_folders_not_faces() -> None:
    """A stage's ``__init__`` holds its docstring only: a module is imported from where it is
    defined (no re-exports), except the package's public face and the policy's."""
    faces = {"dpsql", "dpsql.policy"}
    for module, path in MODULES.items():
        if path.name != "__init__.py" or module in faces:
            continue
        body = ast.parse(path.read_text(encoding="utf-8")).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr), f"{module} is not a docstring"
        assert isinstance(body[0].value, ast.Constant) and str(body[0].value.value).strip()


def _reaches(module: str) -> set[str]:
    """Every module ``module`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for target in GRAPH[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_only_the_owner_s_cli_reaches_the_data_check() -> None:
    """``dpsql check`` reads every line of the data and names lines: the owner's command only.
    No module of an analyst interface (shell, wire server, DB-API, the session they share)
    imports ``dpsql.engine.check``, however indirectly; within the interfaces, only the CLI's
    ``check`` command (and the group that registers it) does."""
    check = {m for m in MODULES if m.startswith("dpsql.engine.check")}
    reaching = sorted(m for m in MODULES if m not in check and _reaches(m) & check)
    assert reaching == ["dpsql.interfaces.cli.check", "dpsql.interfaces.cli.main"], reaching


CHARGE = re.compile(r"\.charge\(")


def test_one_module_outside_accounting_charges() -> None:
    """Charge-before-run is written once: only the session's pipeline calls the filter's
    ``charge`` (the budget itself lives in ``accounting/``)."""
    charging = sorted(
        module
        for module, path in MODULES.items()
        if _stage(module) != "accounting" and CHARGE.search(path.read_text(encoding="utf-8"))
    )
    assert charging == ["dpsql.session.pipeline"]


def _private_session_uses(source: str) -> list[str]:
    """Each ``<...session>._name`` an interface writes: an attribute of a private name read from
    anything called a session (``session``, ``self.session``, ``self._session``, ...)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__"):
            continue
        owner = node.value
        name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
        if "session" in name.lower():
            found.append(ast.unparse(node))
    return found


def test_interfaces_use_the_session_s_public_members_only() -> None:
    """The interfaces call ``Session``'s public methods; none reaches into its parts' privates
    (as the workload answers once called seven private members)."""
    uses = {
        module: _private_session_uses(path.read_text(encoding="utf-8"))
        for module, path in MODULES.items()
        if _stage(module) == "interfaces"
    }
    assert {m: u for m, u in uses.items() if u} == {}
    # and the check sees such a use
    seen = _private_session_uses("x = self.session._answer(q)\ny = session._plans")
    assert sorted(seen) == ["self.session._answer", "session._plans"]


def test_the_stage_graph_is_what_the_docs_draw() -> None:
    """docs/design.md lists the folders in the order of STAGES."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    drawn = re.findall(r"^  ([a-z]+)/ ", text, flags=re.M)
    assert drawn == [s for s in STAGES if s != "errors"]


def test_the_graph_sees_every_kind_of_import() -> None:
    """Function-level and TYPE_CHECKING imports count like the others."""
    source = "from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
    source += "if TYPE_CHECKING:\n    from dpsql.plan.plans import Plan\n"
    source += "def f():\n    from dpsql.engine import base\n    import dpsql.noise.bits\n"
    path = ROOT / "build" / "probe.py"
    path.parent.mkdir(exist_ok=True)
    try:
        path.write_text(source, encoding="utf-8")
        assert _imports("dpsql.release.probe", path) == {
            "dpsql.plan.plans",
            "dpsql.engine.base",
            "dpsql.noise.bits",
        }
    finally:
        path.unlink()


def test_every_module_is_reached_from_the_package() -> None:
    """No module is left behind by a move: each is imported by another module (or is a stage's
    ``__init__``, or the command's entry point)."""
    imported = set().union(*GRAPH.values())
    entry = {"dpsql", "dpsql.interfaces.cli.main"}
    lonely = defaultdict(list)
    for module, path in MODULES.items():
        if module in imported or module in entry or path.name == "__init__.py":
            continue
        lonely[_stage(module)].append(module)
    assert dict(lonely) == {}
