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


def test_readme_incremental_example_runs(capsys) -> None:
    """The incremental-allocation example: every job gets tasks within the capacity, and
    the next round keeps the running jobs' tasks (a change would cost a restart)."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    blocks = [
        b for b in re.findall(r"```python\n(.*?)```", text, re.S) if 'method="incremental"' in b
    ]
    assert blocks, "README has no incremental-allocation example"
    scope: dict[str, object] = {"__name__": "readme"}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    first, nxt = scope["first"], scope["nxt"]
    assert all(w >= 1 and p >= 1 for p, w in first.tasks.values())  # type: ignore[attr-defined]
    assert all(u <= c for u, c in zip(first.used, first.capacity, strict=True))  # type: ignore[attr-defined]
    for k in ("job0", "job1"):
        assert nxt.tasks[k] == first.tasks[k]  # type: ignore[attr-defined]
    # with per-job penalties too: the often-restarted job0 keeps its tasks
    priced = scope["priced"]
    assert priced.tasks["job0"] == first.tasks["job0"]  # type: ignore[attr-defined]
    assert priced.tasks["job2"] != (0, 0)  # type: ignore[attr-defined]
    assert capsys.readouterr().out.strip()
