"""Run one configuration of a scenario with one policy through the core's reference loop."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

import attrs
from dynsched_core import (
    DynamicScheduleConfig,
    EventBus,
    FullyAsyncLoop,
    LoopResult,
    RetryingClient,
    RolloutSample,
)
from dynsched_core.errors import SampleWaitTimeoutError
from dynsched_core.events import ReplicaModeEvent, TrainStepEvent, TransitionEvent
from dynsched_core.planner import RolePlannerOptions
from dynsched_metrics import CycleMetrics, MetricsAggregator

from dynsched_sim._bound import LowerBound, lower_bound
from dynsched_sim._cluster import SimCluster, build_cluster, prompt_source, run_workload
from dynsched_sim._mover import SimRoleMover
from dynsched_sim._planner import (
    PLANNER_SUFFIX,
    PlannerSpec,
    build_planner,
    reachable_configurations,
    resolve,
)
from dynsched_sim._scenario import Configuration, Scenario, ScenarioError
from dynsched_sim._trainer import SimTrainer
from dynsched_sim._vloop import VirtualTimeEventLoop, deferred_interrupts, stop_quietly
from dynsched_sim._workload import Workload

__all__ = [
    "STATIC_POLICY",
    "RunResult",
    "SimulationStalledError",
    "policy_for",
    "queue_ceiling",
    "run_configuration",
    "run_lower_bound",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

STATIC_POLICY = "static_fully_async"
PROXY_KEYS = (
    "dynamic_resource/train_resource_utilization",
    "dynamic_resource/rollout_resource_utilization",
    "dynamic_resource/resource_utilization",
    "dynamic_resource/mq_size",
)

_FOREVER_S = 30 * 24 * 3600.0
"""Bound of every wait in a simulated run (30 simulated days: a stuck pipeline, not a slow one)."""

ProgressFn = Callable[[int, int, float], None]


class SimulationStalledError(ScenarioError):
    """A simulated run waited longer than `_FOREVER_S` for samples: the scenario's speeds
    make a step take simulated weeks (e.g. a prefill of minutes per token)."""


@attrs.frozen(kw_only=True)
class RunResult:
    """Everything measured in one simulated run (deterministic for a given seed).

    Attributes:
        scenario: Scenario name.
        configuration: Configuration name.
        policy: Policy name.
        seed: Workload seed.
        wall_clock_s: Simulated wall-clock of the training run.
        lower_bound_s: `dynsched_sim.lower_bound` of the configuration (with a planner:
            relaxed over every split the planner can reach).
        efficiency: ``lower_bound_s / wall_clock_s``.
        summary: Counters (samples, switches, aborts, re-routed requests, ...).
        true_utilization: Ground truth per pool (``trainer``, ``standalone``,
            ``cluster``): fraction of GPU-time per mode.
        proxy_metrics: Mean over sync cycles of each ``dynamic_resource/*`` metric.
        cycles: Per-cycle ``dynamic_resource/*`` metrics (dicts with ``step``).
        steps: Per micro-step: ``[step, end time, mq_size, collect wait s, in flight]``
            (``in flight``: samples admitted and not finished when ``mq_size`` was read).
        conservation: Conservation checks (all must be True).
        events: Callbacks the virtual loop scheduled.
        mode_events: Ground-truth mode changes (for the layout plot; not serialised).
        state_events: Hybrid state transitions (for the layout plot; not serialised).
        queue_capacity: Capacity of the sample queue.
        staleness: Per-sample staleness of the consumed samples, in policy versions
            behind (`StalenessLedger.summary`: ``count``, ``mean``, ``p95``, ``max`` by
            the first token's version; ``last_token_mean``, ``admitted_mean``).
    """

    scenario: str
    configuration: str
    policy: str
    seed: int
    wall_clock_s: float
    lower_bound_s: float
    efficiency: float
    summary: Mapping[str, Any]
    true_utilization: Mapping[str, Mapping[str, float]]
    proxy_metrics: Mapping[str, float]
    cycles: tuple[Mapping[str, float], ...]
    steps: tuple[tuple[int, float, int, float, int], ...]
    conservation: Mapping[str, bool]
    events: int
    mode_events: tuple[ReplicaModeEvent, ...] = attrs.field(default=(), repr=False, eq=False)
    state_events: tuple[TransitionEvent, ...] = attrs.field(default=(), repr=False, eq=False)
    queue_capacity: int = 0
    staleness: Mapping[str, float] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (the ``runs`` entries of ``result.json``)."""
        return {
            "scenario": self.scenario,
            "configuration": self.configuration,
            "policy": self.policy,
            "seed": self.seed,
            "wall_clock_s": self.wall_clock_s,
            "wall_clock_h": self.wall_clock_s / 3600.0,
            "lower_bound_s": self.lower_bound_s,
            "efficiency": self.efficiency,
            "summary": dict(self.summary),
            "true_utilization": {k: dict(v) for k, v in self.true_utilization.items()},
            "proxy_metrics": dict(self.proxy_metrics),
            "cycles": [dict(c) for c in self.cycles],
            "steps": [list(s) for s in self.steps],
            "conservation": dict(self.conservation),
            "events": self.events,
            "staleness": dict(self.staleness),
        }


def policy_for(conf: Configuration, policy: str) -> str:
    """The policy a configuration runs with: static splits always use `STATIC_POLICY`."""
    return policy if conf.hybrid else STATIC_POLICY


@attrs.frozen
class _Outcome:
    cluster: SimCluster
    result: LoopResult
    cycles: list[CycleMetrics]
    left: list[RolloutSample]
    mode_events: list[ReplicaModeEvent]
    bound: LowerBound
    floop: FullyAsyncLoop
    state_events: list[TransitionEvent]
    blocked: list[int]
    in_flight: list[int]
    mover: SimRoleMover | None = None


async def _run(
    scenario: Scenario,
    conf: Configuration,
    cfg: DynamicScheduleConfig,
    seed: int,
    progress: ProgressFn | None,
    spec: PlannerSpec | None = None,
) -> _Outcome:
    loop = asyncio.get_running_loop()
    bus = EventBus()
    truth_bus = EventBus()
    mode_events: list[ReplicaModeEvent] = []
    truth_bus.subscribe(mode_events.append)
    cluster = build_cluster(
        scenario, conf, seed=seed, events=truth_bus, clock=loop.time, config=cfg
    )
    pol = cfg.build_policy()
    agg = MetricsAggregator(
        hybrid_gpus=conf.trainer_gpus, standalone_gpus=conf.rollout_gpus, bus=bus
    )
    blocked: list[int] = [0, 0, 0]
    state_events: list[TransitionEvent] = []
    bus.subscribe(state_events.append, TransitionEvent)
    in_flight: list[int] = []
    if progress is not None:
        total = scenario.steps

        def on_step(e: TrainStepEvent) -> None:
            progress(e.step, total, e.time)

        bus.subscribe(on_step, TrainStepEvent)
    planner, mover = (None, None) if spec is None else build_planner(spec, scenario, cluster, cfg)
    floop = FullyAsyncLoop.build(
        cfg,
        pol,
        cluster.trainer,
        prompts=prompt_source(cluster.workload, scenario.workload.max_response_len),
        standalone=cluster.standalone,
        hybrid=cluster.hybrid,
        events=bus,
        wait_timeout_s=_FOREVER_S,
        max_tokens=scenario.workload.max_response_len,
        planner=planner,
        mover=mover,
    )
    if mover is not None:
        mover.bind(floop)
    cluster.trainer.set_reclaim(_reclaimer(floop, cfg, has_standalone=bool(cluster.standalone)))
    bus.subscribe(lambda e: in_flight.append(floop.rollouter.active), TrainStepEvent)
    sampler = loop.create_task(_sample_admission(floop, blocked))
    try:
        result = await floop.run(scenario.steps)
    finally:
        sampler.cancel()
    agg.finish(result.end)
    cycles = list(agg.records)
    left = (
        await floop.queue.get(await floop.queue.size(), timeout=0.0) if result.samples_left else []
    )
    bound = _run_bound(scenario, conf, cluster.workload, cfg, spec)
    return _Outcome(
        cluster,
        result,
        cycles,
        left,
        mode_events,
        bound,
        floop,
        state_events,
        blocked,
        in_flight,
        mover,
    )


def _reclaimer(
    floop: FullyAsyncLoop, cfg: DynamicScheduleConfig, *, has_standalone: bool
) -> Callable[[], Awaitable[None]]:
    """The deactivation a policy skipped, performed before the trainer trains (memory is
    conserved: an awake hybrid engine holds memory on the trainer GPUs)."""
    trainer = floop.trainer
    assert isinstance(trainer, SimTrainer)

    async def reclaim() -> None:
        if not has_standalone:
            # colocated: nothing produces once the engines sleep, so (as the driver does
            # for a deactivation) first buffer the rest of the cycle
            position = trainer.steps % cfg.trigger_parameter_sync_step
            rest = (cfg.trigger_parameter_sync_step - position - 1) * cfg.required_samples
            if rest:
                await floop.queue.wait_for(rest, timeout=_FOREVER_S)
        await floop.controller.deactivate()

    return reclaim


async def _sample_admission(floop: FullyAsyncLoop, out: list[int], period_s: float = 30.0) -> None:
    """Ground truth on what limits the rollouter: [samples, staleness-bound, concurrency-bound]."""
    while True:
        await asyncio.sleep(period_s)
        st = floop.rollouter.stats()
        out[0] += 1
        if st.window_admitted >= st.max_required_samples:
            out[1] += 1
        elif st.active >= st.capacity:
            out[2] += 1


def queue_ceiling(cfg: DynamicScheduleConfig, step: int) -> int:
    """The most samples the queue plus the samples in flight can hold right after
    micro-step ``step`` (the backlog the staleness rule allows).

    Under verl's staleness rule in flight + queued never exceeds ``max_required_samples``
    minus what the trainer consumed since the window opened, so after the ``j``-th step of
    a window (``j = (step - 1) % T + 1``) the ceiling is ``max_required - j * required``
    (the snapshot after a sync step is taken before the new window produced anything).
    Under the in-flight rule the queue alone may hold its capacity.
    """
    if cfg.staleness_rule == "in_flight":
        return cfg.max_queue_size
    j = (step - 1) % cfg.trigger_parameter_sync_step + 1
    return max(1, cfg.max_required_samples - j * cfg.required_samples)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _settle(
    scenario: Scenario,
    conf: Configuration | str,
    policy: str,
    seed: int | None,
    planner: PlannerSpec | RolePlannerOptions | bool | None,
    *,
    warn: bool = False,
) -> tuple[Configuration, int, str, DynamicScheduleConfig, PlannerSpec | None]:
    """A run's configuration, seed, policy, schedule config and planner, as
    `run_configuration` resolves its arguments."""
    if isinstance(conf, str):
        conf = scenario.configuration(conf)
    seed = scenario.seed if seed is None else seed
    policy = policy_for(conf, policy)
    cfg = scenario.schedule_config(conf, policy)  # built and validated once per run
    spec = resolve(planner)
    if spec is not None and conf.trainer_gpus % scenario.engine.gpus_per_replica:
        if warn:
            logger.warning(
                "%s: no role planner (trainer GPUs %d are not whole %d-GPU replicas)",
                conf.name,
                conf.trainer_gpus,
                scenario.engine.gpus_per_replica,
            )
        spec = None
    return conf, seed, policy, cfg, spec


def run_lower_bound(
    scenario: Scenario,
    conf: Configuration | str,
    policy: str = "default",
    *,
    seed: int | None = None,
    planner: PlannerSpec | RolePlannerOptions | bool | None = None,
) -> LowerBound:
    """The lower bound `run_configuration` reports for the same arguments (its
    ``lower_bound_s``), without simulating the run: the same workload draw, schedule
    config and, with a planner, the same splits relaxed over. A run's efficiency against
    the current bound is ``run_lower_bound(...).seconds / wall_clock_s``, so results
    recorded before a change of the bound can be re-read without re-simulating them."""
    conf, seed, _policy, cfg, spec = _settle(scenario, conf, policy, seed, planner)
    return _run_bound(scenario, conf, run_workload(scenario, conf, cfg, seed), cfg, spec)


def _run_bound(
    scenario: Scenario,
    conf: Configuration,
    workload: Workload,
    cfg: DynamicScheduleConfig,
    spec: PlannerSpec | None,
) -> LowerBound:
    """The bound a run reports: a re-planned run can be in any split the planner
    reaches, so its bound relaxes over them (one place for `_run` and
    `run_lower_bound`)."""
    splits = () if spec is None else reachable_configurations(spec, scenario, conf)
    return lower_bound(scenario, conf, workload, cfg, splits=splits)


def run_configuration(
    scenario: Scenario,
    conf: Configuration | str,
    policy: str = "default",
    *,
    seed: int | None = None,
    progress: ProgressFn | None = None,
    planner: PlannerSpec | RolePlannerOptions | bool | None = None,
) -> RunResult:
    """Simulate ``conf`` of ``scenario`` with ``policy`` on a fresh virtual-time loop.

    Args:
        scenario: The scenario.
        conf: A configuration or its name.
        policy: Registered policy name (static configurations always use
            ``static_fully_async``).
        seed: Workload seed (default: the scenario's).
        progress: Called ``(step, total_steps, simulated_time)`` after each micro-step.
        planner: Re-plan the split at run time with a role planner on top of the
            policy (`dynsched_sim._planner`; True: the default settings; None: as the
            enclosing `planner_enabled` block says, else no planner). The run's policy
            name then ends with ``+planner`` and its summary counts the moves.

    Returns:
        The `RunResult`.

    Raises:
        SimulationStalledError: the run waited 30 simulated days for samples.
    """
    conf, seed, policy, cfg, spec = _settle(scenario, conf, policy, seed, planner, warn=True)
    try:
        out, events = _on_virtual_time(
            functools.partial(_run, scenario, conf, cfg, seed, progress, spec)
        )
    except SampleWaitTimeoutError as e:
        raise SimulationStalledError(
            f"scenario {scenario.name!r}, configuration {conf.name!r}, seed {seed}: no "
            f"progress for {_FOREVER_S / 86400:g} simulated days ({e}); the scenario's "
            "speeds are off by orders of magnitude (engine.decode_base_s, "
            "engine.decode_per_seq_s, engine.prefill_s_per_token, trainer.gpu_s_per_token, "
            "trainer.step_overhead_s, ...)"
        ) from None
    res, wall = out.result, out.result.duration_s
    return RunResult(
        scenario=scenario.name,
        configuration=conf.name,
        policy=policy if spec is None else policy + PLANNER_SUFFIX,
        seed=seed,
        wall_clock_s=wall,
        lower_bound_s=out.bound.seconds,
        efficiency=out.bound.seconds / wall if wall > 0 else 0.0,
        summary=_summary(out),
        true_utilization=out.cluster.accountant.pool_fractions(),
        proxy_metrics=_proxy_means(out.cycles),
        cycles=tuple(c.as_dict() for c in out.cycles),
        steps=tuple(
            (r.step, r.time - res.start, r.mq_size, r.collect_wait_s, a)
            for r, a in zip(res.records, out.in_flight, strict=True)
        ),
        conservation=_conservation(scenario, out),
        events=events,
        mode_events=tuple(out.mode_events),
        state_events=tuple(out.state_events),
        queue_capacity=out.cluster.config.max_queue_size,
        staleness=out.cluster.staleness.summary(),
    )


def _on_virtual_time(main: Callable[[], Coroutine[Any, Any, _T]]) -> tuple[_T, int]:
    """Run ``main()`` on a fresh virtual-time event loop; its result and the callback count."""
    loop = VirtualTimeEventLoop()
    # Ctrl-C is raised only between two loop iterations (never inside a task's step), so
    # the run's tasks can always be cancelled cleanly below.
    with deferred_interrupts(loop):
        try:
            asyncio.set_event_loop(loop)
            out = loop.run_until_complete(main())
            return out, loop.callbacks_scheduled
        except BaseException:
            # Ctrl-C mid-run: stop the run's tasks without printing their teardown errors.
            stop_quietly(loop)
            raise
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _client(out: _Outcome) -> RetryingClient:
    client = out.floop.client
    assert isinstance(client, RetryingClient)
    return client


def _conservation(scenario: Scenario, out: _Outcome) -> dict[str, bool]:
    """No sample or request lost or duplicated; every response exact."""
    cluster, res, left, client = out.cluster, out.result, out.left, _client(out)
    consumed_ids = res.consumed_sample_ids
    left_ids = [s.sample_id for s in left]
    # tokens of every produced sample equal the workload's lengths
    rl = cluster.workload.response_lens
    exact = all(
        tuple(o.num_tokens for o in s.responses) == tuple(int(x) for x in rl[int(s.sample_id[1:])])
        for s in left
    )
    for s in left:  # the ledger check of the samples the trainer did not consume
        cluster.trainer.check_sample(s)
    consumed_set = set(consumed_ids)
    return {
        "produced_equals_consumed_plus_left": res.samples_produced
        == res.samples_consumed + res.samples_left,
        "no_sample_consumed_twice": len(consumed_set) == len(consumed_ids),
        "consumed_and_left_disjoint": not (consumed_set & set(left_ids)),
        "left_count_matches_queue": len(left_ids) == res.samples_left,
        "no_sample_failed": res.samples_failed == 0,
        "consumed_all_steps": res.steps == scenario.steps,
        "responses_complete_and_exact": exact and cluster.trainer.tokens_exact,
        "no_replica_failure_or_truncation": client.total_failures == 0 and client.truncated == 0,
        "every_request_ended_once": client.completed + client.failed
        == res.rollouter.admitted * scenario.workload.n,
        "cancelled_only_in_flight_at_end": client.failed
        <= res.samples_cancelled * scenario.workload.n,
    }


def _summary(out: _Outcome) -> dict[str, Any]:
    """The run's counters (samples, switches, requests, tokens, queue, admission)."""
    cluster, res, client, blocked = out.cluster, out.result, _client(out), out.blocked
    rep_stats = list(cluster.replicas.values())
    ceilings = [queue_ceiling(cluster.config, r.step) for r in res.records]
    return {
        "steps": res.steps,
        "samples_produced": res.samples_produced,
        "samples_consumed": res.samples_consumed,
        "samples_left_in_queue": res.samples_left,
        "samples_in_flight_cancelled": res.samples_cancelled,
        "activations": res.activations,
        "deactivations": res.deactivations,
        "switches": res.activations + res.deactivations,
        "skipped_hybrid_syncs": res.skipped_hybrid_syncs,
        "switch_errors": res.switch_errors,
        "aborted_requests": client.total_aborts,
        "rerouted_requests": res.moved_requests,
        "reprefill_tokens": client.total_reprefill_tokens,
        "requests_completed": client.completed,
        "tokens_generated": sum(r.tokens_generated for r in rep_stats),
        "tokens_trained": cluster.trainer.tokens_trained,
        "train_s": cluster.trainer.train_s,
        "sync_s": cluster.trainer.sync_s,
        "forced_deactivations": cluster.trainer.reclaims,
        "mismatched_responses": cluster.trainer.mismatched_responses,
        "requests_routed_before_resume": sum(r.requests_while_paused for r in rep_stats),
        "final_deactivate_ratio": getattr(out.floop.driver.policy, "deactivate_ratio", None),
        "mq_size_mean": _mean([float(r.mq_size) for r in res.records]),
        "backlog_fill_mean": _mean(
            [
                min(1.0, (r.mq_size + a) / c)
                for r, a, c in zip(res.records, out.in_flight, ceilings, strict=True)
            ]
        ),
        "lower_bound_binding": out.bound.binding,
        "queue_capacity": cluster.config.max_queue_size,
        "staleness_bound_fraction": blocked[1] / blocked[0] if blocked[0] else 0.0,
        "concurrency_bound_fraction": blocked[2] / blocked[0] if blocked[0] else 0.0,
        **_planner_summary(out),
    }


def _planner_summary(out: _Outcome) -> dict[str, Any]:
    """The role moves of a planned run (nothing without a planner)."""
    if out.mover is None:
        return {}
    split = out.mover.split()
    return {
        "role_moves": out.mover.moves,
        "role_move_s": out.mover.seconds,
        "final_trainer_gpus": split.trainer_gpus,
        "final_standalone_replicas": split.standalone_replicas,
    }


def _proxy_means(cycles: list[CycleMetrics]) -> dict[str, float]:
    """Mean over the sync cycles of each ``dynamic_resource/*`` proxy."""
    rows = [c.as_dict() for c in cycles]
    return {k: _mean([float(r[k]) for r in rows if k in r]) for k in PROXY_KEYS}
