"""The Pollux baseline (``pollux``): goodput, speedup, batch choice, search, rules."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
from dynsched_optimus.cluster import (
    SCHEDULERS,
    BatchRange,
    ClusterSpec,
    ClusterState,
    NodeSpec,
    Placement,
    PolluxOptions,
    PolluxProblem,
    PolluxScheduler,
    SimConfig,
    Simulator,
    ThroughputParams,
    fit_throughput,
    genetic_search,
    goodput_grid,
    make_scheduler,
)
from dynsched_optimus.cluster._data import load_workload
from dynsched_optimus.cluster._pollux import _JobModel, iteration_time, restart_factor
from dynsched_optimus.cluster._run import gpu_jobs
from hypothesis import given
from hypothesis import strategies as st

#: a hand-made throughput model: compute 0.1 + 0.01 * micro-batch; all-reduce 0.05 s in
#: one node and 0.2 s across nodes (+0.01 / +0.02 per replica beyond two); no overlap
HAND = ThroughputParams(0.1, 0.01, 0.2, 0.02, 0.05, 0.01, 1.0)
#: batch 10..40, 5..10 samples per GPU micro-batch
RANGE = BatchRange(init_batch=10, max_batch=40, min_local=5, max_local=10)
#: gradient statistics sqr = var = 1: gain(M) = 2 / (10 / M + 1)
GRAD = (1.0, 1.0)


def test_iteration_time_hand_computed() -> None:
    # one GPU: compute only, 0.1 + 0.01 * 10
    assert iteration_time(HAND, 1, 1, 10, 0) == pytest.approx(0.2)
    # two nodes, four GPUs: compute 0.2 + all-reduce 0.2 + 0.02 * 2 (gamma 1: no overlap)
    assert iteration_time(HAND, 2, 4, 10, 0) == pytest.approx(0.44)
    # one accumulation step more: + one compute time
    assert iteration_time(HAND, 2, 4, 10, 1) == pytest.approx(0.64)
    # gamma 2: the optimizer step is the 2-norm of compute and all-reduce
    g2 = ThroughputParams(0.1, 0.01, 0.2, 0.02, 0.05, 0.01, 2.0)
    assert iteration_time(g2, 2, 4, 10, 0) == pytest.approx(math.hypot(0.2, 0.24))


def test_goodput_and_batch_choice_hand_computed() -> None:
    # candidates 10, 20, 40 (three geometric points)
    good, batch = goodput_grid(HAND, GRAD, RANGE, np.array([1, 1]), np.array([1, 2]), 3)
    # 1 GPU: 10 -> t 0.2, gain 1 -> 5.0; 20 -> 1 accumulation, t 0.4, gain 4/3 -> 3.33;
    # 40 -> 3 accumulations, t 0.8, gain 1.6 -> 2.0: the job picks 10
    assert good[0] == pytest.approx(5.0)
    assert batch[0] == 10
    # 2 GPUs in one node: 10 -> micro 5, t 0.15 + 0.05 = 0.2 -> 5.0; 20 -> micro 10,
    # t 0.25, gain 4/3 -> 5.333; 40 -> 1 accumulation, t 0.45, gain 1.6 -> 3.556: picks 20
    assert good[1] == pytest.approx(4.0 / 3.0 / 0.25)
    assert batch[1] == 20


def test_goodput_without_gradient_statistics_takes_a_batch_as_perfectly_efficient() -> None:
    good, batch = goodput_grid(HAND, None, RANGE, np.array([1]), np.array([2]), 3)
    # gain = M / 10: 10 -> 1 / 0.2 = 5; 20 -> 2 / 0.25 = 8; 40 -> 4 / 0.45 = 8.9
    assert batch[0] == 40
    assert good[0] == pytest.approx(4.0 / 0.45)


def test_goodput_is_zero_where_no_batch_is_allowed() -> None:
    # 9 GPUs need 45 samples at 5 per GPU, above the largest batch 40
    good, batch = goodput_grid(HAND, GRAD, RANGE, np.array([3]), np.array([9]), 3)
    assert good[0] == 0.0 and batch[0] == 0


class _StubJob:
    """The observation surface of a GPU job, with chosen values."""

    kind = "gpu"
    adaptive = True
    max_ps = 0
    worker_demand = np.array([4.0, 16.0, 1.0, 0.0])
    ps_demand = np.zeros(4)

    def __init__(self, name: str, *, submit: float = 0.0, seen: int = 1) -> None:
        self.name = name
        self.submit_time = submit
        self.batch_size = 10
        self.grad_stats: tuple[float, float] | None = GRAD
        self.step_samples = {(1, seen, 10): (0.2, 0.2)}
        self.placement: Placement | None = None
        self.num_restarts = 0
        self.attained_service = 0.0

    def batch_limits(self) -> tuple[int, int]:
        return RANGE.init_batch, RANGE.max_batch

    def local_limits(self) -> tuple[int, int]:
        return RANGE.min_local, RANGE.max_local

    def max_workers_for(self, batch_size: int | None) -> int:
        return (batch_size or self.batch_size) // RANGE.min_local


def _state(nodes: int, gpus: int) -> ClusterState:
    spec = ClusterSpec.homogeneous(nodes, NodeSpec(gpu=gpus))
    return ClusterState(spec, spec.capacity(), 60.0, 30.0)


def _with_hand_model(sched: PolluxScheduler, *jobs: _StubJob) -> None:
    for job in jobs:
        sched.models[job.name] = _JobModel(HAND, len(job.step_samples))


@pytest.mark.parametrize(
    ("baseline", "fair", "expected"),
    [
        # one GPU: goodput / 5.0
        ("one-gpu", 1, {(1, 1): 1.0, (1, 2): (16 / 3) / 5.0}),
        # fair share two GPUs on one node: goodput / 5.333
        ("fair-share", 2, {(1, 1): 5.0 / (16 / 3), (1, 2): 1.0}),
    ],
)
def test_speedup_hand_computed(baseline: str, fair: int, expected: dict) -> None:
    sched = PolluxScheduler(baseline=baseline, batch_candidates=3)
    job = _StubJob("a")
    _with_hand_model(sched, job)
    table, batches = sched.speedup_table(job, RANGE, 2, 2, fair)  # type: ignore[arg-type]
    for (n, r), value in expected.items():
        assert table[n, r] == pytest.approx(value)
    assert batches[1, 2] == 20


def test_speedup_before_any_measurement_is_linear_in_gpus() -> None:
    sched = PolluxScheduler()
    job = _StubJob("a")  # no model fitted: no call to schedule yet
    table, _ = sched.speedup_table(job, RANGE, 2, 4, 4)  # type: ignore[arg-type]
    assert table[1, 1:] == pytest.approx([0.25, 0.5, 0.75, 1.0])


def test_each_job_trains_with_its_best_batch_for_the_gpus_it_got() -> None:
    # one job alone on one node with two GPUs; it has run on one GPU, so it may get two
    sched = PolluxScheduler(batch_candidates=3, generations=20, population=20)
    job = _StubJob("a", submit=-600.0)
    _with_hand_model(sched, job)
    out = sched.schedule(0.0, [job], _state(1, 2))  # type: ignore[list-item]
    assert out["a"].workers == (2,)
    assert out["a"].batch_size == 20  # hand-computed above: 20 beats 10 and 40 on 2 GPUs


def test_exploration_caps_a_job_at_twice_the_gpus_it_ran_on() -> None:
    sched = PolluxScheduler()
    assert sched.max_replicas(_StubJob("a", seen=1), RANGE) == 2  # type: ignore[arg-type]
    assert sched.max_replicas(_StubJob("a", seen=3), RANGE) == 6  # type: ignore[arg-type]
    # the batch range caps it too: 40 // 5 = 8 GPUs
    assert sched.max_replicas(_StubJob("a", seen=8), RANGE) == 8  # type: ignore[arg-type]


def test_fit_recovers_a_known_model() -> None:
    truth = ThroughputParams(0.05, 0.004, 0.3, 0.01, 0.08, 0.005, 1.5)
    samples = {}
    for n, r, a in [(1, 1, 8), (1, 1, 32), (1, 2, 16), (1, 4, 16), (2, 4, 16), (2, 8, 32)]:
        x = truth.as_array()
        compute = x[0] + x[1] * a
        step = float(iteration_time(truth, n, r, a, 0))
        samples[(n, r, a)] = (compute, step)
    fit = fit_throughput(samples)
    for (n, r, a), (_, step) in samples.items():
        assert float(iteration_time(fit, n, r, a, 0)) == pytest.approx(step, rel=0.05)


def test_fit_with_one_gpu_only_is_optimistic_about_scaling() -> None:
    # nothing observed beyond one GPU: all-reduce fixed near zero, inter >= 1.1 x intra
    fit = fit_throughput({(1, 1, 16): (0.2, 0.2)})
    assert fit.alpha_n >= 1.1 * fit.alpha_r
    assert float(iteration_time(fit, 2, 8, 16, 0)) == pytest.approx(0.2, rel=1e-3)


def test_fit_rejects_bad_samples() -> None:
    with pytest.raises(ValueError, match="samples"):
        fit_throughput({})
    with pytest.raises(ValueError, match="samples"):
        fit_throughput({(1, 1, 8): (0.0, 0.1)})


# ---- the search ---------------------------------------------------------------------


@st.composite
def small_problems(draw: st.DrawFn) -> PolluxProblem:
    """2-3 jobs, 2 nodes of 2-3 GPUs, random speedups, caps, current rows, penalties."""
    jobs = draw(st.integers(2, 3))
    slots = draw(st.integers(2, 3))
    nodes = 2
    width = nodes * slots
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # speedups grow with replicas, a second node costs a random share
    per_r = np.cumsum(rng.uniform(0.2, 1.0, size=(jobs, width)), axis=1)
    speed = np.zeros((jobs, nodes + 1, width + 1))
    speed[:, 1, 1:] = per_r
    speed[:, 2, 1:] = per_r * rng.uniform(0.6, 1.0, size=(jobs, 1))
    cap = np.array([[32.0, 256.0, slots, 10.0]] * nodes)
    base = np.zeros((jobs, nodes), dtype=np.int64)
    free = [slots] * nodes
    for j in range(jobs):
        for n in range(nodes):
            take = int(rng.integers(0, free[n] + 1)) if rng.random() < 0.5 else 0
            base[j, n] = take
            free[n] -= take
    return PolluxProblem(
        speedup=speed,
        base=base,
        max_replicas=rng.integers(1, width + 1, size=jobs),
        demand=np.array([[4.0, 16.0, 1.0, 0.0]] * jobs),
        capacity=cap,
        restart_factor=rng.uniform(0.0, 1.0, size=jobs),
        p=float(draw(st.sampled_from([-1.0, 0.0, 1.0]))),
        scale=0.25,
        interference_avoidance=draw(st.booleans()),
    )


def _brute_force(problem: PolluxProblem) -> float:
    jobs, nodes = problem.base.shape
    slots = int(problem.per_node.max())
    cells = list(itertools.product(range(slots + 1), repeat=jobs * nodes))
    states = np.array(cells, dtype=np.int64).reshape(-1, jobs, nodes)
    ok = problem.feasible(states)
    return float(problem.value(states[ok]).max())


@given(small_problems())
def test_search_finds_the_brute_force_optimum(problem: PolluxProblem) -> None:
    # the published search size (population 100, 100 generations); smaller searches
    # stall in a local optimum on a few of these instances
    best, value, _ = genetic_search(
        problem, np.random.default_rng(0), population=100, generations=100
    )
    assert problem.feasible(best[None])[0]
    assert value == pytest.approx(float(problem.value(best[None])[0]))
    assert value == pytest.approx(_brute_force(problem), rel=1e-9, abs=1e-12)


@given(small_problems(), st.integers(0, 2**32 - 1))
def test_repair_always_returns_feasible_states(problem: PolluxProblem, seed: int) -> None:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 5, size=(16, *problem.base.shape))
    fixed = problem.repair(raw, rng)
    assert problem.feasible(fixed).all()
    assert np.all(fixed <= raw)  # repair only removes replicas


@given(small_problems(), st.integers(0, 2**32 - 1))
def test_no_node_ever_holds_two_distributed_jobs(problem: PolluxProblem, seed: int) -> None:
    import attrs

    problem = attrs.evolve(problem, interference_avoidance=True)
    rng = np.random.default_rng(seed)
    states = problem.repair(rng.integers(0, 5, size=(16, *problem.base.shape)), rng)
    states = problem.repair(problem.mutate(states, rng), rng)
    best, _, pop = genetic_search(problem, rng, population=16, generations=5, initial=states)
    for x in (*states, *pop, best):
        distributed = np.count_nonzero(x, axis=1) > 1
        assert ((x > 0) & distributed[:, None]).sum(axis=0).max(initial=0) <= 1


def test_restart_penalty_keeps_a_young_job_where_it_runs() -> None:
    # one node, two GPUs; job 0 holds both; job 1 waits. Sum of speedups (p = 1):
    # moving to one GPU each gives 1 + 1 = 2 > 1.9, unless job 0's restart costs it half
    speed = np.zeros((2, 2, 3))
    speed[0, 1, 1:] = [1.0, 1.9]
    speed[1, 1, 1:] = [1.0, 1.9]
    common = {
        "speedup": speed,
        "base": np.array([[2], [0]]),
        "max_replicas": np.array([2, 2]),
        "demand": np.array([[4.0, 16.0, 1.0, 0.0]] * 2),
        "capacity": np.array([[32.0, 256.0, 2.0, 10.0]]),
        "p": 1.0,
    }
    free = PolluxProblem(restart_factor=np.ones(2), **common)
    best, _, _ = genetic_search(free, np.random.default_rng(0), population=20, generations=20)
    assert best.tolist() == [[1], [1]]
    # job 0: 60 s old, restarted once: (60 - 30) / (60 + 30) = 1/3 of its speedup
    factor = restart_factor(np.array([60.0, 60.0]), np.array([1, 0]), 30.0)
    assert factor == pytest.approx([1 / 3, 2 / 3])
    penalised = PolluxProblem(restart_factor=factor, **common)
    best, _, _ = genetic_search(penalised, np.random.default_rng(0), population=20, generations=20)
    assert best.tolist() == [[2], [0]]


# ---- options, registration, a short simulation ---------------------------------------


def test_options_reject_bad_values_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"baseline='fair'.*fair-share"):
        PolluxOptions(baseline="fair")
    with pytest.raises(ValueError, match="population"):
        PolluxOptions(population=0)
    with pytest.raises(ValueError, match="explore"):
        PolluxOptions(explore=0.5)
    with pytest.raises(ValueError, match="unknown Pollux option"):
        PolluxScheduler(generation=3)


def test_registered_as_pollux() -> None:
    assert SCHEDULERS["pollux"] is PolluxScheduler
    sched = make_scheduler("pollux", p=0.0)
    assert isinstance(sched, PolluxScheduler) and sched.options.p == 0.0


def test_refuses_parameter_server_jobs() -> None:
    job = _StubJob("ps")
    job.max_ps = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="all-reduce GPU jobs only"):
        PolluxScheduler().schedule(0.0, [job], _state(1, 2))  # type: ignore[list-item]


class _Recorder(PolluxScheduler):
    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.rounds: list[dict[str, Placement]] = []

    def schedule(self, now, jobs, cluster):  # type: ignore[no-untyped-def]
        out = super().schedule(now, jobs, cluster)
        self.rounds.append(out)
        return out


def test_short_simulation_completes_within_the_rules(pollux_root) -> None:  # type: ignore[no-untyped-def]
    cfg = SimConfig(seed=0)
    jobs = gpu_jobs(load_workload("workload-1", root=pollux_root)[:6], cfg, pollux_root)
    sched = _Recorder(generations=15, population=30)
    res = Simulator(ClusterSpec.pollux(), jobs, sched, cfg).run()
    assert not res.unfinished and len(res.jct) == 6
    assert sched.decision_seconds and all(s >= 0 for s in sched.decision_seconds)
    grew = False
    for out in sched.rounds:
        rows = np.array([pl.workers for pl in out.values()]) if out else np.zeros((0, 16))
        distributed = np.count_nonzero(rows, axis=1) > 1
        assert ((rows > 0) & distributed[:, None]).sum(axis=0).max(initial=0) <= 1
        grew |= any(pl.num_workers > 1 for pl in out.values())
    assert grew  # jobs scale out beyond one GPU once they measured it
    # a job's batch changed with its allocation (job-side choice)
    assert res.batches


def test_docs_pollux_example_runs(pollux_root, capsys) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"
    text = doc.read_text()
    section = text[text.index("### `pollux`") :]
    block = section[section.index("```python\n") + 10 : section.index("```\n", 10)]
    exec(compile(block, str(doc), "exec"), {})
    assert re.search(
        r"pollux: \d+ s average JCT, \d\.\d{3} s per decision", capsys.readouterr().out
    )


def test_cli_simulates_with_pollux(tmp_path, pollux_root, capsys) -> None:  # type: ignore[no-untyped-def]
    import argparse

    from dynsched_optimus.cluster import cli

    csv = tmp_path / "three.csv"
    csv.write_text(
        "name,time,application,num_replicas,batch_size\n"
        "cifar10-0,0,cifar10,2,256\nncf-1,60,ncf,1,32768\nbert-2,120,bert,2,12\n"
    )
    parser = argparse.ArgumentParser()
    cli.add_subcommands(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(
        ["simulate", "--workload", str(csv), "--scheduler", "pollux", "--quiet"]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "scheduler pollux" in out and "avg_jct_s" in out


@given(st.integers(0, 2**32 - 1))
def test_fit_gradient_matches_finite_differences(seed: int) -> None:
    from dynsched_optimus.cluster._pollux import _fit_loss
    from scipy.optimize import approx_fprime

    rng = np.random.default_rng(seed)
    n = np.array([1, 1, 1, 2, 2, 4.0])
    r = np.array([1, 2, 4, 4, 8, 16.0])
    a = np.array([8, 16, 16, 32, 8, 4.0])
    log_c, log_s = rng.normal(-2, 0.3, 6), rng.normal(-1.5, 0.3, 6)
    x = np.concatenate([rng.uniform(0.01, 0.3, 6), [rng.uniform(1.0, 5.0)]])
    numeric = approx_fprime(x, lambda v: _fit_loss(v, n, r, a, log_c, log_s)[0], 1e-7)
    assert _fit_loss(x, n, r, a, log_c, log_s)[1] == pytest.approx(numeric, rel=1e-4, abs=1e-5)
