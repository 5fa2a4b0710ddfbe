"""Optimus on Ray (issue 30): real jobs submitted, scheduled, re-allocated, recovered.

Every test runs the service on the session's local Ray cluster (4 CPUs) with tiny torch
jobs on CPU; waits are bounded loops on the job table, never sleeps against the clock.
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch  # noqa: F401  (the test environment installs it: never skip)
from dynsched_optimus import JobPlacement
from dynsched_optimus.jobs import Decision, JobSpec, load_job_file, silent_error
from dynsched_optimus.scheduler import CompletionRule

pytestmark = pytest.mark.usefixtures("ray_cluster")

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "optimus_jobs"
#: generous bound of one test's run (a loaded 2-core machine starts actors slowly)
BOUND_S = 300.0

PROBE = """
import json, os, time
import torch
from dynsched_optimus import jobs

def flat(model):
    return [float(x) for p in model.parameters() for x in p.detach().flatten()]

ctx = jobs.context()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
out = ctx.args["out"]
state = ctx.restore()
step = 0
if state is not None:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    step = int(state["step"])
    if ctx.rank == 0:
        json.dump(flat(model), open(f"{out}/restored-{step}-w{ctx.world_size}.json", "w"))
net = torch.nn.parallel.DistributedDataParallel(model) if ctx.world_size > 1 else model
w_true = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
while not ctx.should_stop():
    step += 1
    g = torch.Generator().manual_seed(step * 1000 + ctx.rank)
    x = torch.randn(ctx.local_batch_size, 4, generator=g)
    loss = torch.nn.functional.mse_loss(net(x), x @ w_true.T)
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(float(ctx.args.get("sleep", 0.0)))
    ctx.report(step=step, loss=loss.item(), samples=ctx.batch_size)
    if ctx.should_checkpoint():
        ctx.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()})
        if ctx.rank == 0:
            json.dump(flat(model), open(f"{out}/saved-{step}.json", "w"))
    gate = ctx.args.get("gate")
    if gate and step == int(ctx.args["gate_step"]):  # wait here until the test opens the gate
        end = time.monotonic() + 300
        while not os.path.exists(gate) and time.monotonic() < end:
            time.sleep(0.05)
"""


def _probe(tmp_path: Path, name: str, steps: int, **kw: Any) -> JobSpec:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = tmp_path / name
    out.mkdir()
    args = {"out": str(out), "sleep": kw.pop("sleep", 0.02)}
    return JobSpec(
        name, str(script), 16, completion=CompletionRule("steps", steps), args=args, **kw
    )


def _service(tmp_path: Path, lines: list[str], **kw: Any) -> Any:
    from dynsched_ray.optimus import JobStore, OptimusService, ServiceOptions

    store = kw.pop("store", None) or JobStore(tmp_path / "jobs.sqlite")
    opts = ServiceOptions(
        scheduler=kw.pop("scheduler", "optimus+"),
        interval_s=kw.pop("interval_s", 1.0),
        checkpoint_root=str(tmp_path / "ck"),
        poll_s=0.2,
    )
    return OptimusService(store, opts, on_line=lines.append, **kw)


def _workers(n: int) -> Callable[..., Decision]:
    """A scripted decider: every job on node 0 with ``n(job)`` workers."""

    def decide(now: float, obs: Any, cap: Any, delay: float) -> Decision:
        return Decision({o.job_id: JobPlacement(o.job_id, (0,), (0,), (n,)) for o in obs})

    return decide


def _step_until(service: Any, done: Callable[[], bool]) -> None:
    end = time.monotonic() + BOUND_S
    while not done():
        assert time.monotonic() < end, "bound passed"
        service.step()
        time.sleep(0.2)


def _state(store: Any, name: str) -> Any:
    return next(r for r in store.jobs() if r.name == name)


def _resumed_exactly(out: Path) -> list[int]:
    """Steps restored from, each with parameters equal to those saved at that step."""
    steps = []
    for f in sorted(out.glob("restored-*.json")):
        step = int(f.name.split("-")[1])
        assert json.loads(f.read_text()) == json.loads((out / f"saved-{step}.json").read_text())
        steps.append(step)
    return steps


def _continues_from(store: Any, name: str, steps: list[int]) -> None:
    """Nothing lost, nothing redone from scratch: the reported steps cover 1..last with no
    gap, step 1 ran once, and the run after each restart began at the checkpoint's next
    step (a report of ``s + 1`` after the checkpoint ``s`` was indexed)."""
    seq = [s for s, _ in store.losses(name)]
    assert set(seq) == set(range(1, max(seq) + 1)) and seq.count(1) == 1
    for s in steps:
        assert s + 1 in seq


def test_a_submitted_job_runs_to_its_loss_target(tmp_path: Path) -> None:
    from dynsched_ray.optimus import status_lines

    lines: list[str] = []
    service = _service(tmp_path, lines)
    spec = load_job_file(EXAMPLES / "mlp.yaml")
    service.store.submit(spec)
    assert service.run(timeout_s=BOUND_S)
    row = _state(service.store, "mlp")
    assert row.state == "finished" and row.error is None and row.started is not None
    losses = [v for _, v in service.store.losses("mlp")]
    assert sum(losses[-5:]) / 5 <= spec.completion.value < sum(losses[:5]) / 5
    assert service.store.last_speed("mlp") is not None  # throughput measured
    assert service.decisions >= 1 and not service.groups
    assert any(
        line.startswith("mlp ") and "finished" in line for line in status_lines(service.store)
    )


def test_a_resize_continues_from_the_checkpoint(tmp_path: Path) -> None:
    lines: list[str] = []
    grow = {"n": 1}

    def decide(now: float, obs: Any, cap: Any, delay: float) -> Decision:
        if any(o.iterations_done >= 30 for o in obs):
            grow["n"] = 2
        return _workers(grow["n"])(now, obs, cap, delay)

    service = _service(tmp_path, lines, decider=decide, interval_s=0.5)
    service.store.submit(_probe(tmp_path, "p", 150, workers=1, max_workers=2))
    assert service.run(timeout_s=BOUND_S)
    row = _state(service.store, "p")
    assert row.state == "finished" and row.restarts == 1
    steps = _resumed_exactly(tmp_path / "p")
    assert len(steps) == 1 and (tmp_path / "p" / f"restored-{steps[0]}-w2.json").is_file()
    _continues_from(service.store, "p", steps)
    assert any("re-allocated from 1 worker(s) to 2 worker(s)" in s for s in lines)
    rec = service.store.record(row)
    assert {k[0] for k in rec.throughput} == {1, 2}  # speed measured at both sizes


def test_a_restarted_service_resumes_every_job(tmp_path: Path) -> None:
    from dynsched_ray.optimus import JobStore

    lines: list[str] = []
    service = _service(tmp_path, lines, decider=_workers(1))
    gate = tmp_path / "gate"
    for name in ("a", "b"):
        spec = _probe(tmp_path, name, 300, checkpoint_every=20)
        args = {**spec.args, "gate": str(gate), "gate_step": 25}
        service.store.submit(attrs.evolve(spec, args=args))
    # each job waits at step 25 (after its checkpoint at 20) until the gate opens, so both
    # are running when the service goes away, however slowly either started
    _step_until(service, lambda: all(service.store.latest_checkpoint(n) for n in ("a", "b")))
    service.shutdown()  # the service goes away with its workers; the table stays
    service.store.close()
    gate.touch()
    again = _service(tmp_path, lines, decider=_workers(1), store=JobStore(tmp_path / "jobs.sqlite"))
    assert sum("resumed from its last checkpoint" in s for s in lines) == 2
    assert again.run(timeout_s=BOUND_S)
    for name in ("a", "b"):
        row = _state(again.store, name)
        assert row.state == "finished" and row.restarts == 1
        steps = _resumed_exactly(tmp_path / name)
        assert len(steps) == 1
        _continues_from(again.store, name, steps)


def test_a_worker_killed_mid_step_restarts_its_job_from_the_checkpoint(tmp_path: Path) -> None:
    import ray

    lines: list[str] = []
    service = _service(tmp_path, lines, decider=_workers(2))
    service.store.submit(_probe(tmp_path, "k", 300, workers=2, checkpoint_every=20))
    _step_until(service, lambda: service.store.latest_checkpoint("k") is not None)
    ray.kill(service.groups["k"].actors[1], no_restart=True)
    assert service.run(timeout_s=BOUND_S)
    row = _state(service.store, "k")
    assert row.state == "finished" and row.restarts == 1
    assert any("a worker died" in s for s in lines)
    steps = _resumed_exactly(tmp_path / "k")
    assert len(steps) == 1
    _continues_from(service.store, "k", steps)
    assert max(s for s, _ in service.store.losses("k")) == 300  # nothing lost: it ends


def test_bad_jobs_fail_in_one_line_and_the_others_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dynsched_optimus.cli import main

    lines: list[str] = []
    service = _service(tmp_path, lines)
    raiser = tmp_path / "raiser.py"
    raiser.write_text(
        textwrap.dedent(
            """
            from dynsched_optimus import jobs
            ctx = jobs.context()
            ctx.report(step=1, loss=1.0)
            raise RuntimeError("boom")
            """
        )
    )
    silent = tmp_path / "silent.py"
    silent.write_text(
        "import time\nfrom dynsched_optimus import jobs\njobs.context()\ntime.sleep(60)\n"
    )
    store = service.store
    store.submit(JobSpec("raiser", str(raiser), 8))
    store.submit(JobSpec("silent", str(silent), 8, report_timeout_s=3.0))
    store.submit(load_job_file(EXAMPLES / "mlp.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nscript: raiser.py\nbatch_size: -1\n")
    db = str(tmp_path / "jobs.sqlite")
    assert main(["submit", str(bad), "--db", db]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"dynsched optimus submit: error: {bad}: field 'batch_size' must be an integer >= 1, got -1"
    )
    assert service.run(timeout_s=BOUND_S)
    states = {r.name: (r.state, r.error) for r in store.jobs()}
    assert states == {
        "raiser": ("failed", "RuntimeError: boom (raiser.py, line 5)"),
        "silent": ("failed", silent_error(JobSpec("silent", "s.py", 8, report_timeout_s=3.0))),
        "mlp": ("finished", None),
    }
    assert "job 'raiser' failed: RuntimeError: boom (raiser.py, line 5)" in lines


def test_a_parameter_server_job_runs_over_rpc_on_two_workers(tmp_path: Path) -> None:
    lines: list[str] = []
    service = _service(tmp_path, lines, decider=_workers(2))
    spec = load_job_file(EXAMPLES / "ps.yaml")
    service.store.submit(spec)
    assert service.run(timeout_s=BOUND_S)
    row = _state(service.store, "ps")
    assert (row.state, row.error) == ("finished", None)
    losses = [v for _, v in service.store.losses("ps")]
    assert sum(losses[-5:]) / 5 <= spec.completion.value < sum(losses[:5]) / 5
    assert {k[0] for k in service.store.record(row).throughput} == {2}
