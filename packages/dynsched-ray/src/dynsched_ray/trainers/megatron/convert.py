"""Megatron-core GPT <-> Hugging Face Llama parameter layouts.

Megatron's GPT (local layer specs) fuses two pairs of Llama projections:

- ``self_attention.linear_qkv.weight`` holds q, k and v **interleaved by query group**:
  viewed as ``[num_kv_heads, q_per_group + 2, head_dim, hidden]``, group ``g`` holds its
  ``q_per_group`` query heads (heads ``g * q_per_group ...``), then its key head, then its
  value head. Hugging Face keeps ``q_proj`` ``[num_heads * head_dim, hidden]``,
  ``k_proj`` and ``v_proj`` ``[num_kv_heads * head_dim, hidden]``.
- ``mlp.linear_fc1.weight`` is ``[gate; up]`` stacked on the output dimension (Megatron's
  gated linear unit applies the activation to the first half), Hugging Face keeps
  ``gate_proj`` and ``up_proj``.

The other parameters map one to one by name. Both directions are exact permutations of
the same numbers (a round trip is bit-identical). Only torch is needed here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

__all__ = ["LlamaShape", "hf_llama_to_megatron", "megatron_to_hf_llama"]


@attrs.frozen(kw_only=True)
class LlamaShape:
    """The shapes of a Llama-architecture model (read from a Hugging Face ``config.json``).

    Attributes:
        num_layers: Transformer blocks.
        hidden_size: Model width.
        num_heads: Query heads.
        num_kv_heads: Key/value heads (query groups).
        head_dim: Dimension of one head.
        intermediate_size: MLP width.
        vocab_size: Vocabulary size.
        max_position_embeddings: Longest sequence.
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: Rotary base.
    """

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    def __attrs_post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"LlamaShape.num_kv_heads ({self.num_kv_heads}) must divide num_heads "
                f"({self.num_heads})"
            )

    @property
    def q_per_group(self) -> int:
        """Query heads per key/value head."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | Path) -> LlamaShape:
        """From a ``config.json`` mapping, file or model folder.

        Raises:
            ValueError: not a Llama model, or a feature this converter does not handle
                (biases, tied embeddings, a rope scaling type, another activation).
        """
        if not isinstance(config, Mapping):
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            loaded: Mapping[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            config = loaded
        cfg = dict(config)
        if cfg.get("model_type") not in ("llama", None):
            raise ValueError(f"expected a Llama config, got model_type={cfg.get('model_type')!r}")
        unsupported = {
            "attention_bias": bool(cfg.get("attention_bias", False)),
            "mlp_bias": bool(cfg.get("mlp_bias", False)),
            "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
            "hidden_act != silu": cfg.get("hidden_act", "silu") != "silu",
        }
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        unsupported[f"rope_type={rope_type}"] = rope_type not in ("default", None)
        bad = [k for k, on in unsupported.items() if on]
        if bad:
            raise ValueError(f"the Megatron <-> Llama converter does not handle: {bad}")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return cls(
            num_layers=int(cfg["num_hidden_layers"]),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        )


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_SIMPLE_LAYER = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_SIMPLE_TOP = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}


def _strip(name: str) -> str:
    while name.startswith("module."):  # Megatron's DDP / Float16Module wrappers
        name = name[len("module.") :]
    return name


def megatron_to_hf_llama(
    named: Mapping[str, torch.Tensor], shape: LlamaShape
) -> dict[str, torch.Tensor]:
    """Megatron GPT parameters -> Hugging Face Llama state dict.

    Args:
        named: Megatron parameter name -> tensor (``module.`` prefixes are ignored;
            ``_extra_state`` entries are skipped).
        shape: The model's shapes.

    Raises:
        ValueError: an unknown parameter name or a shape that does not fit ``shape``.
    """
    out: dict[str, torch.Tensor] = {}
    hd, ng, qpg, hidden = shape.head_dim, shape.num_kv_heads, shape.q_per_group, shape.hidden_size
    ffn = shape.intermediate_size
    for raw, t in named.items():
        name = _strip(raw)
        if name.endswith("_extra_state"):
            continue
        if name in _SIMPLE_TOP:
            out[_SIMPLE_TOP[name]] = t
            continue
        m = _LAYER.match(name)
        if m is None:
            raise ValueError(f"unknown Megatron parameter {raw!r}")
        layer, rest = int(m.group(1)), m.group(2)
        pre = f"model.layers.{layer}."
        if rest in _SIMPLE_LAYER:
            out[pre + _SIMPLE_LAYER[rest]] = t
        elif rest == "self_attention.linear_qkv.weight":
            want = (ng * (qpg + 2) * hd, hidden)
            if tuple(t.shape) != want:
                raise ValueError(f"{raw}: shape {tuple(t.shape)}, expected {want}")
            grouped = t.reshape(ng, qpg + 2, hd, hidden)
            out[pre + "self_attn.q_proj.weight"] = grouped[:, :qpg].reshape(ng * qpg * hd, hidden)
            out[pre + "self_attn.k_proj.weight"] = grouped[:, qpg].reshape(ng * hd, hidden)
            out[pre + "self_attn.v_proj.weight"] = grouped[:, qpg + 1].reshape(ng * hd, hidden)
        elif rest == "mlp.linear_fc1.weight":
            if tuple(t.shape) != (2 * ffn, hidden):
                raise ValueError(f"{raw}: shape {tuple(t.shape)}, expected {(2 * ffn, hidden)}")
            out[pre + "mlp.gate_proj.weight"] = t[:ffn]
            out[pre + "mlp.up_proj.weight"] = t[ffn:]
        else:
            raise ValueError(f"unknown Megatron parameter {raw!r}")
    return out


def hf_llama_to_megatron(
    hf: Mapping[str, torch.Tensor], shape: LlamaShape
) -> dict[str, torch.Tensor]:
    """Hugging Face Llama state dict -> Megatron GPT parameter names and layout.

    Raises:
        ValueError: an unknown or missing Llama parameter.
    """
    top = {v: k for k, v in _SIMPLE_TOP.items()}
    layer_map = {v: k for k, v in _SIMPLE_LAYER.items()}
    hd, ng, qpg, hidden = shape.head_dim, shape.num_kv_heads, shape.q_per_group, shape.hidden_size
    out: dict[str, torch.Tensor] = {}
    pending: dict[int, dict[str, torch.Tensor]] = {}
    pat = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
    for name, t in hf.items():
        if name in top:
            out[top[name]] = t
            continue
        m = pat.match(name)
        if m is None:
            if name.endswith("rotary_emb.inv_freq"):
                continue
            raise ValueError(f"unknown Llama parameter {name!r}")
        layer, rest = int(m.group(1)), m.group(2)
        pre = f"decoder.layers.{layer}."
        if rest in layer_map:
            out[pre + layer_map[rest]] = t
        elif rest in (
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
        ):
            pending.setdefault(layer, {})[rest] = t
        else:
            raise ValueError(f"unknown Llama parameter {name!r}")
    for layer, parts in sorted(pending.items()):
        pre = f"decoder.layers.{layer}."
        try:
            q = parts["self_attn.q_proj.weight"].reshape(ng, qpg, hd, hidden)
            k = parts["self_attn.k_proj.weight"].reshape(ng, 1, hd, hidden)
            v = parts["self_attn.v_proj.weight"].reshape(ng, 1, hd, hidden)
            gate, up = parts["mlp.gate_proj.weight"], parts["mlp.up_proj.weight"]
        except KeyError as exc:
            raise ValueError(f"layer {layer}: missing Llama parameter {exc.args[0]!r}") from None
        out[pre + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(
            ng * (qpg + 2) * hd, hidden
        )
        out[pre + "mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
    return out
