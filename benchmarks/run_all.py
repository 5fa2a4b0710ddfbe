"""Run every benchmark script in this folder, one after the other.

Usage: ``hatch run bench:all [--only SUBSTRING] [--out DIR]``. Each script prints its own
table (times and ratios against a baseline measured in the same run); with ``--out`` each
script that supports it also writes JSON there.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="", help="run only scripts whose name contains this")
    parser.add_argument("--out", default=None, help="folder for JSON results")
    args = parser.parse_args()
    scripts = sorted(
        p for p in HERE.glob("*.py") if p.name != Path(__file__).name and args.only in p.name
    )
    failed = []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        cmd = [sys.executable, str(script)]
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            cmd += ["--out", str(Path(args.out) / f"{script.stem}.json")]
        t0 = time.perf_counter()
        rc = subprocess.call(cmd)
        print(f"--- {script.name}: exit {rc} in {time.perf_counter() - t0:.1f} s", flush=True)
        if rc:
            failed.append(script.name)
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
