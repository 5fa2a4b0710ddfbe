"""The job contract (dynsched_optimus.jobs): job files, the context, local runs, records."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dynsched_optimus import InputFileError, JobPlacement, OptimusError
from dynsched_optimus.jobs import (
    ContextOptions,
    JobContext,
    JobContractError,
    JobRecord,
    JobSpec,
    context,
    load_job_file,
    make_decider,
    observe_record,
    run_local,
)
from dynsched_optimus.scheduler import CompletionRule
from hypothesis import given
from hypothesis import strategies as st

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "optimus_jobs"


def _write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    (tmp_path / "train.py").write_text("pass\n")
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_a_job_file_becomes_a_spec(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        """
        name: a
        script: train.py
        batch_size: 32
        workers: 2
        max_workers: 4
        completion: {target_loss: 0.1}
        resources: {CPU: 2, GPU: 1}
        args: {lr: 0.1}
        """,
    )
    spec = load_job_file(p)
    assert spec.script == str((tmp_path / "train.py").resolve())
    assert (spec.workers, spec.max_workers, spec.batch_size) == (2, 4, 32)
    assert spec.completion == CompletionRule("target_metric", 0.1)
    assert spec.resources == (2.0, 1.0) and spec.args == {"lr": 0.1}
    assert load_job_file(p).to_dict() == spec.to_dict()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("script: train.py\nbatch_size: 8\n", "field 'name' is required"),
        (
            "name: a\nscript: train.py\nbatch_size: 0\n",
            "field 'batch_size' must be an integer >= 1",
        ),
        ("name: a\nscript: nope.py\nbatch_size: 8\n", "field 'script': no such file"),
        ("name: a\nscript: train.py\nbatch_size: 8\ncolour: red\n", "unknown field(s) ['colour']"),
        (
            "name: a\nscript: train.py\nbatch_size: 8\ncompletion: {epochs: 3}\n",
            "field 'completion' must be one of ['steps', 'target_loss']",
        ),
        (
            "name: a\nscript: train.py\nbatch_size: 8\nresources: {TPU: 1}\n",
            "field 'resources': unknown ['TPU']",
        ),
        (
            "name: a\nscript: train.py\nbatch_size: 8\nworkers: 3\nmax_workers: 2\n",
            "field 'max_workers' must be >= workers",
        ),
        ("name: a b\nscript: train.py\nbatch_size: 8\n", "field 'name' must be"),
        ("name: [a\n", "YAML syntax error"),
        ("- 1\n", "must hold a mapping"),
    ],
)
def test_a_malformed_job_file_is_one_line(tmp_path: Path, body: str, needle: str) -> None:
    p = _write(tmp_path, body)
    with pytest.raises(InputFileError) as info:
        load_job_file(p)
    msg = str(info.value)
    assert needle in msg and msg.startswith(str(p)) and "\n" not in msg


class _Control:
    def __init__(self) -> None:
        self.stop = False
        self.events: list[dict[str, Any]] = []

    def stop_requested(self) -> bool:
        return self.stop

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def _ctx(tmp_path: Path, rule: CompletionRule, **kw: Any) -> tuple[JobContext, _Control]:
    ctl = _Control()
    opts = ContextOptions("j", 0, 1, 8, rule, checkpoint_dir=str(tmp_path), **kw)
    return JobContext(opts, ctl), ctl


def _loop(ctx: JobContext, ctl: _Control, losses: list[float], stop_at: int | None) -> int:
    """The contract's loop on given losses; returns the step it ended at."""
    step = 0
    while not ctx.should_stop():
        step += 1
        ctl.stop = stop_at is not None and step >= stop_at
        ctx.report(step=step, loss=losses[(step - 1) % len(losses)])
        if ctx.should_checkpoint():
            ctx.save({"step": step, "w": float(step)})
    return step


@given(
    st.integers(1, 60),
    st.one_of(st.none(), st.integers(1, 80)),
    st.integers(1, 20),
)
def test_a_job_stops_only_done_or_checkpointed(
    tmp_path_factory: pytest.TempPathFactory, n: int, stop_at: int | None, every: int
) -> None:
    tmp = tmp_path_factory.mktemp("ctx")
    ctx, ctl = _ctx(tmp, CompletionRule("steps", n), checkpoint_every=every)
    end = _loop(ctx, ctl, [1.0], stop_at)
    saved = [e["step"] for e in ctl.events if e["kind"] == "checkpoint"]
    assert saved == sorted(set(saved))
    assert all(s % every == 0 or s == end for s in saved)
    if stop_at is None or stop_at >= n:
        assert end == n and ctx.finished and not ctx.stopped_early
    else:  # asked to stop: it checkpoints the step it stops at, and a restart resumes there
        assert end == stop_at and saved[-1] == end and ctx.stopped_early
        again, _ = _ctx(tmp, CompletionRule("steps", n), restore_path=ctl.events[-1]["path"])
        assert again.restore() == {"step": end, "w": float(end)} and again.step == end


def test_a_target_loss_is_met_on_the_mean_of_the_last_reports(tmp_path: Path) -> None:
    ctx, ctl = _ctx(tmp_path, CompletionRule("target_metric", 0.5))
    end = _loop(ctx, ctl, [1.0, 1.0, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.0, 0.0], None)
    # windows of 5: mean(1,.4,.4,.4,.4)=.52 at step 6, mean(.4 x5)=.4 at step 7
    assert end == 7 and ctx.finished
    assert [e["step"] for e in ctl.events if e["kind"] == "report"] == list(range(1, 8))


def test_report_averages_the_loss_over_ranks(tmp_path: Path) -> None:
    ctl = _Control()
    opts = ContextOptions("j", 1, 2, 8, CompletionRule("steps", 3), checkpoint_dir=str(tmp_path))
    sums: list[list[float]] = []

    def reduce(values: list[float]) -> list[float]:  # the other rank: loss 3, asks to stop
        sums.append(values)
        return [values[0] + 3.0, values[1] + 1.0]

    ctx = JobContext(opts, ctl, reduce=reduce)
    assert ctx.local_batch_size == 4 and ctx.rank == 1
    assert ctx.report(step=1, loss=1.0) == 2.0
    assert sums == [[1.0, 0.0]] and ctx.should_checkpoint()  # stop agreed: checkpoint now
    assert ctl.events == []  # only rank 0 emits


def test_report_refuses_bad_values(tmp_path: Path) -> None:
    ctx, _ = _ctx(tmp_path, CompletionRule("steps", 3))
    with pytest.raises(JobContractError, match="loss at step 1 is nan"):
        ctx.report(step=1, loss=float("nan"))
    ctx.report(step=2, loss=1.0)
    with pytest.raises(JobContractError, match="step 2 reported after step 2"):
        ctx.report(step=2, loss=1.0)


def test_context_outside_a_job_is_a_clear_error() -> None:
    with pytest.raises(JobContractError, match="outside a dynsched optimus job"):
        context()


@pytest.mark.parametrize("example", ["mlp", "cnn", "ps"])
def test_the_examples_reach_their_loss_target(tmp_path: Path, example: str) -> None:
    import torch  # noqa: F401  (the test environment installs it: never skip)

    spec = load_job_file(EXAMPLES / f"{example}.yaml")
    res = run_local(spec, str(tmp_path))
    losses = [e["loss"] for e in res.reports]
    assert res.finished and spec.completion.kind == "target_metric"
    assert np.mean(losses[-5:]) <= spec.completion.value < np.mean(losses[:5])
    assert res.checkpoints and Path(res.checkpoints[-1]["path"]).is_file()


def _script_spec(tmp_path: Path, body: str, **kw: Any) -> JobSpec:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    return JobSpec("s", str(script), 4, **kw)


def test_a_raising_script_is_one_line_naming_its_line(tmp_path: Path) -> None:
    spec = _script_spec(
        tmp_path,
        """
        from dynsched_optimus import jobs
        ctx = jobs.context()
        ctx.report(step=1, loss=1.0)
        raise RuntimeError("out of data")
        """,
    )
    with pytest.raises(JobContractError) as info:
        run_local(spec, str(tmp_path / "ck"))
    assert str(info.value) == "job 's': RuntimeError: out of data (job.py, line 5)"


def test_a_silent_job_fails_with_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    spec = _script_spec(
        tmp_path,
        """
        import time
        from dynsched_optimus import jobs
        jobs.context()
        time.sleep(3)
        """,
        report_timeout_s=0.3,
    )
    with pytest.raises(JobContractError, match=r"sent no report for 0\.3 s \(report_timeout_s\)"):
        run_local(spec, str(tmp_path / "ck"))


def test_a_script_that_returns_early_is_an_error(tmp_path: Path) -> None:
    spec = _script_spec(
        tmp_path,
        "from dynsched_optimus import jobs\njobs.context().report(step=1, loss=1.0)\n",
        completion=CompletionRule("steps", 5),
    )
    with pytest.raises(JobContractError, match="returned at step 1 before the job was done"):
        run_local(spec, str(tmp_path / "ck"))


def test_a_record_becomes_the_observation_the_scheduler_reads() -> None:
    spec = JobSpec("a", "a.py", 64, workers=2, max_workers=4, resources=(1.0, 0.0))
    pl = JobPlacement("a", (0,), (0,), (2,))
    rec = JobRecord(
        spec, 5.0, 120, ((50.0, 1.0), (100.0, 0.5)), {(2, 0, 1, 64.0): (3.0, 5.0)}, 1, pl
    )
    obs = observe_record(rec)
    assert (obs.kind, obs.requested_workers, obs.max_workers, obs.arrival) == (
        "allreduce",
        2,
        4,
        5.0,
    )
    assert obs.worker_demand == (1.0, 0.0) and obs.batch_size == 64.0
    assert obs.measured(2, 0, 1) == 4.0 and obs.iterations_done == 120
    assert obs.placement == pl and obs.restarts == 1 and obs.completion == spec.completion


def _obs(name: str, arrival: float, workers: int) -> Any:
    return observe_record(JobRecord(JobSpec(name, "x.py", 8, workers=workers), arrival))


def test_fifo_and_drf_on_records() -> None:
    cap = np.array([[4.0, 0.0], [4.0, 0.0]])
    jobs_ = [_obs("late", 2.0, 2), _obs("first", 1.0, 6), _obs("last", 3.0, 1)]
    fifo = make_decider("fifo")(0.0, jobs_, cap, 0.0).placements
    assert {k: v.workers for k, v in fifo.items()} == {"first": 6, "late": 2}
    drf = make_decider("drf")(0.0, jobs_, cap, 0.0).placements
    assert {k: v.workers for k, v in drf.items()} == {"first": 5, "late": 2, "last": 1}
    assert sum(v.workers for v in drf.values()) <= 8


def test_unknown_scheduler_names_the_allowed_ones() -> None:
    with pytest.raises(OptimusError, match=r"scheduler='lifo': allowed values are \["):
        make_decider("lifo")


def _spec_fields() -> tuple[str, ...]:
    from dynsched_optimus.jobs._spec import _FIELDS

    return _FIELDS


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 300),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(
        st.sampled_from(["target_loss", "steps", "CPU", "GPU", "x"]), st.integers(-1, 5)
    ),
)


@given(st.dictionaries(st.sampled_from([*_spec_fields(), "other"]), _VALUES))
def test_any_job_mapping_is_a_spec_or_one_line(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any]
) -> None:
    import json

    d = tmp_path_factory.mktemp("fuzz")
    (d / "train.py").write_text("pass\n")
    p = d / "job.json"
    p.write_text(json.dumps({"name": "a", "script": "train.py", "batch_size": 4, **data}))
    try:
        spec = load_job_file(p)
    except InputFileError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(p))
    else:
        assert json.loads(json.dumps(spec.to_dict()))["name"] == spec.name
