"""Whole simulated runs: conservation, determinism, machine-speed independence (the bound:
test_bound.py)."""

from __future__ import annotations

import json
import time

import pytest
from dynsched_sim import SimReplica, load_scenario
from dynsched_sim._sim import run_configuration
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def _short(name: str, steps: int = 8):  # type: ignore[no-untyped-def]
    sc = load_scenario(name)
    return sc.with_steps(min(sc.steps, steps))


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(["default", "fixed_ratio"]))
def test_conservation_across_aborts_and_rebalances(seed: int, policy: str) -> None:
    sc = _short("seed-qwen35", 12)
    r = run_configuration(sc, "dynamic-16-16", policy, seed=seed)
    assert all(r.conservation.values()), r.conservation
    s = r.summary
    # the run really exercised the paths conservation is about
    assert s["aborted_requests"] > 0 and s["activations"] > 0
    assert s["samples_produced"] == s["samples_consumed"] + s["samples_left_in_queue"]
    assert s["samples_consumed"] == 12 * 16
    assert s["tokens_trained"] > 0


def test_same_seed_same_result_bit_for_bit() -> None:
    sc = _short("seed-qwen35", 12)
    a = json.dumps(run_configuration(sc, "dynamic-16-16", "default", seed=3).to_json())
    b = json.dumps(run_configuration(sc, "dynamic-16-16", "default", seed=3).to_json())
    c = json.dumps(run_configuration(sc, "dynamic-16-16", "default", seed=4).to_json())
    assert a == b
    assert a != c


def test_results_do_not_depend_on_machine_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = _short("seed-qwen35", 8)
    fast = json.dumps(run_configuration(sc, "dynamic-16-16", "default").to_json())
    original = SimReplica._on_departure

    def slow(self: SimReplica) -> None:
        t = time.perf_counter()
        while time.perf_counter() - t < 2e-4:  # a much slower machine
            pass
        original(self)

    monkeypatch.setattr(SimReplica, "_on_departure", slow)
    slow_json = json.dumps(run_configuration(sc, "dynamic-16-16", "default").to_json())
    assert slow_json == fast


def test_colocated_completes_with_every_builtin_policy() -> None:
    sc = _short("colocated", 8)
    for pol in ("default", "static_fully_async", "fixed_ratio"):
        r = run_configuration(sc, "colocated-32", pol)
        assert r.summary["steps"] == 8 and r.summary["activations"] > 0, pol


def test_conservation_check_catches_lost_partial_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine that drops the tokens of aborted attempts must fail the conservation check."""
    import dynsched_sim._replica as replica_mod
    from dynsched_core import GenerateResult

    def lossy(**kw):  # type: ignore[no-untyped-def]
        if kw.get("finish_reason") == "abort":
            kw["num_tokens"] = 0  # the client then generates those tokens again
        return GenerateResult(**kw)

    monkeypatch.setattr(replica_mod, "GenerateResult", lossy)
    sc = _short("seed-qwen35", 12)
    r = run_configuration(sc, "dynamic-16-16", "default")
    assert r.summary["aborted_requests"] > 0
    assert r.conservation["responses_complete_and_exact"] is False


def test_same_result_in_fresh_processes_with_different_hash_seeds() -> None:
    """Bit-identical across interpreters: no dependence on set/dict hash order."""
    import hashlib
    import os
    import subprocess
    import sys

    code = (
        "import json, hashlib\n"
        "from dynsched_sim import load_scenario, run_configuration\n"
        "r = run_configuration(load_scenario('seed-qwen35').with_steps(8), 'dynamic-16-16', 'default')\n"
        "print(hashlib.sha256(json.dumps(r.to_json()).encode()).hexdigest())\n"
    )
    digests = set()
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    assert len(digests) == 1
    assert len(next(iter(digests))) == len(hashlib.sha256().hexdigest())
