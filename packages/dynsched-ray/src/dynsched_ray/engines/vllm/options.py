"""`VLLMOptions`: the settings of a `VLLMReplica`, one frozen record validated on creation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from dynsched_core import validators as v
from dynsched_core.errors import ConfigError

__all__ = ["SAMPLING_KEYS", "VLLMOptions"]

_MIB = 1024 * 1024
#: Default sampling fields a replica accepts (vLLM ``SamplingParams`` names).
SAMPLING_KEYS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "ignore_eos",
        "repetition_penalty",
        "stop_token_ids",
    }
)


def _mapping(value: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(value or {})


def _sampling_keys(inst: Any, attr: attrs.Attribute[Any], value: Mapping[str, Any]) -> None:
    bad = sorted(set(value) - SAMPLING_KEYS)
    if bad:
        raise ConfigError(
            f"VLLMOptions.{attr.name}: sampling keys {bad} unknown; allowed: {sorted(SAMPLING_KEYS)}",
            key=attr.name,
        )


def _optional(validator: v.Validator) -> v.Validator:
    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            validator(inst, attr, value)

    return check


@attrs.frozen(kw_only=True)
class VLLMOptions:
    """How a `VLLMReplica` runs its engine (every field validated; errors name it).

    Attributes:
        sampling: Default sampling fields (``temperature``, ``top_p``, ``top_k``,
            ``min_p``, ``seed``, ``ignore_eos``, ``repetition_penalty``,
            ``stop_token_ids``).
        asleep: Initial state (``None``: asleep for hybrid, awake for standalone).
        weights_version: Version of the start-up weights.
        device: ``"cpu"``, ``"cuda"`` or ``None`` (the installed vLLM build decides).
        sleep_level: vLLM sleep level used by `VLLMReplica.sleep` on a GPU (1 or 2).
        max_model_len: Context length (``None``: the model's).
        max_num_seqs: Concurrent sequences of the engine.
        kv_cache_bytes: KV cache size on CPU (default 64 MiB: plenty for the tiny model).
        gpu_memory_utilization: Share of the GPU the engine may use, in (0, 1].
        dtype: Model dtype (``None``: float32 on CPU, ``"auto"`` on a GPU).
        seed: Engine seed.
        start_timeout_s: Bound of `VLLMReplica.start` (> 0).
        engine_kwargs: Further ``vllm.AsyncEngineArgs`` fields (override the above).

    Example:
        >>> VLLMOptions(sleep_level=3)
        Traceback (most recent call last):
        ...
        dynsched_core._errors.ConfigError: VLLMOptions.sleep_level must be one of [1, 2], got 3
    """

    sampling: Mapping[str, Any] = attrs.field(
        factory=dict, converter=_mapping, validator=_sampling_keys
    )
    asleep: bool | None = attrs.field(default=None, validator=_optional(v.bool_()))
    weights_version: int = attrs.field(default=0, validator=v.int_ge(0))
    device: str | None = attrs.field(default=None, validator=_optional(v.one_of(("cpu", "cuda"))))
    sleep_level: int = attrs.field(default=1, validator=v.one_of((1, 2)))  # type: ignore[arg-type]
    max_model_len: int | None = attrs.field(default=None, validator=v.int_ge(1, optional=True))
    max_num_seqs: int = attrs.field(default=32, validator=v.int_ge(1))
    kv_cache_bytes: int = attrs.field(default=64 * _MIB, validator=v.int_ge(1))
    gpu_memory_utilization: float = attrs.field(
        default=0.3, validator=v.float_in(0.0, 1.0, lo_open=True)
    )
    dtype: str | None = attrs.field(default=None, validator=_optional(v.non_empty_str()))
    seed: int = attrs.field(default=0, validator=v.int_ge(0))
    start_timeout_s: float = attrs.field(default=600.0, validator=v.float_gt(0.0))
    engine_kwargs: Mapping[str, Any] = attrs.field(factory=dict, converter=_mapping)

    @classmethod
    def merge(cls, options: VLLMOptions | None, fields: Mapping[str, Any]) -> VLLMOptions:
        """``options`` (default: the defaults) with ``fields`` replaced.

        Raises:
            TypeError: a field name `VLLMOptions` does not have (the known ones listed).
            ConfigError: an invalid value (the field and the allowed values named).
        """
        known = attrs.fields_dict(cls)
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise TypeError(f"unknown VLLMReplica option(s) {unknown}; allowed: {sorted(known)}")
        return attrs.evolve(options if options is not None else cls(), **fields)
