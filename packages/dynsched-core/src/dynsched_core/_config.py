"""`DynamicScheduleConfig`: scheduler settings, read from verl's config keys.

A verl user points dynsched at an existing fully-async config (a dict or a YAML file)::

    async_training:
      use_dynamic_resource_scheduling: true
      dynamic_schedule_policy: default
      dynamic_schedule_deactivate_ratio: 0.6
      staleness_threshold: 0.1
      trigger_parameter_sync_step: 4
      require_batches: 1
      partial_rollout: true
    trainer: {nnodes: 1, n_gpus_per_node: 8}
    rollout: {nnodes: 1, n_gpus_per_node: 8}
    actor_rollout_ref:
      actor: {ppo_mini_batch_size: 32}
      rollout: {n: 8}

Keys of the ``async_training`` section and top-level keys are all checked: an unknown one
warns (`ConfigWarning`, naming the key). The other verl sections (``trainer``,
``rollout``, ``actor_rollout_ref``, ``data``, ...) configure verl itself; dynsched reads
the few keys it needs there and only warns about a key that looks like a misspelling of
one of them. A wrong type or an out-of-range value raises `ConfigError` naming the key.
"""

from __future__ import annotations

import difflib
import inspect
import os
import warnings
from collections.abc import Mapping
from typing import Any

import attrs

from dynsched_core import derived
from dynsched_core import validators as v
from dynsched_core._errors import ConfigError, ConfigTypeError
from dynsched_core._guards import is_colocated
from dynsched_core._loading import check_tree, read_config_file
from dynsched_core._policy import DynamicSchedulePolicyBase
from dynsched_core._rollouter import STALENESS_RULES

__all__ = ["ConfigTypeError", "ConfigWarning", "DynamicScheduleConfig"]


class ConfigWarning(UserWarning):
    """A configuration key is unknown (probably misspelt) and was ignored."""


# --------------------------------------------------------------------------- key map
#: field -> verl locations, the first one present wins (the standard key first).
_VERL_PATHS: dict[str, tuple[str, ...]] = {
    "use_dynamic_resource_scheduling": ("async_training.use_dynamic_resource_scheduling",),
    "dynamic_schedule_policy": ("async_training.dynamic_schedule_policy",),
    "dynamic_schedule_deactivate_ratio": ("async_training.dynamic_schedule_deactivate_ratio",),
    "dynamic_schedule_enable_rebalance": ("async_training.dynamic_schedule_enable_rebalance",),
    "dynamic_schedule_min_deactivate_ratio": (
        "async_training.dynamic_schedule_min_deactivate_ratio",
    ),
    "dynamic_schedule_max_deactivate_ratio": (
        "async_training.dynamic_schedule_max_deactivate_ratio",
    ),
    "concurrent_samples_per_replica": (
        "async_training.concurrent_samples_per_replica",
        "rollout.max_concurrent_samples_per_replica",
    ),
    "staleness_threshold": ("async_training.staleness_threshold",),
    # dynsched extension (verl has only the default rule)
    "staleness_rule": ("async_training.staleness_rule",),
    "trigger_parameter_sync_step": ("async_training.trigger_parameter_sync_step",),
    "require_batches": ("async_training.require_batches",),
    "partial_rollout": ("async_training.partial_rollout",),
    "ppo_mini_batch_size": ("actor_rollout_ref.actor.ppo_mini_batch_size",),
    "n": ("actor_rollout_ref.rollout.n", "rollout.n"),
    "rollout_tensor_parallel_size": ("actor_rollout_ref.rollout.tensor_model_parallel_size",),
    "trainer_nnodes": ("trainer.nnodes",),
    "trainer_n_gpus_per_node": ("trainer.n_gpus_per_node",),
    "rollout_nnodes": ("rollout.nnodes",),
    "rollout_n_gpus_per_node": ("rollout.n_gpus_per_node",),
    "total_rollout_steps": ("rollout.total_rollout_steps",),
    "total_training_steps": ("trainer.total_training_steps",),
    "max_prompt_length": ("data.max_prompt_length",),
    "max_response_length": ("data.max_response_length",),
}

#: verl keys of ``async_training`` that dynsched knows and does not use (no warning).
_IGNORED_ASYNC_KEYS = frozenset(
    {
        "use_trainer_do_validate",
        "parallel_validate_and_rollout",
        "checkpoint_engine",
        "compute_prox_log_prob",
        "use_rollout_log_probs",
    }
)

#: Top-level verl sections whose other keys configure verl, not dynsched.
_VERL_SECTIONS = frozenset(
    {
        "trainer",
        "rollout",
        "actor_rollout_ref",
        "data",
        "algorithm",
        "critic",
        "reward_model",
        "reward",
        "custom_reward_function",
        "ray_init",
        "ray_kwargs",
        "global_profiler",
        "transfer_queue",
        "model_engine_server",
        "distillation",
        "hydra",
        "defaults",
    }
)

_OWNED_SECTIONS = frozenset({"async_training"})

# --------------------------------------------------------------------------- upper bounds
# What any cluster can hold, checked when a config is built (before anything starts). A
# local cluster is bounded further by the machine (``dynsched run``/``train``).
#: GPUs of the trainer and rollout pools together (a large cluster has a few thousand).
MAX_GPUS = 65_536
#: Samples the trainer consumes per weight sync (``required_samples x T``); every numeric
#: batch field is bounded by it too.
MAX_SAMPLES_PER_STEP = 1_000_000
#: Responses per prompt (``actor_rollout_ref.rollout.n``).
MAX_RESPONSES_PER_PROMPT = 65_536
#: ``async_training.staleness_threshold`` (a fraction of a cycle's demand; 0-1 is usual).
MAX_STALENESS_THRESHOLD = 1_000.0
#: Trainer micro-steps (``trainer.total_training_steps``).
MAX_STEPS = 10_000_000
#: Prompts generated in total (``rollout.total_rollout_steps``).
MAX_ROLLOUT_PROMPTS = 10_000_000_000
#: Token budgets (``data.max_prompt_length``, ``data.max_response_length``).
MAX_TOKENS = 10_000_000


@attrs.frozen(kw_only=True)
class DynamicScheduleConfig:
    """Settings of the dynamic scheduler and the reference fully-async loop.

    Field names are verl's leaf key names (``async_training.*``); node counts and batch
    sizes come from verl's ``trainer``/``rollout``/``actor_rollout_ref`` sections. One
    *sample* is one prompt group of ``n`` responses, as the trainer consumes it.

    Attributes:
        use_dynamic_resource_scheduling: Let hybrid replicas on trainer GPUs generate
            while the trainer waits (``async_training.use_dynamic_resource_scheduling``).
        dynamic_schedule_policy: Registered policy name (``default``,
            ``static_fully_async``, ``fixed_ratio`` or a plug-in).
        dynamic_schedule_deactivate_ratio: Initial deactivate ratio, in
            ``[dynamic_schedule_min_deactivate_ratio, dynamic_schedule_max_deactivate_ratio]``.
        dynamic_schedule_enable_rebalance: Rebalance in-flight requests after activation.
        dynamic_schedule_min_deactivate_ratio: Guard rail (dynsched): the driver never lets
            any policy deactivate with fewer than ``floor(min * step_required_samples)``
            samples buffered; in ``[0, 1]``.
        dynamic_schedule_max_deactivate_ratio: Guard rail (dynsched): nor wait for more than
            ``floor(max * step_required_samples)``; in ``[min, 1]``.
        concurrent_samples_per_replica: Samples in flight per routable replica (>= 1).
        staleness_threshold: Extra samples the rollouter may produce ahead of demand, as a
            fraction of a cycle's demand (>= 0).
        staleness_rule: What a new staleness window starts with (dynsched extension,
            ``async_training.staleness_rule``): ``"in_flight_and_queued"`` (default,
            verl's rule: samples in flight and samples waiting in the queue count against
            the new version's budget) or ``"in_flight"`` (queued samples do not count;
            the queue's capacity alone bounds them). See `Rollouter`.
        trigger_parameter_sync_step: Micro-steps per weight sync, ``T`` (>= 1).
        require_batches: PPO mini-batches the trainer consumes per micro-step (> 0).
        partial_rollout: Resume aborted requests keeping their tokens. Required by dynamic
            scheduling (each deactivation aborts requests).
        ppo_mini_batch_size: Samples per PPO mini-batch (>= 1).
        n: Responses per prompt (group size, >= 1).
        rollout_tensor_parallel_size: GPUs per rollout replica (>= 1).
        trainer_nnodes: Trainer nodes (>= 0); their GPUs host the hybrid replicas.
        trainer_n_gpus_per_node: GPUs per trainer node (>= 0).
        rollout_nnodes: Standalone rollout nodes (>= 0; 0 means hybrid-only/colocated).
        rollout_n_gpus_per_node: GPUs per rollout node (>= 0).
        total_rollout_steps: Prompts to generate in total (None: until the data ends).
        total_training_steps: Cap on trainer micro-steps (None: no cap).
        max_prompt_length: Prompt token budget (``data.max_prompt_length``, >= 1).
        max_response_length: Response token budget (``data.max_response_length``, >= 1).

    Example:
        >>> cfg = DynamicScheduleConfig.from_dict(
        ...     {
        ...         "async_training": {"staleness_threshold": 0.5, "trigger_parameter_sync_step": 2},
        ...         "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4}},
        ...     }
        ... )
        >>> cfg.required_samples, cfg.step_required_samples, cfg.max_required_samples
        (4, 8, 12)
    """

    use_dynamic_resource_scheduling: bool = attrs.field(default=False, validator=v.bool_())
    dynamic_schedule_policy: str = attrs.field(
        default="default", validator=v.non_empty_str("a non-empty policy name (string)")
    )
    dynamic_schedule_deactivate_ratio: float = attrs.field(
        default=0.3, validator=v.float_in(0.0, 1.0)
    )
    dynamic_schedule_enable_rebalance: bool = attrs.field(default=True, validator=v.bool_())
    dynamic_schedule_min_deactivate_ratio: float = attrs.field(
        default=0.0, validator=v.float_in(0.0, 1.0)
    )
    dynamic_schedule_max_deactivate_ratio: float = attrs.field(
        default=1.0, validator=v.float_in(0.0, 1.0)
    )
    concurrent_samples_per_replica: int = attrs.field(
        default=16, validator=v.int_ge(1, maximum=MAX_SAMPLES_PER_STEP)
    )
    staleness_threshold: float = attrs.field(
        default=0.1, validator=v.float_in(0.0, MAX_STALENESS_THRESHOLD)
    )
    staleness_rule: str = attrs.field(
        default="in_flight_and_queued", validator=v.one_of(STALENESS_RULES)
    )
    trigger_parameter_sync_step: int = attrs.field(
        default=4, validator=v.int_ge(1, maximum=MAX_SAMPLES_PER_STEP)
    )
    require_batches: float = attrs.field(
        default=1, validator=v.float_in(0.0, MAX_SAMPLES_PER_STEP, lo_open=True)
    )
    partial_rollout: bool = attrs.field(default=True, validator=v.bool_())
    ppo_mini_batch_size: int = attrs.field(
        default=256, validator=v.int_ge(1, maximum=MAX_SAMPLES_PER_STEP)
    )
    n: int = attrs.field(default=1, validator=v.int_ge(1, maximum=MAX_RESPONSES_PER_PROMPT))
    rollout_tensor_parallel_size: int = attrs.field(
        default=1, validator=v.int_ge(1, maximum=MAX_GPUS)
    )
    trainer_nnodes: int = attrs.field(default=1, validator=v.int_ge(0, maximum=MAX_GPUS))
    trainer_n_gpus_per_node: int = attrs.field(default=8, validator=v.int_ge(0, maximum=MAX_GPUS))
    rollout_nnodes: int = attrs.field(default=1, validator=v.int_ge(0, maximum=MAX_GPUS))
    rollout_n_gpus_per_node: int = attrs.field(default=8, validator=v.int_ge(0, maximum=MAX_GPUS))
    total_rollout_steps: int | None = attrs.field(
        default=None, validator=v.int_ge(1, maximum=MAX_ROLLOUT_PROMPTS, optional=True)
    )
    total_training_steps: int | None = attrs.field(
        default=None, validator=v.int_ge(1, maximum=MAX_STEPS, optional=True)
    )
    max_prompt_length: int = attrs.field(default=512, validator=v.int_ge(1, maximum=MAX_TOKENS))
    max_response_length: int = attrs.field(default=512, validator=v.int_ge(1, maximum=MAX_TOKENS))

    def __attrs_post_init__(self) -> None:
        lo, hi = (
            self.dynamic_schedule_min_deactivate_ratio,
            self.dynamic_schedule_max_deactivate_ratio,
        )
        derived.check_ratio_range(type(self).__name__, lo, hi, prefix="dynamic_schedule_")
        if not lo <= self.dynamic_schedule_deactivate_ratio <= hi:
            raise ConfigError(
                f"{type(self).__name__}.dynamic_schedule_deactivate_ratio must be in "
                f"[{lo:g}, {hi:g}] (the guard-rail range dynamic_schedule_min/max_deactivate_ratio),"
                f" got {self.dynamic_schedule_deactivate_ratio:g}",
                key="dynamic_schedule_deactivate_ratio",
            )
        product = self.ppo_mini_batch_size * self.require_batches
        if abs(product - round(product)) > 1e-9 or round(product) < 1:
            raise ConfigError(
                f"{type(self).__name__}.require_batches: ppo_mini_batch_size ({self.ppo_mini_batch_size}) * "
                f"require_batches ({self.require_batches}) = {product:g} must be a whole number "
                ">= 1 (the samples the trainer consumes per micro-step)",
                key="require_batches",
            )
        total = self.hybrid_gpus + self.standalone_gpus
        if total > MAX_GPUS:
            field = (
                "trainer_n_gpus_per_node"
                if self.hybrid_gpus >= self.standalone_gpus
                else "rollout_n_gpus_per_node"
            )
            raise ConfigError(
                f"{type(self).__name__}.{field}: trainer.nnodes x trainer.n_gpus_per_node "
                f"({self.trainer_nnodes} x {self.trainer_n_gpus_per_node}) + rollout.nnodes x "
                f"rollout.n_gpus_per_node ({self.rollout_nnodes} x "
                f"{self.rollout_n_gpus_per_node}) = {total:,} GPUs; at most {MAX_GPUS:,}",
                key=field,
            )
        if self.step_required_samples > MAX_SAMPLES_PER_STEP:
            raise ConfigError(
                f"{type(self).__name__}.ppo_mini_batch_size: samples per weight sync "
                f"ppo_mini_batch_size x require_batches x trigger_parameter_sync_step "
                f"({self.ppo_mini_batch_size} x {self.require_batches:g} x "
                f"{self.trigger_parameter_sync_step}) = {self.step_required_samples:,}; at most "
                f"{MAX_SAMPLES_PER_STEP:,}",
                key="ppo_mini_batch_size",
            )
        if self.use_dynamic_resource_scheduling and not self.partial_rollout:
            raise ConfigError(
                f"{type(self).__name__}.partial_rollout: dynamic resource scheduling needs partial_rollout=true. Every "
                "deactivation aborts the requests running on hybrid replicas; without partial "
                "rollout they cannot be resumed elsewhere and each one would end as a truncated "
                "trajectory. Set async_training.partial_rollout=true or disable "
                "async_training.use_dynamic_resource_scheduling.",
                key="partial_rollout",
            )
        if self.standalone_gpus == 0 and not self.use_dynamic_resource_scheduling:
            raise ConfigError(
                f"{type(self).__name__}.rollout_nnodes: no standalone rollout GPUs (rollout.nnodes * "
                "rollout.n_gpus_per_node = 0) and dynamic scheduling is off, so nothing would "
                "generate samples; set rollout.nnodes >= 1 or enable "
                "async_training.use_dynamic_resource_scheduling (hybrid-only mode)",
                key="rollout_nnodes",
            )

    # ------------------------------------------------------------------ derived values
    @property
    def required_samples(self) -> int:
        """Samples consumed per micro-step: ``ppo_mini_batch_size * require_batches``."""
        return round(self.ppo_mini_batch_size * self.require_batches)

    @property
    def step_required_samples(self) -> int:
        """Samples consumed per weight-sync cycle: ``required_samples * T``."""
        return derived.step_required_samples(
            self.required_samples, self.trigger_parameter_sync_step
        )

    @property
    def max_required_samples(self) -> int:
        """Admission budget per parameter version: ``(1 + staleness) * required * T``."""
        return derived.max_required_samples(
            self.required_samples, self.trigger_parameter_sync_step, self.staleness_threshold
        )

    @property
    def buffer_samples(self) -> int:
        """Samples allowed ahead of demand: ``staleness_threshold * step_required_samples``."""
        return int(self.staleness_threshold * self.step_required_samples)

    @property
    def max_queue_size(self) -> int:
        """Queue capacity used by the reference loop (``max_required_samples``, as verl)."""
        return self.max_required_samples

    @property
    def hybrid_gpus(self) -> int:
        """Trainer GPUs, which host the hybrid replicas."""
        return self.trainer_nnodes * self.trainer_n_gpus_per_node

    @property
    def standalone_gpus(self) -> int:
        """GPUs of the standalone rollout pool."""
        return self.rollout_nnodes * self.rollout_n_gpus_per_node

    @property
    def num_standalone_replicas(self) -> int:
        """Standalone replicas the GPUs allow (``standalone_gpus // tensor parallel size``)."""
        return self.standalone_gpus // self.rollout_tensor_parallel_size

    @property
    def num_hybrid_replicas(self) -> int:
        """Hybrid replicas the trainer GPUs allow (0 when dynamic scheduling is off)."""
        if not self.use_dynamic_resource_scheduling:
            return 0
        return self.hybrid_gpus // self.rollout_tensor_parallel_size

    @property
    def only_hybrid(self) -> bool:
        """Colocated as configured: no standalone replica, every sample from hybrid replicas.

        What verl passes to a policy's constructor; at run time the driver derives the
        same flag from the live membership (`dynsched_core.GuardRails`).
        """
        return is_colocated(self.use_dynamic_resource_scheduling, self.num_standalone_replicas)

    def max_concurrent_samples(self, routable_replicas: int) -> int:
        """Concurrency cap: ``min(routable * concurrent_samples_per_replica, max_required)``."""
        return derived.concurrency_cap(
            routable_replicas, self.concurrent_samples_per_replica, self.max_required_samples
        )

    # ------------------------------------------------------------------ policy helpers
    def policy_kwargs(self) -> dict[str, Any]:
        """Constructor arguments verl passes to a policy: the ratio and ``only_hybrid``."""
        return {
            "deactivate_ratio": float(self.dynamic_schedule_deactivate_ratio),
            "only_hybrid": self.only_hybrid,
        }

    def build_policy(self, **overrides: Any) -> DynamicSchedulePolicyBase:
        """Build ``dynamic_schedule_policy`` from the registry.

        `policy_kwargs` are passed when the policy's constructor accepts them (a policy
        without a ``deactivate_ratio`` argument simply does not get it); ``overrides``
        are always passed.

        Raises:
            PolicyRegistryError: unknown policy name (lists the known names).
        """
        from dynsched_core._registry import get_policy_class

        cls = get_policy_class(self.dynamic_schedule_policy)
        kwargs = _accepted_kwargs(cls, self.policy_kwargs())
        kwargs.update(overrides)
        return cls(**kwargs)

    # ------------------------------------------------------------------ (de)serialising
    def to_dict(self) -> dict[str, Any]:
        """Flat field -> value mapping (round-trips through `from_dict`)."""
        return attrs.asdict(self)

    def to_verl_dict(self) -> dict[str, Any]:
        """Nested mapping in verl's layout (each field at its standard verl key)."""
        out: dict[str, Any] = {}
        for name, value in self.to_dict().items():
            node = out
            *parents, leaf = _VERL_PATHS[name][0].split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return out

    def evolve(self, **changes: Any) -> DynamicScheduleConfig:
        """Return a copy with ``changes`` applied (validated again)."""
        return attrs.evolve(self, **changes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], **overrides: Any) -> DynamicScheduleConfig:
        """Read a config from verl's nested layout, flat field names or dotted keys.

        Accepted forms, which can be mixed: nested verl sections
        (``{"async_training": {"staleness_threshold": 0.1}}``), dotted verl keys
        (``{"async_training.staleness_threshold": 0.1}``) and flat field names
        (``{"staleness_threshold": 0.1, "rollout_nnodes": 2}``). ``overrides`` are flat
        field names applied last.

        Raises:
            ConfigError: a value has the wrong type or range (the message names the key
                as it was given), or the combination is refused.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"config must be a mapping (dict), got {type(data).__name__}", key=None
            )
        check_tree(data)  # size, depth, huge ints: before anything expands it
        tree = _expand_dotted(data)
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        _read_verl(tree, values, sources)
        _read_flat(tree, values, sources)
        _warn_unknown(tree)
        for name, value in overrides.items():
            if name not in _VERL_PATHS:
                raise ConfigError(
                    f"unknown config field {name!r}; known fields: {sorted(_VERL_PATHS)}",
                    key=name,
                )
            values[name] = value
            sources[name] = name
        try:
            return cls(**values)
        except ConfigError as exc:
            # name the key as the user wrote it (verl's dotted path), not the field
            field = exc.key or ""
            key = sources.get(field)
            prefix = f"{cls.__name__}.{field}"
            message = str(exc)
            if key is None or not message.startswith(prefix):
                raise
            raise type(exc)(f"{key}{message[len(prefix) :]}", key=key) from None

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], **overrides: Any) -> DynamicScheduleConfig:
        """Read a YAML file (e.g. verl's ``fully_async_ppo_trainer.yaml``); see `from_dict`.

        Raises:
            ConfigError: PyYAML is missing, the file cannot be read or parsed, or a value
                is invalid.
        """
        try:
            import yaml  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ConfigError(
                "reading YAML configs needs PyYAML: pip install 'dynsched-core[yaml]'"
            ) from exc
        try:
            data = read_config_file(path)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {os.fspath(path)!r}: {exc}") from exc
        except ConfigError as exc:
            raise ConfigError(
                f"cannot parse YAML config {os.fspath(path)!r}: {exc}", key=exc.key
            ) from None
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"config file {os.fspath(path)!r} must hold a mapping, got {type(data).__name__}"
            )
        return cls.from_dict(data, **overrides)


# --------------------------------------------------------------------------- helpers
def _accepted_kwargs(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


def _expand_dotted(data: Mapping[str, Any]) -> dict[str, Any]:
    """Turn ``{"a.b": 1}`` into ``{"a": {"b": 1}}``, merging with nested entries."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(f"config keys must be strings, got {key!r}", key=str(key))
        node = out
        *parents, leaf = key.split(".")
        for i, part in enumerate(parents):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(
                    f"{'.'.join(parents[: i + 1])} is both a value and a section", key=key
                )
            node = child
        if isinstance(value, Mapping):
            merged = _expand_dotted(value)
            existing = node.get(leaf)
            if isinstance(existing, dict):
                existing.update(merged)
            else:
                node[leaf] = merged
        else:
            node[leaf] = value
    return out


def _lookup(tree: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _read_verl(tree: Mapping[str, Any], values: dict[str, Any], sources: dict[str, str]) -> None:
    for name, paths in _VERL_PATHS.items():
        for path in paths:
            found, value = _lookup(tree, path)
            if found:
                values[name] = value
                sources[name] = path
                break


def _read_flat(tree: Mapping[str, Any], values: dict[str, Any], sources: dict[str, str]) -> None:
    for name in _VERL_PATHS:
        if name in tree and not isinstance(tree[name], Mapping):
            values[name] = tree[name]
            sources[name] = name


def _read_keys_of(section: str, read_paths: set[str] | None = None) -> set[str]:
    """Leaf keys dynsched reads below ``section`` (dotted, relative)."""
    prefix = section + "."
    if read_paths is None:
        read_paths = {p for paths in _VERL_PATHS.values() for p in paths}
    return {path[len(prefix) :] for path in read_paths if path.startswith(prefix)}


#: A key of a verl section whose name is this close (difflib ratio) to a key dynsched reads
#: there is taken for a misspelling of it and warned about; other keys are verl's own.
MISSPELT_RATIO = 0.8

#: verl's own keys that are that close to a key dynsched reads (never warned about).
_VERL_LOOKALIKE_KEYS = frozenset(
    {
        "actor_rollout_ref.actor.ppo_micro_batch_size",  # ~ ppo_mini_batch_size
        "critic.ppo_micro_batch_size",
    }
)


def unknown_key_messages(tree: Mapping[str, Any], extra_read: tuple[str, ...] = ()) -> list[str]:
    """One message per unknown key of an expanded config tree, naming the closest known key.

    Checked: the top-level keys and ``async_training`` (dynsched's own section: every
    unknown key), and in verl's other sections the keys within `MISSPELT_RATIO` of a key
    dynsched reads in the same section (verl's other keys are its own and stay silent).

    Args:
        tree: The config (dotted keys are expanded first).
        extra_read: More dotted verl keys the caller reads (e.g. ``dynsched train``'s
            ``actor_rollout_ref.actor.optim.lr``).
    """
    tree = _expand_dotted(tree)
    out: list[str] = []
    read_paths = {p for paths in _VERL_PATHS.values() for p in paths} | set(extra_read)
    flat_names = set(_VERL_PATHS)
    top_known = flat_names | _OWNED_SECTIONS | _VERL_SECTIONS
    for key in tree:
        if key not in top_known:
            close = difflib.get_close_matches(str(key), sorted(top_known), n=1)
            out.append(_unknown_message(tree, str(key), close[0] if close else None))
    for section in _OWNED_SECTIONS:
        body = tree.get(section)
        if not isinstance(body, Mapping):
            continue
        known = _read_keys_of(section, read_paths) | _IGNORED_ASYNC_KEYS
        for key in body:
            if key not in known:
                close = difflib.get_close_matches(str(key), sorted(known), n=1)
                out.append(
                    _unknown_message(
                        tree, f"{section}.{key}", f"{section}.{close[0]}" if close else None
                    )
                )
    for section in sorted(_VERL_SECTIONS):
        body = tree.get(section)
        if isinstance(body, Mapping):
            _misspelt(tree, section, body, _read_keys_of(section, read_paths), out)
    return out


def _unknown_message(tree: Mapping[str, Any], key: str, close: str | None) -> str:
    if close is None:
        return f"unknown key {key}; ignored"
    given, _ = _lookup(tree, close)
    then = "ignored" if given else "using the default"
    return f"unknown key {key} (did you mean {close}?); {then}"


def _warn_unknown(tree: Mapping[str, Any]) -> None:
    for message in unknown_key_messages(tree):
        warnings.warn(message, ConfigWarning, stacklevel=4)


def _misspelt(
    tree: Mapping[str, Any], prefix: str, body: Mapping[str, Any], read: set[str], out: list[str]
) -> None:
    """Keys of a verl section that look like a misspelt key dynsched reads."""
    leaves = {k.split(".")[0] for k in read}
    for key, value in body.items():
        key = str(key)
        if key in leaves:
            sub = {k.split(".", 1)[1] for k in read if k.startswith(key + ".")}
            if sub and isinstance(value, Mapping):
                _misspelt(tree, f"{prefix}.{key}", value, sub, out)
            continue
        close = difflib.get_close_matches(key, sorted(leaves), n=1, cutoff=MISSPELT_RATIO)
        if close and f"{prefix}.{key}" not in _VERL_LOOKALIKE_KEYS:
            out.append(_unknown_message(tree, f"{prefix}.{key}", f"{prefix}.{close[0]}"))
