"""``dynsched run --backend ray``: the reference fully-async loop on a Ray cluster.

Registered through the ``dynsched.cli`` entry point group (``run``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any

__all__ = ["DEMO_CONFIG", "build_config", "main", "register"]

logger = logging.getLogger(__name__)

#: Used when no ``--config`` is given: 2 trainer GPUs (2 hybrid replicas), 2 standalone.
DEMO_CONFIG: dict[str, Any] = {
    "async_training": {
        "use_dynamic_resource_scheduling": True,
        "dynamic_schedule_policy": "default",
        "trigger_parameter_sync_step": 2,
        "staleness_threshold": 0.5,
        "concurrent_samples_per_replica": 4,
        "partial_rollout": True,
    },
    "trainer": {"nnodes": 1, "n_gpus_per_node": 2},
    "rollout": {"nnodes": 1, "n_gpus_per_node": 2},
    "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 2}},
}


def _parse_value(text: str) -> Any:
    try:
        import yaml

        return yaml.safe_load(text)
    except ImportError:  # pragma: no cover - PyYAML is usually there
        try:
            return json.loads(text)
        except ValueError:
            return text


def build_config(path: str | None, overrides: list[str]) -> Any:
    """The core config from a YAML file (verl layout) or the demo, plus ``key=value`` overrides.

    Raises:
        ConfigError: invalid file or values; SystemExit on a malformed override.
    """
    from dynsched_core import DynamicScheduleConfig
    from dynsched_core._config import _expand_dotted

    data: dict[str, Any]
    if path:
        import yaml

        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    else:
        data = json.loads(json.dumps(DEMO_CONFIG))
    merged = _expand_dotted(data)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"dynsched run: --set expects KEY=VALUE, got {item!r}")
        extra = _expand_dotted({key.strip(): _parse_value(value)})
        _merge(merged, extra)
    return DynamicScheduleConfig.from_dict(merged)


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def register(subparsers: Any) -> None:
    """Add the ``run`` sub-command to the ``dynsched`` dispatcher."""
    p = subparsers.add_parser(
        "run",
        help="run the fully-async loop with dynamic scheduling on a backend (ray)",
        description=(
            "Run the reference fully-async RL loop (in-memory engines for now) with dynamic "
            "resource scheduling. Prints one line per step/switch/failure and writes the "
            "dynamic_resource/* metrics as JSON lines."
        ),
    )
    p.add_argument("--backend", choices=["ray"], default="ray", help="execution backend (ray)")
    p.add_argument(
        "--config", default=None, help="YAML config (verl layout or flat keys); default: a demo"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (dotted verl key or flat name); repeatable",
    )
    p.add_argument("--policy", default=None, help="policy name (overrides dynamic_schedule_policy)")
    p.add_argument(
        "--steps", type=int, default=None, help="trainer micro-steps (default: config or 8)"
    )
    p.add_argument("--prompts", type=int, default=None, help="prompts of the synthetic source")
    p.add_argument(
        "--address",
        default=None,
        help="join this Ray cluster (e.g. 'auto'); default: start a local one",
    )
    p.add_argument("--namespace", default=None, help="Ray namespace of the named actors")
    p.add_argument("--name", default="dynsched", help="run name (prefix of actor names)")
    p.add_argument(
        "--metrics", default="dynsched-metrics.jsonl", help="JSON-lines metrics file ('' for none)"
    )
    p.add_argument(
        "--checkpoint", default=None, help="driver checkpoint file (written after each sync)"
    )
    p.add_argument("--resume", action="store_true", help="restore from --checkpoint before running")
    p.add_argument(
        "--keep-router", action="store_true", help="leave the named router actor alive at the end"
    )
    p.add_argument(
        "--tokens-per-s",
        type=float,
        default=2000.0,
        help="decoding speed of the in-memory replicas",
    )
    p.add_argument(
        "--trainer-step-time", type=float, default=0.05, help="seconds per stand-in training step"
    )
    p.add_argument(
        "--trainer-workers",
        type=int,
        default=None,
        help="trainer worker actors (default: one per trainer GPU)",
    )
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local cluster")
    p.add_argument("--quiet", action="store_true", help="no progress lines, only the summary")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Handler of ``dynsched run``."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from dynsched_core import ConfigError, DynschedError

    try:
        config = build_config(args.config, list(args.overrides))
        if args.policy:
            config = config.evolve(dynamic_schedule_policy=args.policy)
        policy = config.build_policy()
    except (ConfigError, OSError, DynschedError) as exc:
        print(f"dynsched run: {exc}", file=sys.stderr)
        return 2

    import ray

    from dynsched_ray._runner import RayRunner, RayRunOptions

    options = RayRunOptions(
        name=args.name,
        namespace=args.namespace,
        num_steps=args.steps,
        num_prompts=args.prompts,
        tokens_per_s=args.tokens_per_s,
        trainer_step_time_s=args.trainer_step_time,
        trainer_workers=args.trainer_workers,
        metrics_path=args.metrics or None,
        checkpoint_path=args.checkpoint,
        resume=bool(args.resume),
        keep_router=bool(args.keep_router),
    )
    started = False
    if not ray.is_initialized():
        if args.address:
            ray.init(address=args.address, namespace=args.namespace, log_to_driver=False)
        else:
            ray.init(
                num_cpus=args.num_cpus or 4,
                num_gpus=config.hybrid_gpus + config.standalone_gpus,
                include_dashboard=False,
                object_store_memory=200 * 1024 * 1024,
                namespace=args.namespace,
                log_to_driver=False,
            )
        started = True
    printer = None if args.quiet else (lambda line: print(line, flush=True))
    print(
        f"dynsched run --backend ray: policy {config.dynamic_schedule_policy}, "
        f"{config.num_standalone_replicas} standalone + {config.num_hybrid_replicas} hybrid replica(s), "
        f"{config.required_samples} sample(s)/step, T={config.trigger_parameter_sync_step}",
        flush=True,
    )
    try:
        result = asyncio.run(RayRunner(config, options, policy=policy, progress=printer).run())
    except DynschedError as exc:
        print(f"dynsched run: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if started:
            ray.shutdown()
    loop = result.loop
    print(
        f"finished: {loop.steps} step(s) from step {result.first_step}, version {result.final_version}, "
        f"{loop.samples_consumed} consumed / {loop.samples_produced} produced / {loop.samples_left} left, "
        f"{loop.activations} activation(s), {loop.deactivations} deactivation(s)"
    )
    for rec in result.metrics:
        keys = {
            k.split("/")[-1]: round(v, 3)
            for k, v in rec.items()
            if k.startswith("dynamic_resource/")
        }
        print(f"cycle {rec['cycle']} (step {rec['step']}): {keys}")
    if options.metrics_path:
        print(f"metrics: {options.metrics_path}")
    return 0
