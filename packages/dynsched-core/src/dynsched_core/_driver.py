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

The decisions themselves live in the sans-I/O `DriverCore` (``_decide``): this class only
performs the actions the core asks for (observe, report, activate, rebalance, wait,
deactivate) and sends their outcomes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Literal

import attrs

from dynsched_core import _decide as d
from dynsched_core import validators as v
from dynsched_core._clock import Clock, LoopClock
from dynsched_core._config import DynamicScheduleConfig
from dynsched_core._context import DynamicScheduleContext
from dynsched_core._controller import DynamicResourceController
from dynsched_core._decide import (
    _COUNTERS,
    _INT_STATE,
    _OPTIONAL_STATE,
    _STATE_KEYS,
    AfterSyncResult,
    BeforeStepResult,
    check_driver_state,
)
from dynsched_core._errors import SampleWaitTimeoutError, SwitchError
from dynsched_core._events import EventBus, FailoverEvent, GuardRailEvent
from dynsched_core._guards import GuardRailOverride, GuardRails, is_colocated
from dynsched_core._policy import DynamicSchedulePolicyBase
from dynsched_core._protocols import SampleQueue
from dynsched_core._replicas import MembershipEvent, ReplicaSet
from dynsched_core._state import HybridState

__all__ = ["AfterSyncResult", "BeforeStepResult", "DriverOptions", "ScheduleDriver"]

logger = logging.getLogger(__name__)

#: Kept importable from here (checkpoint checks elsewhere read them).
_STATE_NAMES = (_COUNTERS, _INT_STATE, _OPTIONAL_STATE, _STATE_KEYS)

#: Failover events kept by a driver (the oldest are dropped: a long run stays bounded).
_MAX_FAILOVER_EVENTS = 256

#: Guard-rail rules whose corrections mean the policy proposed something out of range.
_POLICY_ERRORS = frozenset({"ratio_range", "queue_capacity"})


def _state_field(name: str, doc: str) -> Any:
    """A driver attribute kept in the core's `DriverState`."""

    def get(self: ScheduleDriver) -> Any:
        return getattr(self.core.state, name)

    def set_(self: ScheduleDriver, value: Any) -> None:
        setattr(self.core.state, name, value)

    return property(get, set_, doc=doc)


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

    requested_samples = _state_field("requested_samples", "Samples the trainer asked for.")
    param_version = _state_field("param_version", "Version of the last weight sync.")
    cycles = _state_field("cycles", "Weight-sync cycles ended.")
    activations = _state_field("activations", "Successful activations.")
    deactivations = _state_field("deactivations", "Successful deactivations.")
    skipped_hybrid_syncs = _state_field("skipped_hybrid_syncs", "Hybrid weight syncs skipped.")
    switch_errors = _state_field("switch_errors", "Switches that failed.")
    failovers = _state_field("failovers", "Successful failovers.")
    mid_cycle_activations = _state_field("mid_cycle_activations", "Lends at a step boundary.")

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
        v.expect_instance("controller", controller, DynamicResourceController)
        self.options = v.options_or_default(options, DriverOptions)
        self._config = config
        self.core = d.DriverCore(policy, config)
        self.controller = controller
        self.queue = queue
        self.events = events
        self._clock: Clock = clock if clock is not None else LoopClock()
        # Guard-rail corrections made by this driver (not checkpointed).
        self.overrides = 0
        self._warned_rules: set[tuple[str, str]] = set()
        if events is not None and _overrides(policy, "observe"):
            events.subscribe(policy.observe)
        # Failover (not checkpointed except the counter).
        self.failover_events: list[FailoverEvent] = []
        self._weights: Any = None
        self._waits: list[int] = []  # samples each running trainer wait needs
        self._failover_task: asyncio.Task[FailoverEvent | None] | None = None
        self.replicas.subscribe(self._on_membership)

    # ------------------------------------------------------------------ properties
    @property
    def policy(self) -> DynamicSchedulePolicyBase:
        """The scheduling policy (the core's)."""
        return self.core.policy

    @property
    def config(self) -> DynamicScheduleConfig:
        """Scheduler settings."""
        return self._config

    @property
    def guard_rails(self) -> GuardRails:
        """The bounds applied after every policy decision (from the config)."""
        return self.core.guard_rails

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
        return self.core.enabled

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
        result = await self._run(d.BeforeStep(global_steps=global_steps, is_last_step=is_last_step))
        assert isinstance(result, BeforeStepResult)
        return result

    def record_collection(self, wait_s: float, waited_samples: int) -> None:
        """Report one sample collection of the trainer.

        Args:
            wait_s: Seconds the trainer waited for the batch (>= 0).
            waited_samples: Samples that were not buffered when the collection started
                and had to be waited for (>= 0).
        """
        self.core.record_collection(wait_s, waited_samples)

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
        self._weights = weights
        command = d.AfterSync(global_steps=global_steps, version=version, is_last_step=is_last_step)
        result = await self._run(command)
        assert isinstance(result, AfterSyncResult)
        return result

    async def initial_activation(self, version: int = 0, weights: Any = None) -> AfterSyncResult:
        """Decide whether hybrid replicas generate before the first training step.

        Calls only ``should_activate_after_step`` (there is no finished step to update
        on), with the guard rails; the activation time counts for the first cycle.
        """
        self._weights = weights
        result = await self._run(d.InitialActivation(version=version))
        assert isinstance(result, AfterSyncResult)
        return result

    async def context(
        self, global_steps: int = 0, *, is_last_step: bool = False
    ) -> DynamicScheduleContext:
        """Build the policy context from the config, the queue and the observations."""
        obs = await self._observe()
        return self.core.context(global_steps, obs, is_last_step=is_last_step)

    # ------------------------------------------------------------------ performing actions
    async def _run(self, command: d.Command) -> BeforeStepResult | AfterSyncResult:
        """Drive the core through one sequence, performing each action it asks for."""
        action: d.Action = self.core.step(command)
        while not isinstance(action, d.Done):
            action = self.core.step(await self._perform(action))
        return action.result

    async def _perform(self, action: d.Action) -> d.Outcome:
        if isinstance(action, d.Observe):
            return await self._observe()
        if isinstance(action, d.ReportOverrides):
            self._report(action.global_steps, action.overrides)
            return d.Ack()
        if isinstance(action, d.WaitForSamples):
            return await self._wait_for_samples(action.target)
        if isinstance(action, d.Activate):
            version, ids = action.version, action.replica_ids
            weights = self._weights
            return await self._switch(
                lambda: self.controller.activate(
                    version, weights, replica_ids=None if ids is None else list(ids)
                )
            )
        if isinstance(action, d.Rebalance):
            return await self._switch(self.controller.rebalance)
        assert isinstance(action, d.Deactivate), action
        return await self._switch(self.controller.deactivate)

    async def _observe(self) -> d.Observation:
        stats = await self.queue.stats()
        hybrid_ids = tuple(self.replicas.hybrid_ids)
        return d.Observation(
            produced=stats.produced,
            queue_size=stats.size,
            producer_finished=stats.closed,
            now=self._clock.now(),
            num_standalone=self.replicas.num_standalone,
            hybrid_ids=hybrid_ids,
            hybrid_nodes=tuple(self.replicas[rid].capabilities.node for rid in hybrid_ids),
            active_hybrid=len(self.controller.active_hybrid_ids),
            is_hybrid_active=self.controller.is_hybrid_active,
            capacity=_capacity_of(self.queue),
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
                switched = await self._switch(self.controller.deactivate)
                if switched.value:
                    self.core.state.deactivations += 1
                    self.core.state.cycle_deactivate_s += switched.ended - switched.started

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
        switched = await self._switch(lambda: self.controller.activate(version, self._weights))
        error = switched.error
        ok = bool(switched.value) and self.controller.is_hybrid_active
        if ok:
            self.core.state.failovers += 1
            self.core.state.cycle_activate_s += switched.ended - switched.started
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
        return self.core.state_dict()

    @staticmethod
    def check_state_dict(state: Any) -> None:
        """Check the shape of a saved driver state without a driver (e.g. before a
        resumed run starts its cluster); the policy's own part is the policy's to check.

        Raises:
            ValueError: not a mapping, unknown format, missing keys or a value of the
                wrong type; the message names the key.
        """
        check_driver_state(state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned.

        Raises:
            ValueError: unknown format or missing keys.
        """
        self.core.load_state_dict(state)

    # ------------------------------------------------------------------ internals
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

    async def _wait_for_samples(self, target: int) -> d.Waited:
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
        return d.Waited(
            buffered=buffered, started=start, ended=self._clock.now(), timed_out=timed_out
        )

    async def _switch(self, operation: Callable[[], Awaitable[Any]]) -> d.Switched:
        """Run a controller operation, timing it; apply ``on_switch_error``."""
        start = self._clock.now()
        try:
            outcome = await operation()
        except SwitchError as exc:
            self.core.state.switch_errors += 1
            if self.options.on_switch_error == "raise":
                raise
            logger.error("%s; continuing with standalone replicas only", exc)
            return self._switched(False, start, exc)
        return self._switched(outcome, start, None)

    def _switched(self, value: Any, start: float, error: SwitchError | None) -> d.Switched:
        return d.Switched(
            value=value,
            started=start,
            ended=self._clock.now(),
            error=error,
            is_hybrid_active=self.controller.is_hybrid_active,
            active_hybrid=len(self.controller.active_hybrid_ids),
        )

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
