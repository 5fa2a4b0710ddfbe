"""The locally built tiny model: deterministic, loadable by transformers, shape-checked."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from dynsched_ray import TinyModelSpec, build_tiny_model
from hypothesis import given
from hypothesis import strategies as st


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


def test_seeded_torch_is_reproducible_and_restores_the_global_generator() -> None:
    import torch
    from dynsched_ray.task.tiny_model import seeded_torch

    torch.manual_seed(123)
    outside = torch.random.get_rng_state()
    with seeded_torch(7):
        first = torch.rand(4)
    assert torch.equal(torch.random.get_rng_state(), outside)
    with seeded_torch(7):
        assert torch.equal(torch.rand(4), first)
    with pytest.raises(RuntimeError), seeded_torch(8):
        raise RuntimeError("the state comes back on errors too")
    assert torch.equal(torch.random.get_rng_state(), outside)


@given(
    wanted=st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    other=st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    key=st.sampled_from([None, "wanted"]),
)
def test_a_marker_matches_only_what_it_records(
    tmp_path_factory: pytest.TempPathFactory,
    wanted: dict[str, int],
    other: dict[str, int],
    key: str | None,
) -> None:
    import json

    from dynsched_ray.task.tiny_model import marker_matches

    marker = tmp_path_factory.mktemp("m") / "marker.json"
    assert not marker_matches(marker, wanted, key)  # missing
    marker.write_text(json.dumps(wanted if key is None else {key: wanted, "loss": 1.0}))
    assert marker_matches(marker, wanted, key)
    assert marker_matches(marker, other, key) == (other == wanted)
    marker.write_text("{not json")
    assert not marker_matches(marker, wanted, key)
    marker.write_text(json.dumps([1, 2]))
    assert not marker_matches(marker, wanted, key)  # a list is never a dict
