"""Plan a GPU budget: the split, rollout concurrency, staleness threshold and policy with
the shortest predicted end-to-end time whose predicted mean staleness stays in a bound.

A *candidate* is a split of ``gpus`` GPUs (trainer GPUs, standalone rollout GPUs in whole
replicas, and whether hybrid replicas run on the trainer GPUs: ``trainer_gpus //
engine.gpus_per_replica`` of them), the rollout concurrency per replica
(``concurrent_samples_per_replica``), the staleness threshold and the policy. Static
splits run ``static_fully_async``; hybrid splits run each dynamic policy asked for; a
colocated split (no standalone replica) runs one policy, because the core's driver runs
the same colocated schedule under every policy.

The search has two stages:

1. *Analytical* (every candidate, first workload seed): feasibility, then a fluid
   estimate of the run time. Feasible means: memory fits (`memory_problem`), the core
   accepts the schedule, and the closed-form mean staleness (`predicted_staleness_for`)
   is within the bound. The estimate is ``max(bound, t_1 + steps * period)`` with the
   lower bound and ``t_1`` (earliest start of step 1) of `lower_bound` and the steady
   period of a step from the cost models: the trainer's step (plus its share of the
   weight broadcast) against the rollout pools' sample rates at their concurrency,
   hybrid replicas serving between training steps after a wake-up, sleep and local sync
   per weight-sync window (`_period`). Policies are not modelled: they differ in the
   simulator only.
2. *Simulated*: the shortlist (a candidate of each of the ``shortlist`` best splits,
   with the first policy it runs: of the split's candidates estimated within
   `WINDOW_TOLERANCE` of its best, the one with the largest staleness threshold) is
   simulated over ``seeds`` workload seeds, then the fastest split with its other
   policies; then the fastest candidate's concurrency and threshold are hill-climbed in the
   simulator (one step either way, same split and policy, at most two rounds, while a
   neighbour is faster), and every simulated candidate is ranked by mean simulated time.
   With ``shortlist=None`` the search is exact over the candidate set: every feasible
   candidate, in estimate order, unless its lower bound (mean over the seeds; a bound is
   never above a simulated time) is already at or above the best simulated mean.

Optionally (``simulated_staleness_bound``) a second bound applies to the staleness the
simulator *measures* for each simulated candidate (mean over the plan's seeds): the closed
form only prefilters, and a simulated candidate over this bound cannot be the plan's best.
Every "best so far" above (the split whose other policies run, the candidate hill-climbed,
the exact search's pruning time) is then the fastest candidate within the bound (the
fastest over it while none is within, so hill-climbing can reach a lower threshold), and
the ranking lists the candidates within the bound first. If no simulated candidate is
within it, `plan` raises `PlanError`. Both sides of this comparison are measured by the
same simulator on the same seeds: a bound taken from another configuration's simulated
runs on those seeds (e.g. `default`'s) is compared like for like, with no closed-form
error in between. ``simulated_staleness_bound="scenario"`` (`SCENARIO_STALENESS`) takes
it from the scenario's own configuration, so the plan is never staler than it on those
seeds.

The scenario's own configuration (`own_candidate`: its dynamic split with its policy,
concurrency and threshold, what the user runs today) is always simulated on the plan's
seeds too (`Plan.reference`), and it joins the ranking when it is on the plan's GPU
budget, its policy is one the plan considers and it passes the memory rule and the
closed-form bound, as every candidate must. So a plan never picks a configuration slower
than the one it replaces on the plan's seeds; where the search finds nothing faster, the
plan keeps it.

A plan is a prediction of the simulator's cost models; `Plan.rests_on` says which.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from dynsched_sim._bound import admissible_prompts, lower_bound
from dynsched_sim._planner import planned_splits
from dynsched_sim._report import Spread
from dynsched_sim._scenario import Configuration, Scenario, ScenarioError, load_scenario
from dynsched_sim._sim import STATIC_POLICY, run_configuration
from dynsched_sim._staleness import _pool_rate, predicted_staleness_for

__all__ = [
    "DEFAULT_PLAN_POLICIES",
    "SCENARIO_STALENESS",
    "Candidate",
    "Plan",
    "PlanError",
    "PlannedCandidate",
    "SplitEstimate",
    "check_plan_inputs",
    "format_plan",
    "memory_problem",
    "own_candidate",
    "plan",
    "write_plan",
]

#: Largest GPU budget a plan accepts.
MAX_PLAN_GPUS = 16_384
#: Most workload seeds a plan simulates per candidate.
MAX_PLAN_SEEDS = 100
#: Largest shortlist (splits simulated).
MAX_SHORTLIST = 1_000
DEFAULT_PLAN_POLICIES = (STATIC_POLICY, "default", "fixed_ratio", "predictive")
#: Staleness thresholds tried besides the scenario's own.
DEFAULT_THRESHOLDS = (0.0, 0.25, 0.5, 1.0)
#: Concurrencies tried: the scenario's ``concurrent_samples_per_replica`` times these.
CONCURRENCY_FACTORS = (0.5, 1.0, 2.0)
_GIB = float(2**30)
#: Most hill-climbing rounds on the best candidate's concurrency and threshold.
_REFINE_ROUNDS = 2
#: Estimates of one split's candidates within this fraction of its best one are told
#: apart by the larger staleness threshold (judgement). The fluid estimate does not model
#: the stalls of a small staleness window (the rollout cannot run ahead of the trainer
#: past it), which only a larger threshold relieves, and its differences of a percent or
#: two between thresholds are workload-draw noise: each threshold admits another number
#: of prompts, hence another draw (on development draw 5, static 16 + 16 at concurrency
#: 16: estimated 0.7 % faster at threshold 0.25 than at 0.5, simulated 14 % slower).
WINDOW_TOLERANCE = 0.02

PRUNING_RULE = (
    "drop candidates whose memory does not fit, whose schedule the core refuses or whose "
    "closed-form mean staleness exceeds the bound; rank the rest by a fluid estimate "
    "max(lower bound, t_1 + steps * steady step period); simulate one candidate of each "
    "of the {k} best splits (of those estimated within {tol:g}% of the split's best, the "
    "largest staleness threshold) with every policy it runs"
)
EXACT_RULE = (
    "drop candidates whose memory does not fit, whose schedule the core refuses or whose "
    "closed-form mean staleness exceeds the bound; simulate the rest in fluid-estimate "
    "order, skipping a candidate only when its lower bound (mean over the seeds) is at or "
    "above the best simulated mean (exact over the candidate set)"
)
MEMORY_RULE = (
    "memory checked: each replica's weights fit its memory fraction "
    "(EngineModel.max_running); the trainer's weights, gradients and optimizer state fit "
    "its GPUs during a step (TrainerModel.resident_bytes_per_gpu <= gpu_memory_gib); "
    "without trainer.offload_state an awake hybrid replica fits next to the resident "
    "trainer state (the simulator's own check)"
)

#: ``simulated_staleness_bound`` value: the simulated mean staleness of the scenario's own
#: configuration (`own_candidate`) on the plan's seeds, which then also joins the ranking.
SCENARIO_STALENESS = "scenario"

Progress = Callable[[str], None]


class PlanError(ValueError):
    """Bad planner input, or no feasible candidate; the message names the parameter."""


@attrs.frozen(kw_only=True)
class Candidate:
    """One configuration the planner considers.

    Attributes:
        trainer_gpus: GPUs of the trainer (hosting hybrid replicas when ``hybrid``).
        rollout_gpus: GPUs of the standalone rollout replicas.
        hybrid: Hybrid replicas on the trainer GPUs (``trainer_gpus // gpus_per_replica``).
        policy: The policy it runs.
        concurrency: ``concurrent_samples_per_replica``.
        staleness_threshold: ``staleness_threshold`` of the schedule.
    """

    trainer_gpus: int
    rollout_gpus: int
    hybrid: bool
    policy: str
    concurrency: int
    staleness_threshold: float

    @property
    def total_gpus(self) -> int:
        """Trainer and standalone rollout GPUs."""
        return self.trainer_gpus + self.rollout_gpus

    @property
    def split(self) -> str:
        """``hybrid-16-16`` / ``static-8-24``."""
        kind = "hybrid" if self.hybrid else "static"
        return f"{kind}-{self.trainer_gpus}-{self.rollout_gpus}"

    @property
    def name(self) -> str:
        """Split, policy, concurrency and threshold in one label."""
        return f"{self.split}/{self.policy}/c{self.concurrency}/s{self.staleness_threshold:g}"

    def configuration(self) -> Configuration:
        """The scenario `Configuration` of the split."""
        return Configuration(
            name=self.split,
            trainer_gpus=self.trainer_gpus,
            rollout_gpus=self.rollout_gpus,
            hybrid=self.hybrid,
        )

    def scenario_for(self, scenario: Scenario) -> Scenario:
        """``scenario`` with this candidate's concurrency and threshold."""
        return scenario.with_values(
            schedule={
                "concurrent_samples_per_replica": self.concurrency,
                "staleness_threshold": self.staleness_threshold,
            }
        )

    def verl_overrides(self, gpus_per_node: int) -> dict[str, Any]:
        """The candidate as verl config keys (dotted), to set on the run's own config: each
        pool as ``nnodes`` x ``n_gpus_per_node``, the most GPUs per node up to
        ``gpus_per_node`` that divide the pool (12 GPUs on 8-GPU servers: 2 x 6), dynamic
        scheduling on for a hybrid split with its policy, the concurrency and threshold.

        Example:
            >>> Candidate(trainer_gpus=24, rollout_gpus=8, hybrid=True, policy="default",
            ...           concurrency=32, staleness_threshold=0.5).verl_overrides(8)["trainer.nnodes"]
            3
        """
        out: dict[str, Any] = {}
        for pool, gpus in (("trainer", self.trainer_gpus), ("rollout", self.rollout_gpus)):
            per = max(d for d in range(1, max(min(gpus, gpus_per_node), 1) + 1) if gpus % d == 0)
            out[f"{pool}.nnodes"] = gpus // per if gpus else 0
            out[f"{pool}.n_gpus_per_node"] = per if gpus else gpus_per_node
        out["async_training.use_dynamic_resource_scheduling"] = self.hybrid
        if self.hybrid:
            out["async_training.dynamic_schedule_policy"] = self.policy
        out["async_training.concurrent_samples_per_replica"] = self.concurrency
        out["async_training.staleness_threshold"] = self.staleness_threshold
        return out

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (also ``name``)."""
        return {"name": self.name, **attrs.asdict(self)}


@attrs.frozen(kw_only=True)
class SplitEstimate:
    """The analytical model's best estimate for one split (the plot's curve).

    Attributes:
        trainer_gpus: Trainer GPUs.
        rollout_gpus: Standalone rollout GPUs.
        hybrid: Hybrid replicas on the trainer GPUs.
        estimate_s: Best fluid estimate over the split's feasible concurrencies and
            thresholds (None when none is feasible).
        problem: Why no candidate of the split is feasible ("" when one is).
    """

    trainer_gpus: int
    rollout_gpus: int
    hybrid: bool
    estimate_s: float | None
    problem: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class PlannedCandidate:
    """A simulated candidate with what the plan predicts for it.

    Attributes:
        candidate: The candidate.
        time_s: Simulated wall-clock over the seeds (mean, spread).
        estimate_s: The fluid estimate (first seed).
        lower_bound_s: Mean lower bound over the seeds.
        efficiency: ``lower bound / simulated`` over the seeds.
        predicted_staleness: Closed-form mean staleness (first seed).
        simulated_staleness: Measured mean staleness, mean over the seeds.
        why_next_lost: Why the next candidate in the ranking ranks below this one
            ("" for the last).
    """

    candidate: Candidate
    time_s: Spread
    estimate_s: float
    lower_bound_s: float
    efficiency: Spread
    predicted_staleness: float
    simulated_staleness: float
    why_next_lost: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "candidate": self.candidate.to_json(),
            "time_s": self.time_s.to_json(),
            "estimate_s": _finite_or_none(self.estimate_s),
            "lower_bound_s": self.lower_bound_s,
            "efficiency": self.efficiency.to_json(),
            "predicted_staleness": _finite_or_none(self.predicted_staleness),
            "simulated_staleness": self.simulated_staleness,
            "why_next_lost": self.why_next_lost,
        }


def _finite_or_none(x: float) -> float | None:
    """``x``, or None where it is not a finite number (JSON has no inf or NaN)."""
    return x if math.isfinite(x) else None


@attrs.frozen(kw_only=True)
class Plan:
    """The result of `plan`.

    Attributes:
        scenario: Scenario name.
        gpus: The GPU budget.
        staleness_bound: Bound on the predicted mean staleness.
        simulated_staleness_bound: Bound on the simulated mean staleness over the seeds
            (None: none); the best candidate is within it.
        seeds: Workload seeds every simulated candidate ran.
        ranked: The simulated candidates, fastest first.
        splits: Per split, the analytical model's best estimate.
        candidates: Candidates considered (every split, concurrency, threshold, policy).
        pruned: Candidates not simulated, counted by reason.
        rests_on: What the plan rests on (simulator, calibration, seeds, models, rules).
        pruning_rule: The rule that chose what to simulate.
        seconds: Wall time of the planning.
        gpus_per_node: GPUs per server of the scenario (`verl_overrides` places the pick's
            pools on whole servers of this size).
        reference: The scenario's own configuration (`own_candidate`) as simulated on
            the seeds (ranked with the others where the plan could pick it); None where
            the core refuses its schedule.
    """

    scenario: str
    gpus: int
    staleness_bound: float
    seeds: tuple[int, ...]
    ranked: tuple[PlannedCandidate, ...]
    splits: tuple[SplitEstimate, ...]
    candidates: int
    pruned: Mapping[str, int]
    rests_on: tuple[str, ...]
    pruning_rule: str
    seconds: float = attrs.field(eq=False)
    simulated_staleness_bound: float | None = None
    gpus_per_node: int = 8
    reference: PlannedCandidate | None = None

    @property
    def best(self) -> PlannedCandidate:
        """The fastest simulated candidate."""
        return self.ranked[0]

    @property
    def verl_overrides(self) -> dict[str, Any]:
        """The best candidate as verl config keys (`Candidate.verl_overrides`)."""
        return self.best.candidate.verl_overrides(self.gpus_per_node)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (``plan.json``)."""
        return {
            "scenario": self.scenario,
            "gpus": self.gpus,
            "staleness_bound": self.staleness_bound,
            "simulated_staleness_bound": self.simulated_staleness_bound,
            "seeds": list(self.seeds),
            "best": self.best.to_json(),
            "ranked": [r.to_json() for r in self.ranked],
            "splits": [s.to_json() for s in self.splits],
            "candidates": self.candidates,
            "simulated": len(self.ranked),
            "pruned": dict(self.pruned),
            "rests_on": list(self.rests_on),
            "pruning_rule": self.pruning_rule,
            "seconds": self.seconds,
            "gpus_per_node": self.gpus_per_node,
            "verl_overrides": self.verl_overrides,
            "reference": None if self.reference is None else self.reference.to_json(),
        }


# ------------------------------------------------------------------------------ inputs
def check_plan_inputs(
    scenario: Scenario,
    *,
    gpus: int | None,
    staleness_bound: float | None,
    seeds: int,
    shortlist: int | None,
    flags: bool = False,
    simulated_staleness_bound: float | str | None = None,
) -> None:
    """Every planner input in range.

    Raises:
        PlanError: naming the parameter (``--gpus`` style when ``flags``) and its range.
    """

    def name(p: str) -> str:
        return "--" + p.replace("_", "-") if flags else p

    g = scenario.engine.gpus_per_replica
    for param, value, lo, hi, what in (
        ("gpus", gpus, g, MAX_PLAN_GPUS, f" (one replica is {g} GPUs)"),
        ("seeds", seeds, 1, MAX_PLAN_SEEDS, ""),
        ("shortlist", shortlist, 1, MAX_SHORTLIST, ""),
    ):
        ok = isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
        if value is not None and not ok:
            shown = "a huge number" if isinstance(value, int) and abs(value) > 10**30 else value
            raise PlanError(
                f"{name(param)} must be an integer >= {lo}{what} and <= {hi:,}, got {shown!r}"
            )
    for param, bound in (
        ("staleness_bound", staleness_bound),
        ("simulated_staleness_bound", simulated_staleness_bound),
    ):
        if param == "simulated_staleness_bound" and bound == SCENARIO_STALENESS:
            continue
        if bound is not None and not (
            isinstance(bound, int | float)
            and not isinstance(bound, bool)
            and 0.0 <= bound < math.inf
        ):
            also = f" or {SCENARIO_STALENESS!r}" if param == "simulated_staleness_bound" else ""
            raise PlanError(
                f"{name(param)} must be a finite number >= 0 (policy versions "
                f"behind per sample){also}, got {bound!r}"
            )


def memory_problem(scenario: Scenario, trainer_gpus: int, rollout_gpus: int, hybrid: bool) -> str:
    """Why a split does not fit in memory ("" when it fits; `MEMORY_RULE`)."""
    hw, llm, eng = scenario.hardware, scenario.model, scenario.engine
    gpu = hw.gpu_memory_gib * _GIB
    state = scenario.trainer.resident_bytes_per_gpu(llm, trainer_gpus)
    if state > gpu:
        return (
            f"memory: trainer state {state / _GIB:.1f} GiB per GPU on {trainer_gpus} GPUs "
            f"exceeds {hw.gpu_memory_gib:g} GiB"
        )
    roles = (["standalone"] if rollout_gpus else []) + (["hybrid"] if hybrid else [])
    for role in roles:
        try:
            eng.max_running(role, hw, llm)
        except ValueError as e:
            return f"memory: {e}"
    if hybrid and not scenario.trainer.offload_state:
        engine = eng.hybrid_memory_fraction * gpu
        if engine + state > gpu:
            return (
                f"memory: an awake hybrid replica ({engine / _GIB:.1f} GiB per GPU) does not "
                f"fit next to the resident trainer state ({state / _GIB:.1f} GiB per GPU)"
            )
    return ""


def _splits(gpus: int, g: int) -> Iterator[tuple[int, int, bool]]:
    """``(trainer, rollout, hybrid)`` of every split of ``gpus`` (rollout in whole replicas,
    trainer >= 1 GPU, hybrid only on whole replicas of trainer GPUs)."""
    for rollout in range(0, gpus, g):
        trainer = gpus - rollout
        if rollout:
            yield trainer, rollout, False
        if trainer % g == 0:
            yield trainer, rollout, True


def _knobs(scenario: Scenario) -> tuple[list[int], list[float]]:
    """The concurrencies and staleness thresholds tried."""
    base = scenario.schedule_config(scenario.configurations[0])
    per = base.concurrent_samples_per_replica
    conc = sorted({max(1, round(per * f)) for f in CONCURRENCY_FACTORS})
    thresholds = sorted({*DEFAULT_THRESHOLDS, float(base.staleness_threshold)})
    return conc, thresholds


def _candidates(
    scenario: Scenario, gpus: int, policies: Sequence[str]
) -> list[tuple[Candidate, tuple[str, ...]]]:
    """Every analytical candidate (policy: its first) with the policies it runs."""
    dynamic = tuple(p for p in policies if p != STATIC_POLICY)
    conc, thresholds = _knobs(scenario)
    out = []
    for trainer, rollout, hybrid in _splits(gpus, scenario.engine.gpus_per_replica):
        if not hybrid:
            runs: tuple[str, ...] = (STATIC_POLICY,) if STATIC_POLICY in policies else ()
        else:
            runs = dynamic if rollout else (dynamic or tuple(policies))[:1]
        for c in conc if runs else ():
            for s in thresholds:
                cand = Candidate(
                    trainer_gpus=trainer,
                    rollout_gpus=rollout,
                    hybrid=hybrid,
                    policy=runs[0],
                    concurrency=c,
                    staleness_threshold=s,
                )
                out.append((cand, runs))
    return out


# ------------------------------------------------------------------------ analytical
@attrs.frozen
class _Assessment:
    candidate: Candidate
    policies: tuple[str, ...]
    problem: str
    estimate_s: float = math.inf
    staleness: float = math.nan


def _period(scenario: Scenario, conf: Configuration, cfg: Any, resp: Any, tokens: float) -> float:
    """Steady seconds per micro-step: the trainer against the rollout pools (module doc)."""
    sc, hw, llm = scenario, scenario.hardware, scenario.model
    b, t_sync = cfg.required_samples, cfg.trigger_parameter_sync_step
    mean_len = float(resp.mean())
    tail = float(resp.max(axis=1).mean()) / mean_len
    g, per, m = (
        sc.engine.gpus_per_replica,
        cfg.concurrent_samples_per_replica,
        cfg.max_required_samples,
    )
    n_s, n_h = conf.rollout_gpus // g, (conf.trainer_gpus // g if conf.hybrid else 0)
    l_s = _pool_rate(sc, "standalone", n_s, min(per * n_s, m), tail, mean_len)[0]
    l_h = _pool_rate(sc, "hybrid", n_h, min(per * n_h, m), tail, mean_len)[0]
    sync = sc.engine.broadcast_sync_s(hw, llm) if n_s else 0.0
    swap = sc.trainer.state_swap_s(hw, llm, conf.trainer_gpus)
    train = sc.trainer.step_s(int(b * tokens), conf.trainer_gpus, swap) + sync / t_sync
    rollout = b / l_s + sync / t_sync if l_s > 0 else math.inf
    if l_h > 0:
        switch = sc.engine.wake_s(hw, llm) + sc.engine.sleep_s(hw, llm)
        switch += sc.engine.local_sync_s(hw, llm)
        lent = (t_sync * b + l_h * (t_sync * train + switch)) / (t_sync * (l_s + l_h))
        rollout = min(rollout, lent)
    period: float = max(train, rollout)
    return period


def _assess(
    scenario: Scenario,
    cand: Candidate,
    policies: tuple[str, ...],
    seed: int,
    bound: float | None,
) -> _Assessment:
    """Feasibility, closed-form staleness and fluid estimate of one candidate."""
    problem = memory_problem(scenario, cand.trainer_gpus, cand.rollout_gpus, cand.hybrid)
    if problem:
        return _Assessment(cand, policies, problem)
    sc, conf = cand.scenario_for(scenario), cand.configuration()
    try:
        cfg = sc.schedule_config(conf, cand.policy)
    except ScenarioError as e:
        return _Assessment(cand, policies, f"schedule: {e}")
    stale = predicted_staleness_for(sc, conf, cand.policy, seed=seed)
    if bound is not None and stale > bound + 1e-12:
        return _Assessment(cand, policies, "predicted staleness over the bound", staleness=stale)
    consumed = sc.steps * cfg.required_samples
    wl = sc.workload.generate(admissible_prompts(sc, conf, cfg), seed, run_samples=consumed)
    lb = lower_bound(sc, conf, wl, cfg)
    resp, tokens = wl.response_lens[:consumed], float(wl.group_tokens()[:consumed].mean())
    fluid = lb.step_starts_s[0] + sc.steps * _period(sc, conf, cfg, resp, tokens)
    return _Assessment(cand, policies, "", max(lb.seconds, fluid), stale)


def _split_estimates(assessed: Sequence[_Assessment]) -> tuple[SplitEstimate, ...]:
    """Per split, the best feasible estimate (or the first problem)."""
    by: dict[tuple[int, int, bool], list[_Assessment]] = {}
    for a in assessed:
        c = a.candidate
        by.setdefault((c.trainer_gpus, c.rollout_gpus, c.hybrid), []).append(a)
    out = []
    for (t, r, h), group in by.items():
        ok = [a.estimate_s for a in group if not a.problem]
        est = min(ok) if ok else None
        out.append(
            SplitEstimate(
                trainer_gpus=t,
                rollout_gpus=r,
                hybrid=h,
                estimate_s=est,
                problem="" if ok else group[0].problem,
            )
        )
    return tuple(sorted(out, key=lambda s: (s.trainer_gpus, s.hybrid)))


# ------------------------------------------------------------------------- simulated
#: A plan's simulated candidates by `_knob_key` (the runs are deterministic: a candidate
#: reached twice, e.g. the scenario's own configuration and a shortlisted one, runs once).
_Simulations = dict[tuple[str, str, int, float], "PlannedCandidate"]


def _simulated(
    scenario: Scenario,
    a: _Assessment,
    policy: str,
    seeds: Sequence[int],
    known: _Simulations | None = None,
) -> PlannedCandidate:
    """Run one candidate over the seeds (or take it from ``known``, where it is added)."""
    cand = attrs.evolve(a.candidate, policy=policy)
    key = _knob_key(cand)
    if known is not None and key in known:
        return known[key]
    sc, conf = cand.scenario_for(scenario), cand.configuration()
    runs = [run_configuration(sc, conf, policy, seed=s) for s in seeds]
    done = PlannedCandidate(
        candidate=cand,
        time_s=Spread.of([r.wall_clock_s for r in runs]),
        estimate_s=a.estimate_s,
        lower_bound_s=sum(r.lower_bound_s for r in runs) / len(runs),
        efficiency=Spread.of([r.efficiency for r in runs]),
        predicted_staleness=a.staleness,
        simulated_staleness=sum(r.staleness.get("mean", 0.0) for r in runs) / len(runs),
    )
    if known is not None:
        known[key] = done
    return done


#: Slack of the simulated staleness bound (a candidate's mean equal to the bound is within).
_STALE_EPS = 1e-9


def _within(d: PlannedCandidate, sim_bound: float | None) -> bool:
    """Whether a simulated candidate's measured mean staleness is within the bound."""
    return sim_bound is None or d.simulated_staleness <= sim_bound + _STALE_EPS


def _best(done: Sequence[PlannedCandidate], sim_bound: float | None) -> PlannedCandidate:
    """The fastest candidate within the simulated bound (the fastest of all if none is)."""
    return min(done, key=lambda d: (not _within(d, sim_bound), d.time_s.mean))


def _mean_bound(scenario: Scenario, cand: Candidate, seeds: Sequence[int]) -> float:
    """Mean over the seeds of the candidate's lower bound (inside a `planner_enabled`
    block, where its runs are re-planned: relaxed over every split the planner reaches,
    as its simulated runs' bounds are)."""
    sc, conf = cand.scenario_for(scenario), cand.configuration()
    cfg = sc.schedule_config(conf, cand.policy)
    splits = planned_splits(sc, conf)
    consumed = sc.steps * cfg.required_samples
    total = 0.0
    for s in seeds:
        wl = sc.workload.generate(admissible_prompts(sc, conf, cfg), s, run_samples=consumed)
        total += lower_bound(sc, conf, wl, cfg, splits=splits).seconds
    return total / len(seeds)


def _shortlisted(feasible: Sequence[_Assessment], k: int) -> list[_Assessment]:
    """One candidate of each of the ``k`` best splits (by their best estimate): of the
    split's candidates estimated within `WINDOW_TOLERANCE` of its best, the one with the
    largest staleness threshold, and of those the best estimate (``feasible`` is in
    estimate order)."""
    groups: dict[str, list[_Assessment]] = {}
    for a in feasible:
        if a.candidate.split in groups or len(groups) < k:
            groups.setdefault(a.candidate.split, []).append(a)
    chosen = []
    for group in groups.values():
        near = [a for a in group if a.estimate_s <= group[0].estimate_s * (1 + WINDOW_TOLERANCE)]
        widest = max(a.candidate.staleness_threshold for a in near)
        chosen.append(next(a for a in near if a.candidate.staleness_threshold == widest))
    return chosen


def _run_shortlist(
    scenario: Scenario,
    feasible: Sequence[_Assessment],
    seeds: Sequence[int],
    shortlist: int | None,
    note: Callable[[str], None],
    sim_bound: float | None = None,
    known: _Simulations | None = None,
) -> tuple[list[PlannedCandidate], dict[str, int]]:
    """Simulate what the rule selects; the simulated candidates and the skipped counts.

    Shortlist: each split with its first policy, then the best split's other policies."""
    pruned: dict[str, int] = {}
    done: list[PlannedCandidate] = []
    if shortlist is None:
        _exact(scenario, feasible, seeds, done, pruned, note, sim_bound, known)
        return done, pruned
    chosen = _shortlisted(feasible, shortlist)
    for i, a in enumerate(chosen, 1):
        note(f"simulating split {i}/{len(chosen)}: {a.candidate.name} over {len(seeds)} seed(s)")
        done.append(_simulated(scenario, a, a.policies[0], seeds, known))
    best = _best(done, sim_bound)
    top = next(a for a in chosen if a.candidate.split == best.candidate.split)
    for policy in top.policies[1:]:
        note(f"simulating policy {policy} on {top.candidate.split}")
        done.append(_simulated(scenario, top, policy, seeds, known))
    return done, pruned


def _exact(
    scenario: Scenario,
    feasible: Sequence[_Assessment],
    seeds: Sequence[int],
    done: list[PlannedCandidate],
    pruned: dict[str, int],
    note: Callable[[str], None],
    sim_bound: float | None = None,
    known: _Simulations | None = None,
) -> None:
    """Every feasible candidate in estimate order unless its lower bound cannot win (against
    the best simulated mean within the simulated staleness bound)."""
    key = "lower bound at or above the best simulated time"
    jobs = [(a, p) for a in feasible for p in a.policies]
    for i, (a, policy) in enumerate(jobs, 1):
        best = min((d.time_s.mean for d in done if _within(d, sim_bound)), default=math.inf)
        if _mean_bound(scenario, attrs.evolve(a.candidate, policy=policy), seeds) >= best:
            pruned[key] = pruned.get(key, 0) + 1
            continue
        note(f"simulating {i}/{len(jobs)}: {a.candidate.name} ({policy}) over {len(seeds)} seed(s)")
        done.append(_simulated(scenario, a, policy, seeds, known))


def _knob_key(c: Candidate) -> tuple[str, str, int, float]:
    return (c.split, c.policy, c.concurrency, c.staleness_threshold)


def _refine(
    scenario: Scenario,
    feasible: Sequence[_Assessment],
    seeds: Sequence[int],
    done: list[PlannedCandidate],
    note: Callable[[str], None],
    sim_bound: float | None = None,
    known: _Simulations | None = None,
) -> int:
    """Hill-climb the best simulated candidate's concurrency and threshold (one step of
    each either way, same split and policy) while a neighbour is better (`_best`: faster
    within the simulated staleness bound); runs added."""
    conc, thresholds = _knobs(scenario)
    index = {
        _knob_key(attrs.evolve(a.candidate, policy=p)): a for a in feasible for p in a.policies
    }
    tried = {_knob_key(d.candidate) for d in done}
    added = 0
    for _ in range(_REFINE_ROUNDS):
        best = _best(done, sim_bound)
        c = best.candidate
        i, j = conc.index(c.concurrency), thresholds.index(c.staleness_threshold)
        steps = [(i + di, j) for di in (-1, 1)] + [(i, j + dj) for dj in (-1, 1)]
        keys = [
            (c.split, c.policy, conc[a], thresholds[b])
            for a, b in steps
            if 0 <= a < len(conc) and 0 <= b < len(thresholds)
        ]
        fresh = [k for k in keys if k in index and k not in tried]
        for k in fresh:
            tried.add(k)
            note(f"refining: {c.split}/{c.policy}/c{k[2]}/s{k[3]:g}")
            done.append(_simulated(scenario, index[k], c.policy, seeds, known))
            added += 1
        if _best(done, sim_bound) is best:
            break
    return added


def _why(
    a: PlannedCandidate, b: PlannedCandidate, bound: float | None, sim_bound: float | None = None
) -> str:
    """Why ``b`` ranks below ``a``."""
    slower = b.time_s.mean / a.time_s.mean - 1.0
    if not _within(b, sim_bound):
        assert sim_bound is not None
        pace = "slower" if slower >= 0 else "faster"
        return (
            f"simulated staleness {b.simulated_staleness:.3f} over the simulated bound "
            f"{sim_bound:.3f} ({pace} by {100 * abs(slower):.1f}%)"
        )
    text = f"slower by {100 * slower:.1f}%"
    if abs(b.time_s.mean - a.time_s.mean) <= max(a.time_s.std, b.time_s.std):
        text += " (within the seed spread)"
    if bound is not None and b.simulated_staleness > bound:
        text += f"; simulated staleness {b.simulated_staleness:.2f} over the bound"
    return text


def _ranked(
    done: Sequence[PlannedCandidate], bound: float | None, sim_bound: float | None = None
) -> tuple[PlannedCandidate, ...]:
    """Fastest first; with a simulated staleness bound, those within it first."""
    order = sorted(
        done,
        key=lambda d: (not _within(d, sim_bound), d.time_s.mean, d.estimate_s, d.candidate.name),
    )
    return tuple(
        attrs.evolve(
            d,
            why_next_lost=_why(d, order[i + 1], bound, sim_bound) if i + 1 < len(order) else "",
        )
        for i, d in enumerate(order)
    )


def own_candidate(scenario: Scenario) -> Candidate:
    """The scenario's own configuration as a candidate: its first dynamic configuration
    (else its first) with the scenario's policy, concurrency and staleness threshold."""
    conf = next((c for c in scenario.configurations if c.hybrid), scenario.configurations[0])
    cfg = scenario.schedule_config(conf)
    return Candidate(
        trainer_gpus=conf.trainer_gpus,
        rollout_gpus=conf.rollout_gpus,
        hybrid=conf.hybrid,
        policy=cfg.dynamic_schedule_policy if conf.hybrid else STATIC_POLICY,
        concurrency=cfg.concurrent_samples_per_replica,
        staleness_threshold=float(cfg.staleness_threshold),
    )


def _own_reference(
    scenario: Scenario,
    seeds: Sequence[int],
    staleness_bound: float,
    rankable: Callable[[Candidate], bool],
    note: Callable[[str], None],
    *,
    sets_bound: bool,
    known: _Simulations | None = None,
) -> tuple[PlannedCandidate | None, bool]:
    """The scenario's own configuration simulated over the seeds, and whether it joins the
    ranking (``rankable``, and it passes the memory rule and the closed-form bound: the
    simulator runs it either way, so it still sets a bound and is reported). None where
    the core refuses its schedule.

    Raises:
        PlanError: the core refuses its schedule and ``sets_bound`` (no bound from it).
    """
    cand = own_candidate(scenario)
    a = _assess(scenario, cand, (cand.policy,), seeds[0], None)
    if a.problem.startswith("schedule"):
        if not sets_bound:
            note(f"the scenario's own configuration {cand.name} cannot run ({a.problem})")
            return None, False
        raise PlanError(
            f"simulated_staleness_bound {SCENARIO_STALENESS!r}: the scenario's own "
            f"configuration {cand.name} cannot run ({a.problem})"
        )
    note(f"simulating the scenario's own configuration {cand.name} over {len(seeds)} seed(s)")
    ranked = not a.problem and rankable(cand) and a.staleness <= staleness_bound + 1e-12
    return _simulated(scenario, a, cand.policy, seeds, known), ranked


def _feasible(
    scenario: Scenario,
    gpus: int,
    policies: Sequence[str],
    seed: int,
    staleness_bound: float,
    note: Callable[[str], None],
) -> tuple[list[_Assessment], list[_Assessment]]:
    """Every candidate assessed, and the feasible ones in estimate order.

    Raises:
        PlanError: no feasible candidate (naming why each kind failed).
    """
    todo = _candidates(scenario, gpus, list(policies))
    note(f"plan {scenario.name}: {len(todo)} analytical candidates on {gpus} GPUs")
    assessed = [_assess(scenario, c, runs, seed, staleness_bound) for c, runs in todo]
    feasible = sorted((a for a in assessed if not a.problem), key=lambda a: a.estimate_s)
    if not feasible:
        reasons = sorted({a.problem.split(":")[0] for a in assessed}) or ["no split"]
        raise PlanError(f"no feasible candidate on {gpus} GPUs ({', '.join(reasons)})")
    return assessed, feasible


def _check_within(ranked: Sequence[PlannedCandidate], sim_bound: float | None) -> None:
    """Raises `PlanError` when no simulated candidate is within the simulated bound."""
    if not _within(ranked[0], sim_bound):
        least = min(ranked, key=lambda d: d.simulated_staleness)
        raise PlanError(
            f"simulated_staleness_bound {sim_bound!r}: no simulated candidate is within it "
            f"({len(ranked)} simulated; least simulated mean staleness "
            f"{least.simulated_staleness:.4f}, {least.candidate.name})"
        )


def _numeric_bound(bound: float | str | None, reference: PlannedCandidate | None) -> float | None:
    """The simulated staleness bound as a number (``"scenario"``: the reference's)."""
    if bound == SCENARIO_STALENESS:
        assert reference is not None  # _own_reference raised otherwise
        return reference.simulated_staleness
    return None if bound is None else float(bound)


def _add_once(done: list[PlannedCandidate], d: PlannedCandidate) -> None:
    """Add ``d`` unless its candidate was simulated already (the same runs)."""
    if _knob_key(d.candidate) not in {_knob_key(x.candidate) for x in done}:
        done.append(d)


def _rests_on(
    scenario: Scenario,
    seeds: Sequence[int],
    rule: str,
    sim_bound: float | None = None,
    reference: PlannedCandidate | None = None,
    bound_from_reference: bool = False,
) -> tuple[str, ...]:
    from dynsched_sim import __version__

    labels: dict[str, int] = {}
    for p in scenario.parameter_paths():
        label = (scenario.label_of(p) or ("unlabelled",))[0]
        labels[label] = labels.get(label, 0) + 1
    fitted = [f"{p} ({(scenario.label_of(p) or ('', ''))[1]})" for p in scenario.fitted()]
    simulated: tuple[str, ...] = (
        (
            f"simulated staleness bound {sim_bound:g}: the best candidate's measured mean "
            "staleness over the seeds is within it",
        )
        if sim_bound is not None
        else ()
    )
    if reference is not None:
        bound_from = (
            "the bound is the measured mean staleness of the scenario's own configuration"
            if bound_from_reference
            else "the scenario's own configuration"
        )
        simulated += (
            f"{bound_from} {reference.candidate.name} simulated on the same seeds (ranked "
            "with the simulated candidates when it has the plan's GPUs and one of its "
            "policies and passes the memory rule and the closed-form bound)",
        )
    return (
        f"simulator: dynsched-sim {__version__} (the real core on virtual time); times and "
        "staleness are predictions of its cost models",
        f"scenario {scenario.name!r}: {scenario.description}".strip(),
        f"scenario {scenario.name!r} parameters by provenance label: "
        + ", ".join(f"{n} {k}" for k, n in sorted(labels.items())),
        "fitted: " + ("; ".join(fitted) if fitted else "none"),
        f"workload seeds: {list(seeds)}",
        "staleness: closed form (dynsched_sim.predicted_staleness_for, first seed)",
        *simulated,
        MEMORY_RULE,
        f"pruning: {rule}",
    )


def plan(
    scenario: Scenario | str | os.PathLike[str],
    *,
    gpus: int | None = None,
    staleness_bound: float | None = None,
    seeds: int = 3,
    shortlist: int | None = 4,
    policies: Sequence[str] = DEFAULT_PLAN_POLICIES,
    progress: Progress | None = None,
    simulated_staleness_bound: float | str | None = None,
) -> Plan:
    """The candidate with the shortest simulated time among those the analytical model
    shortlists, with every simulated candidate ranked (module docstring).

    Args:
        scenario: A `Scenario`, a built-in name or a scenario file.
        gpus: GPU budget (default: the scenario's largest configuration).
        staleness_bound: Most predicted mean staleness (versions behind per sample);
            None: the scenario's ``staleness_threshold`` (under verl's rule no run exceeds
            it on average, so the plan never predicts more staleness than the scenario's
            own setting allows).
        seeds: Workload seeds simulated per candidate (the scenario's seed onwards).
        shortlist: Splits simulated; None: exact search over the candidate set.
        policies: Policies to consider (``static_fully_async`` allows static splits).
        progress: Called with one line per stage and simulated candidate.
        simulated_staleness_bound: Most *simulated* mean staleness (mean over the seeds)
            of the best candidate; None: no such bound. The closed-form bound still
            prefilters; simulated candidates over this one rank after every candidate
            within it and are never the best (module docstring). ``"scenario"``: the
            simulated mean staleness of the scenario's own configuration
            (`own_candidate`) on the same seeds. That configuration is simulated
            whatever this bound (`Plan.reference`) and joins the ranking when it has
            ``gpus`` GPUs, a policy among ``policies`` and passes the memory rule and
            the closed-form bound: the pick is never slower than it on the seeds.

    Raises:
        PlanError: an input out of range, no feasible candidate, or no simulated
            candidate within ``simulated_staleness_bound``.
    """
    start = time.perf_counter()
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    gpus = max(c.total_gpus for c in sc.configurations) if gpus is None else gpus
    if staleness_bound is None:
        staleness_bound = float(sc.schedule_config(sc.configurations[0]).staleness_threshold)
    check_plan_inputs(
        sc,
        gpus=gpus,
        staleness_bound=staleness_bound,
        seeds=seeds,
        shortlist=shortlist,
        simulated_staleness_bound=simulated_staleness_bound,
    )
    if not policies:
        raise PlanError("policies must name at least one policy")
    note = progress if progress is not None else (lambda _line: None)
    seed_list = tuple(range(sc.seed, sc.seed + seeds))
    assessed, feasible = _feasible(sc, gpus, policies, seed_list[0], staleness_bound, note)
    bound_from_own = simulated_staleness_bound == SCENARIO_STALENESS
    known: _Simulations = {}
    reference, rank_reference = _own_reference(
        sc,
        seed_list,
        staleness_bound,
        lambda c: c.total_gpus == gpus and c.policy in policies,
        note,
        sets_bound=bound_from_own,
        known=known,
    )
    sim_bound = _numeric_bound(simulated_staleness_bound, reference)
    rule = (
        EXACT_RULE
        if shortlist is None
        else PRUNING_RULE.format(k=shortlist, tol=100 * WINDOW_TOLERANCE)
    )
    done, pruned = _run_shortlist(sc, feasible, seed_list, shortlist, note, sim_bound, known)
    if shortlist is not None:
        _refine(sc, feasible, seed_list, done, note, sim_bound, known)
        left = sum(len(a.policies) for a in feasible) - len(done)
        if left:
            pruned["not shortlisted (fluid estimate)"] = left
    if reference is not None and rank_reference:
        _add_once(done, reference)
    for a in assessed:
        if a.problem:
            key = a.problem.split(":")[0] if ":" in a.problem else a.problem
            pruned[key] = pruned.get(key, 0) + len(a.policies)
    ranked = _ranked(done, staleness_bound, sim_bound)
    _check_within(ranked, sim_bound)
    return Plan(
        scenario=sc.name,
        gpus=gpus,
        staleness_bound=staleness_bound,
        seeds=seed_list,
        ranked=ranked,
        splits=_split_estimates(assessed),
        candidates=sum(len(a.policies) for a in assessed),
        pruned=pruned,
        rests_on=_rests_on(sc, seed_list, rule, sim_bound, reference, bound_from_own),
        pruning_rule=rule,
        seconds=time.perf_counter() - start,
        simulated_staleness_bound=sim_bound,
        gpus_per_node=sc.hardware.gpus_per_node,
        reference=reference,
    )


# ---------------------------------------------------------------------------- output
def format_plan(p: Plan, top: int = 10) -> str:
    """The best candidates as a table, with what the plan rests on."""
    head = [
        "#",
        "split",
        "policy",
        "conc",
        "thr",
        "time h (±sd)",
        "est h",
        "eff",
        "stale pred/sim",
        "why the next one lost",
    ]
    rows = [
        [
            str(i),
            r.candidate.split,
            r.candidate.policy,
            str(r.candidate.concurrency),
            f"{r.candidate.staleness_threshold:g}",
            f"{r.time_s.mean / 3600:.3f} ±{r.time_s.std / 3600:.3f}",
            f"{r.estimate_s / 3600:.3f}",
            f"{r.efficiency.mean:.3f}",
            f"{r.predicted_staleness:.2f}/{r.simulated_staleness:.2f}",
            r.why_next_lost,
        ]
        for i, r in enumerate(p.ranked[:top], 1)
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=False)]
    lines = [
        "  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)).rstrip()
        for row in (head, *rows)
    ]
    simulated = (
        ""
        if p.simulated_staleness_bound is None
        else f" (simulated: {p.simulated_staleness_bound:g})"
    )
    lines.insert(
        0,
        f"plan {p.scenario}: {p.gpus} GPUs, staleness bound {p.staleness_bound:g}{simulated}, "
        f"{p.candidates} candidates, {len(p.ranked)} simulated over seeds "
        f"{list(p.seeds)} in {p.seconds:.1f} s",
    )
    if p.reference is not None:
        r = p.reference
        same = p.simulated_staleness_bound == r.simulated_staleness
        bound_note = " (the simulated bound)" if same else ""
        lines.append(
            f"the scenario's own configuration {r.candidate.name}: "
            f"{r.time_s.mean / 3600:.3f} h ±{r.time_s.std / 3600:.3f}, simulated staleness "
            f"{r.simulated_staleness:.2f}{bound_note}; the pick is "
            f"{p.best.time_s.mean / r.time_s.mean:.3f} of its time"
        )
    lines.append("not simulated: " + ", ".join(f"{n} {k}" for k, n in sorted(p.pruned.items())))
    # what it rests on: the scenario (a verl config names its base) and the labels; the
    # rest (fitted sources, seeds, rules) in plan.json's rests_on
    lines += [f"rests on {r}" for r in p.rests_on if r.startswith("scenario ")]
    lines.append(
        "the best as verl overrides: "
        + " ".join(f"{k}={_verl_value(v)}" for k, v in p.verl_overrides.items())
    )
    return "\n".join(lines)


def _verl_value(v: Any) -> str:
    """A value as written on verl's (Hydra's) command line."""
    return str(v) if not isinstance(v, float) else f"{v:g}"


def write_plan(p: Plan, out_dir: str | os.PathLike[str], *, plot: bool = True) -> dict[str, str]:
    """``plan.json`` and (``plot``) ``plan.png`` in ``out_dir``; their paths."""
    import json

    from dynsched_core.storage import atomic_write_text

    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(os.fspath(out_dir), "plan.json")}
    atomic_write_text(paths["json"], json.dumps(p.to_json(), indent=2) + "\n")
    if plot:
        paths["plot"] = _plot(p, os.path.join(os.fspath(out_dir), "plan.png"))
    return paths


def _plot(p: Plan, path: str) -> str:
    """Predicted time against trainer share: the fluid estimate per split (lines) and the
    simulated candidates (mean ± std over the seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for hybrid, style in ((False, "C0"), (True, "C1")):
        pts = [
            (s.trainer_gpus / p.gpus, s.estimate_s / 3600)
            for s in p.splits
            if s.hybrid == hybrid and s.estimate_s is not None
        ]
        if pts:
            xs, ys = zip(*pts, strict=True)
            label = "hybrid" if hybrid else "static"
            ax.plot(xs, ys, "-", color=style, alpha=0.6, label=f"fluid estimate ({label})")
    for i, r in enumerate(p.ranked):
        c = r.candidate
        ax.errorbar(
            c.trainer_gpus / p.gpus,
            r.time_s.mean / 3600,
            yerr=r.time_s.std / 3600,
            fmt="o",
            color="C1" if c.hybrid else "C0",
            ms=4,
            label="simulated (mean ± sd over seeds)" if i == 0 else None,
        )
    b = p.best
    ax.plot(
        b.candidate.trainer_gpus / p.gpus,
        b.time_s.mean / 3600,
        "k*",
        ms=12,
        label=f"best: {b.candidate.name}",
    )
    ax.set_xlabel("trainer share of the GPUs")
    ax.set_ylabel("predicted time (h)")
    ax.set_title(f"dynsched plan {p.scenario} ({p.gpus} GPUs)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
