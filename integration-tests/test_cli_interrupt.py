"""Ctrl-C in each long ``dynsched`` command: one line, exit 130, partial output marked.

Each test starts the installed command in a subprocess, waits until it is visibly
working (its first progress line), sends SIGINT as a terminal would, and checks: exit
status 130, no traceback and no pending-task/event-loop noise, the one ``interrupted``
line, what was finished written and marked as partial, and no process of the command left
behind. No wait races the clock: each waits for what it can see (a progress line, the
process's exit), bounded far above the work's own time (a clean stop takes under 1 s for
the simulators, about 2 s for ``dynsched run``; the bounds hold on a loaded machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

BIN = Path(sys.executable).parent
DYNSCHED = shutil.which("dynsched", path=str(BIN)) or shutil.which("dynsched")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

#: Text that must never appear after Ctrl-C.
NOISE = (
    "Traceback",
    "Task was destroyed",
    "Task exception was never retrieved",
    "no current event loop",
    "unhandled exception during asyncio.run() shutdown",
    "KeyboardInterrupt",
    "was never awaited",
    "Segmentation fault",
)

#: Bound on the time from SIGINT to the exit: far above a clean stop (see above), so a
#: loaded machine does not fail the test while an interrupt that is swallowed (the
#: command runs on: minutes for ``simulate --seeds 200``) still does.
STOP_WITHIN_S = 120.0


def _interrupt(args: list[str], marker: str, *, stream: str, start_timeout: float) -> dict:
    """Run ``dynsched ARGS``; SIGINT once ``marker`` is printed on ``stream``."""
    assert DYNSCHED is not None
    proc = subprocess.Popen(
        [DYNSCHED, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    seen: dict[str, list[str]] = {"stdout": [], "stderr": []}
    ready = threading.Event()

    def pump(name: str) -> None:
        pipe = getattr(proc, name)
        for line in pipe:
            seen[name].append(line)
            if name == stream and marker in line:
                ready.set()
        pipe.close()

    threads = [threading.Thread(target=pump, args=(n,), daemon=True) for n in seen]
    for t in threads:
        t.start()
    try:
        assert ready.wait(start_timeout), f"{marker!r} never printed:\n{''.join(seen[stream])}"
        children = psutil.Process(proc.pid).children(recursive=True)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=STOP_WITHIN_S + 180)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for t in threads:
        t.join(timeout=10)
    _gone, alive = psutil.wait_procs(children, timeout=120)
    return {
        "rc": rc,
        "took": took,
        "stdout": "".join(seen["stdout"]),
        "stderr": "".join(seen["stderr"]),
        "left": [p.pid for p in alive],
    }


def _check(res: dict, command: str, within_s: float = STOP_WITHIN_S) -> str:
    text = res["stdout"] + res["stderr"]
    assert res["rc"] == 130, f"exit {res['rc']}\n{text}"
    assert res["took"] <= within_s, f"stopped after {res['took']:.1f} s"
    for bad in NOISE:
        assert bad not in text, f"{bad!r} printed after Ctrl-C:\n{text}"
    mine = [x for x in res["stderr"].splitlines() if x.startswith(f"dynsched {command}: ")]
    assert len(mine) == 1, res["stderr"]
    last = mine[0]
    assert last.startswith(f"dynsched {command}: interrupted"), last
    assert res["left"] == [], f"processes left behind: {res['left']}"
    return last


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ctrl_c_in_simulate_writes_finished_runs_marked_partial(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    res = _interrupt(
        ["simulate", "--scenario", "balanced", "--seeds", "200", "--no-plots", "--out", str(out)],
        "/seed 1 ",  # the second run's bar: the first run is recorded by then
        stream="stderr",
        start_timeout=300,
    )
    last = _check(res, "simulate")
    assert "marked partial" in last
    data = json.loads((out / "result.json").read_text())
    assert data["partial"] is True and len(data["runs"]) >= 1
    assert (out / "table.txt").read_text().startswith("PARTIAL")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ctrl_c_in_optimus_compare_prints_and_writes_partial(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    res = _interrupt(
        [
            "optimus",
            "compare",
            "--schedulers",
            "fifo,optimus",
            "--interval",
            "600",
            "--out",
            str(out),
        ],
        "avg JCT",
        stream="stderr",
        start_timeout=400,
    )
    last = _check(res, "optimus compare")
    assert "partial" in last
    assert res["stdout"].startswith("PARTIAL: interrupted after")
    assert "| workload-1 | fifo |" in res["stdout"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is True and summary["rows"]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_ctrl_c_in_run_backend_ray_stops_ray_and_marks_metrics(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = _interrupt(
        [
            "run",
            "--backend",
            "ray",
            "--steps",
            "200",
            "--trainer-step-time",
            "0.05",
            "--out",
            str(out),
            "--checkpoint",
            str(out / "ckpt.json"),
        ],
        "[sync]",
        stream="stdout",
        start_timeout=600,
    )
    # A clean stop takes about 2 s; when Ray does not shut down in time the run exits
    # anyway after the interrupt deadline, saying so (rare: seen in 2 of ~10 CI runs)
    last = _check(res, "run")
    assert "partial metrics" in last
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1]) == {"partial": True, "interrupted": True}
    assert json.loads((out / "ckpt.json").read_text())["steps_done"] >= 2
