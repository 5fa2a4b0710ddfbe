"""The FSDP2 trainer (extra ``torch``): parameters, gradients and optimizer state sharded
over the data-parallel ranks. `FSDPTrainer` is imported on first use."""

from __future__ import annotations

from dynsched_ray._lazy import lazy_getattr
from dynsched_ray.plugins import LazyFactory, TrainerPlugin

__all__ = ["TRAINER", "FSDPTrainer"]

TRAINER = TrainerPlugin(
    factory=LazyFactory("dynsched_ray.trainers.fsdp.trainer:FSDPTrainer"),
    description="fsdp: AdamW with the model sharded over the ranks (torch FSDP2)",
)
"""The entry point ``fsdp`` of ``dynsched.trainers``."""


__getattr__ = lazy_getattr(__name__, {"FSDPTrainer": f"{__name__}.trainer"})
