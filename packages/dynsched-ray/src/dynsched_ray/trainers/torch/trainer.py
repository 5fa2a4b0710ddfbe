"""`TorchTrainer`: a Hugging Face ``transformers`` causal LM trained with AdamW."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dynsched_ray.trainers.base import RLTrainerBase, TrainerOptions

__all__ = ["TorchTrainer"]

logger = logging.getLogger(__name__)


class TorchTrainer(RLTrainerBase):
    """Implements the core `Trainer` over a ``transformers`` causal LM (float32).

    The model is loaded from a Hugging Face folder (e.g. `build_tiny_model`'s). Each
    `train_step` is one AdamW update on the shared RL objective, with gradients
    accumulated over mini-batches of ``options.ppo_mini_batch_size`` prompt groups.
    `offload` moves parameters, gradients and AdamW state to host memory (pinned on
    CUDA) and `reload` brings them back, bit for bit. Its parameter names already are
    Hugging Face names, so `export_weights` returns them as they are.

    Args:
        model: Folder of a Hugging Face causal LM (``config.json`` + weights).
        options: Optimizer and step settings.

    Example:
        >>> trainer = TorchTrainer(folder, TrainerOptions(lr=1e-3))  # doctest: +SKIP
        >>> metrics = trainer.train_step(batch)  # doctest: +SKIP
        >>> trainer.offload().after.device_bytes  # doctest: +SKIP
        0
    """

    def __init__(self, model: str | Path, options: TrainerOptions | None = None) -> None:
        from transformers import AutoModelForCausalLM

        path = self._setup(model, options, kind="model")
        self.model = AutoModelForCausalLM.from_pretrained(  # nosec B615: a local folder, no download
            str(path), dtype=torch.float32, local_files_only=True
        )
        self.model.to(self.device)
        self.model.train()
        pad = self.model.config.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else 0
        self.optimizer = self.options.adamw(self.model.parameters())
        self._version = 0
        self._init_offloader()
        logger.info(
            "TorchTrainer: %s on %s, %d parameters",
            path.name,
            self.device,
            sum(p.numel() for p in self._params()),
        )

    def _params(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def _named_params(self) -> list[tuple[str, torch.nn.Parameter]]:
        return list(self.model.named_parameters())

    def _logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(input_ids=input_ids, use_cache=False).logits
        return out

    def _hf_weights(self, named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(named)

    def logits(self, input_ids: Any) -> torch.Tensor:
        """Forward pass without gradient: ``[B, L, V]`` logits of ``[B, L]`` token ids."""
        self._require_resident("logits")
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device)
        with torch.no_grad():
            return self._logits(ids)
