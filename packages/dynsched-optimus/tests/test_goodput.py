"""Goodput (Pollux' model) in the composed scheduler: the efficiency model, batch
candidates, the batch-aware speed form, the goodput estimator, the batch strategies and
the whole policy driven by hand-built observation records (no simulator)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dynsched_optimus import OptimusError
from dynsched_optimus._online_speed import fit_allreduce_speed, predict_allreduce_time
from dynsched_optimus.scheduler import (
    BATCH_MODES,
    AdaptiveBatch,
    CompletionRule,
    FittedEstimator,
    FixedBatch,
    GoodputBatch,
    JobObservation,
    best_goodput,
    efficiency_gain,
    make_optimus,
    micro_steps,
)
from hypothesis import given
from hypothesis import strategies as st

NODE = (32.0, 256.0, 4.0, 10.0)
REPLICA = (4.0, 16.0, 1.0, 0.0)


def _nodes(n: int = 4) -> np.ndarray:
    return np.array([NODE] * n)


def _true_time(w: int, k: int, b: float, max_local: float = 64.0) -> float:
    """A job's true iteration time: 20 ms per micro-batch, 1 ms per sample of the local
    batch, 10 ms of synchronisation inside a node, 100 ms more across nodes."""
    m = float(micro_steps(b, w, max_local))
    sync = 0.0 if w == 1 else (0.01 if k == 1 else 0.11 + 0.02 * (k - 2))
    return 0.02 * m + 0.001 * b / w + sync


def _measured(
    configs: list[tuple[int, int, float]],
) -> dict[tuple[int, int, int, float], tuple[float, ...]]:
    return {(w, 0, k, b): (1.0 / _true_time(w, k, b),) for w, k, b in configs}


def _adaptive(**kw: object) -> AdaptiveBatch:
    base: dict[str, object] = {
        "init_batch": 32,
        "max_batch": 2048,
        "min_local": 8,
        "max_local": 64,
        "grad_sqr": 1.0,
        "grad_var": 8.0,  # noise scale 8 * 32 = 256 samples
        "progress": 1000.0,
        "progress_per_epoch": 500.0,
    }
    base.update(kw)
    return AdaptiveBatch(**base)  # type: ignore[arg-type]


def _job(jid: str = "a", **kw: object) -> JobObservation:
    base: dict[str, object] = {
        "job_id": jid,
        "kind": "allreduce",
        "worker_demand": REPLICA,
        "requested_workers": 2,
        "max_workers": 2,
        "batch_size": 64,
        "epochs_done": 2,
        "iterations_done": 900,
        "completion": CompletionRule("epochs", 10),
        "throughput": _measured([(1, 1, 32), (2, 1, 64), (4, 1, 128), (8, 2, 256)]),
        "adaptive_batch": _adaptive(),
    }
    base.update(kw)
    return JobObservation(**base)  # type: ignore[arg-type]


# ------------------------------------------------------------------ efficiency model


@given(
    init=st.floats(1, 1e3),
    scale=st.floats(1, 1e3),
    sqr=st.floats(1e-6, 1e6),
    var=st.floats(0, 1e6),
)
def test_efficiency_gain_is_between_one_and_the_scale_and_grows_with_the_batch(
    init: float, scale: float, sqr: float, var: float
) -> None:
    g = float(efficiency_gain(init * scale, init, sqr, var))
    assert 1.0 - 1e-9 <= g <= scale * (1 + 1e-9)
    assert float(efficiency_gain(init, init, sqr, var)) == pytest.approx(1.0)
    assert float(efficiency_gain(init * scale * 1.5, init, sqr, var)) >= g * (1 - 1e-12)


def test_efficiency_gain_follows_the_gradient_noise_scale() -> None:
    # noise scale B_noise = init * var / sqr; at batch B the gain is
    # (B_noise + init) / (B_noise + B) * B / init
    init, sqr, var = 32.0, 1.0, 8.0
    b_noise = init * var / sqr
    for b in (32.0, 64.0, 256.0, 4096.0):
        want = (b_noise + init) / (b_noise + b) * b / init
        assert float(efficiency_gain(b, init, sqr, var)) == pytest.approx(want)
    # no measurement: perfectly efficient
    assert float(efficiency_gain(256.0, 32.0, 0.0, 0.0)) == pytest.approx(8.0)


def test_micro_steps_count_gradient_accumulation() -> None:
    assert float(micro_steps(256, 4, 64)) == 1  # local 64 fits
    assert float(micro_steps(257, 4, 64)) == 2  # local 65: two micro-batches
    assert float(micro_steps(1024, 2, 64)) == 8
    assert float(micro_steps(1024, 2, None)) == 1  # no limit: no accumulation


@given(workers=st.integers(1, 300), lo=st.integers(1, 512), span=st.integers(1, 64))
def test_candidates_respect_the_batch_range_and_the_smallest_local_batch(
    workers: int, lo: int, span: int
) -> None:
    ab = AdaptiveBatch(init_batch=lo, max_batch=lo * span, min_local=4)
    cand = ab.candidates(workers)
    if cand.size == 0:
        assert max(lo, 4 * workers) > lo * span
        return
    assert cand.min() >= lo - 1e-9 and cand.max() <= lo * span + 1e-9
    assert np.all(cand / workers >= 4 - 1e-9)
    assert workers <= ab.max_workers


def test_adaptive_batch_validates_fields_by_name() -> None:
    with pytest.raises(OptimusError, match="max_batch"):
        AdaptiveBatch(init_batch=64, max_batch=32)
    with pytest.raises(OptimusError, match="max_local"):
        AdaptiveBatch(init_batch=8, max_batch=64, min_local=8, max_local=4)
    with pytest.raises(OptimusError, match="init_batch"):
        AdaptiveBatch(init_batch=0, max_batch=32)
    with pytest.raises(OptimusError, match="grad_sqr"):
        AdaptiveBatch(init_batch=8, max_batch=64, grad_sqr=1.0)
    with pytest.raises(OptimusError, match="progress"):
        AdaptiveBatch(init_batch=8, max_batch=64, progress=-1)
    with pytest.raises(OptimusError, match="adaptive_batch"):
        JobObservation("j", "allreduce", REPLICA, adaptive_batch={"init_batch": 8})  # type: ignore[arg-type]


@given(
    workers=st.integers(1, 32),
    sqr=st.floats(1e-3, 1e3),
    var=st.floats(1e-3, 1e3),
    c0=st.floats(1e-3, 1.0),
    c1=st.floats(1e-5, 1e-2),
)
def test_best_goodput_is_the_best_allowed_candidate(
    workers: int, sqr: float, var: float, c0: float, c1: float
) -> None:
    ab = AdaptiveBatch(32, 4096, min_local=4, max_local=128, grad_sqr=sqr, grad_var=var)

    def it_time(b: np.ndarray, m: np.ndarray) -> np.ndarray:
        return c0 * m + c1 * b / workers

    good, batch = best_goodput(ab, workers, it_time)
    cand = ab.candidates(workers)
    if cand.size == 0:
        assert (good, batch) == (0.0, 0.0)
        return
    brute = [
        float(ab.gain(b)) / (c0 * float(micro_steps(b, workers, 128)) + c1 * b / workers)
        for b in cand
    ]
    assert good == pytest.approx(max(brute))
    assert batch in cand


# ----------------------------------------------------------------- batch-aware speed form


def test_speed_form_fitted_on_several_batches_predicts_a_new_batch() -> None:
    configs = [(1, 1, 32), (2, 1, 64), (4, 1, 64), (4, 1, 512), (8, 2, 256), (16, 4, 1024)]
    coef = fit_allreduce_speed(_measured(configs), 0.0, max_local=64)
    assert coef is not None
    # the form is the truth's (micro-batch cost, per-sample cost, sync); a batch and a
    # GPU count never measured are predicted within a few percent
    for w, k, b in ((4, 1, 1024), (8, 2, 2048), (2, 1, 32)):
        pred = float(predict_allreduce_time(coef, w, k, b, micro_steps(b, w, 64)))
        assert pred == pytest.approx(_true_time(w, k, b), rel=0.15)


def test_throughput_keys_are_tagged_with_the_batch_they_were_measured_at() -> None:
    obs = JobObservation(
        "j",
        "allreduce",
        REPLICA,
        batch_size=64,
        throughput={(1, 0, 1): (2.0,), (2, 0, 1, 128): (3.0,), (2, 0, 1, 64.0): (5.0,)},
    )
    # the record keeps the keys as given; ``throughput_by_batch`` names every batch
    assert (1, 0, 1) in obs.throughput
    assert set(obs.throughput_by_batch) == {(1, 0, 1, 64.0), (2, 0, 1, 128.0), (2, 0, 1, 64.0)}
    assert obs.measured(2, 0, 1) == 5.0  # at the job's batch
    assert obs.measured(2, 0, 1, 128) == 3.0
    assert obs.measured(1, 0, 1, 128) is None
    # a record rebuilt from a stored one keeps its keys (attrs.evolve re-runs converters)
    import attrs

    assert attrs.evolve(obs, batch_size=128).throughput == obs.throughput
    # measured at "the job's batch" means the new batch once it changes
    assert attrs.evolve(obs, batch_size=128).measured(2, 0, 1) == 3.0
    with pytest.raises(OptimusError, match="'throughput'"):
        JobObservation("j", "allreduce", REPLICA, throughput={(1, 0, 1, -8): (1.0,)})
    with pytest.raises(OptimusError, match="'throughput'"):
        JobObservation("j", "allreduce", REPLICA, throughput={(1, 0): (1.0,)})


# ------------------------------------------------------------------- goodput estimator


def _round(policy, obs, nodes=None):  # type: ignore[no-untyped-def]
    return policy.new_round(0.0, obs, _nodes() if nodes is None else nodes)


def test_goodput_estimator_counts_work_in_progress_and_speed_in_goodput() -> None:
    est = FittedEstimator(goodput=True)
    policy = make_optimus("optimus+")
    obs = _job()
    rnd = _round(policy, [obs])
    # N epochs: progress left is exact (10 x 500 - 1000), whatever the batch
    rem = est.remaining(obs, rnd)
    assert rem.estimate == pytest.approx(4000.0) and rem.fitted
    # speed = the best goodput over the allowed batches on that placement
    g4 = est.speed(obs, 0, 4, 1, rnd)
    ab = obs.adaptive_batch
    assert ab is not None
    coef = fit_allreduce_speed(obs.throughput, obs.batch_size, ab.max_local)
    assert coef is not None
    cand = ab.candidates(4)
    brute = max(
        float(ab.gain(b)) / float(predict_allreduce_time(coef, 4, 1, b, micro_steps(b, 4, 64)))
        for b in cand
    )
    assert g4 == pytest.approx(brute)
    # goodput grows with GPUs inside a node (larger batches are efficient at this noise
    # scale); across two nodes the 110 ms synchronisation costs more than 4 GPUs bring
    assert g4 > est.speed(obs, 0, 2, 1, rnd) > est.speed(obs, 0, 1, 1, rnd)
    assert est.speed(obs, 0, 8, 2, rnd) < g4
    # the adaptive range bounds the GPUs worth allocating once statistics exist
    assert est.max_workers(obs) == ab.max_workers == 2048 // 8
    # without goodput the same record is counted in iterations at the fixed batch
    plain = FittedEstimator()
    assert plain.remaining(obs, rnd).estimate == pytest.approx(10 * 450 - 900)
    assert plain.max_workers(obs) == 2


def test_the_batch_follows_the_noise_scale() -> None:
    est = FittedEstimator(goodput=True)
    policy = make_optimus("optimus+")
    quiet = _job("quiet", adaptive_batch=_adaptive(grad_sqr=1.0, grad_var=0.05))  # B_noise 1.6
    noisy = _job("noisy", adaptive_batch=_adaptive(grad_sqr=1.0, grad_var=500.0))  # 16000
    rnd = _round(policy, [quiet, noisy])
    b_quiet = est.batch_size(quiet, 8, 2, rnd)
    b_noisy = est.batch_size(noisy, 8, 2, rnd)
    assert b_quiet is not None and b_noisy is not None
    # a small noise scale: the smallest batch 8 GPUs can run; a large one: far larger
    assert b_quiet == pytest.approx(64)
    assert b_noisy >= 8 * 64  # at least full micro-batches
    assert est.speed(noisy, 0, 8, 2, rnd) > est.speed(noisy, 0, 4, 1, rnd)


def test_without_gradient_statistics_the_job_keeps_its_batch() -> None:
    est = FittedEstimator(goodput=True)
    policy = make_optimus("optimus+")
    obs = _job(adaptive_batch=_adaptive(grad_sqr=None, grad_var=None))
    rnd = _round(policy, [obs])
    assert est.batch_size(obs, 2, 1, rnd) is None  # batch 64 runs on 2 GPUs
    # more GPUs than the batch allows: the smallest batch that can use them
    assert est.batch_size(obs, 16, 4, rnd) == pytest.approx(16 * 8)
    assert est.max_workers(obs) == obs.max_workers
    # speed in progress units, the batch taken as efficient (batch / init_batch)
    assert est.speed(obs, 0, 2, 1, rnd) == pytest.approx(est._iter_speed(obs, 2, 1, rnd) * 64 / 32)


def test_a_job_that_ends_after_n_steps_keeps_iteration_units() -> None:
    est = FittedEstimator(goodput=True)
    obs = _job(completion=CompletionRule("steps", 5000))
    assert est.adaptive(obs) is None
    rnd = _round(make_optimus("optimus+"), [obs])
    assert est.remaining(obs, rnd).estimate == pytest.approx(5000 - 900)


def test_target_metric_is_fitted_against_progress() -> None:
    est = FittedEstimator(goodput=True)
    # loss = 1 / (1e-3 progress + 1) + 0.1 against progress, one point per 500 progress
    pts = tuple((p, 1.0 / (1e-3 * p + 1.0) + 0.1) for p in (500.0, 1000.0, 1500.0, 2000.0))
    target = 1.0 / (1e-3 * 6000 + 1.0) + 0.1
    obs = _job(
        completion=CompletionRule("target_metric", target),
        epochs_done=4,
        loss_points=tuple((i * 450.0, v) for i, (_, v) in enumerate(pts, 1)),
        adaptive_batch=_adaptive(progress=2000.0, progress_points=pts),
    )
    rnd = _round(make_optimus("optimus"), [obs])
    assert est.remaining(obs, rnd).estimate == pytest.approx(4000.0, rel=0.05)


# --------------------------------------------------------------------- batch strategies


def test_batch_strategies_alone() -> None:
    policy = make_optimus("optimus+")
    obs = _job("a")
    fixed_job = _job("f", adaptive_batch=None)
    rnd = _round(policy, [obs, fixed_job])
    from dynsched_optimus import JobPlacement

    pls = {
        "a": JobPlacement("a", (0, 1), (0, 0), (4, 4)),
        "f": JobPlacement("f", (2,), (0,), (2,)),
    }
    est = FittedEstimator(goodput=True)
    assert FixedBatch().choose(rnd, pls, est) == {}
    chosen = GoodputBatch().choose(rnd, pls, est)
    assert set(chosen) == {"a"}  # a fixed-batch job is never given a batch
    assert chosen["a"] == round(est.batch_size(obs, 8, 2, rnd) or 0)
    ab = obs.adaptive_batch
    assert ab is not None and ab.init_batch <= chosen["a"] <= ab.max_batch


def test_make_optimus_batch_modes() -> None:
    assert BATCH_MODES == ("goodput", "fixed")
    with pytest.raises(OptimusError, match="batch='huge'"):
        make_optimus("optimus+", batch="huge")
    assert isinstance(make_optimus("optimus+").batch, GoodputBatch)
    assert isinstance(make_optimus("optimus+", batch="fixed").batch, FixedBatch)
    assert isinstance(make_optimus("optimus").batch, FixedBatch)


# ----------------------------------------------------------- the policy, by a minimal host


def test_policy_gives_gpus_and_a_batch_to_the_job_that_converts_them_into_progress() -> None:
    """Two identical jobs on one 8-GPU server, one with a large gradient noise scale (big
    batches are efficient), one with a tiny one (they are wasted): goodput gives the
    noisy one more GPUs and a larger batch; a fixed-batch policy cannot tell them apart."""
    noisy = _job("noisy", arrival=0.0, adaptive_batch=_adaptive(grad_sqr=1.0, grad_var=500.0))
    quiet = _job("quiet", arrival=0.0, adaptive_batch=_adaptive(grad_sqr=1.0, grad_var=0.05))
    nodes = np.array([[64.0, 512.0, 8.0, 10.0]])
    dec = make_optimus("optimus+").schedule(0.0, [noisy, quiet], nodes)
    assert dec.tasks["noisy"][1] > dec.tasks["quiet"][1] >= 1
    assert sum(w for _, w in dec.tasks.values()) <= 8
    assert dec.batch_sizes["noisy"] > dec.batch_sizes.get("quiet", 64)
    fixed = make_optimus("optimus+", batch="fixed").schedule(0.0, [noisy, quiet], nodes)
    assert fixed.batch_sizes == {}
    assert fixed.tasks["noisy"][1] == fixed.tasks["quiet"][1]  # indistinguishable
    # decisions are plain data the host applies
    for jid, b in dec.batch_sizes.items():
        assert isinstance(b, int) and math.isfinite(b)
        assert b / dec.tasks[jid][1] >= 8  # min local batch


def test_readme_goodput_example_runs(capsys) -> None:  # type: ignore[no-untyped-def]
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    example = next(b for b in blocks if "AdaptiveBatch" in b)
    exec(compile(example, "README.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "noisy:" in out and "quiet:" in out
