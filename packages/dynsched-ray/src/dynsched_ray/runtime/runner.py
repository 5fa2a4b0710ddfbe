"""`RayRunner`: the core's reference fully-async loop over Ray actors, from one config.

The controller, `ScheduleDriver`, rollouter and retrying client run in the driver
process on one asyncio loop; replicas, router, queue and trainer workers are actors
(see `RayFleet`). The runner adds what a distributed run needs:

- failure handling: a replica actor found dead (failed call or health-check ping) is
  marked dead in the run's `ReplicaSet`, the one owner of membership, so routing, the
  retrying client, the rollouter's cap, the controller and the driver's context all drop
  it at once; its in-flight requests are retried elsewhere by the core `RetryingClient`,
  continuing after the tokens it already holds; a hybrid replica dying during activation
  leaves the controller in ``STANDALONE_ONLY`` (the driver goes on with the survivors and
  activates the remaining hybrid replicas at later cycles); when every replica is gone the
  run stops with `AllReplicasLostError`. The runner keeps no membership of its own;
- checkpoints: after every weight sync (and at the end) the driver state (policy
  ``state_dict``, parameter version, counters) and the consumed sample ids are written
  as JSON; ``resume=True`` restores them and continues at the saved version, reusing the
  named router actor when it is still alive (rebuilding it otherwise);
- progress lines and the ``dynamic_resource/*`` metrics as JSON lines (dynsched-metrics).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import attrs
from dynsched_core import (
    ClientOptions,
    ConfigError,
    ControllerOptions,
    DriverOptions,
    DynamicScheduleConfig,
    DynamicSchedulePolicyBase,
    EventBus,
    FullyAsyncLoop,
    LoopResult,
    ReplicaSet,
    ScheduleDriver,
)
from dynsched_core import validators as v
from dynsched_core.events import SwitchEvent, TrainStepEvent
from dynsched_core.storage import atomic_write_text, trim_json_lines

from dynsched_ray.runtime.errors import AllReplicasLostError, CheckpointWriteError
from dynsched_ray.runtime.fleet import FleetSpec, RayFleet, ReplicaFactory
from dynsched_ray.runtime.proxies import RayReplica
from dynsched_ray.runtime.supervisor import ReplicaRestart, ReplicaSupervisor, RestartOptions
from dynsched_ray.runtime.workload import RunWorkload, StandInWorkload, synthetic_prompts
from dynsched_ray.trainers.group import RayTrainerGroup, RayTrainerGroupBackend, RayTrainerSpec
from dynsched_ray.trainers.standin import RayTrainerBackend

__all__ = [
    "RayRunOptions",
    "RayRunResult",
    "RayRunner",
    "RunWorkload",
    "StandInWorkload",
    "check_fingerprint",
    "checkpoint_policy",
    "config_fingerprint",
    "load_checkpoint",
    "run_ray",
    "synthetic_prompts",
    "validate_checkpoint",
]

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1

#: Largest ``steps_done`` a checkpoint may hold (judgement: far beyond any real run;
#: the consumed-id list must hold as many steps' ids anyway).
MAX_STEPS_DONE = 10**9


@attrs.frozen(kw_only=True)
class RayRunOptions:
    """Ray-side settings of a run (the scheduler settings are the core config).

    Attributes:
        name: Run name: prefix of actor and placement group names; the router actor is
            ``<name>-router``.
        namespace: Ray namespace of the named actors.
        num_steps: Trainer micro-steps (default: ``config.total_training_steps`` or 8).
        num_prompts: Prompts of the synthetic source (default: enough for the steps
            twice over, so the producer does not finish before the trainer).
        max_tokens: Response budget per request.
        prompt_len: Prompt length in tokens.
        min_response_len: Shortest natural response length of the synthetic prompts.
        max_response_len: Longest natural response length (<= max_tokens).
        tokens_per_s: Decoding speed of the in-memory replicas (real time in the actors).
        chunk_tokens: Tokens per decoding chunk of the in-memory replicas.
        switch_delay_s: Duration of sleep/wake_up/update_weights of hybrid replicas.
        stream_tokens: Replicas stream their output in segments of this many tokens, so
            the tokens of a replica that dies mid-generation are kept (None: off).
        trainer_workers: Trainer worker actors (None: one per trainer GPU; 0: none).
        trainer: Real trainers (`RayTrainerSpec`: e.g. `TorchTrainer` on every trainer
            GPU, with the hand-over order enforced against the hybrid replicas); None:
            the stand-in workers that sleep ``trainer_step_time_s`` per step.
        trainer_step_time_s: Time of one stand-in training step.
        hybrid_gpu_fraction: Share of a trainer GPU declared by a hybrid replica.
        replica_factory: Builds each hosted replica (default: the core's
            `dynsched_core.InMemoryReplica`).
        metrics_path: Write ``dynamic_resource/*`` metrics as JSON lines here.
        checkpoint_path: Write the driver checkpoint here after each weight sync.
        resume: Restore from ``checkpoint_path`` before running.
        keep_router: Leave the router actor alive at the end (for a later resume).
        detached_router: Give the router a detached lifetime (outlives the driver).
        batch_router_calls: Coalesce concurrent router calls.
        health_check_interval_s: Period of the liveness pings of replica actors.
        call_timeout_s: Timeout of control calls to actors.
        generate_timeout_s: Timeout of one generation attempt.
        wait_timeout_s: Bound of every wait for samples.
        no_replica_timeout_s: How long a request waits for a routable replica.
        max_failures: Failed attempts tolerated per request (retrying client).
        replica_restarts: Restarts per replica id (`ReplicaSupervisor`: a fresh actor on
            the same bundle, re-registered through the `ReplicaSet` and warmed with the
            current weights before it is routable); 0: a dead replica stays dead.
        restart_timeout_s: Bound of one restart attempt.
        restart_queue: Replace a dead queue actor, reloading its contents from the
            driver-side journal (no sample lost or repeated).
        restart_router: Replace a dead router actor, re-applying the routable set.
        failover: Wake sleeping hybrid replicas when no replica is routable while the
            trainer waits (`DriverOptions.failover`).
        placement_strategy: Ray strategy of the trainer and standalone placement groups
            (PACK, SPREAD, STRICT_PACK, STRICT_SPREAD).
    """

    name: str = "dynsched"
    namespace: str | None = None
    num_steps: int | None = attrs.field(default=None, validator=v.int_ge(1, optional=True))
    num_prompts: int | None = attrs.field(default=None, validator=v.int_ge(1, optional=True))
    max_tokens: int = 64
    prompt_len: int = 16
    min_response_len: int = 16
    max_response_len: int = 48
    tokens_per_s: float = attrs.field(default=2000.0, validator=v.float_gt(0.0))
    chunk_tokens: int = 8
    switch_delay_s: float = 0.0
    stream_tokens: int | None = 16
    trainer_workers: int | None = None
    trainer: RayTrainerSpec | None = None
    trainer_step_time_s: float = 0.05
    hybrid_gpu_fraction: float = 0.5
    replica_factory: ReplicaFactory | None = None
    metrics_path: str | None = None
    checkpoint_path: str | None = None
    resume: bool = False
    keep_router: bool = False
    detached_router: bool = False
    batch_router_calls: bool = True
    health_check_interval_s: float = attrs.field(default=0.5, validator=v.float_gt(0.0))
    call_timeout_s: float = attrs.field(default=60.0, validator=v.float_gt(0.0))
    generate_timeout_s: float = attrs.field(default=600.0, validator=v.float_gt(0.0))
    wait_timeout_s: float = attrs.field(default=600.0, validator=v.float_gt(0.0))
    no_replica_timeout_s: float = attrs.field(default=30.0, validator=v.float_gt(0.0))
    max_failures: int = 3
    replica_restarts: int = attrs.field(default=0, validator=v.int_ge(0))
    restart_timeout_s: float = attrs.field(default=60.0, validator=v.float_gt(0.0))
    restart_queue: bool = True
    restart_router: bool = True
    failover: bool = True
    placement_strategy: str = "PACK"

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.min_response_len <= self.max_response_len <= self.max_tokens:
            raise ConfigError(
                "RayRunOptions.max_response_len: need 1 <= min_response_len <= "
                f"max_response_len <= max_tokens, got {self.min_response_len}, "
                f"{self.max_response_len}, {self.max_tokens}",
                key="max_response_len",
            )
        if self.resume and not self.checkpoint_path:
            raise ConfigError(
                "RayRunOptions.resume: resume=True needs checkpoint_path (the checkpoint to"
                " restore)",
                key="resume",
            )


@attrs.frozen(kw_only=True)
class RayRunResult:
    """Outcome of `RayRunner.run`.

    Attributes:
        loop: The core loop's result (this run's steps and sample counters).
        first_step: Global step number of this run's first step (1 unless resumed).
        final_version: Parameter version at the end.
        switches: Successful switches in order (``"activate"``/``"deactivate"``).
        failed_switches: Failed switches in order.
        transitions: Hybrid state transitions ``(source, target)`` in order.
        dead_replicas: Replicas that died during the run, in order of detection.
        router_reused: An existing named router actor was reused.
        resumed: The run started from a checkpoint.
        metrics: The ``dynamic_resource/*`` records (one dict per sync cycle).
        consumed_sample_ids: Sample ids consumed, over every run of a resumed chain.
        interrupted: ``(replica_id, request_id, tokens kept)`` of each generation attempt
            cut short by its replica's death (the request was resumed elsewhere).
        trainer_metrics: `TrainMetrics` of every step (runs with ``options.trainer``).
        restarts: Replica restarts by the `ReplicaSupervisor`, in order.
        queue_restarts: Queue actors replaced (contents reloaded from the journal).
        router_restarts: Router actors replaced.
        failovers: Times sleeping hybrid replicas were woken because no replica was
            routable while the trainer waited.
    """

    loop: LoopResult
    first_step: int
    final_version: int
    switches: tuple[str, ...]
    failed_switches: tuple[str, ...]
    transitions: tuple[tuple[str, str], ...]
    dead_replicas: tuple[str, ...]
    router_reused: bool
    resumed: bool
    metrics: tuple[dict[str, Any], ...]
    consumed_sample_ids: tuple[str, ...]
    interrupted: tuple[tuple[str, str, int], ...] = ()
    trainer_metrics: tuple[Any, ...] = ()
    restarts: tuple[ReplicaRestart, ...] = ()
    queue_restarts: int = 0
    router_restarts: int = 0
    failovers: int = 0


def load_checkpoint(path: str | os.PathLike[str], *, check_driver: bool = True) -> dict[str, Any]:
    """Read a checkpoint written by `RayRunner`.

    Args:
        path: The checkpoint file.
        check_driver: Also check the shape of the driver's state (`check_checkpoint_driver`).

    Raises:
        ConfigError: (a `ValueError`) the file is missing, unreadable, empty, not JSON,
            not a dynsched-ray checkpoint, or of an unknown format; the message names
            the file.
    """
    name = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise ConfigError(f"checkpoint {name!r} does not exist", key="checkpoint") from None
    except OSError as exc:
        raise ConfigError(
            f"checkpoint {name!r}: cannot read it ({exc.strerror or exc})", key="checkpoint"
        ) from None
    if not text.strip():
        raise ConfigError(f"checkpoint {name!r} is empty", key="checkpoint")
    try:
        data = json.loads(text)
    except ValueError as exc:  # UnicodeDecodeError is one too
        raise ConfigError(
            f"checkpoint {name!r} is corrupt (not JSON: {exc})", key="checkpoint"
        ) from None
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError(
            f"{name!r} is not a dynsched-ray checkpoint (format {CHECKPOINT_FORMAT})",
            key="checkpoint",
        )
    missing = [k for k in ("driver", "steps_done", "consumed_sample_ids") if k not in data]
    if missing:
        raise ConfigError(
            f"checkpoint {name!r} is incomplete: missing {', '.join(missing)}", key="checkpoint"
        )
    if check_driver:
        check_checkpoint_driver(data, name)
    steps, ids = data["steps_done"], data["consumed_sample_ids"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ConfigError(
            f"checkpoint {name!r}: 'steps_done' must be an int >= 0, got {steps!r}",
            key="checkpoint",
        )
    if not isinstance(ids, list) or not all(isinstance(x, str | int) for x in ids):
        raise ConfigError(
            f"checkpoint {name!r}: 'consumed_sample_ids' must be a list of ids", key="checkpoint"
        )
    return data


def check_checkpoint_driver(data: Mapping[str, Any], name: str) -> None:
    """Check the driver's state in a checkpoint read from ``name``.

    Raises:
        ConfigError: its shape is not what `ScheduleDriver.state_dict` writes.
    """
    try:
        ScheduleDriver.check_state_dict(data["driver"])
    except ValueError as exc:
        raise ConfigError(f"checkpoint {name!r}: 'driver': {exc}", key="checkpoint") from None


def checkpoint_policy(data: Mapping[str, Any]) -> str | None:
    """Name of the policy that wrote a checkpoint (None when it does not say)."""
    config = data.get("config")
    if isinstance(config, Mapping):
        name = config.get("dynamic_schedule_policy")
        if isinstance(name, str):
            return name
    return None


#: Config fields that do not change what a step means (``--steps`` adds steps on resume).
_NOT_FINGERPRINTED = frozenset({"total_training_steps", "total_rollout_steps"})


def config_fingerprint(config: DynamicScheduleConfig) -> dict[str, Any]:
    """Every config field that changes the meaning of a step, by the key a user sets.

    The policy and its parameters, batch (``ppo_mini_batch_size``, ``require_batches``,
    ``rollout.n``), ``trigger_parameter_sync_step``, staleness, the GPU layout (trainer and
    rollout nodes x GPUs per node, tensor parallel size: hence the hybrid count),
    ``partial_rollout``, concurrency and lengths; keyed by the verl key without the
    ``async_training.`` prefix (e.g. ``trainer.n_gpus_per_node``).
    """
    from dynsched_core._config import _VERL_PATHS

    out: dict[str, Any] = {}
    for field, value in config.to_dict().items():
        if field in _NOT_FINGERPRINTED:
            continue
        paths = _VERL_PATHS.get(field)
        key = paths[0] if paths else field
        out[key.removeprefix("async_training.")] = value
    normal: dict[str, Any] = json.loads(json.dumps(out, default=str))  # as read back
    return normal


def with_extras(fingerprint: Mapping[str, Any], extras: Mapping[str, Any]) -> dict[str, Any]:
    """``fingerprint`` plus ``extras`` (a workload's), as read back from JSON."""
    if not extras:
        return dict(fingerprint)
    normal: dict[str, Any] = json.loads(json.dumps({**fingerprint, **extras}, default=str))
    return normal


def fingerprint_diff(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``"key old -> new"`` for each field that differs (a missing one shows as ``-``)."""
    out = []
    for key in sorted(set(saved) | set(current), key=lambda k: (k not in current, k)):
        old, new = saved.get(key, "-"), current.get(key, "-")
        if old != new:
            out.append(f"{key} {old} -> {new}")
    return out


def check_fingerprint(
    data: Mapping[str, Any], current: Mapping[str, Any], *, allow_change: bool = False
) -> str | None:
    """Compare a checkpoint's config fingerprint with this run's.

    Returns:
        None when they match (or ``allow_change``); otherwise the one-line refusal,
        naming each differing field and the override flag.
    """
    if allow_change:
        return None
    saved = data.get("fingerprint")
    if not isinstance(saved, Mapping):
        return (
            "--resume: the checkpoint has no config fingerprint (written by an older "
            "dynsched), so a changed batch size, GPU layout or sync interval cannot be "
            "detected (pass --allow-config-change to resume anyway)"
        )
    diff = fingerprint_diff(saved, current)
    if not diff:
        return None
    shown = ", ".join(diff[:8]) + (f", and {len(diff) - 8} more" if len(diff) > 8 else "")
    return (
        f"--resume: checkpoint differs from this run: {shown} "
        "(pass --allow-config-change to resume anyway)"
    )


_ID_RE = {"p": r"p(0|[1-9][0-9]{0,17})", "t": r"t(0|[1-9][0-9]{0,17})"}


def _checkpoint_error(name: str, field: str, why: str) -> ConfigError:
    """One line naming the checkpoint and the field."""
    return ConfigError(f"checkpoint {name!r}: {field!r} {why}", key="checkpoint")


def _check_checkpoint_finite(value: Any, name: str, where: str = "", depth: int = 0) -> None:
    """No NaN or infinity anywhere in ``value``, nested at most 64 deep."""
    import math

    if depth > 64:
        raise _checkpoint_error(name, where, "is nested too deep")
    if isinstance(value, float) and not math.isfinite(value):
        raise _checkpoint_error(name, where, f"must be a finite number, got {value}")
    if isinstance(value, Mapping):
        for k, x in value.items():
            _check_checkpoint_finite(x, name, f"{where}.{k}" if where else str(k), depth + 1)
    elif isinstance(value, list | tuple):
        for i, x in enumerate(value):
            _check_checkpoint_finite(x, name, f"{where}[{i}]", depth + 1)


def _check_checkpoint_int(name: str, field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _checkpoint_error(name, field, f"must be an int >= 0, got {value!r}")


def _check_checkpoint_steps(data: Mapping[str, Any], name: str, max_steps_done: int | None) -> int:
    """``steps_done``: an int >= 0 and at most ``max_steps_done``; returned."""
    raw = data.get("steps_done")
    _check_checkpoint_int(name, "steps_done", raw)
    steps = cast(int, raw)  # checked just above
    if max_steps_done is None:
        max_steps_done = MAX_STEPS_DONE
    if steps > max_steps_done:
        raise _checkpoint_error(
            name, "steps_done", f"must be <= {max_steps_done} for this config, got {steps}"
        )
    return steps


def _check_checkpoint_counters(data: Mapping[str, Any], name: str, steps: int) -> None:
    """``param_version`` (agreeing with the driver's, at most ``steps``), the driver's
    numbers, ``metrics_rows`` and ``wall_s``: non-negative."""
    driver = data.get("driver")
    driver = driver if isinstance(driver, Mapping) else {}
    if "param_version" in data:
        version = data["param_version"]
        _check_checkpoint_int(name, "param_version", version)
        if "param_version" in driver and driver["param_version"] != version:
            raise _checkpoint_error(
                name,
                "param_version",
                f"is {version!r} but the driver state says {driver['param_version']!r}",
            )
        if version > steps:  # one version per sync at most
            raise _checkpoint_error(
                name, "param_version", f"is {version} but only {steps} step(s) were trained"
            )
    for key, value in driver.items():
        if key != "policy" and isinstance(value, int | float) and not isinstance(value, bool):
            if value < 0:
                raise _checkpoint_error(name, f"driver.{key}", f"must be >= 0, got {value!r}")
            if key in ("param_version", "cycles", "requested_samples"):
                _check_checkpoint_int(name, f"driver.{key}", value)
    if "metrics_rows" in data:
        _check_checkpoint_int(name, "metrics_rows", data["metrics_rows"])
    wall = data.get("wall_s", 0)
    if isinstance(wall, bool) or not isinstance(wall, int | float) or wall < 0:
        raise _checkpoint_error(name, "wall_s", f"must be a number >= 0, got {wall!r}")


def _check_checkpoint_ids(
    data: Mapping[str, Any],
    name: str,
    steps: int,
    required_samples: int | None,
    id_prefix: str | None,
) -> None:
    """``consumed_sample_ids``: unique, of the source's form, as many as were consumed."""
    import re

    field = "consumed_sample_ids"
    ids = data.get(field)
    if not isinstance(ids, list) or not all(
        isinstance(x, str | int) and not isinstance(x, bool) for x in ids
    ):
        raise _checkpoint_error(name, field, "must be a list of sample ids")
    seen: set[str] = set()
    for x in ids:
        key = str(x)
        if key in seen:
            raise _checkpoint_error(
                name, field, f"holds {key!r} twice (each sample is consumed once)"
            )
        seen.add(key)
    if id_prefix is not None:
        pattern = re.compile(_ID_RE.get(id_prefix, re.escape(id_prefix) + r"[0-9]+"))
        for x in ids:
            if not isinstance(x, str) or not pattern.fullmatch(x):
                raise _checkpoint_error(
                    name,
                    field,
                    f"holds {str(x)[:40]!r}, not an id of this prompt source "
                    f"({id_prefix}0, {id_prefix}1, ...)",
                )
    if required_samples is not None and len(ids) != steps * required_samples:
        raise _checkpoint_error(
            name,
            field,
            f"holds {len(ids)} id(s) but {steps} step(s) x {required_samples} sample(s) were "
            "consumed (a cut or emptied list would retrain prompts already consumed)",
        )


def validate_checkpoint(
    data: Mapping[str, Any],
    name: str,
    *,
    required_samples: int | None = None,
    id_prefix: str | None = None,
    max_steps_done: int | None = None,
) -> None:
    """Check a checkpoint's content before anything starts (after `load_checkpoint`).

    No NaN or infinity anywhere; ``steps_done`` and every version and counter a
    non-negative int (``steps_done`` at most ``max_steps_done``); the consumed sample ids
    unique, of the prompt source's form (``id_prefix`` + index) and as many as the steps
    consumed (``steps_done x required_samples``: an emptied or cut list would retrain
    prompts already consumed).

    Raises:
        ConfigError: one line naming the checkpoint and the field.
    """
    _check_checkpoint_finite(data, name)
    steps = _check_checkpoint_steps(data, name, max_steps_done)
    _check_checkpoint_counters(data, name, steps)
    _check_checkpoint_ids(data, name, steps, required_samples, id_prefix)


def check_resumable(
    path: str,
    config: DynamicScheduleConfig,
    fingerprint: Mapping[str, Any],
    *,
    allow_config_change: bool,
    id_prefix: str,
    where: str,
) -> dict[str, Any]:
    """Read a driver checkpoint before Ray starts and refuse, in one line each: one another
    policy wrote, a malformed driver state, a config fingerprint that differs from
    ``fingerprint`` (unless ``allow_config_change``), inconsistent content
    (`validate_checkpoint`) and policy state the configured policy cannot load.

    ``where`` starts each message (``"--checkpoint 'x.json'"``, ``"--resume: 'x.json'"``).

    Raises:
        ConfigError, UsageError: the one-line reason.
    """
    from dynsched_core.errors import UsageError

    data = load_checkpoint(path, check_driver=False)  # ConfigError naming the file
    writer = checkpoint_policy(data)
    if writer is not None and writer != config.dynamic_schedule_policy:
        raise UsageError(
            f"{where} was written by policy {writer!r}; this run uses "
            f"{config.dynamic_schedule_policy!r} (give --policy {writer} to resume it, or "
            "start a fresh run without --resume)"
        )
    check_checkpoint_driver(data, path)
    refusal = check_fingerprint(data, fingerprint, allow_change=allow_config_change)
    if refusal is not None:
        raise UsageError(refusal)
    validate_checkpoint(
        data,
        path,
        required_samples=checkpoint_required_samples(data) or config.required_samples,
        id_prefix=id_prefix,
    )
    try:  # the policy's part of the state, on a throwaway instance
        config.build_policy().load_state_dict(data["driver"]["policy"])
    except (ValueError, TypeError, KeyError) as exc:
        raise UsageError(
            f"{where}: the {config.dynamic_schedule_policy!r} policy state in it cannot be "
            f"loaded ({exc})"
        ) from None
    return data


def checkpoint_required_samples(data: Mapping[str, Any]) -> int | None:
    """Samples per step of the config that wrote a checkpoint (None when it does not say)."""
    config = data.get("config")
    if not isinstance(config, Mapping):
        return None
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return int(DynamicScheduleConfig.from_dict(dict(config)).required_samples)
    except Exception:  # an unreadable config: the fingerprint check says so
        return None


def shared_fields(source: Any, target: type[Any]) -> dict[str, Any]:
    """The values of ``source``'s attrs fields that the attrs class ``target`` also has,
    by name (e.g. the `FleetSpec` fields of the `RayRunOptions`)."""
    names = {f.name for f in attrs.fields(target)}
    return {f.name: getattr(source, f.name) for f in attrs.fields(type(source)) if f.name in names}


def call_safely(callback: Callable[[Any], None] | None, arg: Any, what: str) -> None:
    """``callback(arg)`` unless it is None; an exception in it is logged, never raised
    (a user callback cannot stop the run)."""
    if callback is None:
        return
    try:
        callback(arg)
    except Exception:
        logger.exception("%s callback failed", what)


def trim_metrics(path: str | os.PathLike[str], steps_done: int, *, numbered_only: bool) -> int:
    """Drop the JSON-lines rows a crashed run wrote after its last checkpoint's step (they
    are redone) and a truncated last line; the number of rows dropped. A row without a
    numeric ``step`` is kept, unless ``numbered_only``."""

    def keep(row: Any) -> bool:
        step = row.get("step") if isinstance(row, dict) else None
        if numbered_only:
            return isinstance(step, int) and not isinstance(step, bool) and step <= steps_done
        return not isinstance(step, int | float) or step <= steps_done

    return trim_json_lines(path, keep)


class _FailFastSink:
    """Passes records on; a write that fails stops the run (``on_error``), never only
    logged (the event bus would swallow it)."""

    def __init__(self, inner: Any, on_error: Callable[[BaseException], object]) -> None:
        self.inner = inner
        self.on_error = on_error

    def write(self, record: Any) -> None:
        try:
            self.inner.write(record)
        except OSError as exc:
            self.on_error(exc)

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        try:
            self.inner.close()
        except OSError as exc:  # pragma: no cover - the data was already fsynced
            logger.warning("closing the metrics file failed: %s", exc)


class _RelabelledSink:
    """Writes the records of a resumed run with global step and cycle numbers."""

    def __init__(self, inner: Any, step_offset: int, cycle_offset: int) -> None:
        self.inner = inner
        self.step_offset = step_offset
        self.cycle_offset = cycle_offset

    def write(self, record: Any) -> None:
        self.inner.write(_relabel(record, self.step_offset, self.cycle_offset))

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()


def _relabel(record: Any, step_offset: int, cycle_offset: int) -> Any:
    if not step_offset and not cycle_offset:
        return record
    return attrs.evolve(
        record,
        cycle=record.cycle + cycle_offset,
        step=record.step + step_offset,
        first_step=record.first_step + step_offset,
    )


class _GroupBackend(RayTrainerGroupBackend):
    """The group backend, awaiting ``after_sync(version, weights)`` after every sync."""

    def __init__(
        self, *args: Any, after_sync: Callable[[int, Any], Awaitable[None]], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._after_sync = after_sync

    async def sync_weights(self, version: int) -> Any:
        weights = await super().sync_weights(version)
        await self._after_sync(version, weights)
        return weights


class RayRunner:
    """Runs the reference fully-async loop on a Ray cluster.

    What the run is about (prompts, replica settings, the hybrid replicas over real
    trainers, checkpoint and resume extras, per-event records) is its *workload*
    (`dynsched_ray.runtime.workload`): ``dynsched run`` uses the default
    `StandInWorkload`, ``dynsched train`` the `TrainWorkload` of `dynsched_ray.training`.

    Args:
        config: Scheduler settings (verl keys accepted through
            `DynamicScheduleConfig.from_dict`/`from_yaml`).
        options: Ray-side settings.
        policy: The policy (default: ``config.build_policy()``).
        prompts: Prompt source (default: the workload's; given, the ids in a resumed
            checkpoint are not checked against the workload's ``id_prefix``).
        progress: Called with one human-readable line per step, switch and failure.
        on_transition: Called with each hybrid state `Transition` (e.g. for drills).
        keep_samples: Keep every consumed sample in `consumed_samples` (for checks).
        on_event: Subscribed to the run's `EventBus` before anything is emitted (every
            core event: `TrainStepEvent` with the run's own step numbers, `SampleEvent`
            with the sample ids produced, consumed and left, ...).
        workload: What the run is about (default: `StandInWorkload`).
        on_loop_built: Called with the core `FullyAsyncLoop` once it is assembled, before
            anything runs (e.g. a drill wrapping ``loop.trainer.train_step``).

    Ray must be initialised (``ray.init()`` or ``ray.init(address="auto")``).
    """

    def __init__(
        self,
        config: DynamicScheduleConfig,
        options: RayRunOptions | None = None,
        *,
        policy: DynamicSchedulePolicyBase | None = None,
        prompts: Any = None,
        progress: Callable[[str], None] | None = None,
        on_transition: Callable[[Any], None] | None = None,
        keep_samples: bool = False,
        on_event: Callable[[Any], None] | None = None,
        workload: RunWorkload | None = None,
        on_loop_built: Callable[[FullyAsyncLoop], None] | None = None,
    ) -> None:
        self.config = config
        self.workload = workload if workload is not None else StandInWorkload()
        self._on_transition = on_transition
        self._on_event_cb = on_event
        self._on_loop_built = on_loop_built
        self.keep_samples = keep_samples
        self.consumed_samples: list[Any] = []
        #: Weight version trained on for each of `consumed_samples` (``keep_samples``).
        self.consumed_versions: list[int] = []
        self.options = v.options_or_default(options, RayRunOptions)
        self.policy = policy if policy is not None else config.build_policy()
        self._prompts = prompts
        self._progress = progress
        self.fleet: RayFleet | None = None
        #: The run's replicas: the one owner of their membership, liveness and routing.
        self.replicas: ReplicaSet | None = None
        self.loop: FullyAsyncLoop | None = None
        self._fatal: asyncio.Event | None = None
        self._consumed: list[str] = []
        self._consumed_steps: list[int] = []
        self._step_offset = 0
        self._cycle_offset = 0
        self._switches: list[str] = []
        self._failed_switches: list[str] = []
        self._transitions: list[tuple[str, str]] = []
        #: The real trainers of a run with ``options.trainer`` (None otherwise).
        self.trainer_group: RayTrainerGroup | None = None
        #: Replaces dead replica actors (runs with ``options.replica_restarts > 0``).
        self.supervisor: ReplicaSupervisor | None = None
        #: A failed checkpoint or metrics write: the run stops with it.
        self._fatal_error: CheckpointWriteError | None = None
        #: Step of the last checkpoint on disk (None: none yet).
        self._last_checkpoint_step: int | None = None
        #: The ``dynamic_resource/*`` aggregator of the run (None before it starts).
        self.metrics_aggregator: Any = None

    # ------------------------------------------------------------------ helpers
    @property
    def num_steps(self) -> int:
        """Micro-steps this run trains."""
        return self.options.num_steps or self.config.total_training_steps or 8

    @property
    def step_offset(self) -> int:
        """Steps done before this run (those of the checkpoint it resumed; else 0)."""
        return self._step_offset

    @property
    def consumed_sample_ids(self) -> tuple[str, ...]:
        """Sample ids consumed so far, over every run of a resumed chain."""
        return tuple(self._consumed)

    def say(self, line: str) -> None:
        """Log one progress line and pass it to the ``progress`` callback."""
        logger.info(line)
        call_safely(self._progress, line, "progress")

    _say = say  # the name `_on_death` and `_start_supervisor` use

    def fleet_spec(self) -> FleetSpec:
        """The actors this run starts: every `FleetSpec` field the options also have
        (name, timeouts, router and queue settings, ...) as the options say, the layout
        from the config, the replicas' keyword arguments from the workload."""
        cfg, opt = self.config, self.options
        standalone_kw, hybrid_kw = self.workload.replica_kwargs(opt)
        fields = shared_fields(opt, FleetSpec)
        fields.update(
            trainer_gpus=cfg.hybrid_gpus,
            standalone_replicas=cfg.num_standalone_replicas,
            hybrid_replicas=cfg.num_hybrid_replicas,
            gpus_per_replica=cfg.rollout_tensor_parallel_size,
            # real trainers (``options.trainer``) start after the fleet, in their group
            trainer_workers=0 if opt.trainer is not None else opt.trainer_workers,
            standalone_kwargs=dict(standalone_kw),
            hybrid_kwargs=dict(hybrid_kw),
            queue_capacity=cfg.max_queue_size,
        )
        return FleetSpec(**fields)

    # ------------------------------------------------------------------ failures
    def _on_death(self, replica_id: str, exc: BaseException) -> None:
        """A replica proxy found its actor dead: tell the one owner of membership (the
        hand-over and the supervisor follow it)."""
        replicas = self.replicas
        if replicas is None or not replicas.mark_dead(replica_id):
            return  # during launch (the launch fails), or already known
        self._say(f"replica {replica_id} is dead ({type(exc).__name__}); removing it from the run")
        if not replicas and self._fatal is not None:
            if self.supervisor is not None and self.supervisor.can_restart_any():
                self._say("every replica is dead; waiting for their restarts")
                return
            self._fatal.set()

    async def _health_checks(self) -> None:
        assert self.fleet is not None
        interval = self.options.health_check_interval_s
        while True:
            await asyncio.sleep(interval)
            await self.fleet.ping_replicas(timeout_s=max(interval * 4, 1.0))

    # ------------------------------------------------------------------ events
    def _on_event(self, event: Any) -> None:
        self.workload.on_event(self, event)
        if isinstance(event, TrainStepEvent):
            step = event.step + self._step_offset
            loop = self.loop
            version = loop.driver.param_version if loop is not None else 0
            state = loop.controller.state if loop is not None else None
            self.say(
                f"step {step}/{self._step_offset + self.num_steps} v{version} mq={event.mq_size}"
                f" wait={event.timings.get('gen', 0.0):.3f}s hybrid={state}"
                + (" [sync]" if event.is_sync_step else "")
            )
            if event.is_sync_step:
                try:
                    self._write_checkpoint()
                except OSError as exc:  # the bus would only log it: stop the run instead
                    self.output_failed("checkpoint write", exc)
        elif isinstance(event, SwitchEvent) and event.kind in ("activate", "deactivate"):
            (self._switches if event.ok else self._failed_switches).append(event.kind)
            status = "ok" if event.ok else f"FAILED: {event.detail}"
            self.say(f"{event.kind} took {event.duration_s * 1e3:.1f} ms ({status})")

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_state(self) -> dict[str, Any]:
        """The driver checkpoint, with the workload's extras at the end."""
        assert self.loop is not None
        driver = self.loop.driver
        state = {
            "format": CHECKPOINT_FORMAT,
            "name": self.options.name,
            "driver": driver.state_dict(),
            "param_version": driver.param_version,
            "steps_done": self._step_offset + len(self._consumed_steps),
            "consumed_sample_ids": list(self._consumed),
            "config": self.config.to_dict(),
            "fingerprint": self.fingerprint(),
        }
        state.update(self.workload.checkpoint_extras(self, state))
        return state

    def fingerprint(self) -> dict[str, Any]:
        """What a resumed run must share with this one: `config_fingerprint` and the
        workload's extras."""
        return with_extras(config_fingerprint(self.config), self.workload.fingerprint_extras(self))

    def _write_checkpoint(self) -> None:
        """Write the driver checkpoint atomically (temp file, fsync, rename).

        Raises:
            OSError: the write failed (the previous checkpoint is intact).
        """
        path = self.options.checkpoint_path
        if not path or self.loop is None or self._fatal_error is not None:
            return
        state = self._checkpoint_state()
        atomic_write_text(path, json.dumps(state))
        self._last_checkpoint_step = int(state["steps_done"])

    def output_failed(self, what: str, exc: BaseException) -> CheckpointWriteError:
        """Record a failed checkpoint/metrics write and stop the run (first one wins);
        the error the run stops with."""
        if self._fatal_error is None:
            step = self._step_offset + len(self._consumed_steps)
            errno = getattr(exc, "errno", None)
            strerror = getattr(exc, "strerror", None)
            reason = f"[Errno {errno}] {strerror}" if errno and strerror else str(exc)
            path = self.options.checkpoint_path
            folder = str(Path(path).parent) if path else ""
            last = self._last_checkpoint_step
            if not path:
                kept = "this run writes no checkpoint"
            elif last is None:
                kept = f"no checkpoint was written yet in {folder}"
            else:
                kept = f"the last good checkpoint (step {last}) is intact in {folder}"
            self._fatal_error = CheckpointWriteError(
                f"{what} failed at step {step}: {reason}; {kept}",
                step=step,
                last_step=last,
                folder=folder,
            )
            logger.error("%s", self._fatal_error)
        if self._fatal is not None:
            self._fatal.set()
        return self._fatal_error

    def _record_step(self, samples: Sequence[Any]) -> None:
        self._consumed_steps.append(len(samples))
        self._consumed.extend(str(getattr(s, "sample_id", "")) for s in samples)
        if self.keep_samples:
            self.consumed_samples.extend(samples)
            version = self.loop.driver.param_version if self.loop is not None else 0
            self.consumed_versions.extend([version] * len(samples))

    # ------------------------------------------------------------------ run
    async def run(self) -> RayRunResult:
        """Launch the fleet, run the loop, write metrics/checkpoint, release the fleet.

        Raises:
            AllReplicasLostError: every replica died; the run cannot continue.
            SampleWaitTimeoutError: the trainer waited longer than ``wait_timeout_s``.
        """
        self._fatal = asyncio.Event()
        restored = self._read_checkpoint()
        self.fleet = fleet = await RayFleet.launch(self.fleet_spec(), on_death=self._on_death)
        self.say(
            f"fleet {self.options.name}: {len(fleet.standalone)} standalone +"
            f" {len(fleet.hybrid)} hybrid replica(s), {self._trainer_worker_count(fleet)} trainer"
            f" worker(s), router {'reused' if fleet.router_reused else 'created'}"
        )
        bus = EventBus()
        if self._on_event_cb is not None:
            bus.subscribe(self._on_event_cb)
        # A resumed run subscribes its metrics after the restore: the restore's staleness
        # reset closes no cycle's rollout window (it would pair with the first cycle).
        aggregator, sink = self._metrics(bus) if restored is None else (None, None)
        health: asyncio.Task[None] | None = None
        try:
            hybrid = await self._trainer_group(fleet)
            self.replicas = self._membership(fleet, hybrid, bus)
            self.loop = loop = self._build_loop(fleet, self.replicas, bus)
            await self._restore(loop, restored)
            if restored is not None:
                aggregator, sink = self._metrics(bus)
            bus.subscribe(self._on_event)
            self._start_supervisor(fleet, loop)
            health = asyncio.ensure_future(self._health_checks())
            result = await self._run_loop(loop)
            if aggregator is not None:
                aggregator.finish(loop.clock.now())
            if self._fatal_error is not None:
                raise self._fatal_error
            try:
                self._write_checkpoint()
            except OSError as exc:
                raise self.output_failed("checkpoint write", exc) from None
        finally:
            await self._release(fleet, health, sink)
        self.say(
            f"done: {result.steps} step(s), {result.samples_consumed} sample(s) consumed,"
            f" {result.samples_left} left, version {result.final_version},"
            f" {result.activations} activation(s), {result.deactivations} deactivation(s),"
            f" dead replicas: {self.replicas.dead_ids or 'none'}"
        )
        return self._result(result, fleet, restored is not None, aggregator)

    def _trainer_worker_count(self, fleet: RayFleet) -> int:
        """Trainer workers of the run: the stand-ins, or the real trainers (one per trainer
        GPU unless the spec says otherwise), which start after the fleet."""
        spec = self.options.trainer
        if spec is None:
            return len(fleet.trainer_workers)
        return int(fleet.spec.trainer_gpus if spec.workers is None else spec.workers)

    def _read_checkpoint(self) -> dict[str, Any] | None:
        """The checkpoint to resume from (None for a fresh run); sets the step offset and
        prepares the outputs (the workload clears a fresh run's, both trim a resumed one's)."""
        opt = self.options
        if not opt.resume:
            self.workload.prepare_outputs(self, None)
            return None
        assert opt.checkpoint_path is not None
        restored = load_checkpoint(opt.checkpoint_path)
        validate_checkpoint(
            restored,
            opt.checkpoint_path,
            required_samples=checkpoint_required_samples(restored) or self.config.required_samples,
            id_prefix=self.workload.id_prefix if self._prompts is None else None,
        )
        self._consumed = list(restored["consumed_sample_ids"])
        self._step_offset = int(restored["steps_done"])
        self._last_checkpoint_step = self._step_offset
        self._trim_metrics(self._step_offset)
        self.workload.prepare_outputs(self, self._step_offset)
        # Cycles the earlier runs reported (a trailing partial cycle counts as one).
        period = max(1, int(self.config.trigger_parameter_sync_step))
        self._cycle_offset = -(-self._step_offset // period)
        return restored

    def _trim_metrics(self, steps_done: int) -> None:
        """Drop the metric rows a crashed run wrote after its last checkpoint (they are
        redone), and a truncated last line, so no cycle is written twice."""
        path = self.options.metrics_path
        if not path:
            return
        dropped = trim_metrics(path, steps_done, numbered_only=False)
        if dropped:
            self.say(f"resume: dropped {dropped} metric row(s) after step {steps_done}")

    async def _trainer_group(self, fleet: RayFleet) -> dict[str, Any]:
        """Start the real trainers (``options.trainer``) on the trainer pool's bundles.

        Returns the hybrid replicas as the loop sees them: with real trainers, as the
        workload wraps them (`RunWorkload.hybrid`: by default in `HandOverReplica`, so a
        hybrid replica wakes only after the trainer on its GPU offloaded, and a trainer
        reloads only after the hybrid slept).
        """
        opt = self.options
        if opt.trainer is None:
            return dict(fleet.hybrid)
        self.trainer_group = group = await RayTrainerGroup.launch(
            fleet.pools,
            opt.trainer,
            gpu_fraction=1.0 - opt.hybrid_gpu_fraction if fleet.hybrid else 1.0,
            name=opt.name,
            namespace=opt.namespace,
            call_timeout_s=opt.call_timeout_s,
        )
        return {
            rid: self.workload.hybrid(self, group, replica, fleet.placement_of(rid).gpu_ids)
            for rid, replica in fleet.hybrid.items()
        }

    def _membership(self, fleet: RayFleet, hybrid: dict[str, Any], bus: EventBus) -> ReplicaSet:
        """The run's `ReplicaSet` over the fleet's replicas, with their records (the router
        and the trainers' hand-over follow it)."""
        replicas = fleet.replica_set(hybrid=hybrid, events=bus)
        if self.trainer_group is not None:
            self.trainer_group.follow(replicas)
        return replicas

    def _build_loop(self, fleet: RayFleet, replicas: ReplicaSet, bus: EventBus) -> FullyAsyncLoop:
        """Assemble the core loop over the fleet: every part given, none swapped later."""
        opt, cfg = self.options, self.config
        trainer: RayTrainerBackend | RayTrainerGroupBackend
        if self.trainer_group is not None and opt.trainer is not None:
            trainer = self._group_backend(replicas)
        else:
            trainer = RayTrainerBackend(
                fleet.trainer_workers,
                replicas,
                call_timeout_s=opt.call_timeout_s,
                step_time_s=opt.trainer_step_time_s,
                on_step=self._record_step,
            )
        loop = FullyAsyncLoop.build(
            cfg,
            self.policy,
            trainer,
            prompts=self._prompt_source(),
            replicas=replicas,
            queue=fleet.queue,
            events=bus,
            wait_timeout_s=opt.wait_timeout_s,
            max_tokens=opt.max_tokens,
            client_options=ClientOptions.from_config(
                cfg, no_replica_timeout_s=opt.no_replica_timeout_s, max_failures=opt.max_failures
            ),
            controller_options=ControllerOptions(call_timeout_s=opt.call_timeout_s),
            driver_options=DriverOptions(wait_timeout_s=opt.wait_timeout_s, failover=opt.failover),
        )
        loop.controller.state_machine.add_listener(
            lambda tr: self._transitions.append((tr.source.name, tr.target.name))
        )
        if self._on_transition is not None:
            loop.controller.state_machine.add_listener(self._on_transition)
        if self._on_loop_built is not None:
            self._on_loop_built(loop)
        return loop

    def _group_backend(self, replicas: ReplicaSet) -> RayTrainerGroupBackend:
        """The loop's trainer backend over the real trainers; it tells the workload of
        every weight sync."""
        assert self.trainer_group is not None and self.options.trainer is not None
        return _GroupBackend(
            self.trainer_group,
            self.options.trainer.make_batch,
            replicas,
            on_step=self._record_step,
            after_sync=lambda version, weights: self.workload.weights_synced(
                self, version, weights
            ),
        )

    def _prompt_source(self) -> Any:
        return self._prompts if self._prompts is not None else self.workload.prompts(self)

    async def _restore(self, loop: FullyAsyncLoop, restored: dict[str, Any] | None) -> None:
        """Load the driver's checkpoint; the run continues at its parameter version, with
        the standalone replicas synced to it before they serve."""
        if restored is None:
            return
        loop.driver.load_state_dict(restored["driver"])
        version = loop.driver.param_version
        # the workload's state (e.g. real trainers' weights) comes back before the sync
        # below exports weights from the trainer
        await self.workload.restore(self, loop, restored)
        # the fresh standalone replicas start with no weights: load the checkpoint's
        # version before they serve, or the first samples would be generated with
        # version-0 weights and trained many versions later
        weights = await loop.trainer.sync_weights(version)
        loop.driver.set_current_weights(version, weights)
        await loop.rollouter.reset_staleness(version)
        self.say(
            f"resumed from {self.options.checkpoint_path}: version {loop.driver.param_version},"
            f" {self._step_offset} step(s) and {len(self._consumed)} sample(s) done"
        )

    def _start_supervisor(self, fleet: RayFleet, loop: FullyAsyncLoop) -> None:
        """Replace dead replica actors (``options.replica_restarts``) from their records."""
        replicas = self.replicas
        assert replicas is not None
        if not self.options.replica_restarts:
            return
        group = self.trainer_group

        def wrap_hybrid(proxy: RayReplica) -> Any:
            if group is None:
                return proxy
            # the same wrapping as at launch (the workload's: a restarted hybrid of a
            # training run loads its weights from the trainer on its own GPU)
            gpus = replicas.placement_of(proxy.replica_id).gpu_ids
            return self.workload.hybrid(self, group, proxy, gpus)

        self.supervisor = ReplicaSupervisor(
            fleet,
            replicas,
            weights=lambda: loop.driver.current_weights,
            options=RestartOptions(
                max_restarts=self.options.replica_restarts,
                restart_timeout_s=self.options.restart_timeout_s,
            ),
            on_death=self._on_death,
            wrap_hybrid=wrap_hybrid,
            progress=self._say,
        )
        self.supervisor.start()

    async def _release(self, fleet: RayFleet, health: asyncio.Task[None] | None, sink: Any) -> None:
        """Stop the health checks, flush pending router calls, free the actors."""
        if self.supervisor is not None:
            await self.supervisor.stop()
        if health is not None:
            health.cancel()
            await asyncio.gather(health, return_exceptions=True)
        if self.replicas is not None:
            await self.replicas.settle(timeout_s=5.0)
        await fleet.router.drain(timeout_s=5.0)
        if sink is not None:
            sink.close()
        await fleet.stop_replicas(timeout_s=min(fleet.spec.call_timeout_s, 60.0))
        fleet.shutdown(keep_router=self.options.keep_router)
        if self.trainer_group is not None:
            self.trainer_group.shutdown()

    def _result(
        self, result: LoopResult, fleet: RayFleet, resumed: bool, aggregator: Any
    ) -> RayRunResult:
        assert self.replicas is not None
        return RayRunResult(
            loop=result,
            first_step=self._step_offset + 1,
            final_version=result.final_version,
            switches=tuple(self._switches),
            failed_switches=tuple(self._failed_switches),
            transitions=tuple(self._transitions),
            dead_replicas=tuple(self.replicas.dead_ids),
            router_reused=fleet.router_reused,
            resumed=resumed,
            metrics=tuple(
                _relabel(r, self._step_offset, self._cycle_offset).as_dict()
                for r in aggregator.records
            )
            if aggregator is not None
            else (),
            consumed_sample_ids=tuple(self._consumed),
            interrupted=tuple(
                (rid, req, kept)
                for replica in [*fleet.retired, *fleet.replicas.values()]
                for rid in [replica.replica_id]
                for req, kept in replica.interrupted
            ),
            trainer_metrics=tuple(getattr(self.loop.trainer, "metrics", ()))
            if self.loop is not None
            else (),
            restarts=tuple(self.supervisor.history) if self.supervisor is not None else (),
            queue_restarts=fleet.queue.restarts,
            router_restarts=fleet.router.restarts,
            failovers=result.failovers,
        )

    async def _run_loop(self, loop: FullyAsyncLoop) -> LoopResult:
        assert self._fatal is not None and self.replicas is not None
        run = asyncio.ensure_future(loop.run(self.num_steps))
        fatal = asyncio.ensure_future(self._fatal.wait())
        try:
            await asyncio.wait({run, fatal}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # the driver is going away: stop the loop too (bounded), not just this wait
            run.cancel()
            await asyncio.wait({run}, timeout=self.options.call_timeout_s)
            raise
        finally:
            fatal.cancel()
        if run.done():
            result = run.result()
            if self._fatal_error is not None:
                raise self._fatal_error
            return result
        # A write failed, or every replica is gone: stop the loop (bounded), then report.
        run.cancel()
        await asyncio.wait({run}, timeout=self.options.call_timeout_s)
        if self._fatal_error is not None:
            raise self._fatal_error
        raise AllReplicasLostError(self.replicas.dead_ids)

    def _metrics(self, bus: EventBus) -> tuple[Any, Any]:
        try:
            from dynsched_metrics import JsonLinesSink, MetricsAggregator
        except ImportError:  # pragma: no cover - dynsched-metrics is a dependency
            logger.warning("dynsched-metrics is not installed: no dynamic_resource/* metrics")
            return None, None
        sink: Any = (
            JsonLinesSink(self.options.metrics_path, append=self.options.resume)
            if self.options.metrics_path
            else None
        )
        if sink is not None and (self._step_offset or self._cycle_offset):
            sink = _RelabelledSink(sink, self._step_offset, self._cycle_offset)
        if sink is not None:
            sink = _FailFastSink(sink, lambda exc: self.output_failed("metrics write", exc))
        self.metrics_aggregator = aggregator = MetricsAggregator(
            hybrid_gpus=self.config.hybrid_gpus
            if self.config.use_dynamic_resource_scheduling
            else 0,
            standalone_gpus=self.config.standalone_gpus,
            bus=bus,
            sinks=[sink] if sink is not None else [],
        )
        return aggregator, sink


def run_ray(
    config: DynamicScheduleConfig | Mapping[str, Any],
    options: RayRunOptions | None = None,
    **kwargs: Any,
) -> RayRunResult:
    """Synchronous convenience: build a `RayRunner` and run it with ``asyncio.run``."""
    cfg = (
        config
        if isinstance(config, DynamicScheduleConfig)
        else DynamicScheduleConfig.from_dict(config)
    )
    return asyncio.run(RayRunner(cfg, options, **kwargs).run())
