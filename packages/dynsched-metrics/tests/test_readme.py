"""The README's first example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_first_python_block_runs(capsys):
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python block"
    exec(compile(blocks[0], str(README), "exec"), {"__name__": "__readme__"})
    assert "dynamic_resource/train_resource_utilization" in capsys.readouterr().out
