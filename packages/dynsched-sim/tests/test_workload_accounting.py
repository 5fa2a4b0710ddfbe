"""Workload draws, the lower bound by hand, ground-truth accounting."""

from __future__ import annotations

import numpy as np
import pytest
from dynsched_core import EventBus, ReplicaModeEvent
from dynsched_sim import (
    GroupAccountant,
    LengthDistribution,
    WorkloadModel,
    load_scenario,
    lower_bound,
)
from dynsched_sim._workload import Workload
from hypothesis import given
from hypothesis import strategies as st


@given(st.integers(0, 2**32 - 1))
def test_workload_is_seeded_and_capped(seed: int) -> None:
    wm = WorkloadModel(
        n=4, response_len=LengthDistribution(median=500, sigma=2.0), max_response_len=2000
    )
    a, b = wm.generate(50, seed), wm.generate(50, seed)
    assert np.array_equal(a.response_lens, b.response_lens) and np.array_equal(
        a.prompt_lens, b.prompt_lens
    )
    assert a.response_lens.shape == (50, 4)
    assert a.response_lens.min() >= 1 and a.response_lens.max() <= 2000
    g = a.group(3)
    assert g.tokens == 4 * g.prompt_len + sum(g.response_lens) == a.group_tokens()[3]


def test_empirical_distribution_draws_from_values() -> None:
    wm = WorkloadModel(
        n=2,
        response_len=LengthDistribution(kind="empirical", values=(10, 20, 90000)),
        max_response_len=1000,
    )
    w = wm.generate(200, 1)
    assert set(np.unique(w.response_lens)) <= {10, 20, 1000}


def test_lower_bound_by_hand() -> None:
    sc = load_scenario("seed-qwen35").with_steps(4)  # one cycle: 64 samples consumed
    conf = sc.configuration("static-16-16")
    a = 2 * 96  # (steps/T + 1) * max_required_samples
    w = Workload(prompt_lens=np.full(a, 100), response_lens=np.tile(np.arange(1, 9) * 100, (a, 1)))
    lb = lower_bound(sc, conf, w)
    eng, hw, llm, tr = sc.engine, sc.hardware, sc.model, sc.trainer
    p = eng.peak_throughput("standalone", hw, llm) / 8
    r_i, k_i = 3600.0, 800.0 + 3600.0
    work = (4 * tr.step_overhead_s * 16 + 64 * (r_i / p + tr.gpu_s_per_token * k_i)) / 32
    train = 4 * tr.step_overhead_s + tr.gpu_s_per_token * 64 * k_i / 16
    assert lb.seconds == pytest.approx(max(work, train))
    assert lb.work_term_s == pytest.approx(work) and lb.train_term_s == pytest.approx(train)


def test_accountant_mode_priority_and_fractions() -> None:
    now = [0.0]
    bus = EventBus()
    seen: list[ReplicaModeEvent] = []
    bus.subscribe(seen.append)
    acc = GroupAccountant(lambda: now[0], bus)
    acc.add_group("t", 8, "trainer")
    acc.add_group("s", 8, "standalone")
    acc.set_engine("s", "rollout")
    acc.set_engine("t", "rollout")
    now[0] = 10.0
    acc.set_trainer("t", "train")  # train wins over an awake engine
    now[0] = 30.0
    acc.set_trainer("t", "")
    acc.set_engine("t", "switching")
    now[0] = 40.0
    acc.set_engine("t", "idle")
    now[0] = 50.0
    use = {u.name: u for u in acc.usage()}
    assert use["t"].seconds == {
        "train": 20.0,
        "rollout": 10.0,
        "weight_sync": 0.0,
        "switching": 10.0,
        "idle": 10.0,
    }
    assert use["s"].seconds["rollout"] == 50.0
    fr = acc.pool_fractions()
    assert fr["cluster"]["rollout"] == pytest.approx(60 / 100)
    for pool in fr.values():
        assert sum(pool.values()) == pytest.approx(1.0)
    modes = [e.mode for e in seen if e.group == "t"]
    assert modes == ["idle", "rollout", "train", "rollout", "switching", "idle"]
