"""The ``dynsched`` console script: Ctrl-C at any moment ends in one line and exit 130.

Each case sends the interrupt at a precise point from inside the process (no timing):
while the dispatcher is imported, inside a finaliser (where Python ignores exceptions),
and after the command returned, while the interpreter shuts down.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DYNSCHED = shutil.which("dynsched", path=str(Path(sys.executable).parent)) or shutil.which(
    "dynsched"
)

#: Bound on each subprocess: far above the second it takes, on a loaded machine too.
WAIT_S = 300

#: Raises SIGINT the moment ``dynsched_core.cli`` is imported (in ``sitecustomize``).
INTERRUPT_ON_IMPORT = """
import importlib.abc, signal, sys

class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "dynsched_core.cli":
            signal.raise_signal(signal.SIGINT)
        return None

sys.meta_path.insert(0, _Finder())
"""


@pytest.mark.skipif(DYNSCHED is None, reason="the dynsched console script is not installed")
def test_ctrl_c_while_the_console_script_imports_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(INTERRUPT_ON_IMPORT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    assert DYNSCHED is not None
    out = subprocess.run(
        [DYNSCHED, "simulate", "--list"], capture_output=True, text=True, env=env, timeout=WAIT_S
    )
    assert out.returncode == 130, out.stderr  # before: a traceback and death by SIGINT
    assert out.stderr.strip().splitlines() == ["dynsched: interrupted"]
    assert out.stdout == ""


AFTER_THE_COMMAND = r"""
import atexit, signal, sys, time
import dynsched_core.cli
dynsched_core.cli.main = lambda: 0  # the command ran and returned

def slow_cleanup():  # e.g. a library's atexit handler that takes its time
    signal.raise_signal(signal.SIGINT)
    time.sleep(600)

atexit.register(slow_cleanup)
import _dynsched_entry
sys.exit(_dynsched_entry.main())
"""


def test_ctrl_c_during_the_interpreter_shutdown_exits_at_once() -> None:
    out = subprocess.run(
        [sys.executable, "-c", AFTER_THE_COMMAND], capture_output=True, text=True, timeout=WAIT_S
    )
    # before: "Exception ignored in atexit callback" and a traceback
    assert out.returncode == 130, out.stderr
    assert out.stderr.strip().splitlines() == ["dynsched: interrupted"]


IN_A_FINALISER = r"""
import signal, sys
import dynsched_core.cli

class Resource:
    def __del__(self):  # Python prints an exception raised here, and carries on
        signal.raise_signal(signal.SIGINT)
        sum(range(1000))

def command():
    Resource()
    for _ in range(10**9):  # the command runs on unless interrupted
        pass
    print("the interrupt was swallowed")
    return 0

def dispatch():
    try:
        return command()
    except KeyboardInterrupt:
        print("dynsched x: interrupted", file=sys.stderr)
        return 130

dynsched_core.cli.main = dispatch
import _dynsched_entry
sys.exit(_dynsched_entry.main())
"""


def test_ctrl_c_inside_a_finaliser_is_delivered_again() -> None:
    out = subprocess.run(
        [sys.executable, "-c", IN_A_FINALISER], capture_output=True, text=True, timeout=WAIT_S
    )
    assert out.returncode == 130, out.stdout + out.stderr
    assert out.stderr.strip().splitlines() == ["dynsched x: interrupted"]
    assert "swallowed" not in out.stdout


SWALLOWED_DURING_PLUGIN_IMPORT = r"""
import importlib.abc, signal, sys

class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "dynsched_sim.cli":
            try:  # import code of a library that catches everything (a bare except)
                signal.raise_signal(signal.SIGINT)
                sum(range(1000))
            except BaseException:
                pass
        return None

sys.meta_path.insert(0, _Finder())
from dynsched_core.cli import main
sys.exit(main(["simulate", "--list"]))
"""


def test_ctrl_c_while_the_plugins_are_imported_is_not_swallowed() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SWALLOWED_DURING_PLUGIN_IMPORT],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    # before: the interrupt was swallowed and the command ran (or half-registered
    # sub-commands answered "unrecognized arguments", exit status 2)
    assert out.returncode == 130, out.stdout + out.stderr
    assert out.stderr.strip().splitlines() == ["dynsched: interrupted"]
    assert out.stdout == ""
