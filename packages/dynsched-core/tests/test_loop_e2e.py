"""End-to-end runs of the reference fully-async loop over in-memory replicas."""

from __future__ import annotations

import asyncio
import doctest
import random
import selectors
from collections.abc import Sequence
from typing import Any

import dynsched_core._loop as loop_module
import pytest
from dynsched_core import (
    AsyncSampleQueue,
    DynamicResourceController,
    DynamicScheduleConfig,
    DynamicSchedulePolicyBase,
    EventBus,
    FullyAsyncLoop,
    HybridState,
    InMemoryReplica,
    InMemoryReplicaOptions,
    Prompt,
    ReplicaSet,
    RetryingClient,
    Rollouter,
    RollouterOptions,
    RolloutSample,
    ScheduleDriver,
)
from dynsched_core.events import ReplicaModeEvent, SwitchEvent, TrainStepEvent


class AlwaysActivate(DynamicSchedulePolicyBase):
    """Trivial test policy: hybrid generates whenever the trainer waits."""

    def __init__(self, wait_samples: int = 2) -> None:
        self.wait_samples = wait_samples
        self.calls: list[str] = []

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        self.calls.append("should_deactivate")
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: Any) -> int:
        self.calls.append("deactivate_wait_samples")
        return self.wait_samples

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        self.calls.append("should_activate_after_step")
        return True

    def request_rebalance(self, global_steps: int, ctx: Any) -> bool | None:
        self.calls.append("request_rebalance")
        return None

    def update_after_step(self, global_steps: int, ctx: Any) -> None:
        self.calls.append("update_after_step")


class SleepingTrainer:
    """Trains by sleeping on the loop clock; syncs weights to the standalone replicas."""

    def __init__(self, standalone: Sequence[InMemoryReplica], train_s: float = 0.02) -> None:
        self.standalone = standalone
        self.train_s = train_s
        self.batches: list[list[Any]] = []
        self.synced: list[int] = []

    async def train_step(self, samples: Sequence[Any]) -> dict[str, float]:
        self.batches.append(list(samples))
        await asyncio.sleep(self.train_s)
        return {"update_actor": self.train_s}

    async def sync_weights(self, version: int) -> str:
        targets = self.standalone() if callable(self.standalone) else self.standalone
        await asyncio.gather(*(r.update_weights(version) for r in targets))
        self.synced.append(version)
        return f"weights-v{version}"


def prompts(count: int, seed: int = 0) -> list[Prompt]:
    rng = random.Random(seed)
    return [
        Prompt(
            prompt_id=f"p{i}",
            prompt_len=4,
            max_tokens=48,
            target_lens=tuple(rng.randint(8, 48) for _ in range(2)),
        )
        for i in range(count)
    ]


def build(
    n_prompts: int,
    *,
    policy: DynamicSchedulePolicyBase | None = None,
    source: Any = None,
    **cfg: Any,
) -> tuple[FullyAsyncLoop, SleepingTrainer, list[InMemoryReplica], list[InMemoryReplica], EventBus]:
    config = DynamicScheduleConfig(
        **{
            "use_dynamic_resource_scheduling": True,
            "ppo_mini_batch_size": 4,
            "trigger_parameter_sync_step": 2,
            "staleness_threshold": 0.5,
            "n": 2,
            "concurrent_samples_per_replica": 2,
            **cfg,
        }
    )
    standalone = [InMemoryReplica(f"s{i}", tokens_per_s=1500.0) for i in range(2)]
    hybrid = [
        InMemoryReplica(
            f"h{i}",
            role="hybrid",
            tokens_per_s=1500.0,
            options=InMemoryReplicaOptions(wake_delay_s=0.002, sleep_delay_s=0.002),
        )
        for i in range(2)
    ]
    trainer = SleepingTrainer(standalone)
    events = EventBus()
    loop = FullyAsyncLoop.build(
        config,
        policy or AlwaysActivate(),
        trainer,
        prompts=prompts(n_prompts) if source is None else source,
        standalone=standalone,
        hybrid=hybrid,
        events=events,
        wait_timeout_s=30.0,
    )
    return loop, trainer, standalone, hybrid, events


def check_sample(sample: RolloutSample) -> None:
    assert len(sample.responses) == 2
    for i, out in enumerate(sample.responses):
        target = sample.prompt.target_lens[i]  # type: ignore[index]
        assert out.num_tokens == target
        # partial rollout kept every token: the response is 0, 1, 2, ... without gaps
        assert list(out.output_tokens) == list(range(target))


async def test_training_completes_without_loss_or_duplicates() -> None:
    loop, trainer, standalone, hybrid, events = build(200)
    seen: list[Any] = []
    events.subscribe(seen.append)
    result = await asyncio.wait_for(loop.run(num_steps=12), 60.0)

    assert result.steps == 12 and result.ended_by == "steps"
    assert result.final_version == 6 and trainer.synced == [1, 2, 3, 4, 5, 6]
    consumed = result.consumed_sample_ids
    assert len(consumed) == 12 * 4 == result.samples_consumed
    assert len(set(consumed)) == len(consumed)
    left: list[RolloutSample] = loop.queue.get_nowait()  # type: ignore[attr-defined]
    left_ids = [s.sample_id for s in left]
    assert len(set(left_ids)) == len(left_ids) and not set(left_ids) & set(consumed)
    # every generated sample was consumed or is still in the queue
    assert len(consumed) + len(left_ids) == result.samples_produced == result.rollouter.completed
    assert result.samples_failed == 0
    for batch in trainer.batches:
        for sample in batch:
            check_sample(sample)

    # hybrid replicas were switched and are asleep and out of routing at the end
    assert result.activations >= 1 and result.deactivations >= 1
    assert loop.controller.state is HybridState.STANDALONE_ONLY
    assert await loop.router.routable() == ["s0", "s1"]
    assert all(h.is_asleep for h in hybrid)
    assert all(h.received for h in hybrid), "hybrid replicas served requests"
    assert all(s.weights_version == 6 for s in standalone)

    steps = [e for e in seen if isinstance(e, TrainStepEvent)]
    assert [e.step for e in steps] == list(range(1, 13))
    assert [e.is_sync_step for e in steps] == [False, True] * 6
    assert all(e.timings["step"] >= e.timings["update_actor"] for e in steps)
    assert any(isinstance(e, SwitchEvent) and e.kind == "activate" for e in seen)
    assert any(isinstance(e, ReplicaModeEvent) and e.mode == "train" for e in seen)

    # policy order per cycle: deactivation decision(s), then the after-sync trio
    calls = loop.driver.policy.calls  # type: ignore[attr-defined]
    assert calls[0] == "should_activate_after_step"  # start-up decision
    sync_calls = [c for c in calls[1:] if c not in ("should_deactivate", "deactivate_wait_samples")]
    assert sync_calls == [
        "should_activate_after_step",
        "request_rebalance",
        "update_after_step",
    ] * 5 + [
        "should_activate_after_step",
        "update_after_step",
    ]  # the last sync is the last step: no activation, no rebalance


async def test_end_of_stream_ends_training_without_hang() -> None:
    # 10 prompts, 4 samples per micro-step: two steps, then 2 samples are left over.
    loop, _, _, _, _ = build(10, policy=AlwaysActivate(wait_samples=8))
    result = await asyncio.wait_for(loop.run(num_steps=50), 30.0)
    assert result.ended_by == "end_of_stream"
    assert result.steps == 2 and result.samples_consumed == 8
    assert result.samples_left == 2 and result.samples_produced == 10
    assert result.rollouter.finished and result.queue.closed
    assert loop.controller.state is HybridState.STANDALONE_ONLY


async def test_static_run_without_dynamic_scheduling_never_switches() -> None:
    loop, _, _, hybrid, _ = build(100, use_dynamic_resource_scheduling=False)
    result = await asyncio.wait_for(loop.run(num_steps=4), 30.0)
    assert result.steps == 4 and result.activations == 0 and result.deactivations == 0
    assert all(h.is_asleep and not h.received for h in hybrid)
    assert loop.driver.policy.calls == []  # type: ignore[attr-defined]


async def test_hybrid_only_mode_is_not_a_deadlock() -> None:
    class Never(AlwaysActivate):
        def should_activate_after_step(
            self, global_steps: int, is_hybrid_active: bool, ctx: Any
        ) -> bool:
            return False

    config = DynamicScheduleConfig(
        use_dynamic_resource_scheduling=True,
        ppo_mini_batch_size=2,
        trigger_parameter_sync_step=1,
        n=1,
        rollout_nnodes=0,
    )
    hybrid = [InMemoryReplica("h0", role="hybrid", tokens_per_s=5000.0)]
    loop = FullyAsyncLoop.build(
        config,
        Never(wait_samples=2),
        SleepingTrainer([], train_s=0.001),
        prompts=prompts(40),
        hybrid=hybrid,
        wait_timeout_s=10.0,
    )
    result = await asyncio.wait_for(loop.run(num_steps=3), 30.0)
    assert result.steps == 3 and result.activations >= 3


async def test_hybrid_only_deactivation_buffers_the_whole_cycle() -> None:
    class Eager(AlwaysActivate):
        def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
            return True  # static_fully_async-like: switch back at every step start

    config = DynamicScheduleConfig(
        use_dynamic_resource_scheduling=True,
        ppo_mini_batch_size=2,
        trigger_parameter_sync_step=3,
        n=1,
        rollout_nnodes=0,
    )
    hybrid = [InMemoryReplica("h0", role="hybrid", tokens_per_s=5000.0)]
    loop = FullyAsyncLoop.build(
        config,
        Eager(wait_samples=0),
        SleepingTrainer([], train_s=0.001),
        prompts=prompts(60),
        hybrid=hybrid,
        wait_timeout_s=5.0,
    )
    result = await asyncio.wait_for(loop.run(num_steps=6), 30.0)
    assert result.steps == 6
    first_steps = [r for r in result.records if r.step % 3 == 1]
    assert all(r.before.wait_target == 6 for r in first_steps)  # the whole cycle buffered


def test_trainer_failure_propagates_and_cleans_up() -> None:
    class Broken(SleepingTrainer):
        async def train_step(self, samples: Sequence[Any]) -> dict[str, float]:
            raise RuntimeError("trainer crashed")

    loop, _, _, hybrid, _ = build(50)
    loop.trainer = Broken([])
    with pytest.raises(RuntimeError, match="trainer crashed"):
        asyncio.run(asyncio.wait_for(loop.run(num_steps=3), 30.0))
    assert loop.rollouter.finished
    assert all(h.is_asleep for h in hybrid)


def test_rollouter_failure_surfaces_after_end_of_stream() -> None:
    def broken_source() -> Any:
        yield from prompts(6)
        raise ValueError("dataset corrupted")

    loop, _, _, _, _ = build(0, source=broken_source())
    with pytest.raises(RuntimeError, match="rollouter failed") as info:
        asyncio.run(asyncio.wait_for(loop.run(num_steps=10), 30.0))
    assert isinstance(info.value.__cause__, ValueError)


class _VirtualSelector:
    def __init__(self, loop: VirtualTimeLoop, inner: selectors.BaseSelector) -> None:
        self._loop, self._inner = loop, inner

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise RuntimeError("virtual-time loop: nothing ready and no timer (deadlock)")
        self._loop.vtime += max(timeout, 0.0)
        return self._inner.select(0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """Event loop whose clock jumps to the next timer (as the simulator's does)."""

    def __init__(self) -> None:
        super().__init__()
        self.vtime = 0.0
        self._selector = _VirtualSelector(self, self._selector)  # type: ignore[has-type]

    def time(self) -> float:
        return self.vtime


def run_virtual(steps: int) -> tuple[Any, ...]:
    loop = VirtualTimeLoop()
    try:
        fa, trainer, _, _, _ = build(400)
        for r in fa.replicas.values():
            r.tokens_per_s = 20.0  # type: ignore[attr-defined]
        trainer.train_s = 4.0
        result = loop.run_until_complete(fa.run(num_steps=steps))
    finally:
        loop.close()
    return (
        result.duration_s,
        result.activations,
        result.deactivations,
        tuple(result.consumed_sample_ids),
        tuple((r.step, round(r.time, 9), r.mq_size, r.before.deactivated) for r in result.records),
    )


def test_runs_on_a_virtual_time_loop_deterministically() -> None:
    first = run_virtual(30)
    duration, activations, deactivations, consumed, _ = first
    assert duration > 30 * 4.0  # minutes of virtual time, well under a second of real time
    assert activations >= 1 and deactivations >= 1
    assert len(consumed) == len(set(consumed)) == 30 * 4
    assert run_virtual(30) == first  # same inputs, same timeline


def test_doctest() -> None:
    assert doctest.testmod(loop_module).failed == 0


def test_colocated_loop_bounds_the_wait_for_a_replica_by_the_sample_timeout() -> None:
    class _Never:
        async def train_step(self, samples):  # type: ignore[no-untyped-def]
            return {}

        async def sync_weights(self, version):  # type: ignore[no-untyped-def]
            return None

    cfg = DynamicScheduleConfig(ppo_mini_batch_size=2)

    class _P(DynamicSchedulePolicyBase):
        def should_deactivate(self, g, a, c):  # type: ignore[no-untyped-def]
            return a

        def deactivate_wait_samples(self, c):  # type: ignore[no-untyped-def]
            return 0

        def should_activate_after_step(self, g, a, c):  # type: ignore[no-untyped-def]
            return True

    colocated = FullyAsyncLoop.build(
        cfg,
        _P(),
        _Never(),
        prompts=range(4),
        hybrid=[InMemoryReplica("h0", role="hybrid")],
        wait_timeout_s=1234.0,
    )
    assert colocated.client.options.no_replica_timeout_s == 1234.0  # type: ignore[attr-defined]
    mixed = FullyAsyncLoop.build(
        cfg,
        _P(),
        _Never(),
        prompts=range(4),
        standalone=[InMemoryReplica("s0")],
        hybrid=[InMemoryReplica("h0", role="hybrid")],
        wait_timeout_s=1234.0,
    )
    assert mixed.client.options.no_replica_timeout_s != 1234.0  # type: ignore[attr-defined]


async def test_loop_runs_over_the_parts_it_is_given() -> None:
    config = DynamicScheduleConfig(
        use_dynamic_resource_scheduling=True, ppo_mini_batch_size=2, trigger_parameter_sync_step=1
    )
    standalone = [InMemoryReplica("s0", tokens_per_s=5000.0)]
    replicas = ReplicaSet(
        standalone=standalone, hybrid=[InMemoryReplica("h0", role="hybrid", tokens_per_s=5000.0)]
    )
    queue = AsyncSampleQueue(capacity=config.max_queue_size)
    driver = ScheduleDriver(AlwaysActivate(), DynamicResourceController(replicas), queue, config)
    rollouter = Rollouter(
        prompts(40),
        RetryingClient(replicas),
        replicas,
        queue,
        RollouterOptions.from_config(config, max_tokens=48),
    )
    loop = FullyAsyncLoop(
        config, SleepingTrainer(standalone, 0.001), driver=driver, rollouter=rollouter
    )
    assert (
        loop.replicas is replicas and loop.queue is queue and loop.controller is driver.controller
    )
    result = await asyncio.wait_for(loop.run(num_steps=4), 30.0)
    assert result.steps == 4 and result.activations >= 1
    other = Rollouter([], RetryingClient(replicas), replicas, AsyncSampleQueue(), rollouter.options)
    with pytest.raises(ValueError, match="driver's queue"):
        FullyAsyncLoop(config, SleepingTrainer([]), driver=driver, rollouter=other)
    elsewhere = ReplicaSet()
    stray = Rollouter([], RetryingClient(elsewhere), elsewhere, queue, rollouter.options)
    with pytest.raises(ValueError, match="one ReplicaSet"):
        FullyAsyncLoop(config, SleepingTrainer([]), driver=driver, rollouter=stray)


async def test_a_replica_dying_mid_run_leaves_every_reader_consistent() -> None:
    loop, trainer, standalone, _, _ = build(400)
    trainer.standalone = lambda: loop.replicas.of_role("standalone")  # type: ignore[assignment]
    task = asyncio.create_task(loop.run(num_steps=10))
    while loop.driver.param_version < 2:
        await asyncio.sleep(0.005)
    standalone[0].kill()
    loop.replicas.mark_dead("s0")
    result = await asyncio.wait_for(task, 60.0)
    assert result.steps == 10 and result.samples_failed == 0
    assert loop.replicas.dead_ids == ["s0"] and loop.replicas.standalone_ids == ["s1"]
    assert await loop.router.routable() == ["s1"]
    last = result.records[-1]
    assert last.before.context is None or last.before.context.num_standalone_replicas == 1
    assert all(o for o in result.consumed_sample_ids)
