"""``dynsched optimus`` sub-commands on user files, and their error messages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from dynsched_optimus import StepTimeModel, plan_sampling
from dynsched_optimus.cli import main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _loss_csv(tmp_path: Path) -> Path:
    ks = np.arange(1, 3001, 20)
    loss = 2.0 / (1e-3 * ks + 1) + 0.3
    path = tmp_path / "loss.csv"
    path.write_text("step,loss\n" + "".join(f"{k},{v}\n" for k, v in zip(ks, loss, strict=True)))
    return path


def test_fit_convergence(tmp_path: Path, capsys) -> None:
    rc, out, _ = _run(
        capsys, "fit", "convergence", str(_loss_csv(tmp_path)), "--json", "--bootstrap", "16"
    )
    assert rc == 0
    res = json.loads(out)
    assert res["model"] == "convergence" and res["n_points"] > 10
    assert res["remaining_low"] <= res["remaining_high"]
    rc, out, _ = _run(capsys, "fit", "convergence", str(_loss_csv(tmp_path)), "--bootstrap", "8")
    assert rc == 0 and "remaining steps from 2981" in out


def test_fit_convergence_reports_a_learning_rate_decay(tmp_path: Path, capsys) -> None:
    ks = np.arange(1, 6001, 20)
    loss = np.where(ks < 3000, 2.0 / (1e-3 * ks + 1) + 0.5, 0.6 / (1e-3 * (ks - 3000) + 1) + 0.1)
    path = tmp_path / "decay.csv"
    path.write_text("step,loss\n" + "".join(f"{k},{v}\n" for k, v in zip(ks, loss, strict=True)))
    rc, out, _ = _run(capsys, "fit", "convergence", str(path), "--bootstrap", "8")
    assert rc == 0
    lines = out.splitlines()
    assert lines[2] == "learning-rate decay detected at step 3041: fit restarted"
    assert lines[3].startswith("remaining steps from 5981: ")
    rc, out, _ = _run(capsys, "fit", "convergence", str(path), "--json", "--bootstrap", "8")
    res = json.loads(out)
    assert res["lr_decay_step"] == 3041 and res["origin_step"] == 3001
    rc, out, _ = _run(capsys, "fit", "convergence", str(path), "--no-decay", "--bootstrap", "8")
    assert rc == 0 and "decay" not in out


def test_fit_speed_forms(tmp_path: Path, capsys) -> None:
    job = StepTimeModel(mode="sync", batch=256)
    cfgs = plan_sampling(8, max_ps=8, max_workers=8)
    path = tmp_path / "speed.json"
    path.write_text(
        json.dumps([{"ps": p, "workers": w, "speed": float(job.speed(p, w))} for p, w in cfgs])
    )
    rc, out, _ = _run(capsys, "fit", "sync", str(path), "--global-batch", "256", "--json")
    assert rc == 0
    res = json.loads(out)
    assert np.allclose(res["theta"], job.theta(), rtol=1e-4)
    rc, _out, err = _run(capsys, "fit", "sync", str(path))
    assert rc == 2 and "--global-batch" in err
    rc, out, _ = _run(capsys, "fit", "async", str(path))
    assert rc == 0 and "fit error" in out


def test_fit_allreduce_on_pollux_style_files(tmp_path: Path, capsys) -> None:
    lines = ["placement,local_bsz,step_time,sync_time"]
    for pl in ("1", "2", "4", "11", "22", "44", "1111", "2222", "4444"):
        g = sum(int(c) for c in pl)
        for b in (16, 32, 64):
            t = 0.01 + 0.002 * b + (0.02 * len(pl) if g > 1 else 0)
            lines.append(f"{pl},{b},{t},0.0")
    path = tmp_path / "placements.csv"
    path.write_text("\n".join(lines) + "\n")
    rc, out, _ = _run(capsys, "fit", "allreduce", str(path), "--json")
    assert rc == 0 and json.loads(out)["n_points"] == 27


def _alloc_file(tmp_path: Path) -> Path:
    data = {
        "resources": ["cpu", "memory"],
        "capacity": {"cpu": 40, "memory": 160},
        "jobs": [
            {
                "id": f"j{i}",
                "remaining_steps": 5000 * (i + 1),
                "speed": {
                    "mode": "sync",
                    "theta": [0.002, 0.1, 0.2, 0.01, 0.01],
                    "global_batch": 128,
                },
                "ps_demand": [2, 4],
                "worker_demand": {"cpu": 2, "memory": 8},
            }
            for i in range(3)
        ],
    }
    path = tmp_path / "alloc.json"
    path.write_text(json.dumps(data))
    return path


def test_allocate(tmp_path: Path, capsys) -> None:
    rc, out, _ = _run(capsys, "allocate", str(_alloc_file(tmp_path)), "--json")
    assert rc == 0
    res = json.loads(out)
    assert set(res["tasks"]) == {"j0", "j1", "j2"}
    assert res["used"][0] <= 40
    rc, out, _ = _run(capsys, "allocate", str(_alloc_file(tmp_path)), "--method", "reference")
    assert rc == 0 and "used: cpu=" in out


def test_place(tmp_path: Path, capsys) -> None:
    data = {
        "resources": ["cpu"],
        "nodes": {"count": 3, "capacity": [8]},
        "jobs": [{"id": "a", "ps": 2, "workers": 10, "ps_demand": [1], "worker_demand": [1]}],
        "previous": {},
    }
    path = tmp_path / "place.json"
    path.write_text(json.dumps(data))
    rc, out, _ = _run(capsys, "place", str(path), "--json")
    assert rc == 0
    res = json.loads(out)
    assert res["placements"]["a"]["nodes"] == [0, 1]
    assert res["placements"]["a"]["ps_per_node"] == [1, 1]
    rc, out, _ = _run(capsys, "place", str(path))
    assert rc == 0 and "0(1/5) 1(1/5)" in out


def test_place_shrink(tmp_path: Path, capsys) -> None:
    data = {
        "resources": ["cpu"],
        "nodes": [[4], [4], [1]],
        "jobs": [{"id": "b", "ps": 1, "workers": 8, "ps_demand": [1], "worker_demand": [1]}],
    }
    path = tmp_path / "frag.json"
    path.write_text(json.dumps(data))
    rc, out, _ = _run(capsys, "place", str(path))
    assert rc == 0 and "unplaced: b" in out
    rc, out, _ = _run(capsys, "place", str(path), "--shrink", "--json")
    assert rc == 0 and json.loads(out)["shrunk"] == {"b": [1, 7]}
    # the fill fallback places all 9 tasks: 4 + 4 workers, the PS on the 1-CPU server
    rc, out, _ = _run(capsys, "place", str(path), "--fill", "--json")
    res = json.loads(out)
    assert rc == 0 and not res["unplaced"]
    assert res["placements"]["b"]["nodes"] == [0, 1, 2]
    assert res["placements"]["b"]["workers_per_node"] == [4, 4, 0]
    assert res["placements"]["b"]["ps_per_node"] == [0, 0, 1]
    rc, out, _ = _run(capsys, "place", str(path), "--strategy", "spread", "--json")
    res = json.loads(out)
    assert rc == 0 and not res["unplaced"]
    assert sum(res["placements"]["b"]["workers_per_node"]) == 8


def test_paa(tmp_path: Path, capsys) -> None:
    rc, out, _ = _run(capsys, "paa", "--model", "resnet50", "--ps", "10", "--json")
    assert rc == 0
    res = {r["method"]: r for r in json.loads(out)["results"]}
    assert res["paa"]["blocks_split"] == 0 and res["paa"]["total_requests"] == 157
    blocks = tmp_path / "blocks.csv"
    blocks.write_text("name,size\nw1,1000\nw2,300\nb,10\n")
    rc, out, _ = _run(capsys, "paa", "--blocks", str(blocks), "--ps", "2", "--method", "paa")
    assert rc == 0 and "3 blocks, 1,310 parameters, 2 PS" in out
    rc, _out, err = _run(capsys, "paa", "--ps", "2")
    assert rc == 2 and "exactly one of --model and --blocks" in err


@pytest.mark.parametrize(
    ("name", "content", "args", "expected"),
    [
        (
            "loss.csv",
            "step,loss\n1,1.0\n2,oops\n3,0.5\n",
            ("fit", "convergence"),
            "loss.csv:3: field 'loss': not a number: 'oops'",
        ),
        ("loss.csv", "step,value\n1,1.0\n", ("fit", "convergence"), "missing column(s) ['loss']"),
        (
            "loss.csv",
            "step,loss\n1,1.0\n2,-1\n3,0.5\n",
            ("fit", "convergence"),
            "loss.csv:3: field 'loss': must be > 0",
        ),
        ("loss.csv", "step,loss\n1,1.0\n", ("fit", "convergence"), "at least 3 points"),
        (
            "s.csv",
            "ps,workers,speed\n1,1,1.0\n1.5,2,1.0\n",
            ("fit", "async"),
            "s.csv:3: field 'ps': not an integer: '1.5'",
        ),
        ("s.csv", "ps,workers,speed\n1,1,1.0\n2,2,1.0\n", ("fit", "async"), "at least 4"),
        (
            "a.json",
            '{"capacity": [1, 2, 3, 4], "jobs": [{"id": "x"}]}',
            ("allocate",),
            "field 'jobs[0].speed': missing",
        ),
        (
            "a.json",
            '{"capacity": [1, 2], "jobs": []}',
            ("allocate",),
            "field 'capacity': expected 4 values",
        ),
        (
            "a.json",
            '{"capacity": [1, 2, 3, 4],\n "jobs": [}',
            ("allocate",),
            "a.json:2: invalid JSON",
        ),
        (
            "p.json",
            '{"resources": ["cpu"], "nodes": {"count": 2, "capacity": [4]}, '
            '"jobs": [{"id": "a", "ps": -1, "workers": 1, "ps_demand": [1], "worker_demand": [1]}]}',
            ("place",),
            "field 'jobs[0].ps': must be an integer >= 0",
        ),
        (
            "p.json",
            '{"resources": ["cpu"], "nodes": [[4], ["x"]], "jobs": []}',
            ("place",),
            "field 'nodes[1]': cpu must be a number >= 0",
        ),
        (
            "b.csv",
            "name,size\nw,12\nv,0\n",
            ("paa", "--ps", "2", "--blocks"),
            "b.csv:3: field 'size': must be > 0",
        ),
    ],
)
def test_malformed_input_names_file_line_and_field(
    tmp_path: Path, capsys, name, content, args, expected
) -> None:
    path = tmp_path / name
    path.write_text(content)
    rc, out, err = _run(capsys, *args, str(path))
    assert rc == 2, out
    assert expected in err
    assert err.startswith("dynsched optimus ")


def test_missing_file(tmp_path: Path, capsys) -> None:
    rc, _out, err = _run(capsys, "fit", "convergence", str(tmp_path / "nope.csv"))
    assert rc == 2 and "nope.csv: no such file" in err


def test_registered_in_the_dynsched_dispatcher(tmp_path: Path, capsys) -> None:
    from dynsched_core.cli import main as dynsched_main

    rc = dynsched_main(["optimus", "paa", "--model", "vgg16", "--ps", "4", "--method", "paa"])
    out, _ = capsys.readouterr()
    assert rc == 0 and "32 blocks" in out
