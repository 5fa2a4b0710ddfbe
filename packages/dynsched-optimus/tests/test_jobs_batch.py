"""Goodput batches for real jobs (issue 30): the job file's batch fields, the in-place
switch the ranks agree on, and the goodput record ``optimus+`` chooses batches from."""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from dynsched_optimus import InputFileError, JobPlacement
from dynsched_optimus.jobs import (
    GRAD_WINDOW,
    ContextOptions,
    JobContext,
    JobRecord,
    JobSpec,
    agreed_batch,
    load_job_file,
    make_decider,
    observe_record,
    progress_by_step,
    run_local,
)
from dynsched_optimus.scheduler import AdaptiveBatch, CompletionRule, make_optimus
from hypothesis import given
from hypothesis import strategies as st

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "optimus_jobs"
#: bound of one collective of the two-rank tests (far above a step of a few microseconds)
WAIT_S = 30.0
BASE = "name: a\nscript: train.py\nbatch_size: 32\ncompletion: {target_loss: 0.1}\n"


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "train.py").write_text("pass\n")
    p = tmp_path / "job.yaml"
    p.write_text(textwrap.dedent(text))
    return p


# ---------------------------------------------------------------- the job file


def test_a_job_file_with_a_batch_range_becomes_a_spec(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        BASE + "adaptive_batch: {max_batch: 256, min_local: 16, max_local: 64}\n"
        "batch_change: in_place\n",
    )
    spec = load_job_file(p)
    assert spec.adaptive_batch == AdaptiveBatch(32, 256, min_local=16, max_local=64)
    assert spec.batch_change == "in_place" and spec.max_workers == 256 // 16
    assert load_job_file(p).to_dict() == spec.to_dict()
    plain = load_job_file(_write(tmp_path, BASE))
    assert plain.adaptive_batch is None and plain.batch_change == "restart"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("batch_change: later\n", "field 'batch_change' must be one of ['restart', 'in_place']"),
        ("adaptive_batch: 64\n", "field 'adaptive_batch' must be a mapping of ['init_batch'"),
        ("adaptive_batch: {max: 64}\n", "field 'adaptive_batch': unknown ['max']; allowed"),
        ("adaptive_batch: {min_local: 4}\n", "field 'adaptive_batch.max_batch' is required"),
        ("adaptive_batch: {max_batch: yes}\n", "field 'adaptive_batch.max_batch' must be a num"),
        (
            "adaptive_batch: {max_batch: 16}\n",
            "field 'adaptive_batch.max_batch' (16.0) must be >= init_batch (32.0)",
        ),
        (
            "adaptive_batch: {max_batch: 64, init_batch: 48}\n",
            "field 'batch_size' (32) must lie in adaptive_batch's [init_batch, max_batch]",
        ),
        (
            "adaptive_batch: {max_batch: 64, min_local: 8, max_local: 4}\n",
            "field 'adaptive_batch.max_local' (4.0) must be >= min_local (8.0)",
        ),
        (
            "adaptive_batch: {max_batch: 64, min_local: 0}\n",
            "field 'adaptive_batch.min_local' must be finite and > 0",
        ),
        (
            "adaptive_batch: {max_batch: 64}\nmax_workers: 4\n",
            "field 'max_workers' (4) must be >= adaptive_batch's max_batch // min_local (64)",
        ),
    ],
)
def test_bad_batch_fields_are_one_line_naming_the_field(
    tmp_path: Path, extra: str, needle: str
) -> None:
    p = _write(tmp_path, BASE + extra)
    with pytest.raises(InputFileError) as info:
        load_job_file(p)
    msg = str(info.value)
    assert needle in msg and msg.startswith(str(p)) and "\n" not in msg


def test_a_batch_range_needs_a_loss_target(tmp_path: Path) -> None:
    body = BASE.replace("{target_loss: 0.1}", "{steps: 10}") + "adaptive_batch: {max_batch: 64}\n"
    with pytest.raises(InputFileError, match="field 'adaptive_batch' needs completion"):
        load_job_file(_write(tmp_path, body))


# ------------------------------------------------------- the in-place switch


class _Rank:
    """One rank's host: it is asked for batch ``asks[k]`` from step ``k`` on."""

    def __init__(self, asks: dict[int, int]) -> None:
        self.asks = asks
        self.step = 0
        self.events: list[dict[str, Any]] = []

    def stop_requested(self) -> bool:
        return False

    def requested_batch(self) -> int | None:
        known = [k for k in self.asks if k <= self.step]
        return self.asks[max(known)] if known else None

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)


class _Collective:
    """A sum over two ranks that run in two threads (each call waits for the other)."""

    def __init__(self) -> None:
        self._barrier = threading.Barrier(2, timeout=WAIT_S)
        self._lock = threading.Lock()
        self._parts: list[list[float]] = []
        self._sum: list[float] = []

    def __call__(self, values: list[float]) -> list[float]:
        with self._lock:
            self._parts.append(values)
        if self._barrier.wait() == 0:
            self._sum = [float(sum(v)) for v in zip(*self._parts, strict=True)]
        self._barrier.wait()
        out = list(self._sum)
        if self._barrier.wait() == 0:
            self._parts.clear()
        self._barrier.wait()
        return out


def _run_two_ranks(asks: list[dict[int, int]], steps: int) -> list[list[int]]:
    """Both ranks' batch per step (the batch each step trained with)."""
    reduce = _Collective()
    seen: list[list[int]] = [[], []]
    hosts = [_Rank(a) for a in asks]
    rule = CompletionRule("steps", steps)

    def rank(r: int) -> None:
        opts = ContextOptions("j", r, 2, 16, rule, batch_change="in_place")
        ctx = JobContext(opts, hosts[r], reduce=reduce)
        for s in range(1, steps + 1):
            hosts[r].step = s
            seen[r].append(ctx.batch_size)
            assert ctx.local_batch_size == ctx.batch_size // 2
            ctx.report(step=s, loss=1.0)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * steps)
    assert not any(t.is_alive() for t in threads)
    return seen


@given(
    first=st.tuples(st.integers(1, 8), st.integers(1, 8)),
    second=st.one_of(st.none(), st.tuples(st.integers(9, 14), st.integers(9, 14))),
    batches=st.tuples(st.integers(1, 8), st.integers(1, 8)).map(lambda t: (16 * t[0], 16 * t[1])),
)
def test_two_ranks_switch_batch_at_the_same_step(
    first: tuple[int, int], second: tuple[int, int] | None, batches: tuple[int, int]
) -> None:
    """The service's request reaches each rank at a different step; both ranks switch
    after the first step at which both were asked, and never train a step apart."""
    asks: list[dict[int, int]] = [{first[0]: batches[0]}, {first[1]: batches[0]}]
    if second is not None:
        asks[0][second[0]] = batches[1]
        asks[1][second[1]] = batches[1]
    seen = _run_two_ranks(asks, 16)
    assert seen[0] == seen[1]  # the ranks never disagree on a step's batch
    expected = [16] * 16
    for step, batch in [
        (max(first), batches[0]),
        *([] if second is None else [(max(second), batches[1])]),
    ]:
        expected[step:] = [batch] * (16 - step)  # from the step after both were asked
    assert seen[0] == expected


def test_a_switch_is_an_event_and_a_fixed_job_ignores_requests() -> None:
    host = _Rank({3: 48})
    ctx = JobContext(
        ContextOptions("j", 0, 1, 16, CompletionRule("steps", 9), batch_change="in_place"), host
    )
    for s in range(1, 6):
        host.step = s
        ctx.report(step=s, loss=1.0, samples=ctx.batch_size)
    reports = [e for e in host.events if e["kind"] == "report"]
    assert [e["samples"] for e in reports] == [16, 16, 16, 48, 48]
    assert [e["batch"] for e in reports] == [16, 16, 16, 48, 48]
    assert [e for e in host.events if e["kind"] == "batch"] == [
        {"kind": "batch", "step": 3, "batch": 48, "old": 16}
    ]
    fixed = _Rank({1: 48})
    ctx = JobContext(ContextOptions("j", 0, 1, 16, CompletionRule("steps", 9)), fixed)
    fixed.step = 1
    ctx.report(step=1, loss=1.0)
    assert ctx.batch_size == 16 and not [e for e in fixed.events if e["kind"] == "batch"]


@given(st.lists(st.integers(1, 2**12), min_size=1, max_size=8))
def test_agreement_holds_exactly_when_every_rank_asks_the_same(asked: list[int]) -> None:
    sums = [float(sum(asked)), float(sum(b * b for b in asked))]
    got = agreed_batch(sums, len(asked), current=7)
    assert got == (asked[0] if len(set(asked)) == 1 else 7)


# ------------------------------------------------------------ the goodput record


def test_progress_counts_each_step_once_with_its_efficiency() -> None:
    # steps 1-3 at the initial batch 8, then a restart redoes step 3 at batch 32
    reports = [(1, 8.0, None, None), (2, 8.0, 1.0, 80.0), (3, 8.0, 1.0, 80.0), (3, 32.0, 1.0, 80.0)]
    by_step, stats = progress_by_step(reports, init_batch=8.0)
    assert stats == (1.0, 80.0)
    var_init = 80.0 / 8  # the variance at the initial batch: noise scale 80 examples
    gain4 = (var_init + 1.0) / (var_init / 4 + 1.0)  # one step at 4x the initial batch
    assert by_step == pytest.approx({1: 1.0, 2: 2.0, 3: 2.0 + gain4})
    many = [(s, 8.0, float(s), 0.0) for s in range(1, 3 * GRAD_WINDOW)]
    _, (sqr, var) = progress_by_step(many, 8.0)  # type: ignore[misc]
    assert sqr == pytest.approx(np.mean(range(2 * GRAD_WINDOW, 3 * GRAD_WINDOW))) and var == 0


def _adaptive_spec(**kw: Any) -> JobSpec:
    return JobSpec(
        "g",
        "g.py",
        32,
        completion=CompletionRule("target_metric", 0.1),
        adaptive_batch=AdaptiveBatch(32, 1024, min_local=8, max_local=256),
        batch_change="in_place",
        **kw,
    )


def _goodput_record(grad_var: float) -> JobRecord:
    pl = JobPlacement("g", (0,), (0,), (2,))
    return JobRecord(
        _adaptive_spec(),
        arrival=0.0,
        iterations_done=100,
        loss_points=tuple((float(s), 2.0 / s + 0.05) for s in range(10, 101, 10)),
        throughput={(2, 0, 1, 32.0): (20.0,)},
        placement=pl,
        batch_size=32,
        grad_stats=(1.0, grad_var),
        progress=100.0,
        progress_points=tuple((float(s), 2.0 / s + 0.05) for s in range(10, 101, 10)),
    )


def test_a_record_with_gradient_statistics_is_a_goodput_observation() -> None:
    rec = _goodput_record(grad_var=3200.0)
    obs = observe_record(rec)
    ab = obs.adaptive_batch
    assert ab is not None and (ab.init_batch, ab.max_batch, ab.min_local, ab.max_local) == (
        32.0,
        1024.0,
        8.0,
        256.0,
    )
    assert (ab.grad_sqr, ab.grad_var) == (1.0, 3200.0 / 32)  # the variance at init_batch
    assert ab.progress == 100.0 and ab.progress_points == rec.progress_points
    assert obs.batch_size == 32.0 and obs.max_workers == 1024 // 8
    assert observe_record(attrs.evolve(rec, grad_stats=None)).adaptive_batch.grad_sqr is None  # type: ignore[union-attr]


@pytest.mark.parametrize("scheduler", ["optimus+"])
def test_optimus_plus_returns_a_goodput_batch_for_a_real_job(scheduler: str) -> None:
    cap = np.array([[2.0, 0.0]])
    noisy = make_decider(scheduler)(0.0, [observe_record(_goodput_record(3200.0))], cap, 5.0)
    assert noisy.placements["g"].workers == 2
    batch = noisy.batch_sizes["g"]
    assert 32 < batch <= 1024  # noise scale 3200 examples: a larger batch is efficient
    # the decision is the policy's own (the simulator's code path), batch included
    policy = make_optimus(scheduler)
    want = policy.schedule(0.0, [observe_record(_goodput_record(3200.0))], cap, restart_delay_s=5.0)
    assert dict(want.batch_sizes) == dict(noisy.batch_sizes)
    quiet = make_decider(scheduler)(0.0, [observe_record(_goodput_record(0.01))], cap, 5.0)
    assert quiet.batch_sizes.get("g", 32) < batch  # little noise: a smaller batch
    fixed = make_decider("optimus")(0.0, [observe_record(_goodput_record(3200.0))], cap, 5.0)
    assert fixed.batch_sizes == {}  # optimus keeps every batch (the paper's setting)


def test_the_adaptive_example_reaches_its_target_with_statistics(tmp_path: Path) -> None:
    import torch  # noqa: F401  (the test environment installs it: never skip)

    spec = load_job_file(EXAMPLES / "adaptive.yaml")
    assert spec.adaptive_batch is not None and spec.batch_change == "in_place"
    res = run_local(spec, str(tmp_path))
    losses = [e["loss"] for e in res.reports]
    assert res.finished and np.mean(losses[-5:]) <= spec.completion.value < np.mean(losses[:5])
    assert all(e["grad_sqr"] >= 0 and e["grad_var"] > 0 for e in res.reports)
    early = np.mean([e["grad_var"] / max(e["grad_sqr"], 1e-12) for e in res.reports[:20]])
    late = np.mean([e["grad_var"] / max(e["grad_sqr"], 1e-12) for e in res.reports[-20:]])
    assert late > early  # the gradient noise scale grows as the loss falls
