"""dynsched-sim: a fully-async RL cluster simulated on virtual time, running the real core.

The simulator drives dynsched-core's reference loop (rollouter, load balancer, retrying
client, dynamic resource controller, schedule driver) and any registered policy on a
virtual-time asyncio event loop, with simulated inference replicas and a simulated
trainer. See the package README.
"""

from __future__ import annotations

from dynsched_sim._accounting import MODES, GroupAccountant, GroupUsage
from dynsched_sim._bound import (
    LowerBound,
    admissible_prompts,
    decode_rates,
    lower_bound,
    pool_throughput,
)
from dynsched_sim._heldout import HELD_OUT_FIRST_DRAW, HELD_OUT_RANGES, heldout_scenario
from dynsched_sim._models import EngineModel, HardwareModel, LLMModel, TrainerLinks, TrainerModel
from dynsched_sim._mover import ResizeCosts, SimRoleMover
from dynsched_sim._plan import (
    Candidate,
    Plan,
    PlanError,
    PlannedCandidate,
    SplitEstimate,
    memory_problem,
    plan,
    write_plan,
)
from dynsched_sim._planner import PlannerSpec, planner_enabled, trainer_memory_min_gpus
from dynsched_sim._random import random_scenario
from dynsched_sim._replica import ReplicaNotServingError, SimReplica, SimReplicaOptions
from dynsched_sim._report import (
    Aggregate,
    Spread,
    aggregate,
    compare,
    format_table,
    seeds_of,
    write_outputs,
)
from dynsched_sim._scenario import (
    PROVENANCE_LABELS,
    Configuration,
    Scenario,
    ScenarioError,
    builtin_scenarios,
    load_scenario,
    scenario_from_dict,
    scenario_to_dict,
    static_splits,
)
from dynsched_sim._sim import (
    RunResult,
    SimulationStalledError,
    run_configuration,
    run_lower_bound,
)
from dynsched_sim._staleness import (
    StalenessInputs,
    predicted_staleness,
    predicted_staleness_for,
    staleness_inputs,
)
from dynsched_sim._trainer import MemoryConservationError, SimTrainer
from dynsched_sim._verl import (
    DEFAULT_VERL_BASE,
    VERL_SCENARIO_KEYS,
    is_verl_config,
    scenario_from_verl,
    verl_key_warnings,
)
from dynsched_sim._vloop import SimulationDeadlockError, VirtualTimeEventLoop, run_virtual
from dynsched_sim._workload import LengthDistribution, PromptGroup, Workload, WorkloadModel

__version__ = "0.1.1"

__all__ = [
    "DEFAULT_VERL_BASE",
    "HELD_OUT_FIRST_DRAW",
    "HELD_OUT_RANGES",
    "MODES",
    "PROVENANCE_LABELS",
    "VERL_SCENARIO_KEYS",
    "Aggregate",
    "Candidate",
    "Configuration",
    "EngineModel",
    "GroupAccountant",
    "GroupUsage",
    "HardwareModel",
    "LLMModel",
    "LengthDistribution",
    "LowerBound",
    "MemoryConservationError",
    "Plan",
    "PlanError",
    "PlannedCandidate",
    "PlannerSpec",
    "PromptGroup",
    "ReplicaNotServingError",
    "ResizeCosts",
    "RunResult",
    "Scenario",
    "ScenarioError",
    "SimReplica",
    "SimReplicaOptions",
    "SimRoleMover",
    "SimTrainer",
    "SimulationDeadlockError",
    "SimulationStalledError",
    "SplitEstimate",
    "Spread",
    "StalenessInputs",
    "TrainerLinks",
    "TrainerModel",
    "VirtualTimeEventLoop",
    "Workload",
    "WorkloadModel",
    "admissible_prompts",
    "aggregate",
    "builtin_scenarios",
    "compare",
    "decode_rates",
    "format_table",
    "heldout_scenario",
    "is_verl_config",
    "load_scenario",
    "lower_bound",
    "memory_problem",
    "plan",
    "planner_enabled",
    "pool_throughput",
    "predicted_staleness",
    "predicted_staleness_for",
    "random_scenario",
    "run_configuration",
    "run_lower_bound",
    "run_virtual",
    "scenario_from_dict",
    "scenario_from_verl",
    "scenario_to_dict",
    "seeds_of",
    "staleness_inputs",
    "static_splits",
    "trainer_memory_min_gpus",
    "verl_key_warnings",
    "write_outputs",
    "write_plan",
]
