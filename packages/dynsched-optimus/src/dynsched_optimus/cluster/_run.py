"""Building workloads and running simulations."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dynsched_optimus import assign_parameters, model_blocks

from ._data import GpuJobSpec, load_profiles, load_workload
from ._jobs import GpuJob, PSJob, PSJobOptions, PSJobType, PSLossCurve, SimJob
from ._schedulers import make_scheduler
from ._sim import SimResult, Simulator
from ._spec import ClusterSpec, SimConfig

__all__ = [
    "PS_JOB_TYPES",
    "gpu_jobs",
    "paper_ps_workload",
    "run_pollux",
    "run_ps",
    "simulate",
]


def gpu_jobs(
    specs: Sequence[GpuJobSpec],
    config: SimConfig,
    root: Path | None = None,
) -> list[SimJob]:
    """Fresh :class:`GpuJob` objects for a workload (deterministic for ``config.seed``)."""
    profiles = load_profiles(root)
    ss = np.random.SeedSequence(config.seed)
    rngs = [np.random.default_rng(s) for s in ss.spawn(len(specs))]
    return [
        GpuJob(
            s,
            profiles[s.application],
            rng,
            completion=config.completion,
            speed_noise=config.speed_noise,
        )
        for s, rng in zip(specs, rngs, strict=True)
    ]


#: Columns of :data:`_PS_JOB_ROWS` (keyword arguments of :class:`PSJobType`).
_PS_JOB_COLUMNS = ("t_fwd", "t_back", "model_gb", "t_update", "delta", "delta_ps", "batch")
_PS_JOB_ROWS: dict[str, tuple[float, float, float, float, float, float, int]] = {
    "resnet-50": (0.012, 0.4, 0.1, 0.02, 0.004, 0.006, 128),
    "vgg-16": (0.02, 0.6, 0.55, 0.05, 0.004, 0.006, 128),
    "inception-bn": (0.008, 0.3, 0.045, 0.015, 0.003, 0.005, 128),
    "seq2seq": (0.01, 0.25, 0.2, 0.03, 0.004, 0.004, 256),
    "cnn-rand": (0.002, 0.05, 0.01, 0.005, 0.002, 0.003, 64),
}

#: Synthetic PS job types (step-time coefficients in seconds, model size in GB).
PS_JOB_TYPES: dict[str, PSJobType] = {
    # a row's ``batch`` is an int; mypy sees the zipped row as ``dict[str, float]``
    name: PSJobType(name, **dict(zip(_PS_JOB_COLUMNS, row, strict=True)))  # type: ignore[arg-type]
    for name, row in _PS_JOB_ROWS.items()
}


#: Architecture (dynsched-optimus model zoo) whose parameter blocks each PS job type has.
PS_JOB_BLOCKS = {
    "resnet-50": "resnet50",
    "vgg-16": "vgg16",
    "inception-bn": "inception_bn",
    "seq2seq": "bert_base",
    "cnn-rand": "resnet50",
}


@functools.lru_cache(maxsize=4096)
def ps_imbalance(job_type: str, num_ps: int, method: str) -> float:
    """Load of the busiest PS over the mean for a job type's parameter blocks.

    Uses dynsched-optimus' parameter assignment (``"paa"``, ``"mxnet"``, ``"round_robin"``)
    on the block list of the job type's architecture (:data:`PS_JOB_BLOCKS`).
    """
    blocks = model_blocks(PS_JOB_BLOCKS[job_type])
    a = assign_parameters(blocks, num_ps, method)
    return float(max(a.loads) / (sum(a.loads) / num_ps))


def paper_ps_workload(
    num_jobs: int = 30,
    *,
    seed: int = 0,
    arrival_window_s: float = 3 * 3600.0,
    imbalance: float | str = "paa",
    speed_noise: float = 0.05,
    lr_decay_share: float = 0.0,
) -> list[SimJob]:
    """A paper-like PS workload: random job types, uniform arrivals, O(1/k) losses.

    Args:
        num_jobs: number of jobs (the paper used 9 to 60).
        seed: random seed.
        arrival_window_s: arrivals uniform in ``[0, window)``.
        imbalance: a constant busiest-PS load factor, or the parameter assignment method
            (``"paa"``, ``"mxnet"``, ``"round_robin"``) whose imbalance per PS count is
            computed from the job type's parameter blocks.
        speed_noise: relative noise of measured speeds.
        lr_decay_share: share of jobs with a step learning-rate decay.
    """
    rng = np.random.default_rng(seed)
    names = sorted(PS_JOB_TYPES)
    arrivals = np.sort(rng.uniform(0.0, arrival_window_s, size=num_jobs))
    jobs: list[SimJob] = []
    children = np.random.SeedSequence(seed + 1).spawn(num_jobs)
    for i in range(num_jobs):
        jt = PS_JOB_TYPES[names[int(rng.integers(len(names)))]]
        b0 = float(rng.uniform(0.5, 3.0)) * 1e-3
        b1 = float(rng.uniform(1.0, 3.0))
        b2 = float(rng.uniform(0.02, 0.15))
        spe = int(rng.choice([100, 200, 400]))
        req = int(rng.choice([2, 4, 6, 8]))
        decay = (
            int(rng.integers(5, 20))
            if lr_decay_share > 0 and rng.uniform() < lr_decay_share
            else None
        )
        jobs.append(
            PSJob(
                f"{jt.name}-{i}",
                float(round(arrivals[i])),
                jt,
                np.random.default_rng(children[i]),
                curve=PSLossCurve(
                    b0,
                    b1,
                    b2,
                    spe,
                    delta_conv=float(rng.uniform(0.001, 0.004)),
                    lr_decay_epoch=decay,
                ),
                options=PSJobOptions(
                    requested_workers=req,
                    requested_ps=max(1, req // 2),
                    imbalance=(
                        functools.partial(ps_imbalance, jt.name, method=imbalance)
                        if isinstance(imbalance, str)
                        else imbalance
                    ),
                    speed_noise=speed_noise,
                ),
            )
        )
    return jobs


def _progress_printer(label: str, every_s: float = 6 * 3600.0) -> Callable[[float, int, int], None]:
    state = {"next": every_s}

    def cb(now: float, done: int, total: int) -> None:
        if now >= state["next"] or done == total:
            state["next"] = (math.floor(now / every_s) + 1) * every_s
            print(
                f"  [{label}] t={now / 3600:7.1f} h  done {done}/{total}",
                file=sys.stderr,
                flush=True,
            )

    return cb


def simulate(
    jobs: Sequence[SimJob],
    scheduler: str,
    *,
    cluster: ClusterSpec,
    config: SimConfig,
    progress: bool = False,
    scheduler_kwargs: dict[str, object] | None = None,
) -> SimResult:
    """Run ``jobs`` under the named scheduler."""
    sched = make_scheduler(scheduler, **(scheduler_kwargs or {}))
    cb = _progress_printer(scheduler) if progress else None
    return Simulator(cluster, jobs, sched, config, progress=cb).run()


def run_pollux(
    workload: str,
    scheduler: str,
    *,
    load: str = "1.0",
    config: SimConfig | None = None,
    progress: bool = False,
    root: Path | None = None,
    scheduler_kwargs: dict[str, object] | None = None,
) -> SimResult:
    """Run one Pollux workload (name like ``"workload-1"`` or a CSV path) on 16x4 GPUs."""
    config = config or SimConfig()
    specs = load_workload(workload, load=load, root=root)
    jobs = gpu_jobs(specs, config, root)
    return simulate(
        jobs,
        scheduler,
        cluster=ClusterSpec.pollux(),
        config=config,
        progress=progress,
        scheduler_kwargs=scheduler_kwargs,
    )


def run_ps(
    scheduler: str,
    *,
    num_jobs: int = 30,
    config: SimConfig | None = None,
    imbalance: float | str = "paa",
    progress: bool = False,
    scheduler_kwargs: dict[str, object] | None = None,
    lr_decay_share: float = 0.0,
) -> SimResult:
    """Run the paper-like PS workload on the 13-server cluster."""
    config = config or SimConfig()
    jobs = paper_ps_workload(
        num_jobs, seed=config.seed, imbalance=imbalance, lr_decay_share=lr_decay_share
    )
    return simulate(
        jobs,
        scheduler,
        cluster=ClusterSpec.paper_ps(),
        config=config,
        progress=progress,
        scheduler_kwargs=scheduler_kwargs,
    )
