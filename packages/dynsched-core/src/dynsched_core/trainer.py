"""The trainer interface and the GPU hand-over between a trainer and hybrid replicas.

`Trainer`, `TrainBatch` and `TrainResponse` are also importable from ``dynsched_core``.
"""

from __future__ import annotations

from dynsched_core import _trainer
from dynsched_core._handover import GpuHandOver, GpuHolders, HandOverError, HandOverReplica
from dynsched_core._trainer import *  # noqa: F403  (exactly `_trainer.__all__`)

__all__ = ["GpuHandOver", "GpuHolders", "HandOverError", "HandOverReplica", *_trainer.__all__]
