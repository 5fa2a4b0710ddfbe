"""Simulated jobs replaying what real jobs measured (issue 30: simulation fidelity).

A :class:`JobProfile` holds what one run of a real job measured (``dynsched optimus
serve``'s job table): its arrival, the steps it needed to reach its completion rule, its
``(step, loss)`` reports, its seconds per step at each worker count, its start-up cost
and its re-allocation cost. :class:`MeasuredJob` replays a profile in the
:class:`~dynsched_optimus.cluster.Simulator`: a job alone on fixed workers finishes at
``arrival + startup_s + steps * step_time_s[workers] + finish_s``; the scheduler sees the measured
loss points as the job passes their steps, and a throughput sample of a configuration
once :data:`~dynsched_optimus.jobs.MIN_SPEED_REPORTS` steady steps ran on it (as the
service records them; the values the real run recorded at that worker count, in order).

:class:`ServiceLoop` hosts the service's own decision functions
(:func:`~dynsched_optimus.jobs.make_decider`, on the records
:func:`~dynsched_optimus.jobs.observe_record` builds, with the service's interval and
restart-delay penalty) instead of the simulator's scheduler classes: the simulated run
then decides with the code the real run decided with (``fifo`` and ``drf`` are restated
on observation records for the service; the simulator's classes read its jobs
directly). It decides when the service does: every ``interval_s``, and at once after a
job ends. :func:`simulate_measured` runs profiles on a :class:`ServiceTestbed`.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from dynsched_optimus.jobs import (
    MIN_SPEED_REPORTS,
    Decider,
    JobRecord,
    JobSpec,
    bucket_loss_points,
    make_decider,
    observe_record,
)
from dynsched_optimus.scheduler import CompletionRule

from ._jobs import SimJob
from ._schedulers import _to_job_placement, _to_placement
from ._sim import ClusterState, SimResult, Simulator
from ._spec import ClusterSpec, NodeSpec, Placement, SimConfig

__all__ = [
    "JobProfile",
    "MeasuredJob",
    "ServiceLoop",
    "ServiceTestbed",
    "load_job_profiles",
    "simulate_measured",
]


def _bad(field: str, want: str, got: object) -> ValueError:
    return ValueError(f"field {field!r} must be {want}, got {got!r}")


def _number(field: str, value: object, *, positive: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):  # type: ignore[operator]
        raise _bad(field, "a finite number " + ("> 0" if positive else ">= 0"), value)
    return float(value)  # type: ignore[arg-type]


def _count(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(field, "an integer >= 1", value)
    return value


def _num(field: str, *, positive: bool = False) -> Callable[[Any, Any, Any], None]:
    """An attrs validator: :func:`_number` of ``field``."""

    def check(_inst: Any, _attr: Any, value: Any) -> None:
        _number(field, value, positive=positive)

    return check


def _counted(field: str, zero: bool = False) -> Callable[[Any, Any, Any], None]:
    """An attrs validator: :func:`_count` of ``field`` (0 allowed with ``zero``)."""

    def check(_inst: Any, _attr: Any, value: Any) -> None:
        if not (zero and value == 0 and not isinstance(value, bool)):
            _count(field, value)

    return check


def _by_worker_count(field: str, value: Mapping[Any, Any]) -> Iterator[tuple[int, Any]]:
    """``value``'s items with each key checked and read as a worker count (an int >= 1)."""
    for k, v in value.items():
        try:
            w = int(k)
        except (TypeError, ValueError):
            raise _bad(field, "keyed by worker counts", k) from None
        yield _count(field, w), v


def _step_times(value: object) -> dict[int, float]:
    if not isinstance(value, Mapping) or not value:
        raise _bad("step_time_s", "a non-empty mapping of worker count -> seconds", value)
    return {
        w: _number(f"step_time_s[{w}]", v, positive=True)
        for w, v in _by_worker_count("step_time_s", value)
    }


def _points(value: object) -> tuple[tuple[float, float], ...]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise _bad("loss_points", "a list of [step, loss] pairs", value)
    out = []
    for i, p in enumerate(value):
        if not isinstance(p, Sequence) or len(p) != 2:
            raise _bad(f"loss_points[{i}]", "a [step, loss] pair", p)
        step = _number(f"loss_points[{i}] step", p[0])
        loss = p[1]
        if isinstance(loss, bool) or not isinstance(loss, int | float) or not math.isfinite(loss):
            raise _bad(f"loss_points[{i}] loss", "a finite number", loss)
        out.append((step, float(loss)))
    return tuple(sorted(out))


def _resources(value: object) -> tuple[float, float]:
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        raise _bad("resources", "[CPU, GPU] per worker", value)
    cpu, gpu = (_number(f"resources[{i}]", v) for i, v in enumerate(value))
    if cpu + gpu <= 0:
        raise _bad("resources", "[CPU, GPU] asking for some resource", value)
    return cpu, gpu


def _speed_samples(value: object) -> dict[int, tuple[float, ...]]:
    """An attrs converter: worker count -> throughput samples (steps/s), in order."""
    if not isinstance(value, Mapping):
        raise _bad("speed_samples", "a mapping of worker count -> [steps/s, ...]", value)
    out = {}
    for w, v in _by_worker_count("speed_samples", value):
        if not isinstance(v, Sequence) or isinstance(v, str):
            raise _bad(f"speed_samples[{w}]", "a list of steps/s", v)
        out[w] = tuple(
            _number(f"speed_samples[{w}][{i}]", x, positive=True) for i, x in enumerate(v)
        )
    return out


def _sources(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _bad("sources", "a mapping of field name -> where its value came from", value)
    return dict(value)


def _target(value: object) -> float | None:
    """An attrs converter: ``None`` or a target loss >= 0."""
    return None if value is None else _number("target_loss", value)


@attrs.frozen(kw_only=True)
class JobProfile:
    """What one run of a real job measured (frozen options record; plain data in JSON).

    Attributes:
        name: the job.
        arrival_s: submission, seconds after the workload's first submission.
        steps: steps the job needed to meet its completion rule (its last reported step).
        step_time_s: seconds per step at each worker count ``1..max_workers``.
        startup_s: seconds from its first placement to its first step (start-up).
        reallocation_s: seconds from a restart's placement to its first step (the start-up
            of a run resumed from its checkpoint), plus any part of the stop before it
            that the scheduler's one-call stop (:class:`ServiceLoop`) does not cover.
        loss_points: its ``(step, loss)`` reports.
        batch_size: global batch.
        workers: requested workers.
        max_workers: most workers it may get.
        target_loss: its completion rule's target loss (``None``: it ran ``steps`` steps).
        finish_s: seconds from its last step to the host seeing it end (the script's exit
            and the service's poll); it holds its workers meanwhile.
        speed_samples: the throughput samples (steps/s) the service recorded at each worker
            count, in order: the scheduler is shown these (the last one again when the
            simulated job needs more); a count without samples shows ``1 /
            step_time_s[w]``.
        resources: ``(CPU, GPU)`` per worker.
        kind: free-form job type (``"mlp"``).
        sources: where each value came from (``{"step_time_s[3]": "measured, profiling
            pass"}``); free-form labels.
    """

    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    arrival_s: float = attrs.field(validator=_num("arrival_s"))
    steps: int = attrs.field(validator=_counted("steps"))
    step_time_s: Mapping[int, float] = attrs.field(converter=_step_times)
    startup_s: float = attrs.field(validator=_num("startup_s"))
    reallocation_s: float = attrs.field(validator=_num("reallocation_s"))
    loss_points: tuple[tuple[float, float], ...] = attrs.field(default=(), converter=_points)
    batch_size: int = attrs.field(default=64, validator=_counted("batch_size"))
    workers: int = attrs.field(default=1, validator=_counted("workers"))
    max_workers: int = attrs.field(default=1, validator=_counted("max_workers"))
    target_loss: float | None = attrs.field(default=None, converter=_target)
    resources: tuple[float, float] = attrs.field(default=(1.0, 0.0), converter=_resources)
    finish_s: float = attrs.field(default=0.0, validator=_num("finish_s"))
    speed_samples: Mapping[int, tuple[float, ...]] = attrs.field(
        factory=dict, converter=_speed_samples
    )
    kind: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    sources: Mapping[str, str] = attrs.field(factory=dict, converter=_sources)

    def __attrs_post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise _bad("name", "non-empty letters, digits, '-', '_' or '.'", self.name)
        if self.max_workers < self.workers:
            raise _bad("max_workers", f">= workers ({self.workers})", self.max_workers)
        missing = [w for w in range(1, self.max_workers + 1) if w not in self.step_time_s]
        if missing:
            raise _bad(
                "step_time_s",
                f"measured at every worker count 1..{self.max_workers} (missing {missing})",
                sorted(self.step_time_s),
            )

    @property
    def completion(self) -> CompletionRule:
        """The job's completion rule (its target loss, or its steps)."""
        if self.target_loss is None:
            return CompletionRule("steps", self.steps)
        return CompletionRule("target_metric", self.target_loss)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (what :func:`load_job_profiles` reads)."""
        out = attrs.asdict(self, recurse=False)
        out["step_time_s"] = {str(k): v for k, v in self.step_time_s.items()}
        out["loss_points"] = [list(p) for p in self.loss_points]
        out["resources"] = list(self.resources)
        out["sources"] = dict(self.sources)
        out["speed_samples"] = {str(k): list(v) for k, v in self.speed_samples.items()}
        return out


_PROFILE_FIELDS = tuple(a.name for a in attrs.fields(JobProfile))


def _profile(i: int, data: object) -> JobProfile:
    if not isinstance(data, Mapping):
        raise ValueError(f"job profile {i}: must be a mapping of {list(_PROFILE_FIELDS)}")
    name = data.get("name", "?")
    unknown = sorted(set(data) - set(_PROFILE_FIELDS))
    missing = [k for k in ("name", "arrival_s", "steps", "step_time_s") if k not in data]
    try:
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}; allowed: {list(_PROFILE_FIELDS)}")
        if missing:
            raise ValueError(f"field {missing[0]!r} is required")
        return JobProfile(**data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"job profile {i} ({name!r}): {exc}") from None


def load_job_profiles(source: str | Path | Mapping[str, Any] | Sequence[Any]) -> list[JobProfile]:
    """Read and check job profiles: a JSON file, or its data (``{"jobs": [...]}`` or a list).

    Raises:
        ValueError: one line naming the profile and the field (and what it may be).
    """
    data: Any = source
    if isinstance(source, str | Path):
        with open(source, encoding="utf-8") as fh:
            data = json.load(fh)
    if isinstance(data, Mapping):
        if "jobs" not in data:
            raise ValueError("job profiles: a mapping must hold the profiles under 'jobs'")
        data = data["jobs"]
    if not isinstance(data, Sequence) or isinstance(data, str):
        raise ValueError("job profiles: expected a list of profiles")
    profiles = [_profile(i, d) for i, d in enumerate(data)]
    names = [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise ValueError(f"job profiles: field 'name' must be unique, got {names}")
    return profiles


class MeasuredJob(SimJob):
    """A simulated job replaying a :class:`JobProfile` (see the module docstring).

    Its speed on ``w`` workers is ``1 / step_time_s[w]`` wherever they are (the measured
    runs share one machine: servers do not change speed); it completes after
    ``steps`` steps; every placement change pauses it for ``startup_s`` (first) or
    ``reallocation_s`` (later ones). The scheduler's view is :meth:`record`, the
    :class:`~dynsched_optimus.jobs.JobRecord` the service builds of a real job.

    Args:
        profile: what the real job measured.
        rng: unused randomness of the base class (nothing here is drawn).
    """

    kind = "measured"

    def __init__(self, profile: JobProfile, rng: np.random.Generator | None = None) -> None:
        super().__init__(profile.name, profile.arrival_s, rng or np.random.default_rng(0))
        self.profile = profile
        self.batch_size = profile.batch_size
        self.requested_workers = profile.workers
        self.max_workers = profile.max_workers
        cpu, gpu = profile.resources
        self.worker_demand = np.array([cpu, 0.0, gpu, 0.0])
        self.target_loss = profile.target_loss
        self.spec = JobSpec(
            profile.name,
            "<measured>",
            profile.batch_size,
            workers=profile.workers,
            max_workers=profile.max_workers,
            completion=profile.completion,
            resources=profile.resources,
        )
        self._steps_of_points = [p[0] for p in profile.loss_points]
        self._run_steps = 0.0  # steps of the current run
        self._pending = 0.0  # steady steps not yet turned into a throughput sample
        self._shown: dict[int, int] = {}  # measured samples shown per worker count
        self._finish_left = profile.finish_s  # held after the last step until seen ended

    def pause_s(self, default_s: float) -> float:
        """The measured start-up cost (first placement) or re-allocation cost; a new run
        begins (its first step is not a steady one)."""
        self._run_steps = 0.0
        self._pending = 0.0
        return self.profile.startup_s if self.start_time is None else self.profile.reallocation_s

    def config_key(self, placement: Placement) -> tuple[int, ...]:
        """``(workers, 0, servers, batch)``: the service's throughput key."""
        return (placement.num_workers, 0, placement.nodes_used, float(self.batch_size))  # type: ignore[return-value]

    def record_speed(self, placement: Placement, speed: float) -> None:
        """Keep one sample as given (no noise added, none dropped: the service keeps all)."""
        self.speed_samples.setdefault(self.config_key(placement), []).append(speed)

    def _sample(self, workers: int) -> float:
        """The next measured throughput sample at ``workers`` (see ``speed_samples``)."""
        samples = self.profile.speed_samples.get(workers, ())
        if not samples:
            return 1.0 / self.step_time(workers)
        k = self._shown.get(workers, 0)
        self._shown[workers] = k + 1
        return samples[min(k, len(samples) - 1)]

    def step_time(self, workers: int) -> float:
        """Measured seconds per step on ``workers`` workers."""
        return self.profile.step_time_s[workers]

    def true_speed(self, placement: Placement, batch_size: int | None = None) -> float:
        """Measured steps per second on ``placement``."""
        return 1.0 / self.step_time(placement.num_workers)

    def true_remaining_steps(self, batch_size: int | None = None) -> float:
        """Steps left to the measured completion step."""
        return max(self.profile.steps - self.steps_done, 0.0)

    def _train(self, seconds: float, now: float) -> float:
        assert self.placement is not None
        st = self.step_time(self.placement.num_workers)
        used = min(seconds, self.true_remaining_steps() * st)
        n = used / st
        before = self._run_steps
        self._run_steps += n
        self._pending += max(self._run_steps - 1.0, 0.0) - max(before - 1.0, 0.0)
        while self._pending >= MIN_SPEED_REPORTS - 1e-9:  # one sample per 5 steady steps
            self.record_speed(self.placement, self._sample(self.placement.num_workers))
            self._pending -= MIN_SPEED_REPORTS
        self.steps_done += n
        if self.profile.steps - self.steps_done <= 1e-9:
            self.steps_done = float(self.profile.steps)
            tail = min(seconds - used, self._finish_left)  # exit and the host's poll
            self._finish_left -= tail
            used += tail
            if self._finish_left <= 1e-12:
                self.completion_time = now + used
        seen = bisect.bisect_right(self._steps_of_points, self.steps_done + 1e-9)
        self.loss_points = list(self.profile.loss_points[:seen])
        return used

    def record(self) -> JobRecord:
        """What the service's job table would hold of this job now."""
        return JobRecord(
            spec=self.spec,
            arrival=self.submit_time,
            iterations_done=float(math.floor(self.steps_done + 1e-9)),
            loss_points=bucket_loss_points(self.loss_points),
            throughput={k: tuple(v) for k, v in self.speed_samples.items()},
            restarts=self.num_restarts,
            placement=(
                None if self.placement is None else _to_job_placement(self.name, self.placement)
            ),
        )


#: columns of the simulator's resource vector that are the service's ``(CPU, GPU)``
_SERVICE_COLUMNS = [0, 2]


class ServiceLoop:
    """The service's decision loop as a simulator scheduler (for :class:`MeasuredJob`).

    Every call (the simulator's interval, the service's poll) it keeps the current
    placements unless a decision is due: ``interval_s`` after the last one (periodic
    decisions while no job was there were empty ones), or at once when a run ended since
    the last call (the service decides again when workers free). A decision is
    :func:`~dynsched_optimus.jobs.make_decider`'s function on the
    :func:`~dynsched_optimus.jobs.observe_record` of each job's :meth:`MeasuredJob.record`,
    with the nodes' ``(CPU, GPU)`` capacity and the penalty ``restart_delay_s``.

    As in the service, a running job whose placement the decision changes is stopped (it
    checkpoints at its next step and its run ends: here, it waits one call) and placed by
    the decision its ended run triggers, where it pays its measured re-allocation cost.

    Args:
        scheduler: one of :data:`~dynsched_optimus.jobs.DECIDERS`.
        interval_s: the service's seconds between decisions.
        restart_delay_s: the service's re-allocation penalty (the policy's input; what a
            re-allocation costs a simulated job is its profile's ``reallocation_s``).
        decider: replaces the decision function of ``scheduler`` (tests).
    """

    def __init__(
        self,
        scheduler: str,
        *,
        interval_s: float = 10.0,
        restart_delay_s: float = 5.0,
        decider: Decider | None = None,
    ) -> None:
        self.name = scheduler
        self.decide = decider or make_decider(scheduler)
        self.interval_s = _number("interval_s", interval_s, positive=True)
        self.restart_delay_s = _number("restart_delay_s", restart_delay_s)
        self.decisions = 0
        self._last = -math.inf  # time of the service's last decision (empty ones included)
        self._seen: dict[str, SimJob] = {}
        self._stopped: set[str] = set()

    def _due(self, now: float, jobs: Sequence[SimJob], tick: float) -> bool:
        """Whether the service decides at ``now`` (the simulator's tick after the event)."""
        ended = [j for n, j in self._seen.items() if n not in {k.name for k in jobs}]
        carried = any(j.name in self._seen for j in jobs)
        self._seen = {j.name: j for j in jobs}
        if self._stopped:  # the runs it stopped ended: their workers are free
            self._stopped = set()
            return True
        if ended:
            # the service decides when workers free (an empty decision if none is left)
            self._last = max(j.completion_time or now for j in ended)
            if carried:
                return True
        if now < self._last + self.interval_s - 1e-9:
            return False
        if math.isinf(self._last):  # the first decision: at once
            return True
        # the latest periodic decision time; one passed while no job was there was empty
        grid = self._last + math.floor((now - self._last) / self.interval_s) * self.interval_s
        if not carried and grid < min(j.submit_time for j in jobs) - 1e-9 and now - grid > tick:
            self._last = grid
            return False
        return True

    def schedule(
        self, now: float, jobs: Sequence[SimJob], cluster: ClusterState
    ) -> dict[str, Placement]:
        """Placements of the jobs (the current ones when no decision is due)."""
        if not self._due(now, jobs, cluster.interval_s):
            return {j.name: j.placement for j in jobs if j.placement is not None}
        self._last = now
        records = []
        for j in jobs:
            if not isinstance(j, MeasuredJob):
                raise TypeError(f"ServiceLoop schedules MeasuredJob only, got {type(j).__name__}")
            records.append(observe_record(j.record()))
        cap = cluster.capacity[:, _SERVICE_COLUMNS]
        dec = self.decide(now, records, cap, self.restart_delay_s)
        self.decisions += 1
        out = {}
        for j in jobs:
            jp = dec.placements.get(j.name)
            pl = None if jp is None or jp.workers == 0 else _to_placement(jp, len(cap))
            if j.placement is not None and (pl is None or not pl.same_tasks(j.placement)):
                self._stopped.add(j.name)  # asked to stop; placed by the next decision
            elif pl is not None:
                out[j.name] = j.placement if j.placement is not None else pl
        return out


@attrs.frozen(kw_only=True)
class ServiceTestbed:
    """The real run's cluster and service settings a measured simulation restates.

    Attributes:
        nodes: servers.
        node_cpus: CPUs per server (Ray's ``CPU`` resource).
        node_gpus: GPUs per server (Ray's ``GPU`` resource, bookkeeping or real).
        interval_s: the service's seconds between decisions.
        restart_delay_s: the service's re-allocation penalty.
        tick_s: the simulator's step (the service's poll: arrivals and freed workers wait
            at most this long).
        max_time_s: safety stop of the simulated clock.
    """

    nodes: int = attrs.field(default=4, validator=_counted("nodes"))
    node_cpus: float = attrs.field(default=2.0, validator=_num("node_cpus"))
    node_gpus: int = attrs.field(default=2, validator=_counted("node_gpus", zero=True))
    interval_s: float = attrs.field(default=10.0, validator=_num("interval_s", positive=True))
    restart_delay_s: float = attrs.field(default=5.0, validator=_num("restart_delay_s"))
    tick_s: float = attrs.field(default=0.5, validator=_num("tick_s", positive=True))
    max_time_s: float = attrs.field(default=86400.0, validator=_num("max_time_s", positive=True))

    def cluster(self) -> ClusterSpec:
        """The servers (memory and network unused: the service books CPU and GPU)."""
        node = NodeSpec(cpu=self.node_cpus, mem_gb=0.0, gpu=self.node_gpus, net_gbps=0.0)
        return ClusterSpec.homogeneous(self.nodes, node)


def simulate_measured(
    profiles: Sequence[JobProfile], scheduler: str, testbed: ServiceTestbed | None = None
) -> SimResult:
    """Run the profiles' jobs under the service's ``scheduler`` on ``testbed``.

    Raises:
        OptimusError: an unknown scheduler (the allowed ones listed).
    """
    bed = testbed or ServiceTestbed()
    loop = ServiceLoop(scheduler, interval_s=bed.interval_s, restart_delay_s=bed.restart_delay_s)
    config = SimConfig(
        interval_s=bed.tick_s, restart_delay_s=0.0, speed_noise=0.0, max_time_s=bed.max_time_s
    )
    jobs = [MeasuredJob(p) for p in profiles]
    return Simulator(bed.cluster(), jobs, loop, config).run()
