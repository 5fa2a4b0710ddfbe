"""Closed-form mean staleness of a fully-async run, in policy versions behind per sample.

Derivation (notation: ``B`` samples per micro-step, ``T`` micro-steps per weight sync,
``M = max_required_samples``, ``C`` the rollouter's concurrency cap in samples).

1. *Counting identity (exact).* A sample generated with version ``v_g`` and consumed at
   trainer version ``v_c`` is ``v_c - v_g`` versions behind: one for every weight sync it
   lives through. Summing over samples and exchanging the sums, the total staleness equals
   the sum over weight syncs of ``N_k``, the samples *in the system* at sync ``k`` (first
   token decoded, not yet consumed). A run of ``S`` steps consumes ``S B`` samples and
   passes ``floor((S - 1) / T)`` syncs that samples are consumed after, so::

       mean staleness = floor((S - 1) / T) * mean_k(N_k) / (S B)
                      -> N / (B T)                (steady state, S -> infinity)

   This is Little's law taken at the sync instants rather than over time: a sample's
   time in the system alone does not fix its staleness, because samples are not
   generated at random phases of a version (verl's window admits them in a burst right
   after each sync).
2. *Window ceiling.* Under verl's rule (``staleness_rule="in_flight_and_queued"``) the
   samples in flight plus queued never exceed ``M`` minus what the trainer consumed since
   the window opened, so at a sync (``T`` steps consumed) ``N <= L = M - T B``. Under the
   ``"in_flight"`` rule the queue alone may hold ``queue_capacity``: ``L = queue_capacity
   + C``. With ``M = B T (1 + threshold)`` the verl ceiling is ``threshold * B T``: the
   mean staleness never exceeds the staleness threshold, and is 0 when it is 0.
3. *Below the ceiling: what the rollout side holds at a sync.*
   ``N = min(L, F + Q)`` with
   - ``F`` the samples in flight that already decoded a token: the rollouter keeps ``C``
     in flight, of which only those with a running response count; the replicas run at
     most ``running_slots`` sequences and an in-flight group runs on average
     ``n / length_tail`` of its ``n`` responses (``length_tail = E[max of the n lengths]
     / E[length]``: the short responses of a group finish first), so
     ``F = min(C, running_slots * length_tail / n)``;
   - ``Q`` the finished samples waiting in the queue at the sync. With the trainer busy a
     fraction ``u < 1`` of the time (its utilization: the rollout side is the bottleneck)
     the trainer empties the queue at each collection and the samples finishing while it
     trains step ``T`` (a fraction ``u`` of a step period, at ``B`` samples per period)
     are queued at the sync: ``Q = B u`` (fluid: production at a constant rate). When
     ``u >= 1`` the trainer is the bottleneck, the queue grows until the ceiling binds:
     ``N = L``.

Where it errs (``benchmarks/sim_staleness_model.py``): when the window ceiling binds
(most configurations: ``C >= M - T B``) the prediction is the counting identity itself
and within about 1% (the rest: syncs at which the window was not quite full). Below the
ceiling (one standalone replica, ``C = 16 < M - T B = 32``) it over-predicts by up to
about 14%: the fluid ``Q = B u`` assumes completions spread evenly over a step, but with
the in-flight cohort turning over about once per step, completions lock to the
trainer's collections and fewer finish while the last step of a window trains (3.8
against 5.6 to 8.1 per training phase on ``heldout_scenario(15)``, ``static-16-8``).

Assumptions: a steady state over the run (stationary rates; the run's first window is
counted by the finite-run factor of step 1, its first fill is not); in-flight groups
keep their responses running until done (no cut by a switch); consumption in completion
order. No constant is fitted to the simulator: every input comes from the schedule,
the engine and trainer models and the workload model (`predicted_staleness_for`).

`predicted_staleness_for` computes the inputs of a configuration from its scenario:
``u`` from the rates of the cost models (trainer: ``TrainerModel.step_s`` over the mean
group tokens plus the per-step share of the blocking broadcast; rollout: the pools'
`pool_throughput` at the concurrency they run, divided by the mean response tokens of
a group); hybrid replicas serve only while the trainer does not train, a fraction
``1 - u`` of the time, which gives ``u`` in closed form (``u = t (l_s + l_h) / (B + t
l_h)`` with ``t`` the trainer's time per step and ``l_s``, ``l_h`` the pools' sample
rates), and count with the weight ``1 - u`` in ``C`` and ``running_slots``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import attrs
import numpy as np
from dynsched_core import DynamicScheduleConfig

from dynsched_sim._bound import admissible_prompts, pool_throughput
from dynsched_sim._scenario import Configuration, Scenario, load_scenario
from dynsched_sim._sim import STATIC_POLICY, policy_for

__all__ = ["StalenessInputs", "predicted_staleness", "predicted_staleness_for", "staleness_inputs"]

_RULES = ("in_flight_and_queued", "in_flight")


def predicted_staleness(
    *,
    utilization: float,
    required_samples: int,
    trigger_parameter_sync_step: int,
    max_required_samples: int,
    concurrency: float,
    n: int = 1,
    length_tail: float = 1.0,
    running_slots: float = math.inf,
    steps: int | None = None,
    staleness_rule: str = "in_flight_and_queued",
    queue_capacity: int | None = None,
) -> float:
    """Closed-form mean staleness (policy versions behind per consumed sample).

    See the module docstring for the derivation and its assumptions.

    Args:
        utilization: The trainer's utilization ``u`` (fraction of the time it trains and
            syncs; ``>= 1``: the trainer is the bottleneck), >= 0.
        required_samples: ``B``, samples per micro-step (>= 1).
        trigger_parameter_sync_step: ``T``, micro-steps per weight sync (>= 1).
        max_required_samples: ``M``, the admission budget per version (>= 0).
        concurrency: ``C``, samples the rollouter keeps in flight (>= 0).
        n: Responses per sample (>= 1).
        length_tail: ``E[max of the n response lengths] / E[response length]`` (>= 1).
        running_slots: Sequences the replicas decode at once (>= 0; default unlimited).
        steps: Micro-steps of the run (finite-run factor; default: steady state).
        staleness_rule: ``"in_flight_and_queued"`` (verl's) or ``"in_flight"``.
        queue_capacity: Queue capacity (``"in_flight"`` rule; default ``M``).

    Raises:
        ValueError: an argument outside its range (the message names it).
    """
    b, t = required_samples, trigger_parameter_sync_step
    _check(utilization, concurrency, n, length_tail, running_slots, b, t, max_required_samples)
    if staleness_rule not in _RULES:
        raise ValueError(f"staleness_rule must be one of {list(_RULES)}, got {staleness_rule!r}")
    if staleness_rule == "in_flight":
        cap = max_required_samples if queue_capacity is None else queue_capacity
        ceiling = float(cap) + concurrency
    else:
        ceiling = float(max(0, max_required_samples - t * b))
    decoding = min(concurrency, running_slots * length_tail / n)
    held = ceiling if utilization >= 1.0 else min(ceiling, decoding + b * utilization)
    return _finite_run(steps, t) * held / (b * t)


def _check(u: float, c: float, n: int, tail: float, slots: float, b: int, t: int, m: int) -> None:
    for name, value, low in (
        ("utilization", u, 0.0),
        ("concurrency", c, 0.0),
        ("running_slots", slots, 0.0),
        ("length_tail", tail, 1.0),
    ):
        if not value >= low:  # also refuses NaN
            raise ValueError(f"{name} must be >= {low:g}, got {value!r}")
    for name, count, least in (
        ("required_samples", b, 1),
        ("trigger_parameter_sync_step", t, 1),
        ("n", n, 1),
        ("max_required_samples", m, 0),
    ):
        if not isinstance(count, int) or count < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {count!r}")


def _finite_run(steps: int | None, t: int) -> float:
    """``floor((S - 1) / T) * T / S``: the share of consumed samples that a sync can
    precede (1 in the steady state)."""
    if steps is None:
        return 1.0
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1 or None, got {steps!r}")
    return ((steps - 1) // t) * t / steps


@attrs.frozen(kw_only=True)
class StalenessInputs:
    """The quantities `predicted_staleness` reads, computed for one configuration.

    Attributes:
        utilization: Predicted trainer utilization ``u`` (capped at 1).
        concurrency: ``C`` (hybrid replicas weighted by the time they serve, ``1 - u``).
        running_slots: Sequences the replicas decode at once (same weighting).
        length_tail: ``E[max of n lengths] / E[length]`` of the run's workload draw.
        trainer_step_s: Trainer time per micro-step (training + share of the broadcast).
        samples_per_s: Rollout production at full concurrency (standalone + hybrid).
    """

    utilization: float
    concurrency: float
    running_slots: float
    length_tail: float
    trainer_step_s: float
    samples_per_s: float


def _pool_rate(
    scenario: Scenario, role: str, replicas: int, groups: float, tail: float, mean_len: float
) -> tuple[float, float]:
    """Samples/s of ``replicas`` of ``role`` holding ``groups`` samples in flight, and their
    running-sequence capacity."""
    eng, hw, llm = scenario.engine, scenario.hardware, scenario.model
    if replicas <= 0:
        return 0.0, 0.0
    cap = eng.max_running(role, hw, llm)
    seqs = math.floor(groups * scenario.workload.n / tail)
    tokens_per_s = pool_throughput(eng, [cap] * replicas, seqs)
    return tokens_per_s / (scenario.workload.n * mean_len), float(cap * replicas)


def staleness_inputs(
    scenario: Scenario,
    configuration: Configuration | str,
    policy: str = "default",
    *,
    seed: int | None = None,
) -> StalenessInputs:
    """The inputs of `predicted_staleness` for ``configuration`` of ``scenario`` run with
    ``policy`` (hybrid replicas never serve under `STATIC_POLICY` unless the configuration
    has no standalone replica), from its cost models and its workload model's draw for
    ``seed`` (default: the scenario's)."""
    conf = (
        scenario.configuration(configuration) if isinstance(configuration, str) else configuration
    )
    cfg = scenario.schedule_config(conf)
    b, t = cfg.required_samples, cfg.trigger_parameter_sync_step
    resp, tokens = _workload_draw(scenario, conf, cfg, seed)
    mean_len = float(resp.mean())
    tail = float(resp.max(axis=1).mean()) / mean_len
    g = scenario.engine.gpus_per_replica
    n_s = conf.rollout_gpus // g
    # hybrid replicas serve unless the policy never activates them; with no standalone
    # replica the driver's colocated schedule activates them under every policy
    serves = conf.hybrid and (policy_for(conf, policy) != STATIC_POLICY or n_s == 0)
    n_h = conf.trainer_gpus // g if serves else 0
    per = cfg.concurrent_samples_per_replica
    l_s, slots_s = _pool_rate(
        scenario, "standalone", n_s, min(per * n_s, cfg.max_required_samples), tail, mean_len
    )
    l_h, slots_h = _pool_rate(
        scenario, "hybrid", n_h, min(per * n_h, cfg.max_required_samples), tail, mean_len
    )
    hw, llm = scenario.hardware, scenario.model
    sync_s = scenario.engine.broadcast_sync_s(hw, llm) if n_s else 0.0
    step_s = (
        scenario.trainer.step_s(
            int(b * tokens),
            conf.trainer_gpus,
            scenario.trainer.state_swap_s(hw, llm, conf.trainer_gpus),
        )
        + sync_s / t
    )
    # u = step_s * (l_s + l_h (1 - u)) / B, solved for u (hybrid serves a fraction 1 - u)
    u = min(1.0, step_s * (l_s + l_h) / (b + step_s * l_h))
    serve = 1.0 - u
    return StalenessInputs(
        utilization=u,
        concurrency=min(float(cfg.max_required_samples), per * (n_s + n_h * serve)),
        running_slots=slots_s + slots_h * serve,
        length_tail=tail,
        trainer_step_s=step_s,
        samples_per_s=l_s + l_h,
    )


def _workload_draw(
    scenario: Scenario, conf: Configuration, cfg: DynamicScheduleConfig, seed: int | None
) -> tuple[np.ndarray, float]:
    """Response lengths ``(P, n)`` of the prompts the run consumes and their mean group
    tokens (the same draw the simulator makes for ``seed``)."""
    consumed = scenario.steps * cfg.required_samples
    wl = scenario.workload.generate(
        admissible_prompts(scenario, conf, cfg),
        scenario.seed if seed is None else seed,
        run_samples=consumed,
    )
    return wl.response_lens[:consumed], float(wl.group_tokens()[:consumed].mean())


def predicted_staleness_for(
    scenario: Scenario | str | os.PathLike[str],
    configuration: Configuration | str | None = None,
    policy: str = "default",
    *,
    seed: int | None = None,
) -> float:
    """`predicted_staleness` of a configuration of a scenario (a `Scenario`, a built-in
    name or a scenario file), for the scenario's step count.

    Args:
        scenario: The scenario.
        configuration: A configuration or its name (default: the first dynamic one, else
            the first).
        policy: The policy it runs with (hybrid replicas never serve under
            `STATIC_POLICY`, which static configurations always run, except in a
            colocated configuration, where the driver activates them after every sync).
        seed: Workload seed of the length draw (default: the scenario's).
    """
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    conf = _default_configuration(sc.configurations) if configuration is None else configuration
    conf = sc.configuration(conf) if isinstance(conf, str) else conf
    cfg = sc.schedule_config(conf)
    inp = staleness_inputs(sc, conf, policy, seed=seed)
    return predicted_staleness(
        utilization=inp.utilization,
        required_samples=cfg.required_samples,
        trigger_parameter_sync_step=cfg.trigger_parameter_sync_step,
        max_required_samples=cfg.max_required_samples,
        concurrency=inp.concurrency,
        n=sc.workload.n,
        length_tail=inp.length_tail,
        running_slots=inp.running_slots,
        steps=sc.steps,
        staleness_rule=cfg.staleness_rule,
        queue_capacity=cfg.max_queue_size,
    )


def _default_configuration(confs: Sequence[Configuration]) -> Configuration:
    if not confs:
        raise ValueError("the scenario has no configuration")
    return next((c for c in confs if c.hybrid), confs[0])
