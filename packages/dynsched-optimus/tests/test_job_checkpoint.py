"""A job's checkpoints hold plain data only: written and read back with torch and without
it, and a file that would run code when loaded is refused with nothing of it run."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from dynsched_optimus.jobs import CheckpointError, load_checkpoint, save_checkpoint


@pytest.fixture
def without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import torch`` raises ImportError (as on a machine without torch)."""
    monkeypatch.setitem(sys.modules, "torch", None)


class _Marker:
    """Unpickling it would create the file ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def _payload(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "was-run"
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(pickle.dumps({"step": 3, "state": _Marker(str(marker))}))
    return bad, marker


def _plain() -> dict[str, Any]:
    return {
        "step": 7,
        "state": {
            "weights": np.arange(6, dtype=np.float32).reshape(2, 3),
            "lr": np.float64(0.25),
            "history": [1, 2.5, "x", None, True, (3, 4)],
            "seen": {1, 2},
            "blob": b"\x00\x01",
            "z": 1 + 2j,
        },
    }


def test_plain_data_round_trips_without_torch(tmp_path: Path, without_torch: None) -> None:
    path = str(tmp_path / "a.ckpt")
    save_checkpoint(_plain(), path)
    back = load_checkpoint(path)
    want = _plain()
    np.testing.assert_array_equal(back["state"]["weights"], want["state"]["weights"])
    assert back["state"]["weights"].dtype == np.float32
    assert back["state"]["lr"] == want["state"]["lr"]
    for key in ("history", "seen", "blob", "z"):
        assert back["state"][key] == want["state"][key]
    assert back["step"] == 7


def test_a_tensor_checkpoint_round_trips_with_torch(tmp_path: Path) -> None:
    path = str(tmp_path / "t.ckpt")
    state = {"step": 2, "state": {"w": torch.arange(4.0), "n": 3}}
    save_checkpoint(state, path)
    back = load_checkpoint(path)
    assert torch.equal(back["state"]["w"], state["state"]["w"])
    assert back["state"]["n"] == 3


def test_a_file_that_would_run_code_is_refused_without_torch(
    tmp_path: Path, without_torch: None
) -> None:
    bad, marker = _payload(tmp_path)
    with pytest.raises(CheckpointError, match=r"not plain data .*: it names (posix|os)\.mkdir"):
        load_checkpoint(str(bad))
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
def test_a_file_that_would_run_code_is_refused_with_torch(tmp_path: Path) -> None:
    bad, marker = _payload(tmp_path)
    with pytest.raises(CheckpointError, match="not a plain tensor checkpoint") as err:
        load_checkpoint(str(bad))
    assert str(bad) in str(err.value)
    assert not marker.exists()


def test_the_error_is_what_callers_of_the_old_reader_caught() -> None:
    assert issubclass(CheckpointError, pickle.UnpicklingError)
    assert issubclass(CheckpointError, ValueError)


def test_a_truncated_file_is_one_clear_error(tmp_path: Path, without_torch: None) -> None:
    path = tmp_path / "cut.ckpt"
    path.write_bytes(pickle.dumps({"step": 1, "state": list(range(100))})[:20])
    with pytest.raises(CheckpointError, match="cut.ckpt"):
        load_checkpoint(str(path))
