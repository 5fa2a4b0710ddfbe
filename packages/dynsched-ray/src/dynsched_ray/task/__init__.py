"""The RL task shipped with dynsched: two-number addition, its objective and a tiny model.

`addition` (`AdditionTask`, `warm_up`), `objective` (`RLObjective`, the policy loss both
built-in trainers use; needs torch), `tiny_model` (`build_tiny_model`, a small Llama for
tests and demos). torch and transformers are imported on first use only.
"""

from __future__ import annotations

from dynsched_ray._lazy import lazy_getattr
from dynsched_ray.task.addition import AdditionTask, TaskTokenizer, WarmUpOptions, warm_up
from dynsched_ray.task.tiny_model import TinyModelSpec, build_tiny_model

__all__ = [
    "AdditionTask",
    "RLObjective",
    "TaskTokenizer",
    "TinyModelSpec",
    "WarmUpOptions",
    "build_tiny_model",
    "warm_up",
]


__getattr__ = lazy_getattr(__name__, {"RLObjective": f"{__name__}.objective"})
