"""Per-sample staleness: the recorder (by hand), the closed form (properties), the CLI line."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from dynsched_core import GenerateRequest
from dynsched_sim import (
    EngineModel,
    HardwareModel,
    LLMModel,
    SimReplica,
    load_scenario,
    predicted_staleness,
    predicted_staleness_for,
    run_configuration,
    run_virtual,
)
from dynsched_sim._versions import StalenessLedger
from dynsched_sim.calibrate import scenario_to_dict
from dynsched_sim.cli import main
from hypothesis import given
from hypothesis import strategies as st

# --- the recorder ---------------------------------------------------------------------


def _sample(sid: str, admitted: int, versions: dict[str, tuple[int, ...]]) -> SimpleNamespace:
    """A consumed sample: responses with request ids and the versions their attempts saw."""
    responses = tuple(SimpleNamespace(request_id=r, param_versions=v) for r, v in versions.items())
    last = max(v for vs in versions.values() for v in vs)
    return SimpleNamespace(
        sample_id=sid, responses=responses, param_version=admitted, max_param_version=last
    )


def test_ledger_by_hand() -> None:
    led = StalenessLedger()
    # the replicas recorded each request's first-token version
    led.first_token.update({"a0": 1, "a1": 2, "b0": 3, "c0": 0})
    # a: admitted under v1, first token v1 (a0), resumed across a sync up to v3
    a = _sample("a", 1, {"a0": (1, 3), "a1": (2,)})
    b = _sample("b", 2, {"b0": (3,)})  # admitted under v2, first token only after v3
    led.consume(3, [a, b])
    c = _sample("c", 0, {"c0": (0, 1, 2)})  # a partial rollout spanning v0..v2
    led.consume(4, [c])
    assert led.behind == [3 - 1, 3 - 3, 4 - 0]  # by the first token (the reported one)
    assert led.behind_last == [0, 0, 2]
    assert led.behind_admitted == [2, 1, 4]
    s = led.summary()
    assert s["count"] == 3 and s["mean"] == pytest.approx(2.0) and s["max"] == 4
    assert s["p95"] == 4  # nearest rank: ceil(0.95 * 3) = 3rd smallest
    assert s["last_token_mean"] == pytest.approx(2 / 3)
    assert s["admitted_mean"] == pytest.approx(7 / 3)
    assert StalenessLedger().summary()["count"] == 0


def test_replica_records_the_first_tokens_version() -> None:
    eng = EngineModel(
        gpus_per_replica=1,
        decode_base_s=0.01,
        decode_per_seq_s=0.0,
        prefill_s_per_token=0.0,
        kv_tokens_per_seq=64.0,
    )
    first: dict[str, int] = {}
    rep = SimReplica("r", eng, HardwareModel(), LLMModel(params_b=7.0), first_tokens=first)

    async def go() -> int | None:
        # "a" decodes 100 tokens (1 s) under v0, then a sync installs v1 while it runs
        req_a = GenerateRequest(request_id="a", max_tokens=10**6, target_len=1000)
        a = asyncio.ensure_future(rep.generate(req_a))
        await asyncio.sleep(1.0)
        await rep.update_weights(1)
        # "b" is submitted after the sync: its first token is v1's
        req_b = GenerateRequest(request_id="b", max_tokens=10**6, target_len=5)
        ra, _ = await asyncio.gather(a, rep.generate(req_b))
        return ra.param_version

    last_version = run_virtual(go())
    assert last_version == 1  # the attempt ended under v1 (its last token's version)
    assert first == {"a": 0, "b": 1}


def _tiny(threshold: float, steps: int = 6) -> object:
    sc = load_scenario("training-bound").with_steps(steps)
    return sc.with_values(
        schedule={"trigger_parameter_sync_step": 1, "staleness_threshold": threshold}
    )


def test_synchronous_window_is_never_stale() -> None:
    """threshold 0: each window admits exactly what its version trains on (hand: all 0)."""
    r = run_configuration(_tiny(0.0), "static-8-24")  # type: ignore[arg-type]
    assert r.staleness["count"] == 6 * 16
    assert r.staleness["mean"] == 0 and r.staleness["max"] == 0


def test_one_batch_carried_per_sync_by_hand() -> None:
    """T = 1, threshold 1 (window 2B), trainer-bound: after each sync the B samples of the
    last window still in the system are one version behind; step 1 has none. So the
    samples consumed are behind by 0 (step 1's B) and 1 (the B of each later step)."""
    steps = 6
    sc = _tiny(1.0, steps)
    r = run_configuration(sc, "static-8-24")  # type: ignore[arg-type]
    assert r.staleness["count"] == steps * 16
    assert r.staleness["mean"] == pytest.approx((steps - 1) / steps)
    assert r.staleness["max"] == 1 and r.staleness["p95"] == 1
    # the closed form's trainer-bound case is this count exactly
    assert predicted_staleness_for(sc, "static-8-24") == pytest.approx((steps - 1) / steps)  # type: ignore[arg-type]


# --- the closed form --------------------------------------------------------------------

_args = st.fixed_dictionaries(
    {
        "utilization": st.floats(0.0, 1.5),
        "required_samples": st.integers(1, 256),
        "trigger_parameter_sync_step": st.integers(1, 8),
        "max_required_samples": st.integers(0, 4096),
        "concurrency": st.floats(0.0, 4096.0),
        "n": st.integers(1, 16),
        "length_tail": st.floats(1.0, 16.0),
        "running_slots": st.floats(0.0, 1e5),
    }
)


@given(_args)
def test_closed_form_is_finite_and_within_the_window(kw: dict[str, float]) -> None:
    s = predicted_staleness(**kw)  # type: ignore[arg-type]
    b, t = kw["required_samples"], kw["trigger_parameter_sync_step"]
    assert math.isfinite(s) and s >= 0.0
    # verl's window: never more than (M - T B) / (B T), i.e. the staleness threshold
    assert s <= max(0.0, kw["max_required_samples"] - t * b) / (b * t) + 1e-12


@given(
    _args,
    st.sampled_from(
        ["utilization", "max_required_samples", "concurrency", "running_slots", "length_tail"]
    ),
    st.floats(0.0, 100.0),
)
def test_closed_form_is_monotone(kw: dict[str, float], field: str, more: float) -> None:
    """More utilization, admission budget, concurrency, decode slots or tail: never less
    staleness (each holds more samples in the system at a sync)."""
    bigger = dict(kw)
    bigger[field] = kw[field] + (int(more) if field == "max_required_samples" else more)
    assert predicted_staleness(**bigger) >= predicted_staleness(**kw) - 1e-12  # type: ignore[arg-type]


@given(_args)
def test_closed_form_zero_cases(kw: dict[str, float]) -> None:
    b, t = kw["required_samples"], kw["trigger_parameter_sync_step"]
    # threshold 0 (M = T B): the window admits exactly one version's batches
    assert predicted_staleness(**{**kw, "max_required_samples": t * b}) == 0.0  # type: ignore[arg-type]
    # a run no longer than one sync cycle: no sync precedes a consumption
    assert predicted_staleness(**kw, steps=t) == 0.0  # type: ignore[arg-type]
    # nothing in flight and the trainer never trains: nothing waits through a sync
    assert predicted_staleness(**{**kw, "utilization": 0.0, "concurrency": 0.0}) == 0.0  # type: ignore[arg-type]


@given(_args)
def test_trainer_bound_fills_the_window(kw: dict[str, float]) -> None:
    b, t, m = kw["required_samples"], kw["trigger_parameter_sync_step"], kw["max_required_samples"]
    s = predicted_staleness(**{**kw, "utilization": 1.0})  # type: ignore[arg-type]
    assert s == pytest.approx(max(0, m - t * b) / (b * t))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("utilization", -0.1),
        ("concurrency", float("nan")),
        ("length_tail", 0.5),
        ("required_samples", 0),
        ("n", 0),
    ],
)
def test_closed_form_refuses_bad_input(field: str, value: float) -> None:
    kw = {
        "utilization": 0.5,
        "required_samples": 16,
        "trigger_parameter_sync_step": 4,
        "max_required_samples": 96,
        "concurrency": 32.0,
    }
    kw[field] = value
    with pytest.raises(ValueError, match=field):
        predicted_staleness(**kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="staleness_rule"):
        predicted_staleness(**{**kw, field: 1, "staleness_rule": "whatever"})  # type: ignore[arg-type]


def test_prediction_of_a_builtin_is_near_its_measurement() -> None:
    sc = load_scenario("rollout-bound").with_steps(12)
    measured = run_configuration(sc, "static-16-16").staleness["mean"]
    assert predicted_staleness_for(sc, "static-16-16") == pytest.approx(measured, rel=0.10)


# --- dynsched simulate ------------------------------------------------------------------


def test_simulate_shows_staleness(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = scenario_to_dict(load_scenario("seed-qwen35").with_steps(8))
    d["seeds"] = 1
    p = tmp_path / "short.yaml"
    p.write_text(yaml.safe_dump(d))
    out = tmp_path / "o"
    assert main(["--scenario", str(p), "--out", str(out), "--quiet"]) in (0, None)
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("staleness"))
    assert "mean/p95/max" in line and "static-16-16 " in line
    res = json.loads((out / "result.json").read_text())
    for run in res["runs"]:
        assert set(run["staleness"]) >= {"count", "mean", "p95", "max"}
        assert run["staleness"]["count"] == 8 * 16
    assert all("mean" in a["staleness"] for a in res["aggregate"])
    assert "stale mean/p95/max" in (out / "table.txt").read_text()
