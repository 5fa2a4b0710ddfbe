"""`ScheduleDriver`: runs the policy call order around a host's training step.

The embedding API for any RL stack is two awaits per micro-step plus one observation:

1. ``await driver.before_train_step(global_steps)`` — before collecting samples:
   ``should_deactivate`` -> ``deactivate_wait_samples`` -> wait (bounded by a timeout
   and by end-of-stream) -> deactivate hybrid replicas;
2. ``driver.record_collection(wait_s, waited_samples)`` — after the host collected a
   batch (seconds waited, samples that had to be waited for);
3. ``await driver.after_weight_sync(global_steps, version)`` — after the weight sync to
   standalone replicas (once per ``T`` micro-steps): ``should_activate_after_step`` ->
   activate with the hybrid weight sync, or skip that sync -> ``request_rebalance`` (after
   an activation, when rebalance is enabled) -> ``update_after_step``, with one context
   for both decisions of the cycle.

Optional hooks (defaults reproduce the published behaviour): at every step boundary while
no hybrid replica is lent, ``should_activate_mid_cycle`` may lend them now (they load the
current weights from their own trainer GPUs); ``hybrid_replicas_to_activate`` picks how
many are lent (k of m) at any activation; ``observe`` receives the bus's events.

After each decision the driver applies the `GuardRails` configured from the config, the
same for every policy (deactivate ratio range, colocated schedule, queue capacity, end
of run), and reports each correction: in the step's result (``overrides``), as a
`GuardRailEvent` on its bus and in the log. Colocated mode (no live standalone replica)
is derived once, from the `ReplicaSet` of the controller, and handed to the policy as
``ctx.only_hybrid``.

Failover: while the trainer waits for samples (the wait before a deactivation, and the
host's collection wrapped in `ScheduleDriver.trainer_waiting`), the driver watches the
`ReplicaSet`. When fewer than ``DriverOptions.min_routable_replicas`` replicas are
routable (e.g. every standalone replica died), the hybrid replicas sleep and the queue
does not already hold what the wait needs, it wakes them with the current weights
(the version and weights of the last sync) without waiting for the next weight sync,
and reports a `FailoverEvent`. Hybrid replicas woken during a collection are put back
to sleep when it ends (the trainer needs their GPUs); with no live standalone replica
the guard rails' colocated schedule then runs the cycles until standalone replicas
come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from dynsched_core import validators as v
from dynsched_core._clock import Clock, LoopClock
from dynsched_core._config import DynamicScheduleConfig
from dynsched_core._context import DynamicScheduleContext
from dynsched_core._controller import DynamicResourceController, RebalanceReport
from dynsched_core._errors import SampleWaitTimeoutError, SwitchError
from dynsched_core._events import EventBus, FailoverEvent, GuardRailEvent
from dynsched_core._guards import GuardRailOverride, GuardRails, is_colocated
from dynsched_core._policy import DynamicSchedulePolicyBase
from dynsched_core._protocols import SampleQueue
from dynsched_core._replicas import MembershipEvent, ReplicaSet
from dynsched_core._state import HybridState

__all__ = ["AfterSyncResult", "BeforeStepResult", "DriverOptions", "ScheduleDriver"]

logger = logging.getLogger(__name__)

_STATE_FORMAT = 1
#: State keys added after format 1 (absent from older checkpoints).
_OPTIONAL_STATE = frozenset({"failovers"})
#: The checkpointed counters, restored as attributes of the same names.
_COUNTERS = (
    "requested_samples",
    "param_version",
    "cycles",
    "activations",
    "deactivations",
    "skipped_hybrid_syncs",
    "switch_errors",
)
_INT_STATE = (*_COUNTERS, "cycle_requested", "failovers")
_STATE_KEYS = (
    "format",
    "policy",
    *_INT_STATE,
    "wait_times",
    "wait_samples",
    "cycle_activate_s",
    "cycle_deactivate_s",
)

#: Failover events kept by a driver (the oldest are dropped: a long run stays bounded).
_MAX_FAILOVER_EVENTS = 256

#: Guard-rail rules whose corrections mean the policy proposed something out of range.
_POLICY_ERRORS = frozenset({"ratio_range", "queue_capacity"})


@attrs.frozen(kw_only=True)
class BeforeStepResult:
    """What `ScheduleDriver.before_train_step` did.

    Attributes:
        global_steps: The step passed in.
        should_deactivate: The policy's decision.
        wait_target: Samples waited for before deactivating (None when not deciding to).
        buffered: Samples buffered when the wait ended (None without a wait).
        wait_s: Seconds spent waiting (verl's ``wait_for_enough_samples``).
        wait_timed_out: The wait hit ``wait_timeout_s`` (deactivation went ahead anyway).
        deactivated: Hybrid replicas were switched off.
        deactivate_s: Seconds the deactivation took.
        error: The switch error, when deactivation failed (hybrid is then out anyway).
        context: The context given to the policy (None when scheduling is disabled).
        proposed_wait: What ``deactivate_wait_samples`` returned (None when not called).
        overrides: The guard rails' corrections of the wait target.
        activated_mid_cycle: Hybrid replicas were lent at this step boundary
            (``should_activate_mid_cycle``), before ``should_deactivate`` was asked.
        mid_cycle_activate_s: Seconds that activation took.
    """

    global_steps: int
    should_deactivate: bool = False
    wait_target: int | None = None
    buffered: int | None = None
    wait_s: float = 0.0
    wait_timed_out: bool = False
    deactivated: bool = False
    deactivate_s: float = 0.0
    error: SwitchError | None = attrs.field(default=None, eq=False)
    context: DynamicScheduleContext | None = None
    proposed_wait: int | None = None
    overrides: tuple[GuardRailOverride, ...] = ()
    activated_mid_cycle: bool = False
    mid_cycle_activate_s: float = 0.0


@attrs.frozen(kw_only=True)
class AfterSyncResult:
    """What `ScheduleDriver.after_weight_sync` did.

    Attributes:
        global_steps: The step passed in.
        version: The weight version synced.
        should_activate: The policy's decision.
        forced: A guard rail overrode the decision (see ``overrides``).
        activated: Hybrid replicas were woken, synced and routed.
        hybrid_sync_skipped: The hybrid weight sync was skipped (no activation).
        rebalance: The rebalance report, when one ran.
        activate_s: Seconds the activation (with rebalance) took.
        error: The switch error, when activation failed.
        context: The context given to ``should_activate_after_step`` and
            ``update_after_step`` (None when scheduling is disabled).
        overrides: The guard rails' corrections of the activation decision.
    """

    global_steps: int
    version: int
    should_activate: bool = False
    forced: bool = False
    activated: bool = False
    hybrid_sync_skipped: bool = False
    rebalance: RebalanceReport | None = None
    activate_s: float = 0.0
    error: SwitchError | None = attrs.field(default=None, eq=False)
    context: DynamicScheduleContext | None = None
    overrides: tuple[GuardRailOverride, ...] = ()


@attrs.frozen(kw_only=True)
class DriverOptions:
    """Settings of a `ScheduleDriver` (the guard rails come from the config).

    Attributes:
        wait_timeout_s: Bound of the wait before a deactivation (> 0). On timeout the
            driver logs a warning and deactivates anyway (training must go on).
        on_switch_error: ``"continue"`` (log, count, go on in standalone mode: the
            controller has restored a safe state) or ``"raise"``.
        failover: Wake sleeping hybrid replicas while the trainer waits and fewer than
            ``min_routable_replicas`` replicas are routable (see `ScheduleDriver`).
        min_routable_replicas: Routable replicas below which a wait fails over (>= 1;
            1 means: only when the routable set is empty).
    """

    wait_timeout_s: float = attrs.field(default=600.0, validator=v.float_gt(0.0))
    on_switch_error: Literal["continue", "raise"] = attrs.field(
        default="continue", validator=v.one_of(("continue", "raise"))
    )
    failover: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    min_routable_replicas: int = attrs.field(default=1, validator=v.int_ge(1))


class ScheduleDriver:
    """Runs a `DynamicSchedulePolicyBase` against a `DynamicResourceController`.

    Args:
        policy: The scheduling policy.
        controller: Switches the hybrid replicas of its `ReplicaSet`, which is also where
            the driver counts the live replicas for the context.
        queue: The sample queue the trainer reads (for sizes, counters, end-of-stream).
        config: Scheduler settings (required samples, ``T``, staleness, rebalance, GPUs,
            guard rails).
        options: Wait bound and switch-error handling (default: `DriverOptions()`).
        clock: Time source (default: the running loop).
        events: Event bus receiving `GuardRailEvent` (and passed on for hosts; the
            controller emits the switch events).

    Example:
        >>> import asyncio
        >>> from dynsched_core import AsyncSampleQueue, DynamicScheduleConfig, InMemoryReplica
        >>> from dynsched_core import DynamicResourceController, DynamicSchedulePolicyBase
        >>> from dynsched_core import ReplicaSet
        >>> class Always(DynamicSchedulePolicyBase):
        ...     def should_deactivate(self, global_steps, is_hybrid_active, ctx): return True
        ...     def deactivate_wait_samples(self, ctx): return 0
        ...     def should_activate_after_step(self, global_steps, is_hybrid_active, ctx): return True
        >>> async def demo() -> tuple[bool, bool]:
        ...     replicas = ReplicaSet(standalone=[InMemoryReplica("s0")],
        ...                           hybrid=[InMemoryReplica("h0", role="hybrid")])
        ...     await replicas.route(["s0"])
        ...     ctrl = DynamicResourceController(replicas)
        ...     cfg = DynamicScheduleConfig(use_dynamic_resource_scheduling=True,
        ...                                 ppo_mini_batch_size=2)
        ...     driver = ScheduleDriver(Always(), ctrl, AsyncSampleQueue(), cfg)
        ...     after = await driver.after_weight_sync(1, version=1)
        ...     before = await driver.before_train_step(2)
        ...     return after.activated, before.deactivated
        >>> asyncio.run(demo())
        (True, True)
    """

    def __init__(
        self,
        policy: DynamicSchedulePolicyBase,
        controller: DynamicResourceController,
        queue: SampleQueue,
        config: DynamicScheduleConfig,
        options: DriverOptions | None = None,
        *,
        clock: Clock | None = None,
        events: EventBus | None = None,
    ) -> None:
        if not isinstance(policy, DynamicSchedulePolicyBase):
            raise TypeError(f"policy must be a DynamicSchedulePolicyBase, got {policy!r}")
        if not isinstance(controller, DynamicResourceController):
            raise TypeError(f"controller must be a DynamicResourceController, got {controller!r}")
        self.options = options if options is not None else DriverOptions()
        if not isinstance(self.options, DriverOptions):
            raise TypeError(f"options must be a DriverOptions, got {self.options!r}")
        self.policy = policy
        self.controller = controller
        self.queue = queue
        self.config = config
        self.events = events
        self.guard_rails = GuardRails.from_config(config)
        self._clock: Clock = clock if clock is not None else LoopClock()
        # Counters (checkpointed).
        self.requested_samples = 0
        self.param_version = 0
        self.cycles = 0
        self.activations = 0
        self.deactivations = 0
        self.skipped_hybrid_syncs = 0
        self.switch_errors = 0
        # Guard-rail corrections made by this driver (not checkpointed).
        self.overrides = 0
        self._warned_rules: set[tuple[str, str]] = set()
        # Observations of the current cycle.
        self._wait_times: list[float] = []
        self._wait_samples: list[int] = []
        self._cycle_activate_s = 0.0
        self._cycle_deactivate_s = 0.0
        self._cycle_requested = 0
        # Wider decision space (optional hooks): mid-cycle lends, what they load.
        self.mid_cycle_activations = 0
        if events is not None and _overrides(policy, "observe"):
            events.subscribe(policy.observe)
        # Failover (not checkpointed except the counter).
        self.failovers = 0
        self.failover_events: list[FailoverEvent] = []
        self._weights: Any = None
        self._waits: list[int] = []  # samples each running trainer wait needs
        self._failover_task: asyncio.Task[FailoverEvent | None] | None = None
        self.replicas.subscribe(self._on_membership)

    # ------------------------------------------------------------------ properties
    @property
    def wait_timeout_s(self) -> float:
        """Bound of the wait before a deactivation (`DriverOptions.wait_timeout_s`)."""
        return self.options.wait_timeout_s

    @property
    def replicas(self) -> ReplicaSet:
        """The replicas of the run (the controller's `ReplicaSet`)."""
        return self.controller.replicas

    @property
    def enabled(self) -> bool:
        """Whether dynamic scheduling is on (otherwise the policy is never called)."""
        return self.config.use_dynamic_resource_scheduling

    @property
    def num_standalone_replicas(self) -> int:
        """Live standalone replicas (from the `ReplicaSet`)."""
        return self.replicas.num_standalone

    @property
    def current_weights(self) -> tuple[int, Any]:
        """``(version, weights)`` of the last sync: what a woken or restarted replica loads."""
        return self.param_version, self._weights

    def set_current_weights(self, version: int, weights: Any = None) -> None:
        """Record the weights the rollout side serves now, outside `after_weight_sync`
        (e.g. a host that re-synced its standalone replicas after restoring a checkpoint),
        so a failover or a restarted replica loads them."""
        self.param_version = version
        self._weights = weights

    @property
    def only_hybrid(self) -> bool:
        """Colocated mode: scheduling on and no live standalone replica (`is_colocated`)."""
        return is_colocated(self.enabled, self.replicas.num_standalone)

    # ------------------------------------------------------------------ host API
    async def before_train_step(
        self, global_steps: int, *, is_last_step: bool = False
    ) -> BeforeStepResult:
        """Run ``should_deactivate`` -> ``deactivate_wait_samples`` -> wait -> deactivate.

        Call before collecting the samples of a micro-step.
        """
        self.requested_samples += self.config.required_samples
        self._cycle_requested += self.config.required_samples
        if not self.enabled:
            return BeforeStepResult(global_steps=global_steps)
        ctx = await self.context(global_steps, is_last_step=is_last_step)
        mid: AfterSyncResult | None = None
        if self._may_activate_mid_cycle(ctx) and self.policy.should_activate_mid_cycle(
            global_steps, self.controller.is_hybrid_active, ctx
        ):
            mid = await self._activate_mid_cycle(global_steps, ctx)
            ctx = await self.context(global_steps, is_last_step=is_last_step)
        if not self.policy.should_deactivate(global_steps, self.controller.is_hybrid_active, ctx):
            return self._with_mid_cycle(
                BeforeStepResult(global_steps=global_steps, context=ctx), mid
            )
        proposed = self._checked_wait(self.policy.deactivate_wait_samples(ctx))
        target, overrides = self.guard_rails.wait_target(
            proposed,
            ctx,
            cycle_remaining=self._cycle_remaining(),
            capacity=_capacity_of(self.queue),
        )
        self._report(global_steps, overrides)
        buffered, wait_s, timed_out = await self._wait_for_samples(target)
        switched, took, error = await self._switch(self.controller.deactivate)
        if switched:
            self.deactivations += 1
            self._cycle_deactivate_s += took
        result = BeforeStepResult(
            global_steps=global_steps,
            should_deactivate=True,
            wait_target=target,
            buffered=buffered,
            wait_s=wait_s,
            wait_timed_out=timed_out,
            deactivated=switched,
            deactivate_s=took,
            error=error,
            context=ctx,
            proposed_wait=proposed,
            overrides=overrides,
        )
        return self._with_mid_cycle(result, mid)

    def record_collection(self, wait_s: float, waited_samples: int) -> None:
        """Report one sample collection of the trainer.

        Args:
            wait_s: Seconds the trainer waited for the batch (>= 0).
            waited_samples: Samples that were not buffered when the collection started
                and had to be waited for (>= 0).
        """
        if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not wait_s >= 0:
            raise ValueError(f"wait_s must be a number >= 0, got {wait_s!r}")
        if isinstance(waited_samples, bool) or not isinstance(waited_samples, int):
            raise ValueError(f"waited_samples must be an int >= 0, got {waited_samples!r}")
        if waited_samples < 0:
            raise ValueError(f"waited_samples must be an int >= 0, got {waited_samples!r}")
        self._wait_times.append(float(wait_s))
        self._wait_samples.append(waited_samples)

    async def after_weight_sync(
        self,
        global_steps: int,
        version: int,
        *,
        weights: Any = None,
        is_last_step: bool = False,
    ) -> AfterSyncResult:
        """Run ``should_activate_after_step`` -> activate (with hybrid weight sync) or skip
        the hybrid sync -> ``request_rebalance`` -> ``update_after_step``.

        Call after the weights of ``version`` reached the standalone replicas; ``weights``
        is forwarded to the hybrid replicas' ``update_weights``.
        """
        self.param_version = version
        self._weights = weights
        if not self.enabled:
            self._end_cycle(0.0)
            return AfterSyncResult(global_steps=global_steps, version=version)
        ctx = await self.context(global_steps, is_last_step=is_last_step)
        wants = bool(
            self.policy.should_activate_after_step(
                global_steps, self.controller.is_hybrid_active, ctx
            )
        )
        activate, overrides = self.guard_rails.activation(wants, ctx)
        self._report(global_steps, overrides)
        result = AfterSyncResult(
            global_steps=global_steps,
            version=version,
            should_activate=wants,
            forced=bool(overrides),
            context=ctx,
            overrides=overrides,
        )
        if activate and self.controller.has_hybrid_replicas:
            result = await self._activate(result, weights)
        elif self.controller.has_hybrid_replicas:
            self.skipped_hybrid_syncs += 1
            result = attrs.evolve(result, hybrid_sync_skipped=True)
            logger.debug("step %s: hybrid weight sync skipped (no activation)", global_steps)
        self.policy.update_after_step(global_steps, ctx)
        self._end_cycle(result.activate_s if result.activated else 0.0)
        return result

    async def initial_activation(self, version: int = 0, weights: Any = None) -> AfterSyncResult:
        """Decide whether hybrid replicas generate before the first training step.

        Calls only ``should_activate_after_step`` (there is no finished step to update
        on), with the guard rails; the activation time counts for the first cycle.
        """
        self.param_version = version
        self._weights = weights
        if not self.enabled:
            return AfterSyncResult(global_steps=0, version=version)
        ctx = await self.context(0)
        wants = bool(
            self.policy.should_activate_after_step(0, self.controller.is_hybrid_active, ctx)
        )
        activate, overrides = self.guard_rails.activation(wants, ctx)
        self._report(0, overrides)
        result = AfterSyncResult(
            global_steps=0,
            version=version,
            should_activate=wants,
            forced=bool(overrides),
            context=ctx,
            overrides=overrides,
        )
        if activate and self.controller.has_hybrid_replicas:
            result = await self._activate(result, weights, allow_rebalance=False)
            self._cycle_activate_s = result.activate_s if result.activated else 0.0
        return result

    async def context(
        self, global_steps: int = 0, *, is_last_step: bool = False
    ) -> DynamicScheduleContext:
        """Build the policy context from the config, the queue and the observations."""
        stats = await self.queue.stats()
        cfg = self.config
        hybrid_ids = self.replicas.hybrid_ids
        return DynamicScheduleContext(
            required_samples=cfg.required_samples,
            trigger_parameter_sync_step=cfg.trigger_parameter_sync_step,
            total_generated_samples=stats.produced,
            expected_samples=self.requested_samples,
            buffer_samples=cfg.buffer_samples,
            step_wait_times=tuple(self._wait_times),
            step_wait_samples=tuple(self._wait_samples),
            only_hybrid=self.only_hybrid,
            last_activate_duration_s=self._cycle_activate_s,
            last_deactivate_duration_s=self._cycle_deactivate_s,
            queue_size=stats.size,
            num_standalone_replicas=self.replicas.num_standalone,
            num_hybrid_replicas=self.replicas.num_hybrid,
            standalone_gpus=cfg.standalone_gpus,
            hybrid_gpus=cfg.hybrid_gpus,
            producer_finished=stats.closed,
            is_last_step=is_last_step,
            param_version=self.param_version,
            now=self._clock.now(),
            min_deactivate_ratio=self.guard_rails.min_deactivate_ratio,
            max_deactivate_ratio=self.guard_rails.max_deactivate_ratio,
            num_active_hybrid_replicas=len(self.controller.active_hybrid_ids),
            cycle_step=self._cycle_requested // cfg.required_samples,
            hybrid_replica_ids=hybrid_ids,
            hybrid_replica_nodes=[self.replicas[rid].capabilities.node for rid in hybrid_ids],
        )

    # ------------------------------------------------------------------ failover
    @contextlib.asynccontextmanager
    async def trainer_waiting(
        self, needed: int, *, release_after: bool = True
    ) -> AsyncIterator[None]:
        """Mark a span in which the trainer waits for ``needed`` buffered samples.

        On entry, and whenever a replica dies or leaves during the span, the driver fails
        over (`failover`) when the routable set is short, the hybrid replicas sleep and the
        queue holds fewer than ``needed`` samples. On exit it waits (bounded) for a
        failover in progress and, with ``release_after``, puts hybrid replicas woken by a
        failover during the span back to sleep (the trainer is about to use their GPUs).

        Example:
            >>> # inside a host's collection of a batch:
            >>> # async with driver.trainer_waiting(required):
            >>> #     samples = await queue.get(required, timeout=driver.wait_timeout_s)
        """
        self._waits.append(needed)
        before = self.failovers
        try:
            await self._failover_if_short(needed)
            yield
        finally:
            self._waits.pop()
            task = self._failover_task
            if task is not None and not task.done():
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(task), self.controller.call_timeout_s * 4)
            if release_after and self.failovers > before and self.controller.is_hybrid_active:
                switched, took, _ = await self._switch(self.controller.deactivate)
                if switched:
                    self.deactivations += 1
                    self._cycle_deactivate_s += took

    def failover_reason(self) -> str | None:
        """Why a failover is due now (None when it is not).

        Due when failover is enabled, hybrid replicas exist and sleep
        (``STANDALONE_ONLY``), and fewer than ``min_routable_replicas`` live replicas are
        routable.
        """
        if not (self.options.failover and self.enabled and self.controller.has_hybrid_replicas):
            return None
        if self.controller.state is not HybridState.STANDALONE_ONLY:
            return None
        routable = self.replicas.num_routable
        floor = self.options.min_routable_replicas
        if routable >= floor:
            return None
        return "routable set empty" if routable == 0 else f"{routable} routable < {floor}"

    async def failover(self) -> FailoverEvent | None:
        """Wake the sleeping hybrid replicas now, with the weights of the last sync.

        Returns:
            The `FailoverEvent` (also emitted on the bus and kept in
            ``failover_events``), or None when no failover was due.
        """
        reason = self.failover_reason()
        if reason is None:
            return None
        start = self._clock.now()
        before = tuple(self.replicas.routable_ids)
        hybrid = tuple(self.controller.hybrid_ids)
        logger.warning(
            "failover (%s): waking hybrid replicas %s with weights v%d",
            reason,
            list(hybrid),
            self.param_version,
        )
        version = self.param_version
        switched, took, error = await self._switch(
            lambda: self.controller.activate(version, self._weights)
        )
        ok = bool(switched) and self.controller.is_hybrid_active
        if ok:
            self.failovers += 1
            self._cycle_activate_s += took
        event = FailoverEvent(
            time=start,
            end=self._clock.now(),
            global_steps=self.param_version,
            reason=reason,
            routable_before=before,
            woken=hybrid if ok else (),
            ok=ok,
            detail="" if error is None else str(error),
        )
        self.failover_events.append(event)
        if len(self.failover_events) > _MAX_FAILOVER_EVENTS:
            del self.failover_events[0]
        if self.events is not None:
            self.events.emit(event)
        return event

    async def _failover_if_short(self, needed: int) -> FailoverEvent | None:
        if self.failover_reason() is None:
            return None
        stats = await self.queue.stats()
        if stats.closed or stats.size >= needed:
            return None
        return await self.failover()

    def _on_membership(self, event: MembershipEvent) -> None:
        if not self._waits or event.kind not in ("died", "removed"):
            return
        if self._failover_task is not None and not self._failover_task.done():
            return
        if self.failover_reason() is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a change made from synchronous code: the next wait checks
            return
        self._failover_task = loop.create_task(
            self._failover_if_short(self._waits[-1]), name="dynsched-failover"
        )

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Policy state plus the driver's counters, as plain data."""
        return {
            "format": _STATE_FORMAT,
            "policy": dict(self.policy.state_dict()),
            "requested_samples": self.requested_samples,
            "param_version": self.param_version,
            "cycles": self.cycles,
            "activations": self.activations,
            "deactivations": self.deactivations,
            "skipped_hybrid_syncs": self.skipped_hybrid_syncs,
            "switch_errors": self.switch_errors,
            "wait_times": list(self._wait_times),
            "wait_samples": list(self._wait_samples),
            "cycle_activate_s": self._cycle_activate_s,
            "cycle_deactivate_s": self._cycle_deactivate_s,
            "cycle_requested": self._cycle_requested,
            "failovers": self.failovers,
        }

    @staticmethod
    def check_state_dict(state: Any) -> None:
        """Check the shape of a saved driver state without a driver (e.g. before a
        resumed run starts its cluster); the policy's own part is the policy's to check.

        Raises:
            ValueError: not a mapping, unknown format, missing keys or a value of the
                wrong type; the message names the key.
        """
        if not isinstance(state, Mapping):
            raise ValueError(f"ScheduleDriver state must be a mapping, got {type(state).__name__}")
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(
                f"unsupported ScheduleDriver state format {state.get('format')!r} "
                f"(this version reads format {_STATE_FORMAT})"
            )
        missing = set(_STATE_KEYS) - set(state) - _OPTIONAL_STATE
        if missing:
            raise ValueError(f"ScheduleDriver state lacks keys {sorted(missing)}")
        if not isinstance(state["policy"], Mapping):
            raise ValueError("ScheduleDriver state key 'policy' must be a mapping")
        for key in _INT_STATE:
            if key in state and (isinstance(state[key], bool) or not isinstance(state[key], int)):
                raise ValueError(f"ScheduleDriver state key {key!r} must be an int")
        for key in ("cycle_activate_s", "cycle_deactivate_s"):
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"ScheduleDriver state key {key!r} must be a number")
        for key, kind in (("wait_times", (int, float)), ("wait_samples", (int,))):
            items = state[key]
            if not isinstance(items, list | tuple) or not all(
                isinstance(x, kind) and not isinstance(x, bool) for x in items
            ):
                raise ValueError(f"ScheduleDriver state key {key!r} must be a list of numbers")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned.

        Raises:
            ValueError: unknown format or missing keys.
        """
        self.check_state_dict(state)
        self.policy.load_state_dict(state["policy"])
        for key in _COUNTERS:
            setattr(self, key, int(state[key]))
        self._wait_times = [float(x) for x in state["wait_times"]]
        self._wait_samples = [int(x) for x in state["wait_samples"]]
        self._cycle_activate_s = float(state["cycle_activate_s"])
        self._cycle_deactivate_s = float(state["cycle_deactivate_s"])
        self._cycle_requested = int(state["cycle_requested"])
        self.failovers = int(state.get("failovers", 0))

    # ------------------------------------------------------------------ internals
    def _checked_wait(self, raw: Any) -> int:
        """The policy's wait as an int (its range is the guard rails' business)."""
        try:
            target = operator.index(raw)
        except TypeError:
            raise TypeError(
                f"{type(self.policy).__name__}.deactivate_wait_samples must return an int, "
                f"got {raw!r}"
            ) from None
        if isinstance(raw, bool):
            raise TypeError(
                f"{type(self.policy).__name__}.deactivate_wait_samples must return an int, "
                f"got {raw!r}"
            )
        return target

    def _cycle_remaining(self) -> int:
        """Samples the rest of the current cycle needs, this micro-step's included."""
        return (
            self.config.step_required_samples - self._cycle_requested + self.config.required_samples
        )

    def _report(self, global_steps: int, overrides: tuple[GuardRailOverride, ...]) -> None:
        """Count, log and publish the guard rails' corrections."""
        for override in overrides:
            self.overrides += 1
            key = (override.decision, override.rule)
            # a policy out of its range is worth a warning; the colocated schedule and the
            # end of the run are the framework doing its job (said once, then debug)
            first = logging.WARNING if override.rule in _POLICY_ERRORS else logging.INFO
            level = logging.DEBUG if key in self._warned_rules else first
            self._warned_rules.add(key)
            logger.log(
                level,
                "step %d: guard rail %r corrected %s: %s",
                global_steps,
                override.rule,
                type(self.policy).__name__,
                override.reason,
            )
            if self.events is not None:
                self.events.emit(GuardRailEvent(self._clock.now(), global_steps, override))

    async def _wait_for_samples(self, target: int) -> tuple[int, float, bool]:
        """Wait until ``target`` samples are buffered, end-of-stream, or the timeout."""
        start = self._clock.now()
        timed_out = False
        try:
            async with self.trainer_waiting(target, release_after=False):
                buffered = await self.queue.wait_for(target, timeout=self.wait_timeout_s)
        except SampleWaitTimeoutError as exc:
            buffered, timed_out = exc.available, True
            logger.warning(
                "waited %.1f s for %d sample(s) before deactivating (%d buffered); deactivating",
                self.wait_timeout_s,
                target,
                exc.available,
            )
        return buffered, self._clock.now() - start, timed_out

    async def _activate(
        self, result: AfterSyncResult, weights: Any, *, allow_rebalance: bool = True
    ) -> AfterSyncResult:
        start = self._clock.now()
        version = result.version
        ids = self._activation_ids(result.global_steps, result.context)
        switched, _, error = await self._switch(
            lambda: self.controller.activate(version, weights, replica_ids=ids)
        )
        report: RebalanceReport | None = None
        if switched:
            self.activations += 1
            if allow_rebalance and self._wants_rebalance(result):
                ok, _, rb_error = await self._switch(self.controller.rebalance)
                report = ok if isinstance(ok, RebalanceReport) else None
                error = error or rb_error
        return attrs.evolve(
            result,
            activated=switched and self.controller.is_hybrid_active,
            rebalance=report,
            activate_s=self._clock.now() - start,
            error=error,
        )

    # ------------------------------------------------------------------ wider decisions
    def _may_activate_mid_cycle(self, ctx: DynamicScheduleContext) -> bool:
        """Whether ``should_activate_mid_cycle`` is asked: nothing lent, something to lend,
        not colocated (the colocated schedule decides there), not at the end of the run."""
        return (
            not self.controller.is_hybrid_active
            and self.controller.has_hybrid_replicas
            and not ctx.only_hybrid
            and not ctx.is_last_step
            and not ctx.producer_finished
        )

    async def _activate_mid_cycle(
        self, global_steps: int, ctx: DynamicScheduleContext
    ) -> AfterSyncResult:
        """Lend hybrid replicas at a step boundary: they load the current weights (version
        ``param_version``) from their own trainer GPUs; then ``request_rebalance`` as after
        a weight sync (when rebalance is enabled)."""
        pending = AfterSyncResult(
            global_steps=global_steps,
            version=self.param_version,
            should_activate=True,
            context=ctx,
        )
        result = await self._activate(pending, self._weights)
        if result.activated:
            self.mid_cycle_activations += 1
            self._cycle_activate_s += result.activate_s
            logger.debug(
                "step %s: %d hybrid replica(s) lent mid-cycle in %.3g s",
                global_steps,
                len(self.controller.active_hybrid_ids),
                result.activate_s,
            )
        return result

    @staticmethod
    def _with_mid_cycle(result: BeforeStepResult, mid: AfterSyncResult | None) -> BeforeStepResult:
        if mid is None:
            return result
        return attrs.evolve(
            result,
            activated_mid_cycle=mid.activated,
            mid_cycle_activate_s=mid.activate_s,
            error=result.error or mid.error,
        )

    def _activation_ids(
        self, global_steps: int, ctx: DynamicScheduleContext | None
    ) -> list[str] | None:
        """The hybrid replicas to lend: None (all) unless the policy names a subset
        (``hybrid_replica_ids_to_activate``) or asks for k < m (``hybrid_replicas_to_activate``)."""
        if ctx is None:
            return None
        live = self.controller.hybrid_ids
        chosen = self.policy.hybrid_replica_ids_to_activate(global_steps, ctx)
        if chosen is not None:
            return self._checked_ids(global_steps, chosen, live)
        raw = self.policy.hybrid_replicas_to_activate(global_steps, ctx)
        if raw is None:
            return None
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise TypeError(
                f"{type(self.policy).__name__}.hybrid_replicas_to_activate must return an int "
                f"or None, got {raw!r}"
            )
        if raw >= len(live):
            return None
        if raw < 1:
            logger.warning(
                "step %s: %s.hybrid_replicas_to_activate returned %d; lending 1 (not lending "
                "is the activation hooks' decision)",
                global_steps,
                type(self.policy).__name__,
                raw,
            )
        return list(live[: max(1, raw)])

    def _checked_ids(self, global_steps: int, chosen: Any, live: Sequence[str]) -> list[str] | None:
        """``hybrid_replica_ids_to_activate``'s answer, bounded to live hybrid replicas."""
        name = type(self.policy).__name__
        if isinstance(chosen, str | bytes) or not isinstance(chosen, Iterable):
            raise TypeError(
                f"{name}.hybrid_replica_ids_to_activate must return a sequence of replica ids "
                f"or None, got {chosen!r}"
            )
        proposed = tuple(chosen)
        bad = [x for x in proposed if not isinstance(x, str)]
        if bad:
            raise TypeError(
                f"{name}.hybrid_replica_ids_to_activate must return replica ids (str), "
                f"got {bad[0]!r}"
            )
        known = set(live)
        order = {rid: i for i, rid in enumerate(live)}
        kept = tuple(sorted({x for x in proposed if x in known}, key=order.__getitem__))
        applied = kept or tuple(live[:1])
        if len(applied) != len(proposed) or set(applied) != set(proposed):
            dropped = sorted(set(proposed) - known)
            why = f"not live hybrid replicas: {dropped}" if dropped else "duplicates"
            if not kept:
                why += "; nothing left, lending the first (not lending is the activation hooks' decision)"
            self._report(
                global_steps,
                (
                    GuardRailOverride(
                        decision="hybrid_replica_ids_to_activate",
                        rule="live_hybrid_replicas",
                        proposed=proposed,
                        applied=applied,
                        reason=(
                            f"hybrid_replica_ids_to_activate {list(proposed)} corrected ({why}): "
                            f"lending {list(applied)}"
                        ),
                    ),
                ),
            )
        if set(applied) == known:
            return None
        return list(applied)

    def _wants_rebalance(self, result: AfterSyncResult) -> bool:
        if not self.config.dynamic_schedule_enable_rebalance or result.context is None:
            return False
        decision = self.policy.request_rebalance(result.global_steps, result.context)
        return decision is None or bool(decision)

    async def _switch(
        self, operation: Callable[[], Awaitable[Any]]
    ) -> tuple[Any, float, SwitchError | None]:
        """Run a controller operation, timing it; apply ``on_switch_error``."""
        start = self._clock.now()
        try:
            outcome = await operation()
        except SwitchError as exc:
            self.switch_errors += 1
            if self.options.on_switch_error == "raise":
                raise
            logger.error("%s; continuing with standalone replicas only", exc)
            return False, self._clock.now() - start, exc
        return outcome, self._clock.now() - start, None

    def _end_cycle(self, next_activate_s: float) -> None:
        self.cycles += 1
        self._wait_times.clear()
        self._wait_samples.clear()
        self._cycle_deactivate_s = 0.0
        self._cycle_requested = 0
        self._cycle_activate_s = next_activate_s

    def __repr__(self) -> str:
        return (
            f"ScheduleDriver(policy={type(self.policy).__name__}, cycles={self.cycles}, "
            f"activations={self.activations}, deactivations={self.deactivations})"
        )


def _overrides(policy: DynamicSchedulePolicyBase, hook: str) -> bool:
    """Whether ``policy`` overrides the base class's optional ``hook``."""
    return getattr(type(policy), hook, None) is not getattr(DynamicSchedulePolicyBase, hook)


def _capacity_of(queue: SampleQueue) -> int | None:
    capacity = getattr(queue, "capacity", None)
    return capacity if isinstance(capacity, int) and not isinstance(capacity, bool) else None
