"""Random scenarios: small clusters with every knob drawn from a wide range.

`random_scenario(seed)` is deterministic for a seed. It serves two purposes: checking that
no run ever beats the lower bound (``benchmarks/sim_bound_validity.py``, ``tests``), and
judging policies on scenarios nobody tuned them on (held-out seeds).

The draws happen in a fixed order (the shape of the cluster first, then each section of
the scenario in file order); changing that order changes every random scenario.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynsched_sim._scenario import Scenario, scenario_from_dict

__all__ = ["random_scenario"]


class _Draws:
    """The seeded generator with the three kinds of draw the scenario uses."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def pick(self, options: list[Any]) -> Any:
        """One of ``options``, uniformly."""
        return options[int(self.rng.integers(0, len(options)))]

    def uniform(self, lo: float, hi: float) -> float:
        """Uniform in ``[lo, hi)``."""
        return float(self.rng.uniform(lo, hi))

    def log_uniform(self, lo: float, hi: float) -> float:
        """Log-uniform in ``[lo, hi)``."""
        return float(np.exp(self.rng.uniform(np.log(lo), np.log(hi))))


def _configurations(g: int, trainer_groups: int, rollout_groups: int) -> list[dict[str, Any]]:
    """The splits a random cluster compares: the static split (when there is a rollout
    pool), the dynamic one, and the static split with one replica moved to the rollout
    pool (when the trainer keeps one)."""
    splits = [("dynamic", trainer_groups, rollout_groups, True)]
    if rollout_groups:
        splits.insert(0, ("static", trainer_groups, rollout_groups, False))
        if trainer_groups > 1:
            splits.append(("static-shifted", trainer_groups - 1, rollout_groups + 1, False))
    return [
        {"name": name, "trainer_gpus": t * g, "rollout_gpus": r * g, "hybrid": hybrid}
        for name, t, r, hybrid in splits
    ]


class _Shape:
    """The cluster's shape: the draws every section depends on (drawn first, in order)."""

    def __init__(self, d: _Draws, max_steps: int) -> None:
        rng = d.rng
        self.g = int(d.pick([1, 2, 4, 8]))
        self.gpu_gib = float(d.pick([24.0, 48.0, 80.0, 95.6]))
        # weights use 10-40 % of a replica's memory
        self.params_b = self.g * self.gpu_gib * 2**30 * rng.uniform(0.1, 0.4) / 2 / 1e9
        self.standalone_frac = d.uniform(0.5, 0.9)
        self.hybrid_frac = d.uniform(0.45, self.standalone_frac)
        self.trainer_groups = int(rng.integers(1, 4))
        self.rollout_groups = int(rng.integers(0, 4))
        self.n = int(d.pick([1, 2, 4, 8]))
        self.q = int(rng.integers(2, 17))
        self.t_sync = int(d.pick([1, 2, 4]))
        self.base = d.log_uniform(2e-3, 3e-2)
        self.median = d.log_uniform(100, 4000)
        self.steps = int(rng.integers(3, max_steps + 1))
        # the trainer needs roughly as long per sample as generation (0.2x..5x)
        gen_s = self.median * self.n / max(1, self.rollout_groups + self.trainer_groups) / 40.0
        self.train_gpu_s_per_token = (
            d.log_uniform(0.2, 5.0) * gen_s * self.g * self.trainer_groups / (self.median * self.n)
        )
        self.length_traj = [[0.0, 1.0], [1.0, d.uniform(0.5, 2.0)]] if rng.random() < 0.5 else []
        self.diff_traj = (
            [[0.0, d.uniform(0, 0.8)], [1.0, d.uniform(0, 0.8)]] if rng.random() < 0.3 else []
        )


def _hardware(d: _Draws, s: _Shape) -> dict[str, Any]:
    return {
        "gpu_memory_gib": s.gpu_gib,
        "h2d_bandwidth_gib_s": d.log_uniform(5, 50),
        "network_bandwidth_gib_s": d.log_uniform(2, 50),
        "network_latency_s": d.uniform(0, 5),
        "local_sync_bandwidth_gib_s": d.log_uniform(5, 200),
    }


def _model(d: _Draws, s: _Shape) -> dict[str, Any]:
    return {
        "params_b": s.params_b,
        "bytes_per_param": 2,
        "kv_bytes_per_token": d.log_uniform(2e3, 2e5),
        "state_bytes_per_seq": float(d.pick([0.0, d.log_uniform(1e5, 1e8)])),
        "trainer_state_bytes_per_param": float(d.pick([0.0, 12.0, 16.0])),
    }


def _engine(d: _Draws, s: _Shape) -> dict[str, Any]:
    return {
        "gpus_per_replica": s.g,
        "decode_base_s": s.base,
        "decode_per_seq_s": s.base * d.log_uniform(1 / 500, 1 / 10),
        "prefill_s_per_token": d.log_uniform(1e-6, 1e-4),
        "max_num_seqs": int(d.pick([8, 32, 64, 128, 256])),
        "kv_tokens_per_seq": d.log_uniform(256, 16384),
        "standalone_memory_fraction": s.standalone_frac,
        "hybrid_memory_fraction": s.hybrid_frac,
        "sleep_overhead_s": d.uniform(0, 20),
        "wake_overhead_s": d.uniform(0, 40),
    }


def _trainer(d: _Draws, s: _Shape) -> dict[str, Any]:
    return {
        "gpu_s_per_token": s.train_gpu_s_per_token,
        "step_overhead_s": d.uniform(0, 20),
        "offload_state": True,
    }


def _workload(d: _Draws, s: _Shape) -> dict[str, Any]:
    return {
        "n": s.n,
        "max_response_len": int(s.median * d.log_uniform(2, 30)) + 1,
        "prompt_len": {"kind": "lognormal", "median": d.log_uniform(20, 2000), "sigma": 0.3},
        "response_len": {"kind": "lognormal", "median": s.median, "sigma": d.uniform(0, 1.5)},
        "group_sigma": d.uniform(0, 0.8),
        "length_trajectory": s.length_traj,
        "difficulty_trajectory": s.diff_traj,
    }


def _schedule(d: _Draws, s: _Shape) -> dict[str, Any]:
    return {
        "ppo_mini_batch_size": s.q,
        "require_batches": 1,
        "trigger_parameter_sync_step": s.t_sync,
        "staleness_threshold": d.uniform(0, 1),
        "staleness_rule": str(d.pick(["in_flight_and_queued", "in_flight"])),
        "dynamic_schedule_deactivate_ratio": d.uniform(0, 1),
        "dynamic_schedule_enable_rebalance": bool(d.rng.random() < 0.7),
        "partial_rollout": True,
        "concurrent_samples_per_replica": int(d.rng.integers(1, 33)),
    }


#: The drawn sections, in the order they are drawn.
_SECTIONS = (
    ("hardware", _hardware),
    ("model", _model),
    ("engine", _engine),
    ("trainer", _trainer),
    ("workload", _workload),
    ("schedule", _schedule),
)


def random_scenario(seed: int, *, max_steps: int = 16) -> Scenario:
    """A small random scenario (2-3 configurations of one cluster), seeded.

    Args:
        seed: Seed of the draw (also the scenario's workload seed).
        max_steps: Most micro-steps of the run.
    """
    d = _Draws(seed)
    shape = _Shape(d, max_steps)
    data: dict[str, Any] = {
        "name": f"random-{seed}",
        "description": "random scenario (dynsched_sim.random_scenario)",
        "seed": seed,
        "steps": shape.steps,
    }
    for section, draw in _SECTIONS:
        data[section] = draw(d, shape)
    data["configurations"] = _configurations(shape.g, shape.trainer_groups, shape.rollout_groups)
    return scenario_from_dict(data)
