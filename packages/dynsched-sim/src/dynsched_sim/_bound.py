"""Lower bound on the wall-clock of a configuration: free, instantaneous switching and
perfect load balance.

Notation (one configuration of a scenario):

* ``G`` GPUs in total, ``g_T`` trainer GPUs; ``steps`` micro-steps of ``q =
  required_samples`` samples each, so ``S = steps * q`` samples are consumed;
* the rollouter admits at most ``max_required_samples`` prompts per weight version, so
  the consumed samples are among the first ``A = (steps / T + 1) * max_required_samples``
  prompts of the workload;
* for prompt group ``i``: ``R_i`` response tokens, ``K_i`` training tokens
  (``n * prompt_len + R_i``);
* ``p``: the best decode throughput per GPU any replica of the configuration reaches
  (`EngineModel.peak_throughput` / GPUs per replica; standalone replicas have the most
  memory, hence the highest ``p``; hybrid-only configurations use the hybrid value);
* trainer: a micro-step over ``K`` tokens takes ``o + c * K / g_T`` (`TrainerModel`).

Every consumed group needs ``R_i / p`` GPU-seconds of decoding and ``c * K_i``
GPU-seconds of training, each micro-step another ``o * g_T``; no GPU does two things at
once, so ``G * wall >= sum`` of these over the consumed groups. Training is sequential
on ``g_T`` GPUs, so ``wall >= steps * o + c * sum K_i / g_T``. The consumed set is not
known in advance, so both sums take the cheapest ``S`` groups among the first ``A``:

    LB = max( (steps * o * g_T + min_S sum_i (R_i / p + c * K_i)) / G,
              steps * o + c * min_S sum_i K_i / g_T )

Weight syncs, prefill, switching, the pipeline start-up and the tail are all ignored,
so the bound is valid for any policy; ``efficiency = LB / achieved <= 1``.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
from dynsched_core import DynamicScheduleConfig

from dynsched_sim._scenario import Configuration, Scenario
from dynsched_sim._workload import Workload

__all__ = ["LowerBound", "admissible_prompts", "lower_bound"]


@attrs.frozen
class LowerBound:
    """The bound and its two terms (seconds)."""

    seconds: float
    work_term_s: float
    train_term_s: float
    peak_tokens_per_gpu_s: float


def admissible_prompts(
    scenario: Scenario, conf: Configuration, config: DynamicScheduleConfig | None = None
) -> int:
    """``A``: prompts the rollouter can ever admit in ``scenario.steps`` micro-steps.

    ``config``: the run's schedule config, when already built (default: built here).
    """
    cfg = config if config is not None else scenario.schedule_config(conf)
    versions = math.ceil(scenario.steps / cfg.trigger_parameter_sync_step)
    return (versions + 1) * cfg.max_required_samples


def lower_bound(
    scenario: Scenario,
    conf: Configuration,
    workload: Workload,
    config: DynamicScheduleConfig | None = None,
) -> LowerBound:
    """The lower bound of the module docstring for ``conf`` on ``workload``.

    ``config``: the run's schedule config, when already built (default: built here).
    """
    cfg = config if config is not None else scenario.schedule_config(conf)
    eng, hw, llm, tr = scenario.engine, scenario.hardware, scenario.model, scenario.trainer
    roles = (["standalone"] if conf.rollout_gpus else []) + (["hybrid"] if conf.hybrid else [])
    p = max(eng.peak_throughput(r, hw, llm) for r in roles) / eng.gpus_per_replica
    s = scenario.steps * cfg.required_samples
    a = min(admissible_prompts(scenario, conf, cfg), len(workload))
    if s > a:
        raise ValueError(f"workload has {a} admissible prompts, fewer than the {s} consumed")
    resp = workload.response_lens[:a].sum(axis=1).astype(np.float64)
    ktok = workload.group_tokens()[:a].astype(np.float64)
    cost = resp / p + tr.gpu_s_per_token * ktok
    cheapest_cost = float(np.sort(cost)[:s].sum())
    cheapest_k = float(np.sort(ktok)[:s].sum())
    g, gt = conf.total_gpus, conf.trainer_gpus
    work = (scenario.steps * tr.step_overhead_s * gt + cheapest_cost) / g
    train = scenario.steps * tr.step_overhead_s + tr.gpu_s_per_token * cheapest_k / gt
    return LowerBound(max(work, train), work, train, p)
