"""The first example of docs/cluster.md runs."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"


def test_cluster_doc_example_runs(capsys) -> None:  # type: ignore[no-untyped-def]
    text = DOC.read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block is not None
    exec(compile(block.group(1), str(DOC), "exec"), {})
    out = capsys.readouterr().out
    assert "drf" in out and "optimus" in out
