"""The root README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


def test_root_readme_policy_example_runs() -> None:
    blocks = python_blocks(ROOT / "README.md")
    assert blocks, "README.md has no python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme_example"})


def test_readme_states_the_two_commands_and_ci_runs_the_test_one() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "hatch run dynsched simulate" in text
    assert "hatch run test" in text
    assert "hatch run test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
