"""``dynsched train``: inputs checked before Ray starts (exit 2), Ctrl-C exits 130."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from dynsched_core.cli import main as dynsched_main
from dynsched_ray.cli import train as train_cli
from dynsched_ray.training import TrainSettings

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_addition.yaml"


def _run(argv: list[str], capsys: Any) -> tuple[int, str]:
    try:
        code = dynsched_main(["train", *argv])
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_example_config_reads_with_verl_keys() -> None:
    config, tree = train_cli.load_train_config(str(EXAMPLE), ["trainer.total_training_steps=4"])
    assert (config.num_standalone_replicas, config.num_hybrid_replicas) == (2, 2)
    assert (config.required_samples, config.n, config.trigger_parameter_sync_step) == (8, 4, 2)
    s = TrainSettings.from_verl(tree, engine="hf")
    assert (s.steps, s.lr, s.max_tokens, s.out_dir, s.engine) == (
        4,
        1e-3,
        6,
        "dynsched-train",
        "hf",
    )
    assert TrainSettings.from_verl(tree, steps=8, lr=None).steps == 8


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--engine", "sglang"], "unknown engine 'sglang'"),
        (["--trainer", "megatrom"], "Did you mean 'megatron'?"),
        (["--set", "async_training.staleness_threshold=-1"], "staleness_threshold"),
        (["--set", "nonsense"], "KEY=VALUE"),
        (["--policy", "no-such-policy"], "no-such-policy"),
        (["--steps", "3"], "multiple of"),
        (["--steps", "0"], "steps"),
        (["--config", "/no/such/file.yaml"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], needle: str, capsys: Any, tmp_path: Path
) -> None:
    code, err = _run([*argv, "--out", str(tmp_path / "o")], capsys)
    assert code == 2
    lines = [x for x in err.splitlines() if x.strip()]
    assert needle in lines[-1]  # the error is the last line
    if not lines[0].startswith("usage:"):  # argparse prints its usage first
        assert len(lines) == 1 and lines[0].startswith("dynsched train: ")


def test_resume_without_checkpoint_exits_2(capsys: Any, tmp_path: Path) -> None:
    code, err = _run(["--resume", "--out", str(tmp_path)], capsys)
    assert code == 2 and "no checkpoint" in err and len(err.strip().splitlines()) == 1


def test_ctrl_c_exits_130(monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(train_cli, "_run", interrupted)
    code, err = _run(["--out", str(tmp_path), "--engine", "hf"], capsys)
    assert code == 130 and "interrupted" in err


def test_progress_bar_lines() -> None:
    out = io.StringIO()
    bar = train_cli.ProgressBar(4, stream=out)
    row = {
        "step": 2,
        "reward": 0.5,
        "exact_match": 0.5,
        "loss": 0.1,
        "mq_size": 3,
        "hybrid_state": "HYBRID_ACTIVE",
        "version": 1,
        "step_time_s": 0.4,
    }
    bar.update(row)
    bar.note("activate took 3 ms (ok)")
    bar.close()
    text = out.getvalue().splitlines()
    assert text[0].startswith("[##########..........] step 2/4 reward 0.500")
    assert "mq 3 hybrid HYBRID_ACTIVE v1" in text[0]
    assert text[1] == "activate took 3 ms (ok)"


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_dynsched_train_runs_end_to_end(capsys: Any, tmp_path: Path, warm_model: Path) -> None:
    """The command itself: the example config, shrunk (one standalone + one hybrid
    replica, 2 steps, 4 prompts x 4 responses), with the session's warmed-up model cache;
    it writes a reward per step and a checkpoint, then resumes for 2 more steps."""
    out = tmp_path / "train"
    argv = [
        "--config",
        str(EXAMPLE),
        "--set",
        "trainer.n_gpus_per_node=1",
        "--set",
        "rollout.n_gpus_per_node=1",
        "--set",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "--engine",
        "hf",
        "--steps",
        "2",
        "--out",
        str(out),
        "--model-cache",
        str(warm_model.parent),
        "--name",
        "train-cli-e2e",
        "--quiet",
    ]
    code = dynsched_main(["train", *argv])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "finished: 2 step(s) from step 1" in printed
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["reward"] <= 1.0 for r in rows)
    assert (out / "checkpoint" / "driver.json").is_file()
    code = dynsched_main(["train", *argv, "--resume"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "finished: 2 step(s) from step 3" in printed
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]


# ---------------------------------------------------------------- one runner
def test_train_runner_is_a_configuration_of_the_one_runner() -> None:
    """`TrainRunner` composes the one `RayRunner` with a `TrainWorkload` (it overrides
    none of the runner's methods), in at most 10 constructor parameters."""
    import inspect

    from dynsched_core import ConfigError
    from dynsched_ray import RayRunner
    from dynsched_ray.runtime.workload import RunWorkload
    from dynsched_ray.training import TrainRunner, TrainRunnerOptions, TrainWorkload

    assert not issubclass(TrainRunner, RayRunner)
    assert issubclass(TrainWorkload, RunWorkload)
    params = [p for p in inspect.signature(TrainRunner.__init__).parameters if p != "self"]
    assert len(params) <= 10, params
    assert "workload" in inspect.signature(RayRunner.__init__).parameters
    # neither re-implements a piece of the runner: what differs is in the workload's hooks
    runner_methods = {
        n for n, _ in inspect.getmembers(RayRunner, inspect.isfunction) if not n.startswith("__")
    }
    assert not runner_methods & (set(vars(TrainWorkload)) | set(vars(TrainRunner)))
    with pytest.raises(ConfigError, match=r"^TrainRunnerOptions\.replica_kwargs must be a"):
        TrainRunnerOptions(replica_kwargs={1: "x"})
    with pytest.raises(ConfigError, match=r"^TrainRunnerOptions\.keep_samples must be a bool"):
        TrainRunnerOptions(keep_samples="yes")  # type: ignore[arg-type]
    assert TrainRunnerOptions(replica_kwargs={"device": "cpu"}).replica_kwargs == {"device": "cpu"}
