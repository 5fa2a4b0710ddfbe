"""Interrupt soak: Ctrl-C at random moments in each long ``dynsched`` command, many times.

Each trial starts the installed ``dynsched`` command in a subprocess, sends SIGINT after a
random delay (anywhere from the interpreter's start-up to the command's natural end) and
classifies what happened:

- ``clean``: exit status 130 (or 0 when the command had already finished), nothing of the
  noise below printed, the process gone within ``--stop-within`` seconds. Death by the
  SIGINT itself (-2 here, 130 in a shell) with nothing printed counts as clean too: it
  happens only where Python's default handler is in place, in the interpreter's first
  and last milliseconds;
- ``traceback``: a Python traceback or an un-retrieved task/event-loop error was printed;
- ``unawaited``: a "coroutine ... was never awaited" warning was printed;
- ``segfault``: the process died of SIGSEGV (or printed "Segmentation fault");
- ``python_startup``: the interrupt landed in the interpreter's own start-up, before the
  ``dynsched`` script ran (a traceback Python prints itself; counted, and allowed);
- ``hung``: the process did not stop within ``--stop-within`` seconds of the interrupt
  (the interrupt was swallowed); it is killed;
- ``swallowed``: exit status 0 more than ``swallow_s`` seconds after the interrupt (the
  command ran on to its end);
- ``bad_exit``: any other exit status.

Usage: ``hatch run test:python benchmarks/interrupt_soak.py [--trials 100] [--commands simulate
optimus optimus-compare run] [--seed N] [--json benchmarks/results/interrupt_soak.json]``
(``train`` can be named too: a minute or more per trial). Each command is first run once
to its end; the delays are drawn from that run's length. The counts per command are
printed; the exit status is 1 when any trial was not clean. The same trial
function drives the CI test (``integration-tests/test_cli_interrupt_random.py``) with
fewer trials.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Printed text that makes a trial not clean, by the class it puts the trial in.
NOISE: dict[str, tuple[str, ...]] = {
    "traceback": (
        "Traceback",
        "Task was destroyed",
        "Task exception was never retrieved",
        "no current event loop",
        "Exception ignored in",
        "unhandled exception during asyncio.run() shutdown",
    ),
    "unawaited": ("was never awaited",),
    "segfault": ("Segmentation fault", "Fatal Python error"),
}


def _redact(text: str) -> str:
    """The output with this machine's paths (environment, home) replaced by placeholders."""
    text = text.replace(sys.prefix, "<venv>")
    return text.replace(os.path.expanduser("~"), "~")


def command_args(name: str, out: Path) -> list[str]:
    """The ``dynsched`` arguments of soak command ``name`` writing under ``out``."""
    if name == "simulate":
        return [
            "simulate",
            "--scenario",
            "balanced",
            "--seeds",
            "3",
            "--no-plots",
            "--quiet",
            "--out",
            str(out),
        ]
    if name == "optimus":
        return [
            "optimus",
            "simulate",
            "--scheduler",
            "fifo",
            "--out",
            str(out),
        ]
    if name == "optimus-compare":
        return [
            "optimus",
            "compare",
            "--workloads",
            "workload-1",
            "--schedulers",
            "fifo,optimus",
            "--interval",
            "600",
            "--quiet",
            "--out",
            str(out),
        ]
    if name == "run":
        return [
            "run",
            "--steps",
            "6",
            "--num-cpus",
            "2",
            "--quiet",
            "--out",
            str(out),
            "--checkpoint",
            str(out / "ckpt.json"),
        ]
    if name == "train":  # not in the default list: a minute or more per trial
        return [
            "train",
            "--engine",
            "hf",
            "--steps",
            "4",
            "--num-cpus",
            "2",
            "--quiet",
            "--model-cache",
            str(out.parent / "model-cache"),
            "--out",
            str(out),
        ]
    raise ValueError(
        f"unknown soak command {name!r} (simulate, optimus, optimus-compare, run, train)"
    )


def dynsched_path() -> str:
    """The ``dynsched`` executable beside this interpreter (or on PATH)."""
    found = shutil.which("dynsched", path=str(Path(sys.executable).parent)) or shutil.which(
        "dynsched"
    )
    if found is None:
        raise SystemExit("the dynsched command is not installed in this environment")
    return found


def trial(
    args: Sequence[str],
    delay_s: float,
    *,
    stop_within_s: float = 120.0,
    swallow_s: float = 2.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``dynsched ARGS``, SIGINT it after ``delay_s`` seconds, classify the result.

    Returns:
        ``{"outcome", "rc", "delay_s", "stopped_s", "output"}``; ``stopped_s`` is the time
        from the interrupt to the process's exit (None when it ended before).
    """
    proc = subprocess.Popen(
        [dynsched_path(), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", **(env or {})},
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    stopped_s: float | None = None
    try:
        proc.wait(timeout=delay_s)
    except subprocess.TimeoutExpired:
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=stop_within_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            reader.join(timeout=10)
            return {
                "outcome": "hung",
                "rc": None,
                "delay_s": delay_s,
                "stopped_s": None,
                "output": _redact("".join(lines)),
            }
        stopped_s = time.monotonic() - sent
    reader.join(timeout=30)
    output = "".join(lines)
    rc = proc.returncode
    outcome = "clean"
    for kind, needles in NOISE.items():
        if any(n in output for n in needles):
            outcome = kind
            break
    if outcome == "traceback" and interrupted_python_startup(output):
        outcome = "python_startup"
    if rc == -signal.SIGSEGV or rc == 128 + signal.SIGSEGV:
        outcome = "segfault"
    elif outcome == "clean" and rc not in (0, 130, -signal.SIGINT):
        outcome = "bad_exit"
    elif outcome == "clean" and rc == 0 and stopped_s is not None and stopped_s > swallow_s:
        # Exit 0 long after the interrupt: it was swallowed and the command ran on to its end
        # (one that lands after the command's work is done exits with 130 at once).
        outcome = "swallowed"
    return {
        "outcome": outcome,
        "rc": rc,
        "delay_s": delay_s,
        "stopped_s": stopped_s,
        "output": _redact(output),
    }


def interrupted_python_startup(output: str) -> bool:
    """The interrupt landed before any code of the project ran: in Python's own start-up
    (the ``site`` module, the first ~20 ms) or on the installer-generated ``dynsched``
    script's line that imports the entry module. Python prints that traceback itself, and
    nothing in the project can catch it (a window of ~20 ms at the very start)."""
    if not output.lstrip().startswith(("Traceback", "Fatal Python error")):
        return False  # the command had printed something: it was running
    if "init_import_site" in output:
        return True
    frames = [line.strip() for line in output.splitlines() if line.strip().startswith('File "')]
    script = f'{os.sep}dynsched"'
    stdlib = f'File "{sysconfig.get_paths()["stdlib"]}{os.sep}'
    return bool(frames) and all(
        f.startswith(('File "<frozen', stdlib)) or script in f for f in frames
    )


def natural_time(args: Sequence[str]) -> float:
    """Seconds ``dynsched ARGS`` takes to its end when not interrupted."""
    start = time.monotonic()
    res = trial(args, delay_s=3600.0)
    if res["rc"] != 0:
        raise RuntimeError(f"dynsched {' '.join(args)} failed (exit {res['rc']}):\n{res['output']}")
    return time.monotonic() - start


def soak(
    name: str, trials: int, rng: random.Random, *, stop_within_s: float, verbose: bool = False
) -> dict[str, Any]:
    """``trials`` random-point interrupts of soak command ``name``; counts and failures."""
    with tempfile.TemporaryDirectory(prefix=f"interrupt-soak-{name}-") as tmp:
        args = command_args(name, Path(tmp) / "calib")
        full = natural_time(args)
        counts: Counter[str] = Counter()
        failures: list[dict[str, Any]] = []
        stops: list[float] = []
        for i in range(trials):
            delay = rng.uniform(0.0, full * 1.05)
            res = trial(command_args(name, Path(tmp) / f"t{i}"), delay, stop_within_s=stop_within_s)
            counts[res["outcome"]] += 1
            if res["stopped_s"] is not None:
                stops.append(res["stopped_s"])
            if res["outcome"] not in ("clean", "python_startup"):
                failures.append({k: v for k, v in res.items()})
            if verbose:
                print(
                    f"{name} #{i}: delay {delay:.2f} s -> {res['outcome']} (exit {res['rc']})",
                    flush=True,
                )
    return {
        "command": name,
        "trials": trials,
        "natural_s": round(full, 2),
        "counts": dict(counts),
        "max_stop_s": round(max(stops), 2) if stops else None,
        "failures": failures,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100, help="trials per command")
    parser.add_argument(
        "--commands",
        nargs="+",
        default=["simulate", "optimus", "optimus-compare", "run"],
        help="commands to soak",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the random delays")
    parser.add_argument(
        "--stop-within", type=float, default=120.0, help="seconds after SIGINT counted as hung"
    )
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per trial")
    ns = parser.parse_args(argv)
    seed = ns.seed if ns.seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    print(f"interrupt soak: seed {seed}, {ns.trials} trial(s) per command", flush=True)
    reports = []
    for name in ns.commands:
        rep = soak(name, ns.trials, rng, stop_within_s=ns.stop_within, verbose=ns.verbose)
        reports.append(rep)
        counts = ", ".join(f"{k} {v}" for k, v in sorted(rep["counts"].items()))
        print(
            f"{name}: {rep['trials']} trial(s) over {rep['natural_s']} s runs: {counts}; "
            f"slowest stop {rep['max_stop_s']} s",
            flush=True,
        )
        for f in rep["failures"][:3]:
            print(f"  {f['outcome']} at {f['delay_s']:.2f} s (exit {f['rc']}):", flush=True)
            print("    " + "\n    ".join(f["output"].splitlines()[-15:]), flush=True)
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps({"seed": seed, "reports": reports}, indent=2) + "\n")
    ok = ("clean", "python_startup")
    return 0 if all(sum(r["counts"].get(k, 0) for k in ok) == r["trials"] for r in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
