"""`import dynsched_core` must load nothing third-party except attrs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import dynsched_core

_PROBE = r"""
import json, sys
before = set(sys.modules)
import dynsched_core, dynsched_core.cli  # noqa: F401
after = set(sys.modules) - before
tops = sorted({m.split('.')[0] for m in after})
print(json.dumps(tops))
"""


def test_core_imports_only_stdlib_and_attrs() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True)
    tops = json.loads(out.stdout.strip().splitlines()[-1])
    third_party = [
        m
        for m in tops
        if m not in sys.stdlib_module_names
        and m not in {"dynsched_core", "attr", "attrs"}
        and not m.startswith("_")
    ]
    assert third_party == [], f"dynsched_core imported third-party modules: {third_party}"
    assert "dynsched_core" in tops


_NO_HYPOTHESIS = r"""
import sys
sys.modules["hypothesis"] = None  # as if it were not installed
import dynsched_core.testing as t
from dynsched_core import InMemoryReplica
from dynsched_core.testing import CallRecorder, RecordingRouter
assert t.InMemoryReplica is InMemoryReplica
try:
    t.check_policy
except ModuleNotFoundError as exc:
    print(exc)
"""


def test_testing_fakes_import_without_hypothesis() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _NO_HYPOTHESIS], check=True, capture_output=True, text=True
    )
    assert "check_policy needs hypothesis" in out.stdout
    assert "pip install 'dynsched-core[testing]'" in out.stdout


def test_public_api_is_curated_and_documented() -> None:
    names = dynsched_core.__all__
    assert len(names) <= 40 and len(set(names)) == len(names)
    for name in names:
        assert getattr(dynsched_core, name).__doc__, name
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## The public API", 1)[1].split("Public submodules", 1)[0]
    assert sorted(names) == sorted(set(re.findall(r"`(\w+)`", section)))
