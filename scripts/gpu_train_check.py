"""Short real training on one GPU: static against dynamic step times.

Runs `dynsched train`'s `TrainRunner` on the addition task with one standalone and one
hybrid replica (vLLM on the GPU) and one `TorchTrainer` on the same GPU, first with
``static_fully_async`` and then with ``default``, and reports each run's step times,
reward and switches as JSON. Ray is told about two GPUs (the trainer pool's and the
standalone pool's bundles) while both roles share the one physical device:
``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1`` keeps every actor on device 0.

Usage::

    hatch run test:python scripts/gpu_train_check.py --device cuda --out gpu-train.json

The CPU path (``--device cpu --engine hf``) runs in the test suite. It has not run on a
GPU: no GPU was lent to the work that wrote it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

CONFIG: dict[str, Any] = {
    "async_training": {
        "use_dynamic_resource_scheduling": True,
        "trigger_parameter_sync_step": 2,
        "staleness_threshold": 0.5,
        "concurrent_samples_per_replica": 8,
        "partial_rollout": True,
    },
    "trainer": {"nnodes": 1, "n_gpus_per_node": 1},
    "rollout": {"nnodes": 1, "n_gpus_per_node": 1},
    "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 8}, "rollout": {"n": 4}},
}


def run(policy: str, args: argparse.Namespace, model: Path) -> dict[str, Any]:
    from dynsched_core import DynamicScheduleConfig
    from dynsched_ray import RayRunOptions
    from dynsched_ray.training import TrainRunner, TrainRunnerOptions, TrainSettings

    cfg = json.loads(json.dumps(CONFIG))
    cfg["async_training"]["dynamic_schedule_policy"] = policy
    config = DynamicScheduleConfig.from_dict(cfg)
    settings = TrainSettings(
        out_dir=str(Path(args.work) / policy),
        model_cache=args.work,
        engine=args.engine,
        steps=args.steps,
        device=args.device,
        seed=args.seed,
    )
    replica_kwargs: dict[str, Any] = {}
    if args.engine == "vllm":
        replica_kwargs = {"device": args.device, "gpu_memory_utilization": 0.2}
    runner = TrainRunner(
        config,
        settings,
        RayRunOptions(name=f"gpu-{policy}"),
        model=model,
        runner_options=TrainRunnerOptions(replica_kwargs=replica_kwargs),
        progress=lambda line: print(f"[{policy}] {line}", flush=True),
    )
    summary = asyncio.run(runner.train())
    rows = summary.rows
    times = [float(r["step_time_s"]) for r in rows]
    return {
        "policy": policy,
        "steps": len(rows),
        "step_time_s": times,
        "median_step_time_s": statistics.median(times),
        "total_loop_s": sum(times),
        "reward": [float(r["reward"]) for r in rows],
        "activations": summary.result.loop.activations,
        "deactivations": summary.result.loop.deactivations,
        "max_lag": max(summary.lags, default=0),
        "wall_s": summary.wall_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", nargs="+", default=["static_fully_async", "default"])
    ap.add_argument("--work", default="gpu-train-work")
    ap.add_argument("--out", default=None, help="write the JSON report here")
    args = ap.parse_args(argv)
    if args.device == "cuda":
        os.environ.setdefault("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "1")
        import torch

        if not torch.cuda.is_available():
            print("gpu_train_check: --device cuda but no CUDA device is visible", file=sys.stderr)
            return 2

    import ray
    from dynsched_ray.task.addition import warm_up

    model = warm_up(args.work)
    started = not ray.is_initialized()
    if started:
        ray.init(
            address="local", num_cpus=8, num_gpus=2, include_dashboard=False, log_to_driver=False
        )
    t0 = time.monotonic()
    try:
        runs = [run(p, args, model) for p in args.policies]
    finally:
        if started:
            ray.shutdown()
    report = {
        "device": args.device,
        "engine": args.engine,
        "config": CONFIG,
        "runs": runs,
        "wall_s": time.monotonic() - t0,
    }
    if len(runs) > 1:
        base = runs[0]["median_step_time_s"]
        report["median_step_time_ratio"] = {
            r["policy"]: r["median_step_time_s"] / base if base else None for r in runs
        }
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
