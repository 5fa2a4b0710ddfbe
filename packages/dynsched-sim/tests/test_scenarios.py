"""Scenario files: built-ins, YAML/TOML loading, clear errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from dynsched_sim import ScenarioError, builtin_scenarios, load_scenario, scenario_from_dict

FAMILY = {"rollout-bound", "training-bound", "balanced", "heavy-tailed", "colocated", "large"}


def _minimal() -> dict:
    return {
        "name": "tiny",
        "steps": 4,
        "engine": {"gpus_per_replica": 8},
        "schedule": {"ppo_mini_batch_size": 4, "trigger_parameter_sync_step": 2},
        "configurations": [{"name": "s", "trainer_gpus": 8, "rollout_gpus": 8}],
    }


def test_builtins_include_seed_and_family() -> None:
    names = set(builtin_scenarios())
    assert {"seed-qwen35", *FAMILY} <= names
    for name in names:
        assert load_scenario(name).name == name


def test_seed_qwen35_has_the_published_settings() -> None:
    sc = load_scenario("seed-qwen35")
    assert [c.name for c in sc.configurations] == ["static-16-16", "static-8-24", "dynamic-16-16"]
    dyn = sc.schedule_config(sc.configuration("dynamic-16-16"))
    assert dyn.trigger_parameter_sync_step == 4
    assert dyn.ppo_mini_batch_size == 16 and dyn.require_batches == 1 and dyn.n == 8
    assert dyn.staleness_threshold == 0.5 and dyn.dynamic_schedule_deactivate_ratio == 0.6
    assert dyn.dynamic_schedule_enable_rebalance and dyn.partial_rollout
    assert dyn.use_dynamic_resource_scheduling and dyn.rollout_tensor_parallel_size == 8
    assert sc.workload.max_response_len == 64000
    assert all(c.total_gpus == 32 for c in sc.configurations)
    # public configuration of the published deployment (see the scenario's provenance)
    assert dyn.staleness_rule == "in_flight_and_queued"
    assert dyn.concurrent_samples_per_replica == 16 and sc.engine.max_num_seqs == 128
    assert sc.engine.standalone_memory_fraction == 0.7
    assert sc.engine.hybrid_memory_fraction == 0.45
    assert sc.trainer.offload_state
    assert sc.workload.length_trajectory  # responses grow over training


def test_every_parameter_is_labelled_with_its_source() -> None:
    from dynsched_sim import PROVENANCE_LABELS

    for name in builtin_scenarios():
        sc = load_scenario(name)
        assert sc.unlabelled() == [], name
        for path in sc.parameter_paths():
            label = sc.label_of(path)
            assert label is not None and label[0] in PROVENANCE_LABELS and label[1], (name, path)
    seed = load_scenario("seed-qwen35")
    labels = {seed.label_of(p)[0] for p in seed.parameter_paths()}  # type: ignore[index]
    assert labels == {"published", "public config", "judgement", "fitted"}
    # only the two rates the static runs identify are fitted
    assert set(seed.fitted()) == {
        "engine.decode_base_s",
        "engine.decode_per_seq_s",
        "trainer.gpu_s_per_token",
    }
    for path in ("engine.hybrid_memory_fraction", "workload.n", "schedule.staleness_rule"):
        assert seed.label_of(path)[0] == "public config"  # type: ignore[index]


def test_bad_provenance_is_refused_with_the_key() -> None:
    d = _minimal()
    d["provenance"] = {"engine.max_num_seqs": "guess: I think so"}
    with pytest.raises(ScenarioError, match=r"provenance.engine.max_num_seqs: label 'guess'"):
        scenario_from_dict(d)
    d["provenance"] = {"engine.speed": "judgement: fast"}
    with pytest.raises(ScenarioError, match="provenance.engine.speed: not a parameter"):
        scenario_from_dict(d)
    d["provenance"] = {"engine.max_num_seqs": "judgement:"}
    with pytest.raises(ScenarioError, match="the source is empty"):
        scenario_from_dict(d)
    d["provenance"] = {"engine": "judgement: all of it", "workload.response_len": "fitted: x"}
    sc = scenario_from_dict(d)
    assert sc.label_of("engine.max_num_seqs") == ("judgement", "all of it")
    assert sc.label_of("workload.response_len.median") == ("fitted", "x")
    assert "steps" in sc.unlabelled()


def test_family_shapes() -> None:
    assert max(c.total_gpus for c in load_scenario("large").configurations) >= 256
    col = load_scenario("colocated")
    assert all(c.rollout_gpus == 0 and c.hybrid for c in col.configurations)


def test_unknown_key_is_named_with_allowed_keys() -> None:
    d = _minimal()
    d["engine"]["decode_speed"] = 3
    with pytest.raises(
        ScenarioError, match=r"engine: unknown key\(s\) \['decode_speed'\].*allowed"
    ):
        scenario_from_dict(d)


def test_bad_value_names_the_field() -> None:
    d = _minimal()
    d["engine"]["decode_base_s"] = -1
    with pytest.raises(
        ScenarioError,
        match=r"engine: EngineModel\.decode_base_s must be a finite number > 0, got -1",
    ):
        scenario_from_dict(d)
    d = _minimal()
    d["workload"] = {"response_len": {"kind": "pareto"}}
    with pytest.raises(ScenarioError, match=r"workload.response_len.*kind must be one of"):
        scenario_from_dict(d)
    d = _minimal()
    d["configurations"][0]["rollout_gpus"] = 12
    with pytest.raises(ScenarioError, match="multiple of engine.gpus_per_replica"):
        scenario_from_dict(d)


def test_core_config_errors_are_reported_with_the_configuration() -> None:
    d = _minimal()
    d["schedule"]["staleness_threshold"] = -1
    with pytest.raises(ScenarioError, match="staleness_threshold"):
        scenario_from_dict(d)


def test_unknown_builtin_lists_the_names() -> None:
    with pytest.raises(ScenarioError, match="seed-qwen35"):
        load_scenario("no-such-scenario")


def test_yaml_and_toml_files(tmp_path: Path) -> None:
    y = tmp_path / "s.yaml"
    y.write_text(
        "name: tiny\nsteps: 4\nschedule: {ppo_mini_batch_size: 4}\n"
        "configurations:\n  - {name: s, trainer_gpus: 8, rollout_gpus: 8}\n"
    )
    t = tmp_path / "s.toml"
    t.write_text(
        'name = "tiny"\nsteps = 4\n[schedule]\nppo_mini_batch_size = 4\n'
        '[[configurations]]\nname = "s"\ntrainer_gpus = 8\nrollout_gpus = 8\n'
    )
    assert load_scenario(y) == load_scenario(t)
    bad = tmp_path / "s.json"
    bad.write_text("{}")
    with pytest.raises(ScenarioError, match="unsupported scenario file type"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="does not exist"):
        load_scenario(tmp_path / "missing.yaml")


_MODELS = ("HardwareModel", "LLMModel", "EngineModel", "TrainerModel")


@pytest.mark.parametrize("model", _MODELS)
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "2"])
def test_every_cost_model_field_refuses_a_bad_number_naming_it(model: str, bad: object) -> None:
    import attrs
    import dynsched_sim._models as models
    from dynsched_core import ConfigError

    cls = getattr(models, model)
    numeric = [f for f in attrs.fields(cls) if f.type in ("float", "int")]
    assert numeric
    for f in numeric:
        with pytest.raises(ConfigError, match=rf"^{model}\.{f.name} must be ") as info:
            cls(**{f.name: bad})
        assert info.value.key == f.name
