"""`dynsched train --trainer fsdp`: the FSDP2 trainer plug-in end to end on Ray.

Two trainer workers (data-parallel 2, a gloo group on CPU) each hold one shard of the
model; the runner exports the weights at every sync and checkpoints the trainer through
the group, which calls every rank (the gathers are collectives). The hybrid replicas
are lent and reclaimed, so the sharded offload and reload run too; a resume from the
run's checkpoint continues the step count.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dynsched_ray import RayRunOptions
from dynsched_ray.plugins import TRAINERS
from dynsched_ray.trainers.base import TrainerOptions
from dynsched_ray.trainers.torch.trainer import TorchTrainer
from dynsched_ray.training import TrainRunner

from ._policies import AlwaysSwitchPolicy
from .test_train import _check_run, _config, _settings

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


def test_fsdp_is_an_installed_trainer_plugin() -> None:
    plugin = TRAINERS.load("fsdp")
    assert "FSDP" in plugin.description
    from dynsched_ray.trainers.fsdp import FSDPTrainer

    assert plugin.factory.resolve() is FSDPTrainer
    # the plug-in's module loads no torch (the driver of a run needs none)
    probe = "import sys, dynsched_ray.trainers.fsdp as m; m.TRAINER; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_train_fsdp_two_ranks_then_resume(tmp_path: Path, warm_model: Path) -> None:
    config = _config(standalone=1, trainer_gpus=2, trigger_parameter_sync_step=1)
    settings = _settings(tmp_path, 2, trainer="fsdp")
    runner = TrainRunner(
        config,
        settings,
        RayRunOptions(name="train-fsdp"),
        model=warm_model,
        policy=AlwaysSwitchPolicy(),
    )
    summary = await runner.train()
    _check_run(runner, summary, 2)
    # the hybrid replicas were lent: the sharded workers offloaded and reloaded
    assert summary.result.loop.activations >= 1
    group = runner.trainer_group
    assert group is not None and group.collective and len(group.workers) == 2
    ckpt_dir = runner.settings.checkpoint_dir
    ckpt = json.loads((ckpt_dir / "driver.json").read_text())
    assert ckpt["trainer_state"] == "trainer-v2.pt" and ckpt["param_version"] == 2
    state = torch.load(ckpt_dir / "trainer-v2.pt", weights_only=True)
    assert state["trainer"] == "FSDPTrainer" and state["version"] == 2
    # whole tensors (gathered from both shards), the unsharded trainer's names and shapes
    whole = TorchTrainer(warm_model, TrainerOptions()).state_dict()["model"]
    assert {k: tuple(t.shape) for k, t in state["model"].items()} == {
        k: tuple(t.shape) for k, t in whole.items()
    }
    # two updates moved the weights
    assert any(not torch.equal(state["model"][k], whole[k]) for k in whole)

    resumed = TrainRunner(
        config,
        _settings(tmp_path, 1, trainer="fsdp"),
        RayRunOptions(name="train-fsdp-b"),
        model=warm_model,
        policy=AlwaysSwitchPolicy(),
        resume=True,
    )
    part = await resumed.train()
    assert part.result.resumed and part.result.first_step == 3
    _check_run(resumed, part, 1, first_step=3)
    chain = list(part.result.consumed_sample_ids)
    assert len(chain) == len(set(chain)) == 3 * config.required_samples
    assert set(summary.result.consumed_sample_ids) < set(chain)
