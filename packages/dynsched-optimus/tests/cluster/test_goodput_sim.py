"""Batch-size adaptation in the cluster simulator: what a GPU job reports for goodput,
what the simulator accepts, and ``optimus+`` adapting batches on a Pollux workload."""

from __future__ import annotations

import numpy as np
import pytest
from dynsched_optimus.cluster import (
    ClusterSpec,
    ClusterState,
    GpuJob,
    GpuJobSpec,
    OverCommitError,
    Placement,
    SimConfig,
    Simulator,
    gpu_jobs,
    load_workload,
    make_scheduler,
)
from dynsched_optimus.cluster._schedulers import observe
from dynsched_optimus.scheduler import AdaptiveBatch


def _job(profiles, app: str = "cifar10", batch: int = 512, replicas: int = 2) -> GpuJob:  # type: ignore[no-untyped-def]
    spec = GpuJobSpec(f"{app}-0", 0.0, app, replicas, batch)
    return GpuJob(spec, profiles[app], np.random.default_rng(0), completion="epochs")


def _one_node(job: GpuJob, gpus: int, batch: int | None = None) -> Placement:
    return Placement([gpus] + [0] * 15, [0] * 16, batch_size=batch)


class _Fixed:
    """A scheduler that always returns one placement (to drive the simulator's checks)."""

    name = "fixed"

    def __init__(self, placement: Placement) -> None:
        self.placement = placement

    def schedule(self, now, jobs, cluster: ClusterState):  # type: ignore[no-untyped-def]
        return {j.name: self.placement for j in jobs}


def test_a_gpu_job_reports_what_goodput_needs(profiles) -> None:  # type: ignore[no-untyped-def]
    job = _job(profiles)
    obs = observe(job)
    ab = obs.adaptive_batch
    assert isinstance(ab, AdaptiveBatch)
    prof = profiles["cifar10"]
    assert (ab.init_batch, ab.max_batch) == (prof.init_batch_size, prof.max_batch_size)
    assert (ab.min_local, ab.max_local) == (prof.min_local_bsz, prof.max_local_bsz)
    assert not ab.has_stats and ab.progress == 0.0 and ab.progress_points == ()
    assert ab.progress_per_epoch * prof.max_epochs == pytest.approx(prof.epoch_progress[-1])
    # run it for a while: statistics of the epoch being trained, progress points per epoch
    job.placement = _one_node(job, 2)
    job.advance(3600.0, 0.0)
    obs = observe(job)
    ab = obs.adaptive_batch
    assert ab is not None and ab.has_stats
    assert (ab.grad_sqr, ab.grad_var) == prof.grad_stats(
        job.effective_batch(2), min(job.epochs_done, prof.max_epochs - 1)
    )
    assert ab.progress == pytest.approx(job.progress) and ab.progress > 0
    assert len(ab.progress_points) == len(obs.loss_points) == job.epochs_done >= 1
    assert [p[1] for p in ab.progress_points] == [p[1] for p in obs.loss_points]
    # throughput is keyed by the batch it was measured at
    assert set(obs.throughput) == {(2, 0, 1, 512.0)}


def test_ncf_keeps_its_batch_as_in_the_pollux_artifact(profiles) -> None:  # type: ignore[no-untyped-def]
    job = _job(profiles, "ncf", 32768, 1)
    assert observe(job).adaptive_batch is None
    with pytest.raises(ValueError, match="fixed"):
        job.set_batch_size(1024)


def test_set_batch_size_checks_the_range_and_moves_the_gpu_limit(profiles) -> None:  # type: ignore[no-untyped-def]
    job = _job(profiles, batch=256)
    prof = profiles["cifar10"]
    assert job.max_workers == 256 // prof.min_local_bsz
    job.set_batch_size(4096)
    assert job.batch_size == 4096 and job.max_workers == 4096 // prof.min_local_bsz
    with pytest.raises(ValueError, match="outside the allowed range"):
        job.set_batch_size(prof.max_batch_size * 2)
    with pytest.raises(ValueError, match="outside the allowed range"):
        job.set_batch_size(prof.init_batch_size - 1)


@pytest.mark.parametrize(
    ("batch", "gpus", "match"),
    [
        (10**6, 2, "outside the allowed range"),
        (None, 16, "exceed the job's limits"),  # 16 GPUs need a larger batch than 256
    ],
)
def test_the_simulator_refuses_batches_and_gpu_counts_a_job_cannot_run(  # type: ignore[no-untyped-def]
    profiles, batch: int | None, gpus: int, match: str
) -> None:
    job = _job(profiles, batch=256)
    pl = Placement([4, 4, 4, 4] + [0] * 12, [0] * 16, batch_size=batch)
    if gpus == 2:
        pl = Placement([2] + [0] * 15, [0] * 16, batch_size=batch)
    sim = Simulator(ClusterSpec.pollux(), [job], _Fixed(pl), SimConfig())
    with pytest.raises(OverCommitError, match=match):
        sim.run()


def test_the_simulator_applies_a_batch_without_a_restart(profiles) -> None:  # type: ignore[no-untyped-def]
    job = _job(profiles, batch=256)
    plan = [_one_node(job, 2), _one_node(job, 2, 1024), _one_node(job, 4, 1024)]

    class _Plan:
        name = "plan"

        def __init__(self) -> None:
            self.i = 0

        def schedule(self, now, jobs, cluster):  # type: ignore[no-untyped-def]
            pl = plan[min(self.i, len(plan) - 1)]
            self.i += 1
            return {j.name: pl for j in jobs}

    res = Simulator(ClusterSpec.pollux(), [job], _Plan(), SimConfig(completion="epochs")).run()
    assert not res.unfinished
    assert job.batch_size == 1024
    assert res.restarts[job.name] == 1  # 2 -> 4 GPUs; the batch change alone is free
    assert {k[3] for k in job.speed_samples} == {256, 1024}
    # the batch history: the submitted batch, then the change at the second round
    assert res.batches[job.name] == [(0.0, 256), (60.0, 1024)]


@pytest.mark.parametrize("completion", ["epochs", "target"])
def test_optimus_plus_adapts_batches_and_beats_its_fixed_batch_ablation(completion: str) -> None:
    """The first 40 jobs of Pollux workload 1: ``optimus+`` (goodput) changes batches,
    finishes every job and has a lower average JCT than with every batch fixed."""
    cfg = SimConfig(seed=0, completion=completion)
    results = {}
    for name in ("optimus+", "optimus+fixed-batch"):
        jobs = gpu_jobs(load_workload("workload-1")[:40], cfg)
        sched = make_scheduler(name)
        res = Simulator(ClusterSpec.pollux(), jobs, sched, cfg).run()
        assert not res.unfinished
        results[name] = res
        changed = [j for j in jobs if j.batch_size != j.spec.batch_size]
        if name == "optimus+":
            assert len(changed) >= 10
            assert all(j.adaptive for j in changed)
            assert {j.name for j in changed} <= set(res.batches)
            for j in changed:  # the history starts at the submitted batch, ends at the last
                assert res.batches[j.name][0] == (j.submit_time, j.spec.batch_size)
                assert res.batches[j.name][-1][1] == j.batch_size
        else:
            assert changed == [] and res.batches == {}
    assert results["optimus+"].avg_jct < 0.95 * results["optimus+fixed-batch"].avg_jct
