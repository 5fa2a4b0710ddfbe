"""Memory is conserved: an awake hybrid engine holds memory on the trainer GPUs, so the
trainer cannot train there until it sleeps, and no policy gains by skipping a deactivation."""

from __future__ import annotations

import pytest
from dynsched_core import DynamicSchedulePolicyBase, available_policies, register_policy
from dynsched_sim import (
    MemoryConservationError,
    ScenarioError,
    SimReplica,
    SimTrainer,
    load_scenario,
    run_configuration,
    run_virtual,
)
from dynsched_sim.calibrate import scenario_to_dict

NEVER = "test_never_deactivate"
AT_BATCH = "test_deactivate_when_batch_ready"

if NEVER not in available_policies():

    @register_policy(NEVER)
    class NeverDeactivate(DynamicSchedulePolicyBase):
        """Activates after every weight sync and never deactivates."""

        def __init__(self, deactivate_ratio: float = 0.0, only_hybrid: bool = False) -> None:
            self.only_hybrid = only_hybrid

        def should_deactivate(self, global_steps, is_hybrid_active, ctx):  # type: ignore[no-untyped-def]
            return False

        def deactivate_wait_samples(self, ctx):  # type: ignore[no-untyped-def]
            return 0

        def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):  # type: ignore[no-untyped-def]
            return True


if AT_BATCH not in available_policies():

    @register_policy(AT_BATCH)
    class DeactivateWhenBatchReady(DynamicSchedulePolicyBase):
        """The same decisions, but it deactivates itself once the step's batch is buffered."""

        def __init__(self, deactivate_ratio: float = 0.0, only_hybrid: bool = False) -> None:
            self.only_hybrid = only_hybrid

        def should_deactivate(self, global_steps, is_hybrid_active, ctx):  # type: ignore[no-untyped-def]
            return is_hybrid_active

        def deactivate_wait_samples(self, ctx):  # type: ignore[no-untyped-def]
            return ctx.required_samples

        def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):  # type: ignore[no-untyped-def]
            return True


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_never_deactivating_gains_nothing_on_colocated(seed: int) -> None:
    sc = load_scenario("colocated")
    never = run_configuration(sc, "colocated-32", NEVER, seed=seed)
    assert all(never.conservation.values())
    # the trainer put the engines to sleep itself before every cycle's first step
    assert never.summary["forced_deactivations"] >= sc.steps // 4
    assert never.summary["deactivations"] == 0
    for pol in ("default", "static_fully_async", "fixed_ratio", AT_BATCH):
        other = run_configuration(sc, "colocated-32", pol, seed=seed)
        assert other.summary["forced_deactivations"] == 0
        assert never.wall_clock_s >= other.wall_clock_s * (1 - 1e-9), (pol, never, other)


def test_skipping_a_deactivation_is_the_deactivation_it_skipped() -> None:
    """With standalone replicas, never deactivating is exactly deactivating at the moment
    the batch is ready: same wall-clock, the switch cost is paid either way."""
    sc = load_scenario("seed-qwen35").with_steps(12)
    never = run_configuration(sc, "dynamic-16-16", NEVER)
    explicit = run_configuration(sc, "dynamic-16-16", AT_BATCH)
    # activation happens after each weight sync: one deactivation per cycle of 4 steps
    assert never.summary["forced_deactivations"] == 3 and never.summary["deactivations"] == 0
    assert explicit.summary["deactivations"] == 3
    assert never.wall_clock_s == pytest.approx(explicit.wall_clock_s, rel=1e-6)
    assert never.wall_clock_s >= explicit.wall_clock_s * (1 - 1e-9)
    # an awake engine never overlapped a training step: the engines slept every step
    assert never.true_utilization["trainer"]["train"] == pytest.approx(
        explicit.true_utilization["trainer"]["train"], rel=1e-6
    )


def test_training_next_to_an_awake_engine_is_refused() -> None:
    sc = load_scenario("seed-qwen35")

    async def main() -> None:
        rep = SimReplica("h", sc.engine, sc.hardware, sc.model, role="hybrid")
        await rep.wake_up()
        trainer = SimTrainer(
            sc.trainer,
            8,
            standalone=[],
            hybrid=[rep],
            tokens_of=lambda s: 100,
            hardware=sc.hardware,
            llm=sc.model,
        )
        with pytest.raises(MemoryConservationError, match="still hold memory"):
            await trainer.train_step([object()])
        slept: list[bool] = []

        async def reclaim() -> None:
            await rep.sleep()
            slept.append(True)

        trainer.set_reclaim(reclaim)
        await trainer.train_step([object()])
        assert slept == [True] and trainer.reclaims == 1 and trainer.steps == 1

    run_virtual(main())


def test_resident_trainer_state_must_leave_room_for_an_awake_engine() -> None:
    d = scenario_to_dict(load_scenario("seed-qwen35"))
    d["trainer"]["offload_state"] = False  # 35 B x 18 bytes over 16 GPUs: 36.7 GiB per GPU
    from dynsched_sim import scenario_from_dict

    scenario_from_dict(d)  # next to a 0.45 x 95.6 GiB engine: fits
    d["engine"]["hybrid_memory_fraction"] = 0.7
    with pytest.raises(ScenarioError, match="does not fit next to the resident trainer state"):
        scenario_from_dict(d)
