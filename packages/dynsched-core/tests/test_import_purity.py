"""`import dynsched_core` must load nothing third-party except attrs."""

from __future__ import annotations

import json
import subprocess
import sys

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
