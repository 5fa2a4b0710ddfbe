"""The one config loader of ``dynsched run`` and ``dynsched train`` (no Ray started).

Misspelt keys dynsched reads warn naming the closest known key (verl's own keys stay
silent), a local cluster is bounded by the machine, ``--device`` is checked before Ray
starts, and hostile files end in one line (issue 27, item 4).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from dynsched_core.cli import main as dynsched_main
from dynsched_core.errors import UsageError
from dynsched_ray.cli import config as _loader
from dynsched_ray.cli import train as train_cli
from dynsched_ray.cli.run import build_config

VERL = (
    Path(__file__).resolve().parents[2]
    / "dynsched-core"
    / "tests"
    / "fixtures"
    / "verl_fully_async.yaml"
)

TYPOS = (
    "async_training:\n"
    "  trigger_parameter_sync_stp: 3\n"
    "  dynamic_schedule_polcy: fixed_ratio\n"
    "trainer: {nnodes: 1, n_gpu_per_node: 2, n_gpus_per_node: 2}\n"
    "rollout: {nnodes: 1, n_gpus_per_node: 2}\n"
)


def _stderr_lines(capsys: Any) -> list[str]:
    return [x for x in capsys.readouterr().err.splitlines() if x.strip()]


def test_realistic_verl_config_is_silent_in_run_and_train(capsys: Any) -> None:
    cfg = build_config(str(VERL), [])
    assert (cfg.ppo_mini_batch_size, cfg.n) == (32, 8)
    config, tree = train_cli.load_train_config(str(VERL), [])
    assert config == cfg and tree["actor_rollout_ref"]["model"]["path"]
    assert _stderr_lines(capsys) == []


def test_misspelt_keys_warn_in_run_and_train(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "typos.yaml"
    path.write_text(TYPOS)
    config = build_config(str(path), [])
    assert config.trigger_parameter_sync_step == 4  # the default: the key was misspelt
    run = _stderr_lines(capsys)
    assert run == [
        "dynsched run: warning: unknown key async_training.trigger_parameter_sync_stp (did you "
        "mean async_training.trigger_parameter_sync_step?); using the default",
        "dynsched run: warning: unknown key async_training.dynamic_schedule_polcy (did you mean "
        "async_training.dynamic_schedule_policy?); using the default",
        "dynsched run: warning: unknown key trainer.n_gpu_per_node (did you mean "
        "trainer.n_gpus_per_node?); ignored",
    ]
    train_cli.load_train_config(str(path), ["actor_rollout_ref.actor.optim.lrr=0.1"])
    train = _stderr_lines(capsys)
    lr = (
        "dynsched train: warning: unknown key actor_rollout_ref.actor.optim.lrr (did you mean "
        "actor_rollout_ref.actor.optim.lr?); using the default"
    )
    assert lr in train and len(train) == 4
    assert {x.replace("dynsched train:", "dynsched run:") for x in train if x != lr} == set(run)


@pytest.mark.parametrize("cores", [1, 2])
def test_local_cluster_is_bounded_by_the_machine(
    monkeypatch: pytest.MonkeyPatch, cores: int
) -> None:
    monkeypatch.delenv(_loader.LOCAL_MAX_GPUS_ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    config = build_config(None, ["trainer.n_gpus_per_node=64"])
    with pytest.raises(UsageError) as info:
        _loader.check_local_capacity(config, address=None)
    assert str(info.value) == (
        "trainer.nnodes x trainer.n_gpus_per_node + rollout.nnodes x rollout.n_gpus_per_node "
        "= 1 x 64 + 1 x 2 = 66 GPUs, but a local cluster on this machine can host at most 8 "
        f"(4 per CPU core, {cores} core(s); each GPU is a process); lower them, or run on a "
        "real cluster with --address ADDRESS"
    )
    _loader.check_local_capacity(config, address="auto")  # a real cluster: not bounded here
    _loader.check_local_capacity(build_config(None, []), address=None)  # the demo fits
    monkeypatch.setenv(_loader.LOCAL_MAX_GPUS_ENV, "66")
    _loader.check_local_capacity(config, address=None)
    with pytest.raises(UsageError, match="--trainer-workers 100"):
        _loader.check_local_capacity(config, address=None, trainer_workers=100)


def test_device_is_checked_before_ray(capsys: Any) -> None:
    with pytest.raises(UsageError, match="allowed values are cpu, cuda, cuda:N"):
        _loader.check_device("bogus")
    with pytest.raises(UsageError, match="allowed values"):
        _loader.check_device("cpu:1")
    _loader.check_device("cpu")
    _loader.check_device("auto")
    import torch  # the [torch] extra; CI installs it: never skip

    if torch.cuda.is_available():
        with pytest.raises(UsageError, match="CUDA device"):
            _loader.check_device(f"cuda:{torch.cuda.device_count()}")
    else:
        with pytest.raises(UsageError, match="no CUDA device is visible here"):
            _loader.check_device("cuda")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--device", "bogus"], "dynsched train: error: --device 'bogus': allowed values"),
        (
            ["--set", "trainer.n_gpus_per_node=1000000000"],
            "trainer.n_gpus_per_node must be <= 65,536",
        ),
        (["--steps", "100000000"], "--steps must be <= 10,000,000"),
        (["--seed", "-1"], "--seed must be >= 0"),
        (["--lr", "inf"], "--lr must be a finite number > 0"),
    ],
)
def test_train_refuses_in_one_line(
    argv: list[str], needle: str, capsys: Any, tmp_path: Path
) -> None:
    code = dynsched_main(["train", *argv, "--out", str(tmp_path / "o")])
    lines = _stderr_lines(capsys)
    assert code == 2 and len(lines) == 1 and needle in lines[0], lines
