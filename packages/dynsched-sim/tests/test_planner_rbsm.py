"""State machine on the virtual-time loop: random role moves both ways (retiring standalone
replicas into the trainer, starting replicas on trainer GPUs) keep every sample exactly
once, the staleness rule and memory conservation, whatever is moved at each sync."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest import mock

import pytest
from dynsched_core import ConfigError, EventBus, FullyAsyncLoop
from dynsched_core.events import RoleMoveEvent
from dynsched_core.planner import RoleMove, RolePlanner, RolePlannerOptions, RoleSplit
from dynsched_sim import VirtualTimeEventLoop, load_scenario, run_configuration
from dynsched_sim import _sim as sim_module
from dynsched_sim._cluster import build_cluster, prompt_source
from dynsched_sim._mover import ResizeCosts, SimRoleMover
from dynsched_sim._planner import build_planner, planner_enabled, trainer_memory_min_gpus
from dynsched_sim._sim import _reclaimer
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

MAX_STEPS = 16


class QueuedPlanner(RolePlanner):
    """Proposes the move the state machine queued (if the split allows it)."""

    def __init__(self, config: Any) -> None:
        super().__init__(RolePlannerOptions(every_n_syncs=1), config=config)
        self.queued: tuple[str, int] | None = None

    def decide(self, split: RoleSplit, *, now: float) -> RoleMove | None:
        queued, self.queued = self.queued, None
        if queued is None:
            return None
        direction, k = queued
        try:
            after = split.moved(direction, k)  # type: ignore[arg-type]
        except ValueError:
            return None
        if after.standalone_replicas < 1:
            return None
        return RoleMove(direction=direction, replicas=k, before=split, after=after)  # type: ignore[arg-type]


class ResizeMachine(RuleBasedStateMachine):
    """One simulated run of ``balanced`` (dynamic 16+16, lending on), one micro-step per
    rule, a random move queued for the next sync."""

    @initialize(hybrid=st.booleans())
    def start(self, hybrid: bool) -> None:
        self.loop = VirtualTimeEventLoop()
        asyncio.set_event_loop(self.loop)
        sc = load_scenario("balanced").with_steps(MAX_STEPS + 2)
        conf = sc.configuration("dynamic-16-16" if hybrid else "static-16-16")
        cfg = sc.schedule_config(conf, "default" if hybrid else "static_fully_async")
        self.cfg = cfg
        self.moves: list[RoleMoveEvent] = []
        bus = EventBus()
        bus.subscribe(self.moves.append, RoleMoveEvent)

        async def build() -> FullyAsyncLoop:
            loop = asyncio.get_running_loop()
            cluster = build_cluster(
                sc, conf, seed=0, events=EventBus(), clock=loop.time, config=cfg
            )
            self.cluster = cluster
            self.planner = QueuedPlanner(cfg)
            self.mover = SimRoleMover(cluster, ResizeCosts(reinit_s=5.0, engine_start_s=5.0))
            floop = FullyAsyncLoop.build(
                cfg,
                cfg.build_policy(),
                cluster.trainer,
                prompts=prompt_source(cluster.workload, sc.workload.max_response_len),
                standalone=cluster.standalone,
                hybrid=cluster.hybrid,
                events=bus,
                wait_timeout_s=3 * 24 * 3600.0,
                max_tokens=sc.workload.max_response_len,
                planner=self.planner,
                mover=self.mover,
            )
            self.mover.bind(floop)
            cluster.trainer.set_reclaim(
                _reclaimer(floop, cfg, has_standalone=bool(cluster.standalone))
            )
            await floop._setup()
            self.task = floop.rollouter.start()
            await floop.driver.initial_activation(version=0)
            return floop

        self.floop = self.loop.run_until_complete(build())
        self.step = 0
        self.consumed: list[Any] = []

    @rule(
        move=st.one_of(
            st.none(),
            st.tuples(st.sampled_from(["to_trainer", "to_rollout"]), st.integers(1, 2)),
        )
    )
    def micro_step(self, move: tuple[str, int] | None) -> None:
        if self.step >= MAX_STEPS:
            return
        self.planner.queued = move
        before = len(self.moves)
        self.step += 1
        record = self.loop.run_until_complete(self.floop._micro_step(self.step, None))
        assert record is not None
        self.consumed.extend(record.sample_ids)
        if len(self.moves) > before:
            event(f"moved {self.moves[-1].direction}")

    @invariant()
    def every_sample_exactly_once(self) -> None:
        if not hasattr(self, "floop"):
            return
        stats = self.loop.run_until_complete(self.floop.queue.stats())
        assert len(set(self.consumed)) == len(self.consumed)
        assert stats.consumed == len(self.consumed)
        assert stats.produced == stats.consumed + stats.size
        assert self.cluster.trainer.tokens_exact

    @invariant()
    def staleness_respected(self) -> None:
        if not hasattr(self, "floop"):
            return
        st_ = self.floop.rollouter.stats()
        assert st_.window_admitted <= st_.max_required_samples
        size = self.loop.run_until_complete(self.floop.queue.size())
        assert size + st_.active <= self.cfg.max_required_samples

    @invariant()
    def gpus_conserved_and_roles_consistent(self) -> None:
        if not hasattr(self, "floop"):
            return
        split = self.mover.split()
        assert split.total_gpus == 32
        assert self.cluster.trainer.gpus == split.trainer_gpus
        replicas = self.floop.replicas
        assert sorted(replicas.standalone_ids) == sorted(
            r.replica_id for r in self.cluster.trainer.standalone
        )
        if self.cfg.use_dynamic_resource_scheduling:
            assert replicas.num_hybrid == split.trainer_gpus // 8
        routable = set(self.loop.run_until_complete(self.floop.router.routable()))
        assert set(replicas.standalone_ids) <= routable
        for r in self.cluster.retired:
            assert r.replica_id not in routable
        # every standalone replica serves the trainer's current weights
        for r in self.cluster.trainer.standalone:
            assert r.version == self.cluster.trainer.version

    def teardown(self) -> None:
        if hasattr(self, "floop"):
            self.loop.run_until_complete(self.floop._shutdown())
            self.task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()
        asyncio.set_event_loop(None)


ResizeMachine.TestCase.settings = settings(
    max_examples=8, stateful_step_count=MAX_STEPS, deadline=None
)
TestResize = ResizeMachine.TestCase


def test_memory_floor_follows_the_trainer_state() -> None:
    """The floor is the fewest GPUs holding the trainer state (and, with lending and a
    resident state, an awake hybrid engine next to it)."""
    for sc in (
        load_scenario("seed-qwen35"),
        load_scenario("seed-qwen35").with_values(trainer={"offload_state": False}),
    ):
        _check_floor(sc)


def _check_floor(sc: Any) -> None:
    gpu = sc.hardware.gpu_memory_gib * 2**30
    for hybrid in (False, True):
        w = trainer_memory_min_gpus(sc, hybrid)
        resident = hybrid and not sc.trainer.offload_state
        room = gpu * (1 - sc.engine.hybrid_memory_fraction) if resident else gpu
        assert sc.trainer.resident_bytes_per_gpu(sc.model, w) <= room
        if w > 1:
            assert sc.trainer.resident_bytes_per_gpu(sc.model, w - 1) > room


def test_a_planned_run_is_conserved_and_labelled() -> None:
    sc = load_scenario("training-bound").with_steps(24)
    conf = next(c for c in sc.configurations if c.hybrid)
    with planner_enabled():
        r = run_configuration(sc, conf, "default")
    assert r.policy == "default+planner"
    assert all(r.conservation.values()), r.conservation
    assert "role_moves" in r.summary
    plain = run_configuration(sc, conf, "default")
    assert plain.policy == "default" and "role_moves" not in plain.summary


def test_simulate_planner_flag_runs_every_configuration_planned(tmp_path: Any) -> None:
    import json

    from dynsched_sim.cli import main

    out = tmp_path / "out"
    argv = ["--scenario", "training-bound", "--planner", "--steps", "8", "--seeds", "1"]
    assert main([*argv, "--quiet", "--no-plots", "--out", str(out)]) == 0
    runs = json.loads((out / "result.json").read_text())["runs"]
    assert runs and all(r["policy"].endswith("+planner") for r in runs)
    assert all("role_moves" in r["summary"] for r in runs)


class _ToTrainer(RolePlanner):
    """Moves one standalone replica to the trainer at every sync its candidates allow."""

    def decide(self, split: RoleSplit, *, now: float) -> RoleMove | None:
        for c in self.candidates(split):
            if c.trainer_gpus > split.trainer_gpus:
                return RoleMove(direction="to_trainer", replicas=1, before=split, after=c)
        return None


def _to_trainer(spec: Any, scenario: Any, cluster: Any, cfg: Any) -> Any:
    planner, mover = build_planner(spec, scenario, cluster, cfg)
    return _ToTrainer(planner.options, config=cfg), mover


@pytest.mark.parametrize(
    ("conf_name", "policy"),
    [("static-16-16", "static_fully_async"), ("dynamic-16-16", "default")],
)
def test_the_planner_never_retires_the_last_standalone_replica(conf_name: str, policy: str) -> None:
    """``balanced`` with a planner that moves a replica to the trainer whenever its
    candidates allow. With ``min_standalone_replicas=0`` it retired the last standalone
    replica: static-16-16 stalled (`SampleWaitTimeoutError`: nothing generates), and
    dynamic-16-16 failed samples (`NoRoutableReplicaError`: the requests the move and every
    later hybrid deactivation aborted waited 60 s for a replica while the trainer trained).
    0 is refused now; at the minimum, 1, the run keeps one replica and trains every sample."""
    sc = load_scenario("balanced").with_steps(16)
    conf = sc.configuration(conf_name)
    with (
        mock.patch.object(sim_module, "build_planner", _to_trainer),
        pytest.raises(ConfigError, match=r"min_standalone_replicas must be an int >= 1, got 0"),
    ):
        run_configuration(
            sc, conf, policy, planner=RolePlannerOptions(min_standalone_replicas=0, every_n_syncs=1)
        )
    with mock.patch.object(sim_module, "build_planner", _to_trainer):
        r = run_configuration(
            sc, conf, policy, planner=RolePlannerOptions(min_standalone_replicas=1, every_n_syncs=1)
        )
    assert r.summary["role_moves"] == 1 and r.summary["final_standalone_replicas"] == 1
    assert r.summary["final_trainer_gpus"] == conf.total_gpus - sc.engine.gpus_per_replica
    assert all(r.conservation.values()), r.conservation
