"""The one config loader of ``dynsched run`` and ``dynsched train``.

Both commands read a verl-layout YAML file (or their demo), apply ``--set KEY=VALUE``
overrides and build the core `DynamicScheduleConfig` through `load_verl_config`; every
check happens here, before Ray starts, and ends in one line (exit status 2 through the
``dynsched`` dispatcher):

- the file through the core's guarded reader (`dynsched_core._loading`: size, expanded
  size, depth, huge integers, YAML syntax with line and column);
- an unknown ``--set`` key (``dynsched run``: refused naming the closest key);
- a misspelt key dynsched reads (a warning naming the closest known key; verl's other keys
  load without a word);
- the values (type and range, upper bounds included: the core's validators);
- `check_local_capacity`: on a local cluster (no ``--address``) no more GPUs than the
  machine can host.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import attrs
from dynsched_core.errors import ConfigError, UsageError

__all__ = [
    "DEMO_ASYNC_TRAINING",
    "DEVICES",
    "LOCAL_GPUS_PER_CPU",
    "LoadedConfig",
    "add_config_arguments",
    "add_ray_arguments",
    "check_device",
    "check_local_capacity",
    "init_command_ray",
    "known_override_keys",
    "load_verl_config",
    "local_gpu_limit",
    "ray_start_error",
]

#: Stand-in GPUs (each one a replica or trainer-worker process) a local cluster may have
#: per CPU core of this machine; ``DYNSCHED_LOCAL_MAX_GPUS`` overrides the product.
LOCAL_GPUS_PER_CPU = 4
#: The local bound is at least this (a 1-core machine still runs the 4-GPU demo).
LOCAL_GPUS_MIN = 8
#: Environment variable that sets the local bound explicitly.
LOCAL_MAX_GPUS_ENV = "DYNSCHED_LOCAL_MAX_GPUS"


#: The scheduler settings of both demos (``dynsched run`` and ``dynsched train`` without
#: ``--config``): dynamic scheduling with the default policy, weights synced every 2 steps.
DEMO_ASYNC_TRAINING: Mapping[str, Any] = {
    "use_dynamic_resource_scheduling": True,
    "dynamic_schedule_policy": "default",
    "trigger_parameter_sync_step": 2,
    "staleness_threshold": 0.5,
    "concurrent_samples_per_replica": 4,
    "partial_rollout": True,
}


@attrs.frozen
class LoadedConfig:
    """A loaded config.

    Attributes:
        config: The core scheduler config.
        tree: The whole verl tree (dotted keys expanded, overrides applied).
        warnings: One line per unknown/misspelt key (without the command's prefix).
    """

    config: Any
    tree: dict[str, Any]
    warnings: tuple[str, ...]


def load_verl_config(
    path: str | None,
    overrides: list[str],
    *,
    demo: Mapping[str, Any],
    strict_overrides: bool = True,
    extra_read: tuple[str, ...] = (),
    command: str | None = None,
) -> LoadedConfig:
    """Read ``path`` (or ``demo``), apply ``KEY=VALUE`` ``overrides``, build the config.

    Args:
        path: YAML file in verl's layout; None: ``demo``.
        overrides: ``--set`` items.
        demo: The config used without a file.
        strict_overrides: Refuse a ``--set`` key dynsched does not read (with the closest
            known key); otherwise any key is merged into the tree.
        extra_read: Dotted verl keys the command reads besides the scheduler's (for the
            misspelling warnings and the strict ``--set`` check).
        command: The sub-command (``run``, ``train``): its warnings are also printed on
            stderr, one line each, as ``dynsched <command>: warning: ...``.

    Raises:
        UsageError: the file is missing, unreadable, hostile or not a mapping; an
            override is malformed or (strict) names an unknown key.
        ConfigError: a value is invalid (names the key and the allowed values).
    """
    from dynsched_core import DynamicScheduleConfig
    from dynsched_core._config import _expand_dotted, unknown_key_messages
    from dynsched_core._loading import check_tree

    data = _read_config_file(path) if path else json.loads(json.dumps(demo))
    tree = _expand_dotted(data)
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        if strict_overrides:
            _check_override_key(key, extra_read)
        parsed = _parse_value(key, value)
        _merge(tree, _expand_dotted({key: parsed}))
    check_tree(tree)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the same messages, collected below
        config = DynamicScheduleConfig.from_dict(tree)
    loaded = LoadedConfig(config, tree, tuple(unknown_key_messages(tree, extra_read)))
    for message in loaded.warnings if command else ():
        print(f"dynsched {command}: warning: {message}", file=sys.stderr)
    return loaded


def add_config_arguments(p: argparse.ArgumentParser, *, config_help: str, set_help: str) -> None:
    """The config flags every command shares: ``--config``, ``--set``, ``--policy``."""
    p.add_argument("--config", default=None, help=config_help)
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=set_help,
    )
    p.add_argument("--policy", default=None, help="policy name (overrides dynamic_schedule_policy)")


def add_ray_arguments(p: argparse.ArgumentParser, *, address_help: str) -> None:
    """The Ray flags every command shares (read by `init_command_ray`): ``--address``,
    ``--node-ip-address``, ``--namespace``, ``--num-cpus``."""
    p.add_argument("--address", default=None, help=address_help)
    p.add_argument(
        "--node-ip-address",
        default=None,
        help="address of this node for Ray (default: Ray's choice; 127.0.0.1 keeps every "
        "listener on this machine)",
    )
    p.add_argument("--namespace", default=None, help="Ray namespace of the named actors")
    p.add_argument(
        "--num-cpus", type=int, default=None, help="CPUs of a local Ray cluster (default 4)"
    )


def init_command_ray(
    ray: Any, plan: Any, args: argparse.Namespace, config: Any, *, prog: str, **extra: Any
) -> None:
    """Start (or join) Ray for a command (`dynsched_ray.runtime.security.init_ray`): the
    ``--namespace``, ``--num-cpus`` (default 4) CPUs and the config's GPUs, no dashboard;
    ``extra`` goes to ``ray.init``."""
    from dynsched_ray.runtime.security import init_ray

    init_ray(
        ray,
        plan,
        namespace=args.namespace,
        prog=prog,
        num_cpus=args.num_cpus or 4,
        num_gpus=config.hybrid_gpus + config.standalone_gpus,
        include_dashboard=False,
        **extra,
    )


def ray_start_error(prog: str, address: str | None, exc: BaseException) -> str:
    """The one line saying Ray could not start (or be joined at ``address``)."""
    where = f"join the Ray cluster at {address!r}" if address else "start a local Ray cluster"
    return f"{prog}: error: could not {where}: {exc}"


def _read_config_file(path: str) -> dict[str, Any]:
    from dynsched_core._loading import read_config_file

    if os.path.isdir(path):
        raise UsageError(f"--config {path!r} is a directory, not a YAML file")
    try:
        data = read_config_file(path)
    except FileNotFoundError:
        raise UsageError(f"--config {path!r} does not exist") from None
    except OSError as exc:
        raise UsageError(f"--config {path!r}: cannot read it ({exc.strerror or exc})") from None
    except ConfigError as exc:
        raise UsageError(f"--config {path!r}: {exc}") from None
    if data is None:
        raise UsageError(
            f"--config {path!r} is empty: give at least the trainer and rollout GPUs "
            "(trainer.n_gpus_per_node, rollout.n_gpus_per_node), or leave out --config "
            "for the demo"
        )
    if not isinstance(data, dict):
        raise UsageError(
            f"--config {path!r} must hold a mapping of config keys, got {type(data).__name__}"
        )
    return data


def _parse_value(key: str, text: str) -> Any:
    from dynsched_core._loading import parse_yaml

    try:
        return parse_yaml(text)
    except ImportError:  # pragma: no cover - PyYAML is a dependency of dynsched-ray
        try:
            return json.loads(text)
        except ValueError:
            return text
    except ConfigError as exc:
        raise UsageError(f"--set {key}=...: {exc}") from None


def known_override_keys(extra_read: tuple[str, ...] = ()) -> list[str]:
    """Keys ``--set`` accepts: the flat field names and the verl keys dynsched reads."""
    from dynsched_core._config import _IGNORED_ASYNC_KEYS, _VERL_PATHS

    keys = set(_VERL_PATHS) | set(extra_read)
    keys.update(path for paths in _VERL_PATHS.values() for path in paths)
    keys.update(f"async_training.{k}" for k in _IGNORED_ASYNC_KEYS)
    return sorted(keys)


def _check_override_key(key: str, extra_read: tuple[str, ...] = ()) -> None:
    known = known_override_keys(extra_read)
    if key in known:
        return
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if not close:  # compare the last part: --set foo.staleness=... -> staleness_threshold
        leaf = key.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(leaf, known, n=1, cutoff=0.0)
    hint = f"; the closest known key is {close[0]!r}" if close else ""
    raise UsageError(
        f"--set: unknown config key {key!r}{hint} (known keys: the config field names, "
        "e.g. staleness_threshold, or verl keys, e.g. async_training.staleness_threshold)"
    )


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def local_gpu_limit() -> tuple[int, str]:
    """Stand-in GPUs a local cluster on this machine may have, and why (for the message)."""
    env = os.environ.get(LOCAL_MAX_GPUS_ENV, "").strip()
    if env:
        try:
            value = int(env)
        except ValueError:
            raise UsageError(f"{LOCAL_MAX_GPUS_ENV}={env!r}: expected a whole number") from None
        if value < 1:
            raise UsageError(f"{LOCAL_MAX_GPUS_ENV}={env!r}: expected a number >= 1")
        return value, f"{LOCAL_MAX_GPUS_ENV}={value}"
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    limit = max(LOCAL_GPUS_MIN, LOCAL_GPUS_PER_CPU * cores)
    return limit, f"{LOCAL_GPUS_PER_CPU} per CPU core, {cores} core(s)"


def check_local_capacity(
    config: Any, *, address: str | None, trainer_workers: int | None = None
) -> None:
    """Refuse a local cluster larger than this machine can host (before Ray starts).

    Each stand-in GPU of a local cluster becomes a replica or trainer-worker process, so
    a config written for a real cluster (``trainer.n_gpus_per_node=64``) would start
    dozens of Python processes on a laptop. With ``address`` (a real cluster) only the
    core's absolute bounds apply.

    Raises:
        UsageError: naming the GPU keys, the count, this machine's bound and ``--address``.
    """
    if address:
        return
    limit, why = local_gpu_limit()
    gpus = config.hybrid_gpus + config.standalone_gpus
    if gpus > limit:
        raise UsageError(
            f"trainer.nnodes x trainer.n_gpus_per_node + rollout.nnodes x "
            f"rollout.n_gpus_per_node = {config.trainer_nnodes} x "
            f"{config.trainer_n_gpus_per_node} + {config.rollout_nnodes} x "
            f"{config.rollout_n_gpus_per_node} = {gpus} GPUs, but a local cluster on this "
            f"machine can host at most {limit} ({why}; each GPU is a process); lower them, "
            f"or run on a real cluster with --address ADDRESS"
        )
    if trainer_workers is not None and trainer_workers > limit:
        raise UsageError(
            f"--trainer-workers {trainer_workers}: a local cluster on this machine can host "
            f"at most {limit} ({why}); lower it, or run on a real cluster with --address ADDRESS"
        )


#: ``--device`` values ``dynsched train`` accepts (and ``cuda:N``).
DEVICES = ("cpu", "cuda", "auto")


def check_device(device: str) -> None:
    """Refuse a ``--device`` that is not ``cpu``/``cuda``/``cuda:N``/``auto``, or a CUDA
    device this machine does not have (before Ray starts: the trainer actors would fail).

    Raises:
        UsageError: naming the allowed values, or why CUDA is not usable here.
    """
    kind, sep, index = device.partition(":")
    if kind not in DEVICES or (sep and (kind != "cuda" or not index.isdigit())):
        raise UsageError(
            f"--device {device!r}: allowed values are cpu, cuda, cuda:N (a device index) "
            "or auto (CUDA when available)"
        )
    if kind != "cuda":
        return
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of dynsched train
        raise UsageError(f"--device {device}: torch is not installed; use --device cpu") from None
    if not torch.cuda.is_available():
        build = (
            "a CPU-only build"
            if torch.version.cuda is None
            else f"built for CUDA {torch.version.cuda}"
        )
        raise UsageError(
            f"--device {device}: no CUDA device is visible here (torch {torch.__version__}, "
            f"{build}); use --device cpu"
        )
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        raise UsageError(
            f"--device {device}: this machine has {count} CUDA device(s) (cuda:0.."
            f"cuda:{count - 1}); use one of them or --device cuda"
        )
