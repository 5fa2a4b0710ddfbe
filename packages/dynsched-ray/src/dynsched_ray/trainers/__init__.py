"""Trainers, one folder each, every one a plug-in of ``dynsched.trainers``; the trainer group.

Built in: ``torch`` (`dynsched_ray.trainers.torch`) and ``megatron``
(`dynsched_ray.trainers.megatron`), both on `RLTrainerBase` (`dynsched_ray.trainers.base`,
the RL step, checkpoints and sleep/wake shared by every trainer). Another package adds a
trainer by naming a `TrainerPlugin` in its entry points (see `dynsched_ray.plugins`);
`load_trainer` finds any of them by name (an unknown one
raises `TrainerLookupError` with the known names and the closest match). `RayTrainerGroup` runs one trainer per actor
(`dynsched_ray.trainers.group`) and resizes its data-parallel group at a sync boundary
(`dynsched_ray.trainers.elastic`); `RayTrainerBackend` is the reference loop's stand-in
(`dynsched_ray.trainers.standin`).

The classes are imported on first access (the base needs torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynsched_ray._lazy import lazy_getattr
from dynsched_ray.plugins import TRAINER_GROUP, TRAINERS, TrainerLookupError, TrainerPlugin

if TYPE_CHECKING:
    from dynsched_ray.trainers.base import RLTrainerBase, TrainerOptions
    from dynsched_ray.trainers.elastic import TrainerResizeError
    from dynsched_ray.trainers.group import RayTrainerGroup, RayTrainerGroupBackend, RayTrainerSpec
    from dynsched_ray.trainers.standin import RayTrainerBackend

__all__ = [
    "TRAINER_GROUP",
    "RLTrainerBase",
    "RayTrainerBackend",
    "RayTrainerGroup",
    "RayTrainerGroupBackend",
    "RayTrainerSpec",
    "TrainerLookupError",
    "TrainerOptions",
    "TrainerPlugin",
    "TrainerResizeError",
    "load_trainer",
    "trainer_names",
]


trainer_names = TRAINERS.names
load_trainer = TRAINERS.load

__getattr__ = lazy_getattr(
    __name__,
    {
        "RLTrainerBase": f"{__name__}.base",
        "TrainerOptions": f"{__name__}.base",
        "RayTrainerGroup": f"{__name__}.group",
        "RayTrainerGroupBackend": f"{__name__}.group",
        "RayTrainerSpec": f"{__name__}.group",
        "RayTrainerBackend": f"{__name__}.standin",
        "TrainerResizeError": f"{__name__}.elastic",
    },
)
