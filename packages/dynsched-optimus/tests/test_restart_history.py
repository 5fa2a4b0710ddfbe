"""A running job's restart history prices its next restart (``RestartPlanner(history=...)``,
``optimus+rw``'s default ``"share"``): hand-computed factors and penalties, the direction
of the effect on a two-job case, the variants' defaults and bad values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dynsched_optimus import AllocationJob, JobPlacement, OptimusError, allocate
from dynsched_optimus.scheduler import (
    RESTART_FACTOR_FLOOR,
    RESTART_HISTORIES,
    RW_EXPONENT,
    RW_RESTART_HISTORY,
    CompletionRule,
    JobObservation,
    RestartPlanner,
    Round,
    make_optimus,
    restart_factor,
)
from hypothesis import given
from hypothesis import strategies as st


def test_hand_computed_restart_factors() -> None:
    # 1,000 s old, 5 restarts of 30 s: 150 s lost
    assert restart_factor(1000.0, 5, 30.0, "share") == pytest.approx(850.0 / 1000.0)
    assert restart_factor(1000.0, 5, 30.0, "pollux") == pytest.approx(850.0 / 1030.0)
    assert restart_factor(1000.0, 5, 30.0, "none") == 1.0
    # never restarted: "share" counts nothing lost; Pollux still counts the next restart
    assert restart_factor(1000.0, 0, 30.0, "share") == 1.0
    assert restart_factor(1000.0, 0, 30.0, "pollux") == pytest.approx(1000.0 / 1030.0)
    # younger than one delay: as if the rest of that delay had been a restart
    assert restart_factor(10.0, 0, 30.0, "share") == pytest.approx(10.0 / 30.0)
    # more restarts than its age holds: the floor, not zero (the penalty stays finite)
    assert restart_factor(100.0, 10, 30.0, "share") == RESTART_FACTOR_FLOOR
    assert restart_factor(0.0, 0, 30.0, "pollux") == RESTART_FACTOR_FLOOR


def test_the_pollux_history_is_the_pollux_baselines_factor_floored() -> None:
    from dynsched_optimus.cluster._pollux import restart_factor as baseline_factor

    ages, restarts = np.array([0.0, 10.0, 1000.0, 1000.0, 100.0]), np.array([0, 0, 5, 0, 10])
    want = baseline_factor(ages, restarts, 30.0)
    got = [restart_factor(a, int(r), 30.0, "pollux") for a, r in zip(ages, restarts, strict=True)]
    assert got == [max(float(w), RESTART_FACTOR_FLOOR) for w in want]


def test_an_unknown_history_names_the_field_and_the_allowed_values() -> None:
    with pytest.raises(OptimusError, match=r"history='often': allowed values are \["):
        restart_factor(1.0, 0, 30.0, "often")
    with pytest.raises(OptimusError) as err:
        RestartPlanner(history="often")
    assert str(err.value) == f"history must be one of {list(RESTART_HISTORIES)}, got 'often'"
    with pytest.raises(OptimusError) as err:
        make_optimus("optimus+rw", restart_history="often")
    assert str(err.value) == (
        f"restart_history must be one of {list(RESTART_HISTORIES)}, got 'often'"
    )


@given(
    age=st.floats(0.0, 1e6),
    restarts=st.integers(0, 10_000),
    delay=st.floats(1.0, 600.0),
    history=st.sampled_from(RESTART_HISTORIES),
)
def test_the_factor_is_a_share_and_falls_with_restarts(age, restarts, delay, history) -> None:
    f = restart_factor(age, restarts, delay, history)
    assert RESTART_FACTOR_FLOOR <= f <= 1.0
    assert restart_factor(age, restarts + 1, delay, history) <= f


def _round(now: float, jobs: dict[str, tuple[float, int]]) -> Round:
    """A round at ``now`` of jobs ``job_id -> (arrival, restarts so far)``."""
    obs = {
        jid: JobObservation(
            job_id=jid, kind="allreduce", worker_demand=(1.0,), arrival=arrival, restarts=r
        )
        for jid, (arrival, r) in jobs.items()
    }
    return Round(now, obs, np.array([[8.0]]), 30.0, 0)


def test_hand_computed_penalties() -> None:
    # now 1,000 s; both jobs submitted at 0 and 10,000 s of predicted time left; "often"
    # restarted 5 times (f = 850 / 1000), "calm" never (f = 1).  Base: hysteresis 2 x 30 s.
    # often: extra = 10,000 (1 / 0.85 - 1) = 1,764.7 s -> 2 ** round(10.79) = 2,048 s
    rnd = _round(1000.0, {"often": (0.0, 5), "calm": (0.0, 0)})
    t_now = {"often": 10_000.0, "calm": 10_000.0}
    got = RestartPlanner(hysteresis=2.0, history="share").penalties(rnd, t_now)
    assert got == {"often": 60.0 + 2048.0, "calm": 60.0}
    # without a history every job pays the base, as one number
    assert RestartPlanner(hysteresis=2.0).penalties(rnd, t_now) == 60.0
    # an unknown remaining time (a job the model cannot time) pays the base only
    got = RestartPlanner(hysteresis=2.0, history="share").penalties(rnd, {"often": math.inf})
    assert got == {"often": 60.0}


def _job(jid: str, remaining: float, arrival: float) -> AllocationJob:
    return AllocationJob(
        jid, remaining, lambda p, w: math.sqrt(w), (), (1.0,), kind="allreduce", arrival=arrival
    )


def test_a_job_that_restarts_often_keeps_its_gpus_where_a_calm_one_gives_them_up() -> None:
    # 8 GPUs held by two equal long jobs (4 each, T = 80,000 / 2 = 40,000 s); a short job
    # (100 s of work on 1 GPU) can start only by taking GPUs.  a = 1.5: its start gains
    # 2 / sqrt(100) = 0.2, and a victim's restart is charged as its penalty in seconds of
    # the taker's time (pen * F'(100) = pen / 1000): 0.06 at the base 60 s, 2.1 at the
    # 60 + 2,048 s of test_hand_computed_penalties' "often".
    jobs = [_job("a", 80_000.0, 0.0), _job("b", 80_000.0, 1.0), _job("short", 100.0, 2.0)]
    kw = {
        "method": "incremental",
        "current": {"a": (0, 4), "b": (0, 4)},
        "min_gain": 0.01,
        "utility_exponent": RW_EXPONENT,
        "jct_gains": True,
    }

    def gpus(penalty: float | dict[str, float]) -> dict[str, int]:
        tasks = allocate(jobs, (8.0,), restart_penalty=penalty, **kw).tasks
        return {jid: w for jid, (_p, w) in tasks.items()}

    base = gpus(60.0)
    assert base["short"] >= 1 and base["a"] + base["b"] < 8
    # the priced job keeps more GPUs than the calm one, whichever it is
    a_priced, b_priced = gpus({"a": 2108.0, "b": 60.0}), gpus({"a": 60.0, "b": 2108.0})
    assert a_priced["a"] > a_priced["b"] and b_priced["b"] > b_priced["a"]
    assert a_priced["a"] > base["a"] and b_priced["b"] >= base["b"]
    # both priced: the start does not pay for a restart, the short job waits
    assert gpus({"a": 2108.0, "b": 2108.0}) == {"a": 4, "b": 4, "short": 0}
    # a mapping that gives every running job the base is the scalar penalty, task for task
    assert gpus({"a": 60.0, "b": 60.0}) == base


def test_variant_defaults() -> None:
    assert RW_RESTART_HISTORY == "share"
    assert make_optimus("optimus+rw").restarts == RestartPlanner(2.0, history="share")
    assert make_optimus("optimus+").restarts == RestartPlanner(2.0, history="none")
    assert make_optimus("optimus").restarts == RestartPlanner()
    for variant, history in (("optimus+rw", "none"), ("optimus+", "pollux")):
        got = make_optimus(variant, restart_history=history).restarts.history
        assert got == history


def _running(jid: str, restarts: int) -> JobObservation:
    # 8 of 10 epochs of 100 iterations left, 2 GPUs held since 0; about 1 it/s per GPU:
    # 460 s left on 2 GPUs, 264 s on 4
    return JobObservation(
        job_id=jid,
        kind="allreduce",
        worker_demand=(1.0,),
        requested_workers=8,
        max_workers=8,
        iterations_done=200,
        epochs_done=2,
        throughput={(1, 0, 1): (1.0,), (2, 0, 1): (1.74,), (4, 0, 1): (3.03,)},
        completion=CompletionRule("epochs", 10),
        batch_size=64,
        restarts=restarts,
        placement=JobPlacement(jid, (0,), (0,), (2,)),
    )


def test_the_scheduler_grows_the_calm_job_not_the_one_that_restarts_often() -> None:
    # 8 GPUs, 4 free; two equal jobs on 2 each, 2,000 s old: "a" has restarted 40 times
    # (1,200 s of its life lost, f = 0.4), "b" never.  A flat 60 s penalty lets the
    # first in rank ("a") take the free GPUs; with the history "a"'s restart costs it
    # 60 + 512 s more than the ~200 s that growing saves, so "b" grows instead.
    jobs = [_running("a", restarts=40), _running("b", restarts=0)]
    nodes = np.array([[8.0]])
    flat = make_optimus("optimus+rw", restart_history="none").schedule(2000.0, jobs, nodes)
    priced = make_optimus("optimus+rw").schedule(2000.0, jobs, nodes)
    assert flat.tasks["a"][1] > 2 and flat.tasks["b"][1] == 2
    assert priced.tasks["a"][1] == 2 and priced.tasks["b"][1] > 2
