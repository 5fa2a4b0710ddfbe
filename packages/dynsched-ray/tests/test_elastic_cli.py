"""``dynsched train --planner``: refused in one line where the trainer cannot grow; a run
with the core's role planner finishes with every sample trained exactly once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dynsched_core.cli import main as dynsched_main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_addition.yaml"


def _run(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    try:
        code = dynsched_main(["train", *argv])
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["trainer.n_gpus_per_node=1"], "got 1 trainer GPU(s)"),
        (["rollout.n_gpus_per_node=0", "rollout.nnodes=0"], "standalone replica (got 0)"),
    ],
)
def test_planner_without_room_to_grow_is_one_line_and_exit_2(
    sets: list[str], needle: str, capsys: Any, tmp_path: Path
) -> None:
    argv = ["--config", str(EXAMPLE), "--planner", "--out", str(tmp_path / "o")]
    for s in sets:
        argv += ["--set", s]
    code, _, err = _run(argv, capsys)
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("dynsched train: ") and needle in lines[0]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_dynsched_train_with_the_planner_trains_every_sample_once(
    capsys: Any, tmp_path: Path, warm_model: Path
) -> None:
    """Two trainer GPUs (the trainer starts on one), two standalone replicas, 4 steps with
    a sync every 2; the planner may move or not (its models decide): either way every
    consumed sample is distinct and each step consumed its share."""
    out = tmp_path / "train"
    argv = [
        "--config",
        str(EXAMPLE),
        "--set",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "--engine",
        "hf",
        "--steps",
        "4",
        "--planner",
        "--out",
        str(out),
        "--model-cache",
        str(warm_model.parent),
        "--name",
        "train-planner-e2e",
        "--quiet",
    ]
    code, printed, err = _run(argv, capsys)
    assert code == 0, printed + err
    assert "finished: 4 step(s) from step 1" in printed
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    ckpt = json.loads((out / "checkpoint" / "driver.json").read_text())
    ids = ckpt["consumed_sample_ids"]
    assert len(ids) == len(set(ids)) == 4 * 4  # steps x ppo_mini_batch_size prompts
