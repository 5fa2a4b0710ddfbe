"""The README's first example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs() -> None:
    block = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)[0]
    out = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    steps, consumed, activations, deactivations = map(int, out.stdout.split())
    assert (steps, consumed) == (8, 32)
    assert activations >= 1 and deactivations >= 1
