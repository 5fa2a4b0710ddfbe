"""The parameter server of ``ps.py``: a module of its own, so that RPC finds ``fetch`` and
``push`` by name in every worker (the job script itself runs as ``__main__``)."""

from __future__ import annotations

import threading
from typing import Any

import torch

_SERVER: ParameterServer | None = None


class ParameterServer:
    """The model and optimizer, updated by every worker's pushed gradients."""

    def __init__(self, dim: int, lr: float, state: dict[str, Any] | None) -> None:
        self.weight = torch.zeros(dim, 1)
        self.opt = torch.optim.SGD([self.weight], lr=lr)
        self.lock = threading.Lock()
        if state is not None:
            self.weight.data.copy_(state["weight"])
            self.opt.load_state_dict(state["opt"])

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {"weight": self.weight.detach().clone(), "opt": self.opt.state_dict()}


def fetch() -> torch.Tensor:
    """The server's parameters (runs on rank 0)."""
    assert _SERVER is not None
    with _SERVER.lock:
        return _SERVER.weight.detach().clone()


def push(grad: torch.Tensor) -> None:
    """Apply one worker's gradient (runs on rank 0)."""
    assert _SERVER is not None
    with _SERVER.lock:
        _SERVER.weight.grad = grad
        _SERVER.opt.step()


def start(dim: int, lr: float, state: dict[str, Any] | None) -> ParameterServer:
    """Host the server in this process (rank 0)."""
    global _SERVER
    _SERVER = ParameterServer(dim, lr, state)
    return _SERVER
