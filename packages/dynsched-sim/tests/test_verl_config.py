"""A verl config as a scenario (`scenario_from_verl`), in `dynsched plan` and `simulate`."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from dynsched_core import DynamicScheduleConfig
from dynsched_sim import (
    VERL_SCENARIO_KEYS,
    ScenarioError,
    builtin_scenarios,
    is_verl_config,
    load_scenario,
    run_configuration,
    scenario_from_verl,
    scenario_to_dict,
)
from dynsched_sim.cli import main as simulate_main
from dynsched_sim.cli import main_plan
from hypothesis import given, settings
from hypothesis import strategies as st

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "verl" / "qwen35-dynamic-megatron.yaml"
SECTIONS = ("hardware", "model", "engine", "trainer", "workload")


def _example() -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE.read_text())
    assert isinstance(data, dict)
    return data


def _value(sc_dict: dict[str, Any], path: str) -> Any:
    head, _, leaf = path.partition(".")
    return sc_dict[head].get(leaf) if leaf else sc_dict[head]


def _nested(dotted: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def test_the_published_script_is_the_seed_scenario() -> None:
    """The published run's launch-script values, as a verl config on the seed scenario,
    give the seed scenario's own dynamic configuration: every model parameter equal, and
    the same simulated run to the last bit."""
    verl = load_scenario(str(EXAMPLE))
    seed = load_scenario("seed-qwen35")
    dv, ds = scenario_to_dict(verl), scenario_to_dict(seed)
    for section in SECTIONS:
        assert dv[section] == ds[section], section
    assert dv["steps"] == ds["steps"]
    schedule = dict(dv["schedule"])
    assert schedule.pop("dynamic_schedule_policy") == "default"  # the core's default
    assert schedule == ds["schedule"]
    (conf,) = verl.configurations
    own = seed.configuration("dynamic-16-16")
    assert (conf.name, conf.trainer_gpus, conf.rollout_gpus, conf.hybrid) == (
        own.name,
        own.trainer_gpus,
        own.rollout_gpus,
        own.hybrid,
    )
    assert verl.published == {}
    a = run_configuration(verl.with_steps(8), conf.name)
    b = run_configuration(seed.with_steps(8), own.name)
    assert a.wall_clock_s == b.wall_clock_s and a.lower_bound_s == b.lower_bound_s


#: a value for every key, each different from the seed scenario's (and valid together)
ALL_KEYS: dict[str, Any] = {
    "async_training.staleness_threshold": 0.25,
    "async_training.staleness_rule": "in_flight",
    "async_training.trigger_parameter_sync_step": 2,
    "async_training.require_batches": 2,
    "async_training.partial_rollout": False,
    "async_training.concurrent_samples_per_replica": 8,
    "async_training.dynamic_schedule_policy": "fixed_ratio",
    "async_training.dynamic_schedule_deactivate_ratio": 0.5,
    "async_training.dynamic_schedule_enable_rebalance": False,
    "async_training.dynamic_schedule_min_deactivate_ratio": 0.1,
    "async_training.dynamic_schedule_max_deactivate_ratio": 0.9,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
    "actor_rollout_ref.rollout.n": 4,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
    "actor_rollout_ref.rollout.max_num_seqs": 64,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.4,
    "actor_rollout_ref.rollout.standalone_gpu_memory_utilization": 0.8,
    "data.max_response_length": 32000,
    "trainer.total_training_steps": 10,
    "trainer.n_gpus_per_node": 4,
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": 4,
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size": 4,
}


def test_every_key_sets_its_parameter_labelled_as_the_files() -> None:
    assert set(ALL_KEYS) == set(VERL_SCENARIO_KEYS) - {
        "rollout.max_concurrent_samples_per_replica"  # the alternative spelling, below
    }
    data = {**ALL_KEYS, "trainer.nnodes": 4, "rollout.nnodes": 2}
    data["rollout.n_gpus_per_node"] = 4
    sc = scenario_from_verl(data, source="all.yaml")
    d = scenario_to_dict(sc)
    base = scenario_to_dict(load_scenario("seed-qwen35"))
    for key, value in ALL_KEYS.items():
        path = VERL_SCENARIO_KEYS[key]
        assert _value(d, path) == value, key
        assert _value(base, path) != value, f"{key}: the test value must differ from the base"
        label, source = sc.label_of(path) or ("", "")
        assert label == "public config" and source == f"[verl config all.yaml] {key} = {value!r}"
    assert [(c.trainer_gpus, c.rollout_gpus, c.hybrid) for c in sc.configurations] == [
        (16, 8, False)  # 4 x 4 trainer, 2 x 4 rollout; dynamic scheduling not switched on
    ]
    assert sc.configurations[0].name == "static-16-8"
    # what the file does not set keeps the base's value, its label and its source, marked
    assert sc.engine.decode_base_s == load_scenario("seed-qwen35").engine.decode_base_s
    label, source = sc.label_of("engine.decode_base_s") or ("", "")
    assert label == "fitted" and source.startswith("[base scenario seed-qwen35] decode speed")
    assert sc.unlabelled() == []


def test_derived_keys_and_the_memory_fallback() -> None:
    base = {"trainer.nnodes": 1, "trainer.n_gpus_per_node": 8, "rollout.nnodes": 1}
    sc = scenario_from_verl(
        {
            **base,
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": 2,
            "actor_rollout_ref.actor.megatron.context_parallel_size": 2,
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
            "actor_rollout_ref.actor.megatron.param_offload": False,
            "actor_rollout_ref.rollout.gpu_memory_utilization": 0.35,
        }
    )
    assert sc.trainer.model_parallel_gpus == 4  # 2 x 1 (pipeline not set) x 2
    assert sc.trainer.offload_state is False  # every offload given is off
    # verl: a standalone fraction left unset falls back to gpu_memory_utilization
    assert sc.engine.hybrid_memory_fraction == sc.engine.standalone_memory_fraction == 0.35
    assert (
        "context_parallel_size = 2" in (sc.label_of("trainer.model_parallel_gpus") or ("", ""))[1]
    )
    # the other spelling of the concurrency key
    alt = scenario_from_verl({**base, "rollout.max_concurrent_samples_per_replica": 4})
    assert alt.schedule["concurrent_samples_per_replica"] == 4
    # nothing set beyond the split: the base's values throughout
    bare = scenario_from_verl(base)
    assert bare.description.startswith(
        "verl config: 2 parameters read from it (configurations, hardware); the rest "
        "from base scenario 'seed-qwen35'"
    )
    seed = load_scenario("seed-qwen35")
    for section in SECTIONS:
        assert getattr(bare, section) == getattr(seed, section)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("actor_rollout_ref.rollout.max_num_seqs", 0, "integer >= 1"),
        ("actor_rollout_ref.rollout.max_num_seqs", 2.5, "integer >= 1"),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", 1.5, "fraction in (0, 1]"),
        ("actor_rollout_ref.rollout.standalone_gpu_memory_utilization", "high", "fraction"),
        ("actor_rollout_ref.actor.megatron.param_offload", "yes", "true or false"),
        ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size", 0, "integer >= 1"),
        ("trainer.total_training_steps", 0, ">= 1"),
        ("async_training.staleness_threshold", -1, "[0, 1000]"),
        ("async_training.staleness_rule", "newest", "in_flight"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", 3, "multiple of"),
    ],
)
def test_a_bad_value_names_the_verl_key(key: str, value: Any, says: str) -> None:
    data = _example()
    data[key] = value  # a dotted key over the nested file: the core merges both
    with pytest.raises(ScenarioError) as err:
        scenario_from_verl(data)
    message = str(err.value)
    assert says in message
    if says != "multiple of":  # the split's check names the configuration instead
        assert key in message


def test_a_misspelt_key_warns_naming_the_right_one() -> None:
    data = _example()
    data["actor_rollout_ref"]["rollout"]["max_num_seq"] = 64
    data["async_training"]["staleness_treshold"] = 0.1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scenario_from_verl(data)
    said = [str(w.message) for w in caught]
    assert any("staleness_treshold" in m and "staleness_threshold" in m for m in said), said
    assert any("max_num_seq" in m and "max_num_seqs" in m for m in said), said
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the example itself: not a word
        scenario_from_verl(_example())


def test_a_scenario_is_never_taken_for_a_verl_config() -> None:
    for name in builtin_scenarios():
        assert not is_verl_config(scenario_to_dict(load_scenario(name))), name
    assert is_verl_config(_example())
    assert is_verl_config({"async_training.staleness_threshold": 0.5})
    assert not is_verl_config({"trainer": {"nnodes": 1}})  # too little to tell: a scenario
    assert not is_verl_config(["actor_rollout_ref"])


@settings(max_examples=25, deadline=None)
@given(
    trainer_nodes=st.integers(1, 4),
    rollout_nodes=st.integers(0, 3),
    gpus_per_node=st.sampled_from([4, 8]),
    tp=st.sampled_from([1, 2, 4, 8]),
    n=st.integers(1, 16),
    mini=st.integers(1, 64),
    threshold=st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0]),
    trigger=st.integers(1, 8),
    dynamic=st.booleans(),
)
def test_the_core_reads_the_scenario_as_it_reads_the_file(
    trainer_nodes: int,
    rollout_nodes: int,
    gpus_per_node: int,
    tp: int,
    n: int,
    mini: int,
    threshold: float,
    trigger: int,
    dynamic: bool,
) -> None:
    """Property: whatever split and schedule a verl file sets, the scenario built from it
    hands the core (`Scenario.schedule_config`) the same config as the file itself, or
    the file is refused with a ScenarioError."""
    data = _nested(
        {
            "trainer.nnodes": trainer_nodes,
            "trainer.n_gpus_per_node": gpus_per_node,
            "rollout.nnodes": rollout_nodes,
            "rollout.n_gpus_per_node": gpus_per_node,
            "actor_rollout_ref.rollout.tensor_model_parallel_size": tp,
            "actor_rollout_ref.rollout.n": n,
            "actor_rollout_ref.actor.ppo_mini_batch_size": mini,
            "async_training.staleness_threshold": threshold,
            "async_training.trigger_parameter_sync_step": trigger,
            "async_training.use_dynamic_resource_scheduling": dynamic,
            "trainer.total_training_steps": 12,
        }
    )
    try:
        sc = scenario_from_verl(data)
    except ScenarioError:
        return
    direct = DynamicScheduleConfig.from_dict(data)
    (conf,) = sc.configurations
    via = sc.schedule_config(conf)
    for field in (
        "n",
        "ppo_mini_batch_size",
        "staleness_threshold",
        "trigger_parameter_sync_step",
        "use_dynamic_resource_scheduling",
        "rollout_tensor_parallel_size",
        "required_samples",
        "max_required_samples",
        "hybrid_gpus",
        "standalone_gpus",
        "num_standalone_replicas",
        "total_training_steps",
    ):
        assert getattr(via, field) == getattr(direct, field), field


def _small_verl(tmp_path: Path) -> Path:
    data = _example()
    data["trainer"]["total_training_steps"] = 4
    path = tmp_path / "my-run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_dynsched_plan_takes_a_verl_config(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "plan"
    argv = [str(_small_verl(tmp_path)), "--seeds", "1", "--shortlist", "1", "--out", str(out)]
    assert main_plan([*argv, "--json", "--quiet", "--no-plot"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["scenario"] == "verl-my-run" and printed["gpus"] == 32
    assert any("base scenario 'seed-qwen35'" in r for r in printed["rests_on"])
    assert main_plan([*argv, "--quiet", "--no-plot"]) == 0
    shown = capsys.readouterr().out
    assert "rests on scenario 'verl-my-run': verl config my-run.yaml" in shown


def test_dynsched_plan_verl_errors_and_warnings(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = ["--out", str(tmp_path / "o"), "--seeds", "1", "--shortlist", "1", "--quiet"]
    assert main_plan(["seed-qwen35", "--base", "large", *out]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "only a verl config is mapped onto a base" in err
    path = _small_verl(tmp_path)
    assert main_plan([str(path), "--base", "no-such", *out]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "base scenario: unknown scenario 'no-such'" in err
    data = yaml.safe_load(path.read_text())
    data["async_training"]["staleness_treshold"] = 0.1
    path.write_text(yaml.safe_dump(data))
    assert main_plan([str(path), *out, "--no-plot"]) == 0
    err = capsys.readouterr().err.strip()
    assert err == (
        "dynsched plan: warning: unknown key async_training.staleness_treshold "
        "(did you mean async_training.staleness_threshold?); ignored"  # the right one is set
    )
    other = tmp_path / "other.yaml"
    other.write_text("foo: 1\n")
    assert main_plan([str(other), *out]) == 2
    assert "nor a verl config" in capsys.readouterr().err


def test_dynsched_simulate_takes_a_verl_config(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "sim"
    argv = ["--scenario", str(_small_verl(tmp_path)), "--seeds", "1", "--quiet"]
    assert simulate_main([*argv, "--no-plots", "--out", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "scenario verl-my-run: verl config my-run.yaml" in shown and "dynamic-16-16" in shown
    result = json.loads((out / "result.json").read_text())
    assert [r["configuration"] for r in result["runs"]] == ["dynamic-16-16"]


def test_module_example_runs() -> None:
    import doctest

    import dynsched_sim._plan as plan_module
    import dynsched_sim._verl as verl_module

    result = doctest.testmod(verl_module)
    assert result.attempted >= 3 and result.failed == 0
    result = doctest.testmod(plan_module)  # Candidate.verl_overrides
    assert result.attempted >= 1 and result.failed == 0


def test_readme_verl_example_runs(capsys) -> None:  # type: ignore[no-untyped-def]
    import re

    text = (Path(__file__).parents[1] / "README.md").read_text()
    section = text[text.index("### From a verl config") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    exec(compile(code.group(1), "README.md", "exec"), {"__name__": "readme"})
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].startswith("dynamic-16-16 ('public config', '[verl config my-run.yaml]")
    assert shown[1].endswith(" h")


@given(
    trainer=st.integers(1, 64),
    rollout=st.integers(0, 64),
    per_node=st.sampled_from([1, 2, 4, 8, 16]),
    hybrid=st.booleans(),
)
def test_verl_overrides_hold_every_gpu_on_whole_servers(
    trainer: int, rollout: int, per_node: int, hybrid: bool
) -> None:
    from dynsched_sim import Candidate

    c = Candidate(
        trainer_gpus=trainer,
        rollout_gpus=rollout,
        hybrid=hybrid,
        policy="default",
        concurrency=16,
        staleness_threshold=0.5,
    )
    o = c.verl_overrides(per_node)
    for pool, gpus in (("trainer", trainer), ("rollout", rollout)):
        assert o[f"{pool}.nnodes"] * o[f"{pool}.n_gpus_per_node"] == gpus
        assert 1 <= o[f"{pool}.n_gpus_per_node"] <= max(per_node, 1) or gpus == 0
    assert o["async_training.use_dynamic_resource_scheduling"] is hybrid
    assert ("async_training.dynamic_schedule_policy" in o) is hybrid


def test_the_plans_overrides_on_the_file_give_the_plans_pick(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Round trip: the verl overrides `dynsched plan` prints, set on the user's file, are
    read back as the very candidate it picked."""
    path = _small_verl(tmp_path)
    argv = [str(path), "--seeds", "1", "--shortlist", "2", "--gpus", "24", "--quiet"]
    assert main_plan([*argv, "--out", str(tmp_path / "p"), "--no-plot"]) == 0
    shown = capsys.readouterr().out
    line = next(x for x in shown.splitlines() if x.startswith("the best as verl overrides: "))
    written = json.loads((tmp_path / "p" / "plan.json").read_text())
    data = yaml.safe_load(path.read_text())
    for item in line.removeprefix("the best as verl overrides: ").split():
        key, _, value = item.partition("=")
        data[key] = yaml.safe_load(value)  # as a command line override would set it
    again = scenario_from_verl(data)
    best = written["best"]["candidate"]
    (conf,) = again.configurations
    assert (conf.trainer_gpus, conf.rollout_gpus, conf.hybrid) == (
        best["trainer_gpus"],
        best["rollout_gpus"],
        best["hybrid"],
    )
    assert conf.trainer_gpus + conf.rollout_gpus == 24
    assert again.schedule["concurrent_samples_per_replica"] == best["concurrency"]
    assert again.schedule["staleness_threshold"] == best["staleness_threshold"]
    if best["hybrid"]:
        assert again.schedule["dynamic_schedule_policy"] == best["policy"]
    assert written["verl_overrides"] == {k: data[k] for k in written["verl_overrides"]}


def test_two_spellings_of_one_key_read_as_the_core_reads_them() -> None:
    data = {
        "trainer.nnodes": 1,
        "trainer.n_gpus_per_node": 8,
        "rollout.nnodes": 1,
        "rollout.n_gpus_per_node": 8,
        "async_training.concurrent_samples_per_replica": 8,
        "rollout.max_concurrent_samples_per_replica": 4,
    }
    sc = scenario_from_verl(data)
    core = DynamicScheduleConfig.from_dict(data)
    assert sc.schedule["concurrent_samples_per_replica"] == 8
    assert core.concurrent_samples_per_replica == 8
    source = (sc.label_of("schedule.concurrent_samples_per_replica") or ("", ""))[1]
    assert source == "[verl config] async_training.concurrent_samples_per_replica = 8"
    none_given = scenario_from_verl({"async_training": {"staleness_threshold": 0.25}})
    assert none_given.label_of("configurations") == (
        "public config",
        "[verl config] verl's defaults",
    )
