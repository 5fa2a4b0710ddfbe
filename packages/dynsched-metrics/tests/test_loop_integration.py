"""The aggregator over a multi-cycle in-memory run of the core reference loop."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from dynsched_core import (
    DynamicScheduleConfig,
    DynamicSchedulePolicyBase,
    EventBus,
    FullyAsyncLoop,
)
from dynsched_core.testing import InMemoryReplica
from dynsched_metrics import (
    CYCLE_METRIC_KEYS,
    MQ_SIZE,
    RESOURCE_UTILIZATION,
    ROLLOUT_RESOURCE_UTILIZATION,
    STEP_GENERATED_SAMPLES,
    TRAIN_ALLOCATED_TIME_S,
    TRAIN_COMPUTE_TIME_S,
    TRAIN_RESOURCE_UTILIZATION,
    DictSink,
    MetricsAggregator,
    train_compute_time,
)

T = 2
CYCLES = 3


class Toggle(DynamicSchedulePolicyBase):
    """Hybrid generates while the trainer waits, sleeps while it trains."""

    def should_deactivate(self, global_steps, is_hybrid_active, ctx):
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx):
        return ctx.required_samples

    def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):
        return True


class Never(Toggle):
    def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):
        return False


class Trainer:
    async def train_step(self, samples):
        await asyncio.sleep(0.004)
        return {"update_actor": 0.003, "old_log_prob": 0.001}

    async def sync_weights(self, version):
        await asyncio.sleep(0.001)


async def run_loop(policy):
    cfg = DynamicScheduleConfig(
        use_dynamic_resource_scheduling=True,
        ppo_mini_batch_size=2,
        trigger_parameter_sync_step=T,
        concurrent_samples_per_replica=2,
        trainer_nnodes=1,
        trainer_n_gpus_per_node=1,
        rollout_nnodes=1,
        rollout_n_gpus_per_node=1,
    )
    bus = EventBus()
    sink = DictSink()
    agg = MetricsAggregator.from_config(cfg, bus=bus, sinks=[sink])
    loop = FullyAsyncLoop.build(
        cfg,
        policy,
        Trainer(),
        prompts=range(1000),
        standalone=[InMemoryReplica("s0", tokens_per_s=4000)],
        hybrid=[InMemoryReplica("h0", role="hybrid", tokens_per_s=4000)],
        events=bus,
        max_tokens=8,
        wait_timeout_s=30,
    )
    result = await asyncio.wait_for(loop.run(num_steps=T * CYCLES), 60)
    return agg, sink, result


@pytest.mark.parametrize("policy", [Toggle(), Never()], ids=["toggle", "never"])
async def test_aggregator_over_reference_loop_emits_every_key_once_per_cycle(policy):
    agg, sink, result = await run_loop(policy)
    assert result.steps == T * CYCLES
    assert agg.finish() == []  # every cycle was already closed with its own window
    assert [r.step for r in agg.records] == [T * (c + 1) for c in range(CYCLES)]
    per_key = Counter((row["step"], key) for row in sink.rows for key in row if key != "step")
    assert len(per_key) == CYCLES * len(CYCLE_METRIC_KEYS)
    assert set(per_key.values()) == {1}
    for rec in agg.records:
        assert tuple(rec.metrics) == CYCLE_METRIC_KEYS

    by_step = {r.step: r for r in result.records}
    for c, rec in enumerate(agg.records):
        steps = [by_step[s] for s in range(c * T + 1, (c + 1) * T + 1)]
        compute = sum(train_compute_time(s.timings) for s in steps)
        alloc = sum(s.allocated_s for s in steps)
        m = rec.metrics
        assert m[TRAIN_COMPUTE_TIME_S] == pytest.approx(compute)
        assert m[TRAIN_ALLOCATED_TIME_S] == pytest.approx(alloc)
        assert m[TRAIN_RESOURCE_UTILIZATION] == pytest.approx(min(1.0, compute / alloc))
        assert m[MQ_SIZE] == steps[-1].mq_size
        assert m[STEP_GENERATED_SAMPLES] >= 0
        for key in (TRAIN_RESOURCE_UTILIZATION, ROLLOUT_RESOURCE_UTILIZATION, RESOURCE_UTILIZATION):
            assert 0.0 <= m[key] <= 1.0
        assert rec.param_version == c + 1  # the window closed by this cycle's own sync
    # windows partition the run: each starts where the previous one ended
    wins = agg.recorder.windows
    assert len(wins) == CYCLES
    assert all(wins[i + 1].start == wins[i].end for i in range(CYCLES - 1))
    total_generated = sum(r.metrics[STEP_GENERATED_SAMPLES] for r in agg.records)
    assert total_generated <= result.samples_produced
    if isinstance(policy, Never):  # hybrid never generates: x = 0, U = (a*U_t + b*U_r)/(a+b)
        for r in agg.records:
            assert r.x == 0.0
            m = r.metrics
            expected = (m[TRAIN_RESOURCE_UTILIZATION] + m[ROLLOUT_RESOURCE_UTILIZATION]) / 2
            assert m[RESOURCE_UTILIZATION] == pytest.approx(expected)
    else:  # hybrid generated while the trainer waited
        assert any(r.x > 0.0 for r in agg.records)
        assert result.deactivations >= CYCLES
