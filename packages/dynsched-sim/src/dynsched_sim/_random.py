"""Random scenarios: small clusters with every knob drawn from a wide range.

`random_scenario(seed)` is deterministic for a seed. It serves two purposes: checking that
no run ever beats the lower bound (``benchmarks/sim_bound_validity.py``, ``tests``), and
judging policies on scenarios nobody tuned them on (held-out seeds).
"""

from __future__ import annotations

import numpy as np

from dynsched_sim._scenario import Scenario, scenario_from_dict

__all__ = ["random_scenario"]


def random_scenario(seed: int, *, max_steps: int = 16) -> Scenario:
    """A small random scenario (2-3 configurations of one cluster), seeded.

    Args:
        seed: Seed of the draw (also the scenario's workload seed).
        max_steps: Most micro-steps of the run.
    """
    rng = np.random.Generator(np.random.PCG64(seed))

    def pick(options: list) -> object:  # type: ignore[type-arg]
        return options[int(rng.integers(0, len(options)))]

    def log_uniform(lo: float, hi: float) -> float:
        return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))

    g = int(pick([1, 2, 4, 8]))
    gpu_gib = float(pick([24.0, 48.0, 80.0, 95.6]))
    # weights use 10-40 % of a replica's memory
    params_b = g * gpu_gib * 2**30 * rng.uniform(0.1, 0.4) / 2 / 1e9
    standalone_frac = float(rng.uniform(0.5, 0.9))
    hybrid_frac = float(rng.uniform(0.45, standalone_frac))
    trainer_groups = int(rng.integers(1, 4))
    rollout_groups = int(rng.integers(0, 4))
    n = int(pick([1, 2, 4, 8]))
    q = int(rng.integers(2, 17))
    t_sync = int(pick([1, 2, 4]))
    base = log_uniform(2e-3, 3e-2)
    median = log_uniform(100, 4000)
    steps = int(rng.integers(3, max_steps + 1))
    # the trainer needs roughly as long per sample as generation (0.2x..5x)
    gen_s = median * n / max(1, rollout_groups + trainer_groups) / 40.0
    train_gpu_s_per_token = log_uniform(0.2, 5.0) * gen_s * g * trainer_groups / (median * n)
    length_traj = [[0.0, 1.0], [1.0, float(rng.uniform(0.5, 2.0))]] if rng.random() < 0.5 else []
    diff_traj = (
        [[0.0, float(rng.uniform(0, 0.8))], [1.0, float(rng.uniform(0, 0.8))]]
        if rng.random() < 0.3
        else []
    )
    confs = []
    if rollout_groups:
        confs.append(
            {
                "name": "static",
                "trainer_gpus": trainer_groups * g,
                "rollout_gpus": rollout_groups * g,
                "hybrid": False,
            }
        )
    confs.append(
        {
            "name": "dynamic",
            "trainer_gpus": trainer_groups * g,
            "rollout_gpus": rollout_groups * g,
            "hybrid": True,
        }
    )
    if rollout_groups and trainer_groups > 1:
        confs.append(
            {
                "name": "static-shifted",
                "trainer_gpus": (trainer_groups - 1) * g,
                "rollout_gpus": (rollout_groups + 1) * g,
                "hybrid": False,
            }
        )
    data = {
        "name": f"random-{seed}",
        "description": "random scenario (dynsched_sim.random_scenario)",
        "seed": seed,
        "steps": steps,
        "hardware": {
            "gpu_memory_gib": gpu_gib,
            "h2d_bandwidth_gib_s": log_uniform(5, 50),
            "network_bandwidth_gib_s": log_uniform(2, 50),
            "network_latency_s": float(rng.uniform(0, 5)),
            "local_sync_bandwidth_gib_s": log_uniform(5, 200),
        },
        "model": {
            "params_b": params_b,
            "bytes_per_param": 2,
            "kv_bytes_per_token": log_uniform(2e3, 2e5),
            "state_bytes_per_seq": float(pick([0.0, log_uniform(1e5, 1e8)])),
            "trainer_state_bytes_per_param": float(pick([0.0, 12.0, 16.0])),
        },
        "engine": {
            "gpus_per_replica": g,
            "decode_base_s": base,
            "decode_per_seq_s": base * log_uniform(1 / 500, 1 / 10),
            "prefill_s_per_token": log_uniform(1e-6, 1e-4),
            "max_num_seqs": int(pick([8, 32, 64, 128, 256])),
            "kv_tokens_per_seq": log_uniform(256, 16384),
            "standalone_memory_fraction": standalone_frac,
            "hybrid_memory_fraction": hybrid_frac,
            "sleep_overhead_s": float(rng.uniform(0, 20)),
            "wake_overhead_s": float(rng.uniform(0, 40)),
        },
        "trainer": {
            "gpu_s_per_token": train_gpu_s_per_token,
            "step_overhead_s": float(rng.uniform(0, 20)),
            "offload_state": True,
        },
        "workload": {
            "n": n,
            "max_response_len": int(median * log_uniform(2, 30)) + 1,
            "prompt_len": {"kind": "lognormal", "median": log_uniform(20, 2000), "sigma": 0.3},
            "response_len": {
                "kind": "lognormal",
                "median": median,
                "sigma": float(rng.uniform(0, 1.5)),
            },
            "group_sigma": float(rng.uniform(0, 0.8)),
            "length_trajectory": length_traj,
            "difficulty_trajectory": diff_traj,
        },
        "schedule": {
            "ppo_mini_batch_size": q,
            "require_batches": 1,
            "trigger_parameter_sync_step": t_sync,
            "staleness_threshold": float(rng.uniform(0, 1)),
            "staleness_rule": str(pick(["in_flight_and_queued", "in_flight"])),
            "dynamic_schedule_deactivate_ratio": float(rng.uniform(0, 1)),
            "dynamic_schedule_enable_rebalance": bool(rng.random() < 0.7),
            "partial_rollout": True,
            "concurrent_samples_per_replica": int(rng.integers(1, 33)),
        },
        "configurations": confs,
    }
    return scenario_from_dict(data)
