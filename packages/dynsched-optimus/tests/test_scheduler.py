"""The composed Optimus scheduler: each strategy alone, and the whole policy driven by a
minimal host that is not the simulator (observation records built by hand)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dynsched_optimus import JobPlacement, OptimusError
from dynsched_optimus.scheduler import (
    MAX_REMAINING_FACTOR,
    CompletionRule,
    FewestServersPlacement,
    FittedEstimator,
    GreedyAllocation,
    IncrementalAllocation,
    JobObservation,
    NoPreruns,
    OptimusPolicy,
    OracleEstimator,
    RestartPlanner,
    SampledPreruns,
    SpeedAwarePlacement,
    SpreadPlacement,
    make_optimus,
)

NODE = (32.0, 256.0, 4.0, 10.0)
REPLICA = (4.0, 16.0, 1.0, 0.0)
PS_TASK = (4.0, 8.0, 0.0, 2.0)
WORKER = (4.0, 8.0, 0.0, 1.0)


def _nodes(n: int = 4) -> np.ndarray:
    return np.array([NODE] * n)


def _loss_points(n_epochs: int, spe: float, b0: float = 1e-3) -> tuple[tuple[float, float], ...]:
    return tuple((e * spe, 1.0 / (b0 * e * spe + 1.0) + 0.1) for e in range(1, n_epochs + 1))


def _gpu(jid: str, arrival: float = 0.0, **kw: object) -> JobObservation:
    base: dict[str, object] = {
        "job_id": jid,
        "kind": "allreduce",
        "worker_demand": REPLICA,
        "arrival": arrival,
        "requested_workers": 4,
        "max_workers": 16,
        "batch_size": 256,
        "throughput": {(1, 0, 1): (2.0,), (2, 0, 1): (3.8,), (4, 0, 1): (7.0,)},
    }
    base.update(kw)
    return JobObservation(**base)  # type: ignore[arg-type]


class _Truth:
    """A host's oracle: every job has 1e4 steps left and runs w**0.8 steps/s."""

    def remaining_steps(self, job_id: str) -> float:
        return 1e4

    def speed(self, job_id: str, ps: int, workers: int, nodes: int) -> float:
        return workers**0.8 * (0.9 ** (nodes - 1))


def _round(policy: OptimusPolicy, obs: list[JobObservation], nodes: np.ndarray | None = None):  # type: ignore[no-untyped-def]
    return policy.new_round(0.0, obs, _nodes() if nodes is None else nodes)


# ------------------------------------------------------------------ observation record


def test_observation_validates_fields_by_name() -> None:
    with pytest.raises(OptimusError, match="'kind'"):
        JobObservation("j", "mpi", REPLICA)
    with pytest.raises(OptimusError, match="'completion.kind'"):
        CompletionRule("forever", 1.0)
    with pytest.raises(OptimusError, match="'throughput'"):
        JobObservation("j", "allreduce", REPLICA, throughput={(0, 0, 1): (1.0,)})
    with pytest.raises(OptimusError, match="'max_workers'"):
        JobObservation("j", "allreduce", REPLICA, max_workers=0)
    obs = JobObservation("j", "allreduce", REPLICA, iterations_done=300, epochs_done=3)
    assert obs.ps_demand == (0.0,) * 4 and obs.steps_per_epoch == 100


# ------------------------------------------------------------------------- estimation


def test_n_epochs_rule_counts_the_epochs_left() -> None:
    # cifar10-like: 100 epochs of 500 steps, 64 done; the loss curve has flattened, so the
    # convergence fallback alone would say ~0 steps left
    spe = 500.0
    points = _loss_points(64, spe, b0=5e-2)
    est = FittedEstimator()
    policy = OptimusPolicy("t", est, GreedyAllocation(), FewestServersPlacement())
    epochs = _gpu(
        "e",
        iterations_done=64 * spe,
        epochs_done=64,
        loss_points=points,
        completion=CompletionRule("epochs", 100),
    )
    conv = _gpu(
        "c",
        iterations_done=64 * spe,
        epochs_done=64,
        loss_points=points,
        completion=CompletionRule("converged", 0.002),
    )
    rnd = _round(policy, [epochs, conv])
    assert rnd.remaining["e"].estimate == pytest.approx(36 * spe)
    assert rnd.remaining["e"].fitted
    assert rnd.remaining["c"].estimate < 0.1 * 36 * spe  # what the fallback would predict
    steps = _gpu("s", iterations_done=100, completion=CompletionRule("steps", 1000))
    assert _round(policy, [steps]).remaining["s"].estimate == 900


def test_target_metric_rule_and_cap() -> None:
    spe = 100.0
    points = _loss_points(20, spe)
    policy = OptimusPolicy("t", FittedEstimator(), GreedyAllocation(), FewestServersPlacement())
    obs = _gpu(
        "t",
        iterations_done=20 * spe,
        epochs_done=20,
        loss_points=points,
        completion=CompletionRule("target_metric", 0.2),
    )
    r = _round(policy, [obs]).remaining["t"]
    # l(k) = 1/(1e-3 k + 1) + 0.1 reaches 0.2 at k = 9000
    assert r.fitted and r.estimate == pytest.approx(9000 - 2000, rel=0.15)
    never = attrs_evolve(obs, completion=CompletionRule("target_metric", 0.01))
    r2 = _round(policy, [never]).remaining["t"]
    assert r2.estimate <= MAX_REMAINING_FACTOR * 2000


def attrs_evolve(obs: JobObservation, **kw: object) -> JobObservation:
    import attrs

    return attrs.evolve(obs, **kw)  # type: ignore[arg-type]


def test_hedged_estimator_gives_an_interval_and_paper_a_point() -> None:
    spe = 100.0
    rng = np.random.default_rng(0)
    points = tuple((k, v * (1 + 0.03 * rng.standard_normal())) for k, v in _loss_points(15, spe))
    obs = _gpu("h", iterations_done=15 * spe, epochs_done=15, loss_points=points)
    plain = OptimusPolicy("p", FittedEstimator(), GreedyAllocation(), FewestServersPlacement())
    hedged = OptimusPolicy(
        "h", FittedEstimator(hedged=True), GreedyAllocation(), FewestServersPlacement()
    )
    p = _round(plain, [obs]).remaining["h"]
    h = _round(hedged, [obs]).remaining["h"]
    assert p.low == p.estimate == p.high
    assert h.low <= h.estimate <= h.high and h.low < h.high


def test_speed_prior_fit_and_measurement() -> None:
    est = FittedEstimator(prior="requested")
    policy = OptimusPolicy("t", est, GreedyAllocation(), FewestServersPlacement())
    one = _gpu("j", throughput={(1, 0, 1): (2.0,)}, requested_workers=4)
    rnd = _round(policy, [one])
    # prior: ~ n**0.9 up to the requested 4 GPUs, flat beyond
    assert est.speed(one, 0, 4, 1, rnd) == pytest.approx(2.0 * 4**0.9)
    assert est.speed(one, 0, 8, 2, rnd) == est.speed(one, 0, 4, 1, rnd)  # flat beyond
    # scattered over more servers than needed: CROSS_NODE_SLOWDOWN per extra server
    assert est.speed(one, 0, 4, 2, rnd) == pytest.approx(0.8 * est.speed(one, 0, 4, 1, rnd))
    three = _gpu("k")
    rnd = _round(policy, [three])
    assert est.speed(three, 0, 2, 1, rnd) == pytest.approx(3.8)  # measured wins
    fitted = est.speed(three, 0, 3, 1, rnd)
    assert 3.8 < fitted < 7.0  # the online form interpolates


def test_oracle_estimator_reads_only_the_host_truth() -> None:
    est = OracleEstimator(_Truth())
    policy = OptimusPolicy("o", est, GreedyAllocation(), FewestServersPlacement())
    rnd = _round(policy, [_gpu("a")])
    assert rnd.remaining["a"].estimate == 1e4
    assert est.speed(rnd.jobs["a"], 0, 4, 1, rnd) == pytest.approx(4**0.8)


# ---------------------------------------------------------------- allocation / restarts


def test_greedy_allocation_alone_fills_gpus_by_gain() -> None:
    policy = OptimusPolicy("o", OracleEstimator(_Truth()), GreedyAllocation(), SpreadPlacement())
    rnd = _round(policy, [_gpu("a", 0.0), _gpu("b", 1.0)], _nodes(2))
    alloc = policy.allocation.allocate(rnd, policy.estimator, policy.restarts)
    assert alloc.tasks == {"a": (0, 4), "b": (0, 4)}  # identical jobs split 8 GPUs evenly


def test_incremental_allocation_keeps_running_jobs_under_hysteresis() -> None:
    running = JobPlacement("a", (0,), (0,), (1,))
    obs = [_gpu("a", placement=running), _gpu("b", 5.0)]
    est = OracleEstimator(_Truth())
    for hyst, expect_change in ((0.0, True), (1e6, False)):
        policy = OptimusPolicy(
            "p", est, IncrementalAllocation(), SpreadPlacement(), RestartPlanner(hysteresis=hyst)
        )
        rnd = _round(policy, obs, _nodes(1))
        alloc = policy.allocation.allocate(rnd, est, policy.restarts)
        assert (alloc.tasks["a"] != (0, 1)) == expect_change
        assert alloc.tasks["b"][1] >= 1  # the waiting job gets its first GPU either way


def test_restart_planner_alone() -> None:
    rp = RestartPlanner(hysteresis=2.0)
    policy = OptimusPolicy("p", OracleEstimator(_Truth()), GreedyAllocation(), SpreadPlacement())
    pl = JobPlacement("a", (1,), (0,), (3,))
    rnd = policy.new_round(0.0, [_gpu("a", placement=pl), _gpu("b")], _nodes(), 30.0)
    assert rp.penalty_s(rnd) == 60.0
    assert rp.previous(rnd) == {"a": pl}
    assert rp.current(rnd) == {"a": (0, 3)}
    assert RestartPlanner(keep_placements=False).previous(rnd) == {}


# ------------------------------------------------------------------------- placement


def test_placements_alone_never_overcommit_and_keep_unchanged_jobs() -> None:
    est = OracleEstimator(_Truth())
    prev = JobPlacement("a", (2,), (0,), (2,))
    obs = [_gpu("a", placement=prev), _gpu("b"), _gpu("c")]
    for strat in (FewestServersPlacement(), SpreadPlacement(), SpeedAwarePlacement()):
        policy = OptimusPolicy("p", est, GreedyAllocation(), strat)
        rnd = _round(policy, obs, _nodes(3))
        out = strat.place(rnd, {"a": (0, 2), "b": (0, 4), "c": (0, 5)}, est, RestartPlanner())
        assert out["a"] == prev
        gpus = np.zeros(3)
        for jp in out.values():
            for nd, w in zip(jp.nodes, jp.workers_per_node, strict=True):
                gpus[nd] += w
        assert np.all(gpus <= 4)
        if isinstance(strat, FewestServersPlacement):
            assert out["b"].num_servers == 1  # 4 GPUs on one server (Theorem 1)


def test_speed_aware_placement_prefers_fewer_gpus_on_one_server() -> None:
    # 2 GPUs free on each of 3 servers; 4 GPUs over 2 servers are slower than 2 on one
    class Slow(_Truth):
        def speed(self, job_id: str, ps: int, workers: int, nodes: int) -> float:
            return workers * (0.3 ** (nodes - 1))

    est = OracleEstimator(Slow())
    # three servers of 4 GPUs, each half taken by a running job that keeps its place
    others = [_gpu(f"r{i}", placement=JobPlacement(f"r{i}", (i,), (0,), (2,))) for i in range(3)]
    policy = OptimusPolicy("p", est, GreedyAllocation(), SpeedAwarePlacement())
    rnd = _round(policy, [*others, _gpu("a", 10.0)], _nodes(3))
    tasks = {"r0": (0, 2), "r1": (0, 2), "r2": (0, 2), "a": (0, 4)}
    out = SpeedAwarePlacement().place(rnd, tasks, est, RestartPlanner())
    assert out["a"].workers == 2 and out["a"].num_servers == 1
    out = FewestServersPlacement().place(rnd, tasks, est, RestartPlanner())
    assert out["a"].workers == 4 and out["a"].num_servers == 2


# ---------------------------------------------------------------------------- pre-runs


def test_preruns_are_requests() -> None:
    gpu = _gpu("g", max_workers=6)
    assert SampledPreruns().request(gpu).configs == ((0, 1), (0, 2), (0, 4))
    assert SampledPreruns().request(_gpu("one", max_workers=1)).configs == ()
    ps = JobObservation("p", "ps", WORKER, PS_TASK, batch_size=256)
    req = SampledPreruns(limit=0).request(ps)
    assert len(req.configs) == 5 and req.seconds_each == 10.0
    assert NoPreruns().request(gpu).configs == ()


# ---------------------------------------------------- a minimal host that is not the simulator


class _Host:
    """A toy cluster manager: jobs progress at ``w**0.8`` steps/s; it measures throughput
    per configuration, reports a loss point per epoch, and satisfies pre-run requests."""

    def __init__(self, policy: OptimusPolicy, nodes: np.ndarray) -> None:
        self.policy = policy
        self.nodes = nodes
        self.done: dict[str, float] = {}
        self.tput: dict[str, dict[tuple[int, int, int], tuple[float, ...]]] = {}
        self.losses: dict[str, list[tuple[float, float]]] = {}
        self.where: dict[str, JobPlacement | None] = {}
        self.total = {"a": 3000.0, "b": 600.0, "p": 2000.0}
        self.finished: dict[str, float] = {}

    @staticmethod
    def rate(ps: int, w: int, nodes: int) -> float:
        return w**0.8 * 0.9 ** (nodes - 1) * (1.0 if ps == 0 else min(ps, w) ** 0.2)

    def obs(self, jid: str) -> JobObservation:
        spe = 100.0
        kind = "ps" if jid == "p" else "allreduce"
        return JobObservation(
            job_id=jid,
            kind=kind,
            worker_demand=WORKER if kind == "ps" else REPLICA,
            ps_demand=PS_TASK if kind == "ps" else (),
            arrival={"a": 0.0, "b": 10.0, "p": 5.0}[jid],
            requested_workers=2,
            max_workers=8,
            max_ps=4 if kind == "ps" else None,
            iterations_done=self.done.get(jid, 0.0),
            epochs_done=int(self.done.get(jid, 0.0) // spe),
            throughput=self.tput.get(jid, {}),
            loss_points=tuple(self.losses.get(jid, [])),
            completion=CompletionRule("steps", self.total[jid]),
            placement=self.where.get(jid),
            batch_size=128,
        )

    def arrive(self, jid: str) -> None:
        req = self.policy.prerun_request(self.obs(jid))
        for ps, w in req.configs:
            k = -(-w // 4)
            self.tput.setdefault(jid, {})[(w, ps, k)] = (self.rate(ps, w, k),)

    def step(self, now: float) -> None:
        live = [j for j in self.total if j not in self.finished]
        dec = self.policy.schedule(now, [self.obs(j) for j in live], self.nodes)
        used = np.zeros_like(self.nodes)
        for jid in live:
            jp = dec.placements.get(jid)
            self.where[jid] = jp
            if jp is None:
                continue
            o = self.obs(jid)
            for nd, pp, ww in zip(jp.nodes, jp.ps_per_node, jp.workers_per_node, strict=True):
                used[nd] += pp * np.array(o.ps_demand) + ww * np.array(o.worker_demand)
            r = self.rate(jp.ps, jp.workers, jp.num_servers)
            self.tput.setdefault(jid, {})[(jp.workers, jp.ps, jp.num_servers)] = (r,)
            self.done[jid] = self.done.get(jid, 0.0) + 60.0 * r
            self.losses.setdefault(jid, []).append((self.done[jid], 1.0 / (1 + self.done[jid])))
            if self.done[jid] >= self.total[jid]:
                self.finished[jid] = now + 60.0
        assert np.all(used <= self.nodes + 1e-9)  # never over-committed


@pytest.mark.parametrize("variant", ["optimus", "optimus+", "optimus-oracle"])
def test_policy_driven_by_a_hand_built_host(variant: str) -> None:
    host: _Host

    class T:
        def remaining_steps(self, job_id: str) -> float:
            return host.total[job_id] - host.done.get(job_id, 0.0)

        def speed(self, job_id: str, ps: int, workers: int, nodes: int) -> float:
            return _Host.rate(ps, workers, nodes)

    policy = make_optimus(variant, truth=T() if variant == "optimus-oracle" else None)
    host = _Host(policy, _nodes(2))
    for jid in host.total:
        host.arrive(jid)
    if variant == "optimus":
        assert host.tput["a"] and len(host.tput["p"]) >= 5  # pre-run requests satisfied
    now = 0.0
    while len(host.finished) < len(host.total) and now < 3600:
        host.step(now)
        now += 60.0
    assert set(host.finished) == set(host.total)
    assert host.finished["b"] < host.finished["a"]  # the short job is not starved
    assert all(math.isfinite(t) for t in host.finished.values())


def test_readme_scheduler_example_runs(capsys) -> None:  # type: ignore[no-untyped-def]
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    example = next(b for b in blocks if "make_optimus" in b)
    exec(compile(example, "README.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "bert:" in out and "resnet:" in out
