"""A verl config as a scenario: what `dynsched plan` and `dynsched simulate` read from it.

A verl fully-async config (``fully_async_ppo_trainer.yaml`` /
``fully_async_ppo_megatron_trainer.yaml`` with a run's overrides, as one YAML file)
names the GPUs, the scheduler settings, the rollout engine's parallelism, concurrency and
memory fractions, the trainer's model parallelism and offloading, the group size and the
longest response. It does not name what the simulator's cost models need besides: how
fast the engine decodes and the trainer trains on this hardware, the model's memory
footprint, and how long the responses are. `scenario_from_verl` therefore maps the keys
of `VERL_SCENARIO_KEYS` onto a *base* scenario (default `DEFAULT_VERL_BASE`, the
published 32-GPU experiment) and keeps everything else from it:

- a mapped value is labelled ``public config`` with the file and the verl key as source;
- every other parameter keeps the base's label, its source prefixed with the base's name
  (``[base scenario seed-qwen35] ...``), so a plan's ``rests_on`` says which numbers came
  from the user's file and which from someone else's cluster;
- the one configuration is the file's split: ``trainer.nnodes x trainer.n_gpus_per_node``
  trainer GPUs, ``rollout.nnodes x rollout.n_gpus_per_node`` standalone rollout GPUs,
  hybrid replicas when ``async_training.use_dynamic_resource_scheduling`` is on (verl's
  defaults where the file sets none); the base's published times are dropped.

The scheduler keys are validated by the core (`DynamicScheduleConfig.from_dict`, which
names the verl key), the others by the simulator's models (the error names the verl key
too); a misspelt key dynsched reads is reported by `verl_key_warnings`.

Example:
    >>> sc = scenario_from_verl(
    ...     {"trainer": {"nnodes": 1, "n_gpus_per_node": 8},
    ...      "rollout": {"nnodes": 1, "n_gpus_per_node": 8},
    ...      "async_training": {"use_dynamic_resource_scheduling": True,
    ...                         "staleness_threshold": 0.25},
    ...      "actor_rollout_ref": {"rollout": {"n": 4, "tensor_model_parallel_size": 4}}},
    ...     source="my-run.yaml")
    >>> sc.configurations[0], sc.schedule["staleness_threshold"], sc.engine.gpus_per_replica
    (Configuration(name='dynamic-8-8', trainer_gpus=8, rollout_gpus=8, hybrid=True), 0.25, 4)
    >>> sc.label_of("workload.n")
    ('public config', '[verl config my-run.yaml] actor_rollout_ref.rollout.n = 4')
    >>> sc.label_of("engine.decode_base_s")[1].startswith("[base scenario seed-qwen35]")
    True
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dynsched_core import ConfigError, DynamicScheduleConfig

from dynsched_sim._scenario import (
    MAX_STEPS,
    Scenario,
    ScenarioError,
    load_scenario,
    scenario_from_dict,
    scenario_to_dict,
)

__all__ = [
    "DEFAULT_VERL_BASE",
    "VERL_SCENARIO_KEYS",
    "is_verl_config",
    "scenario_from_verl",
    "verl_key_warnings",
]

#: The scenario whose cost models, model and workload a verl config is mapped onto unless
#: another is named (``--base``): the published experiment's calibrated cluster.
DEFAULT_VERL_BASE = "seed-qwen35"

#: Dotted verl key -> the scenario parameter it sets (``schedule.*``: a core scheduler
#: key). Two more are derived from several keys: ``trainer.model_parallel_gpus`` (Megatron's
#: tensor x pipeline x context parallel sizes) and ``trainer.offload_state`` (any of the
#: actor's Megatron or FSDP parameter, gradient or optimizer offloads).
VERL_SCENARIO_KEYS: Mapping[str, str] = {
    "async_training.staleness_threshold": "schedule.staleness_threshold",
    "async_training.staleness_rule": "schedule.staleness_rule",
    "async_training.trigger_parameter_sync_step": "schedule.trigger_parameter_sync_step",
    "async_training.require_batches": "schedule.require_batches",
    "async_training.partial_rollout": "schedule.partial_rollout",
    "async_training.concurrent_samples_per_replica": "schedule.concurrent_samples_per_replica",
    "rollout.max_concurrent_samples_per_replica": "schedule.concurrent_samples_per_replica",
    "async_training.dynamic_schedule_policy": "schedule.dynamic_schedule_policy",
    "async_training.dynamic_schedule_deactivate_ratio": (
        "schedule.dynamic_schedule_deactivate_ratio"
    ),
    "async_training.dynamic_schedule_enable_rebalance": (
        "schedule.dynamic_schedule_enable_rebalance"
    ),
    "async_training.dynamic_schedule_min_deactivate_ratio": (
        "schedule.dynamic_schedule_min_deactivate_ratio"
    ),
    "async_training.dynamic_schedule_max_deactivate_ratio": (
        "schedule.dynamic_schedule_max_deactivate_ratio"
    ),
    "actor_rollout_ref.actor.ppo_mini_batch_size": "schedule.ppo_mini_batch_size",
    "actor_rollout_ref.rollout.n": "workload.n",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "engine.gpus_per_replica",
    "actor_rollout_ref.rollout.max_num_seqs": "engine.max_num_seqs",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "engine.hybrid_memory_fraction",
    "actor_rollout_ref.rollout.standalone_gpu_memory_utilization": (
        "engine.standalone_memory_fraction"
    ),
    "data.max_response_length": "workload.max_response_len",
    "trainer.total_training_steps": "steps",
    "trainer.n_gpus_per_node": "hardware.gpus_per_node",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": "trainer.pipeline_stages",
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size": "trainer.expert_parallel_gpus",
}

#: Megatron's model-parallel sizes whose product is ``trainer.model_parallel_gpus``
#: (verl's default for each: 1).
_MODEL_PARALLEL_KEYS = tuple(
    f"actor_rollout_ref.actor.megatron.{k}"
    for k in (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
    )
)
#: Offload switches of the actor; any one on sets ``trainer.offload_state``.
_OFFLOAD_KEYS = tuple(
    f"actor_rollout_ref.actor.{backend}.{k}"
    for backend in ("megatron", "fsdp_config")
    for k in ("param_offload", "grad_offload", "optimizer_offload")
)
#: The keys that set the split (read through the core's config).
_SPLIT_KEYS = (
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "rollout.nnodes",
    "rollout.n_gpus_per_node",
    "async_training.use_dynamic_resource_scheduling",
)
#: Top-level sections that mark a verl config (a scenario has ``configurations`` and its
#: own sections instead).
VERL_SECTIONS = frozenset({"actor_rollout_ref", "async_training", "data", "rollout", "algorithm"})
_SCENARIO_ONLY = frozenset(
    {"configurations", "name", "steps", "engine", "workload", "hardware", "model", "schedule"}
)


def is_verl_config(data: Any) -> bool:
    """Whether ``data`` (a file's top-level mapping) is a verl config, not a scenario: it
    has a verl section (``actor_rollout_ref``, ``async_training``, ``rollout``, ``data``,
    ``algorithm``; dotted keys count by their first part) and no scenario-only key."""
    if not isinstance(data, Mapping):
        return False
    heads = {str(k).split(".", 1)[0] for k in data}
    return bool(heads & VERL_SECTIONS) and not heads & _SCENARIO_ONLY


def verl_key_warnings(data: Mapping[str, Any]) -> list[str]:
    """One line per key of ``data`` that looks like a misspelt key dynsched reads (the
    core's rule, with the simulator's keys of `VERL_SCENARIO_KEYS` counted as read)."""
    from dynsched_core._config import unknown_key_messages

    return unknown_key_messages(data, (*VERL_SCENARIO_KEYS, *_MODEL_PARALLEL_KEYS, *_OFFLOAD_KEYS))


def scenario_from_verl(
    data: Mapping[str, Any],
    *,
    base: Scenario | str | os.PathLike[str] = DEFAULT_VERL_BASE,
    source: str | None = None,
    name: str | None = None,
) -> Scenario:
    """The scenario of a verl config (module docstring).

    Args:
        data: The config tree (nested sections or dotted keys, as read from YAML).
        base: The scenario (or its name or file) the cost models, model, hardware and
            workload come from.
        source: How provenance names the file (e.g. its name; None: not named).
        name: The scenario's name (default: ``verl-<file stem>``).

    Warns:
        dynsched_core's ``ConfigWarning``: one per key that looks like a misspelt key
            dynsched reads (`verl_key_warnings`).

    Raises:
        ScenarioError: a value is invalid (naming the verl key and what is allowed), or the
            split does not fit the base's replicas or memory.
    """
    from dynsched_core._config import ConfigWarning, _expand_dotted

    if not isinstance(data, Mapping):
        raise ScenarioError(f"a verl config must be a mapping, got {type(data).__name__}")
    tree = _expand_dotted(data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConfigWarning)  # said below, with our keys read
            core = DynamicScheduleConfig.from_dict(tree)
    except ConfigError as e:
        raise ScenarioError(str(e)) from None
    for message in verl_key_warnings(tree):
        warnings.warn(message, ConfigWarning, stacklevel=2)
    try:
        base_sc = base if isinstance(base, Scenario) else load_scenario(base)
    except ScenarioError as e:
        raise ScenarioError(f"base scenario: {e}") from None
    values: dict[str, Any] = {}
    for key, path in VERL_SCENARIO_KEYS.items():
        value = _at(tree, key)
        if value is not None and path not in map(VERL_SCENARIO_KEYS.get, values):
            values[key] = value  # two spellings of one key: the first, as the core reads it
    fallback = "actor_rollout_ref.rollout.gpu_memory_utilization"
    standalone = "actor_rollout_ref.rollout.standalone_gpu_memory_utilization"
    if standalone not in values and fallback in values:  # verl: null falls back to it
        values[standalone] = values[fallback]
    where = f"verl config {source}" if source else "verl config"
    out = _base_dict(base_sc)
    labels: dict[str, str] = {}
    for key, value in values.items():
        path = VERL_SCENARIO_KEYS[key]
        _set(out, path, _checked(key, path, value))
        labels[path] = f"public config: [{where}] {key} = {value!r}"
    _derived(tree, out, labels, where)
    out["configurations"] = [_split(core)]
    given = [k for k in _SPLIT_KEYS if _at(tree, k) is not None]
    rest = "verl's defaults" if not given else "verl's defaults for the rest"
    labels["configurations"] = f"public config: [{where}] " + ", ".join(
        [*given, rest] if len(given) < len(_SPLIT_KEYS) else given
    )
    out["provenance"].update(labels)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(source or "config").stem) or "config"
    out["name"] = name or f"verl-{stem}"
    sections: dict[str, int] = {}
    for path in labels:
        head = path.split(".", 1)[0]
        sections[head] = sections.get(head, 0) + 1
    read = ", ".join(f"{h} ({n})" if n > 1 else h for h, n in sorted(sections.items()))
    out["description"] = (
        f"{where}: {len(labels)} parameters read from it ({read}); the rest "
        f"from base scenario {base_sc.name!r} (its model, hardware, decode and trainer "
        "speeds, response lengths and every parameter the file does not set)"
    )
    try:
        return scenario_from_dict(out)
    except ScenarioError as e:
        raise ScenarioError(f"verl config on base scenario {base_sc.name!r}: {e}") from None


def _base_dict(base: Scenario) -> dict[str, Any]:
    """The base as plain data without its configurations and published times; each
    provenance source marked as the base's."""
    out = scenario_to_dict(base)
    out["published"] = {}
    out["provenance"] = {
        path: _rebased(text, base.name)
        for path, text in base.provenance.items()
        if path.split(".", 1)[0] not in ("configurations", "published")
    }
    return out


def _rebased(text: str, base: str) -> str:
    label, _, src = text.partition(":")
    return f"{label.strip()}: [base scenario {base}] {src.strip()}"


def _at(tree: Mapping[str, Any], dotted: str) -> Any:
    """The value at a dotted key of an expanded tree (None: absent), as the core reads it."""
    from dynsched_core._config import _lookup

    return _lookup(tree, dotted)[1]


def _set(out: dict[str, Any], path: str, value: Any) -> None:
    head, _, leaf = path.partition(".")
    if leaf:
        out[head][leaf] = value
    else:
        out[head] = value


def _checked(key: str, path: str, value: Any) -> Any:
    """``value`` of verl key ``key`` in the type ``path`` takes (the models check ranges).

    Raises:
        ScenarioError: naming ``key`` and what is allowed.
    """
    if path.startswith("schedule."):
        return value  # validated by the core already
    field = path.rsplit(".", 1)[-1]
    if path in ("engine.hybrid_memory_fraction", "engine.standalone_memory_fraction"):
        ok = _is_number(value) and 0.0 < float(value) <= 1.0
        if not ok:
            raise ScenarioError(f"{key}: expected a fraction in (0, 1], got {value!r}")
        return float(value)
    hi = MAX_STEPS if field == "steps" else 1 << 20
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= hi:
        raise ScenarioError(f"{key}: expected an integer >= 1 and <= {hi:,}, got {value!r}")
    return value


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _derived(
    tree: Mapping[str, Any], out: dict[str, Any], labels: dict[str, str], where: str
) -> None:
    """``trainer.model_parallel_gpus`` and ``trainer.offload_state`` where the file sets
    any of their keys."""
    sizes = {k: _at(tree, k) for k in _MODEL_PARALLEL_KEYS}
    given = {k: v for k, v in sizes.items() if v is not None}
    if given:
        product = 1
        for key in _MODEL_PARALLEL_KEYS:
            size = 1 if sizes[key] is None else sizes[key]
            product *= _checked(key, "trainer.model_parallel_gpus", size)
        out["trainer"]["model_parallel_gpus"] = product
        labels["trainer.model_parallel_gpus"] = (
            f"public config: [{where}] product of "
            + ", ".join(f"{k} = {v!r}" for k, v in given.items())
            + " (1 where not set)"
        )
    offloads = {k: v for k in _OFFLOAD_KEYS if (v := _at(tree, k)) is not None}
    if offloads:
        for key, value in offloads.items():
            if not isinstance(value, bool):
                raise ScenarioError(f"{key}: expected true or false, got {value!r}")
        out["trainer"]["offload_state"] = any(offloads.values())
        labels["trainer.offload_state"] = f"public config: [{where}] " + ", ".join(
            f"{k} = {v!r}" for k, v in offloads.items()
        )


def _split(core: DynamicScheduleConfig) -> dict[str, Any]:
    """The file's one configuration, named as the built-ins name theirs."""
    trainer, rollout = core.hybrid_gpus, core.standalone_gpus
    hybrid = bool(core.use_dynamic_resource_scheduling)
    kind = "dynamic" if hybrid else "static"
    return {
        "name": f"{kind}-{trainer}-{rollout}",
        "trainer_gpus": trainer,
        "rollout_gpus": rollout,
        "hybrid": hybrid,
    }
