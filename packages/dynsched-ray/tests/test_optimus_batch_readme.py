"""The README's "Goodput batches" example runs as written (from a checkout's root)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_goodput_batches_example_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch  # noqa: F401  (the test environment installs it: never skip)

    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Goodput batches") :]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "the section has no python example"
    monkeypatch.chdir(ROOT)
    exec(compile(block.group(1), str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    found = re.search(r"noise scale (\d+) examples after (\d+) steps; optimus\+ batch (\d+)", out)
    assert found, out
    assert 32 <= int(found.group(3)) <= 256  # within the job's adaptive_batch range
