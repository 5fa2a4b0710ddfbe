"""Hypothesis strategies for policy authors: valid contexts and driver-ordered steps.

Every context these strategies produce passes `DynamicScheduleContext`'s validators, and
they deliberately reach the corners a policy must survive: empty wait histories, zero
waited samples with positive wait time (and the reverse), negative and huge surpluses,
zero buffer, a single micro-step per cycle, colocated deployments.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
from hypothesis import strategies as st

from dynsched_core._context import DynamicScheduleContext
from dynsched_core._policy import DynamicSchedulePolicyBase

__all__ = [
    "PolicyStep",
    "StepInput",
    "colocated_contexts",
    "contexts",
    "drive_step",
    "drive_steps",
    "global_steps",
    "step_sequences",
]

_SECONDS = st.floats(min_value=0.0, max_value=1e5)


def global_steps(max_value: int = 100_000) -> st.SearchStrategy[int]:
    """Training step numbers as the driver passes them (``0`` is the initial sync)."""
    return st.integers(min_value=0, max_value=max_value)


@attrs.frozen
class _Deployment:
    """The fields of a context that stay fixed during a run."""

    required: int
    sync_steps: int
    buffer: int
    colocated: bool
    n_standalone: int
    n_hybrid: int
    gpus_per_replica: int
    ratio_range: tuple[float, float] = (0.0, 1.0)


#: Guard-rail deactivate ratio ranges a deployment may configure (mostly the default).
_RATIO_RANGES = st.sampled_from([(0.0, 1.0), (0.0, 1.0), (0.0, 1.0), (0.2, 0.8), (0.5, 0.5)])


@st.composite
def _deployments(
    draw: st.DrawFn, only_hybrid: bool | None, max_required_samples: int, max_sync_steps: int
) -> _Deployment:
    required = draw(st.integers(min_value=1, max_value=max_required_samples))
    sync_steps = draw(st.integers(min_value=1, max_value=max_sync_steps))
    colocated = draw(st.booleans()) if only_hybrid is None else only_hybrid
    return _Deployment(
        required=required,
        sync_steps=sync_steps,
        buffer=draw(st.integers(min_value=0, max_value=2 * required * sync_steps)),
        colocated=colocated,
        n_standalone=0 if colocated else draw(st.integers(min_value=0, max_value=64)),
        n_hybrid=draw(st.integers(min_value=1 if colocated else 0, max_value=64)),
        gpus_per_replica=draw(st.integers(min_value=1, max_value=8)),
        ratio_range=draw(_RATIO_RANGES),
    )


@st.composite
def _observed(draw: st.DrawFn, dep: _Deployment, max_collections: int) -> DynamicScheduleContext:
    """A context of deployment ``dep`` with arbitrary observations."""
    step_required = dep.required * dep.sync_steps
    # surplus = generated - expected: behind demand, exactly at a boundary, or far ahead
    surplus = draw(
        st.one_of(
            st.integers(min_value=-2 * step_required, max_value=3 * step_required),
            st.sampled_from([0, step_required, -step_required]),
            st.integers(min_value=-(10**9), max_value=10**9),
        )
    )
    expected = max(0, -surplus) + draw(st.integers(min_value=0, max_value=10**7))
    waits = draw(
        st.lists(
            st.tuples(_SECONDS, st.integers(min_value=0, max_value=2 * dep.required)),
            max_size=max_collections,
        )
    )
    return DynamicScheduleContext(
        required_samples=dep.required,
        trigger_parameter_sync_step=dep.sync_steps,
        total_generated_samples=expected + surplus,
        expected_samples=expected,
        buffer_samples=dep.buffer,
        step_wait_times=tuple(w for w, _ in waits),
        step_wait_samples=tuple(s for _, s in waits),
        only_hybrid=dep.colocated,
        last_activate_duration_s=draw(_SECONDS),
        last_deactivate_duration_s=draw(_SECONDS),
        queue_size=draw(st.integers(min_value=0, max_value=step_required + dep.buffer)),
        num_standalone_replicas=dep.n_standalone,
        num_hybrid_replicas=dep.n_hybrid,
        standalone_gpus=dep.n_standalone * dep.gpus_per_replica,
        hybrid_gpus=dep.n_hybrid * dep.gpus_per_replica,
        producer_finished=draw(st.booleans()),
        is_last_step=draw(st.booleans()),
        param_version=draw(st.integers(min_value=0, max_value=10**6)),
        now=draw(st.floats(min_value=0.0, max_value=1e7)),
        min_deactivate_ratio=dep.ratio_range[0],
        max_deactivate_ratio=dep.ratio_range[1],
    )


def contexts(
    *,
    only_hybrid: bool | None = None,
    max_required_samples: int = 512,
    max_sync_steps: int = 8,
    max_collections: int = 8,
) -> st.SearchStrategy[DynamicScheduleContext]:
    """Valid `DynamicScheduleContext` snapshots.

    Args:
        only_hybrid: Fix the deployment: True for colocated contexts (no standalone
            replica), False for mixed ones, None (default) for both.
        max_required_samples: Upper bound of ``required_samples``.
        max_sync_steps: Upper bound of ``trigger_parameter_sync_step``.
        max_collections: Upper bound of the number of sample collections
            (``len(step_wait_times)``) in the cycle.

    Example::

        from hypothesis import given
        from dynsched_core.testing import contexts

        @given(contexts())
        def test_threshold_in_range(ctx):
            assert 0 <= MyPolicy().deactivate_wait_samples(ctx) <= ctx.step_required_samples
    """
    return _deployments(only_hybrid, max_required_samples, max_sync_steps).flatmap(
        lambda dep: _observed(dep, max_collections)
    )


def colocated_contexts(
    *, max_required_samples: int = 512, max_sync_steps: int = 8, max_collections: int = 8
) -> st.SearchStrategy[DynamicScheduleContext]:
    """`contexts` of colocated deployments (``only_hybrid=True``, no standalone replica)."""
    return contexts(
        only_hybrid=True,
        max_required_samples=max_required_samples,
        max_sync_steps=max_sync_steps,
        max_collections=max_collections,
    )


@attrs.frozen
class StepInput:
    """What the driver shows a policy during one training step.

    Attributes:
        global_steps: The step number passed to every call of the step.
        before: Context of the before-training calls (`should_deactivate`,
            `deactivate_wait_samples`).
        after: Context of the after-weight-sync calls (`should_activate_after_step`,
            `request_rebalance`, `update_after_step`).
    """

    global_steps: int
    before: DynamicScheduleContext
    after: DynamicScheduleContext


@attrs.frozen
class PolicyStep:
    """The decisions a policy made during one step run by `drive_step`.

    ``deactivate_wait_samples`` is None when it was not called (no deactivation) and
    ``rebalance_called`` tells whether `request_rebalance` ran (only after an
    activation).
    """

    global_steps: int
    was_active: bool
    should_deactivate: bool
    deactivate_wait_samples: int | None
    should_activate: bool
    rebalance_called: bool
    request_rebalance: bool | None
    is_active_after: bool


@st.composite
def _step_sequences(
    draw: st.DrawFn,
    min_size: int,
    max_size: int,
    only_hybrid: bool | None,
    max_required_samples: int,
    max_sync_steps: int,
    max_collections: int,
) -> list[StepInput]:
    dep = draw(_deployments(only_hybrid, max_required_samples, max_sync_steps))
    ctxs = _observed(dep, max_collections)
    n = draw(st.integers(min_value=min_size, max_value=max_size))
    step = draw(st.integers(min_value=0, max_value=3))
    out: list[StepInput] = []
    for _ in range(n):
        out.append(StepInput(step, draw(ctxs), draw(ctxs)))
        step += draw(st.integers(min_value=1, max_value=2))
    return out


def step_sequences(
    *,
    min_size: int = 0,
    max_size: int = 8,
    only_hybrid: bool | None = None,
    max_required_samples: int = 512,
    max_sync_steps: int = 8,
    max_collections: int = 8,
) -> st.SearchStrategy[list[StepInput]]:
    """Lists of `StepInput` with increasing ``global_steps``, as in one run.

    The deployment (``required_samples``, ``trigger_parameter_sync_step``,
    ``buffer_samples``, replica and GPU counts, ``only_hybrid``) is drawn once per
    sequence; the observations (counts, waits, switch durations, queue size, flags)
    change freely from one context to the next.

    Args:
        min_size: Fewest steps.
        max_size: Most steps.
        only_hybrid: Deployment of every context (None: drawn once per sequence).
        max_required_samples: As in `contexts`.
        max_sync_steps: As in `contexts`.
        max_collections: As in `contexts`.
    """
    return _step_sequences(
        min_size, max_size, only_hybrid, max_required_samples, max_sync_steps, max_collections
    )


def drive_step(
    policy: DynamicSchedulePolicyBase, step: StepInput, is_hybrid_active: bool
) -> PolicyStep:
    """Run one step's policy calls in the driver's order and record the decisions.

    Order: `should_deactivate` (before training) -> `deactivate_wait_samples` if it
    said yes -> `should_activate_after_step` (after the weight sync) ->
    `request_rebalance` if it said yes -> `update_after_step`. The hybrid state follows
    the decisions (deactivated if asked, activated if asked).
    """
    g = step.global_steps
    deactivate = policy.should_deactivate(g, is_hybrid_active, step.before)
    wait = policy.deactivate_wait_samples(step.before) if deactivate else None
    active = is_hybrid_active and not deactivate
    activate = policy.should_activate_after_step(g, active, step.after)
    rebalance = policy.request_rebalance(g, step.after) if activate else None
    policy.update_after_step(g, step.after)
    return PolicyStep(
        global_steps=g,
        was_active=is_hybrid_active,
        should_deactivate=deactivate,
        deactivate_wait_samples=wait,
        should_activate=activate,
        rebalance_called=activate,
        request_rebalance=rebalance,
        is_active_after=active or activate,
    )


def drive_steps(
    policy: DynamicSchedulePolicyBase, steps: Sequence[StepInput], is_hybrid_active: bool = False
) -> list[PolicyStep]:
    """`drive_step` over ``steps``, carrying the hybrid state from one step to the next."""
    records: list[PolicyStep] = []
    for step in steps:
        rec = drive_step(policy, step, is_hybrid_active)
        is_hybrid_active = rec.is_active_after
        records.append(rec)
    return records
