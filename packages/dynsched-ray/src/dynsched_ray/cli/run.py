"""``dynsched run --backend ray``: the reference fully-async loop on a Ray cluster.

Registered through the ``dynsched.cli`` entry point group (``run``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dynsched_core.cli import ensure_output_folder
from dynsched_core.errors import UsageError

from dynsched_ray.cli.config import (
    DEMO_ASYNC_TRAINING,
    add_config_arguments,
    add_ray_arguments,
    init_command_ray,
    ray_start_error,
)

__all__ = ["DEMO_CONFIG", "build_config", "known_override_keys", "main", "register"]

logger = logging.getLogger(__name__)

#: Decoding speed of the demo's in-memory replicas (tokens/s per request). Responses of
#: 16-48 tokens then take about 0.3-1 s while a stand-in training step takes 0.05 s, so the
#: trainer waits for samples and the ``default`` policy activates the hybrid replicas in
#: most cycles (3 activations and 3 deactivations in the 8 default steps).
DEMO_TOKENS_PER_S = 50.0
#: Upper bounds of the stand-in engine and trainer flags (``--tokens-per-s``,
#: ``--trainer-step-time``): faster than any real engine, slower than any real step.
MAX_TOKENS_PER_S = 1e9
MAX_TRAINER_STEP_TIME_S = 3600.0

#: Used when no ``--config`` is given: 2 trainer GPUs (2 hybrid replicas), 2 standalone.
DEMO_CONFIG: dict[str, Any] = {
    "async_training": dict(DEMO_ASYNC_TRAINING),
    "trainer": {"nnodes": 1, "n_gpus_per_node": 2},
    "rollout": {"nnodes": 1, "n_gpus_per_node": 2},
    "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 2}},
}


def build_config(path: str | None, overrides: list[str]) -> Any:
    """The core config from a YAML file (verl layout) or the demo, plus ``key=value`` overrides.

    Loaded by the one loader of ``run`` and ``train`` (`dynsched_ray.cli.config`); an unknown
    or misspelt key dynsched reads is warned about on stderr, naming the closest known key.

    Raises:
        UsageError: the file is missing, unreadable, hostile (too large, too deep, aliases
            expanding too far, huge numbers), not YAML, empty or not a mapping; an
            override is not ``KEY=VALUE`` or names an unknown key (the closest known key
            is suggested).
        ConfigError: a value is invalid (names the key and the allowed values).
    """
    from dynsched_ray.cli.config import load_verl_config

    return load_verl_config(path, overrides, demo=DEMO_CONFIG, command="run").config


def known_override_keys() -> list[str]:
    """Keys ``--set`` accepts: the flat field names and the verl keys dynsched reads."""
    from dynsched_ray.cli.config import known_override_keys as known

    return known()


def register(subparsers: Any) -> None:
    """Add the ``run`` sub-command to the ``dynsched`` dispatcher."""
    p = subparsers.add_parser(
        "run",
        help="run the fully-async loop with dynamic scheduling on a backend (ray)",
        description=(
            "Run the reference fully-async RL loop with dynamic resource scheduling: in-memory "
            "replicas by default, or a rollout engine plug-in (--engine) on the addition task's "
            "prompts, with a stand-in trainer. Prints one line per step/switch/failure and writes the "
            "dynamic_resource/* metrics as JSON lines."
        ),
    )
    p.add_argument("--backend", choices=["ray"], default="ray", help="execution backend (ray)")
    add_config_arguments(
        p,
        config_help="YAML config (verl layout or flat keys); default: a demo",
        set_help="override a config key (dotted verl key or flat name); repeatable",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="trainer micro-steps this invocation runs (default: config or 8); with --resume "
        "they are ADDITIONAL steps after the checkpoint's (a checkpoint of 8 steps and "
        "--steps 4 ends at step 12)",
    )
    p.add_argument(
        "--prompts",
        type=int,
        default=None,
        help="prompts of the synthetic source (default: enough)",
    )
    add_ray_arguments(
        p, address_help="join this Ray cluster (e.g. 'auto'); default: start a local one"
    )
    p.add_argument("--name", default="dynsched", help="run name (prefix of actor names)")
    _add_output_arguments(p)
    p.add_argument(
        "--keep-router", action="store_true", help="leave the named router actor alive at the end"
    )
    p.add_argument(
        "--tokens-per-s",
        type=float,
        default=DEMO_TOKENS_PER_S,
        help="decoding speed of each request on the in-memory replicas (default "
        f"{DEMO_TOKENS_PER_S:g}: rollout is the bottleneck, so the default policy lends the "
        "trainer GPUs in most cycles)",
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
    p.add_argument("--quiet", action="store_true", help="no progress lines, only the summary")
    _add_engine_arguments(p)
    p.set_defaults(func=main)


def _add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """``--engine``, ``--model``, ``--model-cache``."""
    p.add_argument(
        "--engine",
        default=None,
        help="rollout engine: an installed plug-in of the entry-point group dynsched.engines "
        "(vllm, hf, or a third-party one); default: the in-memory stand-in replicas. The "
        "engine runs the addition task's prompts; the trainer is the stand-in (no training)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="with --engine: model folder the replicas load (Hugging Face layout with the "
        "task's tokenizer); default: the tiny model warmed up in --model-cache",
    )
    p.add_argument(
        "--model-cache",
        default="dynsched-model-cache",
        help="with --engine and no --model: folder of the warmed-up tiny model (built once, "
        "shared with dynsched train)",
    )


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    """``--out``, ``--metrics``, ``--checkpoint``, ``--resume``, ``--allow-config-change``."""
    p.add_argument(
        "--out",
        default="dynsched-out",
        help="output folder of the default metrics file (default: ./dynsched-out)",
    )
    p.add_argument(
        "--metrics",
        default=None,
        help="JSON-lines metrics file (default: OUT/metrics.jsonl; '' for none)",
    )
    p.add_argument(
        "--checkpoint", default=None, help="driver checkpoint file (written after each sync)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="restore from --checkpoint (required) before running; --steps more steps follow",
    )
    p.add_argument(
        "--allow-config-change",
        action="store_true",
        help="with --resume: continue even though the config differs from the checkpoint's "
        "(batch size, GPU layout, sync interval...: the steps then mix two meanings)",
    )


def _check_flags(args: argparse.Namespace) -> None:
    """Every flag checked before anything starts (one error naming the flag)."""
    from dynsched_core._config import MAX_GPUS, MAX_ROLLOUT_PROMPTS, MAX_STEPS

    for flag, value, low, high in (
        ("--steps", args.steps, 1, MAX_STEPS),
        ("--prompts", args.prompts, 1, MAX_ROLLOUT_PROMPTS),
        ("--trainer-workers", args.trainer_workers, 0, MAX_GPUS),
        ("--num-cpus", args.num_cpus, 1, MAX_GPUS),
    ):
        if value is not None and value < low:
            raise UsageError(f"{flag} must be >= {low}, got {value}")
        if value is not None and value > high:
            shown = value if value < 10**30 else "a huge number"
            raise UsageError(f"{flag} must be <= {high:,} (>= {low}), got {shown}")
    if not 0 < args.tokens_per_s <= MAX_TOKENS_PER_S:
        raise UsageError(
            f"--tokens-per-s must be a number > 0 and <= {MAX_TOKENS_PER_S:g}, "
            f"got {args.tokens_per_s}"
        )
    if not 0 <= args.trainer_step_time <= MAX_TRAINER_STEP_TIME_S:
        raise UsageError(
            f"--trainer-step-time must be a number of seconds >= 0 and <= "
            f"{MAX_TRAINER_STEP_TIME_S:g}, got {args.trainer_step_time}"
        )
    if not args.name or not args.name.strip():
        raise UsageError("--name must not be empty")
    if args.resume and not args.checkpoint:
        raise UsageError("--resume needs --checkpoint FILE (the checkpoint to continue from)")


def _check_output_file(flag: str, path: str, folder_flag: str | None = None) -> None:
    """Create the folder of ``path`` and make sure the file can be written there."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{flag} {path!r} is a directory; give a file name")
    folder = target.parent
    if folder_flag is not None:
        flag, path = folder_flag, str(folder)
    ensure_output_folder(folder, flag, given=path)


def _hold_folders(paths: list[tuple[str, str]], command: str, *, stream: Any = None) -> list[Any]:
    """Take the lock (``.dynsched.lock``) of each output folder of ``(flag, file)``.

    Raises:
        UsageError: a folder is held by a live run (one line naming it, the holder's pid
            and the flag to change); the locks already taken are released.
    """
    from dynsched_core.storage import RunLock, RunLockBusyError

    held: list[Any] = []
    seen: set[str] = set()
    for flag, path in paths:
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.realpath(folder) in seen:
            continue
        seen.add(os.path.realpath(folder))
        lock = RunLock(folder, command)
        try:
            lock.acquire()
        except RunLockBusyError as exc:
            for other in held:
                other.release()
            raise UsageError(f"{exc}; wait for it or choose another {flag}") from None
        except OSError as exc:
            for other in held:
                other.release()
            raise UsageError(
                f"{flag} {path!r}: cannot lock the folder {folder!r} ({exc.strerror or exc})"
            ) from None
        if lock.stale:
            print(
                f"{command}: note: {folder} was held by pid {lock.stale.get('pid', '?')}, "
                "which is no longer running; taking it over",
                file=stream if stream is not None else sys.stderr,
            )
        held.append(lock)
    return held


def _check_resume(path: str, config: Any, *, allow_config_change: bool = False) -> dict[str, Any]:
    """Read the checkpoint before Ray starts; refuse one another policy wrote, one whose
    config fingerprint differs (unless ``allow_config_change``), and one whose content
    is inconsistent (`check_resumable`)."""
    from dynsched_ray.runtime.runner import check_resumable, config_fingerprint

    return check_resumable(
        path,
        config,
        config_fingerprint(config),
        allow_config_change=allow_config_change,
        id_prefix="p",
        where=f"--checkpoint {path!r}",
    )


def main(args: argparse.Namespace) -> int:
    """Handler of ``dynsched run``.

    Raises:
        UsageError, ConfigError: bad flags, config or checkpoint, found before Ray starts
            (the ``dynsched`` dispatcher prints one line, exit status 2).
        KeyboardInterrupt: Ctrl-C; the actors are released, Ray is shut down and the
            metrics file ends with a ``{"partial": true, ...}`` line.
    """
    _check_engine_flags(args)
    ray_plan, config, metrics_path = _prepare_config(args)
    policy = config.build_policy()
    if metrics_path:
        _check_output_file("--metrics", metrics_path, "--out" if args.metrics is None else None)
    restored = _check_resume_flags(args, config)
    options = _run_options(args, metrics_path)
    workload = _engine_workload(args)
    if workload is not None:
        options = workload.run_options(options)

    import ray

    # one live run per output folder (freed by the kernel if this process dies)
    locks = _hold_folders(_output_flags(args, metrics_path), "dynsched run")
    _print_header(config, options, restored, args.engine)
    result = _run_on_ray(ray, args, (config, ray_plan, policy, options, workload), locks)
    if result is None:
        return 1
    _print_summary(result, options)
    return 0


def _check_engine_flags(args: argparse.Namespace) -> None:
    """``--engine`` names an installed engine, ``--model`` a model folder, and ``--model``
    comes with ``--engine`` (`ConfigError` / `UsageError`, before anything is written)."""
    if args.engine is None:
        if args.model is not None:
            raise UsageError("--model needs --engine (the in-memory replicas load no model)")
        return
    from dynsched_ray.plugins import ENGINES

    ENGINES.check(args.engine, key="engine", where="--engine")
    if args.model is not None and not (Path(args.model) / "config.json").is_file():
        raise UsageError(
            f"--model {args.model!r} is not a Hugging Face model folder (no config.json)"
        )


def _engine_workload(args: argparse.Namespace) -> Any:
    """``--engine``'s `RolloutWorkload` (None without it). Without ``--model`` the tiny
    model is warmed up once in ``--model-cache``."""
    if args.engine is None:
        return None
    if args.model is not None:
        model = Path(args.model)
    else:
        from dynsched_ray.task.addition import warm_up

        if not args.quiet:
            print(f"preparing the tiny model in {args.model_cache} (once) ...", flush=True)
        model = warm_up(args.model_cache)
    from dynsched_ray.training import RolloutWorkload

    return RolloutWorkload(args.engine, model)


def _prepare_config(args: argparse.Namespace) -> tuple[Any, Any, str | None]:
    """Check the flags, plan Ray's start, load the config and check it fits a local
    cluster; the Ray plan, the config and the metrics file (``None``: none)."""
    from dynsched_ray.cli.config import check_local_capacity
    from dynsched_ray.runtime.security import plan_ray_start

    _check_flags(args)
    ray_plan = plan_ray_start(args.address, args.node_ip_address)
    config = build_config(args.config, list(args.overrides))
    if args.policy:
        config = config.evolve(dynamic_schedule_policy=args.policy)
    check_local_capacity(config, address=args.address, trainer_workers=args.trainer_workers)
    metrics_path = (
        str(Path(args.out) / "metrics.jsonl") if args.metrics is None else args.metrics or None
    )
    return ray_plan, config, metrics_path


def _check_resume_flags(args: argparse.Namespace, config: Any) -> dict[str, Any] | None:
    """The checkpoint to resume from (``None`` without ``--resume``), then the
    ``--checkpoint`` file checked writable."""
    restored = (
        _check_resume(
            args.checkpoint,
            config,
            allow_config_change=bool(getattr(args, "allow_config_change", False)),
        )
        if args.resume
        else None
    )
    if args.checkpoint:
        _check_output_file("--checkpoint", args.checkpoint)
    return restored


def _run_options(args: argparse.Namespace, metrics_path: str | None) -> Any:
    from dynsched_ray.runtime.runner import RayRunOptions

    return RayRunOptions(
        name=args.name,
        namespace=args.namespace,
        num_steps=args.steps,
        num_prompts=args.prompts,
        tokens_per_s=args.tokens_per_s,
        trainer_step_time_s=args.trainer_step_time,
        trainer_workers=args.trainer_workers,
        metrics_path=metrics_path,
        checkpoint_path=args.checkpoint,
        resume=bool(args.resume),
        keep_router=bool(args.keep_router),
    )


def _output_flags(args: argparse.Namespace, metrics_path: str | None) -> list[tuple[str, str]]:
    """``(flag, file)`` of each output file, for `_hold_folders`."""
    return [
        *(
            [("--out" if args.metrics is None else "--metrics", metrics_path)]
            if metrics_path
            else []
        ),
        *([("--checkpoint", args.checkpoint)] if args.checkpoint else []),
    ]


def _print_header(
    config: Any, options: Any, restored: dict[str, Any] | None, engine: str | None = None
) -> None:
    steps = options.num_steps or config.total_training_steps or 8
    first = int(restored["steps_done"]) + 1 if restored is not None else 1
    print(
        f"dynsched run --backend ray: policy {config.dynamic_schedule_policy}, "
        + (f"engine {engine} (stand-in trainer), " if engine else "")
        + f"{config.num_standalone_replicas} standalone + {config.num_hybrid_replicas} hybrid "
        f"replica(s), {config.required_samples} sample(s)/step, "
        f"T={config.trigger_parameter_sync_step}, steps {first}..{first + steps - 1}",
        flush=True,
    )


def _run_on_ray(
    ray: Any, args: argparse.Namespace, plan: tuple[Any, Any, Any, Any, Any], locks: list[Any]
) -> Any:
    """Start (or join) Ray, run the loop and shut down; the run's result, or ``None``
    after a one-line error (Ray did not start, or a `DynschedError`). The ``locks`` are
    released at the end whatever happens.

    Raises:
        KeyboardInterrupt: Ctrl-C (the metrics file is marked partial).
    """
    from dynsched_core import DynschedError

    from dynsched_ray.runtime.runner import RayRunner

    config, ray_plan, policy, options, workload = plan
    metrics_path = options.metrics_path

    def printer(line: str) -> None:
        # The runner's closing "done:" line repeats the "finished:" summary printed later.
        if not args.quiet and not line.startswith("done:"):
            print(line, flush=True)

    started = False
    interrupted = False
    deadline = _InterruptDeadline(
        _partial_note(metrics_path, args.checkpoint), metrics_path, INTERRUPT_GRACE_S
    )
    try:
        if not ray.is_initialized():
            if not _start_ray(ray, args, config, ray_plan):
                return None
            started = True
        runner = RayRunner(config, options, policy=policy, progress=printer, workload=workload)
        return _run_quietly_on_interrupt(_armed(runner.run(), deadline))
    except KeyboardInterrupt:
        interrupted = True
        deadline.arm()  # Ctrl-C before the loop ran (e.g. while Ray started)
        raise KeyboardInterrupt(_partial_note(metrics_path, args.checkpoint)) from None
    except DynschedError as exc:
        print(f"dynsched run: error: {exc}", file=sys.stderr)
        return None
    finally:
        if started:
            _shutdown_ray(ray)
        if interrupted and metrics_path:
            _mark_partial(metrics_path)
        deadline.cancel()
        for lock in locks:
            lock.release()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _start_ray(ray: Any, args: argparse.Namespace, config: Any, ray_plan: Any) -> bool:
    """`_init_ray`; False after one line on stderr when Ray could not start or join."""
    from dynsched_core import DynschedError

    try:
        _init_ray(ray, args, config, ray_plan)
    except (KeyboardInterrupt, DynschedError):
        raise
    except Exception as exc:  # Ray could not start or join: say so in one line
        print(ray_start_error("dynsched run", args.address, exc), file=sys.stderr)
        _shutdown_ray(ray)  # whatever part of it did start
        return False
    return True


def _print_summary(result: Any, options: Any) -> None:
    loop = result.loop
    print(
        f"finished: {loop.steps} step(s) from step {result.first_step}, version "
        f"{result.final_version}, {loop.samples_consumed} consumed / {loop.samples_produced} "
        f"produced / {loop.samples_left} left, {loop.activations} activation(s), "
        f"{loop.deactivations} deactivation(s)"
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


#: Seconds a Ctrl-C'd run may take to release its actors and stop Ray before the process
#: exits anyway (judgement: a clean stop takes about 2 s on 2 cores; Ray's own shutdown
#: can wait much longer for a process that does not answer).
INTERRUPT_GRACE_S = 15.0


class _InterruptDeadline:
    """Armed by the first Ctrl-C: if the run has not stopped ``grace_s`` later, the
    metrics file is marked partial, one line says so and the process exits with status
    130, after terminating its own child processes (the local Ray cluster). `cancel`
    disarms it after a clean stop."""

    def __init__(self, note: str, metrics_path: str | None, grace_s: float) -> None:
        self.note = note
        self.metrics_path = metrics_path
        self.grace_s = grace_s
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def arm(self) -> None:
        with self._lock:
            if self._timer is None:
                self._timer = threading.Timer(self.grace_s, self._force)
                self._timer.daemon = True
                self._timer.start()

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()

    def install(self) -> None:
        """Wrap the current SIGINT handler (inside ``asyncio.Runner.run``: the runner's,
        which cancels the main task) so that a Ctrl-C also arms the deadline."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGINT)

        def on_sigint(signum: int, frame: Any) -> None:
            self.arm()
            if callable(previous):
                previous(signum, frame)
            else:
                raise KeyboardInterrupt

        signal.signal(signal.SIGINT, on_sigint)

    def _force(self) -> None:
        if self.metrics_path:
            _mark_partial(self.metrics_path)
        sys.stderr.write(
            f"dynsched run: interrupted: {self.note} (stopped after {self.grace_s:g} s: "
            "Ray did not shut down cleanly in time)\n"
        )
        sys.stderr.flush()
        _stop_children()
        os._exit(130)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``; empty elsewhere)."""
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(name))
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _stop_children(wait_s: float = 2.0) -> None:
    """Terminate this process's own children (the local Ray cluster it started) before a
    forced exit: ``os._exit`` alone leaves them running."""
    kids = _descendants(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in kids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        end = time.monotonic() + wait_s
        while kids and time.monotonic() < end:
            kids = [k for k in kids if _alive(k)]
            time.sleep(0.05)
        if not kids:
            return


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


async def _armed(coro: Any, deadline: _InterruptDeadline) -> Any:
    deadline.install()  # running inside asyncio.Runner.run: its SIGINT handler is set
    return await coro


def _init_ray(ray: Any, args: argparse.Namespace, config: Any, plan: Any) -> None:
    init_command_ray(
        ray, plan, args, config, prog="dynsched run", object_store_memory=200 * 1024 * 1024
    )


def _run_quietly_on_interrupt(coro: Any) -> Any:
    """``asyncio.run(coro)``, but Ctrl-C cancels without printing pending-task errors."""
    stopping = False

    def on_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if stopping:  # tasks torn down by the interrupt: not news to the user
            logger.debug("during shutdown: %s", context.get("message"))
            return
        loop.default_exception_handler(context)

    with asyncio.Runner() as runner:
        runner.get_loop().set_exception_handler(on_error)
        try:
            return runner.run(coro)
        except (KeyboardInterrupt, asyncio.CancelledError):
            stopping = True
            raise KeyboardInterrupt from None
        finally:
            stopping = True


def _shutdown_ray(ray: Any) -> None:
    try:
        ray.shutdown()
    except KeyboardInterrupt:  # a second Ctrl-C while shutting down: try once more
        ray.shutdown()


def _partial_note(metrics_path: str | None, checkpoint: str | None) -> str:
    parts = []
    if metrics_path:
        parts.append(f"partial metrics in {metrics_path} (last line marked partial)")
    if checkpoint:
        parts.append(f"checkpoint of the last finished sync in {checkpoint}")
    return "; ".join(parts) or "nothing written"


def _mark_partial(path: str) -> None:
    """Append the interrupt marker line to the metrics file."""
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"partial": True, "interrupted": True}) + "\n")
    except OSError as exc:  # pragma: no cover - the folder was writable at the start
        logger.warning("could not mark %s as partial: %s", path, exc)
