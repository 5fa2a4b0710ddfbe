"""The trainer interface and the GPU hand-over between a trainer and hybrid replicas.

`Trainer`, `TrainBatch` and `TrainResponse` are also importable from ``dynsched_core``.
"""

from __future__ import annotations

from dynsched_core._handover import GpuHandOver, GpuHolders, HandOverError, HandOverReplica
from dynsched_core._trainer import (
    MemoryReport,
    OffloadReport,
    TrainBatch,
    Trainer,
    TrainerLoopBackend,
    TrainMetrics,
    TrainResponse,
)

__all__ = [
    "GpuHandOver",
    "GpuHolders",
    "HandOverError",
    "HandOverReplica",
    "MemoryReport",
    "OffloadReport",
    "TrainBatch",
    "TrainMetrics",
    "TrainResponse",
    "Trainer",
    "TrainerLoopBackend",
]
