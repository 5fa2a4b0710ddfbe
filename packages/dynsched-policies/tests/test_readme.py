"""The README's first example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_first_python_block_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "README.md has no python example"
    exec(compile(blocks[0], str(README), "exec"), {"__name__": "readme_example"})


def test_readme_documents_every_fix() -> None:
    text = README.read_text(encoding="utf-8")
    assert "## Differences from the published implementation" in text
    assert "## Write and property-test your own policy" in text
    assert "check_policy" in text
