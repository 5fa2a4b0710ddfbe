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
from dynsched_sim._scenario import Scenario

__all__ = [
    "PLANNER_SUFFIX",
    "PlannerSpec",
    "build_planner",
    "planner_enabled",
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


def build_planner(
    spec: PlannerSpec, scenario: Scenario, cluster: SimCluster, cfg: DynamicScheduleConfig
) -> tuple[RolePlanner, SimRoleMover]:
    """The planner of a run (its memory floor raised to the scenario's) and its mover
    (`SimRoleMover.bind` it to the loop)."""
    floor = trainer_memory_min_gpus(scenario, cluster.conf.hybrid)
    options = attrs.evolve(
        spec.options,
        trainer_memory_min_gpus=max(spec.options.trainer_memory_min_gpus, floor),
    )
    return RolePlanner(options, config=cfg), SimRoleMover(cluster, spec.costs)
