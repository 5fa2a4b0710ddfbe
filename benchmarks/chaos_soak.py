"""Chaos soak: a long run over Ray actors under seeded random faults, checked continuously.

For each seed, `dynsched_ray.run_chaos_soak` trains ``--steps`` steps (in-memory replicas in
actors, 2 standalone + 2 hybrid, a policy that switches every cycle, replica restarts on)
while a seeded schedule injects the nine fault kinds (replica kills mid-generation, all
standalone replicas at once, kills during activation and deactivation, router and queue
actor restarts, driver restart from the checkpoint, stragglers, transient actor-call
delays) at random moments. It checks every sample by id across every driver lifetime
(each produced id trained exactly once, or re-generated after a driver restart discarded
it, or still queued at the end; any id lost or trained twice fails the run, naming it),
staleness within its bound, no wait over its timeout, driver memory and live Ray
references bounded, the run finishes. The fault schedule is a function of the seed,
drawn up front and written into the report; a fault that cannot fire when due (e.g. right
after a driver restart) is deferred, never dropped. The JSON report has the schedule, the
faults executed (with their deferrals), recoveries, time lost per kind, the per-id
accounting (produced, consumed, regenerated, left, returned, lost, duplicated), the
maximum wait against its timeout and the memory series.

Usage: ``hatch run test:python benchmarks/chaos_soak.py [--seed N ...] [--steps 300]
[--out benchmarks/results/chaos_soak.json]``; without ``--seed`` one seed is drawn at run
time (``os.urandom``) and printed, so a soak is not limited to the seeds in the
repository; rerun with ``--seed N`` to replay it. Exit status 1 when a check fails.
Starts a local Ray cluster (4 CPUs, 8 bookkeeping GPUs). Wall time is dominated by actor
restarts (a fresh worker process per restarted actor) and grows with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import sys
import tempfile
import time
from typing import Any

import ray
from dynsched_ray import FAULT_KINDS, ChaosSchedule, run_chaos_soak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--seed",
        "--seeds",
        dest="seeds",
        type=int,
        nargs="+",
        default=None,
        help="seed(s) of the fault schedule (default: one drawn at run time and printed)",
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--faults-per-10-steps", type=float, default=1.5)
    parser.add_argument("--out", default=None, help="write the JSON report here")
    args = parser.parse_args()
    if args.seeds is None:
        args.seeds = [int.from_bytes(os.urandom(4), "big")]
        print(f"seed {args.seeds[0]} (drawn at run time; replay with --seed)", flush=True)
    # bad input: one line, exit 2, before Ray starts
    rate = args.faults_per_10_steps
    if not (math.isfinite(rate) and 0 < rate <= 10):
        print(
            f"chaos_soak.py: --faults-per-10-steps must be in (0, 10], got {rate}", file=sys.stderr
        )
        return 2
    try:
        for seed in args.seeds:
            ChaosSchedule.generate(seed, args.steps, faults_per_10_steps=rate)
    except ValueError as exc:
        print(f"chaos_soak.py: --steps: {exc}", file=sys.stderr)
        return 2
    for attempt in range(3):  # a loaded machine can time out the node's start-up
        try:
            ray.init(
                address="local",  # a fresh cluster of its own, never one already running
                num_cpus=4,
                num_gpus=8,
                include_dashboard=False,
                object_store_memory=200 * 1024 * 1024,
                namespace="dynsched-chaos-soak",
                log_to_driver=False,
                configure_logging=False,
            )
            break
        except Exception as exc:
            print(f"ray.init failed ({exc}); retrying", file=sys.stderr, flush=True)
            ray.shutdown()
            if attempt == 2:
                raise
            time.sleep(5)
    runs: list[dict[str, Any]] = []
    try:
        for seed in args.seeds:
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                report = asyncio.run(
                    run_chaos_soak(
                        seed,
                        args.steps,
                        name=f"soak{seed}",
                        checkpoint_dir=tmp,
                        faults_per_10_steps=args.faults_per_10_steps,
                    )
                )
            data = report.as_dict()
            runs.append(data)
            ids = data["samples"]
            print(
                f"seed {seed}: {data['steps_completed']}/{data['steps_requested']} steps in"
                f" {time.perf_counter() - t0:.0f} s, {data['segments']} driver lifetime(s),"
                f" {sum(data['faults_by_kind'].values())}/{len(data['schedule'])} scheduled"
                f" faults {dict(data['faults_by_kind'])} ({data['fault_deferrals']} deferral(s));"
                f" samples by id: produced {ids['produced']}, consumed {ids['consumed']},"
                f" regenerated {ids['regenerated']}, left {ids['left']}, returned"
                f" {ids['returned']}, lost {ids['lost']}, duplicated {ids['duplicated']};"
                f" max wait {data['max_wait_s']} s"
                f" (timeout {data['wait_timeout_s']} s), rss {data['memory'].get('rss_mb_start')}"
                f" -> {data['memory'].get('rss_mb_end')} MiB, ok={data['ok']}"
                + ("" if data["ok"] else f" FAILURES: {list(data['failures'])}"),
                flush=True,
            )
    finally:
        ray.shutdown()
    result = {
        "command": "hatch run test:python benchmarks/chaos_soak.py " + " ".join(sys.argv[1:]),
        "seeds": list(args.seeds),
        "fault_kinds": list(FAULT_KINDS),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "runs": runs,
    }
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
