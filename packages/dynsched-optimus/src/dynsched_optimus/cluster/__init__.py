"""Cluster simulator for Optimus-style scheduling (see ``docs/cluster.md``).

Discrete-time simulation of parameter-server jobs (synthetic, the Optimus paper's
step-time model) and all-reduce GPU jobs (the vendored Pollux workloads and profiles)
under FIFO, DRF, Tetris, SRTF, Tiresias, Optimus, Optimus+Oracle, ``optimus+`` and
Pollux (``pollux``); jobs replaying what real jobs measured (:class:`MeasuredJob`) under
the decision loop of ``dynsched optimus serve`` (:class:`ServiceLoop`,
:func:`simulate_measured`).
"""

from __future__ import annotations

from ._data import (
    POLLUX_ENV_VAR,
    GpuJobSpec,
    ModelProfile,
    PolluxDataError,
    find_pollux_data,
    load_profiles,
    load_workload,
)
from ._jobs import GpuJob, PSJob, PSJobOptions, PSJobType, PSLossCurve, SimJob
from ._measured import (
    JobProfile,
    MeasuredJob,
    ServiceLoop,
    ServiceTestbed,
    load_job_profiles,
    simulate_measured,
)
from ._pollux import (
    BatchRange,
    PolluxOptions,
    PolluxProblem,
    PolluxScheduler,
    ThroughputParams,
    fit_throughput,
    genetic_search,
    goodput_grid,
)
from ._report import format_table, plot_results, result_to_dict, write_result
from ._run import (
    PS_JOB_BLOCKS,
    PS_JOB_TYPES,
    gpu_jobs,
    paper_ps_workload,
    ps_imbalance,
    run_pollux,
    run_ps,
    simulate,
)
from ._schedulers import (
    SCHEDULERS,
    DRFScheduler,
    FIFOScheduler,
    FixedDRFScheduler,
    OptimusScheduler,
    SRTFScheduler,
    TetrisScheduler,
    TiresiasScheduler,
    make_scheduler,
)
from ._sim import ClusterScheduler, ClusterState, OverCommitError, SimResult, Simulator
from ._spec import RESOURCES, ClusterSpec, NodeSpec, Placement, SimConfig

__all__ = [
    "POLLUX_ENV_VAR",
    "PS_JOB_BLOCKS",
    "PS_JOB_TYPES",
    "RESOURCES",
    "SCHEDULERS",
    "BatchRange",
    "ClusterScheduler",
    "ClusterSpec",
    "ClusterState",
    "DRFScheduler",
    "FIFOScheduler",
    "FixedDRFScheduler",
    "GpuJob",
    "GpuJobSpec",
    "JobProfile",
    "MeasuredJob",
    "ModelProfile",
    "NodeSpec",
    "OptimusScheduler",
    "OverCommitError",
    "PSJob",
    "PSJobOptions",
    "PSJobType",
    "PSLossCurve",
    "Placement",
    "PolluxDataError",
    "PolluxOptions",
    "PolluxProblem",
    "PolluxScheduler",
    "SRTFScheduler",
    "ServiceLoop",
    "ServiceTestbed",
    "SimConfig",
    "SimJob",
    "SimResult",
    "Simulator",
    "TetrisScheduler",
    "ThroughputParams",
    "TiresiasScheduler",
    "find_pollux_data",
    "fit_throughput",
    "format_table",
    "genetic_search",
    "goodput_grid",
    "gpu_jobs",
    "load_job_profiles",
    "load_profiles",
    "load_workload",
    "make_scheduler",
    "paper_ps_workload",
    "plot_results",
    "ps_imbalance",
    "result_to_dict",
    "run_pollux",
    "run_ps",
    "simulate",
    "simulate_measured",
    "write_result",
]
