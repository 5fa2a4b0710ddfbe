"""The reference fully-async loop: rollouter, queue, router, client, controller, driver.

`FullyAsyncLoop` runs training steps over parts it is given (a `ScheduleDriver`, whose
controller switches the hybrid members of a `ReplicaSet`, and a `Rollouter` feeding the
driver's queue) and a pluggable `TrainerBackend`; nothing is swapped after construction.
`FullyAsyncLoop.build` assembles the standard parts from a config and replicas. The same
code serves three hosts:

- tests: in-memory replicas and a trainer that sleeps on the loop clock;
- the simulator: simulated replicas and trainer on a virtual-time event loop;
- the Ray runtime: actor-backed replicas, router and queue, with a trainer that drives
  real workers.

One micro-step: ``before_train_step`` (maybe wait and deactivate hybrid) -> collect
``required_samples`` from the queue (bounded wait; end-of-stream ends training) ->
``train_step`` -> every ``T`` micro-steps: ``sync_weights`` (standalone) ->
``after_weight_sync`` (maybe activate hybrid with its weight sync, rebalance) ->
``reset_staleness``. A `TrainStepEvent` is emitted per micro-step.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import attrs

from dynsched_core._client import ClientOptions, RetryingClient
from dynsched_core._clock import Clock, LoopClock
from dynsched_core._config import DynamicScheduleConfig
from dynsched_core._controller import ControllerOptions, DynamicResourceController
from dynsched_core._driver import AfterSyncResult, BeforeStepResult, DriverOptions, ScheduleDriver
from dynsched_core._errors import SwitchError
from dynsched_core._events import (
    EventBus,
    GroupMode,
    ReplicaModeEvent,
    RoleMoveEvent,
    SampleEvent,
    TrainStepEvent,
    sample_key,
)
from dynsched_core._policy import DynamicSchedulePolicyBase
from dynsched_core._protocols import QueueStats, RolloutReplica, Router, SampleQueue
from dynsched_core._queue import AsyncSampleQueue
from dynsched_core._replicas import ReplicaSet
from dynsched_core._rollouter import GenerateClient, Rollouter, RollouterOptions, RollouterStats

if TYPE_CHECKING:
    from dynsched_core.planner import RoleMover, RolePlanner

__all__ = ["FullyAsyncLoop", "LoopResult", "StepRecord", "TrainerBackend", "run_fully_async"]

logger = logging.getLogger(__name__)


@runtime_checkable
class TrainerBackend(Protocol):
    """The trainer side of the loop, plugged by the host.

    ``train_step`` trains on one micro-batch of samples and returns seconds per phase
    (verl's ``timing_raw`` keys: ``reward``, ``old_log_prob``, ``ref``, ``adv``,
    ``update_actor``, ...). ``sync_weights`` pushes the weights of ``version`` to the
    standalone replicas and returns whatever the hybrid replicas' ``update_weights``
    needs (or None).
    """

    async def train_step(self, samples: Sequence[Any]) -> Mapping[str, float]:
        """Train on ``samples``; return phase timings in seconds."""
        ...

    async def sync_weights(self, version: int) -> Any:
        """Push weights of ``version`` to the standalone replicas."""
        ...


@attrs.frozen(kw_only=True)
class StepRecord:
    """One trainer micro-step of the reference loop.

    Attributes:
        step: Micro-step index (1-based).
        version: Weight version after the step.
        is_sync_step: The step ended with a weight sync.
        sample_ids: Ids of the samples trained on (``sample_id`` attribute when present).
        collect_wait_s: Seconds waiting for the batch.
        waited_samples: Samples of the batch that were not buffered at the start.
        before: What the driver did before the step.
        after: What the driver did after the weight sync (None off sync steps).
        timings: The emitted timings.
        allocated_s: Seconds from collection through weight sync.
        mq_size: Queue size after the step.
        time: Loop time at the end of the step.
    """

    step: int
    version: int
    is_sync_step: bool
    sample_ids: tuple[Any, ...]
    collect_wait_s: float
    waited_samples: int
    before: BeforeStepResult
    after: AfterSyncResult | None
    timings: Mapping[str, float]
    allocated_s: float
    mq_size: int
    time: float


@attrs.frozen(kw_only=True)
class LoopResult:
    """Outcome of `FullyAsyncLoop.run`.

    Attributes:
        steps: Micro-steps trained.
        ended_by: ``"steps"`` (the requested number was reached) or ``"end_of_stream"``
            (the prompt source ran out).
        final_version: Weight version at the end.
        samples_produced: Samples the rollouter put into the queue.
        samples_consumed: Samples the trainer took from the queue.
        samples_left: Samples still in the queue.
        samples_failed: Samples dropped because a response failed for good.
        samples_cancelled: Samples in flight when the loop stopped.
        activations: Hybrid activations.
        deactivations: Hybrid deactivations.
        skipped_hybrid_syncs: Weight syncs that skipped the hybrid replicas.
        switch_errors: Failed switches (each left a safe state).
        failovers: Times the driver woke sleeping hybrid replicas because the routable
            set ran short while the trainer waited (`ScheduleDriver.failover`).
        moved_requests: Requests moved by rebalances.
        records: Per-step records.
        start: Loop time at the start.
        end: Loop time at the end.
        rollouter: Final rollouter counters.
        queue: Final queue counters.
    """

    steps: int
    ended_by: Literal["steps", "end_of_stream"]
    final_version: int
    samples_produced: int
    samples_consumed: int
    samples_left: int
    samples_failed: int
    samples_cancelled: int
    activations: int
    deactivations: int
    skipped_hybrid_syncs: int
    switch_errors: int
    moved_requests: int
    records: tuple[StepRecord, ...]
    start: float
    end: float
    rollouter: RollouterStats
    queue: QueueStats
    failovers: int = 0

    @property
    def duration_s(self) -> float:
        """``end - start`` on the loop clock."""
        return self.end - self.start

    @property
    def consumed_sample_ids(self) -> list[Any]:
        """Ids of every consumed sample, in consumption order."""
        return [sid for r in self.records for sid in r.sample_ids]


class FullyAsyncLoop:
    """Reference fully-async trainer loop, assembled from the parts it is given.

    Args:
        config: Scheduler settings.
        trainer: The `TrainerBackend`.
        driver: Runs the policy; its controller switches the hybrid members of the
            `ReplicaSet` and its queue is what the trainer consumes.
        rollouter: Produces samples into the driver's queue from the same replicas.
        controller: The driver's controller, given again to make the assembly explicit
            (optional; refused if it is not ``driver.controller``).
        events: Bus for the `TrainStepEvent` and `ReplicaModeEvent` of the loop
            (default: the driver's bus, else a new one).
        clock: Time source (default: the running loop).
        planner: Optional `dynsched_core.planner.RolePlanner`: every ``every_n_syncs``
            weight syncs (right after the standalone sync, before the driver's
            after-sync step) it may move GPUs between the roles through ``mover``; each
            applied move emits a `RoleMoveEvent`. Without one the loop is unchanged.
        mover: The host's `RoleMover` (required with a planner, refused without one).

    Raises:
        ValueError: the rollouter does not feed the driver's queue or does not draw on
            the controller's replicas; a planner without a mover or the reverse.

    The loop's waits for samples are bounded by the driver's
    `DriverOptions.wait_timeout_s`; a collection that times out raises
    `SampleWaitTimeoutError` (the pipeline is stuck).

    Example:
        >>> import asyncio
        >>> from dynsched_core import DynamicScheduleConfig, DynamicSchedulePolicyBase
        >>> from dynsched_core import InMemoryReplica
        >>> class Never(DynamicSchedulePolicyBase):
        ...     def should_deactivate(self, global_steps, is_hybrid_active, ctx): return False
        ...     def deactivate_wait_samples(self, ctx): return 0
        ...     def should_activate_after_step(self, global_steps, is_hybrid_active, ctx): return False
        >>> class Trainer:
        ...     async def train_step(self, samples): return {"update_actor": 0.0}
        ...     async def sync_weights(self, version): return None
        >>> cfg = DynamicScheduleConfig(ppo_mini_batch_size=2, trigger_parameter_sync_step=1)
        >>> loop = FullyAsyncLoop.build(cfg, Never(), Trainer(), prompts=range(10),
        ...                             standalone=[InMemoryReplica("s0", tokens_per_s=1e5)],
        ...                             max_tokens=8)
        >>> result = asyncio.run(loop.run(num_steps=3))
        >>> result.steps, result.samples_consumed
        (3, 6)
    """

    def __init__(
        self,
        config: DynamicScheduleConfig,
        trainer: TrainerBackend,
        *,
        driver: ScheduleDriver,
        rollouter: Rollouter,
        controller: DynamicResourceController | None = None,
        events: EventBus | None = None,
        clock: Clock | None = None,
        planner: RolePlanner | None = None,
        mover: RoleMover | None = None,
    ) -> None:
        if (planner is None) != (mover is None):
            raise ValueError("FullyAsyncLoop: planner and mover go together (give both or neither)")
        if controller is not None and controller is not driver.controller:
            raise ValueError("the controller must be the one the driver switches with")
        if rollouter.queue is not driver.queue:
            raise ValueError("the rollouter must feed the driver's queue (rollouter.queue)")
        if rollouter.replicas is not driver.replicas:
            raise ValueError("the rollouter and the driver's controller must share one ReplicaSet")
        self.config = config
        self.trainer = trainer
        self.driver = driver
        self.rollouter = rollouter
        self.events = events if events is not None else driver.events or EventBus()
        self.clock: Clock = clock if clock is not None else LoopClock()
        self._mode: GroupMode | None = None
        self.planner = planner
        self.mover = mover
        self._planner_syncs = 0
        if planner is not None and mover is not None:
            planner.attach(self.events, mover.split, getattr(mover, "estimate_s", None))

    @classmethod
    def build(
        cls,
        config: DynamicScheduleConfig,
        policy: DynamicSchedulePolicyBase,
        trainer: TrainerBackend,
        *,
        prompts: Iterable[Any] | AsyncIterable[Any],
        standalone: Sequence[RolloutReplica] | Mapping[str, RolloutReplica] = (),
        hybrid: Sequence[RolloutReplica] | Mapping[str, RolloutReplica] = (),
        router: Router | None = None,
        replicas: ReplicaSet | None = None,
        queue: SampleQueue | None = None,
        client: GenerateClient | None = None,
        events: EventBus | None = None,
        clock: Clock | None = None,
        wait_timeout_s: float = 3600.0,
        max_tokens: int | None = None,
        client_options: ClientOptions | None = None,
        controller_options: ControllerOptions | None = None,
        driver_options: DriverOptions | None = None,
        planner: RolePlanner | None = None,
        mover: RoleMover | None = None,
    ) -> FullyAsyncLoop:
        """Assemble the standard parts over the given replicas and build the loop.

        Args:
            config: Scheduler settings.
            policy: Scheduling policy (e.g. ``config.build_policy()``).
            trainer: The `TrainerBackend`.
            prompts: Prompt source for the `Rollouter` (sync or async iterable).
            standalone: Standalone replicas (routable from the start).
            hybrid: Hybrid replicas (asleep and out of routing until activated).
            router: Router that follows the replicas (default: a new `LoadBalancer`).
            replicas: A `ReplicaSet` built by the caller, instead of ``standalone``,
                ``hybrid`` and ``router``.
            queue: Sample queue (default: `AsyncSampleQueue` of ``config.max_queue_size``).
            client: Generation client (default: a `RetryingClient` over the replicas).
            events: Event bus shared by every part (default: a new one).
            clock: Time source (default: the running loop).
            wait_timeout_s: Bound of every wait for samples (> 0).
            max_tokens: Response budget for raw prompt payloads (default:
                ``config.max_response_length``).
            client_options: `RetryingClient` settings (default: from the config, with a
                colocated wait for a routable replica: `_default_client`).
            controller_options: `DynamicResourceController` settings.
            driver_options: `ScheduleDriver` settings (default:
                ``DriverOptions(wait_timeout_s=wait_timeout_s)``; when given, its own
                ``wait_timeout_s`` is used).
            planner, mover: An optional role planner and its `RoleMover` (see the class).

        Raises:
            ValueError: ``replicas`` together with ``standalone``/``hybrid``/``router``,
                or a replica id given twice.
        """
        events = events if events is not None else EventBus()
        clock = clock if clock is not None else LoopClock()
        replicas = _replica_set(replicas, router, standalone, hybrid, clock, events)
        queue = queue if queue is not None else AsyncSampleQueue(capacity=config.max_queue_size)
        if client is None:
            client = _default_client(config, replicas, client_options, wait_timeout_s, clock)
        controller = DynamicResourceController(
            replicas, controller_options, clock=clock, events=events
        )
        tokens = config.max_response_length if max_tokens is None else max_tokens
        ropts = RollouterOptions.from_config(config, max_tokens=tokens)
        rollouter = Rollouter(prompts, client, replicas, queue, ropts, clock=clock, events=events)
        opts = driver_options or DriverOptions(wait_timeout_s=wait_timeout_s)
        driver = ScheduleDriver(policy, controller, queue, config, opts, clock=clock, events=events)
        return cls(
            config,
            trainer,
            driver=driver,
            controller=controller,
            rollouter=rollouter,
            events=events,
            clock=clock,
            planner=planner,
            mover=mover,
        )

    # ------------------------------------------------------------------ parts
    @property
    def controller(self) -> DynamicResourceController:
        """The driver's controller."""
        return self.driver.controller

    @property
    def replicas(self) -> ReplicaSet:
        """The replicas of the run (the one owner of membership)."""
        return self.driver.replicas

    @property
    def router(self) -> Router:
        """The router that follows the replicas."""
        return self.replicas.router

    @property
    def queue(self) -> SampleQueue:
        """The sample queue between the rollouter and the trainer."""
        return self.driver.queue

    @property
    def client(self) -> GenerateClient:
        """The rollouter's generation client."""
        return self.rollouter.client

    @property
    def wait_timeout_s(self) -> float:
        """Bound of every wait for samples (the driver's)."""
        return self.driver.wait_timeout_s

    # ------------------------------------------------------------------ run
    async def run(self, num_steps: int | None = None) -> LoopResult:
        """Train ``num_steps`` micro-steps (default: ``config.total_training_steps``, or
        until end-of-stream), then stop the rollouter and put hybrid replicas to sleep.

        Raises:
            SampleWaitTimeoutError: a collection waited longer than ``wait_timeout_s``.
            Exception: whatever the trainer or the rollouter raised.
        """
        if num_steps is None:
            num_steps = self.config.total_training_steps
        if num_steps is not None and num_steps < 0:
            raise ValueError(f"num_steps must be >= 0 or None, got {num_steps}")
        start = self.clock.now()
        records: list[StepRecord] = []
        ended_by: Literal["steps", "end_of_stream"] = "steps"
        await self._setup()
        task = self.rollouter.start()
        try:
            await self.driver.initial_activation(version=self.driver.param_version)
            while num_steps is None or len(records) < num_steps:
                record = await self._micro_step(len(records) + 1, num_steps)
                if record is None:
                    ended_by = "end_of_stream"
                    break
                records.append(record)
        finally:
            await self._shutdown()
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise RuntimeError("the rollouter failed") from task.exception()
        return await self._result(records, ended_by, start)

    async def _setup(self) -> None:
        await self.replicas.route(self.replicas.standalone_ids)
        await self.controller.reconcile()
        self._set_mode("idle")

    async def _shutdown(self) -> None:
        await self.rollouter.stop()
        try:
            await self.controller.deactivate()
        except SwitchError:
            logger.exception("final deactivation failed (hybrid replicas are out of routing)")
        self._set_mode("idle")

    # ------------------------------------------------------------------ one step
    async def _micro_step(self, step: int, num_steps: int | None) -> StepRecord | None:
        cfg = self.config
        is_last = num_steps is not None and step == num_steps
        is_sync = step % cfg.trigger_parameter_sync_step == 0
        t_step = self.clock.now()
        before = await self.driver.before_train_step(
            self.driver.param_version, is_last_step=is_last
        )
        t_alloc = self.clock.now()
        batch = await self._collect()
        if batch is None:
            return None
        samples, wait_s, waited = batch
        if self.planner is not None:
            self.planner.observe_batch(samples)
        self.events.emit(
            SampleEvent(
                self.clock.now(), "consumed", tuple(sample_key(s) for s in samples), step=step
            )
        )
        self.driver.record_collection(wait_s, waited)
        self._set_mode("train")
        timings = dict(await self.trainer.train_step(samples))
        after, sync_s = None, 0.0
        if is_sync:
            after, sync_s = await self._weight_sync(is_last)
        self._set_mode("rollout" if self.controller.is_hybrid_active else "idle")
        end = self.clock.now()
        timings.update(
            wait_for_enough_samples=before.wait_s,
            gen=wait_s,
            param_sync=sync_s,
            step=end - t_step,
        )
        mq_size = await self.queue.size()
        self.events.emit(
            TrainStepEvent(
                step=step,
                time=end,
                timings=timings,
                allocated_s=end - t_alloc,
                mq_size=mq_size,
                is_sync_step=is_sync,
                hybrid_did_rollout=before.deactivated,
            )
        )
        return StepRecord(
            step=step,
            version=self.driver.param_version,
            is_sync_step=is_sync,
            sample_ids=tuple(getattr(s, "sample_id", None) for s in samples),
            collect_wait_s=wait_s,
            waited_samples=waited,
            before=before,
            after=after,
            timings=timings,
            allocated_s=end - t_alloc,
            mq_size=mq_size,
            time=end,
        )

    async def _collect(self) -> tuple[list[Any], float, int] | None:
        """Take ``required_samples`` from the queue; None at end-of-stream."""
        need = self.config.required_samples
        self._set_mode("rollout" if self.controller.is_hybrid_active else "idle")
        buffered_at_start = await self.queue.size()
        start = self.clock.now()
        # a failover may wake sleeping hybrid replicas during the wait (routable set
        # empty); they go back to sleep before the trainer trains
        async with self.driver.trainer_waiting(need):
            buffered = await self.queue.wait_for(need, timeout=self.wait_timeout_s)
            if buffered < need:
                logger.info(
                    "end-of-stream: %d sample(s) left, %d needed; training ends", buffered, need
                )
                return None
            samples = await self.queue.get(need, timeout=self.wait_timeout_s)
        return samples, self.clock.now() - start, max(0, need - buffered_at_start)

    async def _weight_sync(self, is_last: bool) -> tuple[AfterSyncResult, float]:
        version = self.driver.param_version + 1
        self._set_mode("weight_sync")
        start = self.clock.now()
        weights = await self.trainer.sync_weights(version)
        sync_s = self.clock.now() - start
        if self.planner is not None:
            await self._replan()
        after = await self.driver.after_weight_sync(
            version, version, weights=weights, is_last_step=is_last
        )
        await self.rollouter.reset_staleness(version)
        return after, sync_s

    async def _replan(self) -> None:
        """Every ``every_n_syncs``-th sync: ask the planner, apply its move, emit it."""
        planner, mover = self.planner, self.mover
        assert planner is not None and mover is not None
        self._planner_syncs += 1
        if self._planner_syncs % planner.options.every_n_syncs:
            return
        move = planner.decide(mover.split(), now=self.clock.now())
        if move is None:
            return
        logger.info("role move %s x%d: %s", move.direction, move.replicas, move.reason)
        seconds = await mover.move(move)
        planner.record_move(move, seconds, now=self.clock.now())
        self.events.emit(
            RoleMoveEvent(
                self.clock.now(), move.direction, move.replicas, move.before, move.after, seconds
            )
        )

    async def _emit_left(self) -> None:
        """Emit the ids the queue still holds (`SampleEvent` ``left``), when it can list
        them (an optional ``held_sample_ids`` coroutine method); never raises."""
        held = getattr(self.queue, "held_sample_ids", None)
        if held is None:
            return
        try:
            ids = tuple(str(x) for x in await held())
        except Exception as exc:
            logger.warning("could not list the samples left in the queue: %r", exc)
            return
        self.events.emit(SampleEvent(self.clock.now(), "left", ids))

    def _set_mode(self, mode: GroupMode) -> None:
        if mode != self._mode:
            self._mode = mode
            gpus = max(1, self.config.hybrid_gpus)
            self.events.emit(ReplicaModeEvent(self.clock.now(), "trainer", mode, gpus))

    async def _result(
        self, records: list[StepRecord], ended_by: Literal["steps", "end_of_stream"], start: float
    ) -> LoopResult:
        qstats = await self.queue.stats()
        await self._emit_left()
        rstats = self.rollouter.stats()
        moved = sum(
            r.after.rebalance.moved for r in records if r.after is not None and r.after.rebalance
        )
        return LoopResult(
            steps=len(records),
            ended_by=ended_by,
            final_version=self.driver.param_version,
            samples_produced=qstats.produced,
            samples_consumed=qstats.consumed,
            samples_left=qstats.size,
            samples_failed=rstats.failed,
            samples_cancelled=rstats.cancelled,
            activations=self.driver.activations,
            deactivations=self.driver.deactivations,
            skipped_hybrid_syncs=self.driver.skipped_hybrid_syncs,
            switch_errors=self.driver.switch_errors,
            moved_requests=moved,
            records=tuple(records),
            start=start,
            end=self.clock.now(),
            rollouter=rstats,
            queue=qstats,
            failovers=self.driver.failovers,
        )


async def run_fully_async(
    config: DynamicScheduleConfig,
    policy: DynamicSchedulePolicyBase,
    trainer: TrainerBackend,
    *,
    num_steps: int | None = None,
    **kwargs: Any,
) -> LoopResult:
    """Build a `FullyAsyncLoop` (``kwargs`` as `FullyAsyncLoop.build`) and run it."""
    loop = FullyAsyncLoop.build(config, policy, trainer, **kwargs)
    return await loop.run(num_steps)


def _replica_set(
    replicas: ReplicaSet | None,
    router: Router | None,
    standalone: Sequence[RolloutReplica] | Mapping[str, RolloutReplica],
    hybrid: Sequence[RolloutReplica] | Mapping[str, RolloutReplica],
    clock: Clock,
    events: EventBus,
) -> ReplicaSet:
    """The caller's `ReplicaSet`, or one over ``standalone`` and ``hybrid`` (not both)."""
    if replicas is None:
        return ReplicaSet(router, standalone=standalone, hybrid=hybrid, clock=clock, events=events)
    if standalone or hybrid or router is not None:
        raise ValueError("pass either replicas= or standalone=/hybrid=/router=, not both")
    return replicas


def _default_client(
    config: DynamicScheduleConfig,
    replicas: ReplicaSet,
    options: ClientOptions | None,
    wait_timeout_s: float,
    clock: Clock,
) -> RetryingClient:
    """A `RetryingClient` over ``replicas``; without standalone replicas an aborted request
    waits up to ``wait_timeout_s`` for a routable replica (a whole training phase)."""
    if options is None:
        colocated = {} if replicas.num_standalone else {"no_replica_timeout_s": wait_timeout_s}
        options = ClientOptions.from_config(config, **colocated)
    return RetryingClient(replicas, options, clock=clock)
