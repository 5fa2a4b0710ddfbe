"""Simulator invariants: conservation, no over-commit, interval independence."""

from __future__ import annotations

import numpy as np
import pytest
from dynsched_optimus.cluster import (
    SCHEDULERS,
    ClusterSpec,
    NodeSpec,
    OverCommitError,
    Placement,
    PSJob,
    PSJobOptions,
    PSLossCurve,
    SimConfig,
    Simulator,
    make_scheduler,
    paper_ps_workload,
)
from dynsched_optimus.cluster._run import PS_JOB_TYPES
from hypothesis import given, settings
from hypothesis import strategies as st


def _ps_job(name: str = "a", submit: float = 0.0, seed: int = 0) -> PSJob:
    return PSJob(
        name,
        submit,
        PS_JOB_TYPES["cnn-rand"],
        np.random.default_rng(seed),
        curve=PSLossCurve(2e-3, 1.0, 0.05, 100, loss_noise=0.0),
        options=PSJobOptions(speed_noise=0.0),
    )


class _Checking:
    """Wraps a scheduler and checks capacity on every decision."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[attr-defined]
        self.calls = 0
        if hasattr(inner, "prerun_configs"):
            self.prerun_configs = inner.prerun_configs  # type: ignore[attr-defined]
            self.prerun_s = inner.prerun_s  # type: ignore[attr-defined]

    def schedule(self, now, jobs, cluster):  # type: ignore[no-untyped-def]
        out = self.inner.schedule(now, jobs, cluster)  # type: ignore[attr-defined]
        used = np.zeros_like(cluster.capacity)
        by = {j.name: j for j in jobs}
        for name, pl in out.items():
            used += pl.usage(by[name].worker_demand, by[name].ps_demand)
        assert np.all(used <= cluster.capacity + 1e-9)
        self.calls += 1
        return out


@settings(deadline=None, max_examples=12)
@given(
    sched=st.sampled_from(sorted(SCHEDULERS)),
    n_jobs=st.integers(2, 6),
    seed=st.integers(0, 1000),
)
def test_no_overcommit_and_work_conserved(sched: str, n_jobs: int, seed: int) -> None:
    jobs = paper_ps_workload(n_jobs, seed=seed, arrival_window_s=1200.0, speed_noise=0.0)
    for j in jobs:  # keep the test fast: short jobs
        j.total_steps = min(j.total_steps, 3000)
    cluster = ClusterSpec.homogeneous(3, NodeSpec(cpu=32, mem_gb=128, gpu=0, net_gbps=10))
    wrapped = _Checking(make_scheduler(sched))
    res = Simulator(cluster, jobs, wrapped, SimConfig(seed=seed)).run()
    assert wrapped.calls > 0
    assert not res.unfinished
    for j in jobs:
        # every step was made: completed jobs reached exactly their total steps
        assert j.steps_done == pytest.approx(j.total_steps, rel=1e-9)
        assert j.completion_time is not None and j.completion_time >= j.submit_time
        # held time = pauses + training time
        assert j.held_seconds >= j.restart_seconds + j.startup_seconds - 1e-9
    assert 0.0 <= res.overhead_share <= 1.0
    assert 0.0 <= res.task_utilization <= 1.0 + 1e-9


def test_single_job_work_equals_speed_times_time() -> None:
    job = _ps_job()
    job.total_steps = 10_000
    # one node large enough for all tasks: no cross-server traffic
    cluster = ClusterSpec.homogeneous(2, NodeSpec(cpu=64, mem_gb=128, gpu=0))
    Simulator(cluster, [job], make_scheduler("fifo"), SimConfig(restart_delay_s=30)).run()
    w, p = job.requested_workers, job.requested_ps
    # FIFO keeps the first placement; training time = steps / true speed
    assert job.placement is None and job.completion_time is not None
    train = job.completion_time - job.submit_time - 30.0
    assert job.total_steps / train == pytest.approx(job.jtype.speed(p, w, 0.0, 1.0), rel=1e-9)


def test_overcommit_is_rejected() -> None:
    class Greedy:
        name = "bad"

        def schedule(self, now, jobs, cluster):  # type: ignore[no-untyped-def]
            n = cluster.spec.num_nodes
            return {j.name: Placement([7] + [0] * (n - 1), [7] + [0] * (n - 1)) for j in jobs}

    cluster = ClusterSpec.homogeneous(2, NodeSpec(cpu=32, mem_gb=128, gpu=0))
    with pytest.raises(OverCommitError, match="over-committed"):
        Simulator(cluster, [_ps_job()], Greedy(), SimConfig()).run()


@pytest.mark.parametrize("interval", [7.0, 30.0, 60.0, 90.0, 600.0])
def test_completion_independent_of_interval_when_alone(interval: float) -> None:
    job = _ps_job()
    job.total_steps = 20_000
    cluster = ClusterSpec.homogeneous(2, NodeSpec(cpu=32, mem_gb=128, gpu=0))
    Simulator(
        cluster, [job], make_scheduler("fifo"), SimConfig(interval_s=interval, restart_delay_s=30)
    ).run()
    ref = _ps_job()
    ref.total_steps = 20_000
    Simulator(cluster, [ref], make_scheduler("fifo"), SimConfig(interval_s=60.0)).run()
    # submitted at t=0 (an interval boundary): no rounding at all
    assert job.completion_time == pytest.approx(ref.completion_time, rel=1e-9)


def test_arrival_rounding_is_at_most_one_interval() -> None:
    cluster = ClusterSpec.homogeneous(2, NodeSpec(cpu=32, mem_gb=128, gpu=0))
    times = []
    for interval in (10.0, 60.0, 300.0):
        job = _ps_job(submit=125.0)
        job.total_steps = 5000
        Simulator(cluster, [job], make_scheduler("fifo"), SimConfig(interval_s=interval)).run()
        times.append((interval, job.completion_time - job.submit_time))
    base = min(t for _, t in times)
    for interval, t in times:
        assert base - 1e-9 <= t <= base + interval + 1e-9


def test_gpu_job_alone_interval_independent(profiles: dict) -> None:  # type: ignore[type-arg]
    from dynsched_optimus.cluster import GpuJob, GpuJobSpec

    out = []
    for interval in (20.0, 60.0, 180.0):
        spec = GpuJobSpec("c", 0.0, "cifar10", 4, 512)
        job = GpuJob(spec, profiles["cifar10"], np.random.default_rng(0))
        Simulator(
            ClusterSpec.pollux(2), [job], make_scheduler("fifo"), SimConfig(interval_s=interval)
        ).run()
        assert job.epochs_done == profiles["cifar10"].completion_epochs(512)
        out.append(job.completion_time)
    assert out[0] == pytest.approx(out[1], rel=1e-9) and out[1] == pytest.approx(out[2], rel=1e-9)


def test_deterministic_for_seed() -> None:
    cluster = ClusterSpec.homogeneous(3, NodeSpec(cpu=32, mem_gb=128, gpu=0))
    res = []
    for _ in range(2):
        jobs = paper_ps_workload(4, seed=3, arrival_window_s=600.0)
        for j in jobs:
            j.total_steps = min(j.total_steps, 2000)
        res.append(Simulator(cluster, jobs, make_scheduler("optimus"), SimConfig(seed=3)).run())
    assert res[0].jct == res[1].jct


_GPU_APPS = [("ncf", 1, 32768), ("cifar10", 6, 2048), ("bert", 4, 96), ("deepspeech2", 4, 160)]


@settings(deadline=None, max_examples=10)
@given(
    sched=st.sampled_from(sorted(SCHEDULERS)),
    picks=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1800)), min_size=2, max_size=5),
)
def test_gpu_jobs_complete_without_overcommit(
    profiles: dict,  # type: ignore[type-arg]
    sched: str,
    picks: list[tuple[int, int]],
) -> None:
    from dynsched_optimus.cluster import GpuJob, GpuJobSpec

    jobs = []
    for i, (a, t) in enumerate(picks):
        app, req, bsz = _GPU_APPS[a]
        spec = GpuJobSpec(f"{app}-{i}", float(t), app, req, bsz)
        jobs.append(GpuJob(spec, profiles[app], np.random.default_rng(i), speed_noise=0.02))
    wrapped = _Checking(make_scheduler(sched))
    res = Simulator(ClusterSpec.pollux(2), jobs, wrapped, SimConfig(seed=1)).run()
    assert not res.unfinished
    for j in jobs:
        # conservation: the job made exactly the progress its completion rule needs
        n_ep = j.profile.completion_epochs(j.batch_size)
        assert j.epochs_done == n_ep
        assert j.progress == pytest.approx(float(j.profile.epoch_progress[n_ep - 1]))
    assert 0.0 <= res.gpu_utilization <= 1.0 + 1e-9


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: PSLossCurve(1e-3, 1.0, 0.05, 0), "steps_per_epoch"),
        (lambda: PSLossCurve(1e-3, 1.0, 0.05, 100, delta_conv=0.0), "delta_conv"),
        (lambda: PSJobOptions(requested_ps=-1), "requested_ps"),
        (lambda: PSJobOptions(speed_noise=-1.0), "speed_noise"),
        (lambda: attrs_evolve_type(batch=0), "batch"),
    ],
)
def test_ps_job_records_name_the_bad_field(build: object, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        build()  # type: ignore[operator]


def attrs_evolve_type(**changes: object) -> object:
    import attrs

    return attrs.evolve(PS_JOB_TYPES["cnn-rand"], **changes)


def test_ps_job_type_is_a_value_record() -> None:
    import attrs

    jt = PS_JOB_TYPES["cnn-rand"]
    again = attrs.evolve(jt)
    assert again == jt and hash(again) == hash(jt)
    assert again.step_time(2, 4, 0.5, 1.2) == jt.step_time(2, 4, 0.5, 1.2)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        jt.batch = 1  # type: ignore[misc]
