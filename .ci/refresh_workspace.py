"""Bring an existing hatch workspace environment up to date with the checkout.

Run inside the environment (``hatch run test:python .ci/refresh_workspace.py``). hatch
creates an environment once and then only checks its declared dependencies; an editable
workspace member installed from an older checkout keeps that checkout's metadata: its entry
points (a sub-command or plug-in added since is "not installed") and its own requirements
(a dependency added since is missing). This script reinstalls every member of the
environment's ``workspace.members`` in editable mode, metadata rebuilt, with its features
and dependencies, in one uv call. On a fresh environment it is a quick no-op reinstall.

The environment's own variables (``UV_OVERRIDE``, ``UV_FIND_LINKS``) apply, because it runs
under ``hatch run``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def member_specs(env: str) -> list[tuple[str, str]]:
    """``(distribution name, uv requirement)`` for each member of hatch environment ``env``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    envs = config["tool"]["hatch"]["envs"]
    if env not in envs:
        raise SystemExit(f"refresh_workspace: no hatch environment {env!r} in pyproject.toml")
    members = envs[env].get("workspace", {}).get("members")
    if members is None:
        members = envs[env].get("workspace.members", [])
    specs = []
    for member in members:
        path = member if isinstance(member, str) else member["path"]
        features = [] if isinstance(member, str) else member.get("features", [])
        project = tomllib.loads((ROOT / path / "pyproject.toml").read_text(encoding="utf-8"))
        name = project["project"]["name"]
        extras = f"[{','.join(features)}]" if features else ""
        specs.append((name, f"{ROOT / path}{extras}"))
    return specs


def uv_command() -> list[str]:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is not None:
        return [uv]
    return [sys.executable, "-m", "uv"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="test", help="hatch environment name (default: test)")
    args = parser.parse_args(argv)
    specs = member_specs(args.env)
    if not specs:
        return 0
    command = [*uv_command(), "pip", "install", "--quiet", "--python", sys.executable]
    for name, _ in specs:
        command += ["--reinstall-package", name]
    for _, requirement in specs:
        command += ["-e", requirement]
    print(f"refresh_workspace: reinstalling {len(specs)} workspace members of {args.env!r}")
    return subprocess.run(command, check=False, env=os.environ.copy()).returncode


if __name__ == "__main__":
    sys.exit(main())
