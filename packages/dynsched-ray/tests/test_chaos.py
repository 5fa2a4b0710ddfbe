"""Seeded chaos runs: every fault kind at least once, every sample id accounted for across
every driver lifetime, the fault schedule replayed exactly per seed, and a mutation (one
sample dropped when the queue actor is replaced) caught by the soak."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dynsched_core.events import SampleEvent
from dynsched_ray import FAULT_KINDS, ChaosFault, ChaosSchedule, account_samples, run_chaos_soak
from dynsched_ray.drills.chaos import _Lifetime
from dynsched_ray.runtime.proxies import RayQueue

HERE = Path(__file__).resolve().parent


def test_schedule_is_seeded_and_covers_every_kind() -> None:
    a = ChaosSchedule.generate(7, 60)
    assert a == ChaosSchedule.generate(7, 60)
    assert a != ChaosSchedule.generate(8, 60)
    assert {f.kind for f in a.faults} == set(FAULT_KINDS)
    steps = [f.step for f in a.faults]
    assert steps == sorted(set(steps)) and steps[0] >= 2 and steps[-1] <= 58
    assert len(ChaosSchedule.generate(0, 200).faults) == 30  # 1.5 per 10 steps
    with pytest.raises(ValueError, match="unknown"):
        ChaosSchedule.generate(0, 60, kinds=["meteor"])
    with pytest.raises(ValueError, match="room for"):
        ChaosSchedule.generate(0, 8)
    with pytest.raises(ValueError, match="kind"):
        ChaosFault(step=1, kind="meteor")


def test_the_drill_configures_the_one_runner_and_reads_no_private_field() -> None:
    """The soak runs the plain `RayRunner` (no subclass), gated through its documented
    ``on_loop_built`` hook; it reads no private runner field and parses no log line."""
    import inspect

    from dynsched_ray import RayRunner
    from dynsched_ray.drills import chaos

    subclasses = [
        obj
        for obj in vars(chaos).values()
        if inspect.isclass(obj) and issubclass(obj, RayRunner) and obj is not RayRunner
    ]
    assert subclasses == []
    source = inspect.getsource(chaos)
    assert "runner._" not in source and "import re" not in source

    order: list[str] = []

    class _Trainer:
        async def train_step(self, samples: Any) -> str:
            order.append(f"train {samples}")
            return "trained"

    async def gate() -> None:
        order.append("gate")

    loop = type("Loop", (), {"trainer": _Trainer()})()
    chaos.gate_training(gate)(loop)
    assert asyncio.run(loop.trainer.train_step(1)) == "trained"
    assert order == ["gate", "train 1"]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(400)
async def test_short_seeded_chaos_run_injects_every_kind_and_loses_nothing(
    tmp_path: Any,
) -> None:
    report = await asyncio.wait_for(
        run_chaos_soak(0, 30, name="chaos-ci", checkpoint_dir=str(tmp_path)), 360
    )
    data = report.as_dict()
    assert report.ok, data["failures"]
    assert set(data["faults_by_kind"]) == set(FAULT_KINDS)
    assert data["steps_completed"] == 30
    assert data["samples_lost"] == 0 and data["samples_duplicated"] == 0
    assert data["samples_consumed"] == 30 * 2  # required_samples = 2 per step
    ids = data["samples"]
    assert ids["lost"] == ids["duplicated"] == 0 and ids["consumed"] == 60
    assert ids["produced"] == ids["consumed"] + ids["left"] + ids["returned"]
    # every scheduled fault fired (deferred at worst, never dropped)
    assert report.executed_faults == [(f["kind"], f["step"]) for f in data["schedule"]]
    assert data["faults_not_executed"] == ()
    assert data["max_wait_s"] <= data["wait_timeout_s"]
    assert data["max_staleness"] <= data["staleness_bound"]
    rec = data["recoveries"]
    assert rec["driver_restarts"] >= 1 and rec["router_replacements"] >= 1
    assert rec["queue_replacements"] >= 1 and rec["replica_restarts"] >= 1
    assert set(data["time_lost_s_by_kind"]) <= set(FAULT_KINDS)
    json.dumps(data)  # the report is plain data


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_node_of_a_multi_node_cluster_removed_mid_run(tmp_path: Any) -> None:
    """Its own in-process `Cluster` (head + 2 GPU nodes, then a third), in a subprocess so
    it does not disturb the session's Ray: the standalone pool's node is removed after
    step 2; the run fails over to the hybrid replicas, the standalone bundles are re-placed
    on the new node, the replicas restarted there, and nothing is lost."""
    out = tmp_path / "multinode.json"
    proc = subprocess.run(
        [sys.executable, str(HERE / "_multinode.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=560,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["removed"]
    before = r["nodes_before"]
    # placement spread the pools over two nodes; the removed one held the standalone pool
    assert before["standalone-0"] == before["standalone-1"] == r["removed_node"]
    assert before["hybrid-0"] != r["removed_node"]
    assert r["steps"] == 10 and r["failed"] == 0
    assert len(r["consumed"]) == len(set(r["consumed"])) == 10 * 2  # 2 samples per step
    assert r["produced"] == r["consumed_count"] + r["left"]
    assert r["failovers"] >= 1  # both standalone replicas died while the hybrids slept
    restarted = {x["replica_id"] for x in r["restarts"] if x["ok"]}
    assert restarted == {"standalone-0", "standalone-1"}
    after = r["nodes_after"]
    assert after["standalone-0"] not in (r["removed_node"], None)
    assert r["dead"] == []


def _life(
    produced: str, consumed: str, committed: str, *, left: str | None = None, finished: bool = False
) -> _Lifetime:
    life = _Lifetime()
    life.record(SampleEvent(0.0, "produced", tuple(produced.split())))
    life.record(SampleEvent(0.0, "consumed", tuple(consumed.split()), step=1))
    if left is not None:
        life.record(SampleEvent(0.0, "left", tuple(left.split())))
    life.committed = committed.split()
    life.finished = finished
    return life


def test_per_id_accounting_across_driver_lifetimes() -> None:
    # lifetime 1 trains p0 p1 (checkpointed), then p2 (not checkpointed) and produces p3;
    # the restart discards p2 and p3: lifetime 2 produces them again (regenerated)
    first = _life("p0 p1 p2 p3", "p0 p1 p2", "p0 p1")
    last = _life("p2 p3 p4 p5", "p2 p3", "p0 p1 p2 p3", left="p4 p5", finished=True)
    acc = account_samples([first, last])
    assert acc.ok, acc.problems
    assert (acc.produced, acc.consumed, acc.regenerated, acc.left, acc.returned) == (6, 4, 2, 2, 0)
    # discarded with a restart and not made again before the end: back to the source
    last = _life("p2 p4", "p2 p4", "p0 p1 p2 p4", left="", finished=True)
    acc = account_samples([first, last])
    assert acc.ok and acc.returned == 1  # p3


def test_per_id_accounting_names_lost_and_duplicated_ids() -> None:
    # the last driver produced p4 and neither trained it nor held it at the end
    acc = account_samples([_life("p0 p1 p4", "p0 p1", "p0 p1", left="", finished=True)])
    assert not acc.ok and acc.lost == ("p4",)
    assert any("lost" in p and "p4" in p for p in acc.problems)
    # p1 checkpointed as trained by lifetime 1, produced and trained again by lifetime 2
    first = _life("p0 p1", "p0 p1", "p0 p1")
    last = _life("p1 p2", "p1 p2", "p0 p1 p1 p2", left="", finished=True)
    acc = account_samples([first, last])
    assert not acc.ok and acc.duplicated == ("p1",)
    # a sample lost by a driver that was NOT restarted (only one lifetime, no left list)
    acc = account_samples([_life("p0 p1", "p0", "p0", finished=True)])
    assert not acc.ok and "did not report" in " ".join(acc.problems)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(300)
async def test_soak_catches_one_sample_dropped_when_the_queue_actor_is_replaced(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutation: the queue replacement silently drops one sample (journal and counters
    adjusted, so the queue's own counters still add up); the soak fails naming it."""
    dropped: list[str] = []
    state_dict = RayQueue.state_dict

    def dropping(self: RayQueue) -> dict[str, Any]:
        state = state_dict(self)
        if state["items"] and not dropped:
            victim = state["items"].pop(0)
            dropped.append(str(victim.sample_id))
            self._journal.pop(dropped[0], None)
            state["produced"] -= 1
        return state

    monkeypatch.setattr(RayQueue, "state_dict", dropping)
    kinds = ("queue_restart", "kill_standalone")
    report = await asyncio.wait_for(
        run_chaos_soak(
            3,
            10,
            name="chaos-mut",
            kinds=kinds,
            faults_per_10_steps=3,
            checkpoint_dir=str(tmp_path),
            # a slow trainer keeps samples buffered when the queue actor is killed
            options={"trainer_step_time_s": 0.15},
        ),
        240,
    )
    assert dropped, "the queue was empty at every replacement: nothing was dropped"
    assert not report.ok
    assert report.samples["lost_ids"] == dropped
    assert any("lost" in f and dropped[0] in f for f in report.failures), report.failures


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(400)
async def test_same_seed_replays_the_same_faults_across_driver_restarts(tmp_path: Any) -> None:
    """Faults due right after a driver restart are deferred, not dropped: two runs of one
    seed execute the same (kind, step) list, the schedule's, with per-id accounting."""
    kinds = ("driver_restart", "kill_standalone", "queue_restart")
    runs = []
    for i in range(2):
        report = await asyncio.wait_for(
            run_chaos_soak(
                11,
                14,
                name=f"chaos-replay{i}",
                kinds=kinds,
                faults_per_10_steps=5,
                checkpoint_dir=str(tmp_path / str(i)),
            ),
            180,
        )
        assert report.ok, report.failures
        assert report.segments >= 2 and report.samples["lost"] == 0
        assert report.samples["consumed"] == 14 * 2
        runs.append(report)
    a, b = runs
    assert a.schedule == b.schedule
    assert a.executed_faults == b.executed_faults == [(f["kind"], f["step"]) for f in a.schedule]
    assert len(a.executed_faults) == len(
        ChaosSchedule.generate(11, 14, faults_per_10_steps=5, kinds=kinds).faults
    )
