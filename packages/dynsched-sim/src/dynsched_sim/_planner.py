"""The role planner in simulated runs: its settings, the memory floor, the wiring.

`run_configuration(..., planner=RolePlannerOptions(...))` (or ``planner=True`` for the
defaults) runs the configuration with a `dynsched_core.planner.RolePlanner` on top of
its policy, moving GPUs through a `SimRoleMover`. `planner_enabled` turns the planner on
for every run in a ``with`` block that does not say otherwise (``dynsched simulate
--planner``: the comparison's runs, statics included, all re-planned).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator

import attrs
from dynsched_core import DynamicScheduleConfig
from dynsched_core.planner import RolePlanner, RolePlannerOptions

from dynsched_sim._cluster import SimCluster
from dynsched_sim._mover import ResizeCosts, SimRoleMover
from dynsched_sim._scenario import Configuration, Scenario

__all__ = [
    "PLANNER_SUFFIX",
    "PlannerSpec",
    "build_planner",
    "planned_splits",
    "planner_enabled",
    "reachable_configurations",
    "resolve",
    "trainer_memory_min_gpus",
]

#: Appended to a run's policy name when a planner re-planned it (``default+planner``).
PLANNER_SUFFIX = "+planner"

_GIB = float(2**30)


@attrs.frozen(kw_only=True)
class PlannerSpec:
    """A planner for simulated runs: its options and what moves cost.

    Attributes:
        options: Planner settings (``trainer_memory_min_gpus`` is raised to the
            scenario's memory floor, `trainer_memory_min_gpus`).
        costs: Costs of a move in the simulator.
    """

    options: RolePlannerOptions = attrs.field(factory=RolePlannerOptions)
    costs: ResizeCosts = attrs.field(factory=ResizeCosts)


_ENABLED: contextvars.ContextVar[PlannerSpec | None] = contextvars.ContextVar(
    "dynsched_sim_planner", default=None
)


@contextlib.contextmanager
def planner_enabled(spec: PlannerSpec | None = None) -> Iterator[PlannerSpec]:
    """Run every simulated run inside the block with a planner (``spec``: default one)."""
    spec = spec if spec is not None else PlannerSpec()
    token = _ENABLED.set(spec)
    try:
        yield spec
    finally:
        _ENABLED.reset(token)


def resolve(planner: PlannerSpec | RolePlannerOptions | bool | None) -> PlannerSpec | None:
    """The planner of a run: the argument, else the enclosing `planner_enabled` block."""
    if planner is None:
        return _ENABLED.get()
    if planner is False:
        return None
    if planner is True:
        return PlannerSpec()
    if isinstance(planner, RolePlannerOptions):
        return PlannerSpec(options=planner)
    if isinstance(planner, PlannerSpec):
        return planner
    raise TypeError(
        "planner must be None, a bool, RolePlannerOptions or PlannerSpec, got "
        f"{type(planner).__name__}"
    )


def trainer_memory_min_gpus(scenario: Scenario, hybrid: bool) -> int:
    """Fewest trainer GPUs that hold its resident state (weights, gradients, optimizer)
    and, with resident state and hybrid lending, an awake hybrid engine next to it: the
    smallest ``w`` with ``state / w (+ engine share) <= gpu memory``."""
    hw, llm, eng, tr = scenario.hardware, scenario.model, scenario.engine, scenario.trainer
    gpu = hw.gpu_memory_gib * _GIB
    room = gpu
    if hybrid and not tr.offload_state:
        room = gpu * (1.0 - eng.hybrid_memory_fraction)
    one = tr.resident_bytes_per_gpu(llm, 1)
    if room <= 0:
        return 1 << 30
    return max(1, math.ceil(one / room - 1e-9))


def _memory_floor(spec: PlannerSpec, scenario: Scenario, hybrid: bool) -> int:
    """The planner's ``trainer_memory_min_gpus``: the option raised to the scenario's."""
    return max(spec.options.trainer_memory_min_gpus, trainer_memory_min_gpus(scenario, hybrid))


def reachable_configurations(
    spec: PlannerSpec, scenario: Scenario, conf: Configuration
) -> tuple[Configuration, ...]:
    """Every split a run of ``conf`` re-planned by ``spec`` can be in, ``conf`` first.

    The planner moves whole replicas (``g = engine.gpus_per_replica`` GPUs) between the
    trainer and the standalone pool and never proposes a split below its minimums
    (`RolePlanner.candidates`): the trainer keeps at least ``max(min_trainer_gpus,
    trainer_memory_min_gpus)`` GPUs (the latter raised to the scenario's memory floor, as
    `build_planner` does) and the pool ``min_standalone_replicas`` replicas. From the
    starting split ``(t0, s0)`` (``s0 = rollout_gpus // g``) every move of any size keeps
    the trainer at ``t0 + j g`` with ``-max(0, (t0 - floor) // g) <= j <= max(0, s0 -
    min_standalone_replicas)``, and every such ``j`` is reachable one replica at a time;
    the GPUs left over by ``rollout_gpus % g`` never change role. A superset of what the
    planner's predictions (staleness bound, gains) let it choose.
    """
    g = scenario.engine.gpus_per_replica
    o = spec.options
    floor = max(o.min_trainer_gpus, _memory_floor(spec, scenario, conf.hybrid))
    t0, s0 = conf.trainer_gpus, conf.rollout_gpus // g
    low = -max(0, (t0 - floor) // g)
    high = max(0, s0 - o.min_standalone_replicas)
    out = [conf]
    for j in range(low, high + 1):
        if j:
            out.append(
                Configuration(
                    name=f"{conf.name}@{t0 + j * g}",
                    trainer_gpus=t0 + j * g,
                    rollout_gpus=conf.rollout_gpus - j * g,
                    hybrid=conf.hybrid,
                )
            )
    return tuple(out)


def planned_splits(
    scenario: Scenario,
    conf: Configuration,
    planner: PlannerSpec | RolePlannerOptions | bool | None = None,
) -> tuple[Configuration, ...]:
    """The splits a run of ``conf`` can be in when re-planned (`resolve` ``planner``: the
    argument, else the enclosing `planner_enabled` block), for `lower_bound`'s
    ``splits``; ``()`` when the run has no planner (none asked for, or the trainer GPUs
    are not whole replicas: `run_configuration` then runs without one)."""
    spec = resolve(planner)
    if spec is None or conf.trainer_gpus % scenario.engine.gpus_per_replica:
        return ()
    return reachable_configurations(spec, scenario, conf)


def build_planner(
    spec: PlannerSpec, scenario: Scenario, cluster: SimCluster, cfg: DynamicScheduleConfig
) -> tuple[RolePlanner, SimRoleMover]:
    """The planner of a run (its memory floor raised to the scenario's) and its mover
    (`SimRoleMover.bind` it to the loop)."""
    options = attrs.evolve(
        spec.options,
        trainer_memory_min_gpus=_memory_floor(spec, scenario, cluster.conf.hybrid),
    )
    return RolePlanner(options, config=cfg), SimRoleMover(cluster, spec.costs)
