"""Optimus on Ray with real jobs: average JCT, makespan and re-allocation overhead (issue 30).

Workload: 8 tiny real jobs (4 MLP, 4 CNN from ``examples/optimus_jobs``, each to its loss
target) arriving ``--gap`` seconds apart in an order and with model seeds drawn per
benchmark seed. Cluster: an in-process ``ray.cluster_utils.Cluster`` of 4 nodes (the
head and 3 more), each with 2 CPUs and 2 GPUs that are Ray bookkeeping (custom-resource
style; no GPU is used), token authentication on. A worker asks for 1 GPU and 0.25 CPU,
so the 8 GPUs are what the schedulers share; jobs request 1 or 2 workers and may use 2-4.
Each scheduler (``optimus+``, ``optimus``, ``fifo``, ``drf``) runs the same workload
through :class:`dynsched_ray.optimus.OptimusService` (interval 5 s, restart delay 5 s).

Reported per scheduler: average JCT (end - submission) and makespan (last end - first
submission), mean and standard deviation over seeds; re-allocations and their overhead
(seconds from each stop request to the job's first report at its new size, over the
jobs' total run time; the paper reports 2.54 %).

Also reported (no Ray): the service's decision time for 1,000 queued jobs (job table ->
records -> observations -> policy) against the policy's own time on the same
observations, the part of a simulator decision it shares (the simulator also builds its
observations, so this is the harder comparison).

Honest limits: every worker shares the machine's cores (2 on the development machine),
so the wall-clock reflects CPU sharing more than GPU counts; the jobs are seconds long,
so actor start-up (process + torch import) weighs far more than on real jobs.

Run: ``python benchmarks/optimus_ray_jobs.py [--seeds 2] [--out benchmarks/results/optimus_ray_jobs.json]``
(with the workspace's Python; a full run takes about 10-20 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# ray.cluster_utils starts its nodes without ray.init's default: ask for token
# authentication explicitly (before Ray reads its settings at import)
os.environ.setdefault("RAY_AUTH_MODE", "token")

import attrs
import numpy as np
from dynsched_optimus import JobPlacement
from dynsched_optimus.jobs import JobSpec, load_job_file, make_decider, observe_record

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "optimus_jobs"
SCHEDULERS = ("optimus+", "optimus", "fifo", "drf")
NODES = 4
#: per node: 2 CPUs (the development machine's cores, shared) and 2 bookkeeping GPUs
NODE_CPUS, NODE_GPUS = 2, 2


def workload(seed: int) -> list[JobSpec]:
    """8 jobs: MLPs and CNNs with seeds, requests and limits drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    base = {k: load_job_file(EXAMPLES / f"{k}.yaml") for k in ("mlp", "cnn")}
    out = []
    for i, kind in enumerate(rng.permutation(["mlp"] * 4 + ["cnn"] * 4)):
        req = int(rng.integers(1, 3))
        spec = base[str(kind)]
        out.append(
            attrs.evolve(
                spec,
                name=f"{kind}-{i}",
                workers=req,
                max_workers=int(rng.integers(max(req, 2), 5)),
                resources=(0.25, 1.0),
                args={**spec.args, "seed": int(rng.integers(0, 1000))},
            )
        )
    return out


def start_cluster() -> Any:
    """The 4-node in-process cluster, connected."""
    import ray
    from ray._private.authentication.authentication_token_setup import (
        ensure_token_if_auth_enabled,
    )
    from ray.cluster_utils import Cluster

    ensure_token_if_auth_enabled()
    node = {"num_cpus": NODE_CPUS, "num_gpus": NODE_GPUS, "object_store_memory": 80 * 2**20}
    cluster = Cluster(
        initialize_head=True, head_node_args={**node, "resources": {"dynsched_node_0": 1000}}
    )
    for k in range(1, NODES):
        cluster.add_node(**node, resources={f"dynsched_node_{k}": 1000})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="optimus-bench", log_to_driver=False)
    return cluster


def run_one(scheduler: str, seed: int, gap_s: float, bound_s: float) -> dict[str, Any]:
    """One workload under one scheduler; JCTs, makespan, re-allocation overhead."""
    from dynsched_ray.optimus import JobStore, OptimusService, ServiceOptions

    tmp = Path(tempfile.mkdtemp(prefix=f"optimus-{scheduler}-{seed}-"))
    store = JobStore(tmp / "jobs.sqlite")
    opts = ServiceOptions(
        scheduler=scheduler,
        interval_s=5.0,
        restart_delay_s=5.0,
        checkpoint_root=str(tmp / "ck"),
        poll_s=0.3,
    )
    lines: list[str] = []
    service = OptimusService(store, opts, on_line=lines.append)
    pending = workload(seed)
    t0 = time.monotonic()
    arrivals = [t0 + i * gap_s for i in range(len(pending))]
    try:
        while pending or store.jobs(("queued", "running", "stopping")):
            if time.monotonic() - t0 > bound_s:
                raise TimeoutError(f"{scheduler} seed {seed}: not done in {bound_s:g} s")
            while pending and time.monotonic() >= arrivals[len(arrivals) - len(pending)]:
                store.submit(pending.pop(0))
            service.step()
            time.sleep(opts.poll_s)
    finally:
        service.shutdown()
    rows = store.jobs()
    failed = [f"{r.name}: {r.error}" for r in rows if r.state != "finished"]
    jct = [r.ended - r.submitted for r in rows if r.ended is not None]
    run = sum(r.ended - r.started for r in rows if r.ended is not None and r.started)
    return {
        "scheduler": scheduler,
        "seed": seed,
        "avg_jct_s": float(np.mean(jct)),
        "makespan_s": max(r.ended for r in rows if r.ended) - min(r.submitted for r in rows),
        "reallocations": service.reallocations,
        "reallocation_s": service.reallocation_s,
        "reallocation_overhead": service.reallocation_s / run if run else 0.0,
        "restarts": sum(r.restarts for r in rows),
        "decisions": service.decisions,
        "failed": failed,
    }


class _NoRay:
    """Wraps the service's decision step without Ray (the benchmark of decision time)."""

    @staticmethod
    def service(store: Any, scheduler: str, cap: np.ndarray) -> Any:
        from dynsched_ray.optimus.service import OptimusService, ServiceOptions

        class Recorded(OptimusService):
            def _capacity(self) -> tuple[np.ndarray, list[str | None]]:
                return cap, [None] * len(cap)

            def _start(self, row: Any, placement: JobPlacement, labels: Any) -> None:
                pass

        return Recorded(store, ServiceOptions(scheduler=scheduler), clock=lambda: 1e6)


def decision_overhead(n_jobs: int, scheduler: str, repeats: int) -> dict[str, Any]:
    """Seconds per decision for ``n_jobs`` queued jobs: the service against the policy."""
    from dynsched_ray.optimus.store import JobStore

    rng = np.random.default_rng(0)
    cap = np.array([[8.0, 8.0]] * 64)
    with tempfile.TemporaryDirectory() as d:
        store = JobStore(Path(d) / "jobs.sqlite")
        base = load_job_file(EXAMPLES / "mlp.yaml")
        for i in range(n_jobs):
            spec = attrs.evolve(base, name=f"j{i}", workers=int(rng.integers(1, 4)), max_workers=4)
            store.submit(spec, now=float(i))
            losses = [(10 * k, 1.0 / k + 0.1) for k in range(1, 6)]
            store.add_reports(
                spec.name, [{"t": 0.0, "step": s, "loss": v, "samples": 64} for s, v in losses]
            )
            store.add_speed(spec.name, spec.workers, 1, 64, float(rng.uniform(5, 20)))
        service_times, inside, policy_times = [], [], []
        for _ in range(repeats):
            svc = _NoRay.service(store, scheduler, cap)
            timed = _Timed(svc.decide)
            svc.decide = timed
            t = time.perf_counter()
            svc._schedule()
            service_times.append(time.perf_counter() - t)
            inside.append(timed.seconds)
            obs = [observe_record(rec) for rec in store.records(store.jobs(("queued",)))]
            decide = make_decider(scheduler)
            t = time.perf_counter()
            decide(1e6, obs, cap, 5.0)
            policy_times.append(time.perf_counter() - t)
        store.close()
    own = [s - i for s, i in zip(service_times, inside, strict=True)]
    s, p = statistics.median(service_times), statistics.median(policy_times)
    return {
        "jobs": n_jobs,
        "scheduler": scheduler,
        "service_s": s,
        "policy_s": p,
        "ratio": s / p,
        "service_own_s": statistics.median(own),
        "service_runs": service_times,
        "policy_runs": policy_times,
    }


class _Timed:
    """A decider that keeps the seconds of its last call."""

    def __init__(self, decide: Any) -> None:
        self.decide = decide
        self.seconds = 0.0

    def __call__(self, *args: Any) -> Any:
        t = time.perf_counter()
        try:
            return self.decide(*args)
        finally:
            self.seconds = time.perf_counter() - t


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean and standard deviation over seeds per scheduler."""
    out = {}
    for name in SCHEDULERS:
        mine = [r for r in runs if r["scheduler"] == name]
        if not mine:
            continue
        row: dict[str, float] = {"seeds": len(mine)}
        for key in ("avg_jct_s", "makespan_s", "reallocation_overhead", "reallocations"):
            vals = [float(r[key]) for r in mine]
            row[key] = statistics.fmean(vals)
            row[key + "_sd"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
        out[name] = row
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--schedulers", default=",".join(SCHEDULERS))
    ap.add_argument("--gap", type=float, default=3.0, help="seconds between arrivals")
    ap.add_argument("--bound", type=float, default=900.0, help="seconds one run may take")
    ap.add_argument("--decision-jobs", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5, help="timings of the decision part")
    ap.add_argument("--skip-ray", action="store_true", help="only the decision-time part")
    ap.add_argument("--skip-decision", action="store_true", help="only the Ray runs")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "optimus_ray_jobs.json"))
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"decision": [], "runs": []}
    for name in () if args.skip_decision else ("optimus+", "optimus"):
        d = decision_overhead(args.decision_jobs, name, repeats=args.repeats)
        result["decision"].append(d)
        print(
            f"decision, {d['jobs']} queued jobs, {name}: service {d['service_s']:.3f} s "
            f"(its own part: job table + records {d['service_own_s']:.3f} s), policy alone "
            f"{d['policy_s']:.3f} s (x{d['ratio']:.2f}; medians of {args.repeats})",
            flush=True,
        )
    if not args.skip_ray:
        import ray

        cluster = start_cluster()
        try:
            for seed in range(args.seeds):
                for name in args.schedulers.split(","):
                    r = run_one(name, seed, args.gap, args.bound)
                    result["runs"].append(r)
                    print(json.dumps(r), flush=True)
        finally:
            ray.shutdown()
            cluster.shutdown()
        result["summary"] = summarize(result["runs"])
        for name, row in result["summary"].items():
            print(
                f"{name:<9} avg JCT {row['avg_jct_s']:6.1f} ± {row['avg_jct_s_sd']:4.1f} s   "
                f"makespan {row['makespan_s']:6.1f} ± {row['makespan_s_sd']:4.1f} s   "
                f"re-allocations {row['reallocations']:.1f}, overhead "
                f"{100 * row['reallocation_overhead']:.2f} % ± {100 * row['reallocation_overhead_sd']:.2f}"
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
