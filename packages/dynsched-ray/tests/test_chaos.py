"""A short seeded chaos run: every fault kind at least once, nothing lost or duplicated."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dynsched_ray import FAULT_KINDS, ChaosFault, ChaosSchedule, run_chaos_soak

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
