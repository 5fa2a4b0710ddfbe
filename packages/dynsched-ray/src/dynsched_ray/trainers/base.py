"""What `TorchTrainer` and `MegatronTrainer` share: options, the RL step, offload, reports.

A subclass provides the model's forward pass (token ids -> logits), its parameters and
optimizer, and the conversion of its weights to Hugging Face Llama names; this module
runs the step (GRPO advantages over the whole batch, gradient accumulation over
mini-batches of ``ppo_mini_batch_size`` prompt groups, one optimizer update), moves
parameters, gradients and optimizer state between the device and host memory, and
accounts for the bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from dynsched_core.trainer import MemoryReport, OffloadReport, TrainBatch, TrainMetrics

from dynsched_ray.runtime.errors import TrainerOffloadedError
from dynsched_ray.runtime.model_files import hf_model_folder
from dynsched_ray.task.objective import (
    PolicyLossStats,
    RLObjective,
    batch_advantages,
    pack_responses,
    policy_loss,
    token_logprobs,
)

__all__ = [
    "Offloader",
    "RLTrainerBase",
    "TensorOffloader",
    "TrainerOffloadedError",
    "TrainerOptions",
    "hf_model_folder",
    "optimizer_bytes",
]

logger = logging.getLogger(__name__)

STATE_FORMAT = 1


def _num(lo: float, *, lo_open: bool = False) -> Any:
    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        ok = not isinstance(value, bool) and isinstance(value, int | float)
        if not ok or (value <= lo if lo_open else value < lo):
            op = ">" if lo_open else ">="
            raise ValueError(
                f"TrainerOptions.{attr.name} must be a number {op} {lo}, got {value!r}"
            )

    return check


def _betas(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not all(isinstance(b, int | float) and 0 <= b < 1 for b in value)
    ):
        raise ValueError(f"TrainerOptions.betas must be two numbers in [0, 1), got {value!r}")


def _mini(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"TrainerOptions.ppo_mini_batch_size must be None or an int >= 1, got {value!r}"
        )


@attrs.frozen(kw_only=True)
class TrainerOptions:
    """Optimizer and step settings shared by the trainers.

    Defaults follow verl's actor configuration (public configuration): AdamW with
    ``lr=1e-6``, ``weight_decay=0.01``, betas ``(0.9, 0.999)``, gradient clipping at 1.0.

    Attributes:
        lr: AdamW learning rate.
        betas: AdamW betas.
        adam_eps: AdamW epsilon.
        weight_decay: AdamW decoupled weight decay.
        max_grad_norm: Clip the global gradient norm to this (``inf``: no clipping; the
            norm is reported either way).
        ppo_mini_batch_size: Prompt groups forwarded and back-propagated at a time; their
            gradients accumulate into one optimizer update per `train_step` (None: the
            whole batch at once). Bounds activation memory; the update does not depend
            on it beyond float rounding.
        objective: The RL loss settings.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when available).
    """

    lr: float = attrs.field(default=1e-6, validator=_num(0.0, lo_open=True))
    betas: tuple[float, float] = attrs.field(default=(0.9, 0.999), validator=_betas)
    adam_eps: float = attrs.field(default=1e-8, validator=_num(0.0, lo_open=True))
    weight_decay: float = attrs.field(default=0.01, validator=_num(0.0))
    max_grad_norm: float = attrs.field(default=1.0, validator=_num(0.0, lo_open=True))
    ppo_mini_batch_size: int | None = attrs.field(default=None, validator=_mini)
    objective: RLObjective = attrs.field(factory=RLObjective)
    device: str = "cpu"

    def resolve_device(self) -> torch.device:
        """The torch device of ``device``."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            dev = torch.device(self.device)
        except RuntimeError as exc:
            raise ValueError(
                f"TrainerOptions.device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got "
                f"{self.device!r}"
            ) from exc
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"TrainerOptions.device is {self.device!r} but CUDA is not available")
        return dev

    def adamw(self, params: Any) -> torch.optim.AdamW:
        """The AdamW optimizer of ``params`` with these settings."""
        return torch.optim.AdamW(
            params, lr=self.lr, betas=self.betas, eps=self.adam_eps, weight_decay=self.weight_decay
        )


def tensor_bytes(t: torch.Tensor | None) -> int:
    """Bytes of ``t``'s elements (0 for None or a freed tensor)."""
    return 0 if t is None else t.numel() * t.element_size()


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of ``t`` (pinned when ``t`` is on CUDA, so the copies can overlap)."""
    if t.device.type == "cuda":
        host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
        host.copy_(t, non_blocking=True)
        return host
    return t.detach().clone()


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A device copy of a host tensor (a real copy on CPU too: it stands for the transfer)."""
    if device.type == "cuda":
        return t.to(device, non_blocking=True)
    return t.clone()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[tuple[dict[str, Any], str]]:
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value):
                yield state, key


def optimizer_bytes(
    optimizer: torch.optim.Optimizer, on_device: Callable[[torch.Tensor], bool]
) -> tuple[int, int]:
    """``(device bytes, host bytes)`` of ``optimizer``'s state tensors, placed by ``on_device``."""
    dev = host = 0
    for state, key in _state_tensors(optimizer):
        t = state[key]
        if on_device(t):
            dev += tensor_bytes(t)
        else:
            host += tensor_bytes(t)
    return dev, host


class Offloader:
    """What every trainer's offloader does: move its state to host memory and back.

    `offload` and `reload` each act once (a repeat moves nothing and returns 0) and keep
    ``offloaded``; a subclass moves the bytes (`_offload`, `_reload`) and accounts for
    them (`memory`).
    """

    offloaded: bool = False
    #: the parameters it manages (every subclass sets them)
    params: list[torch.nn.Parameter]

    def offload(self) -> int:
        """Move everything to host memory; return the bytes moved."""
        if self.offloaded:
            return 0
        moved = self._offload()
        self.offloaded = True
        return moved

    def reload(self) -> int:
        """Bring everything back to the device; return the bytes moved."""
        if not self.offloaded:
            return 0
        moved = self._reload()
        self.offloaded = False
        return moved

    def memory(self) -> tuple[int, int]:
        """``(device bytes, host bytes)`` of what the offloader manages."""
        raise NotImplementedError

    def param_host(self, index: int) -> torch.Tensor:
        """Host copy of parameter ``index`` (only while offloaded)."""
        raise NotImplementedError

    def _offload(self) -> int:
        raise NotImplementedError

    def _reload(self) -> int:
        raise NotImplementedError


class TensorOffloader(Offloader):
    """Moves parameters, their gradients and optimizer state to host memory and back.

    Parameters keep their identity (the optimizer refers to them): their ``.data`` is
    swapped for an empty tensor while offloaded. Copies are exact, so a reload restores
    bit for bit what was offloaded.

    Args:
        params: The trainer's parameters.
        optimizer: Its optimizer (state tensors move too).
        device: The trainer's device.
    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        optimizer: torch.optim.Optimizer,
        device: torch.device,
    ) -> None:
        self.params = list(params)
        self.optimizer = optimizer
        self.device = device
        self.offloaded = False
        self._param_host: list[torch.Tensor] = []
        self._grad_host: dict[int, torch.Tensor] = {}
        self._moved_state: list[tuple[dict[str, Any], str]] = []

    def param_host(self, index: int) -> torch.Tensor:
        """Host copy of parameter ``index`` (only while offloaded)."""
        return self._param_host[index]

    def memory(self) -> tuple[int, int]:
        """``(device bytes, host bytes)`` of what the offloader manages."""
        dev = sum(tensor_bytes(p.data) + tensor_bytes(p.grad) for p in self.params)
        host = sum(tensor_bytes(t) for t in self._param_host)
        host += sum(tensor_bytes(t) for t in self._grad_host.values())
        if self.device.type == "cpu":  # the "device" is the host here
            opt_dev, opt_host = optimizer_bytes(self.optimizer, lambda t: not self.offloaded)
        else:
            opt_dev, opt_host = optimizer_bytes(
                self.optimizer, lambda t: t.device.type == self.device.type
            )
        return dev + opt_dev, host + opt_host

    def _offload(self) -> int:
        moved = 0
        self._param_host = []
        for i, p in enumerate(self.params):
            host = _to_host(p.data)
            moved += tensor_bytes(host)
            self._param_host.append(host)
            if p.grad is not None:
                self._grad_host[i] = _to_host(p.grad)
                moved += tensor_bytes(p.grad)
        self._moved_state = []
        for state, key in _state_tensors(self.optimizer):
            t = state[key]
            # on CUDA only device tensors move (AdamW keeps its step counter on the host)
            if t.device == self.device or self.device.type == "cpu":
                state[key] = _to_host(t)
                moved += tensor_bytes(t)
                self._moved_state.append((state, key))
        _sync(self.device)
        for i, p in enumerate(self.params):
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            if i in self._grad_host:
                p.grad = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return moved

    def _reload(self) -> int:
        moved = 0
        for p, host in zip(self.params, self._param_host, strict=True):
            p.data = _to_device(host, self.device)
            moved += tensor_bytes(host)
        for i, host in self._grad_host.items():
            self.params[i].grad = _to_device(host, self.device)
            moved += tensor_bytes(host)
        for state, key in self._moved_state:
            t = state[key]
            state[key] = _to_device(t, self.device)
            moved += tensor_bytes(t)
        _sync(self.device)
        self._param_host = []
        self._grad_host = {}
        self._moved_state = []
        return moved


def _cpu_tree(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, Mapping):
        return {k: _cpu_tree(x) for k, x in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_cpu_tree(x) for x in value)
    return value


class RLTrainerBase:
    """Base of the trainers: the RL step, offload/reload, reports, export, checkpoints.

    Subclasses set ``self.options``, ``self.device``, ``self.optimizer`` and
    ``self.pad_token_id``, call `_init_offloader` with their parameters, and implement
    `_logits`, `_hf_weights` and the model part of the state dict.
    """

    options: TrainerOptions
    device: torch.device
    optimizer: torch.optim.Optimizer
    pad_token_id: int
    _offloader: Offloader
    _version: int = 0
    #: True when `export_weights` and `state_dict` are collectives (sharded parameters):
    #: the trainer group then calls them on every rank and keeps rank 0's answer.
    collective_export: bool = False
    #: True when the trainer is bound to the process group it was built in (sharded
    #: parameters, Megatron's ``parallel_state``): after an elastic resize every rank
    #: builds it again on the new group and loads rank 0's state
    #: (`dynsched_ray.trainers.elastic`). False: it reads the group at each step.
    rebuild_on_resize: bool = False

    # ------------------------------------------------------------------ subclass API
    def _params(self) -> list[torch.nn.Parameter]:
        raise NotImplementedError

    def _logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[B, L, V]`` logits of right-padded ``[B, L]`` token ids."""
        raise NotImplementedError

    def _hf_weights(self, named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Hugging Face Llama weights from the trainer's own named parameters."""
        raise NotImplementedError

    def _named_params(self) -> list[tuple[str, torch.nn.Parameter]]:
        raise NotImplementedError

    def _load_named(self, named: Mapping[str, torch.Tensor]) -> None:
        """Copy the trainer's own named parameters in (same names as `_named_params`)."""
        with torch.no_grad():
            own = dict(self._named_params())
            missing = set(own) - set(named)
            unexpected = set(named) - set(own)
            if missing or unexpected:
                raise ValueError(
                    f"model state does not match: missing {sorted(missing)[:5]}, "
                    f"unexpected {sorted(unexpected)[:5]}"
                )
            for name, p in own.items():
                src = named[name]
                if tuple(src.shape) != tuple(p.shape):
                    raise ValueError(
                        f"model state {name}: shape {tuple(src.shape)} != {tuple(p.shape)}"
                    )
                p.copy_(src.to(p.device, p.dtype))

    def _setup(self, model: str | Path, options: TrainerOptions | None, kind: str) -> Path:
        """Keep ``options`` (default: `TrainerOptions()`) and their device; return the
        model folder, checked by `hf_model_folder`."""
        self.options = options if options is not None else TrainerOptions()
        self.device = self.options.resolve_device()
        return hf_model_folder(model, type(self).__name__, kind)

    def _init_offloader(self) -> None:
        self._offloader = TensorOffloader(self._params(), self.optimizer, self.device)

    # ------------------------------------------------------------------ Trainer
    @property
    def version(self) -> int:
        """Optimizer updates applied (0 for the loaded weights)."""
        return self._version

    @property
    def is_offloaded(self) -> bool:
        """True between `offload` and `reload`."""
        return self._offloader.offloaded

    def _require_resident(self, what: str) -> None:
        if self.is_offloaded:
            raise TrainerOffloadedError(
                f"{type(self).__name__}.{what} needs the state on {self.device}: call reload() "
                "first (the trainer is offloaded)"
            )

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _clip_and_step(self) -> float:
        self._all_reduce_grads()
        norm = torch.nn.utils.clip_grad_norm_(self._params(), self.options.max_grad_norm)
        self.optimizer.step()
        return float(norm)

    # ------------------------------------------------------------------ data parallel
    def _dp(self) -> tuple[int, int]:
        """``(rank, world size)`` of the default process group ((0, 1) without one)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def _all_reduce_grads(self) -> None:
        """Sum the gradients over the data-parallel ranks (one flat all-reduce)."""
        _, world = self._dp()
        if world == 1:
            return
        import torch.distributed as dist

        params = self._params()
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n

    def _all_reduce_stats(self, stats: PolicyLossStats) -> PolicyLossStats:
        _, world = self._dp()
        if world == 1:
            return stats
        import torch.distributed as dist

        sums = torch.tensor(
            [stats.tokens, stats.loss_sum, stats.clipped, stats.ratio_sum, stats.kl_sum],
            dtype=torch.float64,
        )
        top = torch.tensor([stats.ratio_max], dtype=torch.float64)
        dist.all_reduce(sums)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        t, loss, clipped, ratio, kl = (float(x) for x in sums)
        return PolicyLossStats(t, loss, clipped, ratio, float(top[0]), kl)

    def _rank_groups(self, batch: TrainBatch) -> list[Sequence[int]]:
        """This rank's share of ``batch``: every ``world``-th prompt group (response
        indices), starting at its rank. Over the ranks of one step the shares cover the
        batch's groups exactly once, whatever the world size."""
        rank, world = self._dp()
        groups: list[Sequence[int]] = list(batch.groups.values())
        return groups[rank::world]

    def train_step(self, batch: TrainBatch) -> TrainMetrics:
        """One RL update: GRPO advantages, clipped ratio loss, one optimizer step.

        Under a data-parallel process group (world size > 1) each rank takes every
        ``world``-th prompt group of the (whole) batch, the loss stays normalised by the
        whole batch's tokens, and the gradients are summed over the ranks before the
        update, so every rank applies the same update.

        Raises:
            TrainerOffloadedError: the trainer is offloaded.
            TypeError: ``batch`` is not a `TrainBatch`.
        """
        if not isinstance(batch, TrainBatch):
            raise TypeError(f"train_step needs a TrainBatch, got {type(batch).__name__}")
        self._require_resident("train_step")
        obj = self.options.objective
        t0 = time.perf_counter()
        adv = batch_advantages(batch, obj)
        groups = self._rank_groups(batch)
        k = self.options.ppo_mini_batch_size or max(len(groups), 1)
        total = batch.num_response_tokens
        stats = PolicyLossStats(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        self._zero_grad()
        for start in range(0, len(groups), k):
            rows = [i for g in groups[start : start + k] for i in g]
            packed = pack_responses(
                [batch.responses[i] for i in rows], [adv[i] for i in rows], pad_id=self.pad_token_id
            ).to(self.device)
            logits = self._logits(packed.input_ids)
            logp = token_logprobs(logits, packed.input_ids)
            loss, part = policy_loss(
                logp,
                packed.rollout_logprobs,
                packed.advantages,
                packed.loss_mask,
                clip_ratio_low=obj.clip_ratio_low,
                clip_ratio_high=obj.clip_ratio_high,
                normalizer=float(max(total, 1)),
            )
            self._backward(loss)
            stats = stats + part
        grad_norm = self._clip_and_step()
        self._zero_grad()
        _sync(self.device)
        stats = self._all_reduce_stats(stats)
        self._version += 1
        n = max(stats.tokens, 1.0)
        return TrainMetrics(
            loss=stats.loss_sum / n,
            grad_norm=grad_norm,
            compute_s=time.perf_counter() - t0,
            num_tokens=total,
            num_responses=len(batch.responses),
            clip_fraction=stats.clipped / n,
            ratio_mean=stats.ratio_sum / n,
            ratio_max=stats.ratio_max,
            approx_kl=stats.kl_sum / n,
            staleness=batch.staleness(),
            version=self._version,
        )

    def memory(self) -> MemoryReport:
        """Bytes of parameters, gradients and optimizer state, on the device and the host."""
        dev, host = self._offloader.memory()
        alloc = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else None
        return MemoryReport(
            device=str(self.device), device_bytes=dev, host_bytes=host, allocator_bytes=alloc
        )

    def _move(self, direction: str) -> OffloadReport:
        before = self.memory()
        t0 = time.perf_counter()
        moved = self._offloader.offload() if direction == "offload" else self._offloader.reload()
        seconds = time.perf_counter() - t0
        after = self.memory()
        logger.debug("%s: %d bytes in %.4f s", direction, moved, seconds)
        return OffloadReport(
            direction=direction, before=before, after=after, moved_bytes=moved, seconds=seconds
        )

    def offload(self) -> OffloadReport:
        """Parameters, gradients and optimizer state to host memory (no-op if already)."""
        return self._move("offload")

    def reload(self) -> OffloadReport:
        """Everything back to the device (no-op if resident)."""
        return self._move("reload")

    def _current_named(self) -> dict[str, torch.Tensor]:
        """The trainer's own named parameter values (host copies while offloaded)."""
        named = self._named_params()
        if not self.is_offloaded:
            return {n: p.detach() for n, p in named}
        index = {id(p): i for i, p in enumerate(self._offloader.params)}
        return {n: self._offloader.param_host(index[id(p)]) for n, p in named}

    def export_weights(self, *, as_bytes: bool = False) -> tuple[int, Any]:
        """``(version, weights)`` in Hugging Face Llama names (CPU tensors or safetensors bytes).

        Works while offloaded (from the host copies).
        """
        weights = {
            k: t.detach().to("cpu").contiguous()
            for k, t in self._hf_weights(self._current_named()).items()
        }
        if as_bytes:
            from safetensors.torch import save

            return self._version, save(weights)
        return self._version, weights

    def state_dict(self) -> dict[str, Any]:
        """Model (trainer's own names), optimizer state and version, as CPU tensors.

        Works while offloaded.
        """
        return {
            "format": STATE_FORMAT,
            "trainer": type(self).__name__,
            "version": self._version,
            "model": {k: t.to("cpu", copy=True) for k, t in self._current_named().items()},
            "optimizer": _cpu_tree(self.optimizer.state_dict()),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a `state_dict` of the same trainer class.

        Raises:
            TrainerOffloadedError: the trainer is offloaded.
            ValueError: not a state dict of this trainer, or mismatched shapes.
        """
        self._require_resident("load_state_dict")
        if state.get("format") != STATE_FORMAT or state.get("trainer") != type(self).__name__:
            raise ValueError(
                f"not a {type(self).__name__} state dict (format {STATE_FORMAT}): got format "
                f"{state.get('format')!r} of {state.get('trainer')!r}"
            )
        self._load_named(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._version = int(state["version"])
