"""The helpers the modules share: attrs validators, the public scheduler surface, CLI flags."""

from __future__ import annotations

import math

import attrs
import dynsched_optimus.scheduler as public
import pytest
from dynsched_optimus import (
    ConvergenceConfig,
    OptimusError,
    PSSpeedModel,
    StepTimeModel,
    _scheduler,
    fit_speed,
)
from dynsched_optimus.cli import main
from hypothesis import given
from hypothesis import strategies as st

_NON_POSITIVE = st.one_of(
    st.floats(max_value=0.0, allow_nan=False), st.just(math.nan), st.just(math.inf)
)
_NEGATIVE = st.one_of(
    st.floats(max_value=-1e-12, allow_nan=False), st.just(math.nan), st.just(-math.inf)
)


@given(_NON_POSITIVE)
def test_positive_fields_name_the_field(value: float) -> None:
    for record, field in ((StepTimeModel, "batch"), (ConvergenceConfig, "delta")):
        with pytest.raises(OptimusError, match=f"^{field} must be a finite number > 0, got"):
            record(**{field: value})


@given(_NEGATIVE)
def test_non_negative_fields_name_the_field(value: float) -> None:
    with pytest.raises(OptimusError, match="^t_back must be a finite number >= 0, got"):
        StepTimeModel(t_back=value)
    assert StepTimeModel(t_back=0.0).t_back == 0.0


@given(st.one_of(st.none(), st.floats(min_value=1e-9, max_value=1e9)))
def test_optional_positive_accepts_none_and_positive(value: float | None) -> None:
    assert ConvergenceConfig(recency_half_life=value).recency_half_life == value


def test_optional_positive_and_int_bounds_reject() -> None:
    with pytest.raises(OptimusError, match="^recency_half_life must be None or a finite"):
        ConvergenceConfig(recency_half_life=0.0)
    with pytest.raises(OptimusError, match="^b2_grid must be an integer >= 4, got 3"):
        ConvergenceConfig(b2_grid=3)
    with pytest.raises(OptimusError, match="^mode must be one of"):
        StepTimeModel(mode="both")


def test_ps_speed_model_fit_is_fit_speed() -> None:
    p, w, f = [1, 1, 2, 2, 4, 3], [1, 2, 2, 4, 4, 6], [1.0, 1.8, 2.1, 3.5, 4.0, 4.2]
    assert PSSpeedModel.fit("async", p, w, f) == fit_speed("async", p, w, f)
    assert "fit" not in {a.name for a in attrs.fields(PSSpeedModel)}


def test_scheduler_module_exports_every_strategy() -> None:
    assert set(_scheduler.__all__) <= set(public.__all__)
    assert len(public.__all__) == len(set(public.__all__))
    for name in public.__all__:
        assert getattr(public, name) is not None
    assert public.make_optimus is _scheduler.make_optimus


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["allocate", "--help"])
    assert "(default: 0.95)" in " ".join(capsys.readouterr().out.split())


def test_handler_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["paa", "--ps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dynsched optimus paa: error:") and "\n" not in err
