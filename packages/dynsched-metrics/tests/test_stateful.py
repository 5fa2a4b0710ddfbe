"""Stateful test of recorder + aggregator under any interleaving of events."""

from __future__ import annotations

import doctest
import math

import dynsched_metrics._recorder as recorder_module
from dynsched_core import EventBus
from dynsched_core.events import RolloutEvent, StalenessResetEvent, TrainStepEvent
from dynsched_metrics import (
    CYCLE_METRIC_KEYS,
    RESOURCE_UTILIZATION,
    ROLLOUT_RESOURCE_UTILIZATION,
    TRAIN_RESOURCE_UTILIZATION,
    MetricsAggregator,
)
from dynsched_metrics._definitions import rollout_resource_utilization_reference
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

gaps = st.floats(min_value=0.0, max_value=5.0, allow_nan=False)


class AggregatorMachine(RuleBasedStateMachine):
    @initialize(seed_cap=st.integers(0, 8), a=st.integers(0, 8), b=st.integers(0, 8))
    def start(self, seed_cap, a, b):
        self.bus = EventBus()
        self.agg = MetricsAggregator(hybrid_gpus=a, standalone_gpus=b, bus=self.bus)
        self.t = 0.0
        self.step = 0
        self.version = 0
        self.sync_steps: list[int] = []
        self.resets = 0
        self.bus.emit(RolloutEvent(self.t, 0, seed_cap, "seed"))

    @rule(
        dt=gaps,
        active=st.integers(0, 12),
        cap=st.integers(0, 8),
        kind=st.sampled_from(["submit", "complete", "drain", "capacity"]),
    )
    def rollout(self, dt, active, cap, kind):
        self.t += dt
        self.bus.emit(RolloutEvent(self.t, active, cap, kind))

    @rule(dt=gaps, sync=st.booleans(), compute=gaps, extra=gaps, wait=gaps, hybrid=st.booleans())
    def micro_step(self, dt, sync, compute, extra, wait, hybrid):
        self.t += dt
        self.step += 1
        timings = {"update_actor": compute, "wait_for_enough_samples": wait, "step": dt}
        self.bus.emit(
            TrainStepEvent(self.step, self.t, timings, compute + extra, self.step, sync, hybrid)
        )
        if sync:
            self.sync_steps.append(self.step)

    @rule(dt=gaps)
    def reset(self, dt):
        self.t += dt
        self.version += 1
        self.resets += 1
        self.bus.emit(StalenessResetEvent(self.t, self.version, 0))

    @invariant()
    def one_record_per_paired_cycle(self):
        records = self.agg.records
        assert len(records) == min(len(self.sync_steps), self.resets)
        assert [r.step for r in records] == self.sync_steps[: len(records)]

    @invariant()
    def every_key_once_and_in_range(self):
        for r in self.agg.records:
            assert tuple(r.metrics) == CYCLE_METRIC_KEYS
            for key in (
                TRAIN_RESOURCE_UTILIZATION,
                ROLLOUT_RESOURCE_UTILIZATION,
                RESOURCE_UTILIZATION,
            ):
                assert 0.0 <= r.metrics[key] <= 1.0

    @invariant()
    def windows_partition_time_and_match_reference(self):
        wins = self.agg.recorder.windows
        for i in range(len(wins) - 1):
            assert wins[i + 1].start == wins[i].end
        for r, w in zip(self.agg.records, wins, strict=False):
            ref = rollout_resource_utilization_reference(
                w.points(), w.end, seed_placeholder=w.seed_placeholder
            )
            assert math.isclose(
                r.metrics[ROLLOUT_RESOURCE_UTILIZATION], ref, rel_tol=1e-9, abs_tol=1e-12
            )


TestAggregatorMachine = AggregatorMachine.TestCase


def test_recorder_docstring_example():
    failures, tried = doctest.testmod(recorder_module, verbose=False)
    assert tried > 0 and failures == 0
