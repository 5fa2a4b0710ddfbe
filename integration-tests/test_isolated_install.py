"""Each package installs alone from its wheel and its README example runs, without test tools.

The wheels of every package (and of the example third-party policy) are built once per
run. Then, per package, a fresh virtual environment gets exactly what the install line
above the package README's first example says (``pip install dynsched-sim``, ...), with
the dynsched distributions taken from those wheels and the third-party ones at the
versions of the test environment (so ``uv`` serves them from its cache). In it:

- the dynsched distributions installed are the documented subset (the root README's
  "Install only what you need"): core; core + policies; core + metrics; core + policies +
  metrics + ray; core + optimus; core + policies + metrics + sim; core + the example policy;
- neither pytest nor hypothesis is there, and ``uv pip check`` finds every declared range
  satisfied;
- the README's first example runs, ``dynsched --help`` lists the installed sub-commands and
  names the package of each missing one, and the package's own sub-command answers
  ``--help``.

From a checkout (dynsched is on no index), each package README's ``pip install ./packages/...``
line names the folder of exactly the dynsched packages of its subset, and both ways the root
README gives to install a subset (every folder in one ``pip install``; the wheels built once,
then ``pip install --find-links dist dynsched-sim``) run as written with pip in a fresh venv,
after which a short ``dynsched simulate`` runs.

A core of the next series (with a hook removed: the next major policy API) is refused by
the example policy's declared range, and forced in anyway it is refused by the policy's
``require_policy_api`` check at import.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from dynsched_core import POLICY_API_VERSION
from dynsched_core.cli import KNOWN_SUBCOMMANDS
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {
    **{p.name: p for p in sorted((ROOT / "packages").glob("dynsched-*"))},
    "dynsched-example-policy": ROOT / "integration-tests" / "example-policy",
}
CORE, POLICIES, METRICS = "dynsched-core", "dynsched-policies", "dynsched-metrics"

#: The dynsched distributions each package's install line brings, as documented.
SUBSETS = {
    "dynsched-core": {CORE},
    "dynsched-policies": {CORE, POLICIES},
    "dynsched-metrics": {CORE, METRICS},
    "dynsched-ray": {CORE, POLICIES, METRICS, "dynsched-ray"},
    "dynsched-optimus": {CORE, "dynsched-optimus"},
    "dynsched-sim": {CORE, POLICIES, METRICS, "dynsched-sim"},
    "dynsched-example-policy": {CORE, "dynsched-example-policy"},
}
SUBCOMMAND_OF = {dist: name for name, dist in KNOWN_SUBCOMMANDS.items()}
TEST_TOOLS = ("pytest", "hypothesis")

pytestmark = pytest.mark.slow


def _uv() -> str:
    found = shutil.which("uv")
    assert found, "uv is a dependency of the test environment (pyproject.toml)"
    return found


def _run(
    cmd: list[str],
    *,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False
    )


def _build_wheels(sources: list[Path], out: Path) -> dict[str, Path]:
    """Build wheels through the PEP 517 hook of the packages' build backend (hatchling)."""
    code = (
        "import os, sys\n"
        "from hatchling.build import build_wheel\n"
        "for src in sys.argv[2:]:\n"
        "    os.chdir(src)\n"
        "    print(build_wheel(sys.argv[1]))\n"
    )
    done = _run([sys.executable, "-c", code, str(out), *map(str, sources)], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    wheels = {}
    for line in done.stdout.split():
        name = line.split("-")[0].replace("_", "-")
        wheels[name] = out / line
    return wheels


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    wheels = _build_wheels(list(SOURCES.values()), out)
    assert set(wheels) == set(SOURCES)
    return wheels


@pytest.fixture(scope="module")
def constraints(wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dynsched distributions from the wheels; third-party ones at the tested versions."""
    lines = [f"{name} @ {path.as_uri()}" for name, path in sorted(wheels.items())]
    seen = {canonicalize_name(n) for n in wheels}
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name not in seen:
            seen.add(name)
            lines.append(f"{name}=={dist.version}")
    path = tmp_path_factory.mktemp("constraints") / "constraints.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def install_line(source: Path) -> list[str]:
    """The requirements of the ``pip install`` line(s) above the README's first example."""
    text = (source / "README.md").read_text(encoding="utf-8")
    head = text.split("```python", 1)[0]
    reqs: list[str] = []
    for block in re.findall(r"```(?:bash|console|sh)\n(.*?)```", head, flags=re.S):
        for line in block.splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("pip install "):
                words = shlex.split(line.split("#", 1)[0])[2:]
                reqs += [w for w in words if not w.startswith("-")]
    assert reqs, f"{source.name}/README.md has no 'pip install' line above its first example"
    return reqs


def _as_requirement(word: str) -> str:
    """A README requirement; a path to one of our sources becomes its distribution's name."""
    if word.startswith((".", "/")):
        path = (ROOT / word).resolve()
        (name,) = [n for n, src in SOURCES.items() if src.resolve() == path]
        return name
    return str(Requirement(word))


def first_example(source: Path) -> str:
    text = (source / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]


class Venv:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.bin = path / ("Scripts" if os.name == "nt" else "bin")
        self.python = self.bin / "python"
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "VIRTUAL_ENV", "RAY_ADDRESS", "HYPOTHESIS"))
        }
        self.env["PATH"] = f"{self.bin}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["MPLBACKEND"] = "Agg"

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return _run(list(args), env=self.env, cwd=self.path.parent, timeout=timeout)

    def dynsched(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.bin / "dynsched"), *args, timeout=timeout)

    def dists(self) -> dict[str, str]:
        out = self.run(
            str(self.python),
            "-c",
            "import json\nfrom importlib import metadata as m\n"
            "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))",
        )
        assert out.returncode == 0, out.stderr
        return {canonicalize_name(k): v for k, v in json.loads(out.stdout).items()}


def make_venv(path: Path, requirements: list[str], constraints: Path) -> Venv:
    uv = _uv()
    venv = Venv(path)
    made = _run([uv, "venv", "-q", "--python", sys.executable, str(path)], timeout=120)
    assert made.returncode == 0, made.stderr
    done = _run(
        [
            uv,
            "pip",
            "install",
            "-q",
            "--python",
            str(venv.python),
            "-c",
            str(constraints),
            *requirements,
        ],
        timeout=600,
    )
    assert done.returncode == 0, f"uv pip install {' '.join(requirements)}:\n{done.stderr[-3000:]}"
    return venv


class Venvs:
    """One environment per package, made on first use from the README's install line."""

    def __init__(self, root: Path, constraints: Path) -> None:
        self.root = root
        self.constraints = constraints
        self.made: dict[str, tuple[Venv, list[str]]] = {}

    def requirements(self, package: str) -> list[str]:
        reqs = [_as_requirement(w) for w in install_line(SOURCES[package])]
        return list(dict.fromkeys(reqs))  # the checkout line names the package again

    def get(self, package: str) -> Venv:
        if package not in self.made:
            reqs = self.requirements(package)
            venv = make_venv(self.root / package / "venv", reqs, self.constraints)
            self.made[package] = (venv, reqs)
        return self.made[package][0]


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory, constraints: Path) -> Iterator[Venvs]:
    made = Venvs(tmp_path_factory.mktemp("venvs"), constraints)
    yield made
    shutil.rmtree(made.root, ignore_errors=True)


@pytest.mark.parametrize("package", sorted(SUBSETS))
def test_package_installs_alone_and_its_readme_example_runs(package: str, venvs: Venvs) -> None:
    source = SOURCES[package]
    requirements = venvs.requirements(package)
    assert canonicalize_name(Requirement(requirements[0]).name) == package, (
        f"{package}/README.md: the install line must install {package}, got {requirements}"
    )
    venv = venvs.get(package)
    dists = venv.dists()

    # exactly the documented subset of dynsched, and no test tools
    ours = {name for name in dists if name.startswith("dynsched-")}
    assert ours == SUBSETS[package], f"pip install {' '.join(requirements)} brought {sorted(ours)}"
    wants_testing = any("testing" in Requirement(r).extras for r in requirements)
    for tool in TEST_TOOLS:
        if not (tool == "hypothesis" and wants_testing):
            assert tool not in dists, f"{tool} was installed by {requirements}"
    checked = venv.run(_uv(), "pip", "check", "--python", str(venv.python))
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # the README's first example, as written
    example = venv.run(str(venv.python), "-c", first_example(source), timeout=600)
    assert example.returncode == 0, f"{package} README example:\n{example.stderr[-4000:]}"

    # the command: installed sub-commands listed, the others name their package
    top = venv.dynsched("--help")
    assert top.returncode == 0, top.stderr
    assert "usage: dynsched" in top.stdout
    for name, dist in KNOWN_SUBCOMMANDS.items():
        line = next(x for x in top.stdout.splitlines() if x.strip().startswith(name + " "))
        if dist in dists:
            assert "not installed" not in line, line
        else:
            assert f"(not installed: pip install {dist})" in line, line
    own = SUBCOMMAND_OF.get(package)
    if own is not None:
        helped = venv.dynsched(own, "--help")
        assert helped.returncode == 0, helped.stderr[-3000:]
        assert f"usage: dynsched {own}" in helped.stdout
    assert not top.stderr.strip(), top.stderr  # no broken plug-in warnings


def test_root_readme_documents_the_subsets() -> None:
    """The root README's "Install only what you need" table lists the subsets tested here."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = re.findall(
        r"\| `pip install --find-links dist (dynsched-[a-z]+)` \| ([a-z +()]+) \|", text
    )
    documented = {
        pkg: {f"dynsched-{part.strip()}" for part in parts.replace("(attrs only)", "").split("+")}
        for pkg, parts in rows
    }
    assert documented == {k: v for k, v in SUBSETS.items() if k != "dynsched-example-policy"}


@pytest.mark.parametrize("package", sorted(p.name for p in (ROOT / "packages").glob("dynsched-*")))
def test_package_readme_checkout_line_names_every_dynsched_package_it_needs(
    package: str,
) -> None:
    """From a checkout, one ``pip install`` must name the folder of every sibling.

    The siblings are on no index, so a folder left out of the line is looked up on the
    index and the install fails; the folders named are exactly the documented subset.
    """
    paths = [w for w in install_line(SOURCES[package]) if w.startswith("./")]
    assert paths, f"{package}/README.md has no 'pip install ./packages/...' line (from a checkout)"
    assert paths[0] == f"./packages/{package}", paths
    named = [_as_requirement(w) for w in paths]
    assert len(named) == len(set(named)), paths
    assert set(named) == SUBSETS[package], f"{package}/README.md: pip install {' '.join(paths)}"


def root_readme_subset_blocks() -> list[str]:
    """The shell blocks of the root README's "Install only what you need" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### Install only what you need", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.S)


def _checkout_copy(dest: Path) -> Path:
    """The packages of this checkout, copied (builds never write into the repository)."""
    ignore = shutil.ignore_patterns("__pycache__", "build", "dist", "*.egg-info", ".hatch")
    shutil.copytree(ROOT / "packages", dest / "packages", ignore=ignore)
    return dest


@pytest.mark.parametrize("block", [0, 1], ids=["folders", "wheels"])
def test_root_readme_subset_install_runs_as_written_with_pip(block: int, tmp_path: Path) -> None:
    """Each block of the root README's subset install, run by bash in a fresh venv with pip.

    Nothing is taken from the test environment: pip builds the packages and fetches their
    third-party dependencies itself. The block installs the simulate subset, and a short
    `dynsched simulate` runs in it.
    """
    blocks = root_readme_subset_blocks()
    assert len(blocks) == 2, blocks
    script = blocks[block]
    assert "pip install" in script, script
    work = _checkout_copy(tmp_path / "checkout")
    made = _run([sys.executable, "-m", "venv", str(work / "venv")], timeout=300)
    assert made.returncode == 0, made.stderr
    venv = Venv(work / "venv")
    done = _run(["bash", "-e", "-o", "pipefail", "-c", script], env=venv.env, cwd=work, timeout=900)
    assert done.returncode == 0, (
        f"README block:\n{script}\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
    )

    dists = venv.dists()
    ours = {name for name in dists if name.startswith("dynsched-")}
    assert ours == SUBSETS["dynsched-sim"], f"the README block brought {sorted(ours)}"
    assert "pytest" not in dists
    out = venv.dynsched(
        "simulate", "--steps", "4", "--seeds", "1", "--no-plots", "--quiet",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "static-16-16" in out.stdout, out.stdout
    assert json.loads((tmp_path / "out" / "result.json").read_text(encoding="utf-8"))


def test_core_alone_says_which_package_provides_each_subcommand(venvs: Venvs) -> None:
    venv = venvs.get(CORE)
    for name, dist in sorted(KNOWN_SUBCOMMANDS.items()):
        out = venv.dynsched(name, "--some-flag", "x")
        assert out.returncode == 2, (name, out.stdout, out.stderr)
        assert f"'{name}' is provided by {dist}, which is not installed: pip install {dist}" in (
            out.stderr
        )
        assert "invalid choice" not in out.stderr


def test_root_readme_policy_example_runs_with_core_alone(venvs: Venvs) -> None:
    """'embed the scheduler, write a policy: dynsched-core' (root README)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert (
        "| embed the scheduler, write a policy | `pip install --find-links dist dynsched-core` |"
        in text
    )
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    venv = venvs.get(CORE)
    for block in blocks:
        out = venv.run(str(venv.python), "-c", block)
        assert out.returncode == 0, out.stderr[-3000:]


def test_dynsched_run_in_the_ray_subset_without_test_tools(venvs: Venvs) -> None:
    """`dynsched run --backend ray` needs nothing beyond core, policies, metrics and ray."""
    venv = venvs.get("dynsched-ray")
    out = venv.dynsched(
        "run",
        "--backend",
        "ray",
        "--steps",
        "2",
        "--name",
        "fresh-venv",
        "--num-cpus",
        "2",
        "--trainer-step-time",
        "0.01",
        "--metrics",
        "",
        "--quiet",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "finished: 2 step(s)" in out.stdout
    assert "hypothesis" not in out.stderr


def _project(source: Path) -> dict[str, Any]:
    with (source / "pyproject.toml").open("rb") as fh:
        project: dict[str, Any] = tomllib.load(fh)["project"]
    return project


def _next_series_core(tmp: Path) -> tuple[Path, str, str]:
    """A dynsched-core wheel of the next series whose policy contract lost a hook.

    Returns:
        The wheel, its version and its policy API version (the next major).
    """
    current = str(_project(SOURCES[CORE])["version"])
    v = Version(current)
    nxt = f"0.{v.minor + 1}.0" if v.major == 0 else f"{v.major + 1}.0.0"
    src = tmp / "dynsched-core"
    shutil.copytree(SOURCES[CORE], src, ignore=shutil.ignore_patterns("__pycache__", "tests"))
    for path, old, new in [
        (src / "pyproject.toml", f'version = "{current}"', f'version = "{nxt}"'),
        (
            src / "src" / "dynsched_core" / "__init__.py",
            f'__version__ = "{current}"',
            f'__version__ = "{nxt}"',
        ),
    ]:
        text = path.read_text(encoding="utf-8")
        assert old in text, (path, old)
        path.write_text(text.replace(old, new), encoding="utf-8")
    policy = src / "src" / "dynsched_core" / "_policy.py"
    text = policy.read_text(encoding="utf-8")
    edited = re.sub(
        r"\n    def request_rebalance\(.*?(?=\n    def )", "\n", text, count=1, flags=re.S
    )
    assert edited != text
    policy.write_text(edited, encoding="utf-8")
    out = tmp / "wheels"
    out.mkdir()
    api = f"{int(POLICY_API_VERSION.split('.')[0]) + 1}.0"
    return _build_wheels([src], out)[CORE], nxt, api


def test_example_policy_refuses_a_core_outside_its_range(
    venvs: Venvs, wheels: dict[str, Path], tmp_path: Path
) -> None:
    import dynsched_example_policy

    # a venv of its own: this test installs a core the others must not see
    venv = make_venv(
        tmp_path / "venv", venvs.requirements("dynsched-example-policy"), venvs.constraints
    )
    core2, core2_version, core2_api = _next_series_core(tmp_path)
    pins = tmp_path / "pins.txt"
    pins.write_text(
        f"{CORE} @ {core2.as_uri()}\n"
        f"dynsched-example-policy @ {wheels['dynsched-example-policy'].as_uri()}\n",
        encoding="utf-8",
    )
    uv = _uv()
    # the resolver refuses: the declared range ends before the next series
    (raw,) = [
        d
        for d in _project(SOURCES["dynsched-example-policy"])["dependencies"]
        if Requirement(d).name == CORE
    ]
    declared = Requirement(raw)
    assert Version(core2_version) not in declared.specifier
    refused = venv.run(
        uv,
        "pip",
        "install",
        "--dry-run",
        "--python",
        str(venv.python),
        "-c",
        str(pins),
        "dynsched-example-policy",
    )
    assert refused.returncode != 0
    assert raw in refused.stderr, refused.stderr  # the range as declared
    # forced in anyway (no dependency check), the policy refuses at import, by name
    forced = venv.run(
        uv, "pip", "install", "-q", "--no-deps", "--python", str(venv.python), str(core2)
    )
    assert forced.returncode == 0, forced.stderr
    probe = venv.run(
        str(venv.python),
        "-c",
        "import dynsched_core as d\nprint(d.__version__, d.POLICY_API_VERSION)\n"
        "import dynsched_example_policy\n",
    )
    assert probe.stdout.split() == [core2_version, core2_api], probe.stdout + probe.stderr
    assert probe.returncode != 0
    assert "PolicyAPIError" in probe.stderr
    assert (
        "dynsched-example-policy needs dynsched policy API "
        f"{dynsched_example_policy.POLICY_API}" in probe.stderr
    )
