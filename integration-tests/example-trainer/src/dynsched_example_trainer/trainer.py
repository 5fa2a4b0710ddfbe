"""`MarkedTorchTrainer`: `TorchTrainer` that appends a line per step to a file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dynsched_ray.trainers.torch.trainer import TorchTrainer

__all__ = ["MarkedTorchTrainer"]


class MarkedTorchTrainer(TorchTrainer):
    """`TorchTrainer`; each `train_step` appends ``<version> <prompt groups>`` to ``log_path``."""

    def __init__(self, model: str | Path, *, log_path: str | None = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.log_path = log_path

    def train_step(self, batch: Any) -> Any:
        metrics = super().train_step(batch)
        if self.log_path:
            with Path(self.log_path).open("a", encoding="utf-8") as f:
                f.write(f"{self.version} {len(batch.groups)}\n")
        return metrics
