"""Simulated jobs from measured profiles (issue 30's fidelity instrument): a job replays its
profile, the loader refuses bad profiles by field, and the service's decision loop in the
simulator gives the JCTs computed by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dynsched_optimus import JobPlacement
from dynsched_optimus.cluster import (
    ClusterSpec,
    ClusterState,
    JobProfile,
    MeasuredJob,
    NodeSpec,
    Placement,
    ServiceLoop,
    ServiceTestbed,
    SimConfig,
    Simulator,
    load_job_profiles,
    simulate_measured,
)
from dynsched_optimus.jobs import MIN_SPEED_REPORTS, Decision, bucket_loss_points, make_decider
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

TICK = 0.5


def _profile(**kw: Any) -> JobProfile:
    base: dict[str, Any] = {
        "name": "a",
        "arrival_s": 0.0,
        "steps": 100,
        "step_time_s": {1: 0.2, 2: 0.1},
        "startup_s": 2.0,
        "reallocation_s": 4.0,
        "workers": 1,
        "max_workers": 2,
        "resources": (0.25, 1.0),
        "target_loss": 0.01,
        "loss_points": [(k, 1.0 / k) for k in range(1, 101)],
    }
    return JobProfile(**{**base, **kw})


def _bed(gpus: int = 3, interval_s: float = 5.0) -> ServiceTestbed:
    return ServiceTestbed(
        nodes=1, node_cpus=2.0, node_gpus=gpus, interval_s=interval_s, tick_s=TICK
    )


@settings(deadline=None)
@given(
    w=st.integers(1, 4),
    steps=st.integers(1, 400),
    step_ms=st.integers(10, 500),
    startup=st.floats(0.0, 20.0),
    arrival_ticks=st.integers(0, 40),
    finish=st.sampled_from([0.0, 0.3, 1.7]),
)
def test_a_job_alone_finishes_at_arrival_plus_startup_plus_its_steps(
    w: int, steps: int, step_ms: int, startup: float, arrival_ticks: int, finish: float
) -> None:
    st_w = step_ms / 1000.0
    times = {k: st_w * w / k for k in range(1, w + 1)}  # only step_time_s[w] may matter
    prof = _profile(
        arrival_s=arrival_ticks * TICK,
        steps=steps,
        step_time_s=times,
        startup_s=startup,
        workers=w,
        max_workers=w,
        loss_points=(),
        finish_s=finish,
    )
    res = simulate_measured([prof], "fifo", _bed(gpus=4))
    assert res.jct["a"] == pytest.approx(startup + steps * st_w + finish, rel=1e-9, abs=1e-9)
    assert res.restarts["a"] == 0 and not res.unfinished


class _Scripted:
    """A scheduler giving the job 1 worker before ``switch_s`` and 2 after."""

    name = "scripted"

    def __init__(self, switch_s: float) -> None:
        self.switch_s = switch_s

    def schedule(self, now: float, jobs: Any, cluster: ClusterState) -> dict[str, Placement]:
        w = 1 if now < self.switch_s else 2
        return {j.name: Placement((w,), (0,)) for j in jobs}


def test_a_reallocation_pauses_the_job_for_its_measured_cost() -> None:
    job = MeasuredJob(_profile())
    cluster = ClusterSpec.homogeneous(1, NodeSpec(cpu=2, mem_gb=0, gpu=2, net_gbps=0))
    Simulator(cluster, [job], _Scripted(5.0), SimConfig(interval_s=TICK)).run()
    # start-up 2 s, 3 s at 0.2 s/step (15 steps); at 5 s: 4 s re-allocation, then 85
    # steps at 0.1 s/step
    assert job.completion_time == pytest.approx(5.0 + 4.0 + 8.5)
    assert job.num_restarts == 1
    assert job.startup_seconds == pytest.approx(2.0)
    assert job.restart_seconds == pytest.approx(4.0)


def test_fifo_over_three_measured_jobs_gives_the_hand_computed_jcts() -> None:
    a = _profile(name="a", workers=2, startup_s=2.0)  # 2 + 100 x 0.1: ends at 12
    b = _profile(name="b", arrival_s=1.0, steps=50, workers=2, startup_s=1.0)
    c = _profile(name="c", arrival_s=2.0, steps=20, startup_s=1.5)
    res = simulate_measured([a, b, c], "fifo", _bed(gpus=3))
    # b (2 workers) does not fit beside a on 3 GPUs and FIFO does not let c pass it;
    # the service decides again when a ends (12 s): b and c start together
    assert res.jct["a"] == pytest.approx(12.0)
    assert res.jct["b"] == pytest.approx(12.0 + 1.0 + 50 * 0.1 - 1.0)
    assert res.jct["c"] == pytest.approx(12.0 + 1.5 + 20 * 0.2 - 2.0)
    assert res.allocations["b"] == [(12.0, 2, 0)] and res.allocations["c"] == [(12.0, 1, 0)]


def test_an_arrival_after_an_idle_gap_waits_for_the_services_next_periodic_decision() -> None:
    a = _profile(name="a", workers=2, startup_s=2.0)  # ends at 12: a decision then
    d = _profile(name="d", arrival_s=20.2, steps=10, startup_s=0.0)
    res = simulate_measured([a, d], "fifo", _bed(gpus=3))
    # decisions at 12, 17 (empty) and 22: d starts at 22
    assert res.allocations["d"] == [(22.0, 1, 0)]
    assert res.jct["d"] == pytest.approx(22.0 + 10 * 0.2 - 20.2)


def test_arrivals_wait_for_the_interval_while_jobs_run() -> None:
    a = _profile(name="a", steps=200)
    b = _profile(name="b", arrival_s=1.0, steps=10)
    res = simulate_measured([a, b], "drf", _bed(gpus=3, interval_s=5.0))
    assert res.allocations["b"][0][0] == 5.0


def test_a_resize_stops_the_job_and_the_next_decision_restarts_it() -> None:
    """As in the service: the decision that changes a running job's workers stops it; the
    decision its ended run triggers (the next call) places it, after which it pays its
    re-allocation cost."""
    seen: list[tuple[float, JobPlacement | None]] = []

    def decider(now: float, obs: Any, cap: Any, delay: float) -> Decision:
        seen.append((now, obs[0].placement))
        w = 1 if now < 5.0 else 2
        return Decision({"a": JobPlacement("a", (0,), (0,), (w,))})

    job = MeasuredJob(_profile())
    loop = ServiceLoop("fifo", interval_s=5.0, decider=decider)
    cluster = ClusterSpec.homogeneous(1, NodeSpec(cpu=2, mem_gb=0, gpu=2, net_gbps=0))
    res = Simulator(cluster, [job], loop, SimConfig(interval_s=TICK)).run()
    # 0: 1 worker, start-up 2 s, 15 steps by 5 s; 5: stopped; 5.5: 2 workers, 4 s
    # re-allocation, 85 steps at 0.1 s; the interval counts from the last decision
    assert [t for t, _ in seen] == [0.0, 5.0, 5.5, 10.5, 15.5]
    assert seen[2][1] is None  # the stopped job is observed waiting
    assert res.allocations["a"] == [(0.0, 1, 0), (5.0, 0, 0), (5.5, 2, 0)]
    assert job.completion_time == pytest.approx(5.5 + 4.0 + 8.5)
    assert res.restarts["a"] == 1


@pytest.mark.parametrize("scheduler", ["optimus+", "optimus", "fifo", "drf"])
def test_the_loop_decides_with_the_services_decider(scheduler: str) -> None:
    """Every decision the loop makes is the service's decider on the jobs' records."""
    calls: list[tuple[float, dict[str, Any]]] = []
    real = make_decider(scheduler)

    def spy(now: float, obs: Any, cap: Any, delay: float) -> Any:
        dec = real(now, obs, cap, delay)
        again = make_decider(scheduler)  # a fresh policy must agree on the first round
        if not calls:
            assert dict(again(now, obs, cap, delay).placements) == dict(dec.placements)
        assert cap.shape == (1, 2) and delay == 5.0
        calls.append((now, dict(dec.placements)))
        return dec

    jobs = [
        MeasuredJob(_profile(name=f"j{i}", arrival_s=float(i), workers=1 + i % 2)) for i in range(3)
    ]
    loop = ServiceLoop(scheduler, interval_s=5.0, restart_delay_s=5.0, decider=spy)
    cluster = ClusterSpec.homogeneous(1, NodeSpec(cpu=2, mem_gb=0, gpu=4, net_gbps=0))
    res = Simulator(cluster, jobs, loop, SimConfig(interval_s=TICK)).run()
    assert not res.unfinished and calls[0][0] == 0.0
    assert loop.decisions == len(calls)


# --------------------------------------------------------------------------- loader
def _data(**kw: Any) -> dict[str, Any]:
    d = _profile().to_dict()
    d.update(kw)
    return d


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"steps": 0}, "'steps' must be an integer >= 1"),
        ({"steps": 2.5}, "'steps' must be an integer >= 1"),
        ({"arrival_s": -1}, "'arrival_s' must be a finite number >= 0"),
        ({"startup_s": float("nan")}, "'startup_s' must be a finite number"),
        ({"finish_s": -0.1}, "'finish_s' must be a finite number >= 0"),
        ({"reallocation_s": "5"}, "'reallocation_s' must be a finite number"),
        ({"step_time_s": {"1": 0.2}}, "'step_time_s' must be measured at every worker count 1..2"),
        ({"step_time_s": {"1": 0.2, "2": 0}}, "'step_time_s[2]' must be a finite number > 0"),
        ({"step_time_s": {"x": 0.2}}, "'step_time_s' must be keyed by worker counts"),
        ({"loss_points": [[1, float("inf")]]}, "'loss_points[0] loss' must be a finite number"),
        ({"loss_points": [[1, 2, 3]]}, "'loss_points[0]' must be a [step, loss] pair"),
        ({"resources": [1.0]}, "'resources' must be [CPU, GPU] per worker"),
        ({"workers": 3}, "'max_workers' must be >= workers (3)"),
        ({"target_loss": -0.5}, "'target_loss' must be a finite number >= 0"),
        ({"sources": {"steps": 1}}, "'sources' must be a mapping"),
        ({"name": "a b"}, "'name' must be non-empty letters"),
        ({"speed": 1}, "unknown field(s) ['speed']"),
        ({"speed_samples": {"1": [0.0]}}, "'speed_samples[1][0]' must be a finite number > 0"),
        ({"speed_samples": {"1": 3.0}}, "'speed_samples[1]' must be a list of steps/s"),
        ({"speed_samples": [1.0]}, "'speed_samples' must be a mapping"),
    ],
)
def test_the_loader_names_the_bad_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError) as err:
        load_job_profiles({"jobs": [_data(), _data(**{"name": "b", **change})]})
    msg = str(err.value)
    assert msg.startswith("job profile 1 (")
    assert field in msg
    assert "\n" not in msg


def test_the_loader_names_a_missing_field_and_bad_containers(tmp_path: Path) -> None:
    d = _data()
    del d["steps"]
    with pytest.raises(ValueError, match=r"job profile 0 \('a'\): field 'steps' is required"):
        load_job_profiles([d])
    with pytest.raises(ValueError, match="field 'name' must be unique"):
        load_job_profiles([_data(), _data()])
    with pytest.raises(ValueError, match="under 'jobs'"):
        load_job_profiles({"profiles": []})
    with pytest.raises(ValueError, match="job profile 0: must be a mapping"):
        load_job_profiles([3])
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"jobs": [_data(), _data(name="b")]}))
    assert [p.name for p in load_job_profiles(path)] == ["a", "b"]


@given(
    steps=st.integers(1, 1000),
    times=st.lists(st.floats(1e-3, 10.0), min_size=1, max_size=4),
    points=st.lists(st.tuples(st.integers(0, 1000), st.floats(-10, 10)), max_size=20),
    target=st.one_of(st.none(), st.floats(0.0, 5.0)),
)
def test_profiles_round_trip_through_json(
    steps: int, times: list[float], points: list[tuple[int, float]], target: float | None
) -> None:
    prof = _profile(
        steps=steps,
        step_time_s=dict(enumerate(times, 1)),
        max_workers=len(times),
        loss_points=points,
        target_loss=target,
        sources={"steps": "measured"},
        speed_samples={1: tuple(1.0 / t for t in times)},
    )
    back = load_job_profiles(json.loads(json.dumps({"jobs": [prof.to_dict()]})))
    assert back == [prof]
    assert prof.completion.kind == ("steps" if target is None else "target_metric")


# ------------------------------------------------------------------- state machine
class MeasuredJobMachine(RuleBasedStateMachine):
    """A measured job under arbitrary placements and runs of time, against a model: its
    steps are the training seconds over the step time of each placement, every placement
    change pauses it (start-up first, re-allocation after), it reveals exactly the loss
    points it has passed, and one throughput sample per run of enough steady steps."""

    def __init__(self) -> None:
        super().__init__()
        self.prof = _profile(
            steps=60,
            step_time_s={1: 0.3, 2: 0.2, 3: 0.1},
            max_workers=3,
            startup_s=1.0,
            reallocation_s=2.5,
            loss_points=[(k, 1.0 / k) for k in range(1, 61, 3)],
        )
        self.job = MeasuredJob(self.prof)
        self.now = 0.0
        self.steps = 0.0
        self.pause = 0.0
        self.placed = False
        self.run_steps = 0.0

    @precondition(lambda self: not self.job.done)
    @rule(w=st.integers(1, 3))
    def place(self, w: int) -> None:
        new = Placement((w,), (0,))
        if self.job.placement is not None and new.same_tasks(self.job.placement):
            return
        self.pause = self.job.pause_s(0.0)
        assert self.pause == (self.prof.reallocation_s if self.placed else self.prof.startup_s)
        self.job.placement, self.job.restart_left = new, self.pause
        self.job.pause_is_restart = self.placed
        if self.job.start_time is None:
            self.job.start_time = self.now
        self.placed = True
        self.run_steps = 0.0

    @precondition(lambda self: not self.job.done and self.job.placement is not None)
    @rule(seconds=st.sampled_from([0.25, 0.5, 1.0, 3.0]))
    def advance(self, seconds: float) -> None:
        assert self.job.placement is not None
        st_w = self.prof.step_time_s[self.job.placement.num_workers]
        pause = min(self.pause, seconds)
        self.pause -= pause
        train = min(seconds - pause, (self.prof.steps - self.steps) * st_w)
        self.steps += train / st_w
        used = self.job.advance(seconds, self.now)
        assert used == pytest.approx(pause + train)
        self.now += seconds

    @precondition(lambda self: not self.job.done)
    @rule()
    def stop(self) -> None:
        self.job.placement = None

    @invariant()
    def steps_follow_the_model(self) -> None:
        assert self.job.steps_done == pytest.approx(min(self.steps, self.prof.steps), abs=1e-6)
        assert self.job.done == (self.steps >= self.prof.steps - 1e-9)

    @invariant()
    def it_reveals_the_points_it_passed(self) -> None:
        want = [p for p in self.prof.loss_points if p[0] <= self.job.steps_done + 1e-9]
        assert self.job.loss_points == want
        assert self.job.record().loss_points == bucket_loss_points(want)

    @invariant()
    def its_samples_are_measured_speeds(self) -> None:
        for key, samples in self.job.speed_samples.items():
            assert samples == [1.0 / self.prof.step_time_s[key[0]]] * len(samples)
            assert key[1:] == (0, 1, 64.0)
        if self.job.speed_samples:
            assert self.job.steps_done >= MIN_SPEED_REPORTS


MeasuredJobMachine.TestCase.settings = settings(deadline=None, stateful_step_count=30)
test_measured_job_machine = MeasuredJobMachine.TestCase


def test_the_scheduler_is_shown_the_measured_samples_in_order() -> None:
    """One sample per 5 steady steps (as the service samples): the real run's samples at
    that worker count in order, then the last one again."""
    job = MeasuredJob(_profile(workers=2, speed_samples={2: [9.0, 11.0, 10.5]}))
    cluster = ClusterSpec.homogeneous(1, NodeSpec(cpu=2, mem_gb=0, gpu=2, net_gbps=0))
    sim = Simulator(cluster, [job], _Scripted(0.0), SimConfig(interval_s=1.0, max_time_s=7.0))
    sim.run()
    # start-up 2 s; from then 10 steps per 1-s tick over 5 ticks: 50 steps, the run's
    # first not steady, so 49 steady steps make 9 samples
    (samples,) = job.speed_samples.values()
    assert samples == [9.0, 11.0] + [10.5] * 7


def test_the_record_is_what_the_service_would_hold() -> None:
    job = MeasuredJob(_profile(workers=2))
    cluster = ClusterSpec.homogeneous(1, NodeSpec(cpu=2, mem_gb=0, gpu=2, net_gbps=0))
    sim = Simulator(cluster, [job], _Scripted(0.0), SimConfig(interval_s=TICK, max_time_s=4.0))
    sim.run()
    rec = job.record()
    assert rec.iterations_done == np.floor(job.steps_done)
    assert rec.spec.completion.kind == "target_metric" and rec.spec.max_workers == 2
    assert rec.throughput and all(k[:2] == (2, 0) for k in rec.throughput)


def test_the_docs_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The example of docs/cluster.md's measured-jobs section runs and prints each
    scheduler's figures."""
    doc = Path(__file__).resolve().parents[1] / "docs" / "cluster.md"
    section = doc.read_text().split("### Jobs measured on a real run", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(block, str(doc), "exec"), {})
    out = capsys.readouterr().out
    for name in ("fifo", "drf", "optimus", "optimus+"):
        assert f"{name:<9} avg JCT" in out
