"""`check_policy`: hypothesis conformance properties for any scheduling policy.

Usable from any project's pytest suite::

    from dynsched_core.testing import check_policy

    def test_my_policy_conforms():
        check_policy(MyPolicy)                                  # a zero-argument factory
        check_policy(lambda: MyPolicy(ratio=0.7), max_examples=200)

A violated property raises `PolicyConformanceError` (an `AssertionError`) whose message
names the property, the policy, the smallest input hypothesis found and the policy API
version (`dynsched_core.POLICY_API_VERSION`) the policy was checked against. A passing check
returns a `ConformanceReport` that records that version.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky

from dynsched_core import _decide as d
from dynsched_core._context import DynamicScheduleContext
from dynsched_core._contract import POLICY_API_VERSION
from dynsched_core._policy import DynamicSchedulePolicyBase
from dynsched_core.testing import _strategies as gen

__all__ = ["POLICY_PROPERTIES", "ConformanceReport", "PolicyConformanceError", "check_policy"]

logger = logging.getLogger(__name__)

#: The properties `check_policy` verifies, by the name used in its failure messages.
POLICY_PROPERTIES: Mapping[str, str] = {
    "construct": "the factory returns a DynamicSchedulePolicyBase instance without raising",
    "no_raise": "every policy call accepts every valid context (and any history) without raising",
    "return_types": (
        "should_deactivate/should_activate_after_step return bool, deactivate_wait_samples "
        "returns int, request_rebalance returns bool or None, update_after_step returns None, "
        "state_dict returns a mapping with str keys that can be deep-copied"
    ),
    "wait_threshold_bounds": (
        "0 <= deactivate_wait_samples(ctx) <= ctx.step_required_samples + ctx.buffer_samples"
    ),
    "deterministic": "two policies from the factory fed the same calls make the same decisions",
    "state_dict_round_trip": (
        "state_dict() is a snapshot; a fresh policy loaded with it reports the same state and "
        "then makes the same decisions as the original on the same inputs"
    ),
    "only_hybrid_no_deadlock": (
        "with only_hybrid contexts (no standalone replica) a simulated colocated run, with "
        "the policy's decisions bounded by the driver's guard rails as in a real run, never "
        "needs samples that nothing can produce"
    ),
}

PolicyFactory = Callable[[], DynamicSchedulePolicyBase]


class PolicyConformanceError(AssertionError):
    """A policy violated one of the `POLICY_PROPERTIES`.

    Attributes:
        property_name: Key of the violated property in `POLICY_PROPERTIES`.
        policy: Label of the policy under test.
        detail: What happened.
        policy_api_version: The policy API version the policy was checked against.
    """

    def __init__(self, policy: str, property_name: str, detail: str) -> None:
        super().__init__(
            f"check_policy({policy}): property {property_name!r} failed: {detail}\n"
            f"  property: {POLICY_PROPERTIES.get(property_name, property_name)}\n"
            f"  checked against dynsched policy API {POLICY_API_VERSION}"
        )
        self.policy = policy
        self.property_name = property_name
        self.detail = detail
        self.policy_api_version = POLICY_API_VERSION


@attrs.frozen
class ConformanceReport:
    """What `check_policy` verified.

    Attributes:
        policy: Label of the policy checked.
        policy_api_version: The policy API version (`dynsched_core.POLICY_API_VERSION`)
            the policy was checked against: the contract its hooks were called through.
        core_version: The dynsched-core version that ran the check.
        properties: Names of the properties that hold (keys of `POLICY_PROPERTIES`).
        max_examples: Examples per hypothesis search.
        colocated_factory: Whether a colocated factory was checked too.
    """

    policy: str
    policy_api_version: str
    core_version: str
    properties: tuple[str, ...]
    max_examples: int
    colocated_factory: bool = False

    def __str__(self) -> str:
        return (
            f"{self.policy} conforms to dynsched policy API {self.policy_api_version} "
            f"(dynsched-core {self.core_version}; {len(self.properties)} properties, "
            f"{self.max_examples} examples per search)"
        )


# ----------------------------------------------------------------------------------
# A checking proxy: every call is guarded and its result validated.
# ----------------------------------------------------------------------------------
def _short(ctx: DynamicScheduleContext) -> str:
    return repr(ctx)


class _Probe(DynamicSchedulePolicyBase):
    """Wraps a policy; turns exceptions and bad results into `PolicyConformanceError`."""

    def __init__(self, inner: DynamicSchedulePolicyBase, label: str) -> None:
        self.inner = inner
        self.label = label

    def _fail(self, prop: str, detail: str) -> PolicyConformanceError:
        return PolicyConformanceError(self.label, prop, detail)

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.inner, method)(*args)
        except PolicyConformanceError:
            raise
        except Exception as exc:
            shown = ", ".join(
                _short(a) if isinstance(a, DynamicScheduleContext) else repr(a) for a in args
            )
            raise self._fail("no_raise", f"{method}({shown}) raised {exc!r}") from exc

    def _bool(self, method: str, *args: Any) -> bool:
        """Call ``method`` and check that it returned a bool."""
        value = self._call(method, *args)
        if not isinstance(value, bool):
            raise self._fail(
                "return_types", f"{method} returned {value!r} ({type(value).__name__}), not bool"
            )
        return value

    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return self._bool("should_deactivate", global_steps, is_hybrid_active, ctx)

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        value = self._call("deactivate_wait_samples", ctx)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(
                "return_types",
                f"deactivate_wait_samples returned {value!r} ({type(value).__name__}), not int",
            )
        hi = ctx.step_required_samples + ctx.buffer_samples
        if not 0 <= value <= hi:
            raise self._fail(
                "wait_threshold_bounds",
                f"deactivate_wait_samples returned {value}, outside [0, {hi}] "
                f"(step_required_samples={ctx.step_required_samples}, "
                f"buffer_samples={ctx.buffer_samples}) for {_short(ctx)}",
            )
        return value

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return self._bool("should_activate_after_step", global_steps, is_hybrid_active, ctx)

    def request_rebalance(self, global_steps: int, ctx: DynamicScheduleContext) -> bool | None:
        value = self._call("request_rebalance", global_steps, ctx)
        if value is not None and not isinstance(value, bool):
            raise self._fail(
                "return_types",
                f"request_rebalance returned {value!r} ({type(value).__name__}), not bool/None",
            )
        return value

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:
        value = self._call("update_after_step", global_steps, ctx)
        if value is not None:
            raise self._fail("return_types", f"update_after_step returned {value!r}, not None")

    def state_dict(self) -> dict[str, Any]:
        value = self._call("state_dict")
        if not isinstance(value, Mapping):
            raise self._fail(
                "return_types", f"state_dict returned {type(value).__name__}, not a mapping"
            )
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise self._fail("return_types", f"state_dict has non-str keys {bad!r}")
        try:
            return dict(copy.deepcopy(value))
        except Exception as exc:
            raise self._fail(
                "return_types", f"state_dict() cannot be deep-copied: {exc!r}"
            ) from exc

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        try:
            self.inner.load_state_dict(state)
        except Exception as exc:
            raise self._fail(
                "state_dict_round_trip",
                f"load_state_dict(state_dict()) raised {exc!r} for state {state!r}",
            ) from exc


def _make(factory: PolicyFactory, label: str) -> _Probe:
    try:
        policy = factory()
    except Exception as exc:
        raise PolicyConformanceError(label, "construct", f"the factory raised {exc!r}") from exc
    if not isinstance(policy, DynamicSchedulePolicyBase):
        raise PolicyConformanceError(
            label, "construct", f"the factory returned {policy!r}, not a DynamicSchedulePolicyBase"
        )
    return _Probe(policy, label)


def _first_difference(a: Sequence[gen.PolicyStep], b: Sequence[gen.PolicyStep]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return f"step #{i}: {x} vs {y}"
    return "(no difference)"  # pragma: no cover - only called when a != b


def _check_round_trip(
    factory: PolicyFactory, label: str, steps: Sequence[gen.StepInput], split: int, active: bool
) -> None:
    """Checkpoint after ``steps[:split]``, restore into a fresh policy, compare the rest."""
    original = _make(factory, label)
    head = gen.drive_steps(original, steps[:split], active)
    mid_active = head[-1].is_active_after if head else active
    raw_state = original.inner.state_dict()
    state = original.state_dict()
    restored = _make(factory, label)
    restored.load_state_dict(copy.deepcopy(state))
    if restored.state_dict() != state:
        raise restored._fail(
            "state_dict_round_trip",
            f"after load_state_dict(s) state_dict() is {restored.state_dict()!r}, s was {state!r}",
        )
    rest_o = gen.drive_steps(original, steps[split:], mid_active)
    rest_r = gen.drive_steps(restored, steps[split:], mid_active)
    if rest_o != rest_r:
        raise restored._fail(
            "state_dict_round_trip",
            f"a policy restored after {split} step(s) decided differently from the original at "
            + _first_difference(rest_o, rest_r),
        )
    if dict(raw_state) != state:
        raise original._fail(
            "state_dict_round_trip",
            "state_dict() returned live objects that later steps changed (return a copy): "
            f"{state!r} became {dict(raw_state)!r}",
        )


# ----------------------------------------------------------------------------------
# Colocated run: the driver's own core, performed on a counts-only model.
# ----------------------------------------------------------------------------------
def _model_settings(base: DynamicScheduleContext) -> d.CoreSettings:
    """The `CoreSettings` of a colocated deployment, taken from a context."""
    return d.CoreSettings(
        use_dynamic_resource_scheduling=True,
        required_samples=base.required_samples,
        trigger_parameter_sync_step=base.trigger_parameter_sync_step,
        step_required_samples=base.step_required_samples,
        buffer_samples=base.buffer_samples,
        standalone_gpus=0,
        hybrid_gpus=base.hybrid_gpus,
        dynamic_schedule_enable_rebalance=True,
        dynamic_schedule_min_deactivate_ratio=base.min_deactivate_ratio,
        dynamic_schedule_max_deactivate_ratio=base.max_deactivate_ratio,
    )


class _ColocatedRun:
    """The driver's `DriverCore` run on a counts-only model with hybrid replicas only.

    The decisions, their order and the guard rails are the driver's own (the core is the
    one the asyncio driver runs); this model only performs the core's actions. While
    active, hybrid replicas produce exactly what is waited for (the least a real run
    produces), within the staleness window ``step_required + buffer`` per weight version;
    while asleep nothing is produced. Each micro-step the trainer takes
    ``required_samples``; after ``T`` of them the weights are synced.
    """

    SECONDS_PER_SAMPLE = 0.5
    SWITCH_S = 2.0

    def __init__(
        self, probe: _Probe, base: DynamicScheduleContext, cycles: int, start_active: bool
    ) -> None:
        self.p = probe
        self.base = base
        self.cycles = cycles
        self.R = base.required_samples
        self.T = base.trigger_parameter_sync_step
        self.window = base.step_required_samples + base.buffer_samples
        self.hybrid = tuple(f"h{i}" for i in range(max(1, base.num_hybrid_replicas)))
        self.core = d.DriverCore(probe, _model_settings(base))
        self.active = start_active
        self.queue = self.generated = self.admitted = 0
        self.now = 0.0
        self.g = self._waited = 0
        self.trace: list[str] = []

    def produce_until(self, target: int) -> int:
        if not self.active or self.queue >= target:
            return 0
        n = max(0, min(target - self.queue, self.window - self.admitted))
        self.queue += n
        self.generated += n
        self.admitted += n
        self.now += n * self.SECONDS_PER_SAMPLE
        return n

    def deadlock(self, why: str) -> PolicyConformanceError:
        trace = "; ".join(self.trace[-8:])
        return self.p._fail(
            "only_hybrid_no_deadlock",
            f"colocated run (required_samples={self.R}, trigger_parameter_sync_step={self.T}, "
            f"buffer_samples={self.base.buffer_samples}) deadlocks at global step {self.g}: "
            f"{why}. Last decisions: {trace}",
        )

    def _switch(self, active: bool, value: Any = True) -> d.Switched:
        start, self.active = self.now, active
        return d.Switched(
            value=value,
            started=start,
            ended=start + self.SWITCH_S,
            is_hybrid_active=active,
            active_hybrid=len(self.hybrid) if active else 0,
        )

    def perform(self, action: d.Action) -> d.Outcome:
        """Carry out one action of the core on the model."""
        if isinstance(action, d.Observe):
            return d.Observation(
                produced=self.generated,
                queue_size=self.queue,
                now=self.now,
                hybrid_ids=self.hybrid,
                hybrid_nodes=("",) * len(self.hybrid),
                active_hybrid=len(self.hybrid) if self.active else 0,
                is_hybrid_active=self.active,
            )
        if isinstance(action, d.WaitForSamples):
            return self._wait(action.target)
        if isinstance(action, d.Activate):
            self.trace.append(f"g={self.g} activate")
            return self._switch(True)
        if isinstance(action, d.Deactivate):
            return self._switch(False, value=self.active)
        if isinstance(action, d.Rebalance):
            return self._switch(self.active, value=None)
        return d.Ack()

    def _wait(self, target: int) -> d.Waited:
        start = self.now
        produced = self.produce_until(target)
        self.trace.append(f"g={self.g} deactivate after {target} buffered")
        if self.queue < target:
            raise self.deadlock(
                f"deactivate_wait_samples={target} but only {self.queue} sample(s) can be "
                "buffered (hybrid replicas "
                + ("exhausted the staleness window)" if self.active else "asleep)")
            )
        self._waited += produced
        return d.Waited(buffered=self.queue, started=start, ended=self.now)

    def drive(self, command: d.BeforeStep | d.AfterSync | d.InitialActivation) -> None:
        action = self.core.step(command)
        while not isinstance(action, d.Done):
            action = self.core.step(self.perform(action))

    def train(self, last: bool) -> None:
        """One micro-step: the driver's decisions, then the trainer takes its samples."""
        self._waited = 0
        self.drive(d.BeforeStep(global_steps=self.g, is_last_step=last))
        produced = self._waited + self.produce_until(self.R)
        if self.queue < self.R:
            raise self.deadlock(
                f"the trainer needs {self.R} sample(s), {self.queue} buffered, and "
                + (
                    "the staleness window is exhausted"
                    if self.active
                    else "the hybrid replicas are asleep (nothing else produces)"
                )
            )
        self.queue -= self.R
        self.core.record_collection(produced * self.SECONDS_PER_SAMPLE, produced)
        self.now += 1.0

    def run(self) -> None:
        if not self.active:  # the initial weight sync of the run
            self.drive(d.InitialActivation(version=0))
        for cycle in range(self.cycles):
            for micro in range(self.T):
                self.g += 1
                self.train(last=cycle == self.cycles - 1 and micro == self.T - 1)
            self.admitted = 0
            self.drive(
                d.AfterSync(
                    global_steps=self.g, version=cycle + 1, is_last_step=cycle == self.cycles - 1
                )
            )


# ----------------------------------------------------------------------------------
# check_policy
# ----------------------------------------------------------------------------------
def _label(factory: Callable[..., Any]) -> str:
    name = getattr(factory, "__qualname__", None) or getattr(factory, "__name__", None)
    return str(name) if name else repr(factory)


def _run_settings(parent: settings, examples: int, shrink: bool) -> settings:
    return settings(
        parent,
        max_examples=examples,
        deadline=None,
        database=None,
        report_multiple_bugs=False,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
        + ([Phase.shrink] if shrink else []),
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


def _single_calls(factory: PolicyFactory, label: str, run: settings) -> Callable[[], None]:
    """After an arbitrary history, every method with an arbitrary valid context."""

    @run
    @given(
        history=gen.step_sequences(max_size=3, max_required_samples=64),
        g=gen.global_steps(),
        active=st.booleans(),
        ctx=gen.contexts(),
    )
    def single_calls(
        history: list[gen.StepInput], g: int, active: bool, ctx: DynamicScheduleContext
    ) -> None:
        probe = _make(factory, label)
        gen.drive_steps(probe, history)
        probe.state_dict()
        probe.should_deactivate(g, active, ctx)
        probe.deactivate_wait_samples(ctx)
        probe.should_activate_after_step(g, active, ctx)
        probe.request_rebalance(g, ctx)
        probe.update_after_step(g, ctx)
        probe.state_dict()

    return single_calls


def _sequences(factory: PolicyFactory, label: str, run: settings) -> Callable[[], None]:
    """Two policies agree; a policy restored at any point agrees with the original."""

    @run
    @given(steps=gen.step_sequences(min_size=1, max_size=6), active=st.booleans())
    def sequences(steps: list[gen.StepInput], active: bool) -> None:
        a, b = _make(factory, label), _make(factory, label)
        ra, rb = gen.drive_steps(a, steps, active), gen.drive_steps(b, steps, active)
        if ra != rb:
            raise a._fail(
                "deterministic",
                "two fresh policies fed the same calls decided differently at "
                + _first_difference(ra, rb),
            )
        if a.state_dict() != b.state_dict():
            raise a._fail(
                "deterministic",
                f"two fresh policies fed the same calls ended in different states: "
                f"{a.state_dict()!r} vs {b.state_dict()!r}",
            )
        for split in range(len(steps) + 1):
            _check_round_trip(factory, label, steps, split, active)

    return sequences


def _colocated(factories: Sequence[tuple[PolicyFactory, str]], run: settings) -> Callable[[], None]:
    """Colocated runs of the driver's core never wait for what nothing can produce."""

    @run
    @given(
        base=gen.colocated_contexts(max_required_samples=64, max_sync_steps=4),
        cycles=st.integers(1, 4),
        start_active=st.booleans(),
    )
    def colocated(base: DynamicScheduleContext, cycles: int, start_active: bool) -> None:
        for f, lab in factories:
            _ColocatedRun(_make(f, lab), base, cycles, start_active).run()

    return colocated


def _search(search: Callable[[], None], label: str) -> None:
    """Run one hypothesis search; a flaky example means a non-deterministic policy."""
    try:
        search()
    except Flaky as exc:
        raise PolicyConformanceError(
            label,
            "deterministic",
            f"hypothesis saw the same example pass once and fail once ({exc!r}): the policy "
            "does not decide deterministically",
        ) from exc


def check_policy(
    factory: PolicyFactory,
    *,
    max_examples: int | None = None,
    colocated_factory: PolicyFactory | None = None,
    name: str | None = None,
    shrink: bool = True,
) -> ConformanceReport:
    """Check a scheduling policy against the `POLICY_PROPERTIES` with hypothesis.

    Runs three hypothesis searches, each with ``max_examples`` examples:

    * single calls: after an arbitrary history, every method is called with an arbitrary
      valid context (``no_raise``, ``return_types``, ``wait_threshold_bounds``);
    * call sequences in the driver's order: two policies agree (``deterministic``); a
      policy restored from ``state_dict()`` at any point keeps agreeing with the original
      (``state_dict_round_trip``);
    * colocated runs: the driver's own decision sequence (`DriverCore`, guard rails
      included) performed on a counts-only model with hybrid replicas only (started
      asleep with an initial activation, or started active), must never wait for
      samples that nothing can produce (``only_hybrid_no_deadlock``).

    Call it from a plain test function (not from inside another ``@given`` test).

    Args:
        factory: Zero-argument callable returning a *fresh* policy each call, e.g. the
            class itself, ``functools.partial(MyPolicy, ratio=0.5)`` or
            ``lambda: build_policy("my_policy")``.
        max_examples: Examples per search; default: the active hypothesis profile's
            ``max_examples``.
        colocated_factory: Optional factory of the policy as configured for a colocated
            deployment (e.g. ``partial(MyPolicy, only_hybrid=True)``); it is checked in
            the colocated runs in addition to ``factory``.
        name: Label used in failure messages (default: the factory's name).
        shrink: Let hypothesis shrink a failing input to a minimal one (the default).
            Shrinking can take tens of seconds; with False the failure is reported at
            once with the first failing input found.

    Returns:
        A `ConformanceReport` naming the policy API version the policy was checked
        against (``report.policy_api_version``), the properties and the example count.

    Raises:
        PolicyConformanceError: a property failed; the message names the property, the
            smallest failing input and the policy API version.
    """
    label = name or _label(factory)
    _make(factory, label)  # fail fast and clearly when the factory itself is broken
    factories = [(factory, label)]
    if colocated_factory is not None:
        factories.append((colocated_factory, f"{label} [colocated_factory]"))
        _make(*factories[1])
    parent = settings()  # the active hypothesis profile
    examples = max_examples if max_examples is not None else parent.max_examples
    run = _run_settings(parent, examples, shrink)
    for search in (_single_calls(factory, label, run), _sequences(factory, label, run)):
        _search(search, label)
    _search(_colocated(factories, run), label)

    from dynsched_core import __version__

    report = ConformanceReport(
        policy=label,
        policy_api_version=POLICY_API_VERSION,
        core_version=__version__,
        properties=tuple(POLICY_PROPERTIES),
        max_examples=examples,
        colocated_factory=colocated_factory is not None,
    )
    logger.info("check_policy: %s", report)
    return report
