"""The vLLM worker extension that loads trainer weights inside the engine.

vLLM mixes the class named by ``worker_extension_cls`` into its worker class, in the
engine process, so its methods run next to the model runner and are called through
``AsyncLLM.collective_rpc("<method>", args=...)``. `VLLMReplica` names
``dynsched_ray.engines.vllm.worker.WeightSyncExtension``.

The weights arrive in Hugging Face parameter names (``model.layers.0.self_attn.q_proj.weight``,
``lm_head.weight``, ...), as one of:

- ``bytes``: a safetensors file's content (``safetensors.torch.save(state_dict)``);
- ``str``: the path of a ``.safetensors`` file, of a ``torch.save`` file (``.pt`` /
  ``.bin``), or of a folder holding ``*.safetensors`` files (a Hugging Face checkpoint).

They are applied with the model runner's in-place ``reload_weights`` (the model's own
``load_weights``, the loader vLLM uses at start-up, which maps HF names onto vLLM's fused
parameters and casts to the engine's dtype). Nothing here is imported by ``import dynsched_ray``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["WeightSyncExtension", "read_weights"]


def read_weights(payload: Any) -> dict[str, Any]:
    """Read a weights payload (bytes or path, see the module docstring) into tensors.

    Raises:
        ValueError: the payload is neither bytes nor a readable path, or holds no tensor.
    """
    import torch
    from safetensors.torch import load, load_file

    if isinstance(payload, bytes | bytearray | memoryview):
        tensors: dict[str, Any] = dict(load(bytes(payload)))
    elif isinstance(payload, str | Path):
        path = Path(payload)
        if path.is_dir():
            files = sorted(path.glob("*.safetensors"))
            if not files:
                raise ValueError(f"weights folder {path} holds no *.safetensors file")
            tensors = {}
            for f in files:
                tensors.update(load_file(str(f), device="cpu"))
        elif path.is_file() and path.suffix == ".safetensors":
            tensors = dict(load_file(str(path), device="cpu"))
        elif path.is_file():
            loaded = torch.load(str(path), map_location="cpu", weights_only=True)
            if not isinstance(loaded, dict):
                raise ValueError(f"weights file {path} does not hold a state dict")
            tensors = dict(loaded)
        else:
            raise ValueError(f"weights path {path} does not exist")
    else:
        raise ValueError(
            "weights must be bytes (safetensors) or a path (file or folder), got "
            f"{type(payload).__name__}"
        )
    if not tensors:
        raise ValueError("the weights payload holds no tensor")
    return tensors


class WeightSyncExtension:
    """Methods mixed into vLLM's worker (``self`` is the worker)."""

    model_runner: Any
    reload_weights: Any

    def dynsched_load_weights(self, payload: Any) -> dict[str, int]:
        """Load ``payload`` (bytes or path) into the running model, in place.

        Uses the model runner's in-place reload (the model's own ``load_weights`` between
        vLLM's layer-wise reload hooks). A payload may cover only some parameters; the
        others keep their values (vLLM logs which).

        Returns:
            ``{"tensors": n, "bytes": total}`` of what was loaded.
        """
        tensors = read_weights(payload)
        self.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)
        total = sum(int(t.numel()) * int(t.element_size()) for t in tensors.values())
        return {"tensors": len(tensors), "bytes": total}

    def dynsched_weight_digest(self) -> str:
        """A digest of the model's parameters (tests: did an update change anything?)."""
        import hashlib

        digest = hashlib.sha256()
        for name, param in sorted(self.model_runner.model.named_parameters()):
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().numpy().tobytes())
        return digest.hexdigest()
