"""DynamicScheduleConfig: verl keys from dicts and YAML, warnings, errors, derived values."""

from __future__ import annotations

import doctest
import textwrap
import warnings
from pathlib import Path
from typing import Any

import dynsched_core._config as config_module
import pytest
from dynsched_core import (
    ConfigError,
    DynamicScheduleConfig,
    DynamicSchedulePolicyBase,
    register_policy,
)
from dynsched_core._config import ConfigWarning
from dynsched_core.errors import ConfigTypeError
from hypothesis import given
from hypothesis import strategies as st

VERL = {
    "hydra": {"searchpath": ["file://verl/trainer/config"]},
    "defaults": ["ppo_trainer", "_self_"],
    "async_training": {
        "use_dynamic_resource_scheduling": True,
        "dynamic_schedule_policy": "fixed_ratio",
        "dynamic_schedule_deactivate_ratio": 0.6,
        "dynamic_schedule_enable_rebalance": False,
        "concurrent_samples_per_replica": 8,
        "staleness_threshold": 0.5,
        "trigger_parameter_sync_step": 4,
        "require_batches": 2,
        "partial_rollout": True,
        "use_trainer_do_validate": False,
    },
    "trainer": {"nnodes": 2, "n_gpus_per_node": 8, "project_name": "p", "logger": ["console"]},
    "rollout": {"nnodes": 1, "n_gpus_per_node": 4, "n": 4, "total_rollout_steps": 1000},
    "actor_rollout_ref": {
        "actor": {"ppo_mini_batch_size": 16, "use_rollout_log_probs": True},
        "rollout": {"n": 8, "tensor_model_parallel_size": 2, "calculate_log_probs": True},
    },
    "data": {"gen_batch_size": 1, "max_response_length": 2048, "train_files": "x.parquet"},
    "algorithm": {"rollout_correction": {"bypass_mode": True}},
}


def test_verl_nested_layout() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a real verl config must not warn
        cfg = DynamicScheduleConfig.from_dict(VERL)
    assert cfg.use_dynamic_resource_scheduling
    assert cfg.dynamic_schedule_policy == "fixed_ratio"
    assert cfg.dynamic_schedule_deactivate_ratio == 0.6
    assert cfg.dynamic_schedule_enable_rebalance is False
    assert cfg.concurrent_samples_per_replica == 8
    assert cfg.n == 8  # actor_rollout_ref.rollout.n wins over rollout.n
    assert (cfg.trainer_nnodes, cfg.trainer_n_gpus_per_node) == (2, 8)
    assert (cfg.rollout_nnodes, cfg.rollout_n_gpus_per_node) == (1, 4)
    assert cfg.total_rollout_steps == 1000
    assert cfg.max_response_length == 2048 and cfg.max_prompt_length == 512
    # derived values
    assert cfg.required_samples == 32  # 16 * 2
    assert cfg.step_required_samples == 128
    assert cfg.max_required_samples == 192  # (1 + 0.5) * 32 * 4
    assert cfg.buffer_samples == 64
    assert cfg.hybrid_gpus == 16 and cfg.standalone_gpus == 4
    assert cfg.num_standalone_replicas == 2 and cfg.num_hybrid_replicas == 8
    assert not cfg.only_hybrid
    assert cfg.max_concurrent_samples(3) == 24 and cfg.max_concurrent_samples(100) == 192


def test_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "fully_async.yaml"
    path.write_text(
        textwrap.dedent(
            """
            hydra:
              searchpath: [file://verl/trainer/config]
            async_training:
              use_dynamic_resource_scheduling: True
              staleness_threshold: 0.1
              trigger_parameter_sync_step: 2
              require_batches: 1
              partial_rollout: true
            rollout:
              nnodes: 0
              n_gpus_per_node: 8
            actor_rollout_ref:
              actor:
                ppo_mini_batch_size: 8
            """
        )
    )
    cfg = DynamicScheduleConfig.from_yaml(path)
    assert cfg.staleness_threshold == 0.1 and cfg.trigger_parameter_sync_step == 2
    assert cfg.required_samples == 8
    assert cfg.only_hybrid  # rollout.nnodes = 0 with dynamic scheduling
    assert cfg.max_required_samples == 17  # int(16 * 1.1)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert DynamicScheduleConfig.from_yaml(empty) == DynamicScheduleConfig()
    bad = tmp_path / "bad.yaml"
    bad.write_text("async_training: [1, 2\n")
    with pytest.raises(ConfigError, match="parse"):
        DynamicScheduleConfig.from_yaml(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        DynamicScheduleConfig.from_yaml(tmp_path / "missing.yaml")


def test_flat_and_dotted_keys_and_overrides() -> None:
    cfg = DynamicScheduleConfig.from_dict(
        {
            "staleness_threshold": 0.3,
            "rollout_nnodes": 2,
            "async_training.trigger_parameter_sync_step": 3,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
        },
        n=2,
    )
    assert cfg.staleness_threshold == 0.3 and cfg.rollout_nnodes == 2
    assert cfg.trigger_parameter_sync_step == 3 and cfg.ppo_mini_batch_size == 4 and cfg.n == 2
    with pytest.raises(ConfigError, match="unknown config field 'bogus'"):
        DynamicScheduleConfig.from_dict({}, bogus=1)


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"async_training": {"staleness_thresold": 0.1}}, "async_training.staleness_thresold"),
        ({"async_trainig": {}}, "async_trainig"),
        ({"mystery": 1}, "mystery"),
        ({"rollout": {"nnode": 2}}, "rollout.nnode"),
        ({"actor_rollout_ref": {"actor": {"ppo_mini_batch_sise": 2}}}, "ppo_mini_batch_sise"),
    ],
)
def test_unknown_keys_warn_naming_the_key(data: dict[str, Any], key: str) -> None:
    with pytest.warns(ConfigWarning, match=key.replace(".", r"\.")):
        DynamicScheduleConfig.from_dict(data)


@pytest.mark.parametrize(
    ("data", "key", "allowed"),
    [
        (
            {"async_training": {"staleness_threshold": "0.1"}},
            "async_training.staleness_threshold",
            r"\[0, 1000\]",
        ),
        (
            {"async_training": {"staleness_threshold": -0.5}},
            "async_training.staleness_threshold",
            ">= 0|\\[0",
        ),
        (
            {"async_training": {"trigger_parameter_sync_step": 0}},
            "async_training.trigger_parameter_sync_step",
            ">= 1",
        ),
        (
            {"async_training": {"trigger_parameter_sync_step": True}},
            "async_training.trigger_parameter_sync_step",
            "int",
        ),
        (
            {"async_training": {"dynamic_schedule_deactivate_ratio": 1.5}},
            "async_training.dynamic_schedule_deactivate_ratio",
            r"\[0, 1\]",
        ),
        ({"async_training": {"partial_rollout": "yes"}}, "async_training.partial_rollout", "bool"),
        (
            {"async_training": {"concurrent_samples_per_replica": 2.5}},
            "async_training.concurrent_samples_per_replica",
            "int",
        ),
        (
            {"async_training": {"dynamic_schedule_policy": ""}},
            "async_training.dynamic_schedule_policy",
            "policy name",
        ),
        ({"trainer": {"nnodes": -1}}, "trainer.nnodes", ">= 0"),
        ({"rollout": {"total_rollout_steps": 0}}, "rollout.total_rollout_steps", ">= 1"),
        ({"actor_rollout_ref": {"rollout": {"n": 0}}}, "actor_rollout_ref.rollout.n", ">= 1"),
        ({"staleness_threshold": float("nan")}, "staleness_threshold", "number"),
    ],
)
def test_wrong_type_or_range_names_the_key(data: dict[str, Any], key: str, allowed: str) -> None:
    with pytest.raises(ConfigError, match=allowed) as info:
        DynamicScheduleConfig.from_dict(data)
    assert info.value.key == key
    assert str(info.value).startswith(key)


def test_type_errors_are_also_type_errors() -> None:
    with pytest.raises(TypeError):
        DynamicScheduleConfig.from_dict({"async_training": {"require_batches": "two"}})
    with pytest.raises(ConfigTypeError) as info:
        DynamicScheduleConfig(n="4")  # type: ignore[arg-type]
    assert info.value.key == "n"
    with pytest.raises(ConfigError) as rng:
        DynamicScheduleConfig(n=0)
    assert not isinstance(rng.value, TypeError)


def test_partial_rollout_off_with_dynamic_scheduling_is_refused() -> None:
    with pytest.raises(ConfigError, match="truncated") as info:
        DynamicScheduleConfig.from_dict(
            {"async_training": {"use_dynamic_resource_scheduling": True, "partial_rollout": False}}
        )
    assert info.value.key == "async_training.partial_rollout"
    assert "abort" in str(info.value)
    # without dynamic scheduling partial rollout may be off
    assert not DynamicScheduleConfig(partial_rollout=False).partial_rollout
    with pytest.raises(ConfigError) as direct:
        DynamicScheduleConfig(use_dynamic_resource_scheduling=True, partial_rollout=False)
    assert direct.value.key == "partial_rollout"


def test_combinations_refused() -> None:
    with pytest.raises(ConfigError, match="whole number") as info:
        DynamicScheduleConfig.from_dict(
            {
                "async_training": {"require_batches": 0.3},
                "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
            }
        )
    assert info.value.key == "async_training.require_batches"
    assert (
        DynamicScheduleConfig(ppo_mini_batch_size=64, require_batches=0.125).required_samples == 8
    )
    with pytest.raises(ConfigError, match="nothing would generate") as info:
        DynamicScheduleConfig.from_dict({"rollout": {"nnodes": 0}})
    assert info.value.key == "rollout.nnodes"
    with pytest.raises(ConfigError, match="mapping"):
        DynamicScheduleConfig.from_dict([1, 2])  # type: ignore[arg-type]


@given(
    st.builds(
        DynamicScheduleConfig,
        use_dynamic_resource_scheduling=st.booleans(),
        dynamic_schedule_deactivate_ratio=st.floats(0, 1),
        staleness_threshold=st.floats(0, 5),
        trigger_parameter_sync_step=st.integers(1, 16),
        require_batches=st.integers(1, 4),
        ppo_mini_batch_size=st.integers(1, 512),
        n=st.integers(1, 16),
        concurrent_samples_per_replica=st.integers(1, 64),
        trainer_nnodes=st.integers(0, 4),
        rollout_nnodes=st.integers(1, 4),
        total_rollout_steps=st.none() | st.integers(1, 10**6),
    )
)
def test_round_trips(cfg: DynamicScheduleConfig) -> None:
    assert DynamicScheduleConfig.from_dict(cfg.to_dict()) == cfg
    assert DynamicScheduleConfig.from_dict(cfg.to_verl_dict()) == cfg
    assert cfg.max_required_samples >= cfg.step_required_samples >= cfg.required_samples >= 1
    assert cfg.buffer_samples <= cfg.max_required_samples


class _RatioPolicy(DynamicSchedulePolicyBase):
    def __init__(
        self, deactivate_ratio: float = 0.1, only_hybrid: bool = False, extra: int = 0
    ) -> None:
        self.deactivate_ratio, self.only_hybrid, self.extra = deactivate_ratio, only_hybrid, extra

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: Any) -> int:
        return 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        return True


class _BarePolicy(_RatioPolicy):
    def __init__(self) -> None:
        super().__init__()


register_policy("test-core-b-ratio")(_RatioPolicy)
register_policy("test-core-b-bare")(_BarePolicy)


def test_build_policy_passes_accepted_arguments() -> None:
    cfg = DynamicScheduleConfig(
        dynamic_schedule_policy="test-core-b-ratio",
        dynamic_schedule_deactivate_ratio=0.7,
        use_dynamic_resource_scheduling=True,
        rollout_nnodes=0,
    )
    policy = cfg.build_policy(extra=3)
    assert isinstance(policy, _RatioPolicy)
    assert (policy.deactivate_ratio, policy.only_hybrid, policy.extra) == (0.7, True, 3)
    bare = cfg.evolve(dynamic_schedule_policy="test-core-b-bare").build_policy()
    assert isinstance(bare, _BarePolicy)


def test_doctest() -> None:
    assert doctest.testmod(config_module).failed == 0
