"""CPU time of the restart-aware incremental allocator (``optimus+``, ``optimus+rw``) as the
cluster grows, against the aggregate ``allocate`` of the same instance (issue 31, item 4).

The scale target (placement-aware 4,000 jobs on 16,000 nodes <= 0.2 s CPU) is measured by
``optimus_allocation_placement.py`` for the paper's fast ``allocate``. The simulator's
``optimus+`` and ``optimus+rw`` decide with ``allocate_incremental`` instead (one task at
a time from the current tasks, with restart costs); this benchmark times it from an empty
cluster (``current={}``: every job waiting, the most work one decision can have) on the
same instances (one job per four nodes), at growing sizes, until one call exceeds
``--budget-s``; the sizes after that are not run and are reported as such.

Run: ``hatch run test:python benchmarks/optimus_incremental_scale.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

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


def cpu(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    c0 = time.process_time()
    out = fn(*args, **kwargs)
    return out, time.process_time() - c0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[125, 250, 500, 1000, 2000, 4000])
    ap.add_argument("--budget-s", type=float, default=120.0, help="stop after a call this long")
    ap.add_argument("--out", default=None, help="JSON result file")
    args = ap.parse_args(argv)
    rows = []
    over = set()
    for n in args.jobs:
        jobs, nodes = instance(4 * n, n)
        cap = tuple(nodes.sum(axis=0))
        agg, c_agg = cpu(allocate, jobs, cap)
        for name, kw in VARIANTS.items():
            if name in over:
                rows.append({"jobs": n, "nodes": 4 * n, "variant": name, "skipped": True})
                continue
            inc, c = cpu(allocate_incremental, jobs, cap, current={}, **kw)
            row = {
                "jobs": n,
                "nodes": 4 * n,
                "variant": name,
                "cpu_s": round(c, 4),
                "aggregate_cpu_s": round(c_agg, 4),
                "ratio": round(c / c_agg, 1) if c_agg > 0 else None,
                "tasks": inc.total_tasks,
                "aggregate_tasks": agg.total_tasks,
            }
            rows.append(row)
            print(
                f"{n} jobs / {4 * n} nodes, {name}: {c:.3f} s CPU ({row['ratio']}x the aggregate "
                f"allocate, {c_agg:.3f} s)",
                flush=True,
            )
            if c > args.budget_s:
                over.add(name)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
