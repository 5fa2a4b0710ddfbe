"""Optimus on Ray with real jobs: average JCT, makespan, re-allocation overhead and the
simulator's fidelity (issue 30).

Workload: 8 real jobs (4 MLP, 4 CNN from ``examples/optimus_jobs``, each to its loss
target) arriving ``--gap`` seconds apart in an order and with model seeds drawn per
benchmark seed. Cluster: an in-process ``ray.cluster_utils.Cluster`` of 4 nodes (the
head and 3 more), each with 2 CPUs and 2 GPUs that are Ray bookkeeping (custom-resource
style; no GPU is used), token authentication on. A worker asks for 1 GPU and 0.25 CPU,
so the 8 GPUs are what the schedulers share; jobs request 1 or 2 workers and may use 2-4.
Each scheduler (``optimus+``, ``optimus``, ``fifo``, ``drf``) runs the same workload
through :class:`dynsched_ray.optimus.OptimusService` (interval 5 s, restart delay 5 s).

Emulated GPU (option (a) of the fidelity brief; on by default, ``--emulate 0`` turns it
off): every job runs with ``emulate_gpu_s_per_sample`` = 3 ms (judgement: steps of
48-192 ms at 4-1 workers, jobs of tens of seconds), a sleep per local sample after each
real step, so a job's speed is governed by the emulated GPU and grows with its workers,
not by how many other workers share the machine's 2 cores (the loss stays the real one).

Reported per scheduler: average JCT (end - submission) and makespan (last end - first
submission), mean and standard deviation over seeds; re-allocations and their overhead
(seconds from each stop request to the job's first report at its new size, over the
jobs' total run time; the paper reports 2.54 %).

Simulation fidelity: each real run's job table is turned into one
:class:`~dynsched_optimus.cluster.JobProfile` per job (arrival; the steps it needed; its
``(step, loss)`` reports; seconds per step at each worker count it ran at, measured in
that run; start-up and re-allocation costs measured from the service's own events); a
worker count the run never used takes the step time of a profiling pass (every job type
alone-ish at 1..4 workers on the same cluster before the workload, ``"measured,
profiling pass"``). :func:`~dynsched_optimus.cluster.simulate_measured` replays the
profiles under the same scheduler with the service's decision functions, interval and
restart penalty (its tick: the real service loop's measured mean period). Reported: real
and simulated average JCT per run and per scheduler (mean ± sd over seeds), and the
residual (simulated - real) / real. No parameter of the simulation is fitted to a JCT.
The profiles go to ``--profiles`` (``--replay PROFILES`` recomputes the fidelity from
them without Ray).

Also reported (no Ray, unless ``--skip-decision``): the service's decision time for
1,000 queued jobs (job table -> records -> observations -> policy) against the policy's
own time on the same observations.

Honest limits: the emulated GPU removes most of the CPU sharing, not all (the real step,
DDP's all-reduce, the report collective and the service itself still share 2 cores: 4
workers step in 0.1-0.13 s, not 0.05 s); start-up (placement group, process spawn, torch
import, gloo rendezvous) took 7-33 s per run on average on the loaded 2-core machine,
against jobs training for 15-60 s; the service waits for a job's actors to start inside
its loop, which holds its decisions and polls meanwhile (``longest_loop_step_s``), a
delay the simulator does not model.

Run: ``python benchmarks/optimus_ray_jobs.py [--seeds 2] [--out ...json]`` (with the
workspace's Python; a full run takes about 15-20 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import math
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
from dynsched_optimus.jobs import (
    MIN_SPEED_REPORTS,
    JobSpec,
    load_job_file,
    make_decider,
    observe_record,
)
from dynsched_optimus.scheduler import CompletionRule

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "optimus_jobs"
SCHEDULERS = ("optimus+", "optimus", "fifo", "drf")
KINDS = ("mlp", "cnn")
NODES = 4
#: per node: 2 CPUs (the development machine's cores, shared) and 2 bookkeeping GPUs
NODE_CPUS, NODE_GPUS = 2, 2
#: the service's settings in every run (public configuration of this benchmark)
INTERVAL_S, RESTART_DELAY_S, POLL_S = 5.0, 5.0, 0.3
#: per worker: 0.25 CPU (bookkeeping) and 1 GPU
RESOURCES = (0.25, 1.0)
#: seconds of emulated GPU compute per local sample (judgement, see the module docstring)
EMULATE_S_PER_SAMPLE = 0.003
#: steps of each profiling-pass job (judgement: 39 steady steps, seconds per job)
PROFILE_STEPS = 40
#: the most workers any job may get (the profiling pass covers 1..this)
MAX_WORKERS = 4


def workload(seed: int, emulate_s: float = EMULATE_S_PER_SAMPLE) -> list[JobSpec]:
    """8 jobs: MLPs and CNNs with seeds, requests and limits drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    base = {k: load_job_file(EXAMPLES / f"{k}.yaml") for k in KINDS}
    out = []
    for i, kind in enumerate(rng.permutation(["mlp"] * 4 + ["cnn"] * 4)):
        req = int(rng.integers(1, 3))
        spec = base[str(kind)]
        args = {**spec.args, "seed": int(rng.integers(0, 1000))}
        if emulate_s > 0:
            args["emulate_gpu_s_per_sample"] = emulate_s
        out.append(
            attrs.evolve(
                spec,
                name=f"{kind}-{i}",
                workers=req,
                max_workers=int(rng.integers(max(req, 2), MAX_WORKERS + 1)),
                resources=RESOURCES,
                args=args,
            )
        )
    return out


def profiling_jobs(emulate_s: float) -> list[JobSpec]:
    """One short job per job type and worker count 1..MAX_WORKERS (fixed workers)."""
    out = []
    for kind in KINDS:
        spec = load_job_file(EXAMPLES / f"{kind}.yaml")
        args = {**spec.args, "seed": 0}
        if emulate_s > 0:
            args["emulate_gpu_s_per_sample"] = emulate_s
        for w in range(1, MAX_WORKERS + 1):
            out.append(
                attrs.evolve(
                    spec,
                    name=f"profile-{kind}-w{w}",
                    workers=w,
                    max_workers=w,
                    resources=RESOURCES,
                    completion=CompletionRule("steps", PROFILE_STEPS),
                    args=args,
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


def _logged_service(store: Any, opts: Any, lines: list[str]) -> Any:
    """The service, keeping a log of each job's runs: start, stop request, end (wall clock)."""
    from dynsched_ray.optimus import OptimusService

    class Logged(OptimusService):
        log: list[dict[str, Any]]

        def _start(self, row: Any, placement: JobPlacement, labels: Any) -> None:
            super()._start(row, placement, labels)
            ev = {"ev": "start", "job": row.name, "t": time.time(), "workers": placement.workers}
            self.log.append(ev)

        def _resize(self, row: Any, new: JobPlacement | None) -> None:
            before = self.reallocations
            super()._resize(row, new)
            if self.reallocations > before:
                self.log.append({"ev": "stop", "job": row.name, "t": time.time()})

        def _end_run(self, name: str, state: str, **fields: object) -> None:
            super()._end_run(name, state, **fields)
            self.log.append({"ev": "end", "job": name, "t": time.time(), "state": state})

    service = Logged(store, opts, on_line=lines.append)
    service.log = []
    return service


def drive(
    service: Any, store: Any, specs: list[JobSpec], gap_s: float, bound_s: float, label: str
) -> float:
    """Submit ``specs`` ``gap_s`` apart and step the service until all are done; returns
    the service loop's mean period (seconds per step, poll included); the longest step
    (a group's actors start inside it) goes to ``service.longest_step_s``."""
    pending = list(specs)
    t0 = time.monotonic()
    arrivals = [t0 + i * gap_s for i in range(len(pending))]
    steps = 0
    service.longest_step_s = 0.0
    try:
        while pending or store.jobs(("queued", "running", "stopping")):
            if time.monotonic() - t0 > bound_s:
                raise TimeoutError(f"{label}: not done in {bound_s:g} s")
            while pending and time.monotonic() >= arrivals[len(arrivals) - len(pending)]:
                store.submit(pending.pop(0))
            t = time.monotonic()
            service.step()
            service.longest_step_s = max(service.longest_step_s, time.monotonic() - t)
            steps += 1
            time.sleep(service.options.poll_s)
    finally:
        service.shutdown()
    return (time.monotonic() - t0) / max(steps, 1)


def _new_run(scheduler: str, label: str) -> tuple[Any, Any, list[str]]:
    from dynsched_ray.optimus import JobStore, ServiceOptions

    tmp = Path(tempfile.mkdtemp(prefix=f"optimus-{label}-"))
    store = JobStore(tmp / "jobs.sqlite")
    opts = ServiceOptions(
        scheduler=scheduler,
        interval_s=INTERVAL_S,
        restart_delay_s=RESTART_DELAY_S,
        checkpoint_root=str(tmp / "ck"),
        poll_s=POLL_S,
    )
    lines: list[str] = []
    return _logged_service(store, opts, lines), store, lines


def run_one(
    scheduler: str, seed: int, gap_s: float, bound_s: float, emulate_s: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One workload under one scheduler: its figures, and what it measured of each job."""
    service, store, _lines = _new_run(scheduler, f"{scheduler}-{seed}")
    period = drive(service, store, workload(seed, emulate_s), gap_s, bound_s, f"{scheduler} {seed}")
    rows = store.jobs()
    failed = [f"{r.name}: {r.error}" for r in rows if r.state != "finished"]
    jct = [r.ended - r.submitted for r in rows if r.ended is not None]
    run = sum(r.ended - r.started for r in rows if r.ended is not None and r.started)
    measured = measure_store(store, service.log)
    store.close()
    result = {
        "scheduler": scheduler,
        "seed": seed,
        "avg_jct_s": float(np.mean(jct)),
        "makespan_s": max(r.ended for r in rows if r.ended) - min(r.submitted for r in rows),
        "reallocations": service.reallocations,
        "reallocation_s": service.reallocation_s,
        "reallocation_overhead": service.reallocation_s / run if run else 0.0,
        "restarts": sum(r.restarts for r in rows),
        "decisions": service.decisions,
        "loop_period_s": period,
        "longest_loop_step_s": service.longest_step_s,
        "failed": failed,
    }
    return result, {"scheduler": scheduler, "seed": seed, "loop_period_s": period, **measured}


# ------------------------------------------------------------------ measuring the runs
def _runs(log: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The job's runs in order: start, workers, stop request (or None), end."""
    runs: list[dict[str, Any]] = []
    for e in log:
        if e["job"] != name:
            continue
        if e["ev"] == "start":
            runs.append({"start": e["t"], "workers": e["workers"], "stop": None, "end": None})
        elif runs and e["ev"] == "stop":
            runs[-1]["stop"] = e["t"]
        elif runs and e["ev"] == "end":
            runs[-1]["end"] = e["t"]
    return runs


def measure_job(
    reports: list[tuple[float, int, float]], runs: list[dict[str, Any]]
) -> dict[str, Any]:
    """What a job's reports and runs measured: steady seconds per step per worker count,
    its start-up cost, each restart's start-up cost and each stop's length (the
    service's events and the reports' wall-clock times).

    A run's first report is start-up, not speed. A run's start-up is its first report
    less one step after its placement (placement group, actors, torch import, rendezvous,
    restore): the first run's is the job's ``startup_s``, a run after a stop request is a
    re-allocation's (``reallocations_s``); a stop lasts from the request to the run's end
    (the simulated service loop stops a job for one tick instead)."""
    per_w: dict[int, list[float]] = {}
    firsts = []
    for run in runs:
        end = run["end"] if run["end"] is not None else math.inf
        mine = [r for r in reports if run["start"] <= r[0] <= end]
        firsts.append(mine[0][0] if mine else None)
        if len(mine) > 1 and mine[-1][1] > mine[0][1]:
            acc = per_w.setdefault(run["workers"], [0.0, 0.0])
            acc[0] += mine[-1][0] - mine[0][0]
            acc[1] += mine[-1][1] - mine[0][1]
    step_time = {w: t / n for w, (t, n) in per_w.items() if n >= MIN_SPEED_REPORTS}
    startups: list[float] = []
    reallocs: list[float] = []
    for i, run in enumerate(runs):
        got = per_w.get(run["workers"])
        st = step_time.get(run["workers"]) or (got[0] / got[1] if got else 0.0)
        if firsts[i] is None:
            continue
        startup = max(firsts[i] - run["start"] - st, 0.0)
        if i and runs[i - 1]["stop"] is not None:
            reallocs.append(startup)
        elif not startups and not reallocs:
            startups.append(startup)
    stops = [r["end"] - r["stop"] for r in runs if r["stop"] is not None and r["end"] is not None]
    return {
        "step_time_s": step_time,
        "steady_steps": {w: n for w, (_, n) in per_w.items()},
        "startup_s": startups[0] if startups else None,
        "reallocations_s": reallocs,
        "stops_s": stops,
        "steps": max((r[1] for r in reports), default=0),
        "loss_points": [[r[1], round(r[2], 7)] for r in reports],
    }


def finish_times(store: Any) -> dict[str, float]:
    """Per finished job: seconds from its last report to the service marking it ended (the
    script's exit and the service's poll, stalls included)."""
    out = {}
    for r in store.jobs(("finished",)):
        reports = store.reports(r.name)
        if reports and r.ended is not None:
            out[r.name] = max(r.ended - reports[-1][0], 0.0)
    return out


def measure_store(store: Any, log: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`measure_job` of every job of a run, with its spec and arrival."""
    rows = store.jobs()
    t0 = min(r.submitted for r in rows)
    finish = finish_times(store)
    jobs = []
    for r in rows:
        m = measure_job(store.reports(r.name), _runs(log, r.name))
        samples: dict[str, list[float]] = {}
        for w, _nodes, _batch, speed in store.speeds(r.name):
            samples.setdefault(str(w), []).append(speed)
        spec = r.spec
        target = spec.completion.value if spec.completion.kind == "target_metric" else None
        jobs.append(
            {
                "name": r.name,
                "kind": r.name.split("-")[0] if "-" in r.name else r.name,
                "arrival_s": r.submitted - t0,
                "real_jct_s": None if r.ended is None else r.ended - r.submitted,
                "batch_size": spec.batch_size,
                "workers": spec.workers,
                "max_workers": spec.max_workers,
                "target_loss": target,
                "resources": list(spec.resources),
                "speed_samples": samples,
                "finish_s": finish.get(r.name),
                **m,
            }
        )
    return {"jobs": jobs}


def profiling_pass(gap_s: float, bound_s: float, emulate_s: float) -> dict[str, Any]:
    """Seconds per step (and start-up) of each job type at 1..MAX_WORKERS workers, each
    measured by a short job at that size on the same cluster (fifo, all submitted at
    once: they run in waves)."""
    service, store, _lines = _new_run("fifo", "profiling")
    drive(service, store, profiling_jobs(emulate_s), 0.0, bound_s, "profiling pass")
    measured = measure_store(store, service.log)
    store.close()
    out: dict[str, Any] = {"step_time_s": {}, "startup_s": []}
    for job in measured["jobs"]:
        kind, w = job["name"].split("-")[1], int(job["name"].rsplit("w", 1)[1])
        st = job["step_time_s"].get(w)
        if st is not None:
            out["step_time_s"].setdefault(kind, {})[str(w)] = st
        if job["startup_s"] is not None:
            out["startup_s"].append(job["startup_s"])
    return out


def to_profile(
    job: dict[str, Any], run_reallocs: list[float], pass_: dict[str, Any], tick_s: float = 0.0
) -> dict[str, Any]:
    """A :class:`~dynsched_optimus.cluster.JobProfile` (as data) of one measured job, each
    value labelled with its source. Its re-allocation cost is its restarted runs' mean
    start-up plus its stops' mean length beyond the simulator's one-tick stop."""
    sources: dict[str, str] = {}
    step_time: dict[str, float] = {}
    for w in range(1, job["max_workers"] + 1):
        own = job["step_time_s"].get(w) or job["step_time_s"].get(str(w))
        if own is not None:
            step_time[str(w)] = own
            sources[f"step_time_s[{w}]"] = "measured, this run"
        else:
            step_time[str(w)] = pass_["step_time_s"][job["kind"]][str(w)]
            sources[f"step_time_s[{w}]"] = "measured, profiling pass"
    startup = job["startup_s"]
    sources["startup_s"] = "measured, this run"
    sources["speed_samples"] = "measured, the service's samples in this run"
    sources["finish_s"] = "measured, last report to the service marking it ended"
    if startup is None:  # it never reported a steady step: the profiling pass's mean
        startup = statistics.fmean(pass_["startup_s"])
        sources["startup_s"] = "measured, profiling pass (mean start-up)"
    stop = max(statistics.fmean(job["stops_s"]) - tick_s, 0.0) if job.get("stops_s") else 0.0
    if job["reallocations_s"]:
        realloc = statistics.fmean(job["reallocations_s"]) + stop
        sources["reallocation_s"] = "measured, this job's re-allocations in this run"
    elif run_reallocs:
        realloc = statistics.fmean(run_reallocs)
        sources["reallocation_s"] = "measured, mean of this run's re-allocations"
    else:
        realloc = startup
        sources["reallocation_s"] = "measured start-up of this job (no re-allocation in this run)"
    return {
        **{k: job[k] for k in ("name", "kind", "arrival_s", "steps", "batch_size", "workers")},
        **{k: job[k] for k in ("max_workers", "target_loss", "resources", "loss_points")},
        "speed_samples": job["speed_samples"],
        "step_time_s": step_time,
        "startup_s": startup,
        "reallocation_s": realloc,
        "finish_s": job.get("finish_s") or 0.0,
        "sources": sources,
    }


def fidelity(measured: dict[str, Any], pass_: dict[str, Any]) -> dict[str, Any]:
    """The simulator fed one run's profiles, under the run's scheduler: JCTs and residual."""
    from dynsched_optimus.cluster import ServiceTestbed, load_job_profiles, simulate_measured

    done = [j for j in measured["jobs"] if j["real_jct_s"] is not None and j["steps"] > 0]
    reallocs = [c for j in done for c in j["reallocations_s"]]
    stops = [c for j in done for c in j["stops_s"]]
    tick = measured["loop_period_s"]
    profiles = load_job_profiles([to_profile(j, reallocs, pass_, tick) for j in done])
    bed = ServiceTestbed(
        nodes=NODES,
        node_cpus=NODE_CPUS,
        node_gpus=NODE_GPUS,
        interval_s=INTERVAL_S,
        restart_delay_s=RESTART_DELAY_S,
        tick_s=measured["loop_period_s"],
    )
    sim = simulate_measured(profiles, measured["scheduler"], bed)
    real = {j["name"]: j["real_jct_s"] for j in done}
    real_avg = statistics.fmean(real.values())
    return {
        "scheduler": measured["scheduler"],
        "seed": measured["seed"],
        "real_avg_jct_s": real_avg,
        "sim_avg_jct_s": sim.avg_jct,
        "residual": (sim.avg_jct - real_avg) / real_avg,
        "excluded_unfinished": [j["name"] for j in measured["jobs"] if j not in done],
        "real_stops": len(stops),
        "sim_restarts": int(sum(sim.restarts.values())),
        "real_mean_startup_s": statistics.fmean(p.startup_s for p in profiles),
        "real_mean_restart_startup_s": statistics.fmean(reallocs) if reallocs else None,
        "real_mean_stop_s": statistics.fmean(stops) if stops else None,
        "sim_tick_s": measured["loop_period_s"],
        "sim_unfinished": list(sim.unfinished),
        "jobs": {n: {"real_jct_s": real[n], "sim_jct_s": sim.jct.get(n)} for n in real},
        "profiles": [p.to_dict() for p in profiles],
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


def _mean_sd(vals: list[float]) -> tuple[float, float]:
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean and standard deviation over seeds per scheduler."""
    out = {}
    for name in SCHEDULERS:
        mine = [r for r in runs if r["scheduler"] == name]
        if not mine:
            continue
        row: dict[str, float] = {"seeds": len(mine)}
        for key in ("avg_jct_s", "makespan_s", "reallocation_overhead", "reallocations"):
            row[key], row[key + "_sd"] = _mean_sd([float(r[key]) for r in mine])
        out[name] = row
    return out


#: the fidelity target of issue 30: |simulated - real| / real average JCT
TARGET = 0.15


def summarize_fidelity(fid: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scheduler: real and simulated average JCT (mean ± sd over seeds), the residual
    of the means, every seed's residual, and whether they are within :data:`TARGET`."""
    out = {}
    for name in SCHEDULERS:
        mine = [f for f in fid if f["scheduler"] == name]
        if not mine:
            continue
        real, real_sd = _mean_sd([f["real_avg_jct_s"] for f in mine])
        sim, sim_sd = _mean_sd([f["sim_avg_jct_s"] for f in mine])
        res = [f["residual"] for f in mine]
        out[name] = {
            "seeds": len(mine),
            "real_avg_jct_s": real,
            "real_avg_jct_s_sd": real_sd,
            "sim_avg_jct_s": sim,
            "sim_avg_jct_s_sd": sim_sd,
            "residual_of_means": (sim - real) / real,
            "residuals": res,
            "within_15pct": abs(sim - real) / real <= TARGET,
            "within_15pct_every_seed": all(abs(r) <= TARGET for r in res),
        }
    return out


def print_fidelity(summary: dict[str, dict[str, Any]]) -> None:
    """One line per scheduler."""
    for name, row in summary.items():
        seeds = ", ".join(f"{100 * r:+.1f} %" for r in row["residuals"])
        print(
            f"fidelity {name:<9} real {row['real_avg_jct_s']:6.1f} ± {row['real_avg_jct_s_sd']:4.1f} s"
            f"   sim {row['sim_avg_jct_s']:6.1f} ± {row['sim_avg_jct_s_sd']:4.1f} s   residual "
            f"{100 * row['residual_of_means']:+.1f} % (seeds: {seeds}) "
            f"{'within' if row['within_15pct'] else 'NOT within'} 15 %",
            flush=True,
        )


def summary_markdown(result: dict[str, Any], args: argparse.Namespace) -> str:
    """The results as a short markdown page (tables of the runs and of the fidelity)."""
    seeds = len({r["seed"] for r in result.get("runs", [])}) or args.seeds
    emulate = result.get("emulate_gpu_s_per_sample", args.emulate)
    lines = [
        "# optimus_ray_jobs: real jobs on Ray and the simulator's fidelity",
        "",
        f"`python benchmarks/optimus_ray_jobs.py --seeds {seeds}` (emulated GPU "
        f"{1000 * emulate:g} ms per sample; interval {INTERVAL_S:g} s, restart delay "
        f"{RESTART_DELAY_S:g} s; {NODES} nodes x {NODE_CPUS} CPUs, {NODE_GPUS} bookkeeping "
        "GPUs). Mean ± standard deviation over seeds.",
        "",
        "| scheduler | avg JCT (s) | makespan (s) | re-allocations | re-allocation overhead |",
        "|---|---|---|---|---|",
    ]
    for name, r in result.get("summary", {}).items():
        lines.append(
            f"| `{name}` | {r['avg_jct_s']:.1f} ± {r['avg_jct_s_sd']:.1f} | "
            f"{r['makespan_s']:.1f} ± {r['makespan_s_sd']:.1f} | {r['reallocations']:.1f} | "
            f"{100 * r['reallocation_overhead']:.1f} % ± {100 * r['reallocation_overhead_sd']:.1f} |"
        )
    lines += [
        "",
        "Simulation fidelity (the cluster simulator fed each run's measured job profiles, "
        "under the same scheduler; residual = (simulated - real) / real average JCT; "
        f"target |residual| <= {100 * TARGET:g} %):",
        "",
        "| scheduler | real avg JCT (s) | simulated (s) | residual of means | per seed | within 15 % |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in result.get("fidelity_summary", {}).items():
        seeds = ", ".join(f"{100 * x:+.1f} %" for x in r["residuals"])
        lines.append(
            f"| `{name}` | {r['real_avg_jct_s']:.1f} ± {r['real_avg_jct_s_sd']:.1f} | "
            f"{r['sim_avg_jct_s']:.1f} ± {r['sim_avg_jct_s_sd']:.1f} | "
            f"{100 * r['residual_of_means']:+.1f} % | {seeds} | "
            f"{'yes' if r['within_15pct'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def replay(path: str, stores: list[str] | None = None) -> dict[str, Any]:
    """The fidelity of saved measurements (``--profiles`` output), without Ray; ``stores``
    (the runs' job tables, in run order) add the jobs' ``finish_s`` where the
    measurements lack it."""
    from dynsched_ray.optimus import JobStore

    data = json.loads(Path(path).read_text())
    for run, db in zip(data["runs"], stores or [], strict=False):
        store = JobStore(db)
        finish = finish_times(store)
        store.close()
        for job in run["jobs"]:
            job.setdefault("finish_s", finish.get(job["name"]))
    fid = [fidelity(m, data["profiling_pass"]) for m in data["runs"]]
    return {"fidelity": fid, "fidelity_summary": summarize_fidelity(fid)}


def ray_part(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    """The profiling pass and the real runs; returns what they measured."""
    import ray

    measured: dict[str, Any] = {"emulate_gpu_s_per_sample": args.emulate, "runs": []}
    cluster = start_cluster()
    try:
        measured["profiling_pass"] = profiling_pass(0.0, args.bound, args.emulate)
        print("profiling pass:", json.dumps(measured["profiling_pass"]), flush=True)
        for seed in range(args.seeds):
            for name in args.schedulers.split(","):
                r, m = run_one(name, seed, args.gap, args.bound, args.emulate)
                result["runs"].append(r)
                measured["runs"].append(m)
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
    return measured


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--schedulers", default=",".join(SCHEDULERS))
    ap.add_argument("--gap", type=float, default=3.0, help="seconds between arrivals")
    ap.add_argument("--bound", type=float, default=900.0, help="seconds one run may take")
    ap.add_argument(
        "--emulate",
        type=float,
        default=EMULATE_S_PER_SAMPLE,
        help="emulated GPU seconds per sample (0: off)",
    )
    ap.add_argument("--decision-jobs", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5, help="timings of the decision part")
    ap.add_argument("--skip-ray", action="store_true", help="only the decision-time part")
    ap.add_argument("--skip-decision", action="store_true", help="only the Ray runs")
    ap.add_argument("--replay", help="a --profiles file: its fidelity only (no Ray)")
    ap.add_argument("--stores", help="with --replay: the runs' job tables, comma-separated")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "optimus_ray_jobs.json"))
    ap.add_argument(
        "--profiles",
        default=str(ROOT / "benchmarks" / "results" / "optimus_ray_jobs_profiles.json"),
        help="where the runs' measurements go",
    )
    ap.add_argument(
        "--summary",
        default=str(ROOT / "benchmarks" / "results" / "optimus_ray_jobs.md"),
        help="where the markdown summary goes",
    )
    args = ap.parse_args(argv)
    if args.replay:  # the fidelity of saved measurements, into --out and --summary
        rep = replay(args.replay, args.stores.split(",") if args.stores else None)
        print_fidelity(rep["fidelity_summary"])
        out = Path(args.out)
        result = json.loads(out.read_text()) if out.is_file() else {}
        result["fidelity"] = [
            {k: v for k, v in f.items() if k != "profiles"} for f in rep["fidelity"]
        ]
        result["fidelity_summary"] = rep["fidelity_summary"]
        out.write_text(json.dumps(result, indent=2))
        Path(args.summary).write_text(summary_markdown(result, args))
        return 0
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
        measured = ray_part(args, result)
        Path(args.profiles).parent.mkdir(parents=True, exist_ok=True)
        Path(args.profiles).write_text(json.dumps(measured))
        Path(args.out).write_text(json.dumps(result, indent=2))  # before the simulations
        fid = [fidelity(m, measured["profiling_pass"]) for m in measured["runs"]]
        result["fidelity"] = [{k: v for k, v in f.items() if k != "profiles"} for f in fid]
        result["fidelity_summary"] = summarize_fidelity(fid)
        result["emulate_gpu_s_per_sample"] = args.emulate
        print_fidelity(result["fidelity_summary"])
        Path(args.summary).write_text(summary_markdown(result, args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
