"""No async function of dynsched-ray calls ``ray.get`` (or ``ray.wait``): they await refs."""

from __future__ import annotations

import ast
from pathlib import Path

import dynsched_ray

SRC = Path(dynsched_ray.__file__).parent
BLOCKING = {"get", "wait"}


def _blocking_calls(tree: ast.AST) -> list[str]:
    found: list[str] = []
    ray_aliases = {"ray"}
    direct: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "ray":
                    ray_aliases.add(a.asname or "ray")
        elif isinstance(node, ast.ImportFrom) and node.module == "ray":
            for a in node.names:
                if a.name in BLOCKING:
                    direct.add(a.asname or a.name)

    def visit(fn: ast.AsyncFunctionDef) -> None:
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if (
                isinstance(f, ast.Attribute)
                and f.attr in BLOCKING
                and isinstance(f.value, ast.Name)
                and f.value.id in ray_aliases
            ) or (isinstance(f, ast.Name) and f.id in direct):
                found.append(f"{fn.name}:{node.lineno}")

    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncFunctionDef):
            visit(node)
    return found


def test_no_async_function_calls_ray_get() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) >= 5
    offenders = {
        str(p.relative_to(SRC)): calls
        for p in files
        if (calls := _blocking_calls(ast.parse(p.read_text(encoding="utf-8"))))
    }
    assert offenders == {}


def test_the_checker_catches_offenders() -> None:
    bad = ast.parse(
        "import ray\nfrom ray import get as g\n"
        "async def f(r):\n    return ray.get(r)\n"
        "async def h(r):\n    return g(r)\n"
        "def ok(r):\n    return ray.get(r)\n"
    )
    assert _blocking_calls(bad) == ["f:4", "h:6"]
