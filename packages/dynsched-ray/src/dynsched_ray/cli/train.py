"""``dynsched train``: real fully-async RL with dynamic scheduling on Ray.

Registered through the ``dynsched.cli`` entry point group (``train``). Every input is
checked before Ray starts (one-line error, exit status 2); Ctrl-C stops the run and
exits with status 130.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from dynsched_ray.cli.config import DEMO_ASYNC_TRAINING, add_config_arguments, add_ray_arguments

__all__ = ["DEMO_TRAIN_CONFIG", "ProgressBar", "load_train_config", "main", "register"]

#: Used when no ``--config`` is given: 2 trainer GPUs (2 hybrid replicas), 2 standalone
#: replicas, 8 prompts of 4 responses per step, weights synced every 2 steps.
DEMO_TRAIN_CONFIG: dict[str, Any] = {
    "async_training": dict(DEMO_ASYNC_TRAINING),
    "trainer": {"nnodes": 1, "n_gpus_per_node": 2, "total_training_steps": 12},
    "rollout": {"nnodes": 1, "n_gpus_per_node": 2},
    "data": {"max_response_length": 6, "seed": 0},
    "actor_rollout_ref": {
        "actor": {"ppo_mini_batch_size": 8, "optim": {"lr": 1e-3}},
        "rollout": {"n": 4, "temperature": 1.0},
    },
}


def load_train_config(path: str | None, overrides: list[str]) -> tuple[Any, dict[str, Any]]:
    """The scheduler config and the raw verl tree (for the training keys).

    Loaded by the one loader of ``run`` and ``train`` (`dynsched_ray.cli.config`); an unknown
    or misspelt key dynsched reads (the scheduler's or ``train``'s own, e.g.
    ``actor_rollout_ref.actor.optim.lr``) is warned about on stderr, naming the closest
    known key. ``--set`` accepts any verl key.

    Raises:
        UsageError: the file is missing, unreadable, hostile, empty or not a mapping; a
            malformed override.
        ConfigError: invalid values (the key and the allowed values named).
    """
    from dynsched_ray.cli.config import load_verl_config
    from dynsched_ray.training import TRAIN_VERL_KEYS

    loaded = load_verl_config(
        path,
        overrides,
        demo=DEMO_TRAIN_CONFIG,
        strict_overrides=False,
        extra_read=TRAIN_VERL_KEYS,
        command="train",
    )
    return loaded.config, loaded.tree


class ProgressBar:
    """One status line per step: a bar, the step, reward, queue size, hybrid state.

    On a terminal the line is redrawn in place; otherwise one line per step is printed.
    """

    def __init__(self, total: int, *, stream: Any = None, width: int = 20) -> None:
        self.total = max(1, int(total))
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._open = False

    def line(self, row: dict[str, Any]) -> str:
        """The status line of a metrics row."""
        step = int(row.get("step", 0))
        done = min(self.width, round(self.width * step / self.total))
        bar = "#" * done + "." * (self.width - done)
        return (
            f"[{bar}] step {step}/{self.total} reward {row.get('reward', 0.0):.3f}"
            f" exact {row.get('exact_match', 0.0):.2f} loss {row.get('loss', 0.0):+.4f}"
            f" mq {row.get('mq_size', 0)} hybrid {row.get('hybrid_state', '?')}"
            f" v{row.get('version', 0)} {row.get('step_time_s', 0.0):.2f}s/step"
        )

    def update(self, row: dict[str, Any]) -> None:
        """Show a row."""
        text = self.line(row)
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
            self._open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        """Print a message line (fleet, switch, failure) above the bar."""
        if self._open:
            self.stream.write("\n")
            self._open = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line."""
        if self._open:
            self.stream.write("\n")
            self._open = False


def register(subparsers: Any) -> None:
    """Add the ``train`` sub-command to the ``dynsched`` dispatcher."""
    p = subparsers.add_parser(
        "train",
        help="train the tiny model with real fully-async RL and dynamic scheduling (ray)",
        description=(
            "Real fully-async RL on Ray: vLLM (or transformers) rollout replicas, standalone "
            "and hybrid, real trainers (torch, megatron or fsdp), the sample queue with staleness "
            "control and the policy of the config, on the shipped addition task after a cached "
            "supervised warm-up. Writes per-step metrics as JSON lines and checkpoints "
            "(model, optimizer, policy state, consumed sample ids); --resume continues."
        ),
    )
    add_config_arguments(
        p,
        config_help="YAML config with verl's keys (default: a demo)",
        set_help="override a config key (dotted verl key); repeatable",
    )
    p.add_argument("--steps", type=int, default=None, help="trainer micro-steps of this run")
    p.add_argument(
        "--engine",
        default="vllm",
        help="rollout engine: an installed plug-in of the entry-point group dynsched.engines "
        "(default vllm; an unknown name lists the installed ones)",
    )
    p.add_argument(
        "--trainer",
        default="torch",
        help="trainer: an installed plug-in of the entry-point group dynsched.trainers "
        "(default torch; an unknown name lists the installed ones)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="output folder (default: trainer.default_local_dir, else ./dynsched-train)",
    )
    p.add_argument(
        "--model-cache",
        default="dynsched-model-cache",
        help="folder of the warmed-up tiny model (built once, then reused)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed (default data.seed or 0)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: config)")
    p.add_argument("--device", default="cpu", help="trainer/HF-engine device: cpu, cuda, auto")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    p.add_argument(
        "--allow-config-change",
        action="store_true",
        help="with --resume: continue even though the config or training settings differ "
        "from the checkpoint's (the steps then mix two meanings)",
    )
    add_ray_arguments(p, address_help="join this Ray cluster (e.g. 'auto')")
    p.add_argument("--name", default="dynsched-train", help="run name (prefix of actor names)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, only the summary")
    p.add_argument(
        "--planner",
        action="store_true",
        help="re-plan the split at run time: a role planner moves GPUs between the trainer "
        "and the standalone replicas (the trainer starts one replica's GPUs below its pool)",
    )
    p.set_defaults(func=main)


def _fail(message: str) -> int:
    print(f"dynsched train: error: {message}", file=sys.stderr)
    return 2


def check_train_resume(config: Any, settings: Any, *, allow_config_change: bool = False) -> int:
    """Check ``OUT/checkpoint`` before Ray starts; return its ``steps_done``.

    Refuses (one line): a checkpoint another policy wrote, one whose config fingerprint
    differs from this run's (unless ``allow_config_change``), inconsistent content
    (`validate_checkpoint`), and a trainer state file that is not a plain file inside
    the checkpoint folder or not loadable with ``weights_only=True``.

    Raises:
        ConfigError, UsageError: the one-line reason.
    """

    from dynsched_ray.runtime.runner import check_resumable
    from dynsched_ray.training import load_trainer_state, resolve_checkpoint_file, train_fingerprint

    path = str(settings.checkpoint_dir / "driver.json")
    data = check_resumable(
        path,
        config,
        train_fingerprint(config, settings),
        allow_config_change=allow_config_change,
        id_prefix="t",
        where=f"--resume: {path!r}",
    )
    name = data.get("trainer_state")
    if name:
        load_trainer_state(resolve_checkpoint_file(settings.checkpoint_dir, name))
    return int(data["steps_done"])


def main(args: argparse.Namespace) -> int:
    """Handler of ``dynsched train``."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from dynsched_core import ConfigError, DynschedError

    from dynsched_ray.runtime.security import plan_ray_start

    try:
        ray_plan = plan_ray_start(args.address, args.node_ip_address)
        config, tree = load_train_config(args.config, list(args.overrides))
        if args.policy:
            config = config.evolve(dynamic_schedule_policy=args.policy)
        config.build_policy()
        from dynsched_ray.cli.config import check_device, check_local_capacity

        check_local_capacity(config, address=args.address)
        check_device(args.device)
        if getattr(args, "planner", False):
            from dynsched_ray.runtime.mover import planner_trainer_workers

            planner_trainer_workers(config)
        from dynsched_ray.training import TrainSettings

        settings = TrainSettings.from_verl(
            tree,
            out_dir=args.out,
            model_cache=args.model_cache,
            engine=args.engine,
            trainer=args.trainer,
            steps=args.steps,
            seed=args.seed,
            lr=args.lr,
            device=args.device,
        )
        t = config.trigger_parameter_sync_step
        if settings.steps % t:
            return _fail(
                f"--steps ({settings.steps}) must be a multiple of "
                f"async_training.trigger_parameter_sync_step ({t})"
            )
        if args.resume and not (settings.checkpoint_dir / "driver.json").is_file():
            return _fail(f"--resume: no checkpoint in {settings.checkpoint_dir}")
        done = (
            check_train_resume(
                config,
                settings,
                allow_config_change=bool(getattr(args, "allow_config_change", False)),
            )
            if args.resume
            else 0
        )
        Path(settings.out_dir).mkdir(parents=True, exist_ok=True)
        from dynsched_ray.cli.run import _hold_folders

        # one live run per output folder (freed by the kernel if this process dies)
        locks = _hold_folders(
            [("--out", str(Path(settings.out_dir) / "metrics.jsonl"))], "dynsched train"
        )
    except (ConfigError, OSError, ValueError, DynschedError) as exc:
        return _fail(str(exc).splitlines()[0])
    try:
        return _run(args, config, settings, ray_plan, done=done)
    except KeyboardInterrupt:
        print("\ndynsched train: interrupted", file=sys.stderr)
        return 130
    finally:
        for lock in locks:
            lock.release()


def _planner_options(config: Any) -> Any:
    """`TrainRunnerOptions` with a core `RolePlanner` of ``config`` (``--planner``)."""
    from dynsched_core.planner import RolePlanner

    from dynsched_ray.training import TrainRunnerOptions

    return TrainRunnerOptions(planner=RolePlanner(config=config))


def _run(
    args: argparse.Namespace, config: Any, settings: Any, ray_plan: Any, *, done: int = 0
) -> int:
    import ray
    from dynsched_core import ConfigError, DynschedError

    from dynsched_ray.cli.config import init_command_ray, ray_start_error
    from dynsched_ray.runtime.runner import RayRunOptions
    from dynsched_ray.training import TrainRunner

    # rows carry global step numbers: count the restored steps in the total
    bar = None if args.quiet else ProgressBar(done + settings.steps)
    print(
        f"dynsched train: policy {config.dynamic_schedule_policy}, engine {settings.engine}, "
        f"trainer {settings.trainer}, {config.num_standalone_replicas} standalone + "
        f"{config.num_hybrid_replicas} hybrid replica(s), {config.required_samples} prompt(s) x "
        f"{config.n} response(s)/step, T={config.trigger_parameter_sync_step}, "
        f"{settings.steps} step(s), out {settings.out_dir}",
        flush=True,
    )
    started = False
    try:
        runner = TrainRunner(
            config,
            settings,
            RayRunOptions(name=args.name, namespace=args.namespace),
            resume=bool(args.resume),
            progress=bar.note if bar is not None else None,
            on_step=bar.update if bar is not None else None,
            runner_options=_planner_options(config) if getattr(args, "planner", False) else None,
        )
        if not ray.is_initialized():
            try:
                init_command_ray(ray, ray_plan, args, config, prog="dynsched train")
            except ConnectionError as exc:  # could not join, or no loopback: one line
                print(ray_start_error("dynsched train", args.address, exc), file=sys.stderr)
                return 1
            started = True
        summary = asyncio.run(runner.train())
    except (ConfigError, DynschedError) as exc:
        if bar is not None:
            bar.close()
        print(f"dynsched train: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.close()
        if started:
            ray.shutdown()
    rows = summary.rows
    loop = summary.result.loop
    first = rows[0]["reward"] if rows else 0.0
    last = rows[-1]["reward"] if rows else 0.0
    print(
        f"finished: {loop.steps} step(s) from step {summary.result.first_step}, version "
        f"{summary.result.final_version}, reward {first:.3f} -> {last:.3f}, "
        f"{loop.activations} activation(s), {loop.deactivations} deactivation(s), max lag "
        f"{max(summary.lags, default=0)}, wall {summary.wall_s:.1f}s"
    )
    print(f"metrics: {settings.metrics_path}\ncheckpoint: {settings.checkpoint_dir}")
    return 0
