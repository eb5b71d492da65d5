"""Every benchmark still imports: a module that moves takes its benchmarks' imports with it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCH.glob("*.py")))
def test_the_benchmark_imports(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The benchmarks import each other by name (``from run import ...``), as ``make bench`` runs.
    monkeypatch.syspath_prepend(str(BENCH))
    try:
        importlib.import_module(name)
    finally:
        for module in [m for m in sys.modules if m == name]:
            del sys.modules[module]
