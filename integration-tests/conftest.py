"""Fixtures of the integration tests."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="session")
def load_benchmark() -> Callable[[str], ModuleType]:
    """``load_benchmark("name")``: ``benchmarks/name.py`` as a module (``benchmarks/`` is not
    a package; its own folder goes on ``sys.path`` first, for the scripts that import their
    siblings)."""

    def load(name: str) -> ModuleType:
        if str(BENCHMARKS) not in sys.path:
            sys.path.insert(0, str(BENCHMARKS))
        spec = importlib.util.spec_from_file_location(
            f"{name}_under_test", BENCHMARKS / f"{name}.py"
        )
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod

    return load
