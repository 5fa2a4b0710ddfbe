"""`FSDPTrainer`: a ``transformers`` causal LM sharded over the data-parallel ranks (FSDP2)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from dynsched_core.trainer import TrainBatch, TrainMetrics
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.experimental import implicit_replication

from dynsched_ray.trainers.base import TrainerOptions, hf_model_folder
from dynsched_ray.trainers.fsdp.sharded import (
    ShardedOffloader,
    gather_full,
    gather_optimizer_state,
    shard_optimizer_state,
)
from dynsched_ray.trainers.torch.trainer import TorchTrainer

__all__ = ["FSDPTrainer", "ensure_process_group", "passes_needed"]

logger = logging.getLogger(__name__)


def ensure_process_group(device: torch.device) -> tuple[int, int]:
    """``(rank, world size)`` of the default group, creating a one-rank group if none.

    ``fully_shard`` needs a process group; a lone trainer gets an in-memory one (gloo on
    CPU, NCCL on CUDA), so a world of one runs the same sharded code path.
    """
    if not dist.is_initialized():
        backend = "gloo" if device.type == "cpu" else "cpu:gloo,cuda:nccl"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        logger.info("FSDPTrainer: started a one-rank %s process group", backend)
    return dist.get_rank(), dist.get_world_size()


def passes_needed(groups: int, world: int, mini_batch: int | None) -> int:
    """Forward/backward passes of the busiest rank in one `train_step`.

    Rank ``r`` takes every ``world``-th of ``groups`` prompt groups starting at ``r`` and
    passes ``mini_batch`` of them at a time (None: all at once), so rank 0 is the busiest.
    """
    mine = len(range(0, groups, world))
    k = mini_batch or max(mine, 1)
    return math.ceil(mine / k)


def _shard(model: torch.nn.Module, device: torch.device, world: int) -> None:
    """``fully_shard`` every transformer block, then the root; gradients summed over ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(device.type, (world,))
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # the base trainer's loss is normalised by the whole batch's tokens: sum, not
            # mean; a plain SUM (gloo has no pre-multiplied sum)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


class FSDPTrainer(TorchTrainer):
    """Implements the core `Trainer` over a ``transformers`` causal LM sharded with FSDP2.

    Every rank of the default process group (the one `TrainerActor` joins; a one-rank
    group is made when there is none) holds one shard of each parameter, gradient and
    AdamW state. A `train_step` follows the base trainer's data-parallel split (rank
    ``r`` takes every ``world``-th prompt group, the loss is normalised by the whole
    batch's tokens); FSDP reduce-scatters the summed gradients, so the update equals the
    unsharded trainer's on the whole batch. The model, its forward pass and its Hugging
    Face names are `TorchTrainer`'s; what differs is where the tensors live.

    Collectives: `train_step`, `export_weights`, `state_dict` and `logits` gather shards,
    so every rank must call them together (each gets the whole result). The checkpoint
    holds whole tensors, like `TorchTrainer`'s, and does not depend on the world size.

    Args:
        model: Folder of a Hugging Face causal LM (``config.json`` + weights).
        options: Optimizer and step settings.
    """

    collective_export = True
    rebuild_on_resize = True  # the shards live on the old group's mesh

    def __init__(self, model: str | Path, options: TrainerOptions | None = None) -> None:
        options = options if options is not None else TrainerOptions()
        hf_model_folder(model, "FSDPTrainer")  # before a process group is made for it
        self.rank, self.world_size = ensure_process_group(options.resolve_device())
        super().__init__(model, options)
        _shard(self.model, self.device, self.world_size)
        # fully_shard replaced the parameters (DTensors now); the optimizer has no state yet
        self.optimizer.param_groups[0]["params"] = self._params()
        self.optimizer.register_state_dict_post_hook(gather_optimizer_state)
        self.optimizer.register_load_state_dict_post_hook(shard_optimizer_state)
        self._passes = (0, 0)  # (forward/backward passes this step needs, done)
        self._offloader = ShardedOffloader(self.model, self._params(), self.optimizer, self.device)
        logger.info("FSDPTrainer: rank %d of %d", self.rank, self.world_size)

    # ------------------------------------------------------------------ sharded overrides
    def _current_named(self) -> dict[str, torch.Tensor]:
        """Whole parameters gathered from the shards (a collective; works while offloaded)."""
        return {n: gather_full(p) for n, p in self._named_params()}

    def _load_named(self, named: Mapping[str, torch.Tensor]) -> None:
        # whole tensors in, each rank copies its shard (no communication)
        with implicit_replication():
            super()._load_named(named)

    def _all_reduce_grads(self) -> None:
        """Nothing to do: FSDP reduce-scattered the gradients in the backward passes."""

    def train_step(self, batch: TrainBatch) -> TrainMetrics:
        """One RL update (see `RLTrainerBase.train_step`); every rank must call it."""
        if isinstance(batch, TrainBatch):
            self._passes = (
                passes_needed(len(batch.groups), self.world_size, self.options.ppo_mini_batch_size),
                0,
            )
        return super().train_step(batch)

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()
        self._passes = (self._passes[0], self._passes[1] + 1)

    def _idle_pass(self) -> None:
        """A forward and backward that changes no gradient (a pad token, zero loss).

        Each pass all-gathers the shards and reduce-scatters the gradients, so a rank with
        fewer prompt groups runs these until it has made as many passes as rank 0.
        """
        ids = torch.full((1, 1), self.pad_token_id, dtype=torch.long, device=self.device)
        (self._logits(ids).sum() * 0.0).backward()

    def _clip_and_step(self) -> float:
        for _ in range(self._passes[0] - self._passes[1]):
            self._idle_pass()
        self._passes = (0, 0)
        norm = torch.nn.utils.clip_grad_norm_(self._params(), self.options.max_grad_norm)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        self.optimizer.step()
        return float(norm)
