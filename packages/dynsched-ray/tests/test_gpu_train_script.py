"""The prepared GPU training check runs its CPU path (no GPU lent here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "gpu_train_check.py"


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_train_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_gpu_train_script_cpu_path(capsys: Any, tmp_path: Path) -> None:
    module = _module()
    assert module.main(["--device", "cuda"]) == 2  # no CUDA here: says so, runs nothing
    rc = module.main(
        [
            "--device",
            "cpu",
            "--engine",
            "hf",
            "--steps",
            "2",
            "--policies",
            "default",
            "--work",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{\n") :])
    assert rc == 0 and report["device"] == "cpu"
    (run,) = report["runs"]
    assert run["policy"] == "default" and run["steps"] == 2
    assert len(run["step_time_s"]) == 2 and run["median_step_time_s"] > 0
