"""optimus+ specifics: fewer restarts than Optimus, no oracle access, hedged estimates."""

from __future__ import annotations

import numpy as np
from dynsched_optimus.cluster import (
    ClusterSpec,
    NodeSpec,
    OptimusScheduler,
    SimConfig,
    Simulator,
    make_scheduler,
    paper_ps_workload,
)


def _run(name: str, seed: int) -> tuple[int, float]:
    jobs = paper_ps_workload(6, seed=seed, arrival_window_s=1800.0)
    for j in jobs:
        j.total_steps = min(j.total_steps, 20_000)
    cluster = ClusterSpec.homogeneous(4, NodeSpec(cpu=32, mem_gb=128, gpu=0))
    res = Simulator(cluster, jobs, make_scheduler(name), SimConfig(seed=seed)).run()
    return sum(res.restarts.values()), res.overhead_share


def test_restart_aware_allocation_restarts_less() -> None:
    plus = [_run("optimus+", s) for s in (0, 1)]
    base = [_run("optimus", s) for s in (0, 1)]
    assert sum(r for r, _ in plus) < sum(r for r, _ in base)
    assert sum(o for _, o in plus) < sum(o for _, o in base)


def test_interval_is_hedged_low_end() -> None:
    jobs = paper_ps_workload(1, seed=4)
    job = jobs[0]
    rng = np.random.default_rng(0)
    for e in range(1, 15):
        k = e * job.steps_per_epoch
        job.loss_points.append((float(k), job.true_loss(k) * (1 + 0.03 * rng.standard_normal())))
    job.steps_done = float(14 * job.steps_per_epoch)
    job.epochs_done = 14
    est, lo, hi, fitted = OptimusScheduler(plus=True).remaining_steps(job)
    assert fitted and lo <= est <= hi
    est_paper, lo_p, hi_p, _ = OptimusScheduler().remaining_steps(job)
    assert lo_p == est_paper == hi_p  # the paper's Optimus has no interval
