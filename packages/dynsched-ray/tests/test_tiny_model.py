"""The locally built tiny model: deterministic, loadable by transformers, shape-checked."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from dynsched_ray import TinyModelSpec, build_tiny_model


def _digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_build_is_deterministic_and_loads(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a = build_tiny_model(tmp_path / "a")
    again = build_tiny_model(tmp_path / "a2")
    other = build_tiny_model(tmp_path / "b", TinyModelSpec(seed=1))
    assert _digest(a) == _digest(again)
    assert _digest(a) != _digest(other)

    tok = AutoTokenizer.from_pretrained(a)
    text = "12+34=46"
    ids = tok(text).input_ids
    assert tok.decode(ids) == text
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)
    assert len(tok) == TinyModelSpec().vocab_size

    model = AutoModelForCausalLM.from_pretrained(a)
    assert model.config.head_dim == 32
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tok))
    assert torch.isfinite(logits).all()


def test_existing_build_is_reused_and_foreign_folder_refused(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "m")
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(folder) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite"):
        build_tiny_model(foreign)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"hidden_size": 64, "num_attention_heads": 4}, "head_dim"),
        ({"vocab_size": 100}, "vocab_size"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"hidden_size": 130}, "hidden_size"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ],
)
def test_bad_spec_names_the_field(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TinyModelSpec(**kwargs)


def test_importing_dynsched_ray_loads_no_torch() -> None:
    code = (
        "import sys, dynsched_ray; "
        "bad = [m for m in ('torch', 'vllm', 'transformers', 'megatron') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
