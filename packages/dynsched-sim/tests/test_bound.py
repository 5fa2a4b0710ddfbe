"""The lower bound: its pieces by hand, exact on a fully serial run, never beaten."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from dynsched_sim import (
    EngineModel,
    builtin_scenarios,
    decode_rates,
    load_scenario,
    lower_bound,
    pool_throughput,
    random_scenario,
    run_configuration,
    scenario_from_dict,
)
from dynsched_sim._bound import _earliest_rows
from hypothesis import given
from hypothesis import strategies as st


@given(
    caps=st.lists(st.integers(1, 12), min_size=1, max_size=3),
    seqs=st.integers(0, 30),
    per_seq=st.floats(0.0, 0.01),
)
def test_pool_throughput_is_the_best_split(caps: list[int], seqs: int, per_seq: float) -> None:
    eng = EngineModel(gpus_per_replica=1, decode_base_s=0.01, decode_per_seq_s=per_seq)

    def f(x: int) -> float:
        return x * eng.per_seq_rate(x) if x else 0.0

    best = max(
        sum(f(x) for x in split)
        for split in itertools.product(*(range(c + 1) for c in caps))
        if sum(split) <= seqs
    )
    assert pool_throughput(eng, caps, seqs) == pytest.approx(best, rel=1e-9, abs=1e-9)


def _earliest(need: float, a: tuple[float, float], b: tuple[float, float]) -> float:
    one = np.asarray([need])
    got = _earliest_rows(
        one, (np.asarray(a[0]), np.asarray(a[1])), (np.asarray(b[0]), np.asarray(b[1]))
    )
    return float(got[0])


def test_earliest_time_for_two_rates() -> None:
    assert _earliest(0.0, (1.0, 5.0), (0.0, 0.0)) == 0.0
    assert _earliest(10.0, (2.0, 0.0), (0.0, 3.0)) == pytest.approx(5.0)
    # 2/s from t=0, another 3/s from t=4: 8 made by t=4, 12 more at 5/s
    assert _earliest(20.0, (2.0, 0.0), (3.0, 4.0)) == pytest.approx(6.4)
    assert _earliest(20.0, (3.0, 4.0), (2.0, 0.0)) == pytest.approx(6.4)  # either order
    assert _earliest(4.0, (2.0, 0.0), (3.0, 4.0)) == pytest.approx(2.0)  # before the second
    assert _earliest(1.0, (0.0, 0.0), (0.0, 1.0)) == float("inf")


@given(
    need=st.floats(0.0, 1e6),
    # a rate is 0 (a pool without replicas) or a real one: a subnormal rate's time overflows
    rates=st.tuples(*[st.one_of(st.just(0.0), st.floats(1e-3, 1e4))] * 2),
    starts=st.tuples(st.floats(0.0, 1e5), st.floats(0.0, 1e5)),
)
def test_earliest_is_when_the_two_terms_have_made_the_need(
    need: float, rates: tuple[float, float], starts: tuple[float, float]
) -> None:
    """What the two terms make by the answer is the need, and a moment earlier less."""
    t = _earliest(need, (rates[0], starts[0]), (rates[1], starts[1]))

    def made(x: float) -> float:
        return sum(r * max(0.0, x - s) for r, s in zip(rates, starts, strict=True))

    if need <= 0:
        assert t == 0.0
    elif max(rates) <= 0:
        assert t == float("inf")
    else:
        assert made(t) == pytest.approx(need, rel=1e-9, abs=1e-6)
        assert made(t * (1 - 1e-6) - 1e-6) <= need * (1 + 1e-9) + 1e-6


def _serial(steps: int) -> dict:  # type: ignore[type-arg]
    """One sample in flight, one replica, a weight sync after every step: a chain."""
    return {
        "name": "serial",
        "steps": steps,
        "hardware": {"network_bandwidth_gib_s": 10, "network_latency_s": 1.0},
        "model": {"params_b": 1.0, "kv_bytes_per_token": 1000.0},
        "engine": {
            "gpus_per_replica": 1,
            "decode_base_s": 0.01,
            "decode_per_seq_s": 0.001,
            "prefill_s_per_token": 1e-4,
        },
        "trainer": {"gpu_s_per_token": 0.01, "step_overhead_s": 3.0},
        "workload": {
            "n": 1,
            "max_response_len": 5000,
            "prompt_len": {"kind": "constant", "median": 50},
            "response_len": {"kind": "lognormal", "median": 400, "sigma": 0.5},
        },
        "schedule": {
            "ppo_mini_batch_size": 1,
            "trigger_parameter_sync_step": 1,
            "staleness_threshold": 0.0,
            "concurrent_samples_per_replica": 1,
        },
        "configurations": [{"name": "s", "trainer_gpus": 1, "rollout_gpus": 1}],
    }


def test_bound_is_exact_on_a_fully_serial_run() -> None:
    """With one sample in flight per version the run is a chain: generate (prefill, then
    decode alone at r(1)), train, sync, admit the next prompt. The bound follows the same
    chain, so it equals the simulated time."""
    sc = scenario_from_dict(_serial(6))
    r = run_configuration(sc, "s", "static_fully_async")
    assert r.efficiency == pytest.approx(1.0, rel=1e-9)
    assert r.summary["lower_bound_binding"] in ("slots", "stragglers")  # equal here


def test_bound_by_hand_on_the_serial_chain() -> None:
    sc = scenario_from_dict(_serial(2))
    conf = sc.configuration("s")
    from dynsched_sim._cluster import build_cluster  # noqa: F401  (same workload draw)

    w = sc.workload.generate(8, sc.seed, run_samples=2)
    lb = lower_bound(sc, conf, w)
    eng, hw, llm, tr = sc.engine, sc.hardware, sc.model, sc.trainer
    solo = [
        int(w.prompt_lens[i]) * eng.prefill_s_per_token
        + int(w.response_lens[i].max()) / eng.per_seq_rate(1)
        for i in range(2)
    ]
    train = [tr.step_s(int(w.group_tokens()[i]), 1, tr.state_swap_s(hw, llm, 1)) for i in range(2)]
    y = eng.broadcast_sync_s(hw, llm)
    t1 = solo[0]
    t2 = t1 + train[0] + y + solo[1]
    assert lb.step_starts_s == pytest.approx((t1, t2))
    assert lb.seconds == pytest.approx(t2 + train[1] + y)


@pytest.mark.parametrize("name", sorted(builtin_scenarios()))
def test_no_builtin_run_beats_the_bound(name: str) -> None:
    """Shortened for CI; ``benchmarks/sim_bound_validity.py`` runs them at full length."""
    sc = load_scenario(name)
    sc = sc.with_steps(min(sc.steps, 8))
    for conf in sc.configurations:
        for pol in ["default", "fixed_ratio", "static_fully_async"] if conf.hybrid else [""]:
            r = run_configuration(sc, conf, pol or "static_fully_async")
            assert 0.0 < r.efficiency <= 1.0, (name, conf.name, pol, r.efficiency)
            assert all(r.conservation.values()), (name, conf.name, pol, r.conservation)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1000, 1012))
def test_no_random_run_beats_the_bound(seed: int) -> None:
    """CI-sized sample; ``benchmarks/sim_bound_validity.py`` runs hundreds."""
    sc = random_scenario(seed, max_steps=10)
    for conf in sc.configurations:
        for pol in ["default", "static_fully_async"] if conf.hybrid else ["static_fully_async"]:
            r = run_configuration(sc, conf, pol)
            assert all(r.conservation.values()), (seed, conf.name, pol, r.conservation)
            assert 0.0 < r.efficiency <= 1.0, (seed, conf.name, pol, r.efficiency)


def test_random_scenarios_are_deterministic_and_valid() -> None:
    a, b = random_scenario(7), random_scenario(7)
    assert a == b
    assert random_scenario(8) != a
    assert any(c.hybrid for c in a.configurations)


@given(
    counts=st.lists(st.integers(1, 2), min_size=1, max_size=2),
    caps=st.lists(st.integers(1, 6), min_size=2, max_size=2),
    samples=st.integers(1, 6),
    n=st.integers(1, 3),
    per_seq=st.floats(0.0, 0.02),
)
def test_decode_rates_never_below_the_best_schedule(
    counts: list[int], caps: list[int], samples: int, n: int, per_seq: float
) -> None:
    """Every way of running sequences (``x``) and longest responses (``c <= x``) on the
    replicas, within ``samples`` samples and ``n * samples`` sequences in flight, makes
    no more weighted work per second than `decode_rates` says."""
    eng = EngineModel(gpus_per_replica=1, decode_base_s=0.01, decode_per_seq_s=per_seq)
    pools = list(zip(counts, caps, strict=False))
    replicas = [cap for cnt, cap in pools for _ in range(cnt)]
    weights = (0.0, 0.25, 0.5, 1.0)
    got = decode_rates(eng, pools, samples, n, weights)
    per_replica = [[(c, x) for x in range(cap + 1) for c in range(x + 1)] for cap in replicas]
    for i, lam in enumerate(weights):
        best = 0.0
        for choice in itertools.product(*per_replica):
            if sum(c for c, _ in choice) > samples or sum(x for _, x in choice) > n * samples:
                continue
            rate = sum(
                (lam * c + (1 - lam) * x) / (eng.decode_base_s + per_seq * x)
                for c, x in choice
                if x
            )
            best = max(best, rate)
        assert got[i] >= best * (1 - 1e-9), (lam, got[i], best)


def test_decode_rates_by_hand_without_a_per_sequence_cost() -> None:
    """With ``decode_per_seq_s = 0`` an iteration takes ``b`` whatever runs, so the best is
    every replica full and as many longest responses as the samples allow."""
    eng = EngineModel(gpus_per_replica=1, decode_base_s=0.02, decode_per_seq_s=0.0)
    # 2 replicas of 8 sequences; 3 samples of n = 4: 12 sequences, 3 longest responses
    got = decode_rates(eng, [(2, 8)], 3, 4, (0.0, 0.5, 1.0))
    assert got == pytest.approx([12 / 0.02, (0.5 * 3 + 0.5 * 12) / 0.02, 3 / 0.02], rel=1e-5)


def test_decode_constraint_binds_where_slots_and_tokens_are_loose() -> None:
    """The published split 16+16 is rollout-bound: two standalone replicas of 128
    sequences hold 32 samples of n = 8. Counting only tokens, or each sample's longest
    response at the fastest single-sequence rate, leaves 30 % of the run unexplained;
    the decode constraint couples them (a replica cannot run 128 sequences and have
    every iteration advance a different sample's longest response), binds, and the run
    still never beats it."""
    sc = load_scenario("seed-qwen35")
    r = run_configuration(sc, "static-16-16", "static_fully_async")
    assert r.summary["lower_bound_binding"] == "decode"
    assert 0.78 < r.efficiency <= 1.0


def _context_bound() -> dict:  # type: ignore[type-arg]
    """One replica holding every sample at once, where reading the KV cache costs most
    of an iteration (long contexts, a slow memory): the replica-time constraint's case."""
    d = _serial(2)
    d["engine"].update(
        {"max_num_seqs": 64, "decode_per_kv_token_s": 2e-5, "prefill_s_per_token": 0.0}
    )
    d["workload"].update(
        {
            "n": 2,
            "prompt_len": {"kind": "constant", "median": 600},
            "response_len": {"kind": "constant", "median": 300},
        }
    )
    d["schedule"].update(
        {"ppo_mini_batch_size": 4, "staleness_threshold": 1.0, "concurrent_samples_per_replica": 8}
    )
    return d


def test_replica_time_by_hand_where_context_reads_dominate() -> None:
    """2c by hand: the first step's 4 samples (8 responses of 300 tokens to prompts of 600)
    need ``R / r_cap`` seconds of decoding at the replica's best rate plus ``k (P R + R^2 /
    2)`` per response of KV reads, from one replica; that is later than the tokens, the
    decode constraint, the slots and the stragglers allow, so it sets the step's start,
    and the simulated run is slower still, but by less than without it (the replica runs
    16 of its 64 sequences, so its base rate is below ``r_cap``)."""
    sc = scenario_from_dict(_context_bound())
    conf = sc.configuration("s")
    eng, hw, llm = sc.engine, sc.hardware, sc.model
    w = sc.workload.generate(16, sc.seed, run_samples=8)
    lb = lower_bound(sc, conf, w)
    cap = eng.max_running("standalone", hw, llm)
    r_cap = cap * eng.per_seq_rate(cap)
    p_len, r_len = 600.0, 300.0
    per_group = 2 * r_len / r_cap + 2 * eng.decode_per_kv_token_s * (p_len * r_len + r_len**2 / 2)
    assert lb.step_starts_s[0] == pytest.approx(4 * per_group, rel=1e-12)
    r = run_configuration(sc, "s", "static_fully_async")
    assert r.summary["lower_bound_binding"] == "work"
    assert 0.78 < r.efficiency <= 1.0  # 0.67, set by the tokens, without 2c


@pytest.mark.parametrize("planner", [False, True])
def test_run_lower_bound_is_the_bound_a_run_reports(planner: bool) -> None:
    """`run_lower_bound` gives, without simulating, the bound `run_configuration` reports
    (the same workload draw and, with the role planner, the same splits)."""
    from dynsched_sim import run_lower_bound

    sc = load_scenario("heavy-tailed").with_steps(6)
    for conf in sc.configurations:
        r = run_configuration(sc, conf, "default", seed=3, planner=planner)
        b = run_lower_bound(sc, conf, "default", seed=3, planner=planner)
        assert b.seconds == r.lower_bound_s
        assert b.binding == r.summary["lower_bound_binding"]


@given(values=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40), data=st.data())
def test_kth_smallest_is_the_sorted_order_statistic(
    values: list[float], data: st.DataObject
) -> None:
    """The order statistic constraint 4 reads: the ``r``-th smallest of what was added so
    far, ``r`` never decreasing."""
    from dynsched_sim._bound import _KthSmallest

    order, r = _KthSmallest(), 1
    for i, x in enumerate(values, start=1):
        order.add(x)
        r = data.draw(st.integers(r, i))
        assert order.kth(r) == sorted(values[:i])[r - 1]


def test_a_prompt_waits_for_a_slot_before_it_starts() -> None:
    """Constraint 4's release by hand: with one sample slot and the first window open to
    three prompts, the second starts only once the first completed, the third once the
    second did (in prompt order), so ``e_i`` is the running sum of the solo times."""
    from dynsched_sim._bound import _Relaxation

    d = _serial(3)
    d["schedule"]["staleness_threshold"] = 2.0  # three prompts admissible in window 0
    sc = scenario_from_dict(d)
    conf = sc.configuration("s")
    w = sc.workload.generate(8, sc.seed, run_samples=3)
    run = _Relaxation(sc, [conf], w, sc.schedule_config(conf))
    assert run.slots == 1 and run.a[0] >= 3
    assert run.done_e[:3] == pytest.approx(np.cumsum(run.solo[:3]))


def _bubble_relaxation():  # type: ignore[no-untyped-def]
    """The relaxed run of held-out draw 1000's ``static-32-32``: a trainer with pipeline
    stages whose bubble grows with a step's tokens from 138k (its smallest step) up to
    its cap at 262k."""
    from dynsched_sim import heldout_scenario
    from dynsched_sim._bound import _Relaxation
    from dynsched_sim._sim import run_workload

    sc = heldout_scenario(1000)
    conf = sc.configuration("static-32-32")
    cfg = sc.schedule_config(conf)
    return sc, conf, _Relaxation(sc, [conf], run_workload(sc, conf, cfg, sc.seed), cfg)


@given(
    m=st.integers(1, 4),
    k_min=st.floats(10.0, 400.0),
    span=st.floats(0.0, 1000.0),
    share=st.floats(0.0, 1.0),
    data=st.data(),
)
def test_training_time_is_the_least_over_every_split_of_the_tokens(
    m: int, k_min: float, span: float, share: float, data: st.DataObject
) -> None:
    """``train(j..k)``'s vertex rule against the steps' own times: for any ``m`` steps of
    ``K_min <= K_i <= K_max`` tokens summing to the total, the sum of their step times is
    at least the bound, and the vertex (every step but one at an end) attains it."""
    _sc, _conf, run = _bubble_relaxation()
    run.k_min = k_min * 1000.0
    k_max = run.k_min + span * 1000.0
    total = m * run.k_min + share * m * (k_max - run.k_min)
    least = run._train_vertex(m, total, k_max)
    # a random feasible split of the total: random shares first, the rest where it fits
    ks, left = [run.k_min] * m, total - m * run.k_min
    for i in data.draw(st.permutations(range(m))):
        extra = min(left, k_max - run.k_min) * data.draw(st.sampled_from([0.0, 0.3, 1.0]))
        ks[i] += extra
        left -= extra
    for i in range(m):
        extra = min(left, k_max - ks[i])
        ks[i] += extra
        left -= extra
    assert left == pytest.approx(0.0, abs=1e-6 * total)
    assert sum(run.step_time(k) for k in ks) >= least * (1 - 1e-9)
    # the vertex itself: as many steps at K_max as the total allows, the others at K_min
    top = (
        0 if k_max <= run.k_min else min(m - 1, int((total - m * run.k_min) // (k_max - run.k_min)))
    )
    vertex = [k_max] * top + [run.k_min] * (m - 1 - top)
    vertex.append(total - sum(vertex))
    assert sum(run.step_time(k) for k in vertex) == pytest.approx(least, rel=1e-9)


def test_training_time_never_below_the_linear_lower_bound() -> None:
    """The vertex rule only tightens the linear bound it replaced (``o + c K`` per step with
    the bubble of the smallest step): never smaller, and larger where the bubble grows
    between the smallest and the largest step."""
    sc, conf, run = _bubble_relaxation()
    o, c = sc.trainer.linear_lower(conf.trainer_gpus, run.k_min)
    swap = sc.trainer.state_swap_s(sc.hardware, sc.model, conf.trainer_gpus)
    gained = []
    for j, k in [(1, 1), (1, 4), (3, 9), (1, sc.steps)]:
        m = k - j + 1
        tokens = run.sk.smallest(0, run.a[(k - 1) // run.t_sync], m * run.q)
        linear = m * (o + swap) + c * tokens
        assert run.train_lb(j, k) >= linear - 1e-9
        gained.append(run.train_lb(j, k) - linear)
    assert gained[-1] > 0.0


def test_a_split_without_replicas_is_one_clear_error() -> None:
    """No standalone GPU and no hybrid replica: no sample can ever be made, so the bound
    says so (it used to divide by the zero sample slots)."""
    from dynsched_sim._scenario import Configuration
    from dynsched_sim._sim import run_workload

    sc = load_scenario("balanced")
    conf = Configuration(name="none", trainer_gpus=32, rollout_gpus=0)
    cfg = sc.schedule_config(sc.configurations[0])
    with pytest.raises(ValueError, match="no replica can produce"):
        lower_bound(sc, conf, run_workload(sc, conf, cfg, 0), cfg)
