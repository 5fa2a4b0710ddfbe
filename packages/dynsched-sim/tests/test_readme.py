"""The README's first example runs as written."""

from __future__ import annotations

import re
from pathlib import Path


def test_readme_example_runs(capsys) -> None:  # type: ignore[no-untyped-def]
    text = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    exec(compile(code.group(1), "README.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "static 16+16" in out and "efficiency" in out
