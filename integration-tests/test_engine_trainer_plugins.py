"""Engines and trainers of other distributions, found through their entry points.

``integration-tests/example-engine`` (engine ``example_hf``) and
``integration-tests/example-trainer`` (trainer ``example_torch``) are installed like any
third-party package; ``dynsched train`` runs them (and ``dynsched run --engine`` the engine,
with the stand-in trainer) with no change to dynsched-ray, and the
name rules of every plug-in group hold (typo: the closest name; two providers: both
named).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
DYNSCHED = shutil.which("dynsched", path=str(BIN)) or shutil.which("dynsched")
EXAMPLE = Path(__file__).resolve().parents[1] / "packages/dynsched-ray/examples/train_addition.yaml"


def _providers(group: str, name: str) -> list[str]:
    return sorted(
        d.metadata["Name"]
        for d in metadata.distributions()
        for ep in d.entry_points
        if ep.group == group and ep.name == name
    )


def test_example_plugins_are_entry_points_of_their_own_distributions() -> None:
    assert _providers("dynsched.engines", "example_hf") == ["dynsched-example-engine"]
    assert _providers("dynsched.trainers", "example_torch") == ["dynsched-example-trainer"]
    assert _providers("dynsched.engines", "hf") == ["dynsched-ray"]
    assert _providers("dynsched.trainers", "torch") == ["dynsched-ray"]


def test_loaded_by_name_in_a_fresh_interpreter_without_torch() -> None:
    probe = (
        "import json, sys\n"
        "from dynsched_ray.engines import engine_names, load_engine\n"
        "from dynsched_ray.trainers import load_trainer, trainer_names\n"
        "assert 'dynsched_example_engine' not in sys.modules\n"
        "e, t = load_engine('example_hf'), load_trainer('example_torch')\n"
        "print(json.dumps([engine_names(), trainer_names(), e.factory.__name__,\n"
        "                  t.factory.target, 'dynsched_example_trainer.trainer' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    engines, trainers, engine_cls, trainer_target, trainer_imported = json.loads(
        out.stdout.strip().splitlines()[-1]
    )
    assert {"example_hf", "hf", "vllm"} <= set(engines)
    assert {"example_torch", "torch", "megatron"} <= set(trainers)
    assert engine_cls == "MarkedHFReplica"
    assert trainer_target == "dynsched_example_trainer.trainer:MarkedTorchTrainer"
    assert trainer_imported is False  # the trainer (and torch) load in the trainer actor


def _train(
    args: list[str], tmp: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    assert DYNSCHED is not None
    return subprocess.run(
        [DYNSCHED, "train", *args, "--out", str(tmp / "out")],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        timeout=600,
    )


@pytest.mark.parametrize(
    ("flag", "typo", "known"),
    [("--engine", "example_fh", "example_hf"), ("--trainer", "example_troch", "example_torch")],
)
def test_a_misspelt_plugin_name_names_the_closest_one(
    flag: str, typo: str, known: str, tmp_path: Path
) -> None:
    proc = _train([flag, typo], tmp_path)
    assert proc.returncode == 2, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    assert f"unknown {flag[2:]} {typo!r}" in line and f"Did you mean {known!r}?" in line, line


def test_a_name_two_distributions_provide_is_refused(tmp_path: Path) -> None:
    """A second distribution (on ``PYTHONPATH``) declaring the engine ``example_hf``."""
    info = tmp_path / "site" / "rogue_engine-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rogue-engine\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text('[dynsched.engines]\nexample_hf = "rogue:ENGINE"\n')
    proc = _train(["--engine", "example_hf"], tmp_path, {"PYTHONPATH": str(tmp_path / "site")})
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "'dynsched-example-engine'" in line and "'rogue-engine'" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.ray
@pytest.mark.slow
def test_dynsched_train_runs_the_out_of_tree_engine_and_trainer(tmp_path: Path) -> None:
    """Two steps of the addition task with both plug-ins: each replica and each trainer
    step leaves its marker, written from inside the Ray actors."""
    engine_log, trainer_log = tmp_path / "engine.log", tmp_path / "trainer.log"
    args = [
        "--config",
        str(EXAMPLE),
        "--set",
        "trainer.n_gpus_per_node=1",
        "--set",
        "rollout.n_gpus_per_node=1",
        "--set",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "--engine",
        "example_hf",
        "--trainer",
        "example_torch",
        "--steps",
        "2",
        "--model-cache",
        str(tmp_path / "cache"),
        "--quiet",
    ]
    env = {
        "DYNSCHED_EXAMPLE_ENGINE_LOG": str(engine_log),
        "DYNSCHED_EXAMPLE_TRAINER_LOG": str(trainer_log),
    }
    proc = _train(args, tmp_path, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "engine example_hf, trainer example_torch" in proc.stdout
    assert "finished: 2 step(s)" in proc.stdout
    roles = sorted(line.split()[1] for line in engine_log.read_text().splitlines())
    assert roles == ["hybrid", "standalone"]
    steps = [line.split() for line in trainer_log.read_text().splitlines()]
    assert [int(version) for version, _ in steps] == [1, 2]
    assert all(int(groups) == 4 for _, groups in steps)  # 4 prompts per step
    rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]


@pytest.mark.ray
@pytest.mark.slow
def test_dynsched_run_runs_the_out_of_tree_engine(tmp_path: Path) -> None:
    """``dynsched run --engine example_hf``: the third-party engine's replicas (one
    standalone, one hybrid) serve two steps of the task's prompts, the stand-in trainer
    consumes them, and each replica leaves its marker from inside its Ray actor."""
    assert DYNSCHED is not None
    engine_log = tmp_path / "engine.log"
    args = [
        *("--config", str(EXAMPLE)),
        *("--set", "trainer.n_gpus_per_node=1", "--set", "rollout.n_gpus_per_node=1"),
        *("--set", "actor_rollout_ref.actor.ppo_mini_batch_size=4"),
        *("--engine", "example_hf", "--steps", "2"),
        *("--model-cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out")),
    ]
    proc = subprocess.run(
        [DYNSCHED, "run", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "DYNSCHED_EXAMPLE_ENGINE_LOG": str(engine_log)},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "engine example_hf (stand-in trainer)" in proc.stdout
    assert "finished: 2 step(s)" in proc.stdout
    roles = sorted(line.split()[1] for line in engine_log.read_text().splitlines())
    assert roles == ["hybrid", "standalone"]
    assert (tmp_path / "out" / "metrics.jsonl").is_file()


def test_dynsched_run_refuses_a_misspelt_engine_before_ray(tmp_path: Path) -> None:
    assert DYNSCHED is not None
    proc = subprocess.run(
        [DYNSCHED, "run", "--engine", "example_fh", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    assert "unknown engine 'example_fh'" in line and "Did you mean 'example_hf'?" in line, line
    assert not (tmp_path / "out").exists()
