"""The held-out scenario family: deterministic draws inside the documented ranges."""

from __future__ import annotations

import attrs
import pytest
from dynsched_sim import HELD_OUT_FIRST_DRAW, HELD_OUT_RANGES, heldout_scenario, load_scenario


def test_a_draw_is_deterministic_and_fully_labelled() -> None:
    a, b = heldout_scenario(HELD_OUT_FIRST_DRAW), heldout_scenario(HELD_OUT_FIRST_DRAW)
    assert attrs.asdict(a) == attrs.asdict(b)
    assert a.unlabelled() == []
    for path in HELD_OUT_RANGES:
        label = a.label_of(path)
        assert label is not None and label[0] == "judgement"


@pytest.mark.parametrize("i", range(20))
def test_draws_stay_inside_the_documented_ranges(i: int) -> None:
    base = load_scenario("seed-qwen35")
    sc = heldout_scenario(HELD_OUT_FIRST_DRAW + i)
    assert 7.0 <= sc.model.params_b <= 70.0
    assert 0.5 <= sc.trainer.gpu_s_per_token / base.trainer.gpu_s_per_token <= 2.0
    assert 2000.0 <= sc.workload.response_len.median <= 12000.0
    assert 0.4 <= sc.workload.response_len.sigma <= 1.2
    assert 0.8 <= sc.workload.length_trajectory[-1][1] <= 2.0
    dyn = [c for c in sc.configurations if c.hybrid]
    assert len(dyn) == 1 and dyn[0].total_gpus in (24, 32, 48, 64)
    statics = [c for c in sc.configurations if not c.hybrid]
    assert statics and all(c.total_gpus == dyn[0].total_gpus for c in statics)
    assert all(c.trainer_gpus >= 8 and c.rollout_gpus >= 8 for c in sc.configurations)
    for c in sc.configurations:
        sc.schedule_config(c)  # valid for the core
