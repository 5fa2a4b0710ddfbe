"""Calibration fits only the two rates the static runs identify; the dynamic run is predicted."""

from __future__ import annotations

import attrs
import pytest
from dynsched_sim import load_scenario
from dynsched_sim.calibrate import calibrate, format_report, mean_wall


def _truth():  # type: ignore[no-untyped-def]
    """A short seed-qwen35 whose 'published' times come from known rates."""
    sc = load_scenario("seed-qwen35").with_steps(8)
    true = sc.with_values(
        engine={
            "decode_base_s": sc.engine.decode_base_s * 1.5,
            "decode_per_seq_s": sc.engine.decode_per_seq_s * 1.5,
        },
        trainer={"gpu_s_per_token": sc.trainer.gpu_s_per_token * 0.6},
    )
    published = {c.name: mean_wall(true, c.name, [0])[0] for c in sc.configurations}
    return attrs.evolve(sc, published=published), true


def test_calibration_recovers_known_rates_and_only_predicts_the_dynamic_run() -> None:
    sc, true = _truth()
    fitted, rep = calibrate(sc, seeds=[0])
    assert rep.decode_base_s == pytest.approx(true.engine.decode_base_s, rel=0.02)
    assert rep.decode_per_seq_s / rep.decode_base_s == pytest.approx(
        sc.engine.decode_per_seq_s / sc.engine.decode_base_s
    )
    # 8 steps of a partly rollout-bound 8+24 pin the trainer speed less sharply
    assert rep.gpu_s_per_token == pytest.approx(true.trainer.gpu_s_per_token, rel=0.08)
    for fit in rep.fits:
        assert not fit.at_edge
        assert fit.achieved_s == pytest.approx(fit.target_s, rel=2e-3)
    # nothing else moved: the dynamic run is a prediction of the same model
    assert attrs.evolve(fitted, engine=sc.engine, trainer=sc.trainer) == sc
    assert rep.predicted == "dynamic-16-16"
    assert rep.residual == pytest.approx(
        rep.wall_clock_s["dynamic-16-16"] / sc.published["dynamic-16-16"] - 1
    )
    text = format_report(rep, dict(sc.published))
    assert "PREDICTED" in text and "AT THE EDGE" not in text


def test_an_unreachable_target_is_flagged_at_the_edge() -> None:
    sc, _ = _truth()
    sc = attrs.evolve(sc, published={**sc.published, "static-16-16": 1.0})  # one second
    _, rep = calibrate(sc, seeds=[0], rounds=1)
    assert rep.fits[0].at_edge
    assert "AT THE EDGE OF ITS SEARCH RANGE" in format_report(rep, dict(sc.published))
