"""The prepared GPU check runs its CPU path (no GPU here: that part only runs where lent)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "gpu_trainer_check.py"


def test_gpu_check_script_cpu_path(capsys: Any, tiny_model_dir: Path) -> None:
    spec = importlib.util.spec_from_file_location("gpu_trainer_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rc = module.main(["--device", "cpu", "--skip-vllm", "--model", str(tiny_model_dir)])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0, report["failed"]
    assert report["failed"] == []
    for part in ("megatron", "torch"):
        checks = report[part]["checks"]
        assert checks and all(checks.values())
        assert report[part]["offload"]["device_bytes_after"] == 0
    assert report["megatron"]["cpu_substitutes"]
    assert report["vllm"] == {"skipped": "--skip-vllm"}
    assert module.main(["--device", "cuda"]) == 2  # no CUDA here: says so, runs nothing
