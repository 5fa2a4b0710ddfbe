"""The transformers engine: `HFReplica` (``generate`` on the trainer's device; extra ``torch``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynsched_ray.engines.hf.replica import HFReplica
from dynsched_ray.plugins import EnginePlugin, RunContext

__all__ = ["ENGINE", "HFReplica"]


def _options(run: RunContext) -> Mapping[str, Any]:
    return {
        "model": run.model,
        "temperature": run.temperature,
        "seed": run.seed,
        "device": run.device,
    }


ENGINE = EnginePlugin(factory=HFReplica, options=_options, description="transformers generate")
"""The entry point ``hf`` of ``dynsched.engines``."""
