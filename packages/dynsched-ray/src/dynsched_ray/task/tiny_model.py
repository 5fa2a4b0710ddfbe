"""A tiny Llama-architecture causal LM and byte-level tokenizer, built locally.

No model hub is reachable from CI, so the real engines (vLLM) and trainers (PyTorch,
Megatron-core) are exercised on a model built here: a byte-level BPE tokenizer trained in
code on a small task corpus, and a randomly initialised Llama-architecture model saved in
Hugging Face format (``config.json``, ``model.safetensors``, ``tokenizer.json``).

The defaults keep ``head_dim`` at 32, the smallest the CPU attention kernels of vLLM
accept. Building is deterministic: the same arguments give byte-identical weight files
and the same tokenizer, so two processes that build "model A" agree on it.

torch, transformers and tokenizers are imported inside the functions: importing
``dynsched_ray`` never loads them.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

logger = logging.getLogger(__name__)

__all__ = [
    "TinyModelSpec",
    "build_tiny_model",
    "marker_matches",
    "seeded_torch",
    "tiny_model_corpus",
]

_MARKER = "dynsched-tiny-model.json"
_SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2
_MIN_HEAD_DIM = 32


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"TinyModelSpec.{attribute.name} must be a positive int, got {value!r}")


@attrs.frozen
class TinyModelSpec:
    """Shape of the tiny model (Llama architecture) and its tokenizer.

    Attributes:
        vocab_size: tokenizer vocabulary size (the BPE trainer stops there; >= 259:
            256 byte symbols and 3 special tokens).
        hidden_size: model width.
        intermediate_size: MLP width.
        num_hidden_layers: transformer blocks.
        num_attention_heads: query heads; ``hidden_size / num_attention_heads`` is the
            head dimension and must be >= 32 (vLLM's CPU attention kernels need it).
        num_key_value_heads: key/value heads (grouped-query attention); divides the
            query heads.
        max_position_embeddings: longest sequence (prompt + response).
        seed: seed of the random weights.
    """

    vocab_size: int = attrs.field(default=512, validator=_positive)
    hidden_size: int = attrs.field(default=128, validator=_positive)
    intermediate_size: int = attrs.field(default=256, validator=_positive)
    num_hidden_layers: int = attrs.field(default=2, validator=_positive)
    num_attention_heads: int = attrs.field(default=4, validator=_positive)
    num_key_value_heads: int = attrs.field(default=2, validator=_positive)
    max_position_embeddings: int = attrs.field(default=512, validator=_positive)
    seed: int = attrs.field(default=0)

    def __attrs_post_init__(self) -> None:
        if self.vocab_size < 256 + len(_SPECIAL_TOKENS):
            raise ValueError(
                f"TinyModelSpec.vocab_size must be >= {256 + len(_SPECIAL_TOKENS)} "
                f"(256 byte symbols + special tokens), got {self.vocab_size}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                "TinyModelSpec.hidden_size must be a multiple of num_attention_heads, got "
                f"{self.hidden_size} and {self.num_attention_heads}"
            )
        if self.head_dim < _MIN_HEAD_DIM:
            raise ValueError(
                f"TinyModelSpec head_dim (hidden_size / num_attention_heads) must be >= "
                f"{_MIN_HEAD_DIM} for vLLM's CPU attention kernels, got {self.head_dim}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                "TinyModelSpec.num_key_value_heads must divide num_attention_heads, got "
                f"{self.num_key_value_heads} and {self.num_attention_heads}"
            )

    @property
    def head_dim(self) -> int:
        """Dimension of one attention head."""
        return self.hidden_size // self.num_attention_heads


def tiny_model_corpus() -> list[str]:
    """The text the tokenizer is trained on: small arithmetic and string tasks.

    Deterministic (no randomness): sums and differences of two-digit numbers, and short
    reversal prompts over a fixed word list.
    """
    lines = [f"{a}+{b}={a + b}" for a in range(100) for b in range(0, 100, 3)]
    lines += [f"{a}-{b}={a - b}" for a in range(100) for b in range(0, 100, 7)]
    words = ["alpha", "bravo", "charlie", "delta", "echo", "gamma", "kappa", "sigma"]
    lines += [f"reverse {w}: {w[::-1]}" for w in words]
    lines += ["Question: what is", "Answer:", "The answer is"]
    return lines


def _train_tokenizer(spec: TinyModelSpec, corpus: Iterable[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer)
    return tok


def build_tiny_model(
    folder: str | Path,
    spec: TinyModelSpec | None = None,
    *,
    corpus: Sequence[str] | None = None,
    overwrite: bool = False,
) -> Path:
    """Build the tiny model and tokenizer into ``folder`` (Hugging Face format).

    An existing folder built with the same spec and corpus is reused as is (the build is
    deterministic, so rebuilding would give the same files); a folder holding something
    else is refused unless ``overwrite``.

    Args:
        folder: where to write ``config.json``, ``model.safetensors``, the tokenizer files
            and a marker describing the build.
        spec: model and tokenizer shape (default: :class:`TinyModelSpec()`).
        corpus: tokenizer training text (default: :func:`tiny_model_corpus`).
        overwrite: rebuild even if the folder holds another build.

    Returns:
        The folder, ready for ``transformers.AutoModelForCausalLM.from_pretrained`` and
        ``vllm`` (``model=str(folder)``).

    Raises:
        FileExistsError: ``folder`` holds files that are not this build and ``overwrite``
            is false.
    """
    spec = spec or TinyModelSpec()
    text = list(corpus) if corpus is not None else tiny_model_corpus()
    path = Path(folder)
    wanted = {"spec": attrs.asdict(spec), "corpus_lines": len(text), "corpus_hash": _hash(text)}
    marker = path / _MARKER
    if not overwrite and marker_matches(marker, wanted):
        return path
    if path.exists() and any(path.iterdir()) and not marker.is_file() and not overwrite:
        raise FileExistsError(
            f"{path} is not empty and holds no tiny-model build; pass overwrite=True or "
            "choose an empty folder"
        )
    path.mkdir(parents=True, exist_ok=True)
    tok = _train_tokenizer(spec, text)
    _save_tokenizer(tok, path)
    with seeded_torch(spec.seed):
        model = _random_llama(spec, tok.get_vocab_size())
    model.save_pretrained(str(path), safe_serialization=True)
    marker.write_text(json.dumps(wanted, indent=2, sort_keys=True))
    logger.info("built tiny model (%s) in %s", spec, path)
    return path


def marker_matches(marker: Path, wanted: Any, key: str | None = None) -> bool:
    """Whether the JSON ``marker`` file (its ``key`` entry, when given) equals ``wanted``.

    A missing or unreadable marker does not match.
    """
    if not marker.is_file():
        return False
    try:
        found = json.loads(marker.read_text())
        return bool((found if key is None else found[key]) == wanted)
    except (OSError, ValueError, KeyError, TypeError):
        return False


@contextlib.contextmanager
def seeded_torch(seed: int) -> Iterator[None]:
    """Seed torch's global generator for the block; its former state is restored after."""
    import torch

    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        yield
    finally:
        torch.random.set_rng_state(state)


def _save_tokenizer(tok: Any, path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(str(path))


def _random_llama(spec: TinyModelSpec, vocab_size: int) -> Any:
    """A randomly initialised float32 Llama of ``spec`` (from torch's global generator)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    )
    return LlamaForCausalLM(config).to(torch.float32)


def _hash(lines: Sequence[str]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode())
        digest.update(b"\n")
    return digest.hexdigest()
