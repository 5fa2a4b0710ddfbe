"""An out-of-tree trainer: the torch trainer with a marker on every step.

Registered as ``example_torch`` in the entry-point group ``dynsched.trainers`` (see this
distribution's ``pyproject.toml``); ``dynsched train --trainer example_torch`` runs it.
Importing this module does not import torch: the trainer class lives in
`dynsched_example_trainer.trainer`, named by a `LazyFactory`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dynsched_ray.plugins import LazyFactory, RunContext, TrainerPlugin, trainer_options

__all__ = ["LOG_ENV", "TRAINER"]

#: Environment variable (read in the driver) naming the file each step marks.
LOG_ENV = "DYNSCHED_EXAMPLE_TRAINER_LOG"


def _options(run: RunContext) -> Mapping[str, Any]:
    return {**trainer_options(run), "log_path": os.environ.get(LOG_ENV)}


TRAINER = TrainerPlugin(
    factory=LazyFactory("dynsched_example_trainer.trainer:MarkedTorchTrainer"),
    options=_options,
    description="example: torch trainer marking each step",
)
