"""Rollouter: staleness admission, concurrency cap, capacity changes, end-of-stream."""

from __future__ import annotations

import asyncio
import doctest
from typing import Any

import dynsched_core._rollouter as rollouter_module
import pytest
from dynsched_core import (
    AsyncSampleQueue,
    DynamicScheduleConfig,
    EventBus,
    GenerateRequest,
    InMemoryReplica,
    Prompt,
    ReplicaSet,
    RetryingClient,
    Rollouter,
    RollouterOptions,
    RolloutSample,
)
from dynsched_core._client import RolloutOutcome
from dynsched_core.events import RolloutEvent, StalenessResetEvent
from hypothesis import given
from hypothesis import strategies as st


class GatedClient:
    """A client whose requests finish only when released (no timing involved)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.fail: set[str] = set()

    async def generate(self, request: GenerateRequest) -> RolloutOutcome:
        self.started.append(request.request_id)
        gate = self.gates.setdefault(request.request_id, asyncio.Event())
        await gate.wait()
        if request.request_id in self.fail:
            raise RuntimeError("boom")
        return RolloutOutcome(request_id=request.request_id, num_tokens=1, output_tokens=(0,))

    def release_all(self) -> None:
        for rid in self.started:
            self.gates.setdefault(rid, asyncio.Event()).set()

    def samples_started(self) -> set[str]:
        return {rid.split("/")[0] for rid in self.started}


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def make(
    *, prompts: Any, routable: int = 1, events: EventBus | None = None, **kw: Any
) -> tuple[Rollouter, GatedClient, ReplicaSet, AsyncSampleQueue]:
    client = GatedClient()
    replicas = ReplicaSet(standalone=[InMemoryReplica(f"r{i}") for i in range(routable)])
    await replicas.route(replicas.standalone_ids)
    queue = AsyncSampleQueue()
    params: dict[str, Any] = {"required_samples": 2, "n": 2, "trigger_parameter_sync_step": 1}
    params.update(kw)
    rollouter = Rollouter(
        prompts, client, replicas, queue, RollouterOptions(**params), events=events
    )
    return rollouter, client, replicas, queue


async def test_staleness_admission_per_version() -> None:
    # max_required = (1 + 0.5) * 2 * 2 = 6 samples per version; plenty of concurrency.
    rollouter, client, _, queue = await make(
        prompts=range(100),
        staleness_threshold=0.5,
        trigger_parameter_sync_step=2,
        concurrent_samples_per_replica=100,
    )
    assert rollouter.max_required_samples == 6
    task = rollouter.start()
    await settle()
    assert rollouter.stats().admitted == 6 and rollouter.active == 6
    client.release_all()
    await settle()
    assert rollouter.stats().admitted == 6  # finishing does not reopen the window
    assert await queue.size() == 6
    await queue.get(4)
    await rollouter.reset_staleness(1)
    await settle()
    # verl's rule: the new window starts with the 2 queued samples: 4 more may be admitted
    assert rollouter.options.staleness_rule == "in_flight_and_queued"
    assert rollouter.stats().admitted == 10
    assert rollouter.stats().window_admitted == 6
    await rollouter.stop()
    await task


async def test_in_flight_staleness_rule_ignores_queued_samples() -> None:
    # same sequence as above, with the explicit "in_flight" rule
    rollouter, client, _, queue = await make(
        prompts=range(100),
        staleness_threshold=0.5,
        trigger_parameter_sync_step=2,
        concurrent_samples_per_replica=100,
        staleness_rule="in_flight",
    )
    task = rollouter.start()
    await settle()
    client.release_all()
    await settle()
    await queue.get(4)
    await rollouter.reset_staleness(1)
    await settle()
    # nothing in flight, 2 queued: they do not count, a full budget of 6 is admitted
    assert rollouter.stats().admitted == 12
    assert rollouter.stats().window_admitted == 6
    # so in flight + queued exceeds the budget verl's rule would keep
    assert rollouter.active + await queue.size() == 8 > rollouter.max_required_samples
    # in flight samples do count: 6 in flight now, the next window starts full
    await rollouter.reset_staleness(2)
    await settle()
    assert rollouter.stats().admitted == 12 and rollouter.stats().window_admitted == 6
    await rollouter.stop()
    await task


def test_staleness_rule_is_validated_and_read_from_the_config() -> None:
    from dynsched_core import DynamicScheduleConfig
    from dynsched_core.errors import ConfigError

    with pytest.raises(ConfigError, match="staleness_rule"):
        RollouterOptions(required_samples=2, staleness_rule="queued_only")  # type: ignore[arg-type]
    cfg = DynamicScheduleConfig.from_dict({"async_training": {"staleness_rule": "in_flight"}})
    assert RollouterOptions.from_config(cfg).staleness_rule == "in_flight"
    default = RollouterOptions.from_config(DynamicScheduleConfig())
    assert default.staleness_rule == "in_flight_and_queued"


@given(
    rule=st.sampled_from(["in_flight_and_queued", "in_flight"]),
    ops=st.lists(st.sampled_from(["release", "consume", "reset", "tick"]), max_size=30),
)
async def test_verl_rule_bounds_in_flight_plus_queued(rule: str, ops: list[str]) -> None:
    """Under verl's rule in flight + queued never exceeds max_required_samples; under the
    in-flight rule the queue may hold more (bounded only by its capacity)."""
    rollouter, client, _, queue = await make(
        prompts=range(1000),
        staleness_threshold=0.5,
        trigger_parameter_sync_step=2,
        concurrent_samples_per_replica=100,
        staleness_rule=rule,
    )
    task = rollouter.start()
    await settle()
    version = 0
    peak = rollouter.active + await queue.size()
    for op in ops:
        if op == "release":
            client.release_all()
        elif op == "consume" and await queue.size() >= 2:
            await queue.get(2)
        elif op == "reset":
            version += 1
            await rollouter.reset_staleness(version)
        await settle()
        total = rollouter.active + await queue.size()
        peak = max(peak, total)
        if rule == "in_flight_and_queued":
            assert total <= rollouter.max_required_samples
    await rollouter.stop()
    await task
    assert peak >= rollouter.max_required_samples  # the first window is admitted at once


async def test_concurrency_cap_follows_routable_set_immediately() -> None:
    events = EventBus()
    seen: list[RolloutEvent] = []
    events.subscribe(seen.append, RolloutEvent)
    rollouter, client, replicas, _ = await make(
        prompts=range(100),
        routable=1,
        events=events,
        concurrent_samples_per_replica=2,
        staleness_threshold=10.0,
    )
    task = rollouter.start()
    await settle()
    assert rollouter.capacity == 2 and rollouter.active == 2
    replicas.add(InMemoryReplica("r9"))
    assert rollouter.capacity == 2  # a member is not capacity until it is routable
    await replicas.route(["r9"])  # capacity 4, noticed before any completion
    await settle()
    assert rollouter.capacity == 4 and rollouter.active == 4
    assert not any(e.kind == "complete" for e in seen)
    await replicas.unroute(["r0"])
    replicas.mark_dead("r9")  # a death takes capacity away at once
    await settle()
    assert rollouter.capacity == 0
    client.release_all()
    await settle()
    assert rollouter.active == 0  # nothing admitted without routable replicas
    kinds = [e.kind for e in seen]
    assert kinds[0] == "seed" and kinds.count("capacity") == 4  # 2, 4, 2, 0
    assert all(e.active <= max(e.capacity, 4) for e in seen)
    await rollouter.stop()
    await task


async def test_end_of_stream_closes_queue_and_failed_samples_are_not_queued() -> None:
    rollouter, client, _, queue = await make(prompts=range(5), staleness_threshold=10.0)
    client.fail.add("p3/1")
    task = rollouter.start()
    await settle()
    client.release_all()
    await asyncio.wait_for(task, 2.0)
    stats = await queue.stats()
    assert stats.closed and stats.produced == 4
    samples = await queue.get(10, timeout=0.1)
    assert sorted(s.sample_id for s in samples) == ["p0", "p1", "p2", "p4"]
    assert rollouter.stats().failed == 1 and rollouter.stats().completed == 4
    assert rollouter.finished and rollouter.active == 0


async def test_pause_resume_and_stop_cancels_in_flight() -> None:
    rollouter, _, _, queue = await make(prompts=range(50), staleness_threshold=10.0)
    rollouter.pause()
    task = rollouter.start()
    await settle()
    assert rollouter.active == 0
    rollouter.resume()
    await settle()
    assert rollouter.active > 0
    await rollouter.stop()
    await task
    assert rollouter.stats().cancelled > 0 and rollouter.active == 0
    assert (await queue.stats()).closed


async def test_reset_emits_window_events() -> None:
    events = EventBus()
    seen: list[Any] = []
    events.subscribe(seen.append)
    rollouter, client, _, _ = await make(prompts=range(3), events=events, staleness_threshold=10.0)
    task = rollouter.start()
    await settle()
    client.release_all()
    await asyncio.wait_for(task, 2.0)
    reset = await rollouter.reset_staleness(4)
    assert isinstance(reset, StalenessResetEvent)
    assert reset.param_version == 4 and reset.step_generated_samples == 3
    assert seen[-1] is reset and seen[-2].kind == "reset"
    assert rollouter.param_version == 4


async def test_real_generation_with_groups_and_versions() -> None:
    replicas = ReplicaSet(standalone=[InMemoryReplica("s0", tokens_per_s=1e5)])
    await replicas.route(["s0"])
    queue = AsyncSampleQueue()
    prompts = [Prompt(prompt_id=f"q{i}", max_tokens=32, target_lens=(5, 9, 32)) for i in range(4)]
    rollouter = Rollouter(
        prompts,
        RetryingClient(replicas),
        replicas,
        queue,
        RollouterOptions(required_samples=4, n=3),
    )
    await asyncio.wait_for(rollouter.run(), 5.0)
    samples: list[RolloutSample] = await queue.get(4, timeout=1.0)
    for s in samples:
        assert [r.num_tokens for r in s.responses] == [5, 9, 32]
        assert [r.request_id for r in s.responses] == [f"{s.sample_id}/{i}" for i in range(3)]
        assert s.param_version == 0 and s.max_param_version == 0
        assert s.num_tokens == 46 and s.completed_at >= s.submitted_at


@given(
    required=st.integers(1, 4),
    t=st.integers(1, 3),
    staleness=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    per_replica=st.integers(1, 3),
    routable=st.integers(1, 3),
)
def test_admission_never_exceeds_either_limit(
    required: int, t: int, staleness: float, per_replica: int, routable: int
) -> None:
    async def scenario() -> None:
        rollouter, client, _, queue = await make(
            prompts=range(1000),
            routable=routable,
            required_samples=required,
            trigger_parameter_sync_step=t,
            staleness_threshold=staleness,
            concurrent_samples_per_replica=per_replica,
        )
        cap = min(routable * per_replica, rollouter.max_required_samples)
        task = rollouter.start()
        admitted_before = 0
        for version in range(1, 4):
            await settle()
            assert rollouter.active <= cap
            # drain the version: finish everything, then consume and open the next window
            for _ in range(20):
                client.release_all()
                await settle()
                assert rollouter.active <= cap
            assert rollouter.stats().window_admitted <= rollouter.max_required_samples
            assert rollouter.stats().admitted - admitted_before <= rollouter.max_required_samples
            admitted_before = rollouter.stats().admitted
            queue.get_nowait()
            await rollouter.reset_staleness(version)
        await rollouter.stop()
        await task

    asyncio.run(scenario())


def test_validation_and_doctest() -> None:
    with pytest.raises(ValueError, match="RollouterOptions.required_samples"):
        RollouterOptions(required_samples=0)
    with pytest.raises(TypeError, match="RollouterOptions.n"):
        RollouterOptions(required_samples=1, n=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="RollouterOptions.put_timeout_s"):
        RollouterOptions(required_samples=1, put_timeout_s=0.0)
    with pytest.raises(TypeError, match="ReplicaSet"):
        Rollouter([], GatedClient(), {}, AsyncSampleQueue(), RollouterOptions(required_samples=1))  # type: ignore[arg-type]
    assert doctest.testmod(rollouter_module).failed == 0


def test_options_from_config_and_the_one_definition_of_the_derived_counts() -> None:
    cfg = DynamicScheduleConfig(
        ppo_mini_batch_size=7,
        trigger_parameter_sync_step=3,
        staleness_threshold=0.3,
        concurrent_samples_per_replica=5,
        n=4,
    )
    options = RollouterOptions.from_config(cfg, max_tokens=9)
    assert (options.required_samples, options.n, options.max_tokens) == (7, 4, 9)
    assert options.max_required_samples == cfg.max_required_samples == int(21 * 1.3)
    for routable in range(8):
        assert options.capacity(routable) == cfg.max_concurrent_samples(routable)
