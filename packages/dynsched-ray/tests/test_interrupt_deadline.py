"""`dynsched run`'s interrupt deadline: a Ctrl-C'd run whose shutdown hangs still exits.

No assertion races the clock: the "hung shutdown" sleeps for an hour (only the deadline
can end it in time), the clean stop joins the cancelled timer instead of sleeping past
it, and every wait is bounded far above the work's own time (a loaded machine included).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HANGS = r"""
import sys, time
from dynsched_ray.cli.run import _InterruptDeadline
d = _InterruptDeadline("partial metrics in {m} (last line marked partial)", {m!r}, 0.3)
d.arm()
d.arm()  # idempotent
time.sleep(3600)  # a shutdown that never returns
"""

STOPS = r"""
from dynsched_ray.cli.run import _InterruptDeadline
d = _InterruptDeadline("nothing written", None, 60.0)
d.arm()
d.cancel()  # the clean stop came in time
d._timer.join(600)  # a cancelled timer ends at once; one still armed would exit at 60 s
print("clean")
"""

#: Bound on each subprocess: far above the second or so it takes (10x and more), so a
#: loaded machine does not fail the tests.
WAIT_S = 300


def test_a_hung_shutdown_exits_after_the_deadline(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1}) + "\n")
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", HANGS.format(m=str(metrics))],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    took = time.monotonic() - start
    assert out.returncode == 130
    assert took < WAIT_S  # the hour-long sleep was cut short
    assert out.stderr.strip().splitlines() == [
        f"dynsched run: interrupted: partial metrics in {metrics} (last line marked partial) "
        "(stopped after 0.3 s: Ray did not shut down cleanly in time)"
    ]
    lines = metrics.read_text().splitlines()
    assert json.loads(lines[-1]) == {"partial": True, "interrupted": True}
    assert len(lines) == 2


def test_a_clean_stop_disarms_the_deadline() -> None:
    out = subprocess.run(
        [sys.executable, "-c", STOPS], capture_output=True, text=True, timeout=WAIT_S
    )
    # a timer still armed would have ended the process with status 130 at 60 s
    assert out.returncode == 0 and out.stdout.strip() == "clean", out.stderr


HANGS_WITH_CHILD = r"""
import subprocess, sys, time
from dynsched_ray.cli.run import _InterruptDeadline
# a child that would outlive a bare os._exit (like a local Ray cluster's processes)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
d = _InterruptDeadline("nothing written", None, 0.3)
d.arm()
time.sleep(3600)
"""


def test_the_forced_exit_leaves_no_child_process_behind() -> None:
    import os

    out = subprocess.run(
        [sys.executable, "-c", HANGS_WITH_CHILD], capture_output=True, text=True, timeout=WAIT_S
    )
    assert out.returncode == 130, out.stderr
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except OSError:
            break  # gone
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        raise AssertionError(f"child {pid} still running after the forced exit")
