"""`dynsched train` underneath: real fully-async RL with dynamic scheduling on Ray.

`TrainRunner` is the one `RayRunner` (same fleet, `ReplicaSet`, `ScheduleDriver`,
retrying client and loop) configured with a `TrainWorkload` that plugs real parts in:

- rollout replicas are real engines, built by the engine plug-in ``settings.engine``
  (`VLLMReplica`, `HFReplica` where starting vLLM costs more than the run, or any
  installed `EnginePlugin`), serving the warmed-up tiny model (`warm_up`);
- the trainers are real, built by the trainer plug-in ``settings.trainer`` (`TorchTrainer`,
  `MegatronTrainer` or any installed `TrainerPlugin`) in a `RayTrainerGroup`, fed
  `TrainBatch`es of the task's prompts with the task's reward;
- every step writes one JSON line (reward, loss, step time, queue size, hybrid state,
  weight-version lag, and the ``dynamic_resource/*`` metrics of the cycle it closes);
- every weight sync checkpoints the trainer (model and optimizer, ``trainer-v<N>.pt``),
  the driver (policy state, counters, parameter version) and the consumed sample ids;
  ``resume`` loads them, pushes the restored weights to every replica, and continues
  with the prompts not yet consumed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import attrs
from dynsched_core import ConfigError, DynamicScheduleConfig
from dynsched_core import validators as v
from dynsched_core._config import MAX_STEPS, MAX_TOKENS
from dynsched_core.events import TrainStepEvent
from dynsched_core.storage import append_line, atomic_writer
from dynsched_core.trainer import HandOverReplica, TrainBatch

from dynsched_ray.plugins import ENGINES, TRAINERS, PluginKind, RunContext
from dynsched_ray.runtime.runner import (
    RayRunner,
    RayRunOptions,
    RayRunResult,
    call_safely,
    config_fingerprint,
    trim_metrics,
    with_extras,
)
from dynsched_ray.runtime.workload import RunWorkload, StandInWorkload
from dynsched_ray.task.addition import AdditionTask, TaskTokenizer, WarmUpOptions
from dynsched_ray.trainers.group import RayTrainerGroup, RayTrainerGroupBackend, RayTrainerSpec

__all__ = [
    "RolloutWorkload",
    "TrainRunner",
    "TrainRunnerOptions",
    "TrainSettings",
    "TrainSummary",
    "TrainWorkload",
    "lag_bound",
    "read_metrics",
]

logger = logging.getLogger(__name__)

#: `TrainSettings` field -> the verl key it is read from (`TrainSettings.from_verl`).
_VERL_KEYS = {
    "lr": "actor_rollout_ref.actor.optim.lr",
    "temperature": "actor_rollout_ref.rollout.temperature",
    "max_tokens": "data.max_response_length",
    "seed": "data.seed",
    "steps": "trainer.total_training_steps",
    "out_dir": "trainer.default_local_dir",
}
#: The verl keys ``dynsched train`` reads besides the scheduler's (misspelling warnings).
TRAIN_VERL_KEYS = tuple(_VERL_KEYS.values())
TRAINER_CKPT = "trainer-v{version}.pt"


def _installed(kind: PluginKind[Any]) -> Any:
    """Validator: the value names an installed plug-in of ``kind`` (nothing imported)."""

    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, str):
            raise ConfigError(
                f"TrainSettings.{attribute.name} must be a {kind.group.kind} name (one of "
                f"{kind.names()}), got {type(value).__name__}",
                key=attribute.name,
            )
        kind.check(value, key=attribute.name, where=f"TrainSettings.{attribute.name}")

    return check


@attrs.frozen(kw_only=True)
class TrainSettings:
    """What `dynsched train` trains, besides the scheduler config.

    The verl keys they come from (`from_verl`): ``actor_rollout_ref.actor.optim.lr``,
    ``actor_rollout_ref.rollout.temperature``, ``data.max_response_length``,
    ``data.seed``, ``trainer.total_training_steps``, ``trainer.default_local_dir``.

    Attributes:
        out_dir: Metrics (``metrics.jsonl``) and checkpoints (``checkpoint/``) go here.
        model_cache: Folder of the warmed-up model (built on first use, then reused).
        engine: An engine plug-in's name (entry-point group ``dynsched.engines``):
            ``"vllm"`` (`VLLMReplica`), ``"hf"`` (`HFReplica`) or an installed one.
        trainer: A trainer plug-in's name (``dynsched.trainers``): ``"torch"``
            (`TorchTrainer`), ``"megatron"`` (`MegatronTrainer`) or an installed one.
        steps: Trainer micro-steps of this run.
        seed: Seed of the prompts' order, the sampling and the trainer.
        lr: Trainer learning rate (judgement for the tiny model; verl's default 1e-6
            is for billion-parameter models).
        temperature: Rollout sampling temperature.
        max_tokens: Response budget in tokens.
        task: The task.
        warm_up: The supervised warm-up.
        device: Trainer and HF-engine device (``cpu``, ``cuda``, ``auto``).
        stream_tokens: Replica streaming segment (see `RayRunOptions`).
        keep_checkpoints: Trainer checkpoints kept on disk (older ones are deleted).
    """

    out_dir: str = "dynsched-train"
    model_cache: str = "dynsched-model-cache"
    engine: str = attrs.field(default="vllm", validator=_installed(ENGINES))
    trainer: str = attrs.field(default="torch", validator=_installed(TRAINERS))
    steps: int = attrs.field(default=12, validator=v.int_ge(1, maximum=MAX_STEPS))
    seed: int = attrs.field(default=0, validator=v.int_ge(0, maximum=2**32 - 1))
    lr: float = attrs.field(default=1e-3, validator=v.float_gt(0.0))
    temperature: float = attrs.field(default=1.0, validator=v.float_in(0.0, 100.0))
    max_tokens: int = attrs.field(default=6, validator=v.int_ge(1, maximum=MAX_TOKENS))
    task: AdditionTask = attrs.field(factory=AdditionTask)
    warm_up: WarmUpOptions = attrs.field(factory=WarmUpOptions)
    device: str = "cpu"
    stream_tokens: int | None = 16
    keep_checkpoints: int = 2

    @classmethod
    def from_verl(cls, tree: Mapping[str, Any], **kwargs: Any) -> TrainSettings:
        """Read the training keys of a verl config tree; ``kwargs`` win."""

        from dynsched_core._config import _lookup

        found = {name: _lookup(tree, path)[1] for name, path in _VERL_KEYS.items()}
        values = {k: v for k, v in found.items() if v is not None}
        given = {k: v for k, v in kwargs.items() if v is not None}
        values.update(given)
        try:
            return cls(**values)
        except ConfigError as exc:  # name the key as the user gave it
            field = exc.key or ""
            prefix = f"{cls.__name__}.{field}"
            where = f"--{field.replace('_', '-')}" if field in given else _VERL_KEYS.get(field)
            message = str(exc)
            if where is None or not message.startswith(prefix):
                raise
            raise type(exc)(f"{where}{message[len(prefix) :]}", key=where) from None

    @property
    def metrics_path(self) -> Path:
        """The per-step JSON-lines file."""
        return Path(self.out_dir) / "metrics.jsonl"

    @property
    def checkpoint_dir(self) -> Path:
        """The checkpoint folder."""
        return Path(self.out_dir) / "checkpoint"


def lag_bound(config: DynamicScheduleConfig) -> int:
    """The largest weight-version lag a sample may have under the staleness control.

    Window ``v`` admits at most ``(1 + staleness_threshold) * required_samples * T``
    samples while the trainer consumes ``required_samples * T`` per version, so the
    surplus admitted under ``v`` is consumed within ``ceil(staleness_threshold)`` later
    versions: lag = consuming version - admission version <= ``ceil(threshold)``.
    """
    return math.ceil(config.staleness_threshold)


def train_fingerprint(config: DynamicScheduleConfig, settings: TrainSettings) -> dict[str, Any]:
    """What a resumed `dynsched train` must share with the run that wrote the checkpoint:
    the scheduler config's fingerprint (`config_fingerprint`) and
    `train_fingerprint_extras`."""
    return with_extras(config_fingerprint(config), train_fingerprint_extras(settings))


def train_fingerprint_extras(settings: TrainSettings) -> dict[str, Any]:
    """The training settings a resumed run must share: the engine, trainer, seed,
    learning rate, temperature, response budget, the task and the warm-up."""
    out: dict[str, Any] = {
        "train.engine": settings.engine,
        "train.trainer": settings.trainer,
        "data.seed": settings.seed,
        "actor_rollout_ref.actor.optim.lr": settings.lr,
        "actor_rollout_ref.rollout.temperature": settings.temperature,
        "train.max_tokens": settings.max_tokens,
    }
    out.update({f"task.{k}": v for k, v in attrs.asdict(settings.task).items() if k != "seed"})
    out.update({f"warm_up.{k}": v for k, v in attrs.asdict(settings.warm_up).items()})
    return out


def resolve_checkpoint_file(folder: str | os.PathLike[str], name: Any) -> Path:
    """The file a checkpoint's JSON names, inside the checkpoint folder only.

    Raises:
        ConfigError: ``name`` is not a plain file name (absolute, ``..``, a folder part),
            or resolves (through a symlink) outside ``folder``, or is not a file there.
    """
    base = Path(folder)
    shown = repr(name) if not isinstance(name, str) else repr(name[:80])
    if (
        not isinstance(name, str)
        or not name
        or "\x00" in name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or os.path.isabs(name)
    ):
        raise ConfigError(
            f"resume: the checkpoint's 'trainer_state' must be a file name inside {str(base)!r},"
            f" got {shown}",
            key="trainer_state",
        )
    path = base / name
    real, root = os.path.realpath(path), os.path.realpath(base)
    if os.path.commonpath([real, root]) != root:
        raise ConfigError(
            f"resume: the checkpoint's 'trainer_state' {shown} leads outside {str(base)!r} "
            "(a symlink); refusing it",
            key="trainer_state",
        )
    if not os.path.isfile(real):
        raise ConfigError(
            f"resume: the checkpoint names trainer state {shown}, which is not in {str(base)!r}",
            key="trainer_state",
        )
    return path


def load_trainer_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a trainer checkpoint holding only tensors and plain data (``weights_only``:
    a file that would run code when unpickled is refused, nothing of it is executed).

    Raises:
        ConfigError: the file is not such a checkpoint (one line naming it).
    """
    import pickle
    import zipfile

    import torch

    try:
        state = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError) as exc:
        import re

        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
        # torch's refusal names the offending global (its advice to load the file
        # anyway is not repeated)
        found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
        why = f"it calls {found.group(1)}" if found else f"unreadable ({type(exc).__name__})"
        raise ConfigError(
            f"resume: trainer state {os.fspath(path)!r} is not a plain tensor checkpoint "
            f"(refused, nothing in it was run): {why[:200]}",
            key="trainer_state",
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"resume: trainer state {os.fspath(path)!r}: cannot read it ({exc.strerror or exc})",
            key="trainer_state",
        ) from None
    if not isinstance(state, dict):
        raise ConfigError(
            f"resume: trainer state {os.fspath(path)!r} is not a state dict "
            f"(got {type(state).__name__})",
            key="trainer_state",
        )
    return state


@attrs.frozen(kw_only=True)
class TrainSummary:
    """What a `TrainRunner` run reports besides the `RayRunResult`.

    Attributes:
        result: The Ray runner's result.
        rows: The per-step metric rows of this run (as written to ``metrics.jsonl``).
        wall_s: Wall-clock seconds of the run (fleet start to end).
        lags: Weight-version lag of every consumed sample of this run.
        model: The model folder the run started from.
    """

    result: RayRunResult
    rows: tuple[dict[str, Any], ...]
    wall_s: float
    lags: tuple[int, ...]
    model: str


class _TrainerLocalHandOver(HandOverReplica):
    """A hybrid replica that loads its weights from the trainer worker on its own GPU.

    Every weight load of a hybrid replica (after a sync, or when lent mid-cycle at any
    step boundary) takes the synced copy its trainer worker keeps
    (`RayTrainerGroup.local_weights`): an object ref resolved from the node's own object
    store, so the driver never sends the bytes (no broadcast). When that worker keeps no
    copy of the version (right after a resume, before the first sync) the weights come
    from ``weights_for`` (the restored checkpoint) or, failing that, as the driver
    passed them.

    Attributes:
        loads: ``(version, source)`` of every weight load, source ``"trainer"`` (the
            trainer worker's copy) or ``"driver"`` (the driver's or the checkpoint's).
    """

    def __init__(
        self,
        *args: Any,
        weights_for: Callable[[int], Any],
        local: Callable[[int], Any],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._weights_for = weights_for
        self._local = local
        self.loads: list[tuple[int, str]] = []

    async def update_weights(self, version: int, weights: Any = None) -> None:
        ref = self._local(version)
        if ref is not None:
            self.loads.append((version, "trainer"))
            await super().update_weights(version, ref)
            return
        if weights is None:
            weights = self._weights_for(version)
        self.loads.append((version, "driver"))
        await super().update_weights(version, weights)


class TrainWorkload(RunWorkload):
    """``dynsched train``'s workload of the `RayRunner` (`RunWorkload`).

    - prompts: the addition task's (ids ``t0, t1, ...``), skipping those consumed;
    - replicas: built by the engine plug-in ``settings.engine`` with its options for the
      run (the caller's ``replica_kwargs`` win); real trainers by the trainer plug-in
      ``settings.trainer`` (`trainer_spec`), fed `TrainBatch`es with the task's reward;
    - each hybrid replica loads its weights from the trainer worker on its own GPU
      (`_TrainerLocalHandOver`);
    - every weight sync writes the trainer's model and optimizer (``trainer-v<N>.pt``);
      the driver checkpoint names it and adds the row count, wall time and settings;
      a resume loads it back before the resume's weight sync;
    - every step writes one JSON line to ``settings.metrics_path`` (`rows`).

    Args:
        settings: What to train and where to write.
        model: The model folder the run starts from.
        replica_kwargs: Extra keyword arguments of every replica.
        on_step: Called with each per-step metric row.
        record_events: Keep every loop event in `events`.

    Attributes:
        rows: The per-step metric rows of this run.
        lags: Weight-version lag of every consumed sample of this run.
        latest_weights: ``(version, weights)`` of the last sync.
        events: Every loop event (when ``record_events``).
    """

    #: Ids of the task's prompts (``t0, t1, ...``).
    id_prefix: str | None = "t"

    def __init__(
        self,
        settings: TrainSettings,
        model: Path,
        *,
        replica_kwargs: Mapping[str, Any] | None = None,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        record_events: bool = False,
    ) -> None:
        self.settings = settings
        self.model = model
        self.tokenizer = TaskTokenizer(model)
        self._replica_kwargs = dict(replica_kwargs or {})
        self._on_step_row = on_step
        self.record_events = record_events
        self.events: list[Any] = []
        self.rows: list[dict[str, Any]] = []
        self.lags: list[int] = []
        self.latest_weights: tuple[int, Any] | None = None
        self._last_batch: dict[str, Any] = {}
        self._t0 = 0.0
        self._wall_offset = 0.0
        self._rows_before = 0
        self._skip_save_version: int | None = None

    # ------------------------------------------------------------------ parts
    def run_context(self) -> RunContext:
        """What the engine and trainer plug-ins are told about the run."""
        s = self.settings
        return RunContext(
            model=str(self.model), temperature=s.temperature, seed=s.seed, device=s.device, lr=s.lr
        )

    def trainer_spec(self) -> RayTrainerSpec:
        """The trainer plug-in's trainers, fed `make_batch`."""
        s = self.settings
        plugin = TRAINERS.load(s.trainer)
        return RayTrainerSpec(
            factory=plugin.factory,
            args=(str(self.model),),
            kwargs=dict(plugin.options(self.run_context())),
            make_batch=self.make_batch,
            # on a CPU nothing is freed by sleep and the GPUs are bookkeeping
            allow_unreleased_sleep=s.device == "cpu",
        )

    def run_options(self, base: RayRunOptions, *, resume: bool) -> RayRunOptions:
        """``base`` with what a training run sets: steps, lengths, the engine's replica
        factory, the trainers, the output files, ``resume``."""
        s = self.settings
        return attrs.evolve(
            base,
            num_steps=s.steps,
            max_tokens=s.max_tokens,
            min_response_len=1,
            max_response_len=s.max_tokens,
            stream_tokens=s.stream_tokens,
            replica_factory=ENGINES.load(s.engine).factory,
            trainer=self.trainer_spec(),
            metrics_path=str(Path(s.out_dir) / "dynamic_resource.jsonl"),
            checkpoint_path=str(s.checkpoint_dir / "driver.json"),
            resume=resume,
        )

    def start_clock(self) -> float:
        """Start the run's wall clock (rows and checkpoints count from here)."""
        self._t0 = time.monotonic()
        return self._t0

    def make_batch(self, samples: Sequence[Any], version: int) -> TrainBatch:
        """The trainer's batch of ``samples`` with the task's reward; records the lags."""
        ordered = sorted(samples, key=lambda s: int(str(s.sample_id).lstrip("t") or 0))
        batch = TrainBatch.from_samples(ordered, self._reward, version=version)
        rewards = [r.reward for r in batch.responses]
        lags = [version - int(s.param_version) for s in ordered]
        token_lags = [version - min(r.versions) for r in batch.responses if r.versions]
        self.lags.extend(lags)
        lengths = [len(r.response_ids) for r in batch.responses]
        self._last_batch = {
            "reward": sum(rewards) / len(rewards) if rewards else 0.0,
            "exact_match": sum(1 for r in rewards if r >= 1.0) / max(1, len(rewards)),
            "response_len": sum(lengths) / max(1, len(lengths)),
            "lag_max": max(lags, default=0),
            "lag_mean": sum(lags) / len(lags) if lags else 0.0,
            "token_lag_max": max(token_lags, default=0),
            "sample_ids": [str(s.sample_id) for s in ordered],
        }
        return batch

    def _reward(self, sample: Any, outcome: Any) -> float:
        return self.settings.task.sample_reward(self.tokenizer, sample, outcome)

    def _weights_for(self, version: int) -> Any:
        latest = self.latest_weights
        if latest is not None and latest[0] == version:
            return latest[1]
        return None

    # ------------------------------------------------------------------ rollout hooks
    def prompts(self, runner: RayRunner) -> Any:
        s = self.settings
        count = 4 * (runner.step_offset + runner.num_steps) * runner.config.required_samples + 16
        return AdditionTask.prompts(
            attrs.evolve(s.task, seed=s.seed),
            self.tokenizer,
            count,
            max_tokens=s.max_tokens,
            skip=frozenset(runner.consumed_sample_ids),
        )

    def replica_kwargs(self, options: RayRunOptions) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        engine = ENGINES.load(self.settings.engine)
        # the engine's options for this run; the caller's replica_kwargs win
        common = {**engine.options(self.run_context()), **self._replica_kwargs}
        return dict(common), dict(common)

    # ------------------------------------------------------------------ trainer hooks
    def hybrid(
        self, runner: RayRunner, group: RayTrainerGroup, replica: Any, gpus: Sequence[Hashable]
    ) -> Any:
        wrapped = group.hybrid(replica, gpus)
        on: Sequence[Hashable] = wrapped.gpus
        return _TrainerLocalHandOver(
            wrapped.inner,
            group.handover,
            on,
            before_wake=lambda: group.release(on),
            weights_for=self._weights_for,
            local=lambda version: group.local_weights(on, version),
        )

    async def weights_synced(self, runner: RayRunner, version: int, weights: Any) -> None:
        self.latest_weights = (version, weights)
        await self.save_trainer(runner, version)

    async def save_trainer(self, runner: RayRunner, version: int) -> None:
        """Write the trainer's model and optimizer state for ``version``."""
        import torch

        group = runner.trainer_group
        if group is None:
            return
        if self._skip_save_version == version:  # just restored from this very file
            self._skip_save_version = None
            return
        folder = self.settings.checkpoint_dir
        state = await group.state_dict()
        path = folder / TRAINER_CKPT.format(version=version)
        try:  # tensors and plain containers only: loadable with weights_only=True
            with atomic_writer(path) as fh:
                torch.save(state, fh)
        except OSError as exc:  # the run stops; the last good checkpoint stays
            raise runner.output_failed("checkpoint write", exc) from None
        kept = sorted(folder.glob("trainer-v*.pt"), key=lambda p: int(p.stem[len("trainer-v") :]))
        for old in kept[: -max(1, self.settings.keep_checkpoints)]:
            old.unlink(missing_ok=True)

    # ------------------------------------------------------------------ checkpoint hooks
    def checkpoint_extras(self, runner: RayRunner, state: Mapping[str, Any]) -> dict[str, Any]:
        version = int(state["param_version"])
        return {
            "trainer_state": TRAINER_CKPT.format(version=version) if version else None,
            "metrics_rows": len(self.rows) + int(self._rows_before),
            "wall_s": self._wall_offset + (time.monotonic() - self._t0),
            "settings": {
                "engine": self.settings.engine,
                "trainer": self.settings.trainer,
                "seed": self.settings.seed,
                "lr": self.settings.lr,
                "model": str(self.model),
            },
        }

    def fingerprint_extras(self, runner: RayRunner) -> dict[str, Any]:
        return train_fingerprint_extras(self.settings)

    async def restore(self, runner: RayRunner, loop: Any, restored: Mapping[str, Any]) -> None:
        """The row count and wall time so far, then the trainer's model and optimizer
        state (the resume's weight sync then pushes the restored weights to every
        standalone replica; hybrid replicas get them at their first activation)."""
        self._rows_before = int(restored.get("metrics_rows", 0))
        self._wall_offset = float(restored.get("wall_s", 0.0))
        name = restored.get("trainer_state")
        version = int(restored["param_version"])
        loop.trainer.version = version
        if not name:
            return
        path = resolve_checkpoint_file(self.settings.checkpoint_dir, name)
        state = load_trainer_state(path)
        group = runner.trainer_group
        assert group is not None
        await group.load_state_dict(state)
        # the restore's sync re-exports these weights; it need not write them again
        self._skip_save_version = version
        runner.say(f"restored trainer state {name} (v{version})")

    # ------------------------------------------------------------------ output hooks
    def prepare_outputs(self, runner: RayRunner, steps_done: int | None) -> None:
        """A fresh run starts without an earlier run's metrics and trainer checkpoints; a
        resumed one drops the rows written after the checkpoint's step."""
        if steps_done is not None:
            self._truncate_metrics(steps_done)
            return
        self.settings.metrics_path.unlink(missing_ok=True)
        for old in self.settings.checkpoint_dir.glob("trainer-v*.pt"):
            old.unlink()
        if runner.options.metrics_path:
            Path(runner.options.metrics_path).unlink(missing_ok=True)

    def _truncate_metrics(self, steps_done: int) -> None:
        """Drop the rows a crashed run wrote after its last checkpoint's step (they are
        redone) and a truncated last line, so every step is in the file exactly once."""
        dropped = trim_metrics(self.settings.metrics_path, steps_done, numbered_only=True)
        if dropped:
            logger.info("resume: dropped %d metric row(s) after step %d", dropped, steps_done)

    def on_event(self, runner: RayRunner, event: Any) -> None:
        if self.record_events:
            self.events.append(event)
        if isinstance(event, TrainStepEvent):
            self._step_row(runner, event)

    def _step_row(self, runner: RayRunner, event: TrainStepEvent) -> None:
        """One metric row per step: appended to `rows` and (fsynced) to the file."""
        loop = runner.loop
        # the runner's trainer is a `RayTrainerGroupBackend`: `run_options` sets a trainer spec
        backend = cast("RayTrainerGroupBackend | None", loop.trainer if loop is not None else None)
        tm = backend.metrics[-1] if backend is not None and backend.metrics else None
        row: dict[str, Any] = {
            "step": event.step + runner.step_offset,
            "version": loop.driver.param_version if loop is not None else 0,
            "wall_s": round(self._wall_offset + time.monotonic() - self._t0, 4),
            "loop_time_s": round(float(event.time), 4),
            "step_time_s": round(float(event.timings.get("step", 0.0)), 4),
            "gen_wait_s": round(float(event.timings.get("gen", 0.0)), 4),
            "mq_size": event.mq_size,
            "hybrid_state": str(loop.controller.state.name) if loop is not None else None,
            "hybrid_did_rollout": bool(event.hybrid_did_rollout),
            "is_sync_step": bool(event.is_sync_step),
            **{k: v for k, v in self._last_batch.items()},
        }
        if tm is not None:
            row.update(
                loss=float(tm.loss),
                grad_norm=float(tm.grad_norm),
                train_compute_s=float(tm.compute_s),
                clip_fraction=float(tm.clip_fraction),
                ratio_mean=float(tm.ratio_mean),
                approx_kl=float(tm.approx_kl),
            )
        agg = runner.metrics_aggregator
        if event.is_sync_step and agg is not None and agg.records:
            row.update(
                {
                    k: v
                    for k, v in agg.records[-1].as_dict().items()
                    if k.startswith(("dynamic_resource/", "fully_async/"))
                }
            )
        self.rows.append(row)
        path = self.settings.metrics_path
        try:  # one whole line per row, fsynced
            path.parent.mkdir(parents=True, exist_ok=True)
            append_line(path, json.dumps(row))
        except OSError as exc:  # the bus would only log it: stop the run instead
            runner.output_failed("metrics write", exc)
        call_safely(self._on_step_row, row, "on_step")


def _str_keyed(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigError(
            f"{type(instance).__name__}.{attribute.name} must be a mapping of keyword "
            f"names (str) to values, got {value!r:.80}",
            key=attribute.name,
        )


@attrs.frozen(kw_only=True)
class TrainRunnerOptions:
    """The less common settings of a `TrainRunner`.

    Attributes:
        replica_kwargs: Extra keyword arguments of every replica (e.g. vLLM settings);
            they win over the engine plug-in's options for the run.
        keep_samples: Keep every consumed sample (see `RayRunner`).
        record_events: Keep every loop event in `TrainRunner.events` (e.g. for the
            resource-time layout plot).
        planner: A role planner (`dynsched_core.planner.RolePlanner`) moving GPUs between
            the trainer and the standalone replicas through a `RayRoleMover`; the trainer
            then starts one replica's GPUs below its pool (`with_room_to_grow`). None: no
            planner.
    """

    replica_kwargs: Mapping[str, Any] = attrs.field(factory=dict, validator=_str_keyed)
    keep_samples: bool = attrs.field(default=False, validator=v.bool_())
    record_events: bool = attrs.field(default=False, validator=v.bool_())
    planner: Any = None


def _delegate(part: str, name: str, *, settable: bool = False) -> Any:
    """A property reading (and, ``settable``, writing) ``self.<part>.<name>``."""

    def get(self: Any) -> Any:
        return getattr(getattr(self, part), name)

    def put(self: Any, value: Any) -> None:
        setattr(getattr(self, part), name, value)

    return property(get, put if settable else None, doc=f"``{part}.{name}``")


def _without_step_lines(progress: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """``progress`` minus the per-step lines (the per-step rows, ``on_step``, replace
    them; they are still logged)."""
    if progress is None:
        return None

    def show(line: str) -> None:
        if not line.startswith("step "):
            progress(line)

    return show


class TrainRunner:
    """Real RL on Ray: the one `RayRunner` configured with a `TrainWorkload` (real
    engines, real trainers and the task).

    Args:
        config: Scheduler settings (verl keys).
        settings: What to train and where to write.
        options: Ray-side settings (name, namespace, timeouts); the fields a training run
            sets (`TrainWorkload.run_options`: trainer, replica factory, metrics,
            checkpoint, resume, steps, max tokens, stream) are overwritten.
        resume: Continue from ``settings.checkpoint_dir``.
        policy: The policy (default: ``config.build_policy()``).
        model: The model folder (default: ``warm_up(settings.model_cache, ...)``).
        progress: Called with each progress line (fleet, switches, failures).
        on_step: Called with each per-step metric row.
        on_transition: See `RayRunner`.
        runner_options: The less common settings (`TrainRunnerOptions`).

    Attributes:
        runner: The `RayRunner` (its ``loop``, ``fleet``, ``replicas``,
            ``trainer_group``, ``supervisor`` are also readable here).
        workload: The `TrainWorkload` (its ``rows``, ``lags``, ``events``,
            ``record_events`` are also readable here).
    """

    def __init__(
        self,
        config: DynamicScheduleConfig,
        settings: TrainSettings,
        options: RayRunOptions | None = None,
        *,
        resume: bool = False,
        policy: Any = None,
        model: str | Path | None = None,
        progress: Callable[[str], None] | None = None,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        on_transition: Callable[[Any], None] | None = None,
        runner_options: TrainRunnerOptions | None = None,
    ) -> None:
        from dynsched_ray.task.addition import warm_up

        extra = v.options_or_default(runner_options, TrainRunnerOptions)
        self.config = config
        self.settings = settings
        self.model = (
            Path(model)
            if model is not None
            else warm_up(settings.model_cache, settings.task, settings.warm_up)
        )
        self.workload = TrainWorkload(
            settings,
            self.model,
            replica_kwargs=extra.replica_kwargs,
            on_step=on_step,
            record_events=extra.record_events,
        )
        _check_train_start(config, settings, resume=resume)
        run_options = self.workload.run_options(options or RayRunOptions(), resume=resume)
        installed = None
        if extra.planner is not None:
            from dynsched_ray.runtime.mover import install_planner, with_room_to_grow

            run_options = with_room_to_grow(run_options, config)
            installed = install_planner(extra.planner, lambda: self.runner)
        self.runner = RayRunner(
            config,
            run_options,
            policy=policy,
            progress=_without_step_lines(progress),
            on_transition=on_transition,
            keep_samples=extra.keep_samples,
            workload=self.workload,
            on_loop_built=installed,
        )

    options = _delegate("runner", "options")
    policy = _delegate("runner", "policy")
    loop = _delegate("runner", "loop")
    fleet = _delegate("runner", "fleet")
    replicas = _delegate("runner", "replicas")
    trainer_group = _delegate("runner", "trainer_group")
    supervisor = _delegate("runner", "supervisor")
    tokenizer = _delegate("workload", "tokenizer")
    rows = _delegate("workload", "rows")
    lags = _delegate("workload", "lags")
    events = _delegate("workload", "events")
    record_events = _delegate("workload", "record_events", settable=True)

    async def train(self) -> TrainSummary:
        """Run (or resume) the training; return the summary.

        Raises:
            AllReplicasLostError: every replica died.
            SampleWaitTimeoutError: the trainer waited longer than ``wait_timeout_s``.
        """
        t0 = self.workload.start_clock()
        result = await self.runner.run()
        return TrainSummary(
            result=result,
            rows=tuple(self.workload.rows),
            wall_s=time.monotonic() - t0,
            lags=tuple(self.workload.lags),
            model=str(self.model),
        )


def _check_train_start(
    config: DynamicScheduleConfig, settings: TrainSettings, *, resume: bool
) -> None:
    """Every checkpoint holds trained weights (steps a multiple of the sync interval);
    a resume has a checkpoint."""
    t = config.trigger_parameter_sync_step
    if settings.steps % t:
        raise ConfigError(
            f"steps must be a multiple of trigger_parameter_sync_step ({t}) so that every "
            f"checkpoint holds the trained weights, got {settings.steps}",
            key="steps",
        )
    ckpt = settings.checkpoint_dir / "driver.json"
    if resume and not ckpt.is_file():
        raise ConfigError(
            f"resume: no checkpoint at {ckpt} (train without --resume first)", key="resume"
        )


class RolloutWorkload(StandInWorkload):
    """``dynsched run --engine NAME``: a rollout engine plug-in on the addition task's
    prompts, with the stand-in trainer.

    The replicas (standalone and hybrid) are the engine plug-in's, built on ``model``;
    the prompts are the task's (``t0, t1, ...``). Nothing is trained: the stand-in trainer
    takes each step's samples, and a weight sync only advances the version the replicas
    record (``update_weights(version, None)`` keeps their weights). It shows how an engine
    behaves under the scheduler (switches, aborts and resumes, routing) without a trainer.

    Args:
        engine: An installed plug-in of ``dynsched.engines`` (checked here, nothing imported).
        model: The model folder the replicas load (Hugging Face layout, the task's tokenizer).
        task: The prompts' task (default `AdditionTask()`).
        seed: Seed of the prompts and of the sampling.
        temperature: Sampling temperature.
        device: ``cpu``, ``cuda`` or ``auto`` (engines that take a device).
        max_tokens: Response budget in tokens (default 6, `TrainSettings`'s: the task's
            answers are a few digits).

    Raises:
        ConfigError: ``engine`` is not installed (the closest name is suggested).
    """

    id_prefix: str | None = "t"

    def __init__(
        self,
        engine: str,
        model: str | os.PathLike[str],
        *,
        task: AdditionTask | None = None,
        seed: int = 0,
        temperature: float = 1.0,
        device: str = "cpu",
        max_tokens: int = 6,
    ) -> None:
        ENGINES.check(engine, key="engine", where="RolloutWorkload.engine")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            max_tokens = -1  # refused below, with the others
        if not 1 <= max_tokens <= MAX_TOKENS:
            raise ConfigError(
                f"RolloutWorkload.max_tokens must be an int in [1, {MAX_TOKENS}]", key="max_tokens"
            )
        self.max_tokens = max_tokens
        self.engine = engine
        self.model = Path(model)
        self.task = task or AdditionTask()
        self.context = RunContext(
            model=str(self.model), temperature=temperature, seed=seed, device=device
        )
        self.tokenizer = TaskTokenizer(self.model)

    def run_options(self, base: RayRunOptions) -> RayRunOptions:
        """``base`` with the engine's replica factory and the response budget (no
        stand-in response lengths: the engine decides, within ``max_tokens``)."""
        return attrs.evolve(
            base,
            replica_factory=ENGINES.load(self.engine).factory,
            max_tokens=self.max_tokens,
            min_response_len=1,
            max_response_len=self.max_tokens,
        )

    def prompts(self, runner: RayRunner) -> Any:
        count = 4 * (runner.step_offset + runner.num_steps) * runner.config.required_samples + 16
        return AdditionTask.prompts(
            attrs.evolve(self.task, seed=self.context.seed),
            self.tokenizer,
            count,
            max_tokens=runner.options.max_tokens,
            skip=frozenset(runner.consumed_sample_ids),
        )

    def replica_kwargs(self, options: RayRunOptions) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        common = dict(ENGINES.load(self.engine).options(self.context))
        return common, dict(common)

    def fingerprint_extras(self, runner: RayRunner) -> dict[str, Any]:
        return {"engine": self.engine, "model": str(self.model), "seed": self.context.seed}


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` written by `TrainRunner` (resumed runs appended)."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out
