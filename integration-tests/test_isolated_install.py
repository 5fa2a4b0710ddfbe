"""`dynsched run --backend ray` works after a plain install, without the test tools.

A fresh virtual environment gets only ``dynsched-core dynsched-policies dynsched-metrics
dynsched-ray`` (and what they declare: attrs, numpy, ray, ...); no hypothesis, no pytest.
The run must not need anything else (the default replica is the core's in-memory engine,
not a test fake). ``uv`` makes the environment in seconds from its cache; without it,
``venv`` + ``pip`` do the same, slower.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["dynsched-core", "dynsched-policies", "dynsched-metrics", "dynsched-ray"]

pytestmark = pytest.mark.slow


def _uv() -> str | None:
    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found]
    except ImportError:
        return None
    return str(find_uv_bin())


def _make_venv(path: Path) -> Path:
    """A virtual environment at ``path`` with only the four packages installed."""
    sources = [str(ROOT / "packages" / p) for p in PACKAGES]
    python = path / ("Scripts" if os.name == "nt" else "bin") / "python"
    uv = _uv()
    if uv is not None:
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(path)], check=True)
        subprocess.run(
            [uv, "pip", "install", "-q", "--python", str(python), *sources],
            check=True,
            timeout=600,
        )
    else:
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *sources],
            check=True,
            timeout=900,
        )
    return python


def test_dynsched_run_in_a_fresh_environment_without_test_tools(tmp_path: Path) -> None:
    python = _make_venv(tmp_path / "venv")
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('hypothesis'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "None", "the fresh environment must not have hypothesis"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "PYTHON"))}
    env["RAY_AUTH_MODE"] = "disabled"
    dynsched = python.parent / "dynsched"
    out = subprocess.run(
        [
            str(dynsched),
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
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "finished: 2 step(s)" in out.stdout
    assert "hypothesis" not in out.stderr
