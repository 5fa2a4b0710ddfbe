"""Versions, sibling ranges, changelogs and dependencies follow the rule in the root README.

The rule ("Releasing" in the root README): each package has its own version; inside a
*series* (``0.MINOR`` while 0.x, ``MAJOR`` from 1.0) versions are compatible. A package
declares each sibling as ``>=LOW,<NEXT`` where ``NEXT`` starts the series after the
sibling's current version and ``LOW`` lies in that series, at most the current version:
the range CI tests (all packages at their current versions) and nothing wider. Every
declared dependency is used; every third-party module a package imports is declared.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from dynsched_core import cli
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = sorted((ROOT / "packages").glob("dynsched-*"))
EXAMPLE_DIR = ROOT / "integration-tests" / "example-policy"
ALL_DIRS = [*PACKAGE_DIRS, EXAMPLE_DIR]


def pyproject(path: Path) -> dict[str, Any]:
    with (path / "pyproject.toml").open("rb") as fh:
        return tomllib.load(fh)


PROJECTS = {d.name: pyproject(d)["project"] for d in ALL_DIRS}
SIBLINGS = {
    canonicalize_name(pyproject(d)["project"]["name"]): Version(pyproject(d)["project"]["version"])
    for d in PACKAGE_DIRS
}


def series(v: Version) -> tuple[int, ...]:
    """Versions in one series are compatible: ``(0, minor)`` while 0.x, else ``(major,)``."""
    return (0, v.minor) if v.major == 0 else (v.major,)


def next_series(v: Version) -> Version:
    return Version(f"0.{v.minor + 1}") if v.major == 0 else Version(f"{v.major + 1}")


def import_name(d: Path) -> str:
    (pkg,) = [p for p in (d / "src").iterdir() if (p / "__init__.py").exists()]
    return pkg.name


def sibling_requirements(d: Path) -> list[Requirement]:
    return [
        r
        for r in map(Requirement, PROJECTS[d.name].get("dependencies", []))
        if canonicalize_name(r.name) in SIBLINGS
    ]


@pytest.mark.parametrize("d", ALL_DIRS, ids=lambda d: d.name)
def test_sibling_ranges_are_the_tested_series(d: Path) -> None:
    for req in sibling_requirements(d):
        current = SIBLINGS[canonicalize_name(req.name)]
        clauses = {s.operator: Version(s.version) for s in req.specifier}
        assert set(clauses) == {">=", "<"} and len(req.specifier) == 2, (
            f"{d.name}: declare {req.name} as '>=LOW,<NEXT' (the series tested with), got "
            f"{str(req.specifier)!r}"
        )
        expected_upper = next_series(current)
        assert clauses["<"] == expected_upper, (
            f"{d.name}: {req.name} is {current}, so its range must end at <{expected_upper} "
            f"(got <{clauses['<']}): test with the new series, then move the range"
        )
        low = clauses[">="]
        assert low <= current and series(low) == series(current), (
            f"{d.name}: the lower bound {low} of {req.name} must lie in the series of "
            f"{current} and not above it"
        )
        assert current in req.specifier


@pytest.mark.parametrize("d", ALL_DIRS, ids=lambda d: d.name)
def test_version_is_declared_once_and_has_a_changelog_entry(d: Path) -> None:
    version = PROJECTS[d.name]["version"]
    init = (d / "src" / import_name(d) / "__init__.py").read_text(encoding="utf-8")
    declared = re.search(r'^__version__ = "([^"]+)"', init, flags=re.M)
    if declared is not None:
        assert declared.group(1) == version, f"{d.name}: __version__ differs from pyproject"
    if d == EXAMPLE_DIR:
        return
    changelog = d / "CHANGELOG.md"
    assert changelog.exists(), f"{d.name} has no CHANGELOG.md"
    headings = re.findall(r"^## (\S+)", changelog.read_text(encoding="utf-8"), flags=re.M)
    assert headings and headings[0] == version, (
        f"{d.name}/CHANGELOG.md must start with a section '## {version}' (newest first), "
        f"got {headings[:2]}"
    )


# ----------------------------------------------------------------------------------
# Dependencies: declared ones are used, imported ones are declared
# ----------------------------------------------------------------------------------
def _scan(d: Path) -> tuple[set[str], set[str]]:
    """Top-level modules imported by the package's source, and its string constants."""
    modules: set[str] = set()
    strings: set[str] = set()
    for f in (d / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules.update(a.name.partition(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.partition(".")[0])
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
    return modules, strings


def _dists_of(module: str) -> set[str]:
    found = metadata.packages_distributions().get(module)
    if found:
        return {canonicalize_name(x) for x in found}
    return {canonicalize_name(module)}  # not installed here: the usual spelling


def _plugin_names(sibling: str) -> set[str]:
    eps = next(
        p.get("entry-points", {})
        for p in PROJECTS.values()
        if canonicalize_name(p["name"]) == sibling
    )
    return {name for group in eps.values() for name in group}


@pytest.mark.parametrize("d", ALL_DIRS, ids=lambda d: d.name)
def test_declared_dependencies_are_used(d: Path) -> None:
    project = PROJECTS[d.name]
    modules, strings = _scan(d)
    modules.discard(import_name(d))
    used_dists = set().union(*(_dists_of(m) for m in modules if m not in sys.stdlib_module_names))
    provides_subcommands = bool(project.get("entry-points", {}).get(cli.CLI_ENTRY_POINT_GROUP))
    for req in map(Requirement, project.get("dependencies", [])):
        name = canonicalize_name(req.name)
        if name in used_dists:
            continue
        if name == "dynsched-core" and provides_subcommands:
            continue  # the `dynsched` command that runs this package's sub-commands
        if name in SIBLINGS and _plugin_names(name) & strings:
            continue  # uses a plug-in of the sibling by name (e.g. the policy "default")
        pytest.fail(
            f"{d.name} declares {req} but neither imports it nor uses its plug-ins: "
            "remove it (or use it)"
        )


@pytest.mark.parametrize("d", ALL_DIRS, ids=lambda d: d.name)
def test_imported_modules_are_declared(d: Path) -> None:
    project = PROJECTS[d.name]
    declared = {
        canonicalize_name(Requirement(r).name)
        for r in [
            *project.get("dependencies", []),
            *(r for extra in project.get("optional-dependencies", {}).values() for r in extra),
        ]
    }
    modules, _ = _scan(d)
    modules.discard(import_name(d))
    for module in sorted(m for m in modules if m not in sys.stdlib_module_names):
        dists = _dists_of(module)
        assert dists & declared, (
            f"{d.name} imports {module!r} (from {sorted(dists)}) but declares none of them in "
            "its dependencies or extras"
        )


def test_known_subcommands_are_those_of_the_packages() -> None:
    provided = {
        name: project["name"]
        for project in PROJECTS.values()
        for name in project.get("entry-points", {}).get(cli.CLI_ENTRY_POINT_GROUP, {})
    }
    assert dict(cli.KNOWN_SUBCOMMANDS) == provided


def test_example_policy_declares_the_core_series_and_the_policy_api() -> None:
    import dynsched_core
    import dynsched_example_policy

    (core,) = [r for r in sibling_requirements(EXAMPLE_DIR) if r.name == "dynsched-core"]
    assert Version(dynsched_core.__version__) in core.specifier
    # the policy API it is written against is served by every core of that range
    # (checked against the record of which core release introduced which API version)
    record = dynsched_core._contract.load_recorded_contract()
    want = dynsched_core._contract._parse(dynsched_example_policy.POLICY_API)
    serving = [
        Version(h["core"])
        for h in record["history"]
        if (v := dynsched_core._contract._parse(h["version"]))[0] == want[0] and v[1] >= want[1]
    ]
    low = next(Version(s.version) for s in core.specifier if s.operator == ">=")
    assert serving and min(serving) <= low, (
        f"dynsched-example-policy needs policy API {dynsched_example_policy.POLICY_API}, "
        f"first shipped by dynsched-core {min(serving, default='(none)')}; its range starts at {low}"
    )
