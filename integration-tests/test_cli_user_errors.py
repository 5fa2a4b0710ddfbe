"""The ``dynsched`` command as a user meets it: every bad input is one line, exit status 2.

Each case runs the installed ``dynsched`` command in a subprocess (as a user would) and
checks the exit status, that stderr is exactly one line naming the flag or file and the
problem, that nothing ran first (stdout empty: inputs are validated before running), and
that no traceback is printed. The cases are the ones of issue 15.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
DYNSCHED = shutil.which("dynsched", path=str(BIN)) or shutil.which("dynsched")

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

OTHER_POLICY_CHECKPOINT = {
    "format": 1,
    "name": "dynsched",
    "driver": {},
    "param_version": 2,
    "steps_done": 4,
    "consumed_sample_ids": [],
    "config": {"dynamic_schedule_policy": "fixed_ratio"},
}

JOBS_NEGATIVE = {
    "resources": ["cpu"],
    "capacity": [8],
    "jobs": [
        {
            "id": "a",
            "remaining_steps": -5,
            "speed": {"mode": "async", "theta": [1, 1, 1, 1]},
            "ps_demand": [1],
            "worker_demand": [1],
        }
    ],
}


def _files(tmp: Path) -> dict[str, str]:
    """The bad input files of the table, by name."""
    (tmp / "bad.yaml").write_text("name: x\n  configurations: [1,\n")
    (tmp / "bad.toml").write_text("name = [1,\n")
    (tmp / "empty.yaml").write_text("")
    (tmp / "empty.json").write_text("")
    (tmp / "corrupt.json").write_text('{"format": 1, "driver": {')
    (tmp / "other.json").write_text(json.dumps(OTHER_POLICY_CHECKPOINT))
    bad_driver = {**OTHER_POLICY_CHECKPOINT, "config": {"dynamic_schedule_policy": "default"}}
    (tmp / "bad-driver.json").write_text(json.dumps(bad_driver))
    (tmp / "jobs-negative.json").write_text(json.dumps(JOBS_NEGATIVE))
    (tmp / "a-file").write_text("not a folder\n")
    (tmp / "a-dir").mkdir()
    # hostile configs (issue 27): an alias bomb, huge numbers, deep nesting
    (tmp / "bomb.yaml").write_text(ALIAS_BOMB)
    (tmp / "int400.yaml").write_text("async_training:\n  staleness_threshold: " + "9" * 400)
    (tmp / "int5000.yaml").write_text("async_training:\n  staleness_threshold: " + "9" * 5000)
    (tmp / "deep.yaml").write_text("trainer: " + "[" * 1000 + "]" * 1000 + "\n")
    (tmp / "huge-steps.yaml").write_text(
        "name: huge\nsteps: 1000000000000\nconfigurations:\n"
        "  - {name: a, trainer_gpus: 8, rollout_gpus: 8, hybrid: false}\n"
    )
    return {p.name: str(p) for p in tmp.iterdir()}


def _alias_bomb(levels: int = 10, fan: int = 9) -> str:
    """~790 bytes of nested mapping anchors that expand to ``fan ** levels`` values."""
    keys = "abcdefghi"[:fan]
    lines = ["l0: &l0 {" + ", ".join(f"{k}: 1" for k in keys) + "}"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} {{" + ", ".join(f"{k}: *l{i - 1}" for k in keys) + "}")
    return "\n".join(lines) + "\n"


ALIAS_BOMB = _alias_bomb()


# (id, arguments with {name} placeholders for the files above, words the line must hold)
CASES: list[tuple[str, list[str], list[str]]] = [
    # simulate
    ("sim-yaml-syntax", ["simulate", "--scenario", "{bad.yaml}"], ["bad.yaml", "YAML syntax"]),
    ("sim-toml-syntax", ["simulate", "--scenario", "{bad.toml}"], ["bad.toml", "TOML syntax"]),
    ("sim-dir-scenario", ["simulate", "--scenario", "{a-dir}"], ["a-dir", "is a directory"]),
    ("sim-unknown-scenario", ["simulate", "--scenario", "nosuch"], ["nosuch", "seed-qwen35"]),
    ("sim-out-under-file", ["simulate", "--out", "{a-file}/out"], ["--out", "not a folder"]),
    ("sim-steps-zero", ["simulate", "--steps", "0"], ["--steps", ">= 1"]),
    ("sim-seed-negative", ["simulate", "--seed", "-1"], ["--seed", ">= 0"]),
    ("sim-steps-text", ["simulate", "--steps", "x"], ["--steps", "invalid int"]),
    ("sim-unknown-policy", ["simulate", "--policy", "nosuch"], ["nosuch", "default"]),
    # run
    ("run-yaml-syntax", ["run", "--config", "{bad.yaml}"], ["--config", "YAML syntax"]),
    ("run-empty-config", ["run", "--config", "{empty.yaml}"], ["--config", "is empty"]),
    ("run-missing-config", ["run", "--config", "{a-dir}/no.yaml"], ["--config", "does not exist"]),
    ("run-steps-negative", ["run", "--steps", "-1"], ["--steps", ">= 1"]),
    ("run-resume-alone", ["run", "--resume"], ["--resume", "--checkpoint"]),
    (
        "run-resume-missing",
        ["run", "--resume", "--checkpoint", "{a-dir}/missing.json"],
        ["missing.json", "does not exist"],
    ),
    (
        "run-resume-empty",
        ["run", "--resume", "--checkpoint", "{empty.json}"],
        ["empty.json", "empty"],
    ),
    (
        "run-resume-corrupt",
        ["run", "--resume", "--checkpoint", "{corrupt.json}"],
        ["corrupt.json", "corrupt"],
    ),
    (
        "run-resume-other-policy",
        ["run", "--resume", "--checkpoint", "{other.json}"],
        ["other.json", "'fixed_ratio'", "'default'"],
    ),
    (
        "run-resume-bad-driver-state",
        ["run", "--resume", "--checkpoint", "{bad-driver.json}"],
        ["bad-driver.json", "'driver'", "format"],
    ),
    (
        "run-set-unknown-key",
        ["run", "--set", "nosuchkey=3"],
        ["--set", "'nosuchkey'", "closest known key"],
    ),
    (
        "run-set-misspelt-key",
        ["run", "--set", "staleness_treshold=0.5"],
        ["'staleness_treshold'", "'staleness_threshold'"],
    ),
    ("run-set-no-equals", ["run", "--set", "novalue"], ["--set", "KEY=VALUE"]),
    ("run-out-is-file", ["run", "--out", "{a-file}"], ["--out", "not a folder"]),
    ("run-bad-value", ["run", "--set", "trigger_parameter_sync_step=0"], ["trigger_parameter"]),
    # optimus
    ("opt-compare-zero-jobs", ["optimus", "compare", "--ps", "--num-jobs", "0"], ["--num-jobs"]),
    (
        "opt-allocate-negative-steps",
        ["optimus", "allocate", "{jobs-negative.json}"],
        ["jobs-negative.json", "remaining_steps", ">= 0"],
    ),
    (
        "opt-dir-workload",
        ["optimus", "simulate", "--workload", "{a-dir}"],
        ["a-dir", "is a directory"],
    ),
    (
        "opt-unknown-workload",
        ["optimus", "simulate", "--workload", "nosuch"],
        ["nosuch", "workload-1", "workload-8"],
    ),
    (
        "opt-compare-one-bad-workload",
        ["optimus", "compare", "--workloads", "workload-1,nosuch"],
        ["nosuch", "workload-1"],
    ),
    ("opt-out-is-file", ["optimus", "simulate", "--out", "{a-file}"], ["--out", "not a folder"]),
    ("opt-bad-interval", ["optimus", "compare", "--interval", "-1"], ["--interval", "> 0"]),
    ("opt-missing-file", ["optimus", "place", "{a-dir}/none.json"], ["none.json"]),
    # issue 27: hostile configs and bounds, all refused before Ray starts
    ("run-alias-bomb", ["run", "--config", "{bomb.yaml}"], ["bomb.yaml", "more than 100,000"]),
    ("run-int-400", ["run", "--config", "{int400.yaml}"], ["staleness_threshold", "400-digit"]),
    ("run-int-5000", ["run", "--config", "{int5000.yaml}"], ["staleness_threshold", "5000-digit"]),
    ("run-deep-nesting", ["run", "--config", "{deep.yaml}"], ["deep.yaml", "deeper than 64"]),
    (
        "run-gpus-absurd",
        ["run", "--set", "trainer.n_gpus_per_node=1000000000"],
        ["trainer.n_gpus_per_node", "<= 65,536"],
    ),
    (
        "run-gpus-beyond-machine",
        ["run", "--set", "trainer.n_gpus_per_node=4096"],
        ["4098 GPUs", "this machine can host at most", "--address"],
    ),
    (
        "run-batch-1e18",
        ["run", "--set", "actor_rollout_ref.actor.ppo_mini_batch_size=1000000000000000000"],
        ["ppo_mini_batch_size", "<= 1,000,000"],
    ),
    (
        "run-steps-absurd",
        ["run", "--set", "trainer.total_training_steps=100000000"],
        ["total_training_steps", "<= 10,000,000"],
    ),
    ("run-gpus-bool", ["run", "--set", "trainer.n_gpus_per_node=true"], ["n_gpus_per_node", "int"]),
    ("run-steps-flag-huge", ["run", "--steps", "1000000000000"], ["--steps", "<= 10,000,000"]),
    ("run-tokens-nan", ["run", "--tokens-per-s", "nan"], ["--tokens-per-s", "got nan"]),
    ("run-steps-text", ["run", "--set", "trainer.total_training_steps=ten"], ["'ten'", "int"]),
    ("run-staleness-inf", ["run", "--set", "staleness_threshold=.inf"], ["staleness", "[0, 1000]"]),
    ("train-alias-bomb", ["train", "--config", "{bomb.yaml}"], ["bomb.yaml", "more than 100,000"]),
    ("train-int-5000", ["train", "--config", "{int5000.yaml}"], ["5000-digit"]),
    ("train-deep-nesting", ["train", "--config", "{deep.yaml}"], ["deeper than 64"]),
    (
        "train-gpus-beyond-machine",
        ["train", "--set", "trainer.n_gpus_per_node=4096"],
        ["4098 GPUs", "--address"],
    ),
    ("train-device-bogus", ["train", "--device", "bogus"], ["--device 'bogus'", "cpu, cuda"]),
    ("train-device-index", ["train", "--device", "cuda:99"], ["--device cuda:99", "CUDA"]),
    ("train-steps-absurd", ["train", "--steps", "100000000"], ["--steps", "<= 10,000,000"]),
    ("sim-steps-huge", ["simulate", "--steps", "1000000000000"], ["--steps", "<= 1,000,000"]),
    ("sim-seeds-huge", ["simulate", "--seeds", "100000000"], ["--seeds", "<= 10,000"]),
    ("sim-seed-huge", ["simulate", "--seed", "99999999999"], ["--seed", "<="]),
    (
        "sim-scenario-huge-steps",
        ["simulate", "--scenario", "{huge-steps.yaml}"],
        ["huge-steps.yaml", "steps", "<= 1,000,000"],
    ),
    ("sim-scenario-bomb", ["simulate", "--scenario", "{bomb.yaml}"], ["more than 100,000"]),
    ("sim-scenario-deep", ["simulate", "--scenario", "{deep.yaml}"], ["deeper than 64"]),
    (
        "opt-unknown-job",
        ["optimus", "simulate", "--job", "nosuchjob"],
        ["--job 'nosuchjob'", "workload-1", "cifar10-0"],
    ),
    (
        "opt-unknown-job-close",
        ["optimus", "simulate", "--job", "cifar10-O"],
        ["did you mean 'cifar10-"],
    ),
    ("opt-num-jobs-huge", ["optimus", "simulate", "--ps", "--num-jobs", "10000000"], ["<= 10,000"]),
]

if shutil.which("nvidia-smi") is None:  # no NVIDIA driver here: no CUDA either
    CASES.append(
        ("train-device-cuda", ["train", "--device", "cuda"], ["no CUDA device", "--device cpu"])
    )


def _fill(arg: str, files: dict[str, str]) -> str:
    for name, path in files.items():
        arg = arg.replace("{" + name + "}", path)
    assert "{" not in arg, arg
    return arg


def _run(args: list[str], timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    assert DYNSCHED is not None, "the dynsched command is not installed"
    return subprocess.run(
        [DYNSCHED, *args], capture_output=True, text=True, timeout=timeout, env=ENV
    )


def _assert_one_line_error(
    proc: subprocess.CompletedProcess[str], words: list[str], label: str
) -> None:
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, f"{label}: traceback\n{text}"
    assert proc.returncode == 2, f"{label}: exit {proc.returncode}\n{text}"
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, f"{label}: {len(lines)} lines on stderr\n{proc.stderr}"
    assert lines[0].startswith("dynsched") and "error:" in lines[0], f"{label}: {lines[0]}"
    for w in words:
        assert w in lines[0], f"{label}: {w!r} not in {lines[0]!r}"
    assert proc.stdout.strip() == "", f"{label}: something ran before the error\n{proc.stdout}"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    files = _files(tmp_path)
    jobs: list[tuple[str, list[str], list[str]]] = []
    for label, args, words in CASES:
        real = [_fill(a, files) for a in args]
        jobs.append((label, real, words))

    def one(job: tuple[str, list[str], list[str]]) -> Callable[[], None]:
        label, args, words = job
        proc = _run(args)
        return lambda: _assert_one_line_error(proc, words, label)

    # Two at a time: each start imports Ray, scipy and torch-free vLLM-free code (seconds).
    with ThreadPoolExecutor(max_workers=2) as pool:
        checks = list(pool.map(one, jobs))
    failures = []
    for check in checks:
        try:
            check()
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, "\n\n".join(failures)


def test_no_plugins_installed_says_which_package(tmp_path: Path) -> None:
    """With no plug-in package installed, ``dynsched simulate`` names dynsched-sim."""
    code = (
        "import sys\n"
        "from importlib import metadata\n"
        "metadata.distributions = lambda *a, **k: []\n"
        "from dynsched_core import cli\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "simulate"],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert proc.returncode == 2, proc.stderr
    assert "pip install dynsched-sim" in proc.stderr and "Traceback" not in proc.stderr
    assert "invalid choice" not in proc.stderr


def test_misspelt_keys_warn_and_bad_values_stop_before_ray(tmp_path: Path) -> None:
    """Warnings name the closest known key; the refusal comes before Ray starts."""
    path = tmp_path / "typos.yaml"
    path.write_text(
        "async_training: {trigger_parameter_sync_stp: 3, dynamic_schedule_polcy: x}\n"
        "trainer: {nnodes: 1, n_gpu_per_node: 2, n_gpus_per_node: 2}\n"
        "rollout: {nnodes: 1, n_gpus_per_node: 2}\n"
        "actor_rollout_ref: {model: {path: Qwen/Qwen2.5-7B}}\n"
        "data: {train_batch_size: 1024}\n"
    )
    for command in ("run", "train"):
        proc = _run([command, "--config", str(path), "--set", "trainer.n_gpus_per_node=4096"])
        text = proc.stdout + proc.stderr
        assert proc.returncode == 2 and "Traceback" not in text, text
        lines = [x for x in proc.stderr.splitlines() if x.strip()]
        assert len(lines) == 4, lines
        assert lines[:3] and all(
            f"dynsched {command}: warning: unknown key" in x for x in lines[:3]
        )
        assert "(did you mean async_training.trigger_parameter_sync_step?)" in proc.stderr
        assert "(did you mean trainer.n_gpus_per_node?)" in proc.stderr
        assert "model.path" not in proc.stderr and "train_batch_size" not in proc.stderr
        assert lines[3].startswith(f"dynsched {command}: error: ") and "4098 GPUs" in lines[3]
