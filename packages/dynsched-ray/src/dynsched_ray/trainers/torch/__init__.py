"""The plain-torch trainer (extra ``torch``): `TorchTrainer`, imported on first use."""

from __future__ import annotations

from dynsched_ray._lazy import lazy_getattr
from dynsched_ray.plugins import LazyFactory, TrainerPlugin

__all__ = ["TRAINER", "TorchTrainer"]

TRAINER = TrainerPlugin(
    factory=LazyFactory("dynsched_ray.trainers.torch.trainer:TorchTrainer"),
    description="torch: AdamW on the whole model",
)
"""The entry point ``torch`` of ``dynsched.trainers``."""


__getattr__ = lazy_getattr(__name__, {"TorchTrainer": f"{__name__}.trainer"})
