"""State machine on the virtual-time loop: mid-cycle activation and partial lending keep
every sample exactly once, respect the staleness rule and never train next to an awake
hybrid engine, whatever a policy decides at each step boundary."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
from dynsched_core import (
    DynamicScheduleContext,
    DynamicSchedulePolicyBase,
    EventBus,
    FullyAsyncLoop,
)
from dynsched_sim import VirtualTimeEventLoop, load_scenario
from dynsched_sim._cluster import build_cluster, prompt_source
from dynsched_sim._sim import _reclaimer
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

MAX_STEPS = 10


class ScriptedLender(DynamicSchedulePolicyBase):
    """Answers each hook from attributes the state machine sets before a micro-step."""

    def __init__(self) -> None:
        self.mid = False
        self.after = False
        self.k: int | None = None
        self.ids: list[str] | None = None
        self.wait = 0

    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        return self.wait

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return self.after

    def should_activate_mid_cycle(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return self.mid

    def hybrid_replicas_to_activate(
        self, global_steps: int, ctx: DynamicScheduleContext
    ) -> int | None:
        return self.k

    def hybrid_replica_ids_to_activate(
        self, global_steps: int, ctx: DynamicScheduleContext
    ) -> list[str] | None:
        return self.ids


class LendingMachine(RuleBasedStateMachine):
    """One simulated run of the ``balanced`` scenario, one micro-step per rule."""

    @initialize()
    def start(self) -> None:
        self.loop = VirtualTimeEventLoop()
        asyncio.set_event_loop(self.loop)
        sc = load_scenario("balanced").with_steps(MAX_STEPS + 2)
        conf = sc.configuration("dynamic-16-16")
        cfg = sc.schedule_config(conf, "default")
        self.cfg = cfg
        self.policy = ScriptedLender()
        bus = EventBus()

        async def build() -> FullyAsyncLoop:
            loop = asyncio.get_running_loop()
            cluster = build_cluster(
                sc, conf, seed=0, events=EventBus(), clock=loop.time, config=cfg
            )
            self.cluster = cluster
            floop = FullyAsyncLoop.build(
                cfg,
                self.policy,
                cluster.trainer,
                prompts=prompt_source(cluster.workload, sc.workload.max_response_len),
                standalone=cluster.standalone,
                hybrid=cluster.hybrid,
                events=bus,
                wait_timeout_s=3 * 24 * 3600.0,
                max_tokens=sc.workload.max_response_len,
            )
            cluster.trainer.set_reclaim(_reclaimer(floop, cfg, has_standalone=True))
            await floop._setup()
            self.task = floop.rollouter.start()
            await floop.driver.initial_activation(version=0)
            return floop

        self.floop = self.loop.run_until_complete(build())
        self.step = 0
        self.consumed: list[Any] = []
        self.lent_max = len(self.cluster.hybrid)

    @rule(
        mid=st.booleans(),
        after=st.booleans(),
        k=st.one_of(st.none(), st.integers(0, 3)),
        ids=st.one_of(
            st.none(), st.lists(st.sampled_from(["hybrid-0", "hybrid-1", "ghost"]), max_size=3)
        ),
        wait=st.integers(0, 64),
    )
    def micro_step(
        self, mid: bool, after: bool, k: int | None, ids: list[str] | None, wait: int
    ) -> None:
        if self.step >= MAX_STEPS:
            return
        self.policy.mid, self.policy.after, self.policy.k, self.policy.wait = mid, after, k, wait
        self.policy.ids = ids
        if ids is not None:  # named replicas (the live ones among them; at least one)
            self.lent_max = max(1, len({"hybrid-0", "hybrid-1"} & set(ids)))
        else:
            self.lent_max = len(self.cluster.hybrid) if k is None else max(1, min(k, 2))
        self.step += 1
        record = self.loop.run_until_complete(self.floop._micro_step(self.step, None))
        assert record is not None
        self.consumed.extend(record.sample_ids)
        if record.before.activated_mid_cycle:
            # lent mid-cycle with the current weights, then given back before training
            assert record.before.deactivated
            event("mid-cycle lend")
        if record.after is not None and record.after.activated:
            event(f"{len(self.floop.controller.active_hybrid_ids)} of 2 lent after a sync")

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
    def only_lent_replicas_serve_and_hold_current_weights(self) -> None:
        if not hasattr(self, "floop"):
            return
        ctrl = self.floop.controller
        lent = set(ctrl.active_hybrid_ids)
        routable = set(self.loop.run_until_complete(self.floop.router.routable()))
        hybrids = {r.replica_id: r for r in self.cluster.hybrid}
        assert routable & set(hybrids) == lent
        assert len(lent) <= self.lent_max
        for rid, replica in hybrids.items():
            if rid in lent:
                assert replica.state == "serving"
                assert replica.version == self.floop.driver.param_version
            else:
                assert replica.state == "asleep"
        # the policy always gives the GPUs back: the trainer never had to reclaim them
        assert self.cluster.trainer.reclaims == 0

    def teardown(self) -> None:
        if hasattr(self, "floop"):
            self.loop.run_until_complete(self.floop._shutdown())
            self.task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()
        asyncio.set_event_loop(None)


LendingMachine.TestCase.settings = settings(
    max_examples=8, stateful_step_count=MAX_STEPS, deadline=None
)
TestLending = LendingMachine.TestCase


def test_replicas_are_labelled_with_their_server() -> None:
    """8 GPUs per server (published layout): with 8-GPU replicas each hybrid replica has a
    trainer node of its own, and the context names them in lending order."""
    sc = load_scenario("balanced")
    conf = sc.configuration("dynamic-16-16")
    assert sc.hardware.gpus_per_node == 8 and sc.engine.gpus_per_replica == 8
    cluster = build_cluster(sc, conf, seed=0, events=EventBus(), clock=lambda: 0.0)
    nodes = {r.replica_id: r.capabilities.node for r in cluster.hybrid}
    assert nodes == {"hybrid-0": "trainer-node-0", "hybrid-1": "trainer-node-1"}
    assert {r.capabilities.node for r in cluster.standalone} == {
        "rollout-node-0",
        "rollout-node-1",
    }
    small = attrs.evolve(sc, engine=attrs.evolve(sc.engine, gpus_per_replica=4))
    cluster = build_cluster(small, conf, seed=0, events=EventBus(), clock=lambda: 0.0)
    assert [r.capabilities.node for r in cluster.hybrid] == [
        "trainer-node-0",
        "trainer-node-0",
        "trainer-node-1",
        "trainer-node-1",
    ]
