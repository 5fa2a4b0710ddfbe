"""Each built-in policy driving the core reference loop over in-memory replicas.

Runs on a small virtual-time event loop defined here (so the test depends on nothing but
dynsched-core and is independent of the machine's speed): ``asyncio.sleep`` jumps the
clock instead of waiting, and a program that can never progress raises instead of hanging.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import pytest
from dynsched_core import DynamicScheduleConfig, FullyAsyncLoop, LoopResult
from dynsched_core.testing import InMemoryReplica
from dynsched_policies import BUILTIN_POLICIES

T = TypeVar("T")


# ----------------------------------------------------------------------------------
# virtual time
# ----------------------------------------------------------------------------------
class LoopDeadlock(RuntimeError):
    """Nothing is runnable and no timer is pending."""


class _JumpSelector:
    def __init__(self, loop: _VirtualLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise LoopDeadlock(f"t={self._loop.time():.3f}: nothing runnable, no timer pending")
        self._loop.jump(timeout)
        return []

    def close(self) -> None:
        pass


class _VirtualLoop(asyncio.BaseEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self._clock_resolution = 1e-9
        self._selector = _JumpSelector(self)

    def time(self) -> float:
        return self._now

    def jump(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass  # single-threaded: nothing to wake up


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    loop = _VirtualLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


# ----------------------------------------------------------------------------------
# the trainer and the loop
# ----------------------------------------------------------------------------------
class SleepTrainer:
    """Trains by sleeping ``step_s(step)`` seconds; weight sync takes ``sync_s``."""

    def __init__(self, step_s: Callable[[int], float], sync_s: float = 1.0) -> None:
        self.step_s = step_s
        self.sync_s = sync_s
        self.steps = 0
        self.samples: list[Any] = []

    async def train_step(self, samples: Sequence[Any]) -> dict[str, float]:
        self.steps += 1
        self.samples.extend(samples)
        seconds = self.step_s(self.steps)
        await asyncio.sleep(seconds)
        return {"update_actor": seconds}

    async def sync_weights(self, version: int) -> None:
        await asyncio.sleep(self.sync_s)


MAX_TOKENS = 64


def run_loop(
    policy_name: str,
    *,
    num_steps: int,
    step_s: Callable[[int], float],
    standalone_tokens_per_s: float | None,
    hybrid_tokens_per_s: float = 64.0,
    staleness: float = 1.0,
) -> tuple[LoopResult, InMemoryReplica]:
    """Build config, policy and replicas; run ``num_steps`` micro-steps on virtual time.

    Each sample is one response of ``MAX_TOKENS`` tokens; 4 samples per micro-step, a
    weight sync every 2 micro-steps (8 samples per cycle), 2 samples in flight per replica.
    ``standalone_tokens_per_s=None`` means no standalone replica (colocated).
    """
    colocated = standalone_tokens_per_s is None
    config = DynamicScheduleConfig(
        use_dynamic_resource_scheduling=True,
        dynamic_schedule_policy=policy_name,
        dynamic_schedule_deactivate_ratio=0.3,
        ppo_mini_batch_size=4,
        trigger_parameter_sync_step=2,
        staleness_threshold=staleness,
        concurrent_samples_per_replica=2,
        n=1,
        trainer_nnodes=1,
        trainer_n_gpus_per_node=1,
        rollout_nnodes=0 if colocated else 1,
        rollout_n_gpus_per_node=1,
    )
    policy = config.build_policy()
    assert type(policy) is BUILTIN_POLICIES[policy_name]
    standalone = [] if colocated else [InMemoryReplica("s0", tokens_per_s=standalone_tokens_per_s)]
    hybrid = InMemoryReplica("h0", role="hybrid", tokens_per_s=hybrid_tokens_per_s)
    loop = FullyAsyncLoop.build(
        config,
        policy,
        SleepTrainer(step_s),
        prompts=range(10_000),
        standalone=standalone,
        hybrid=[hybrid],
        max_tokens=MAX_TOKENS,
        wait_timeout_s=10_000.0,
    )

    async def main() -> LoopResult:
        return await asyncio.wait_for(loop.run(num_steps), timeout=1e7)

    return run_virtual(main()), hybrid


def sync_records(result: LoopResult) -> list[Any]:
    return [r.after for r in result.records if r.after is not None]


# ----------------------------------------------------------------------------------
# the behaviour of each policy
# ----------------------------------------------------------------------------------
def test_static_never_activates_with_standalone_replicas() -> None:
    # slow standalone replica, fast trainer: the queue runs dry, static still never helps
    result, hybrid = run_loop(
        "static_fully_async", num_steps=10, step_s=lambda _: 0.5, standalone_tokens_per_s=4.0
    )
    assert result.steps == 10 and result.ended_by == "steps"
    assert result.activations == 0
    syncs = sync_records(result)
    assert len(syncs) == 5
    assert not any(a.should_activate or a.activated or a.forced for a in syncs)
    assert all(a.hybrid_sync_skipped for a in syncs)
    assert hybrid.completed == 0 and hybrid.generated_tokens == 0
    assert result.samples_consumed == 40


def test_default_activates_when_queue_runs_dry_and_stops_when_it_does_not() -> None:
    fast_steps = 10  # trainer 0.1 s per micro-step: the standalone replica cannot keep up

    def step_s(step: int) -> float:
        return 0.1 if step <= fast_steps else 300.0  # then training is the bottleneck

    result, hybrid = run_loop("default", num_steps=30, step_s=step_s, standalone_tokens_per_s=4.0)
    assert result.steps == 30 and result.ended_by == "steps"
    records = result.records
    dry = [r for r in records if r.step <= fast_steps]
    full = [r for r in records if r.step > fast_steps + 2]

    # phase 1: the trainer waits for samples; hybrid replicas are activated after syncs
    assert sum(r.waited_samples for r in dry) > 0
    dry_syncs = [r.after for r in dry if r.after is not None]
    assert dry_syncs and all(a.should_activate and a.activated and not a.forced for a in dry_syncs)
    assert all(r.before.deactivated for r in dry if r.step % 2 == 1 and r.step > 1)
    assert hybrid.completed > 0

    # phase 2: samples are buffered ahead of demand; the policy stops activating
    full_syncs = [r.after for r in full if r.after is not None]
    assert full_syncs
    assert not any(a.should_activate or a.activated for a in full_syncs)
    assert all(a.hybrid_sync_skipped for a in full_syncs)
    assert not any(r.before.deactivated for r in full)
    assert all(r.waited_samples == 0 for r in full)


def test_fixed_ratio_activates_only_while_behind() -> None:
    result, _ = run_loop(
        "fixed_ratio",
        num_steps=24,
        step_s=lambda s: 0.1 if s <= 8 else 300.0,
        standalone_tokens_per_s=4.0,
    )
    syncs = [r.after for r in result.records if r.after is not None]
    assert any(a.activated for a in syncs[:4])
    assert not any(a.should_activate for a in syncs[-4:])


@pytest.mark.parametrize("name", sorted(BUILTIN_POLICIES))
def test_only_hybrid_completes_training_with_every_policy(name: str) -> None:
    num_steps = 8
    result, hybrid = run_loop(
        name, num_steps=num_steps, step_s=lambda _: 2.0, standalone_tokens_per_s=None
    )
    assert result.steps == num_steps and result.ended_by == "steps"
    assert result.samples_consumed == 4 * num_steps
    assert hybrid.completed >= 4 * num_steps
    syncs = sync_records(result)
    assert len(syncs) == num_steps // 2
    # the colocated schedule is the driver's guard rail: it activates whatever the policy
    # proposed, and says so whenever it had to correct the proposal
    assert all(a.activated for a in syncs[:-1])
    for a in syncs[:-1]:
        assert [o.rule for o in a.overrides] == ([] if a.should_activate else ["colocated"])
    # hybrid replicas never held the GPUs during training: each cycle starts by buffering
    # the whole cycle (8 samples), then deactivates
    first_of_cycle = [r.before for r in result.records if r.step % 2 == 1]
    assert all(
        b.deactivated and b.wait_target == 8 and not b.wait_timed_out for b in first_of_cycle
    )
