"""CPU time of the restart-aware incremental allocator (``optimus+``, ``optimus+rw``) as the
cluster grows, against the aggregate ``allocate`` of the same instance (issue 31, item 4).

The scale target (placement-aware 4,000 jobs on 16,000 nodes <= 0.2 s CPU) was set by
``optimus_allocation_placement.py`` for the paper's fast ``allocate``. The simulator's
``optimus+`` and ``optimus+rw`` decide with ``allocate_incremental`` instead (the greedy
of one task at a time from the current tasks, with restart costs; computed by victim
heaps and a vectorised merge of every job's chain of next tasks, see
``dynsched_optimus._incremental``). On the same instances (one job per four nodes) this
times, at growing sizes:

- ``empty``: a decision from an empty cluster (every job waiting: the most work one
  decision can have);
- ``steady``: a decision in a running cluster: the ``empty`` decision's tasks are the
  current tasks, 5 % of the jobs (every 20th) arrive new, and a change of a running
  job's tasks costs a restart penalty of ``RESTART_PENALTY_S`` (judgement);
- ``placed``: the ``steady`` decision placement-aware (``allocate(node_capacity=...,
  method="incremental")``: the aggregate counts placed on the nodes, fewest servers);
- ``placed_empty``: the ``empty`` decision placement-aware (the analogue of the aggregate
  benchmark's placement-aware ``allocate``, which also starts from nothing);
- ``steady_history`` / ``placed_history``: the ``steady`` / ``placed`` decision with a
  restart penalty per running job, as ``optimus+rw``'s restart history gives them
  (``RestartPlanner(history="share")``): ``RESTART_PENALTY_S`` plus, for most jobs, a
  power of two of seconds, ``HISTORY_LEVELS`` levels drawn at random (judgement: a
  2.0x Pollux workload's rounds had up to 15 distinct penalties, 5 on average); the
  victims then fall in one heap per penalty level and resource set.

Each time is the least CPU time (``time.process_time``) of ``--repeat`` calls, reported
with its ratio to the aggregate ``allocate`` and to the placement-aware ``allocate`` of
the same instance, timed in the same run. A size whose call exceeds ``--budget-s`` stops
that variant; the sizes after it are not run and are reported as such.

Run: ``hatch run test:python benchmarks/optimus_incremental_scale.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynsched_optimus import allocate
from dynsched_optimus._allocation import allocate_incremental
from dynsched_optimus._scheduler import IncrementalAllocation, RemainingWorkAllocation
from optimus_allocation_placement import instance

#: Each variant's allocator settings, taken from its strategy's defaults (its decision from
#: an empty cluster: no restart penalty applies)
VARIANTS = {
    "optimus+": {
        "utility_exponent": IncrementalAllocation().utility_exponent,
        "min_gain": IncrementalAllocation().min_gain,
    },
    "optimus+rw": {
        "utility_exponent": RemainingWorkAllocation().exponent,
        "min_gain": RemainingWorkAllocation().min_gain,
        "jct_gains": True,
    },
}


#: seconds charged to a running job whose tasks change in the ``steady`` case (judgement:
#: the order of a restart from a checkpoint in the simulator's profiles)
RESTART_PENALTY_S = 30.0
#: ``steady_history``: the per-job extras, 0 (no restart history) or ``2**k`` s for k in
#: 5..18 (judgement, see the module docstring)
HISTORY_LEVELS = (0.0, *(2.0**k for k in range(5, 19)))


def history_penalties(current: dict[str, tuple[int, int]], seed: int = 0) -> dict[str, float]:
    """A restart penalty per running job: the base plus one of ``HISTORY_LEVELS``."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(HISTORY_LEVELS), size=len(current))
    return {
        jid: RESTART_PENALTY_S + HISTORY_LEVELS[k] for jid, k in zip(current, picks, strict=True)
    }


def cpu(fn, *args, repeat: int = 1, **kwargs):  # type: ignore[no-untyped-def]
    """``fn``'s result and the least CPU seconds of ``repeat`` calls."""
    best = float("inf")
    out = None
    for _ in range(max(repeat, 1)):
        c0 = time.process_time()
        out = fn(*args, **kwargs)
        best = min(best, time.process_time() - c0)
    return out, best


def unplaced(jobs, cap, current, repeat, **kw):  # type: ignore[no-untyped-def]
    """``allocate_incremental`` from ``current``: its result and least CPU seconds."""
    return cpu(allocate_incremental, jobs, cap, current=current, repeat=repeat, **kw)


def placed_on_nodes(jobs, nodes, current, repeat, **kw):  # type: ignore[no-untyped-def]
    """The same placement-aware (``allocate(node_capacity=...)``)."""
    return cpu(
        allocate,
        jobs,
        node_capacity=nodes,
        method="incremental",
        current=current,
        repeat=repeat,
        **kw,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[125, 250, 500, 1000, 2000, 4000])
    ap.add_argument("--repeat", type=int, default=3, help="calls per timing (the least counts)")
    ap.add_argument("--budget-s", type=float, default=120.0, help="stop after a call this long")
    ap.add_argument("--out", default=None, help="JSON result file")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat must be >= 1, got {args.repeat}")
    rows = []
    over: set[str] = set()
    for n in args.jobs:
        jobs, nodes = instance(4 * n, n)
        cap = tuple(float(x) for x in nodes.sum(axis=0))
        agg, c_agg = cpu(allocate, jobs, cap, repeat=args.repeat)
        _p, c_aware = cpu(allocate, jobs, node_capacity=nodes, repeat=args.repeat)
        for name, kw in VARIANTS.items():
            if name in over:
                rows.append({"jobs": n, "nodes": 4 * n, "variant": name, "skipped": True})
                print(f"{n} jobs, {name}: not run (a smaller size exceeded the budget)")
                continue
            empty, c_empty = unplaced(jobs, cap, {}, args.repeat, **kw)
            current = {
                j.job_id: empty.tasks[j.job_id]
                for i, j in enumerate(jobs)
                if i % 20 and empty.tasks[j.job_id][1] > 0
            }
            steady_kw = dict(kw, restart_penalty=RESTART_PENALTY_S)
            hist_kw = dict(kw, restart_penalty=history_penalties(current))
            r = args.repeat
            steady, c_steady = unplaced(jobs, cap, current, r, **steady_kw)
            placed, c_placed = placed_on_nodes(jobs, nodes, current, r, **steady_kw)
            _sh, c_steady_hist = unplaced(jobs, cap, current, r, **hist_kw)
            _ph, c_placed_hist = placed_on_nodes(jobs, nodes, current, r, **hist_kw)
            _pe, c_placed_empty = placed_on_nodes(jobs, nodes, {}, r, **kw)
            row = {
                "jobs": n,
                "nodes": 4 * n,
                "variant": name,
                "aggregate_cpu_s": round(c_agg, 4),
                "aggregate_placed_cpu_s": round(c_aware, 4),
                "empty_cpu_s": round(c_empty, 4),
                "steady_cpu_s": round(c_steady, 4),
                "placed_cpu_s": round(c_placed, 4),
                "placed_empty_cpu_s": round(c_placed_empty, 4),
                "steady_history_cpu_s": round(c_steady_hist, 4),
                "placed_history_cpu_s": round(c_placed_hist, 4),
                "empty_over_aggregate": round(c_empty / c_agg, 2) if c_agg > 0 else None,
                "steady_over_aggregate": round(c_steady / c_agg, 2) if c_agg > 0 else None,
                "placed_over_aggregate_placed": round(c_placed / c_aware, 2) if c_aware else None,
                "placed_empty_over_aggregate_placed": (
                    round(c_placed_empty / c_aware, 2) if c_aware else None
                ),
                "placed_history_over_aggregate_placed": (
                    round(c_placed_hist / c_aware, 2) if c_aware else None
                ),
                "tasks_empty": empty.total_tasks,
                "tasks_steady": steady.total_tasks,
                "tasks_placed": placed.total_tasks,
                "aggregate_tasks": agg.total_tasks,
            }
            rows.append(row)
            print(
                f"{n} jobs / {4 * n} nodes, {name}: empty {c_empty:.3f} s "
                f"({row['empty_over_aggregate']}x aggregate {c_agg:.3f} s), steady "
                f"{c_steady:.3f} s ({row['steady_over_aggregate']}x), placed {c_placed:.3f} s "
                f"({row['placed_over_aggregate_placed']}x placed aggregate {c_aware:.3f} s), "
                f"placed from empty {c_placed_empty:.3f} s "
                f"({row['placed_empty_over_aggregate_placed']}x), placed with restart histories "
                f"{c_placed_hist:.3f} s ({row['placed_history_over_aggregate_placed']}x)",
                flush=True,
            )
            if max(c_empty, c_steady, c_placed, c_placed_empty, c_placed_hist) > args.budget_s:
                over.add(name)
    if args.out:
        Path(args.out).write_text(json.dumps({"repeat": args.repeat, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
