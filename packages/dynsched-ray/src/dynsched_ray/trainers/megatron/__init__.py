"""The Megatron-core trainer (extra ``megatron``) and the HF <-> Megatron weight conversion.

Imported on first use: importing this package loads neither torch nor Megatron.
"""

from __future__ import annotations

from dynsched_ray._lazy import lazy_getattr
from dynsched_ray.plugins import LazyFactory, TrainerPlugin

__all__ = [
    "TRAINER",
    "LlamaShape",
    "MegatronTrainer",
    "hf_llama_to_megatron",
    "megatron_to_hf_llama",
]

TRAINER = TrainerPlugin(
    factory=LazyFactory("dynsched_ray.trainers.megatron.trainer:MegatronTrainer"),
    description="Megatron-core GPTModel (weights converted from and to HF Llama)",
)
"""The entry point ``megatron`` of ``dynsched.trainers``."""

__getattr__ = lazy_getattr(
    __name__,
    {
        "MegatronTrainer": f"{__name__}.trainer",
        "LlamaShape": f"{__name__}.convert",
        "hf_llama_to_megatron": f"{__name__}.convert",
        "megatron_to_hf_llama": f"{__name__}.convert",
    },
)
