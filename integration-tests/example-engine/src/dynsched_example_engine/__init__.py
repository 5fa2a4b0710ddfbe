"""An out-of-tree rollout engine: the transformers engine under another name, with a marker.

Registered as ``example_hf`` in the entry-point group ``dynsched.engines`` (see this
distribution's ``pyproject.toml``); ``dynsched train --engine example_hf`` runs it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dynsched_ray.engines.hf import ENGINE as HF_ENGINE
from dynsched_ray.engines.hf import HFReplica
from dynsched_ray.plugins import EnginePlugin, RunContext

__all__ = ["ENGINE", "LOG_ENV", "MarkedHFReplica"]

#: Environment variable (read in the driver) naming the file each replica marks.
LOG_ENV = "DYNSCHED_EXAMPLE_ENGINE_LOG"


class MarkedHFReplica(HFReplica):
    """`HFReplica` that appends ``<replica id> <role>`` to ``log_path`` once built."""

    def __init__(self, replica_id: str, *, log_path: str | None = None, **kwargs: Any) -> None:
        super().__init__(replica_id, **kwargs)
        if log_path:
            with Path(log_path).open("a", encoding="utf-8") as f:
                f.write(f"{replica_id} {kwargs.get('role', 'standalone')}\n")


def _options(run: RunContext) -> Mapping[str, Any]:
    return {**HF_ENGINE.options(run), "log_path": os.environ.get(LOG_ENV)}


ENGINE = EnginePlugin(
    factory=MarkedHFReplica, options=_options, description="example: marked transformers engine"
)
