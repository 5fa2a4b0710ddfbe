"""The README's first example runs as written."""

from __future__ import annotations

import re
from pathlib import Path


def test_readme_example_runs(capsys) -> None:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match, "README has no python example"
    exec(compile(match.group(1), "README.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "PAA: 157 requests" in out
