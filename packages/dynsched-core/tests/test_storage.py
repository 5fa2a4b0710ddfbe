"""Writes that cannot half-happen and the one-run-per-folder lock (`dynsched_core.storage`)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dynsched_core import storage
from dynsched_core.storage import (
    LOCK_NAME,
    RunLock,
    RunLockBusyError,
    append_line,
    atomic_write_text,
    atomic_writer,
    read_json_lines,
    trim_json_lines,
)


def test_atomic_write_replaces_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "ckpt.json"
    atomic_write_text(target, '{"step": 1}')
    atomic_write_text(target, '{"step": 2}')
    assert json.loads(target.read_text()) == {"step": 2}
    assert sorted(p.name for p in target.parent.iterdir()) == ["ckpt.json"]


def test_failed_atomic_write_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "ckpt.json"
    atomic_write_text(target, '{"step": 2}')

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(storage.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_text(target, '{"step": 4, "half": "' + "x" * 10000 + '"}')
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"step": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.json"]
    # an exception inside the block leaves the file as it was too
    with pytest.raises(RuntimeError), atomic_writer(target) as fh:
        fh.write(b"partial")
        raise RuntimeError("boom")
    assert json.loads(target.read_text()) == {"step": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.json"]


def test_truncated_last_line_is_dropped_and_trim_keeps_selected_rows(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    for step in (1, 2, 3):
        append_line(path, json.dumps({"step": step}))
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"step": 4, "reward"')  # a crash in the middle of a row
    assert read_json_lines(path) == [{"step": 1}, {"step": 2}, {"step": 3}]
    assert trim_json_lines(path, lambda r: r["step"] <= 2) == 2
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    assert trim_json_lines(path, lambda r: True) == 0
    assert trim_json_lines(tmp_path / "missing.jsonl", lambda r: True) == 0


def test_lock_refuses_a_second_holder_and_is_released(tmp_path: Path) -> None:
    first = RunLock(tmp_path, "dynsched train").acquire()
    holder = json.loads((tmp_path / LOCK_NAME).read_text())
    assert holder["pid"] == os.getpid() and holder["command"] == "dynsched train"
    with pytest.raises(RunLockBusyError) as err:
        RunLock(tmp_path, "dynsched train").acquire()
    assert str(err.value) == f"{tmp_path} is in use by a running dynsched train (pid {os.getpid()})"
    first.release()
    first.release()  # idempotent
    with RunLock(tmp_path) as again:
        assert again.held and again.stale is None


def test_lock_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    """The kernel frees a flock when its holder dies; the file still names it."""
    code = (
        "import sys; from dynsched_core.storage import RunLock; "
        f"lock = RunLock({str(tmp_path)!r}, 'dynsched run').acquire(); print('held', flush=True); "
        "sys.stdin.readline(); import os; os._exit(9)"  # dies without releasing
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(RunLockBusyError, match=f"dynsched run \\(pid {proc.pid}\\)"):
            RunLock(tmp_path).acquire()
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=120) == 9
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lock = RunLock(tmp_path).acquire()
    assert lock.stale is not None and lock.stale["pid"] == proc.pid
    lock.release()
