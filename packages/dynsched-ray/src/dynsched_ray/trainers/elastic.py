"""Elastic data parallelism: re-form a trainer's process group and hand its state over.

A data-parallel trainer resized at a sync boundary goes through three steps on its ranks
(`RayTrainerGroup.resize` drives them across the worker actors):

1. rank 0 keeps a host `snapshot` of the trainer's checkpoint (model, optimizer state,
   version; a sharded trainer gathers it on the old group, every old rank taking part);
2. every rank `leave_process_group`; ranks that stay `join_process_group` with their
   new rank and the new world size, new ranks join for the first time;
3. `broadcast_state` sends rank 0's snapshot to every rank of the new group (one flat
   broadcast per dtype, exact bytes), and each rank that needs it loads it: a new rank,
   every rank of a trainer that is rebuilt on the new group (`rebuild_on_resize`: a
   sharded trainer re-shards its parameters and optimizer state, Megatron re-forms its
   ``parallel_state``), and the old ranks other than 0 (they hold the same state already;
   loading rank 0's makes them equal bit for bit).

The global batch is kept by the trainers' step itself: rank ``r`` of ``w`` takes every
``w``-th prompt group of the whole batch and the loss is normalised by the whole batch's
tokens, so the summed gradients, and the update, do not depend on ``w`` beyond the order
of floating-point sums.

torch is imported by the functions that need it, inside the worker processes.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

__all__ = [
    "TrainerResizeError",
    "broadcast_state",
    "join_process_group",
    "leave_process_group",
    "needs_rebuild",
]


class TrainerResizeError(RuntimeError):
    """A data-parallel resize that cannot run now (e.g. outside a sync boundary)."""


def join_process_group(
    rank: int, world_size: int, address: tuple[str, int] | None, timeout_s: float
) -> None:
    """Join the default process group as ``rank`` of ``world_size`` (gloo on CPU, NCCL on CUDA).

    A world of one joins nothing (the trainers run without a group, or make their own
    one-rank group). Rank 0 hosts the rendezvous at ``address``.

    Raises:
        ValueError: ``world_size > 1`` without an address, or a rank outside the world.
        RuntimeError: this process is already in a default group.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size - 1}], got {rank}")
    if world_size == 1:
        return
    if address is None:
        raise ValueError("joining a process group of world_size > 1 needs the rank-0 address")
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError(
            "this process is already in a process group: leave_process_group() first"
        )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://{address[0]}:{address[1]}",
        rank=rank,
        world_size=world_size,
        # a collective whose peer never comes fails instead of hanging
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def leave_process_group(trainer: Any = None) -> None:
    """Leave the default process group (and every group made from it); idempotent.

    ``trainer``'s ``leave_group`` hook runs first when it has one (Megatron drops its
    ``parallel_state`` groups there).
    """
    hook = getattr(trainer, "leave_group", None)
    if hook is not None:
        hook()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def needs_rebuild(trainer: Any) -> bool:
    """Whether ``trainer`` must be built again after its process group changed size."""
    return bool(getattr(trainer, "rebuild_on_resize", False))


def _split(tree: Any, tensors: list[Any]) -> Any:
    """``tree`` with each tensor replaced by ``("__tensor__", index, shape, dtype)``."""
    import torch

    if torch.is_tensor(tree):
        tensors.append(tree.detach().to("cpu").contiguous())
        return ("__tensor__", len(tensors) - 1, tuple(tree.shape), tree.dtype)
    if isinstance(tree, Mapping):
        return {k: _split(v, tensors) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_split(v, tensors) for v in tree)
    return tree


def _join(tree: Any, tensors: list[Any]) -> Any:
    """Inverse of `_split`."""
    if isinstance(tree, tuple) and len(tree) == 4 and tree[0] == "__tensor__":
        return tensors[tree[1]]
    if isinstance(tree, Mapping):
        return {k: _join(v, tensors) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_join(v, tensors) for v in tree)
    return tree


def _specs(tree: Any, out: list[tuple[int, tuple[int, ...], Any]]) -> None:
    if isinstance(tree, tuple) and len(tree) == 4 and tree[0] == "__tensor__":
        out.append((tree[1], tree[2], tree[3]))
    elif isinstance(tree, Mapping):
        for v in tree.values():
            _specs(v, out)
    elif isinstance(tree, list | tuple):
        for v in tree:
            _specs(v, out)


def broadcast_state(state: Mapping[str, Any] | None, *, src: int = 0) -> dict[str, Any]:
    """Rank ``src``'s ``state`` (a tree of dicts, lists and tensors) on every rank.

    A collective of the default group: rank ``src`` passes its state, the others pass
    None. The tree's layout travels as one pickled object; the tensors travel as one flat
    buffer per dtype (bytes exact), on CUDA when the group is NCCL. Without a group (a
    world of one) the state is returned as it is.

    Raises:
        ValueError: rank ``src`` passed no state.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        if state is None:
            raise ValueError("broadcast_state: the source rank needs a state")
        return dict(state)
    rank = dist.get_rank()
    tensors: list[Any] = []
    layout: list[Any] = [None]
    if rank == src:
        if state is None:
            raise ValueError(f"broadcast_state: rank {src} (the source) passed no state")
        layout[0] = _split(dict(state), tensors)
    dist.broadcast_object_list(layout, src=src)
    specs: list[tuple[int, tuple[int, ...], Any]] = []
    _specs(layout[0], specs)
    device = torch.device("cuda", torch.cuda.current_device()) if _nccl() else torch.device("cpu")
    out: list[Any] = [None] * len(specs)
    for dtype in sorted({s[2] for s in specs}, key=str):
        mine = [s for s in specs if s[2] == dtype]
        sizes = [int(torch.Size(s[1]).numel()) for s in mine]
        if rank == src:
            flat = torch.cat([tensors[s[0]].reshape(-1) for s in mine]).to(device)
        else:
            flat = torch.empty(sum(sizes), dtype=dtype, device=device)
        dist.broadcast(flat, src=src)
        flat = flat.to("cpu")
        for (index, shape, _), part in zip(mine, flat.split(sizes), strict=True):
            out[index] = part.view(shape).clone()
    return dict(_join(layout[0], out))


def _nccl() -> bool:
    import torch.distributed as dist

    return bool(dist.get_backend() == "nccl")
