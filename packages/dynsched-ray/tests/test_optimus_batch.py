"""Batch changes of real jobs on Ray (issue 30): in place on the same worker processes
where the job allows it, by a checkpoint-restart otherwise.

The decider is scripted (two workers on node 0 throughout; batch 16, then 32 once the job
has run 20 steps) so that only the service's handling of a new batch is under test; the
scheduler's choice of batches is checked against the simulator in
``test_optimus_service_decision.py``. Waits are bounded loops on the job table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401  (the test environment installs it: never skip)
from dynsched_optimus import JobPlacement
from dynsched_optimus.jobs import Decision, JobSpec
from dynsched_optimus.scheduler import CompletionRule

from .test_optimus_service import BOUND_S, _continues_from, _service, _state, _step_until

pytestmark = pytest.mark.usefixtures("ray_cluster")

#: every rank logs ``step batch local_batch pid`` per step (the batch it trained with)
PROBE = """
import os, time
import torch
from dynsched_optimus import jobs

ctx = jobs.context()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
state = ctx.restore()
step = 0 if state is None else int(state["step"])
if state is not None:
    model.load_state_dict(state["model"])
net = torch.nn.parallel.DistributedDataParallel(model) if ctx.world_size > 1 else model
log = open(os.path.join(ctx.args["out"], f"rank{ctx.rank}.log"), "a")
while not ctx.should_stop():
    step += 1
    x = torch.randn(ctx.local_batch_size, 4)
    loss = torch.nn.functional.mse_loss(net(x), x.sum(dim=1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
    log.write(f"{step} {ctx.batch_size} {len(x)} {os.getpid()}\\n")
    log.flush()
    time.sleep(0.05)
    ctx.report(step=step, loss=loss.item(), samples=ctx.batch_size)
    if ctx.should_checkpoint():
        ctx.save({"step": step, "model": model.state_dict()})
"""
STEPS = 120


def _spec(tmp_path: Path, how: str) -> JobSpec:
    script = tmp_path / "batch_probe.py"
    script.write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    return JobSpec(
        "b",
        str(script),
        16,
        workers=2,
        completion=CompletionRule("steps", STEPS),
        checkpoint_every=10,
        args={"out": str(out)},
        batch_change=how,
    )


def _decide(now: float, obs: Any, cap: Any, delay: float) -> Decision:
    """Two workers on node 0; batch 32 once 20 steps are done."""
    out = {o.job_id: JobPlacement(o.job_id, (0,), (0,), (2,)) for o in obs}
    grow = {o.job_id: 32 for o in obs if o.iterations_done >= 20 and o.batch_size != 32}
    return Decision(out, batch_sizes=grow)


def _rank_logs(out: Path) -> list[dict[int, tuple[int, int, int]]]:
    """Per rank: ``step -> (batch, local batch, pid)`` (the last run of a step)."""
    logs = []
    for rank in (0, 1):
        rows = [line.split() for line in (out / f"rank{rank}.log").read_text().splitlines()]
        logs.append({int(s): (int(b), int(n), int(p)) for s, b, n, p in rows})
    return logs


def _run(tmp_path: Path, how: str) -> tuple[Any, list[str], list[int]]:
    """Run the probe under the scripted decider; returns the service, its lines and the
    worker pids of its first run."""
    lines: list[str] = []
    service = _service(tmp_path, lines, decider=_decide, interval_s=0.5)
    service.store.submit(_spec(tmp_path, how))
    _step_until(service, lambda: "b" in service.groups and bool(service.groups["b"].pids))
    first = list(service.groups["b"].pids)
    assert service.run(timeout_s=BOUND_S)
    return service, lines, first


def test_an_in_place_job_gets_a_new_batch_on_the_same_workers(tmp_path: Path) -> None:
    service, lines, first = _run(tmp_path, "in_place")
    store = service.store
    row = _state(store, "b")
    assert row.state == "finished" and row.restarts == 0 and row.batch == 32
    [(at, old, new, how)] = store.batch_changes("b")
    assert (old, new, how) == (16, 32, "in_place") and at >= 20
    assert service.in_place_changes == 1 and service.reallocations == 0
    assert any(f"batch 16 -> 32 in place after step {at}" in s for s in lines)
    # the steps went on (each once), the reports carry the new sample count from at + 1
    samples = store.samples("b")
    assert [s for s, _ in samples] == list(range(1, STEPS + 1))
    assert [n for _, n in samples] == [16] * at + [32] * (STEPS - at)
    # both ranks trained every step with the same batch, on the processes they started on
    r0, r1 = _rank_logs(tmp_path / "out")
    assert [v[:2] for v in r0.values()] == [v[:2] for v in r1.values()]
    assert [r0[s][:2] for s in sorted(r0)] == [(16, 8)] * at + [(32, 16)] * (STEPS - at)
    assert sorted({r0[s][2] for s in r0} | {r1[s][2] for s in r1}) == sorted(first)


def test_a_restart_job_restarts_with_the_new_batch(tmp_path: Path) -> None:
    service, lines, first = _run(tmp_path, "restart")
    store = service.store
    row = _state(store, "b")
    assert row.state == "finished" and row.restarts == 1 and row.batch == 32
    [(at, old, new, how)] = store.batch_changes("b")
    assert (old, new, how) == (16, 32, "restart") and service.in_place_changes == 0
    assert any("re-allocated from 2 worker(s) to 2 worker(s), batch 16 -> 32" in s for s in lines)
    r0, _ = _rank_logs(tmp_path / "out")
    resumed = min(s for s in r0 if r0[s][2] not in first)  # the new run's first step
    # recorded at the checkpoint the new run resumed from (it trained with the old batch
    # until it stopped there, after the decision)
    assert at == resumed - 1
    _continues_from(store, "b", [resumed - 1])
    assert [r0[s][:2] for s in sorted(r0)] == [(16, 8)] * (resumed - 1) + [(32, 16)] * (
        STEPS - resumed + 1
    )
    last = dict(store.samples("b"))  # the last report of each step
    assert [last[s] for s in sorted(last)] == [16] * (resumed - 1) + [32] * (STEPS - resumed + 1)
