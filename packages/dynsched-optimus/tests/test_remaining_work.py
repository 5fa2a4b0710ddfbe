"""``optimus+rw``: allocation by marginal gain in predicted JCT (remaining work / goodput)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from dynsched_optimus import AllocationJob, OptimusError, allocate
from dynsched_optimus.scheduler import (
    RW_EXPONENT,
    CompletionRule,
    GoodputBatch,
    JobObservation,
    RemainingWorkAllocation,
    Round,
    SpeedAwarePlacement,
    make_optimus,
    optimus_variants,
)
from hypothesis import given
from hypothesis import strategies as st

GPU = (1.0,)


def _job(jid: str, remaining: float, arrival: float, speed=math.sqrt, **kw) -> AllocationJob:
    return AllocationJob(
        jid,
        remaining,
        lambda p, w: speed(w),
        (),
        GPU,
        kind="allreduce",
        arrival=arrival,
        **kw,
    )


def _gpus(alloc, jid: str) -> int:
    return alloc.tasks[jid][1]


def test_hand_computed_third_gpu_goes_to_the_nearly_finished_job() -> None:
    # 3 GPUs; each job first gets its minimum (1 GPU).  The third GPU: long scales as
    # w**0.6, short as w**0.5.  log utility (optimus+): gain = exponent * log 2, long
    # 0.416 > short 0.347 -> "long"; a = 2 (optimus+rw): gain = (s(2) - s(1)) / R,
    # long (2**0.6 - 1) / 4 = 0.129 < short (2**0.5 - 1) / 1 = 0.414 -> "short"
    jobs = [
        _job("long", 4.0, 0.0, speed=lambda w: w**0.6),
        _job("short", 1.0, 1.0, speed=lambda w: w**0.5),
    ]
    kw = {"method": "incremental", "current": {}}
    by_log = allocate(jobs, (3.0,), **kw)
    by_jct = allocate(jobs, (3.0,), **kw, utility_exponent=2.0, jct_gains=True)
    assert (_gpus(by_log, "long"), _gpus(by_log, "short")) == (2, 1)
    assert (_gpus(by_jct, "long"), _gpus(by_jct, "short")) == (1, 2)


def test_hand_computed_restart_penalty_against_the_predicted_saving() -> None:
    # a running job on 2 GPUs, speed w, R = 100: T(2) = 50, T(3) = 33.3 (max 3 GPUs)
    # saving 16.7 s: below a 20 s restart penalty (no change), above a 10 s one
    job = _job("a", 100.0, 0.0, speed=float, max_workers=3)
    kw = {
        "method": "incremental",
        "current": {"a": (0, 2)},
        "utility_exponent": 2.0,
        "jct_gains": True,
    }
    assert _gpus(allocate([job], (8.0,), restart_penalty=20.0, **kw), "a") == 2
    assert _gpus(allocate([job], (8.0,), restart_penalty=10.0, **kw), "a") == 3


@pytest.mark.parametrize(("short_remaining", "starts"), [(10.0, False), (100.0, True)])
def test_hand_computed_start_against_the_restart_it_causes(short_remaining, starts) -> None:
    # a = 2, speed w, 2 GPUs held by L (R = 1000: T(2) = 500, T(1) = 1000), pen 30 s.
    # S waits for a GPU; starting it gains -F(T_S(1)) = 1 / T_S.  L's loss:
    # 1/500 - 1/1030 = 0.00103, plus its 30 s restart at the taker's rate 30 / T_S**2.
    # T_S = 10: 0.1 < 0.00103 + 0.3 -> S waits; T_S = 100: 0.01 > 0.00103 + 0.003 -> S runs
    jobs = [_job("L", 1000.0, 0.0, speed=float), _job("S", short_remaining, 1.0, speed=float)]
    alloc = allocate(
        jobs,
        (2.0,),
        method="incremental",
        current={"L": (0, 2)},
        restart_penalty=30.0,
        min_gain=0.01,
        utility_exponent=2.0,
        jct_gains=True,
    )
    assert (_gpus(alloc, "L"), _gpus(alloc, "S")) == ((1, 1) if starts else (2, 0))


def test_hand_computed_relative_min_gain() -> None:
    # waiting job, speed w, R = 100, up to 8 GPUs: 7 -> 8 saves 1/8 of T(7) (12.5 %),
    # so a 13 % threshold stops it at 7 GPUs and a 12 % one lets it take 8
    job = _job("a", 100.0, 0.0, speed=float)
    kw = {"method": "incremental", "current": {}, "utility_exponent": 2.0}
    assert _gpus(allocate([job], (8.0,), min_gain=0.13, jct_gains=True, **kw), "a") == 7
    assert _gpus(allocate([job], (8.0,), min_gain=0.12, jct_gains=True, **kw), "a") == 8


def _obs(jid: str, epochs_done: int, arrival: float = 0.0) -> JobObservation:
    # 100 iterations per epoch, 10 epochs; 1, 2 and 4 GPUs measured (speed ~ n**0.8)
    return JobObservation(
        job_id=jid,
        kind="allreduce",
        worker_demand=(1.0,),
        arrival=arrival,
        requested_workers=8,
        max_workers=8,
        iterations_done=100 * epochs_done,
        epochs_done=epochs_done,
        throughput={(1, 0, 1): (10.0,), (2, 0, 1): (17.4,), (4, 0, 1): (30.3,)},
        completion=CompletionRule("epochs", 10),
        batch_size=64,
    )


def test_remaining_work_moves_gpus_to_the_nearly_finished_job() -> None:
    nodes = np.array([[8.0]])
    jobs = [_obs("far", epochs_done=1), _obs("near", epochs_done=9, arrival=1.0)]
    plus = make_optimus("optimus+").schedule(0.0, jobs, nodes).tasks
    rw = make_optimus("optimus+rw").schedule(0.0, jobs, nodes).tasks
    # sum log T: the remaining work cancels out, the same split whatever is left
    assert plus["near"][1] <= plus["far"][1]
    # marginal gain in predicted JCT: the nearly finished job gains GPUs
    assert rw["near"][1] > plus["near"][1]
    assert rw["near"][1] > rw["far"][1]
    assert rw["near"][1] + rw["far"][1] <= 8


class _LinearEstimator:
    """Speed = workers (iterations/s), nothing else (hand-computable weights)."""

    def speed(self, obs, ps, workers, nodes, rnd) -> float:
        return float(workers)


def test_hand_computed_aging_weight() -> None:
    # waiting job (1 GPU now), 100 done, 300 left, requested 4 GPUs, age 250 s:
    # T_alone = 400 / 4 = 100 s; slowdown = (250 + 300 / 1) / 100 = 5.5; guard 2 -> 2.75,
    # rounded down to a power of two: 2
    obs = JobObservation(
        job_id="j",
        kind="allreduce",
        worker_demand=(1.0,),
        requested_workers=4,
        iterations_done=100,
    )
    rnd = Round(250.0, {"j": obs}, np.array([[8.0]]), 30.0, 0, per_node={"j": 8})
    w = RemainingWorkAllocation(max_slowdown=2.0).weights(rnd, _LinearEstimator(), {"j": 300.0})
    assert w["j"] == 2.0
    w = RemainingWorkAllocation(max_slowdown=1.0).weights(rnd, _LinearEstimator(), {"j": 300.0})
    assert w["j"] == 4.0  # 5.5 -> 4
    # not behind: weight 1
    w = RemainingWorkAllocation(max_slowdown=8.0).weights(rnd, _LinearEstimator(), {"j": 300.0})
    assert w["j"] == 1.0


def test_aging_guard_lets_a_starved_long_job_win_a_gpu() -> None:
    # without the guard the short job takes the contested GPU; the long job, far behind
    # (waited 10x its time alone), gets it with the guard
    nodes = np.array([[3.0]])
    t = 9000.0
    # far: 1000 iterations in all, alone on 8 GPUs about 20 s, submitted 9000 s ago;
    # near: submitted 10 s ago, 100 iterations left (10 s on 1 GPU): not behind
    far = _obs("far", epochs_done=1)
    near = _obs("near", epochs_done=9, arrival=t - 10.0)
    loose = make_optimus("optimus+rw", max_slowdown=1e9).schedule(t, [far, near], nodes).tasks
    tight = make_optimus("optimus+rw", max_slowdown=2.0).schedule(t, [far, near], nodes).tasks
    assert loose["far"][1] < loose["near"][1]
    assert tight["far"][1] > loose["far"][1]


def test_variant_composition() -> None:
    assert "optimus+rw" in optimus_variants()
    pol = make_optimus("optimus+rw", max_slowdown=3.0, remaining_estimate="high", min_gain=0.05)
    assert pol.allocation == RemainingWorkAllocation("high", RW_EXPONENT, 3.0, 0.05)
    assert isinstance(pol.placement, SpeedAwarePlacement)
    assert isinstance(pol.batch, GoodputBatch)
    assert pol.restarts.hysteresis == 2.0
    for variant in ("optimus+", "optimus+rw"):
        assert make_optimus(variant, hysteresis=16.0).restarts.hysteresis == 16.0


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("remaining_estimate", "best", "one of ['low', 'mid', 'high']"),
        ("max_slowdown", 0.5, "a number >= 1.0"),
        ("jct_exponent", -1.0, "a number >= 0.0"),
        ("min_gain", float("nan"), "a number >= 0.0"),
        ("max_slowdown", "4", "a number >= 1.0"),
        ("max_slowdown", True, "a number >= 1.0"),
        ("hysteresis", -1.0, "a number >= 0.0"),
        ("hysteresis", "16", "a number >= 0.0"),
    ],
)
def test_bad_options_name_the_field_and_the_allowed_values(field, value, allowed) -> None:
    # the keyword of make_optimus is the one named
    with pytest.raises(OptimusError) as err:
        make_optimus("optimus+rw", **{field: value})
    assert str(err.value) == f"{field} must be {allowed}, got {value!r}"


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("estimate", "best", "one of ['low', 'mid', 'high']"),
        ("exponent", float("nan"), "a number >= 0.0"),
        ("min_gain", -0.1, "a number >= 0.0"),
    ],
)
def test_bad_fields_of_the_strategy_itself(field, value, allowed) -> None:
    with pytest.raises(OptimusError) as err:
        RemainingWorkAllocation(**{field: value})
    assert str(err.value) == f"{field} must be {allowed}, got {value!r}"


@given(
    rem=st.lists(st.floats(1.0, 1e5), min_size=1, max_size=6),
    cap=st.integers(1, 16),
    running=st.integers(0, 3),
)
def test_never_overcommits_and_every_job_gets_at_most_its_cap(rem, cap, running) -> None:
    jobs = [_job(f"j{i}", r, float(i), max_workers=4) for i, r in enumerate(rem)]
    current = {f"j{i}": (0, 1) for i in range(min(running, len(rem), cap))}
    alloc = allocate(
        jobs,
        (float(cap),),
        method="incremental",
        current=current,
        restart_penalty=60.0,
        min_gain=0.01,
        utility_exponent=2.0,
        jct_gains=True,
    )
    counts = [_gpus(alloc, j.job_id) for j in jobs]
    assert sum(counts) <= cap
    assert all(0 <= c <= 4 for c in counts)
    # no job waits while GPUs stay free (a waiting job's first free GPU is always taken)
    if sum(counts) < cap:
        assert all(c >= 1 for c in counts)


def test_readme_example_of_optimus_rw_runs(capsys) -> None:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    example = next(b for b in blocks if "optimus+rw" in b)
    exec(compile(example, "README.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "near:" in out and "far:" in out


def test_restart_penalty_decides_whether_a_short_job_restarts_a_long_one() -> None:
    # 4 GPUs, all held by a long running job (T = 40,000 / sqrt(4) = 20,000 s); a short job
    # (100 s of work on 1 GPU) can start only by taking one.  a = 1.5, F = -2 / sqrt(T):
    # its start gains 2 / sqrt(100) = 0.2; the long job loses
    # F(40,000 / sqrt(3)) - F(20,000) ~ 0.0010, and its restart is charged as `pen` seconds
    # of the taker's time, pen * F'(100) = pen / 1000.  The default penalty (hysteresis 2 x
    # 30 s) costs 0.06: the short job starts (and, the long job restarted anyway, grows
    # further); hysteresis 16 (480 s) costs 0.48 > 0.2: it waits, the long job keeps its GPUs
    jobs = [_job("long", 40_000.0, 0.0), _job("short", 100.0, 1.0)]
    for hysteresis, starts in ((2.0, True), (16.0, False)):
        alloc = allocate(
            jobs,
            (4.0,),
            method="incremental",
            current={"long": (0, 4)},
            restart_penalty=hysteresis * 30.0,
            min_gain=0.01,
            utility_exponent=RW_EXPONENT,
            jct_gains=True,
        )
        assert (_gpus(alloc, "short") >= 1) is starts, hysteresis
        assert (_gpus(alloc, "long") == 4) is not starts
