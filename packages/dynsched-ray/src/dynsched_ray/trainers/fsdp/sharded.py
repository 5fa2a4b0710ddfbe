"""What a trainer with sharded (DTensor) parameters needs beyond `RLTrainerBase`.

FSDP2 (``torch.distributed.fsdp.fully_shard``) turns every parameter into a `DTensor`
whose local part is one rank's shard. The base trainer's export, checkpoint and offload
paths read ``p.data`` as the whole parameter; here are their sharded counterparts:

- `gather_full`: the whole tensor of a shard (a collective: every rank calls it);
- `shard_like`: this rank's shard of a whole tensor, placed like a parameter (no
  communication: every rank holds the whole tensor);
- `gather_optimizer_state` / `shard_optimizer_state`: optimizer state hooks, so
  ``optimizer.state_dict()`` holds whole tensors (a checkpoint that does not depend on the
  world size, loadable with ``torch.load(..., weights_only=True)``) and
  ``optimizer.load_state_dict`` shards them back;
- `ShardedOffloader`: offload/reload of the local shards, parameters, gradients and
  optimizer state.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from dynsched_ray.trainers.base import TensorOffloader, tensor_bytes

__all__ = [
    "ShardedOffloader",
    "gather_full",
    "gather_optimizer_state",
    "local_part",
    "shard_like",
    "shard_optimizer_state",
]


def local_part(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t`` (``t`` itself when it is not a `DTensor`)."""
    return t.to_local() if isinstance(t, DTensor) else t


def gather_full(t: torch.Tensor) -> torch.Tensor:
    """A host copy of the whole tensor ``t`` (a collective when ``t`` is a `DTensor`).

    The local shard is moved to the mesh's device first when it is elsewhere (an
    offloaded trainer keeps its shards in host memory, NCCL gathers device tensors only).
    """
    if not isinstance(t, DTensor):
        return t.detach().to("cpu", copy=True)
    local = t.to_local().detach()
    mesh = t.device_mesh
    if local.device.type != mesh.device_type:
        local = local.to(mesh.device_type)
    whole = DTensor.from_local(
        local, mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride()
    )
    return whole.full_tensor().to("cpu", copy=True)


def shard_like(whole: torch.Tensor, like: DTensor) -> DTensor:
    """``whole`` split like ``like`` (its mesh and placements); this rank keeps its shard."""
    local = local_part(like)
    src = whole.detach().to(local.device, local.dtype)
    return distribute_tensor(src, like.device_mesh, like.placements, src_data_rank=None)


def gather_optimizer_state(
    _optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
) -> dict[str, Any]:
    """``optimizer.state_dict`` post-hook: every `DTensor` in the state made whole.

    Builds new per-parameter dicts (the packed state shares them with the live state).
    """
    out = dict(state_dict)
    out["state"] = {
        index: {k: gather_full(v) if isinstance(v, DTensor) else v for k, v in entry.items()}
        for index, entry in state_dict["state"].items()
    }
    return out


def shard_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.load_state_dict`` post-hook: whole state tensors sharded like their parameter.

    A plain tensor of a `DTensor` parameter's shape becomes that parameter's shard;
    scalars (AdamW's ``step``) stay as they are.
    """
    for group in optimizer.param_groups:
        for p in group["params"]:
            entry = optimizer.state.get(p)
            if not isinstance(p, DTensor) or not entry:
                continue
            for key, value in entry.items():
                if (
                    torch.is_tensor(value)
                    and not isinstance(value, DTensor)
                    and value.shape == p.shape
                ):
                    entry[key] = shard_like(value, p)


def _device_state(
    optimizer: torch.optim.Optimizer, device: torch.device
) -> Iterator[tuple[dict[str, Any], str]]:
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and local_part(value).device.type == device.type:
                yield state, key


class ShardedOffloader(TensorOffloader):
    """Offload/reload of a sharded module's local shards, gradients and optimizer state.

    On CUDA the module moves with ``module.to`` (FSDP2 re-registers its shards, and the
    parameters keep their identity, so the optimizer still refers to them) and the
    optimizer's device tensors move one by one. On CPU the "device" is host memory:
    nothing moves, and the memory report only moves the bytes from the device column to
    the host one (what the base offloader's copies stand for).

    Args:
        module: The sharded module (``fully_shard`` applied).
        params: Its parameters.
        optimizer: Their optimizer.
        device: The trainer's device.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        params: Sequence[torch.nn.Parameter],
        optimizer: torch.optim.Optimizer,
        device: torch.device,
    ) -> None:
        super().__init__(params, optimizer, device)
        self.module = module
        self._moved_keys: list[tuple[dict[str, Any], str]] = []

    def _locals(self) -> list[torch.Tensor]:
        out = [local_part(p) for p in self.params]
        out += [local_part(p.grad) for p in self.params if p.grad is not None]
        for state in self.optimizer.state.values():
            out += [local_part(v) for v in state.values() if torch.is_tensor(v)]
        return out

    def memory(self) -> tuple[int, int]:
        """``(device bytes, host bytes)`` of this rank's shards and state."""
        tensors = self._locals()
        total = sum(tensor_bytes(t) for t in tensors)
        if self.device.type == "cpu":
            return (0, total) if self.offloaded else (total, 0)
        dev = sum(tensor_bytes(t) for t in tensors if t.device.type == self.device.type)
        return dev, total - dev

    def _offload(self) -> int:
        """Shards, gradients and optimizer state to host memory; the bytes moved."""
        moved = self.memory()[0]
        if self.device.type != "cpu":
            self._moved_keys = list(_device_state(self.optimizer, self.device))
            self.module.to("cpu")
            for state, key in self._moved_keys:
                state[key] = state[key].to("cpu")
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        return moved

    def _reload(self) -> int:
        """Everything back to the device; the bytes moved."""
        moved = self.memory()[1]
        if self.device.type != "cpu":
            self.module.to(self.device)
            for state, key in self._moved_keys:
                state[key] = state[key].to(self.device)
            self._moved_keys = []
            torch.cuda.synchronize(self.device)
        return moved
