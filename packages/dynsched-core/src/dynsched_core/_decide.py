"""`DriverCore`: the driver's decisions as a pure, synchronous step (sans-I/O).

The core holds the policy, the guard rails and the driver's counters; it performs no I/O,
awaits nothing and reads no clock. A sequence starts with a command (`BeforeStep`,
`AfterSync`, `InitialActivation`) and proceeds one action at a time: the core answers
each event with the next `Action`; whoever drives it performs that action and sends its
outcome back, until the core answers `Done` with the step's result::

    action = core.step(BeforeStep(global_steps=3))
    while not isinstance(action, Done):
        action = core.step(perform(action))     # Observation, Switched, Waited or Ack()
    result = action.result

The asyncio `ScheduleDriver` performs the actions against a controller and a queue; the
conformance kit (`dynsched_core.testing.check_policy`) performs them on a counts-only
model; unit tests send outcomes by hand. All three therefore run the same call order:

* before a training step: ``should_activate_mid_cycle`` (optional hook; nothing lent,
  not colocated, not at the end) -> [`Activate` -> ``request_rebalance`` -> `Rebalance`
  -> `Observe`] -> ``should_deactivate`` -> ``deactivate_wait_samples`` -> guard rails
  (`ReportOverrides`) -> `WaitForSamples` -> `Deactivate`;
* after a weight sync: ``should_activate_after_step`` -> guard rails -> `Activate`
  (hybrid weight sync) -> ``request_rebalance`` -> `Rebalance`, or skip the hybrid sync
  -> ``update_after_step`` -> end of the cycle.

Every outcome carries the clock readings around its action (``started``, ``ended``), so
the durations the policy sees are computed here from the runtime's own clock.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import Any

import attrs

from dynsched_core._context import DynamicScheduleContext
from dynsched_core._controller import RebalanceReport
from dynsched_core._errors import SwitchError
from dynsched_core._guards import GuardRailOverride, GuardRails, guard_override, is_colocated
from dynsched_core._policy import DynamicSchedulePolicyBase

__all__ = [
    "Ack",
    "Activate",
    "AfterSync",
    "AfterSyncResult",
    "BeforeStep",
    "BeforeStepResult",
    "CoreSettings",
    "Deactivate",
    "Done",
    "DriverCore",
    "DriverState",
    "InitialActivation",
    "Observation",
    "Observe",
    "Rebalance",
    "ReportOverrides",
    "Switched",
    "WaitForSamples",
    "Waited",
]

logger = logging.getLogger(__name__)

_STATE_FORMAT = 1
#: The checkpointed counters.
_COUNTERS = (
    "requested_samples",
    "param_version",
    "cycles",
    "activations",
    "deactivations",
    "skipped_hybrid_syncs",
    "switch_errors",
)


@attrs.frozen
class _Saved:
    """How one `DriverState` field is checkpointed: a number of ``kind`` or a list of them.

    ``optional``: added after format 1, absent from older checkpoints (then 0).
    """

    key: str
    kind: type[int] | type[float]
    many: bool = False
    optional: bool = False

    def dump(self, value: Any) -> Any:
        """The field's value as plain data (a list copied)."""
        return list(value) if self.many else value

    def load(self, state: Mapping[str, Any]) -> Any:
        """The field's value read back from a checked state."""
        value = state.get(self.key, 0) if self.optional else state[self.key]
        return [self.kind(x) for x in value] if self.many else self.kind(value)

    def problem(self, state: Mapping[str, Any]) -> str | None:
        """Why the state's value of this field is malformed (None when it is not)."""
        if self.key not in state:
            return None
        value, accepted = state[self.key], (int,) if self.kind is int else (int, float)

        def ok(x: Any) -> bool:
            return isinstance(x, accepted) and not isinstance(x, bool)

        if self.many:
            if isinstance(value, list | tuple) and all(ok(x) for x in value):
                return None
            return "a list of numbers"
        if ok(value):
            return None
        return "an int" if self.kind is int else "a number"


#: Every checkpointed field of `DriverState`, in the order of `DriverCore.state_dict`.
_SAVED = (
    *(_Saved(key, int) for key in _COUNTERS),
    _Saved("wait_times", float, many=True),
    _Saved("wait_samples", int, many=True),
    _Saved("cycle_activate_s", float),
    _Saved("cycle_deactivate_s", float),
    _Saved("cycle_requested", int),
    _Saved("failovers", int, optional=True),
)
#: State keys added after format 1 (absent from older checkpoints).
_OPTIONAL_STATE = frozenset(s.key for s in _SAVED if s.optional)
_INT_STATE = tuple(s.key for s in _SAVED if s.kind is int and not s.many)
_STATE_KEYS = ("format", "policy", *(s.key for s in _SAVED))


# ---------------------------------------------------------------------------- results
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


# ---------------------------------------------------------------------------- commands
@attrs.frozen(kw_only=True)
class BeforeStep:
    """Command: run the decisions before a training step."""

    global_steps: int
    is_last_step: bool = False


@attrs.frozen(kw_only=True)
class AfterSync:
    """Command: run the decisions after the weight sync of ``version``."""

    global_steps: int
    version: int
    is_last_step: bool = False


@attrs.frozen(kw_only=True)
class InitialActivation:
    """Command: decide whether hybrid replicas generate before the first step."""

    version: int = 0


Command = BeforeStep | AfterSync | InitialActivation


# ---------------------------------------------------------------------------- actions
@attrs.frozen
class Observe:
    """Action: read the queue and the membership; answer with an `Observation`."""


@attrs.frozen(kw_only=True)
class ReportOverrides:
    """Action: count, log and publish guard-rail corrections; answer with `Ack`."""

    global_steps: int
    overrides: tuple[GuardRailOverride, ...]


@attrs.frozen(kw_only=True)
class Activate:
    """Action: wake, sync (weights of ``version``) and route hybrid replicas.

    ``replica_ids`` None means every live hybrid replica. Answer with `Switched`.
    """

    version: int
    replica_ids: tuple[str, ...] | None = None


@attrs.frozen
class Rebalance:
    """Action: rebalance in-flight requests after an activation; answer with `Switched`."""


@attrs.frozen
class Deactivate:
    """Action: unroute, abort and sleep the hybrid replicas; answer with `Switched`."""


@attrs.frozen(kw_only=True)
class WaitForSamples:
    """Action: wait until ``target`` samples are buffered (bounded); answer with `Waited`."""

    target: int


@attrs.frozen
class Done:
    """The sequence ended; ``result`` is its `BeforeStepResult` or `AfterSyncResult`."""

    result: BeforeStepResult | AfterSyncResult


Action = Observe | ReportOverrides | Activate | Rebalance | Deactivate | WaitForSamples | Done


# ---------------------------------------------------------------------------- outcomes
@attrs.frozen
class Ack:
    """Outcome of an action that returns nothing (`ReportOverrides`)."""


@attrs.frozen(kw_only=True)
class Observation:
    """Outcome of `Observe`: what the runtime read from the queue and the replicas.

    Attributes:
        produced: Samples produced so far (the queue's counter).
        queue_size: Samples buffered now.
        producer_finished: The queue is closed (end-of-stream).
        now: The clock's time of the reading.
        num_standalone: Live standalone replicas.
        hybrid_ids: Live hybrid replicas, sorted (the default lending order).
        hybrid_nodes: The node of each of ``hybrid_ids`` (``""`` when unknown).
        active_hybrid: Hybrid replicas lent to rollout now.
        is_hybrid_active: The controller is in ``HYBRID_ACTIVE``.
        capacity: The queue's capacity (None: unbounded).
    """

    produced: int = 0
    queue_size: int = 0
    producer_finished: bool = False
    now: float = 0.0
    num_standalone: int = 0
    hybrid_ids: tuple[str, ...] = ()
    hybrid_nodes: tuple[str, ...] = ()
    active_hybrid: int = 0
    is_hybrid_active: bool = False
    capacity: int | None = None

    @property
    def has_hybrid_replicas(self) -> bool:
        """Whether any live hybrid replica exists (else switching is a no-op)."""
        return bool(self.hybrid_ids)


@attrs.frozen(kw_only=True)
class Switched:
    """Outcome of `Activate`, `Rebalance` or `Deactivate`.

    Attributes:
        value: What the controller returned (False after a switch error).
        started: Clock reading before the switch.
        ended: Clock reading after it.
        error: The switch error, if any (the controller restored a safe state).
        is_hybrid_active: The controller's state after the switch.
        active_hybrid: Hybrid replicas lent after the switch.
    """

    value: Any
    started: float = 0.0
    ended: float = 0.0
    error: SwitchError | None = None
    is_hybrid_active: bool = False
    active_hybrid: int = 0


@attrs.frozen(kw_only=True)
class Waited:
    """Outcome of `WaitForSamples`: samples buffered, clock readings, timeout hit."""

    buffered: int
    started: float = 0.0
    ended: float = 0.0
    timed_out: bool = False


Outcome = Ack | Observation | Switched | Waited
_Seq = Generator[Action, Any, BeforeStepResult | AfterSyncResult]


# ---------------------------------------------------------------------------- settings
@attrs.frozen(kw_only=True)
class CoreSettings:
    """What the core reads of its settings (`of` takes them from a `DynamicScheduleConfig`)."""

    use_dynamic_resource_scheduling: bool
    required_samples: int
    trigger_parameter_sync_step: int
    step_required_samples: int
    buffer_samples: int
    standalone_gpus: int
    hybrid_gpus: int
    dynamic_schedule_enable_rebalance: bool
    dynamic_schedule_min_deactivate_ratio: float
    dynamic_schedule_max_deactivate_ratio: float

    @classmethod
    def of(cls, config: Any) -> CoreSettings:
        """``config`` itself when it is a `CoreSettings`, else its fields of the same names."""
        if isinstance(config, cls):
            return config
        return cls(**{f.name: getattr(config, f.name) for f in attrs.fields(cls)})


# ---------------------------------------------------------------------------- state
@attrs.define(kw_only=True)
class DriverState:
    """The driver's counters and the observations of the current cycle (checkpointed)."""

    requested_samples: int = 0
    param_version: int = 0
    cycles: int = 0
    activations: int = 0
    deactivations: int = 0
    skipped_hybrid_syncs: int = 0
    switch_errors: int = 0
    failovers: int = 0
    mid_cycle_activations: int = 0
    cycle_requested: int = 0
    wait_times: list[float] = attrs.Factory(list)
    wait_samples: list[int] = attrs.Factory(list)
    cycle_activate_s: float = 0.0
    cycle_deactivate_s: float = 0.0


def check_driver_state(state: Any) -> None:
    """Check the shape of a saved driver state (see `ScheduleDriver.check_state_dict`)."""
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
    for saved in _SAVED:
        wanted = saved.problem(state)
        if wanted is not None:
            raise ValueError(f"ScheduleDriver state key {saved.key!r} must be {wanted}")


# ---------------------------------------------------------------------------- the core
class DriverCore:
    """The driver's decision sequence, pure and synchronous (see the module docstring).

    Args:
        policy: The scheduling policy (called only from inside `step`).
        config: Scheduler settings (required samples, ``T``, rebalance, GPUs, guard rails):
            a `DynamicScheduleConfig`, a `CoreSettings`, or anything with its fields (kept
            as `CoreSettings`).
        state: Counters to continue from (default: a fresh `DriverState`).

    Example:
        >>> from dynsched_core import DynamicScheduleConfig, DynamicSchedulePolicyBase
        >>> class Never(DynamicSchedulePolicyBase):
        ...     def should_deactivate(self, g, active, ctx): return False
        ...     def deactivate_wait_samples(self, ctx): return 0
        ...     def should_activate_after_step(self, g, active, ctx): return False
        >>> core = DriverCore(Never(), DynamicScheduleConfig(
        ...     use_dynamic_resource_scheduling=True, ppo_mini_batch_size=2))
        >>> core.step(BeforeStep(global_steps=1))
        Observe()
        >>> core.step(Observation(num_standalone=1)).result.should_deactivate
        False
    """

    def __init__(
        self,
        policy: DynamicSchedulePolicyBase,
        config: Any,
        state: DriverState | None = None,
    ) -> None:
        self.policy = policy
        self.config = CoreSettings.of(config)
        self.guard_rails = GuardRails.from_config(config)
        self.state = state if state is not None else DriverState()
        self._seq: _Seq | None = None

    @property
    def enabled(self) -> bool:
        """Whether dynamic scheduling is on (otherwise the policy is never called)."""
        return self.config.use_dynamic_resource_scheduling

    @property
    def busy(self) -> bool:
        """Whether a sequence waits for the outcome of its last action."""
        return self._seq is not None

    # ------------------------------------------------------------------ stepping
    def step(self, event: Command | Outcome) -> Action:
        """Feed a command (starts a sequence) or the outcome of the last action.

        Returns:
            The next action; `Done` ends the sequence.

        Raises:
            RuntimeError: an outcome without a sequence waiting for one.
        """
        if isinstance(event, BeforeStep | AfterSync | InitialActivation):
            if self._seq is not None:  # an abandoned sequence (an error was raised)
                self._seq.close()
            self._seq = self._sequence(event)
            return self._advance(None)
        if self._seq is None:
            raise RuntimeError(f"DriverCore got {event!r} with no sequence running")
        return self._advance(event)

    def _advance(self, outcome: Outcome | None) -> Action:
        assert self._seq is not None
        try:
            return self._seq.send(outcome)
        except StopIteration as stop:
            self._seq = None
            return Done(stop.value)
        except BaseException:
            self._seq = None
            raise

    def _sequence(self, command: Command) -> _Seq:
        if isinstance(command, BeforeStep):
            return self._before(command.global_steps, command.is_last_step)
        if isinstance(command, AfterSync):
            return self._after(command.global_steps, command.version, command.is_last_step)
        return self._initial(command.version)

    # ------------------------------------------------------------------ context
    def context(
        self, global_steps: int, obs: Observation, *, is_last_step: bool = False
    ) -> DynamicScheduleContext:
        """The policy context from the config, the counters and an observation."""
        cfg, st = self.config, self.state
        return DynamicScheduleContext(
            required_samples=cfg.required_samples,
            trigger_parameter_sync_step=cfg.trigger_parameter_sync_step,
            total_generated_samples=obs.produced,
            expected_samples=st.requested_samples,
            buffer_samples=cfg.buffer_samples,
            step_wait_times=tuple(st.wait_times),
            step_wait_samples=tuple(st.wait_samples),
            only_hybrid=is_colocated(self.enabled, obs.num_standalone),
            last_activate_duration_s=st.cycle_activate_s,
            last_deactivate_duration_s=st.cycle_deactivate_s,
            queue_size=obs.queue_size,
            num_standalone_replicas=obs.num_standalone,
            num_hybrid_replicas=len(obs.hybrid_ids),
            standalone_gpus=cfg.standalone_gpus,
            hybrid_gpus=cfg.hybrid_gpus,
            producer_finished=obs.producer_finished,
            is_last_step=is_last_step,
            param_version=st.param_version,
            now=obs.now,
            min_deactivate_ratio=self.guard_rails.min_deactivate_ratio,
            max_deactivate_ratio=self.guard_rails.max_deactivate_ratio,
            num_active_hybrid_replicas=obs.active_hybrid,
            cycle_step=st.cycle_requested // cfg.required_samples,
            hybrid_replica_ids=obs.hybrid_ids,
            hybrid_replica_nodes=obs.hybrid_nodes,
        )

    def _observe(self, global_steps: int, is_last_step: bool) -> Generator[Action, Any, Any]:
        obs = yield Observe()
        if not isinstance(obs, Observation):
            raise TypeError(f"Observe must be answered with an Observation, got {obs!r}")
        return obs, self.context(global_steps, obs, is_last_step=is_last_step)

    # ------------------------------------------------------------------ sequences
    def _before(self, g: int, is_last_step: bool) -> _Seq:
        st = self.state
        st.requested_samples += self.config.required_samples
        st.cycle_requested += self.config.required_samples
        if not self.enabled:
            return BeforeStepResult(global_steps=g)
        obs, ctx = yield from self._observe(g, is_last_step)
        mid: AfterSyncResult | None = None
        if self._may_activate_mid_cycle(ctx, obs) and self.policy.should_activate_mid_cycle(
            g, obs.is_hybrid_active, ctx
        ):
            mid = yield from self._activate_mid_cycle(g, ctx, obs)
            obs, ctx = yield from self._observe(g, is_last_step)
        if not self.policy.should_deactivate(g, obs.is_hybrid_active, ctx):
            return _with_mid_cycle(BeforeStepResult(global_steps=g, context=ctx), mid)
        proposed = self._checked_wait(self.policy.deactivate_wait_samples(ctx))
        target, overrides = self.guard_rails.wait_target(
            proposed, ctx, cycle_remaining=self.cycle_remaining(), capacity=obs.capacity
        )
        yield from self._report(g, overrides)
        waited: Waited = yield WaitForSamples(target=target)
        switched: Switched = yield Deactivate()
        took = switched.ended - switched.started
        if switched.value:
            st.deactivations += 1
            st.cycle_deactivate_s += took
        result = BeforeStepResult(
            global_steps=g,
            should_deactivate=True,
            wait_target=target,
            buffered=waited.buffered,
            wait_s=waited.ended - waited.started,
            wait_timed_out=waited.timed_out,
            deactivated=switched.value,
            deactivate_s=took,
            error=switched.error,
            context=ctx,
            proposed_wait=proposed,
            overrides=overrides,
        )
        return _with_mid_cycle(result, mid)

    def _after(self, g: int, version: int, is_last_step: bool) -> _Seq:
        self.state.param_version = version
        if not self.enabled:
            self._end_cycle(0.0)
            return AfterSyncResult(global_steps=g, version=version)
        obs, ctx = yield from self._observe(g, is_last_step)
        decided = yield from self._decide_activation(g, version, ctx, obs)
        result = decided.pending
        if decided.activate and obs.has_hybrid_replicas:
            result = yield from self._activate(g, result, obs)
        elif obs.has_hybrid_replicas:
            self.state.skipped_hybrid_syncs += 1
            result = attrs.evolve(result, hybrid_sync_skipped=True)
            logger.debug("step %s: hybrid weight sync skipped (no activation)", g)
        self.policy.update_after_step(g, ctx)
        self._end_cycle(result.activate_s if result.activated else 0.0)
        return result

    def _initial(self, version: int) -> _Seq:
        self.state.param_version = version
        if not self.enabled:
            return AfterSyncResult(global_steps=0, version=version)
        obs, ctx = yield from self._observe(0, False)
        decided = yield from self._decide_activation(0, version, ctx, obs)
        result = decided.pending
        if decided.activate and obs.has_hybrid_replicas:
            result = yield from self._activate(0, result, obs, allow_rebalance=False)
            self.state.cycle_activate_s = result.activate_s if result.activated else 0.0
        return result

    def _decide_activation(
        self, g: int, version: int, ctx: DynamicScheduleContext, obs: Observation
    ) -> Generator[Action, Any, _Pending]:
        """``should_activate_after_step`` bounded by the guard rails."""
        wants = bool(self.policy.should_activate_after_step(g, obs.is_hybrid_active, ctx))
        activate, overrides = self.guard_rails.activation(wants, ctx)
        yield from self._report(g, overrides)
        pending = AfterSyncResult(
            global_steps=g,
            version=version,
            should_activate=wants,
            forced=bool(overrides),
            context=ctx,
            overrides=overrides,
        )
        return _Pending(pending, activate)

    def _activate(
        self, g: int, pending: AfterSyncResult, obs: Observation, *, allow_rebalance: bool = True
    ) -> Generator[Action, Any, AfterSyncResult]:
        """Activate (the replicas the policy picks), then rebalance if asked."""
        ids = yield from self._activation_ids(g, pending.context, obs.hybrid_ids)
        switched: Switched = yield Activate(
            version=pending.version, replica_ids=None if ids is None else tuple(ids)
        )
        last, report, error = switched, None, switched.error
        if switched.value:
            self.state.activations += 1
            if allow_rebalance and self._wants_rebalance(g, pending.context):
                last = yield Rebalance()
                report = last.value if isinstance(last.value, RebalanceReport) else None
                error = error or last.error
        return attrs.evolve(
            pending,
            activated=bool(switched.value) and last.is_hybrid_active,
            rebalance=report,
            activate_s=last.ended - switched.started,
            error=error,
        )

    # ------------------------------------------------------------------ wider decisions
    def _may_activate_mid_cycle(self, ctx: DynamicScheduleContext, obs: Observation) -> bool:
        """Whether ``should_activate_mid_cycle`` is asked: nothing lent, something to lend,
        not colocated (the colocated schedule decides there), not at the end of the run."""
        return (
            not obs.is_hybrid_active
            and obs.has_hybrid_replicas
            and not ctx.only_hybrid
            and not ctx.is_last_step
            and not ctx.producer_finished
        )

    def _activate_mid_cycle(
        self, g: int, ctx: DynamicScheduleContext, obs: Observation
    ) -> Generator[Action, Any, AfterSyncResult]:
        """Lend hybrid replicas at a step boundary with the current weights."""
        pending = AfterSyncResult(
            global_steps=g, version=self.state.param_version, should_activate=True, context=ctx
        )
        result = yield from self._activate(g, pending, obs)
        if result.activated:
            self.state.mid_cycle_activations += 1
            self.state.cycle_activate_s += result.activate_s
            logger.debug("step %s: hybrid replicas lent mid-cycle in %.3g s", g, result.activate_s)
        return result

    def _activation_ids(
        self, g: int, ctx: DynamicScheduleContext | None, live: Sequence[str]
    ) -> Generator[Action, Any, list[str] | None]:
        """The hybrid replicas to lend: None (all) unless the policy names a subset
        (``hybrid_replica_ids_to_activate``) or asks for k < m (``hybrid_replicas_to_activate``)."""
        if ctx is None:
            return None
        chosen = self.policy.hybrid_replica_ids_to_activate(g, ctx)
        if chosen is not None:
            applied, overrides = _bounded_ids(type(self.policy).__name__, chosen, live)
            yield from self._report(g, overrides)
            return None if set(applied) == set(live) else list(applied)
        raw = self.policy.hybrid_replicas_to_activate(g, ctx)
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
                g,
                type(self.policy).__name__,
                raw,
            )
        return list(live[: max(1, raw)])

    def _wants_rebalance(self, g: int, ctx: DynamicScheduleContext | None) -> bool:
        if not self.config.dynamic_schedule_enable_rebalance or ctx is None:
            return False
        decision = self.policy.request_rebalance(g, ctx)
        return decision is None or bool(decision)

    # ------------------------------------------------------------------ bookkeeping
    @staticmethod
    def _report(g: int, overrides: tuple[GuardRailOverride, ...]) -> Generator[Action, Any, None]:
        if overrides:
            yield ReportOverrides(global_steps=g, overrides=overrides)

    def _checked_wait(self, raw: Any) -> int:
        """The policy's wait as an int (its range is the guard rails' business)."""
        if not isinstance(raw, bool):
            try:
                return operator.index(raw)
            except TypeError:
                pass
        raise TypeError(
            f"{type(self.policy).__name__}.deactivate_wait_samples must return an int, got {raw!r}"
        )

    def cycle_remaining(self) -> int:
        """Samples the rest of the current cycle needs, this micro-step's included."""
        cfg = self.config
        return cfg.step_required_samples - self.state.cycle_requested + cfg.required_samples

    def record_collection(self, wait_s: float, waited_samples: int) -> None:
        """Record one sample collection of the trainer (see `ScheduleDriver`)."""
        if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not wait_s >= 0:
            raise ValueError(f"wait_s must be a number >= 0, got {wait_s!r}")
        if isinstance(waited_samples, bool) or not isinstance(waited_samples, int):
            raise ValueError(f"waited_samples must be an int >= 0, got {waited_samples!r}")
        if waited_samples < 0:
            raise ValueError(f"waited_samples must be an int >= 0, got {waited_samples!r}")
        self.state.wait_times.append(float(wait_s))
        self.state.wait_samples.append(waited_samples)

    def _end_cycle(self, next_activate_s: float) -> None:
        st = self.state
        st.cycles += 1
        st.wait_times.clear()
        st.wait_samples.clear()
        st.cycle_deactivate_s = 0.0
        st.cycle_requested = 0
        st.cycle_activate_s = next_activate_s

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Policy state plus the counters, as plain data."""
        st = self.state
        out: dict[str, Any] = {"format": _STATE_FORMAT, "policy": dict(self.policy.state_dict())}
        out.update({s.key: s.dump(getattr(st, s.key)) for s in _SAVED})
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned (checked with `check_driver_state`)."""
        check_driver_state(state)
        self.policy.load_state_dict(state["policy"])
        for saved in _SAVED:
            setattr(self.state, saved.key, saved.load(state))


@attrs.frozen
class _Pending:
    """An activation decision before it is carried out."""

    pending: AfterSyncResult
    activate: bool


def _with_mid_cycle(result: BeforeStepResult, mid: AfterSyncResult | None) -> BeforeStepResult:
    if mid is None:
        return result
    return attrs.evolve(
        result,
        activated_mid_cycle=mid.activated,
        mid_cycle_activate_s=mid.activate_s,
        error=result.error or mid.error,
    )


def _bounded_ids(
    name: str, chosen: Any, live: Sequence[str]
) -> tuple[tuple[str, ...], tuple[GuardRailOverride, ...]]:
    """``hybrid_replica_ids_to_activate``'s answer, bounded to live hybrid replicas."""
    if isinstance(chosen, str | bytes) or not isinstance(chosen, Iterable):
        raise TypeError(
            f"{name}.hybrid_replica_ids_to_activate must return a sequence of replica ids "
            f"or None, got {chosen!r}"
        )
    proposed = tuple(chosen)
    bad = [x for x in proposed if not isinstance(x, str)]
    if bad:
        raise TypeError(
            f"{name}.hybrid_replica_ids_to_activate must return replica ids (str), got {bad[0]!r}"
        )
    known = set(live)
    order = {rid: i for i, rid in enumerate(live)}
    kept = tuple(sorted({x for x in proposed if x in known}, key=order.__getitem__))
    applied = kept or tuple(live[:1])
    if len(applied) == len(proposed) and set(applied) == set(proposed):
        return applied, ()
    dropped = sorted(set(proposed) - known)
    why = f"not live hybrid replicas: {dropped}" if dropped else "duplicates"
    if not kept:
        why += "; nothing left, lending the first (not lending is the activation hooks' decision)"
    override = guard_override(
        "hybrid_replica_ids_to_activate", "live_hybrid_replicas", proposed, applied, why
    )
    return applied, (override,)
