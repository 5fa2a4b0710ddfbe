"""The config loader refuses hostile and mistaken input cheaply (issue 27, item 4).

Hostile files (alias bombs, huge numbers, deep nesting, self-reference, huge files) are
refused by `dynsched_core._loading` before anything expands them, in one `ConfigError`
naming the key and the limit; a key that looks like a misspelling of one dynsched reads
warns naming the closest known key, while verl's own keys load without a word; every
numeric field has an upper bound.
"""

from __future__ import annotations

import json
import math
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from dynsched_core import ConfigError, DynamicScheduleConfig
from dynsched_core._config import ConfigWarning, unknown_key_messages
from dynsched_core._loading import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    LoadLimits,
    check_tree,
    parse_yaml,
    read_config_file,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FIXTURES = Path(__file__).parent / "fixtures"
VERL = FIXTURES / "verl_fully_async.yaml"


def alias_bomb(levels: int = 10, fan: int = 9) -> str:
    """A ~790-byte YAML of nested mapping anchors: ``fan ** levels`` values expanded."""
    keys = "abcdefghijklmnopqrstuvwxyz"[:fan]
    lines = ["l0: &l0 {" + ", ".join(f"{k}: 1" for k in keys) + "}"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} {{" + ", ".join(f"{k}: *l{i - 1}" for k in keys) + "}")
    return "\n".join(lines) + "\n"


def _refused_fast(call: Any) -> tuple[ConfigError, float, int]:
    """Run ``call``; it must raise ConfigError. Returns the error, seconds, peak bytes."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(ConfigError) as info:
            call()
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return info.value, elapsed, peak


# ------------------------------------------------------------------------ hostile files
def test_alias_bomb_is_refused_before_expanding(tmp_path: Path) -> None:
    text = alias_bomb()
    assert 700 <= len(text) <= 900, len(text)
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    # PyYAML alone builds it as shared references; dynsched's dotted-key expansion used to
    # copy it (61 s, 2.9 GB and growing). Now: refused, fast and small.
    exc, elapsed, peak = _refused_fast(lambda: DynamicScheduleConfig.from_yaml(path))
    assert "expands to more than 100,000 values" in str(exc) and "YAML aliases" in str(exc)
    assert peak < 20 * 2**20, f"{peak / 2**20:.1f} MiB"
    assert elapsed < 10.0  # measured ~0.02 s; the bound only catches an expansion
    # the same tree built by PyYAML and handed over as a dict: refused too
    data = yaml.safe_load(text)
    exc, _, peak = _refused_fast(lambda: DynamicScheduleConfig.from_dict(data))
    assert "expands to more than" in str(exc)
    assert peak < 20 * 2**20


@pytest.mark.parametrize("digits", [400, 5000])
def test_huge_integer_names_the_key(tmp_path: Path, digits: int) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("async_training:\n  staleness_threshold: " + "9" * digits + "\n")
    with pytest.raises(ConfigError, match=f"async_training.staleness_threshold: a {digits}-digit"):
        DynamicScheduleConfig.from_yaml(path)
    # as JSON (Python's int conversion limit raises ValueError deep inside json) and TOML
    for suffix, body in (
        (".json", '{"async_training": {"staleness_threshold": ' + "9" * digits + "}}"),
        (".toml", "[async_training]\nstaleness_threshold = " + "9" * digits + "\n"),
    ):
        other = tmp_path / f"big{suffix}"
        other.write_text(body)
        with pytest.raises(ConfigError, match="integer|digits"):
            read_config_file(other)


def test_huge_integer_in_a_dict_is_refused_without_printing_it() -> None:
    with pytest.raises(ConfigError, match="async_training.staleness_threshold"):
        DynamicScheduleConfig.from_dict({"async_training": {"staleness_threshold": 10**5000}})


@pytest.mark.parametrize(
    "text",
    [
        "a: " + "[" * 1000 + "]" * 1000,
        "a: " + "{b: " * 1000 + "1" + "}" * 1000,
        "".join("  " * i + f"k{i}:\n" for i in range(1000)) + "  " * 1000 + "v\n",
    ],
    ids=["flow-lists", "flow-maps", "block-maps"],
)
def test_deep_nesting_is_one_error_not_a_recursion_error(text: str) -> None:
    with pytest.raises(ConfigError, match=f"nested deeper than {MAX_DEPTH} levels"):
        parse_yaml(text)


def test_deep_nesting_in_json_toml_and_dicts(tmp_path: Path) -> None:
    (tmp_path / "deep.json").write_text('{"a": ' + "[" * 1000 + "]" * 1000 + "}")
    (tmp_path / "deep.toml").write_text("a = " + "[" * 1000 + "]" * 1000 + "\n")
    for name in ("deep.json", "deep.toml"):
        with pytest.raises(ConfigError):
            read_config_file(tmp_path / name)
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(1000):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(ConfigError, match="nested deeper than"):
        DynamicScheduleConfig.from_dict(deep)


def test_self_reference_is_refused() -> None:
    with pytest.raises(ConfigError, match="refers to itself"):
        parse_yaml("a: &a [1, *a]")
    loop: dict[str, Any] = {}
    loop["async_training"] = loop
    with pytest.raises(ConfigError, match="contains itself"):
        DynamicScheduleConfig.from_dict(loop)


def test_file_size_is_capped(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match="bytes; a config or scenario file may be at most"):
        read_config_file(path)


def test_yaml_errors_are_one_line_with_the_position() -> None:
    with pytest.raises(ConfigError, match=r"YAML syntax error at line 2, column \d+"):
        parse_yaml("name: x\n  bad: [1,\n")
    with pytest.raises(ConfigError, match="YAML error"):
        parse_yaml("a: !!python/object/apply:os.system [true]")


# ------------------------------------------------------------------------ property
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**18), 10**18),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)


def _trees(max_leaves: int) -> st.SearchStrategy[Any]:
    return st.recursive(
        _scalars,
        lambda kids: st.one_of(
            st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=6), kids, max_size=4)
        ),
        max_leaves=max_leaves,
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=_trees(40))
def test_any_structure_within_the_caps_loads_unchanged(tree: Any) -> None:
    text = yaml.safe_dump({"data": tree})
    assert parse_yaml(text) == {"data": tree}
    check_tree({"data": tree})
    assert json.loads(json.dumps({"data": tree})) == {"data": tree}


@settings(max_examples=30, deadline=None)
@given(depth=st.integers(MAX_DEPTH + 1, 400), flow=st.booleans())
def test_any_structure_beyond_the_depth_cap_is_refused_quickly(depth: int, flow: bool) -> None:
    text = (
        "[" * depth + "]" * depth
        if flow
        else "".join("  " * i + f"k{i}:\n" for i in range(depth)) + "  " * depth + "v\n"
    )
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="nested deeper"):
        parse_yaml(text)
    assert time.perf_counter() - start < 10.0


@settings(max_examples=30, deadline=None)
@given(levels=st.integers(2, 12), fan=st.integers(2, 9))
def test_alias_fan_out_loads_or_is_refused_by_its_expanded_size(levels: int, fan: int) -> None:
    text = alias_bomb(levels, fan)
    limits = LoadLimits(max_nodes=5_000)
    # expanded size of the last anchor: each level is 1 mapping + fan keys + fan values
    size = 1 + 2 * fan  # l0
    for _ in range(1, levels):
        size = 1 + fan + fan * size
    if size * 2 < limits.max_nodes:
        parse_yaml(text, limits=limits)
    elif size > limits.max_nodes:
        start = time.perf_counter()
        with pytest.raises(ConfigError, match="expands to more than 5,000 values"):
            parse_yaml(text, limits=limits)
        assert time.perf_counter() - start < 10.0


def test_integers_at_the_digit_cap() -> None:
    assert parse_yaml("a: " + "9" * MAX_INT_DIGITS) == {"a": int("9" * MAX_INT_DIGITS)}
    with pytest.raises(ConfigError, match="digit"):
        parse_yaml("a: " + "9" * (MAX_INT_DIGITS + 1))


# ------------------------------------------------------------------------ misspelt keys
def test_realistic_verl_config_loads_without_a_word() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any ConfigWarning fails the test
        cfg = DynamicScheduleConfig.from_yaml(VERL)
    assert (cfg.ppo_mini_batch_size, cfg.n, cfg.rollout_tensor_parallel_size) == (32, 8, 2)
    tree = yaml.safe_load(VERL.read_text())
    train_keys = ("actor_rollout_ref.actor.optim.lr", "data.seed", "trainer.default_local_dir")
    assert unknown_key_messages(tree, train_keys) == []


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "async_training.trigger_parameter_sync_stp",
            3,
            "unknown key async_training.trigger_parameter_sync_stp (did you mean "
            "async_training.trigger_parameter_sync_step?); using the default",
        ),
        (
            "trainer.n_gpu_per_node",
            4,
            "unknown key trainer.n_gpu_per_node (did you mean trainer.n_gpus_per_node?); "
            "ignored",  # the fixture gives trainer.n_gpus_per_node too
        ),
        (
            "async_training.dynamic_schedule_polcy",
            "fixed_ratio",
            "unknown key async_training.dynamic_schedule_polcy (did you mean "
            "async_training.dynamic_schedule_policy?); ignored",
        ),
        (
            "actor_rollout_ref.rollout.tensor_model_paralel_size",
            2,
            "(did you mean actor_rollout_ref.rollout.tensor_model_parallel_size?)",
        ),
    ],
)
def test_misspelt_key_warns_naming_the_closest_known_key(
    key: str, value: Any, message: str
) -> None:
    tree = yaml.safe_load(VERL.read_text())
    if "using the default" in message:  # the right key absent: its default is used
        section, right = message.split("did you mean ")[1].split("?")[0].split(".")
        del tree[section][right]
    tree[key] = value
    with pytest.warns(ConfigWarning) as record:
        DynamicScheduleConfig.from_dict(tree)
    texts = [str(w.message) for w in record]
    assert len(texts) == 1 and message in texts[0], texts


def test_verl_keys_far_from_read_keys_stay_silent() -> None:
    tree = {
        "actor_rollout_ref.model.path": "Qwen/Qwen2.5-7B",
        "data.train_batch_size": 1024,
        "trainer.project_name": "x",
        "actor_rollout_ref.actor.ppo_micro_batch_size": 8,  # verl's own, close to mini
    }
    assert unknown_key_messages(tree) == []


# ------------------------------------------------------------------------ upper bounds
@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"trainer.n_gpus_per_node": 10**9}, "trainer.n_gpus_per_node must be <= 65,536"),
        (
            {"trainer.nnodes": 4096, "trainer.n_gpus_per_node": 32},
            "= 131,080 GPUs; at most 65,536",
        ),
        (
            {"actor_rollout_ref.actor.ppo_mini_batch_size": 10**18},
            "ppo_mini_batch_size must be <= 1,000,000",
        ),
        (
            {
                "actor_rollout_ref.actor.ppo_mini_batch_size": 100_000,
                "async_training.trigger_parameter_sync_step": 100,
            },
            "samples per weight sync",
        ),
        ({"trainer.total_training_steps": 10**8}, "total_training_steps must be <= 10,000,000"),
        ({"async_training.staleness_threshold": math.inf}, "staleness_threshold"),
        ({"async_training.staleness_threshold": 1e300}, "[0, 1000]"),
        ({"actor_rollout_ref.rollout.n": 10**6}, "rollout.n must be <= 65,536"),
        ({"data.max_response_length": 10**9}, "max_response_length must be <= 10,000,000"),
        ({"trainer.n_gpus_per_node": True}, "trainer.n_gpus_per_node must be an int in"),
        ({"trainer.n_gpus_per_node": "1e9"}, "got '1e9'"),
    ],
)
def test_numeric_fields_have_upper_bounds(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        DynamicScheduleConfig.from_dict(data)
    assert needle in str(info.value)
