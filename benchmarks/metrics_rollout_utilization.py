"""Rollout utilization over a 1,000,000-point history: vectorised vs a plain Python loop.

Run: ``hatch run python benchmarks/metrics_rollout_utilization.py [--events N] [--out FILE]``.
Prints a small table (best-of-``--repeat`` seconds and the speed-up ratio against the loop
measured in the same run) and writes it as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from collections.abc import Callable, Sequence

import numpy as np
from dynsched_metrics import (
    rollout_resource_utilization,
    rollout_resource_utilization_arrays,
)


def make_history(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """A plausible rollouter history: random gaps, active around capacity, capacity steps."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(0.01, size=n))
    capacity = np.where((np.arange(n) // 5_000) % 2 == 0, 64, 128).astype(np.int64)
    capacity[rng.random(n) < 0.001] = 0  # a few moments with no routable replica
    active = np.clip(rng.normal(90, 30, size=n).round(), 0, None).astype(np.int64)
    return times, active, capacity, float(times[-1] + 1.0)


def python_loop(points: Sequence[tuple[float, int, int]], now: float) -> float:
    """The straightforward loop, written for this comparison."""
    used = 0.0
    weight = 0.0
    last = len(points) - 1
    for k in range(len(points)):
        t, active, cap = points[k]
        end = points[k + 1][0] if k < last else now
        dt = end - t
        if cap > 0 and dt > 0:
            used += dt * (active if active < cap else cap)
            weight += dt * cap
    return used / weight if weight > 0 else 0.0


def best_of(fn: Callable[[], float], repeat: int) -> tuple[float, float]:
    best = math.inf
    value = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    times, active, capacity, now = make_history(args.events)
    points = list(zip(times.tolist(), active.tolist(), capacity.tolist(), strict=True))

    loop_s, loop_v = best_of(lambda: python_loop(points, now), args.repeat)
    vec_s, vec_v = best_of(
        lambda: rollout_resource_utilization_arrays(times, active, capacity, now),
        max(5, args.repeat),
    )
    tup_s, tup_v = best_of(lambda: rollout_resource_utilization(points, now), args.repeat)
    for v in (vec_v, tup_v):
        if not math.isclose(v, loop_v, rel_tol=1e-9):
            raise SystemExit(f"results disagree: loop={loop_v!r} other={v!r}")

    rows = [
        ("python loop (baseline)", loop_s),
        ("numpy, arrays (recorder storage)", vec_s),
        ("numpy, from list of tuples", tup_s),
    ]
    print(f"rollout_resource_utilization over {args.events:,} events (best of {args.repeat})")
    print(f"{'method':36s} {'seconds':>10s} {'speed-up':>9s}")
    for name, secs in rows:
        print(f"{name:36s} {secs:10.4f} {loop_s / secs:8.1f}x")
    print(f"utilization = {loop_v:.6f}")
    if args.out:
        result = {
            "benchmark": "metrics_rollout_utilization",
            "events": args.events,
            "repeat": args.repeat,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "utilization": loop_v,
            "python_loop_s": loop_s,
            "vectorised_arrays_s": vec_s,
            "vectorised_from_tuples_s": tup_s,
            "speedup_arrays": loop_s / vec_s,
            "speedup_from_tuples": loop_s / tup_s,
        }
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
