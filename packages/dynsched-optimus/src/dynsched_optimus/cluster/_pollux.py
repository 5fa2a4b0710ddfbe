"""Pollux (Qiao et al., OSDI'21) as a baseline scheduler of the cluster simulator.

Written from the paper (sections 3-4) and the public description of its artifact's
simulator (``petuum/adaptdl``, ``simulator/``); read for facts, not copied.

* **Throughput model** (paper eq. 4-6): a job's per-micro-step compute time is
  ``T_c = alpha_c + beta_c * atomic``; its all-reduce time ``T_n = alpha + beta *
  max(replicas - 2, 0)`` with ``(alpha_n, beta_n)`` across nodes and ``(alpha_r,
  beta_r)`` inside one node (zero on one GPU); an optimizer step overlaps both,
  ``T_s = (T_c^gamma + T_n^gamma)^(1/gamma)``, and an iteration with ``accum``
  gradient-accumulation steps takes ``accum * T_c + T_s``.  Each job fits the seven
  parameters to the step and sync times it measured on the configurations it ran on
  (:attr:`GpuJob.step_samples`); what it has not observed is fixed optimistically.
* **Goodput** = throughput x statistical efficiency: progress (initial-batch steps)
  per second ``gain(M) / T_iter`` with ``gain`` from the job's latest gradient
  statistics (:func:`dynsched_optimus._goodput.efficiency_gain`).
* **Speedup** of ``(nodes, replicas)``: the goodput there, with the batch that
  maximises it, over the goodput of the baseline allocation (the fair share, one node
  with ``ceil(GPUs / jobs)`` GPUs, as the paper defines it; or one GPU).
* **Objective**: the power mean with exponent ``p`` of the jobs' speedups, scaled so
  one node's worth of GPUs is 1, each multiplied by the restart factor
  ``max(age - restarts * delay, 0) / (age + delay)`` when its allocation changes.
* **Search**: a genetic algorithm over the ``jobs x nodes`` replica matrix (below).
* **Job side**: each job then trains with the batch that maximises its own goodput on
  the GPUs it got.

Why an own vectorised GA rather than pymoo or scipy's ``differential_evolution``: the
variables are small integers in a ``jobs x nodes`` matrix whose feasibility (node
capacity, the job's replica cap, interference avoidance) is restored by a repair step;
differential evolution moves continuous vectors by scaled differences, which rounding
and repair would mostly undo, and pymoo would add a dependency whose NSGA-II second
objective (the cluster size for autoscaling) this fixed-size cluster does not use.
The whole population is evaluated, repaired and mutated as numpy arrays.

Parameters (source):

========================  =========  ======================================================
``p = -1``                published  the paper's fairness exponent (section 4.2, eval.)
``population = 100``      public     the artifact's GA population
``generations = 100``     public     the artifact's GA generations per round
``mutation 0.1 / 0.1``    public     the artifact's reset-to-current and zeroing rates
``batch_candidates = 50`` public     global batches tried, geometric (the artifact's)
``explore = 2``           public     a job may get at most twice the GPUs it ran on
``max_replicas = 64``     public     the artifact's cap of one job's GPUs
``restart delay``         public     30 s in the artifact; here the simulator's delay
``epsilon = 1e-3``        public     added to each speedup inside the power mean
fit regularisers          public     ``1e-3 (gamma - 1)^2``, ``1e-2 (beta/alpha)^2``
fair replicas capped      judgement  at the job's usable GPUs (avoids a zero baseline)
alpha, beta <= 1e4 s      judgement  upper bound of the fit (keeps its line search finite)
selection                 judgement  binary tournaments, best distinct states survive
                                     (the artifact: NSGA-II, whose 2nd objective is unused)
``patience``              judgement  optional early stop of the GA (default: off; 10
                                     makes rounds ~4x cheaper but, on the loaded
                                     workloads, restarts jobs twice as often and ends
                                     4-10 % slower: benchmarks/results)
========================  =========  ======================================================

No parameter is fitted to the published Pollux results.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
from scipy.optimize import minimize

from dynsched_optimus._goodput import efficiency_gain
from dynsched_optimus._scheduler import pollux_restart_factor as restart_factor

from ._jobs import SimJob
from ._sim import ClusterState
from ._spec import Placement

__all__ = [
    "BatchRange",
    "PolluxOptions",
    "PolluxProblem",
    "PolluxScheduler",
    "ThroughputParams",
    "fit_throughput",
    "genetic_search",
    "goodput_grid",
    "iteration_time",
    "power_mean",
    "restart_factor",
]

_EPS = 1e-8
_TINY = 1e-8  # lower bound of every alpha / beta (the artifact's slack)
_HUGE = 1e4  # upper bound of every alpha / beta in seconds (keeps the line search finite)


@attrs.frozen
class ThroughputParams:
    """The seven parameters of Pollux' throughput model (seconds).

    Attributes:
        alpha_c, beta_c: compute time of one micro-step, ``alpha_c + beta_c * atomic``.
        alpha_n, beta_n: all-reduce across nodes, ``alpha_n + beta_n * (replicas - 2)``.
        alpha_r, beta_r: all-reduce inside one node.
        gamma: overlap of compute and all-reduce (1: none, 10: about full).
    """

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float

    def as_array(self) -> np.ndarray:
        """The parameters in the order of the attributes."""
        return np.array(attrs.astuple(self), dtype=float)


def _times(
    x: np.ndarray, nodes: np.ndarray, replicas: np.ndarray, atomic: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Compute time of a micro-step and time of an optimizer step for parameter vector ``x``."""
    compute = x[0] + x[1] * atomic
    extra = np.maximum(replicas - 2, 0)
    net = np.where(
        nodes > 1,
        x[2] + x[3] * extra,
        np.where(replicas > 1, x[4] + x[5] * extra, 0.0),
    )
    g = x[6]
    step = (compute**g + net**g) ** (1.0 / g)
    return compute, step


def iteration_time(
    params: ThroughputParams,
    nodes: np.ndarray | int,
    replicas: np.ndarray | int,
    atomic: np.ndarray | float,
    accum: np.ndarray | int,
) -> np.ndarray:
    """Predicted seconds of one iteration (``accum`` accumulation steps plus the optimizer step)."""
    n, r, a, k = (np.asarray(v, dtype=float) for v in (nodes, replicas, atomic, accum))
    compute, step = _times(params.as_array(), n, r, a)
    return np.asarray(k * compute + step)


def _fit_start(
    n: np.ndarray, r: np.ndarray, a: np.ndarray, compute: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Starting point and free-parameter mask (unidentified parameters fixed)."""
    x0 = np.array([1e-1, 1e-2] * 3 + [1.0 + 1e-3])
    free = np.ones(7, dtype=bool)
    if len(np.unique(a)) == 1:
        x0[0] = float(np.mean(compute)) / 2
        free[0] = False
    fixed_at_lo = []
    if not np.any(n > 1):
        fixed_at_lo += [2, 3]
    if not np.any((n == 1) & (r > 1)):
        fixed_at_lo += [4, 5]
    if not np.any(r > 2):
        fixed_at_lo += [3, 5]
    for i in fixed_at_lo:
        x0[i] = _TINY
        free[i] = False
    return x0, free


def _fit_loss(
    x: np.ndarray,
    n: np.ndarray,
    r: np.ndarray,
    a: np.ndarray,
    log_c: np.ndarray,
    log_s: np.ndarray,
) -> tuple[float, np.ndarray]:
    """RMS log errors of compute and step time plus the regularisers, and the gradient."""
    compute, step = _times(x, n, r, a)
    extra = np.maximum(r - 2, 0)
    inter, intra = n > 1, (n == 1) & (r > 1)
    net = np.where(inter, x[2] + x[3] * extra, np.where(intra, x[4] + x[5] * extra, 0.0))
    g = x[6]
    e_c, e_s = np.log(compute) - log_c, np.log(step) - log_s
    err_c = math.sqrt(float(np.mean(e_c**2))) + 1e-12
    err_s = math.sqrt(float(np.mean(e_s**2))) + 1e-12
    total = compute**g + net**g
    # d log(step) / d compute, / d net, / d gamma
    safe_net = np.where(net > 0, net, 1.0)
    d_c = compute ** (g - 1) / total
    d_n = np.where(net > 0, safe_net ** (g - 1) / total, 0.0)
    net_log = np.where(net > 0, net**g * np.log(safe_net), 0.0)
    d_g = -np.log(total) / g**2 + (compute**g * np.log(compute) + net_log) / (g * total)
    # d compute / d (alpha_c, beta_c); d net / d (alpha_n, beta_n, alpha_r, beta_r)
    dc = np.stack([np.ones_like(a), a])
    dn = np.stack([inter * 1.0, inter * extra, intra * 1.0, intra * extra])
    grad = np.zeros(7)
    grad[:2] = (dc / compute * e_c).mean(axis=1) / err_c + (dc * d_c * e_s).mean(axis=1) / err_s
    grad[2:6] = (dn * d_n * e_s).mean(axis=1) / err_s
    grad[6] = float((d_g * e_s).mean()) / err_s
    reg = 1e-3 * (g - 1.0) ** 2 + 1e-2 * ((x[3] / x[2]) ** 2 + (x[5] / x[4]) ** 2)
    grad[6] += 2e-3 * (g - 1.0)
    grad[2] -= 2e-2 * x[3] ** 2 / x[2] ** 3
    grad[3] += 2e-2 * x[3] / x[2] ** 2
    grad[4] -= 2e-2 * x[5] ** 2 / x[4] ** 3
    grad[5] += 2e-2 * x[5] / x[4] ** 2
    return err_c + err_s + reg, grad


def fit_throughput(
    samples: dict[tuple[int, int, int], tuple[float, float]],
) -> ThroughputParams:
    """Fit the throughput model to measured ``(nodes, replicas, atomic) -> (compute, step)``.

    Minimises the RMS log error of both times plus the artifact's two regularisers
    (``1e-3 (gamma - 1)^2``; ``1e-2 ((beta_n/alpha_n)^2 + (beta_r/alpha_r)^2)``).  What
    the samples cannot identify is fixed as Pollux does: ``alpha_c`` at half the mean
    compute time with one atomic batch; the inter-node pair without multi-node samples,
    the intra-node pair without single-node multi-GPU samples, both ``beta`` without
    more than two replicas, all at their lower bound; then without multi-node samples
    the inter-node pair is raised to at least 1.1 x the intra-node pair.

    Raises:
        ValueError: no samples, or a time that is not finite and positive.
    """
    if not samples:
        raise ValueError("samples: at least one measured configuration is required")
    keys = np.array(list(samples), dtype=float)
    vals = np.array(list(samples.values()), dtype=float)
    if not (np.all(np.isfinite(vals)) and np.all(vals > 0)):
        raise ValueError("samples: compute and step times must be finite and > 0")
    n, r, a = keys[:, 0], keys[:, 1], keys[:, 2]
    log_c, log_s = np.log(vals[:, 0]), np.log(vals[:, 1])
    x0, free = _fit_start(n, r, a, vals[:, 0])
    lo = np.array([_TINY] * 6 + [1.0])
    # alphas and betas are searched in log space (their scales differ by orders of
    # magnitude, which slows L-BFGS-B down); gamma linearly
    logged = np.arange(7) < 6

    def expand(z: np.ndarray) -> np.ndarray:
        x = x0.copy()
        x[free] = np.where(logged[free], np.exp(z), z)
        return x

    def objective(z: np.ndarray) -> tuple[float, np.ndarray]:
        x = expand(z)
        value, grad = _fit_loss(x, n, r, a, log_c, log_s)
        return value, (grad * np.where(logged, x, 1.0))[free]

    z0 = np.where(logged, np.log(x0), x0)[free]
    zlo = np.where(logged, np.log(lo), lo)[free]
    zhi = np.where(logged, np.log(_HUGE), 10.0)[free]
    res = minimize(
        objective, z0, jac=True, method="L-BFGS-B", bounds=list(zip(zlo, zhi, strict=True))
    )
    x = expand(res.x if np.all(np.isfinite(res.x)) else z0)
    if not np.any(n > 1):
        x[2] = max(x[2], 1.1 * x[4])
        x[3] = max(x[3], 1.1 * x[5])
    return ThroughputParams(*(float(v) for v in x))


@attrs.frozen
class BatchRange:
    """What a job allows for its batch (the observation of :class:`GpuJob`).

    Attributes:
        init_batch: smallest global batch (the unit of progress).
        max_batch: largest global batch.
        min_local: smallest per-GPU batch.
        max_local: largest per-GPU micro-batch (more by gradient accumulation).
    """

    init_batch: int
    max_batch: int
    min_local: int
    max_local: int

    @property
    def max_replicas(self) -> int:
        """Most GPUs usable (each with at least ``min_local`` samples at the largest batch)."""
        return max(self.max_batch // self.min_local, 1)


def goodput_grid(
    params: ThroughputParams,
    grad: tuple[float, float] | None,
    batch: BatchRange,
    nodes: np.ndarray,
    replicas: np.ndarray,
    candidates: int = 50,
) -> tuple[np.ndarray, np.ndarray]:
    """Best goodput and the global batch attaining it for each ``(nodes, replicas)`` pair.

    Global batches are tried on a geometric grid from ``max(init_batch, min_local *
    replicas)`` to ``max_batch`` (``candidates`` points, rounded), split into micro-batches
    as the simulator's job does (accumulation steps when the local batch exceeds
    ``max_local``; the micro-batch capped so the effective batch stays within
    ``max_batch``).  Goodput is progress per second, ``gain(effective batch) / T_iter``;
    pairs where no batch is allowed get goodput 0 and batch 0.
    """
    n = np.asarray(nodes, dtype=float).ravel()
    r = np.asarray(replicas, dtype=float).ravel()
    lo = np.maximum(batch.init_batch, batch.min_local * r)
    ok = lo <= batch.max_batch
    hi = np.where(ok, batch.max_batch, lo)
    frac = np.linspace(0.0, 1.0, candidates)[:, None]
    cand = np.round(np.exp(np.log(lo) + frac * (np.log(hi) - np.log(lo))))
    local = np.ceil(cand / r - _EPS)
    accum = np.maximum(np.ceil(local / batch.max_local - _EPS) - 1, 0)
    atomic = np.ceil(local / (accum + 1) - _EPS)
    atomic = np.maximum(np.minimum(atomic, np.floor(batch.max_batch / (r * (accum + 1)))), 1)
    eff = atomic * (accum + 1) * r
    valid = ok & (atomic >= batch.min_local) & (atomic <= batch.max_local)
    if grad is None:
        gain = eff / batch.init_batch
    else:
        gain = efficiency_gain(eff, batch.init_batch, grad[0], grad[1])
    compute, step = _times(params.as_array(), n, r, atomic)
    good = np.where(valid, gain / (accum * compute + step), 0.0)
    best = np.argmax(good, axis=0)
    cols = np.arange(good.shape[1])
    return good[best, cols], np.where(good[best, cols] > 0, cand[best, cols], 0.0)


def _positive_int(_inst: object, attr: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attr.name} must be an int >= 1, got {value!r}")


def _finite(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value)):
        raise ValueError(f"{attr.name} must be a finite number, got {value!r}")


def _optional_positive_int(inst: object, attr: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        _positive_int(inst, attr, value)


def _at_least_one(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 1):
        raise ValueError(f"{attr.name} must be a finite number >= 1, got {value!r}")


#: allowed values of :attr:`PolluxOptions.baseline`
BASELINES = ("fair-share", "one-gpu")


@attrs.frozen
class PolluxOptions:
    """Settings of :class:`PolluxScheduler` (sources in the module docstring).

    Attributes:
        p: fairness exponent of the power mean (``-1`` published; 1: sum of speedups;
            0: geometric mean).
        population: GA population size.
        generations: GA generations per scheduling round.
        patience: stop after this many generations without improvement (``None``: never).
        baseline: speedup denominator: ``"fair-share"`` (the paper's: the goodput on
            ``ceil(GPUs / jobs)`` GPUs of one node) or ``"one-gpu"``.
        restart_penalty: weigh a changed allocation by the restart factor.
        interference_avoidance: at most one distributed job per node.
        batch_candidates: global batches tried per GPU count.
        explore: a job may get at most this many times the most GPUs it has run on.
        max_replicas: most GPUs of one job.
        seed: seed of the GA's random draws.
    """

    p: float = attrs.field(default=-1.0, validator=_finite)
    population: int = attrs.field(default=100, validator=_positive_int)
    generations: int = attrs.field(default=100, validator=_positive_int)
    patience: int | None = attrs.field(default=None, validator=_optional_positive_int)
    baseline: str = attrs.field(default="fair-share")
    restart_penalty: bool = True
    interference_avoidance: bool = True
    batch_candidates: int = attrs.field(default=50, validator=_positive_int)
    explore: float = attrs.field(default=2.0, validator=_at_least_one)
    max_replicas: int = attrs.field(default=64, validator=_positive_int)
    seed: int = attrs.field(default=0, validator=attrs.validators.instance_of(int))

    @baseline.validator
    def _check_baseline(self, attr: attrs.Attribute[Any], value: str) -> None:
        if value not in BASELINES:
            raise ValueError(f"baseline={value!r}: allowed values are {list(BASELINES)}")


def power_mean(values: np.ndarray, p: float, axis: int = -1) -> np.ndarray:
    """Power mean of ``values + 1e-3`` along ``axis`` (geometric mean at ``p = 0``)."""
    v = np.asarray(values, dtype=float) + 1e-3
    if p == 0:
        return np.asarray(np.exp(np.mean(np.log(v), axis=axis)))
    return np.asarray(np.mean(v**p, axis=axis) ** (1.0 / p))


@attrs.frozen(eq=False)
class PolluxProblem:
    """One scheduling round as an optimisation over ``jobs x nodes`` replica matrices.

    Attributes:
        speedup: ``(jobs, nodes + 1, replicas + 1)`` speedup of each job by nodes used and
            replicas (index 0 unused but 0).
        base: ``(jobs, nodes)`` current allocation (restarts are counted against it).
        max_replicas: ``(jobs,)`` most replicas of each job.
        demand: ``(jobs, resources)`` resources of one replica.
        capacity: ``(nodes, resources)``.
        restart_factor: ``(jobs,)`` multiplier of a job's speedup when its row changes.
        p: fairness exponent.
        scale: multiplier of each job's speedup before the power mean (a scalar or
            ``(jobs,)``).
        interference_avoidance: at most one distributed job per node.
    """

    speedup: np.ndarray
    base: np.ndarray
    max_replicas: np.ndarray
    demand: np.ndarray
    capacity: np.ndarray
    restart_factor: np.ndarray
    p: float = -1.0
    scale: np.ndarray | float = 1.0
    interference_avoidance: bool = True

    per_node: np.ndarray = attrs.field(init=False, repr=False)
    _slots: np.ndarray | None = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        d = self.demand[:, None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            fit = np.where(d > 0, np.floor(self.capacity[None] / np.where(d > 0, d, 1) + 1e-9), 1e9)
        #: ``(jobs, nodes)`` most replicas of each job that fit on each empty node
        object.__setattr__(self, "per_node", fit.min(axis=2).astype(np.int64))
        same = len(self.demand) > 0 and bool(np.all(self.demand == self.demand[0]))
        # identical replicas (every GPU job): capacity counted in replica slots per node
        object.__setattr__(self, "_slots", self.per_node[0] if same else None)

    def value(self, states: np.ndarray) -> np.ndarray:
        """Objective of each ``(..., jobs, nodes)`` state (higher is better)."""
        x = np.asarray(states)
        nodes = np.count_nonzero(x, axis=-1)
        reps = np.minimum(x.sum(axis=-1), self.speedup.shape[2] - 1)
        jobs = np.arange(x.shape[-2])
        sp = self.speedup[jobs, nodes, reps] * self.scale
        changed = np.any(x != self.base, axis=-1)
        sp = np.where(changed, sp * self.restart_factor, sp)
        return power_mean(sp, self.p)

    def feasible(self, states: np.ndarray) -> np.ndarray:
        """Whether each ``(..., jobs, nodes)`` state satisfies every constraint."""
        x = np.asarray(states)
        used = np.einsum("...jn,jr->...nr", x, self.demand)
        ok = np.all(used <= self.capacity + 1e-9, axis=(-2, -1))
        ok &= np.all(x.sum(axis=-1) <= self.max_replicas, axis=-1)
        ok &= np.all(x >= 0, axis=(-2, -1))
        if self.interference_avoidance:
            dist = np.count_nonzero(x, axis=-1) > 1
            per_node = np.sum((x > 0) & dist[..., None], axis=-2)
            ok &= np.all(per_node <= 1, axis=-1)
        return np.asarray(ok)

    def repair(self, states: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Make ``(pop, jobs, nodes)`` states feasible, earlier jobs winning conflicts.

        (1) a distributed job keeps its replicas only on nodes where no earlier
        distributed job has any; (2) a job above its replica cap keeps replicas on nodes
        in a random order up to the cap; (3) on each node, jobs in order keep what
        still fits.
        """
        x = np.maximum(np.asarray(states, dtype=np.int64), 0)
        if self.interference_avoidance:
            mask = (x > 0) & (np.count_nonzero(x, axis=2) > 1)[:, :, None]
            clash = np.any(mask.sum(axis=1) > 1, axis=1)  # states to fix
            if clash.any():
                sub, m = x[clash], mask[clash]
                sub[m & (np.cumsum(m, axis=1) > 1)] = 0
                x[clash] = sub
        over = x.sum(axis=2) > self.max_replicas[None, :]
        if over.any():
            rows = x[over]
            order = np.argsort(rng.random(rows.shape), axis=1)
            shuffled = np.take_along_axis(rows, order, axis=1)
            top = np.broadcast_to(self.max_replicas[None, :], over.shape)[over][:, None]
            shuffled = np.diff(np.minimum(np.cumsum(shuffled, axis=1), top), axis=1, prepend=0)
            x[over] = np.take_along_axis(shuffled, np.argsort(order, axis=1), axis=1)
        return self._fit_nodes(x)

    def _fit_nodes(self, x: np.ndarray) -> np.ndarray:
        """On each node, jobs in order keep the replicas that still fit."""
        if self._slots is not None:
            full = np.any(x.sum(axis=1) > self._slots[None, :], axis=1)  # states to fix
            if full.any():
                kept = np.minimum(np.cumsum(x[full], axis=1), self._slots[None, None, :])
                x[full] = np.diff(kept, axis=1, prepend=0)
            return x
        res = x[..., None] * self.demand[None, :, None, :]
        res = np.diff(np.minimum(np.cumsum(res, axis=1), self.capacity), axis=1, prepend=0)
        d = self.demand[None, :, None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            fit = np.where(d > 0, np.floor(res / np.where(d > 0, d, 1) + 1e-9), np.inf)
        out: np.ndarray = np.minimum(fit.min(axis=3), x).astype(np.int64)
        return out

    def _room(self, x: np.ndarray) -> np.ndarray:
        """Whether one more replica of the job fits on the node: ``(pop, jobs, nodes)``,
        or ``(pop, 1, nodes)`` when every job's replica is the same."""
        if self._slots is not None:
            free = self._slots[None, :] - x.sum(axis=1)
            same: np.ndarray = (free >= 1)[:, None, :]  # the same for every job
            return same
        used = np.einsum("pjn,jr->pnr", x, self.demand)
        free = self.capacity[None] - used
        room: np.ndarray = np.all(
            self.demand[None, :, None, :] <= free[:, None, :, :] + 1e-9, axis=3
        )
        return room

    def mutate(self, states: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Pollux' three mutations: reset a job to its current row (10 % of jobs), zero
        entries (10 % of jobs, each entry 10 %), raise entries on nodes with room (about
        one per job: a node with room, or one the job already holds, drawn uniformly)."""
        x = states.copy()
        pop, jobs = x.shape[:2]
        reset = rng.random((pop, jobs)) < 0.1
        if reset.any():
            x[reset] = np.broadcast_to(self.base[None], x.shape)[reset]
        rows = rng.random((pop, jobs)) < 0.1
        if rows.any():
            sub = x[rows]
            sub[rng.random(sub.shape) < 0.1] = 0
            x[rows] = sub
        room = self._room(x)
        p1 = room / np.maximum(room.sum(axis=2, keepdims=True), 1, dtype=np.float32)
        held = (x > 0) & room
        p2 = held / np.maximum(held.sum(axis=2, keepdims=True), 1, dtype=np.float32)
        hit = np.nonzero(rng.random(x.shape, dtype=np.float32) < p1 + p2 * (1 - p1))
        if hit[0].size:
            cur = x[hit]
            top = np.maximum(self.per_node[hit[1], hit[2]] - cur, 0) + 1
            x[hit] = cur + np.floor(rng.random(cur.size) * top).astype(np.int64)
        return x

    def crossover(self, a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Single-point crossover over jobs: two children per ``(a[i], b[i])`` pair."""
        jobs = a.shape[1]
        cut = rng.integers(0, jobs + 1, size=(a.shape[0], 1))
        take_a = (np.arange(jobs)[None, :] < cut)[..., None]
        return np.concatenate([np.where(take_a, a, b), np.where(take_a, b, a)])


def genetic_search(
    problem: PolluxProblem,
    rng: np.random.Generator,
    *,
    population: int = 100,
    generations: int = 100,
    patience: int | None = None,
    initial: np.ndarray | None = None,
) -> tuple[np.ndarray, float, np.ndarray]:
    """Maximise :meth:`PolluxProblem.value` with an elitist genetic algorithm.

    The population starts from ``initial`` (e.g. last round's, adapted) plus the current
    allocation, topped up with mutants of it; each generation draws parents by binary
    tournament, makes children by crossover and mutation, repairs them and keeps the best
    ``population`` distinct states of parents and children.

    Returns:
        ``(best state, its value, final population)``.
    """
    seeds = [problem.base[None]]
    if initial is not None and initial.size:
        seeds.append(initial)
    pop = np.concatenate(seeds).astype(np.int64)
    if len(pop) < population:
        extra = np.repeat(problem.base[None], population - len(pop), axis=0)
        pop = np.concatenate([pop, problem.mutate(extra, rng)])
    pop = problem.repair(pop, rng)
    pop, fit = _survivors(pop, problem.value(pop), population)
    best, stale = fit[0], 0
    for _ in range(generations):
        i = rng.integers(0, len(pop), size=(2, max(population // 2, 1)))
        j = rng.integers(0, len(pop), size=i.shape)
        parents = np.where(fit[i] >= fit[j], i, j)  # binary tournaments
        kids = problem.crossover(pop[parents[0]], pop[parents[1]], rng)
        kids = problem.repair(problem.mutate(kids, rng), rng)
        pop, fit = _survivors(
            np.concatenate([pop, kids]), np.concatenate([fit, problem.value(kids)]), population
        )
        if fit[0] > best + 1e-12:
            best, stale = fit[0], 0
        else:
            stale += 1
            if patience is not None and stale >= patience:
                break
    return pop[0].copy(), float(fit[0]), pop


def _survivors(states: np.ndarray, fit: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``size`` best distinct states, best first, and their values.

    Duplicates are found by a random 64-bit projection of each state (a collision only
    drops a state, it never admits an infeasible one).
    """
    flat = states.reshape(len(states), -1)
    _, idx = np.unique(flat @ _hash_weights(flat.shape[1]), return_index=True)
    keep = idx[np.argsort(-fit[idx], kind="stable")[:size]]
    return states[keep], fit[keep]


_HASH: dict[int, np.ndarray] = {}


def _hash_weights(width: int) -> np.ndarray:
    w = _HASH.get(width)
    if w is None:
        w = np.random.default_rng(width).integers(1, 2**62, size=width, dtype=np.int64)
        _HASH[width] = w
    return w


class _JobModel:
    """A job's fitted throughput model, refitted when it measured a new configuration."""

    def __init__(self, params: ThroughputParams | None = None, n_samples: int = 0) -> None:
        self.params = params
        self.n_samples = n_samples

    def update(self, samples: dict[tuple[int, int, int], tuple[float, float]]) -> None:
        if samples and len(samples) != self.n_samples:
            self.params = fit_throughput(samples)
            self.n_samples = len(samples)


def _batch_range(job: SimJob) -> BatchRange | None:
    limits = getattr(job, "batch_limits", None)
    if limits is None:
        return None
    (lo, hi), (lmin, lmax) = limits(), job.local_limits()  # type: ignore[attr-defined]
    if not job.adaptive:  # a fixed batch: the range is that batch
        lo = hi = job.batch_size
    return BatchRange(int(lo), int(hi), int(lmin), int(lmax))


class PolluxScheduler:
    """Pollux's scheduling policy (see the module docstring for the model and sources).

    Every round: jobs are ordered by attained service then submission (earlier wins in
    repairs); each job's speedup table over ``(nodes, replicas)`` is computed from its
    fitted throughput model and gradient statistics; the genetic search picks the
    replica matrix maximising the fairness-weighted objective; each placed job trains
    with the batch maximising its own goodput on its GPUs.

    Args:
        options: the settings (default :class:`PolluxOptions`).
        **kwargs: fields of :class:`PolluxOptions`, when ``options`` is not given.

    Attributes:
        decision_seconds: CPU seconds of each round's decision (as the Optimus schedulers' ``decision_seconds``).
    """

    name = "pollux"

    def __init__(self, options: PolluxOptions | None = None, **kwargs: object) -> None:
        if options is not None and kwargs:
            raise ValueError("give either options or keyword fields of PolluxOptions, not both")
        if options is None:
            fields = attrs.fields_dict(PolluxOptions)
            bad = sorted(k for k in kwargs if k not in fields)
            if bad:
                raise ValueError(f"unknown Pollux option(s) {bad}; allowed: {sorted(fields)}")
            options = PolluxOptions(**kwargs)  # type: ignore[arg-type]
        self.options = options
        self.rng = np.random.default_rng(options.seed)
        self.models: dict[str, _JobModel] = {}
        self.decision_seconds: list[float] = []
        self._prev: tuple[list[str], np.ndarray] | None = None

    def max_replicas(self, job: SimJob, batch: BatchRange | None) -> int:
        """Most GPUs ``job`` may get this round (exploration cap, model and batch caps)."""
        if not job.adaptive or batch is None:
            return max(job.max_workers_for(None), 1)
        seen = max((k[1] for k in job.step_samples), default=0)
        cap = max(int(self.options.explore * seen), 1)
        return max(min(cap, self.options.max_replicas, batch.max_replicas), 1)

    def speedup_table(
        self, job: SimJob, batch: BatchRange | None, num_nodes: int, max_r: int, fair_r: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(nodes + 1, max_r + 1)`` speedups and best batches of ``job``."""
        table = np.zeros((num_nodes + 1, max_r + 1))
        batches = np.zeros_like(table)
        model = self.models.get(job.name)
        params = None if model is None else model.params
        base_r = fair_r if self.options.baseline == "fair-share" else 1
        if batch is None or params is None:
            reps = np.arange(max_r + 1, dtype=float)
            table[1:, :] = reps[None, :] / base_r
            return table, batches
        # the model tells one node from several, not two nodes from three: two rows
        rows = min(num_nodes, 2)
        n, r = np.meshgrid(np.arange(1, rows + 1), np.arange(1, max_r + 1), indexing="ij")
        pairs_n = np.append(n.ravel(), 1)
        pairs_r = np.append(r.ravel(), min(base_r, batch.max_replicas))
        good, best = goodput_grid(
            params, job.grad_stats, batch, pairs_n, pairs_r, self.options.batch_candidates
        )
        base = good[-1]
        if base <= 0:
            base = float(good[:-1].max()) or 1.0
        good, best = good[:-1].reshape(n.shape), best[:-1].reshape(n.shape)
        table[1:, 1:] = (good / base)[np.minimum(np.arange(num_nodes), rows - 1)]
        batches[1:, 1:] = best[np.minimum(np.arange(num_nodes), rows - 1)]
        return table, batches

    def _problem(
        self,
        jobs: Sequence[SimJob],
        ranges: Sequence[BatchRange | None],
        cluster: ClusterState,
        now: float,
    ) -> tuple[PolluxProblem, list[np.ndarray]]:
        """The round's optimisation problem and each job's best-batch table
        (``ranges``: each job's `_batch_range`)."""
        cap = np.asarray(cluster.capacity, dtype=float)
        num_nodes = cap.shape[0]
        demand = np.array([j.worker_demand for j in jobs], dtype=float)
        total = np.where(cap.sum(axis=0) > 0, cap.sum(axis=0), np.inf)
        share = np.max(demand / total, axis=1)
        max_r = [self.max_replicas(j, b) for j, b in zip(jobs, ranges, strict=True)]
        width = max(max_r)
        speed = np.zeros((len(jobs), num_nodes + 1, width + 1))
        batches = []
        for i, (job, b) in enumerate(zip(jobs, ranges, strict=True)):
            fair = max(math.ceil(1.0 / share[i] / len(jobs)), 1)
            if b is not None:
                fair = min(fair, b.max_replicas)
            table, best = self.speedup_table(job, b, num_nodes, max_r[i], fair)
            speed[i, :, : max_r[i] + 1] = table
            batches.append(best)
        base = np.array(
            [j.placement.workers if j.placement is not None else [0] * num_nodes for j in jobs],
            dtype=np.int64,
        )
        factor = restart_factor(
            np.array([now - j.submit_time for j in jobs], dtype=float),
            np.array([j.num_restarts for j in jobs], dtype=float),
            cluster.restart_delay_s,
        )
        problem = PolluxProblem(
            speedup=speed,
            base=base,
            max_replicas=np.array(max_r, dtype=np.int64),
            demand=demand,
            capacity=cap,
            restart_factor=factor if self.options.restart_penalty else np.ones(len(jobs)),
            p=self.options.p,
            scale=share * num_nodes,
            interference_avoidance=self.options.interference_avoidance,
        )
        return problem, batches

    def _initial(self, names: list[str], num_nodes: int) -> np.ndarray | None:
        """Last round's population, rows moved to the current job order (new jobs: 0)."""
        if self._prev is None:
            return None
        prev_names, prev_pop = self._prev
        if prev_pop.shape[2] != num_nodes:
            return None
        out = np.zeros((len(prev_pop), len(names), num_nodes), dtype=np.int64)
        where = {n: i for i, n in enumerate(prev_names)}
        for i, n in enumerate(names):
            if n in where:
                out[:, i] = prev_pop[:, where[n]]
        return out

    def schedule(
        self, now: float, jobs: Sequence[SimJob], cluster: ClusterState
    ) -> dict[str, Placement]:
        """Placements (with each job's batch) for this round."""
        t0 = time.process_time()
        if not jobs:
            return {}
        ps_jobs = [j.name for j in jobs if j.max_ps > 0]
        if ps_jobs:
            raise ValueError(
                f"scheduler 'pollux' places all-reduce GPU jobs only; parameter-server "
                f"job(s) {ps_jobs[:3]} need another scheduler"
            )
        order = sorted(jobs, key=lambda j: (j.attained_service, j.submit_time, j.name))
        for job in order:
            self.models.setdefault(job.name, _JobModel()).update(job.step_samples)
        ranges = [_batch_range(j) for j in order]
        problem, batches = self._problem(order, ranges, cluster, now)
        names = [j.name for j in order]
        best, _, pop = genetic_search(
            problem,
            self.rng,
            population=self.options.population,
            generations=self.options.generations,
            patience=self.options.patience,
            initial=self._initial(names, problem.base.shape[1]),
        )
        self._prev = (names, pop)
        out = {}
        for i, job in enumerate(order):
            row = best[i]
            if row.sum() == 0:
                continue
            out[job.name] = self._placement(job, ranges[i], row, batches[i])
        self.decision_seconds.append(time.process_time() - t0)
        return out

    def _placement(
        self, job: SimJob, b: BatchRange | None, row: np.ndarray, batches: np.ndarray
    ) -> Placement:
        """The job's placement with the batch it picks (within ``b``) for the GPUs it got."""
        n, r = int(np.count_nonzero(row)), int(row.sum())
        cur = job.placement
        batch = None
        if job.adaptive and b is not None:
            chosen = int(batches[n, r]) if batches.size and batches[n, r] > 0 else 0
            if chosen <= 0:  # no model yet: the smallest batch every GPU can take
                chosen = min(max(b.init_batch, b.min_local * r), b.max_batch)
            batch = chosen
        workers = tuple(int(v) for v in row)
        if cur is not None and cur.workers == workers and batch in (None, job.batch_size):
            return cur
        return Placement(workers, [0] * len(workers), batch_size=batch)
