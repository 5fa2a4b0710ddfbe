"""A run-time role planner: moves GPUs between the trainer and the standalone rollout pool.

The base split of a run (trainer GPUs, standalone replicas) is fixed by the user and the
lending policies move GPUs one way only (trainer -> rollout, for a while). `RolePlanner`
re-plans the split itself while the run goes on, in either direction:

- ``"to_trainer"``: ``replicas`` standalone replicas are retired (their requests aborted
  and resumed elsewhere, as a hybrid deactivation does) and the trainer's data-parallel
  group grows by their GPUs at a sync boundary (global batch kept, optimizer state
  re-sharded);
- ``"to_rollout"``: the trainer shrinks by ``replicas * gpus_per_replica`` GPUs and
  ``replicas`` standalone replicas are started on them (with the current weights).

Its inputs are the events the core already emits (`TrainStepEvent`, `SampleEvent`,
`RolloutEvent`, `ReplicaModeEvent`) plus the batches the loop trains on, from which it
fits two speed models online (Optimus's approach):

- `TrainerSpeedModel`: trainer step time against data-parallel size ``w`` and the
  step's work (tokens), ``t(w) = a + b * work / w + c * w`` by non-negative least squares,
  with a prediction interval;
- `RolloutSpeedModel`: per-sample time in flight against running samples per replica
  (Little's law over each sync interval), ``l(n) = alpha + beta * n``, hence the rollout
  rate of ``k`` replicas ``k * n / l(n)``.

Every ``every_n_syncs`` weight syncs the loop asks `RolePlanner.decide` for a move; the
planner predicts the time of one sync interval for the current split and for every
split one move away (`max_move_replicas`), and proposes the best move only if its gain
over ``horizon_syncs`` intervals (the candidate judged at the pessimistic end of its
prediction interval) beats the move's cost times ``1 + margin``. It never proposes a split
below `RolePlannerOptions.min_trainer_gpus`, `trainer_memory_min_gpus` or
`min_standalone_replicas`, nor one whose predicted mean staleness exceeds the bound. The
host applies the move through its `RoleMover` (in-memory test host, the simulator, Ray).

The planner is an optional layer: without one the loop runs unchanged, and lending
policies never see it.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from dynsched_core import validators as v
from dynsched_core._events import (
    EventBus,
    ReplicaModeEvent,
    RoleMoveEvent,
    RolloutEvent,
    SampleEvent,
    TrainStepEvent,
)

__all__ = [
    "LOOP_TIMING_KEYS",
    "IntervalPrediction",
    "PlannerWorkload",
    "Prediction",
    "RoleMove",
    "RoleMoveEvent",
    "RoleMover",
    "RolePlanner",
    "RolePlannerOptions",
    "RoleSplit",
    "RolloutSpeedModel",
    "TrainerSpeedModel",
    "default_staleness",
    "nnls",
]

MoveDirection = Literal["to_trainer", "to_rollout"]
DIRECTIONS: tuple[MoveDirection, ...] = ("to_trainer", "to_rollout")

#: Keys of a `TrainStepEvent`'s timings that the loop adds (waits, sync, the whole step);
#: the rest are the trainer's own phases, whose sum is the trainer's step time.
LOOP_TIMING_KEYS = frozenset({"wait_for_enough_samples", "gen", "param_sync", "step"})

#: z of a two-sided 90% normal prediction interval (judgement: the level of the interval).
_Z90 = 1.645
#: doublings of the interval searched for the fixed point of a split without standalone
#: replicas (2**200 times the training time: beyond any finite rollout)
_MAX_DOUBLINGS = 200


# ---------------------------------------------------------------------------- records
@attrs.frozen(kw_only=True)
class RoleSplit:
    """How the GPUs of a run are split between the roles.

    Attributes:
        trainer_gpus: GPUs of the trainer (its data-parallel group; hybrid replicas, if
            any, live on them), >= 1.
        standalone_replicas: Standalone rollout replicas, >= 0.
        gpus_per_replica: GPUs of one rollout replica (tensor-parallel size), >= 1.
    """

    trainer_gpus: int = attrs.field(validator=v.int_ge(1))
    standalone_replicas: int = attrs.field(validator=v.int_ge(0))
    gpus_per_replica: int = attrs.field(validator=v.int_ge(1))

    @property
    def total_gpus(self) -> int:
        """``trainer_gpus + standalone_replicas * gpus_per_replica``."""
        return self.trainer_gpus + self.standalone_replicas * self.gpus_per_replica

    def moved(self, direction: MoveDirection, replicas: int) -> RoleSplit:
        """The split after moving ``replicas`` replicas' GPUs in ``direction``.

        Raises:
            ValueError: unknown direction, or a side would end below its minimum (1
                trainer GPU, 0 replicas).
        """
        g = self.gpus_per_replica
        if direction == "to_trainer":
            t, s = self.trainer_gpus + replicas * g, self.standalone_replicas - replicas
        elif direction == "to_rollout":
            t, s = self.trainer_gpus - replicas * g, self.standalone_replicas + replicas
        else:
            raise ValueError(f"direction must be one of {list(DIRECTIONS)}, got {direction!r}")
        return RoleSplit(trainer_gpus=t, standalone_replicas=s, gpus_per_replica=g)


def _check_after(move: RoleMove, attribute: attrs.Attribute[RoleSplit], after: RoleSplit) -> None:
    expected = move.before.moved(move.direction, move.replicas)
    if after != expected:
        raise ValueError(
            f"RoleMove.after must be before moved {move.direction} by {move.replicas} "
            f"replica(s) ({expected}), got {after}"
        )


@attrs.frozen(kw_only=True)
class RoleMove:
    """One move of GPUs between the roles, applied at a sync boundary by a `RoleMover`.

    Attributes:
        direction: ``"to_trainer"`` or ``"to_rollout"`` (module docstring).
        replicas: Standalone replicas retired (to the trainer) or started, >= 1.
        before: The split before the move.
        after: The split after (``before.moved(direction, replicas)``).
        predicted_gain_s: Seconds the planner predicts the move saves over its horizon.
        cost_s: Seconds the planner expects the move to cost.
        reason: One line: why.
    """

    direction: MoveDirection = attrs.field(validator=v.one_of(DIRECTIONS))
    replicas: int = attrs.field(validator=v.int_ge(1))
    before: RoleSplit
    after: RoleSplit = attrs.field(validator=_check_after)
    predicted_gain_s: float = 0.0
    cost_s: float = attrs.field(default=0.0, validator=v.float_ge(0.0))
    reason: str = ""

    @property
    def gpus(self) -> int:
        """GPUs that change role: ``replicas * before.gpus_per_replica``."""
        return self.replicas * self.before.gpus_per_replica


@runtime_checkable
class RoleMover(Protocol):
    """Applies role moves; implemented by the host (in-memory tests, simulator, Ray)."""

    def split(self) -> RoleSplit:
        """The current split."""
        ...

    async def move(self, move: RoleMove) -> float:
        """Apply ``move`` (at a sync boundary: the trainer is idle); seconds it took."""
        ...


def _min_standalone(inst: Any, attr: attrs.Attribute[int], value: int) -> None:
    """An int >= 1: the planner never retires the last standalone replica."""
    if isinstance(value, int) and not isinstance(value, bool) and value < 1:
        raise v.field_error(
            inst,
            attr,
            f"must be an int >= 1, got {value}: retiring the last standalone replica leaves "
            "the requests the move aborts nowhere to resume (static runs stall, dynamic runs "
            "fail samples)",
        )
    v.int_ge(1)(inst, attr, value)


@attrs.frozen(kw_only=True)
class RolePlannerOptions:
    """Settings of a `RolePlanner` (every default is a judgement; see each line).

    Attributes:
        every_n_syncs: Re-plan after every this many weight syncs (judgement: 4 syncs give
            the speed models a few fresh intervals between two decisions).
        margin: A move must gain more than ``cost * (1 + margin)`` over the horizon
            (judgement: 20% covers the models' bias the interval does not).
        horizon_syncs: Sync intervals over which a move must pay (judgement: 8, twice the
            re-plan period; capped by what is left of the run when the config knows).
        max_move_replicas: Most replicas moved at once (judgement: 1, one step at a time
            so the models see every size they extrapolate to).
        min_trainer_gpus: The trainer never shrinks below this (judgement: 1).
        min_standalone_replicas: Standalone replicas always kept, >= 1 (judgement: 1, so
            the requests a move aborts always have somewhere to resume; 0 is refused: with
            no standalone replica a static run has nothing that generates and a dynamic
            one's aborted requests wait for a hybrid replica only the client's
            ``no_replica_timeout_s``, less than a training phase, and fail). A run that
            starts with fewer (a colocated one) is never moved below its start: the
            planner only moves GPUs to the rollout side there.
        staleness_bound: Most predicted mean staleness (policy versions behind per sample)
            a planned split may have; None: no bound.
        trainer_memory_min_gpus: The fewest GPUs that hold the trainer's model state
            (weights, gradients, optimizer); set by the host from its memory model
            (judgement default 1: no constraint).
        move_cost_s: Cost of a move before any was measured, seconds (judgement: 60 s,
            an engine start plus a weight load or an optimizer re-shard of a mid-size
            model); afterwards the mean of the measured moves of the same direction.
        min_intervals: Sync intervals observed at the current split before a move is
            considered (judgement: 2).
    """

    every_n_syncs: int = attrs.field(default=4, validator=v.int_ge(1))
    margin: float = attrs.field(default=0.2, validator=v.float_ge(0.0))
    horizon_syncs: int = attrs.field(default=8, validator=v.int_ge(1))
    max_move_replicas: int = attrs.field(default=1, validator=v.int_ge(1))
    min_trainer_gpus: int = attrs.field(default=1, validator=v.int_ge(1))
    min_standalone_replicas: int = attrs.field(default=1, validator=_min_standalone)
    staleness_bound: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(v.float_ge(0.0))
    )
    trainer_memory_min_gpus: int = attrs.field(default=1, validator=v.int_ge(1))
    move_cost_s: float = attrs.field(default=60.0, validator=v.float_ge(0.0))
    min_intervals: int = attrs.field(default=2, validator=v.int_ge(1))


@attrs.frozen
class Prediction:
    """A predicted quantity with its prediction interval (``low <= mean <= high``)."""

    mean: float
    low: float
    high: float


# ---------------------------------------------------------------------------- fitting
def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Solve ``a x = b`` (Gaussian elimination, partial pivoting); None when singular."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        scale = max(1.0, max(abs(x) for row in m for x in row[:n]))
        if abs(m[piv][col]) <= 1e-12 * scale:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    return [m[i][n] / m[i][i] for i in range(n)]


def nnls(rows: Sequence[Sequence[float]], y: Sequence[float]) -> tuple[float, ...]:
    """Non-negative least squares for a few columns: ``argmin |X c - y|, c >= 0``.

    Exact by enumeration: the optimum is the unconstrained least-squares fit on its own
    support, so the best feasible fit over every support is the optimum (``2**p``
    supports; meant for ``p <= 4``).

    Raises:
        ValueError: no rows, rows of different lengths, or ``len(y) != len(rows)``.
    """
    if not rows or len(rows) != len(y):
        raise ValueError(f"nnls needs as many targets as rows (>= 1), got {len(rows)}/{len(y)}")
    p = len(rows[0])
    if any(len(r) != p for r in rows):
        raise ValueError("nnls: every row must have the same number of columns")
    best, best_sse = (0.0,) * p, sum(t * t for t in y)
    for size in range(1, p + 1):
        for support in itertools.combinations(range(p), size):
            ata = [[sum(r[i] * r[j] for r in rows) for j in support] for i in support]
            aty = [sum(r[i] * t for r, t in zip(rows, y, strict=True)) for i in support]
            sol = _solve(ata, aty)
            if sol is None or min(sol) < 0.0:
                continue
            coef = [0.0] * p
            for i, c in zip(support, sol, strict=True):
                coef[i] = c
            sse = sum(
                (sum(c * x for c, x in zip(coef, r, strict=True)) - t) ** 2
                for r, t in zip(rows, y, strict=True)
            )
            if sse < best_sse - 1e-12 * max(1.0, best_sse):
                best, best_sse = tuple(coef), sse
    return best


def _fit(rows: list[list[float]], y: list[float]) -> tuple[tuple[float, ...], float]:
    """NNLS coefficients and the residual standard deviation (0 without spare rows)."""
    coef = nnls(rows, y)
    resid = [
        sum(c * x for c, x in zip(coef, r, strict=True)) - t for r, t in zip(rows, y, strict=True)
    ]
    dof = len(y) - sum(1 for c in coef if c > 0)
    sd = math.sqrt(sum(e * e for e in resid) / dof) if dof > 0 else 0.0
    return coef, sd


# ---------------------------------------------------------------------------- models
class TrainerSpeedModel:
    """Trainer step time against data-parallel size: ``t(w) = a + b * work / w + c * w``.

    ``work`` is what one step trains on (tokens; 1.0 when the host gives none). Fitted by
    `nnls` over the last ``window`` steps once at least two sizes were seen (the ``c * w``
    term only with three or more); the prediction interval is ``+- z * sd * sqrt(1 + 1/n)``
    with ``sd`` the residual deviation, at least ``floor`` of the mean.

    Before a second size is seen the curve is not identified; then the prediction scales
    the mean time per unit of work seen at ``w0`` as ``(w0 / w) ** e``, with the exponent
    ``e`` at ``prior_exponent[1]`` and the interval spanning ``prior_exponent[0]`` to
    ``[2]`` (judgement: 0.7 to 1.0 around 0.9, from sub-linear data-parallel scaling in
    published data-parallel training measurements to perfectly linear).

    Args:
        window: Steps kept (judgement: 64, enough for several sizes, short enough to
            follow growing responses).
        prior_exponent: ``(low, mean, high)`` of the scaling exponent before a fit.
        floor: Smallest half-width of the fitted interval, as a fraction of the mean
            (judgement: 2%, the step-to-step noise of a real trainer).
    """

    def __init__(
        self,
        *,
        window: int = 64,
        prior_exponent: tuple[float, float, float] = (0.7, 0.9, 1.0),
        floor: float = 0.02,
    ) -> None:
        if window < 2:
            raise ValueError(f"TrainerSpeedModel.window must be >= 2, got {window}")
        lo, mid, hi = prior_exponent
        if not 0.0 <= lo <= mid <= hi:
            raise ValueError(
                f"TrainerSpeedModel.prior_exponent must be 0 <= low <= mean <= high, got "
                f"{prior_exponent}"
            )
        self._obs: deque[tuple[int, float, float]] = deque(maxlen=window)
        self._prior = prior_exponent
        self._floor = floor
        self._fit: tuple[tuple[float, ...], float] | None = None

    def observe(self, gpus: int, seconds: float, work: float = 1.0) -> None:
        """Record one step of ``seconds`` on ``gpus`` GPUs over ``work``."""
        if gpus < 1 or not math.isfinite(seconds) or seconds < 0 or work <= 0:
            raise ValueError(
                f"TrainerSpeedModel.observe: gpus >= 1, seconds >= 0 and work > 0 "
                f"expected, got {gpus}, {seconds}, {work}"
            )
        self._obs.append((gpus, seconds, work))
        self._fit = None

    @property
    def observations(self) -> int:
        """Steps held."""
        return len(self._obs)

    @property
    def sizes(self) -> list[int]:
        """Distinct data-parallel sizes held, ascending."""
        return sorted({w for w, _, _ in self._obs})

    @property
    def coefficients(self) -> tuple[float, float, float] | None:
        """``(a, b, c)`` of the fit; None before two sizes were seen."""
        fit = self._fitted()
        if fit is None:
            return None
        coef = fit[0]
        return (coef[0], coef[1], coef[2] if len(coef) > 2 else 0.0)

    def mean_work(self, last: int = 8) -> float:
        """Mean work of the last ``last`` steps (1.0 before any)."""
        recent = list(self._obs)[-last:]
        return sum(w for _, _, w in recent) / len(recent) if recent else 1.0

    def _fitted(self) -> tuple[tuple[float, ...], float] | None:
        sizes = self.sizes
        if len(sizes) < 2:
            return None
        if self._fit is None:
            full = len(sizes) >= 3
            rows = [[1.0, k / w] + ([float(w)] if full else []) for w, _, k in self._obs]
            self._fit = _fit(rows, [t for _, t, _ in self._obs])
        return self._fit

    def predict(self, gpus: int, work: float | None = None) -> Prediction:
        """Step time on ``gpus`` GPUs for ``work`` (default: the recent mean).

        Raises:
            ValueError: nothing observed yet.
        """
        if not self._obs:
            raise ValueError("TrainerSpeedModel.predict: no step observed yet")
        k = self.mean_work() if work is None else work
        fit = self._fitted()
        if fit is None:
            w0 = self._obs[-1][0]
            per_work = sum(t / kk for w, t, kk in self._obs if w == w0) / sum(
                1 for w, _, _ in self._obs if w == w0
            )
            base = per_work * k
            lo_e, mid_e, hi_e = self._prior
            vals = sorted(base * (w0 / gpus) ** e for e in (lo_e, hi_e))
            return Prediction(base * (w0 / gpus) ** mid_e, vals[0], vals[1])
        coef, sd = fit
        feats = [1.0, k / gpus] + ([float(gpus)] if len(coef) > 2 else [])
        mean = sum(c * x for c, x in zip(coef, feats, strict=True))
        half = max(_Z90 * sd * math.sqrt(1.0 + 1.0 / len(self._obs)), self._floor * mean)
        return Prediction(mean, max(0.0, mean - half), mean + half)


class RolloutSpeedModel:
    """Per-sample time in flight against running samples per replica: ``l(n) = alpha +
    beta * n``; the rollout rate of ``k`` replicas at ``n`` running samples each is
    ``k * n / l(n)`` samples per second.

    Each observation is one window (a sync interval): ``in_flight_s`` (the integral of
    samples in flight over time), ``produced`` samples and ``replica_s`` (replica-seconds
    of serving), so by Little's law ``l = in_flight_s / produced`` and ``n = in_flight_s /
    replica_s``. Fitted by `nnls` over the last ``window`` windows; with a single
    distinct ``n`` the time in flight is taken as constant. Interval as in
    `TrainerSpeedModel` (``floor``: 5%, judgement: rollout intervals are noisier).
    """

    def __init__(self, *, window: int = 32, floor: float = 0.05) -> None:
        if window < 1:
            raise ValueError(f"RolloutSpeedModel.window must be >= 1, got {window}")
        self._obs: deque[tuple[float, float]] = deque(maxlen=window)
        self._floor = floor

    def observe(self, *, in_flight_s: float, produced: int, replica_s: float) -> bool:
        """Record one window; False (ignored) when it produced nothing or had no replica."""
        if produced <= 0 or replica_s <= 0 or in_flight_s <= 0:
            return False
        self._obs.append((in_flight_s / replica_s, in_flight_s / produced))
        return True

    @property
    def observations(self) -> int:
        """Windows held."""
        return len(self._obs)

    def latency(self, n: float) -> Prediction:
        """Time in flight of one sample at ``n`` running samples per replica.

        Raises:
            ValueError: nothing observed yet.
        """
        if not self._obs:
            raise ValueError("RolloutSpeedModel.latency: no window observed yet")
        ns = [x for x, _ in self._obs]
        ls = [y for _, y in self._obs]
        if max(ns) - min(ns) <= 1e-6 * max(1.0, max(ns)):
            coef, sd = _fit([[1.0] for _ in ls], ls)
            mean = coef[0]
        else:
            coef, sd = _fit([[1.0, x] for x in ns], ls)
            mean = coef[0] + coef[1] * n
        half = max(_Z90 * sd * math.sqrt(1.0 + 1.0 / len(ls)), self._floor * mean)
        return Prediction(mean, max(1e-9, mean - half), mean + half)

    def rate(self, replicas: float, n: float) -> Prediction:
        """Samples per second of ``replicas`` replicas with ``n`` running samples each."""
        if replicas <= 0 or n <= 0:
            return Prediction(0.0, 0.0, 0.0)
        lat = self.latency(n)
        return Prediction(replicas * n / lat.mean, replicas * n / lat.high, replicas * n / lat.low)


# ---------------------------------------------------------------------------- planner
@attrs.frozen(kw_only=True)
class PlannerWorkload:
    """What the planner needs of the run's schedule (from a `DynamicScheduleConfig`).

    Attributes:
        steps_per_sync: Trainer micro-steps per weight sync (``T``).
        samples_per_step: Samples one micro-step trains on.
        concurrency_per_replica: Samples in flight per routable replica at most.
        max_in_flight: Samples in flight plus queued the staleness rule allows per window.
        hybrid: Hybrid replicas live on the trainer GPUs (one per replica's GPUs).
        total_steps: Micro-steps of the run (None: unknown).
    """

    steps_per_sync: int = attrs.field(validator=v.int_ge(1))
    samples_per_step: int = attrs.field(validator=v.int_ge(1))
    concurrency_per_replica: int = attrs.field(validator=v.int_ge(1))
    max_in_flight: int = attrs.field(validator=v.int_ge(1))
    hybrid: bool = False
    total_steps: int | None = None

    @classmethod
    def from_config(cls, config: Any) -> PlannerWorkload:
        """From a `DynamicScheduleConfig`."""
        return cls(
            steps_per_sync=config.trigger_parameter_sync_step,
            samples_per_step=config.required_samples,
            concurrency_per_replica=config.concurrent_samples_per_replica,
            max_in_flight=config.max_required_samples,
            hybrid=bool(config.use_dynamic_resource_scheduling and config.hybrid_gpus > 0),
            total_steps=config.total_training_steps,
        )


StalenessFn = Callable[["RoleSplit", "IntervalPrediction"], float]


@attrs.frozen
class IntervalPrediction:
    """Predicted seconds of one sync interval of a split, and its parts.

    Attributes:
        seconds: The interval (``max`` of the two sides, mean prediction).
        high: Its pessimistic end (both sides at the slow end of their interval).
        train_s: Trainer side: ``T`` steps plus the weight sync.
        rollout_s: Rollout side: ``T * samples_per_step`` samples at the predicted rate.
        latency_s: Time in flight of one sample at the split's running samples per replica.
        running_per_replica: Running samples per replica at the split.
    """

    seconds: float
    high: float
    train_s: float
    rollout_s: float
    latency_s: float
    running_per_replica: float


def default_staleness(work: PlannerWorkload) -> StalenessFn:
    """A small closed form of the mean staleness (policy versions behind per sample).

    ``latency_s / interval`` (a sample is in flight that long) plus the queue: when the
    rollout side is faster than the trainer, the backlog the staleness rule allows
    (``max_in_flight - T * samples_per_step``) fills in proportion to the surplus
    ``1 - rollout_s / train_s`` and waits one interval per ``T * samples_per_step``
    samples (judgement: the simulator's closed form, `dynsched_sim.predicted_staleness`,
    is the calibrated one; a host can pass it as ``staleness_of``).
    """
    per_interval = work.steps_per_sync * work.samples_per_step
    backlog = max(0, work.max_in_flight - per_interval) / per_interval

    def staleness(split: RoleSplit, pred: IntervalPrediction) -> float:
        surplus = 0.0 if pred.train_s <= 0 else max(0.0, 1.0 - pred.rollout_s / pred.train_s)
        return pred.latency_s / max(pred.seconds, 1e-9) + surplus * backlog

    return staleness


class RolePlanner:
    """Decides role moves from speed models fitted online (module docstring).

    Args:
        options: Settings (default: `RolePlannerOptions()`).
        config: The run's `DynamicScheduleConfig` (or a `PlannerWorkload`).
        staleness_of: ``f(split, prediction) -> mean staleness`` (default:
            `default_staleness`); used only with a ``staleness_bound``.

    Attach it to the loop's bus (`attach`; `FullyAsyncLoop` does it when given a
    planner); the loop also reports each batch (`observe_batch`) and each applied move
    (`record_move`).
    """

    def __init__(
        self,
        options: RolePlannerOptions | None = None,
        *,
        config: Any,
        staleness_of: StalenessFn | None = None,
    ) -> None:
        self.options = v.options_or_default(options, RolePlannerOptions)
        self.workload = (
            config if isinstance(config, PlannerWorkload) else (PlannerWorkload.from_config(config))
        )
        self.staleness_of = staleness_of or default_staleness(self.workload)
        self.trainer_model = TrainerSpeedModel()
        self.rollout_model = RolloutSpeedModel()
        self._split_fn: Callable[[], RoleSplit] | None = None
        self._estimate: Callable[[RoleMove], float] | None = None
        self._pending: deque[tuple[int, float]] = deque()
        self._sync_s: deque[float] = deque(maxlen=16)
        self._intervals: deque[float] = deque(maxlen=4)
        self._costs: dict[str, list[float]] = {d: [] for d in DIRECTIONS}
        self._window = _Window()
        self._steps = 0
        self._intervals_since_move = 0
        self.moves: list[tuple[RoleMove, float]] = []

    # ------------------------------------------------------------------ feeding
    def attach(
        self,
        events: EventBus,
        split: Callable[[], RoleSplit],
        estimate: Callable[[RoleMove], float] | None = None,
    ) -> None:
        """Subscribe to ``events``; ``split`` gives the current split (the mover's);
        ``estimate`` (optional, the mover's ``estimate_s``) what a move would cost before
        one was measured."""
        self._split_fn = split
        self._estimate = estimate
        events.subscribe(self._on_step, TrainStepEvent)
        events.subscribe(self._on_sample, SampleEvent)
        events.subscribe(self._on_rollout, RolloutEvent)
        events.subscribe(self._on_mode, ReplicaModeEvent)

    def observe_batch(self, samples: Sequence[Any]) -> None:
        """The loop took ``samples`` for the next step: remember its work and trainer size.

        Work: the tokens of the samples (``num_tokens`` plus ``n * prompt_len`` of
        `RolloutSample`), 1.0 per batch when the samples carry none.
        """
        work = 0.0
        for s in samples:
            tokens = getattr(s, "num_tokens", None)
            prompt = getattr(getattr(s, "prompt", None), "prompt_len", None)
            if isinstance(tokens, int | float):
                work += float(tokens)
                if isinstance(prompt, int | float):
                    work += float(prompt) * len(getattr(s, "responses", ()) or (1,))
        gpus = self._split().trainer_gpus
        self._pending.append((gpus, work if work > 0 else 1.0))

    def record_move(self, move: RoleMove, seconds: float, *, now: float) -> None:
        """A move was applied and took ``seconds`` (its measured cost), ending at ``now``."""
        self._costs[move.direction].append(seconds / move.replicas)
        self.moves.append((move, seconds))
        self._intervals_since_move = 0
        self._intervals.clear()
        self._window.restart(now)

    def _split(self) -> RoleSplit:
        if self._split_fn is None:
            raise RuntimeError("RolePlanner.attach(events, split) must be called first")
        return self._split_fn()

    def _on_step(self, e: TrainStepEvent) -> None:
        self._steps = max(self._steps, e.step)
        train_s = sum(s for k, s in e.timings.items() if k not in LOOP_TIMING_KEYS)
        if self._pending:
            gpus, work = self._pending.popleft()
            if train_s > 0:
                self.trainer_model.observe(gpus, train_s, work)
        if e.is_sync_step:
            self._sync_s.append(float(e.timings.get("param_sync", 0.0)))
            split = self._split()
            start = self._window.start
            if self._window.close(e.time, self.rollout_model, split, self.workload.hybrid):
                self._intervals_since_move += 1
                if start is not None:
                    self._intervals.append(e.time - start)

    def _on_sample(self, e: SampleEvent) -> None:
        if e.kind == "produced":
            self._window.produced += len(e.sample_ids)

    def _on_rollout(self, e: RolloutEvent) -> None:
        self._window.active_at(e.time, e.active)

    def _on_mode(self, e: ReplicaModeEvent) -> None:
        if e.group == "trainer":
            self._window.lent_at(e.time, e.mode == "rollout")

    # ------------------------------------------------------------------ predicting
    def ready(self) -> bool:
        """Both models have data and the split was observed long enough."""
        return (
            self.trainer_model.observations > 0
            and self.rollout_model.observations > 0
            and self._intervals_since_move >= self.options.min_intervals
        )

    def predict(self, split: RoleSplit) -> IntervalPrediction:
        """Predicted sync interval of ``split``, calibrated to the observed intervals.

        Trainer side: ``T`` steps (`TrainerSpeedModel`) plus the mean weight sync.
        Rollout side: ``T * samples_per_step`` samples at the rate of the standalone
        replicas plus the hybrid ones lent while the trainer waits (``1 - train /
        interval`` of the interval), with the samples in flight capped by the
        concurrency and the staleness window (on average ``max_in_flight - T *
        samples_per_step / 2``: half an interval's consumption is counted in it). The
        interval is ``max(train, rollout)`` at its fixed point (bisection), times the
        ratio of the observed intervals to the model's at the current split (the bias the
        model shares across neighbouring splits). ``high``: both sides at the slow end.

        Raises:
            ValueError: a model has no data yet.
        """
        t = self.trainer_model.predict(split.trainer_gpus)
        mean, roll, lat, n = self._interval(split, t.mean, pessimistic=False)
        high = self._interval(split, t.high, pessimistic=True)[0]
        bias = self._bias()
        train = self._train_s(t.mean)
        return IntervalPrediction(mean * bias, max(mean, high) * bias, train, roll, lat, n)

    def _train_s(self, step_s: float) -> float:
        sync = sum(self._sync_s) / len(self._sync_s) if self._sync_s else 0.0
        return self.workload.steps_per_sync * step_s + sync

    def _bias(self) -> float:
        """Observed over modelled interval at the current split (1.0 before any)."""
        seen = list(self._intervals)[-2:]
        if not seen or self._split_fn is None or self.rollout_model.observations == 0:
            return 1.0
        t = self.trainer_model.predict(self._split().trainer_gpus)
        model = self._interval(self._split(), t.mean, pessimistic=False)[0]
        return (sum(seen) / len(seen)) / model if 0 < model < math.inf else 1.0

    def _interval(
        self, split: RoleSplit, step_s: float, *, pessimistic: bool
    ) -> tuple[float, float, float, float]:
        """``(interval, rollout_s, latency_s, n)`` of the uncalibrated model."""
        wl = self.workload
        train = self._train_s(step_s)
        hybrid = split.trainer_gpus // split.gpus_per_replica if wl.hybrid else 0
        need = wl.steps_per_sync * wl.samples_per_step
        cap = max(1.0, wl.max_in_flight - need / 2.0)

        def rollout(interval: float) -> tuple[float, float, float]:
            lent = hybrid * max(0.0, 1.0 - train / interval) if interval > 0 else 0.0
            k = split.standalone_replicas + lent
            if k <= 0:
                return math.inf, 0.0, 0.0
            n = min(float(wl.concurrency_per_replica), cap / k)
            lat_p = self.rollout_model.latency(n)
            lat = lat_p.high if pessimistic else lat_p.mean
            return need * lat / (k * n), lat, n

        roll, lat, n = rollout(train)
        if roll <= train:
            return train, roll, lat, n
        # rollout(I) - I falls from > 0 at train to < 0 at roll; without a standalone
        # replica nothing rolls out while the trainer trains (roll is inf at train), so
        # the upper end is found by doubling: the hybrid replicas lend more the longer
        # the interval
        lo, hi = train, roll
        if not math.isfinite(hi):
            hi = 2.0 * max(train, 1e-9)
            for _ in range(_MAX_DOUBLINGS):
                if rollout(hi)[0] <= hi:
                    break
                lo, hi = hi, 2.0 * hi
            else:
                return math.inf, math.inf, lat, n  # nothing can roll out at all
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            if rollout(mid)[0] > mid:
                lo = mid
            else:
                hi = mid
        roll, lat, n = rollout(hi)
        return max(hi, roll if math.isfinite(roll) else hi), roll, lat, n

    def candidates(self, split: RoleSplit) -> list[RoleSplit]:
        """Splits one move away that respect the minimums (memory included)."""
        o = self.options
        floor = max(o.min_trainer_gpus, o.trainer_memory_min_gpus)
        out = []
        for k in range(1, o.max_move_replicas + 1):
            if split.standalone_replicas - k >= o.min_standalone_replicas:
                out.append(split.moved("to_trainer", k))
            if split.trainer_gpus - k * split.gpus_per_replica >= floor:
                out.append(split.moved("to_rollout", k))
        return out

    def move_cost(self, move: RoleMove) -> float:
        """Expected seconds of ``move``: the mean measured per replica of its direction,
        else the mover's estimate, else ``options.move_cost_s`` per replica."""
        seen = self._costs[move.direction]
        if seen:
            return sum(seen) / len(seen) * move.replicas
        if self._estimate is not None:
            return float(self._estimate(move))
        return self.options.move_cost_s * move.replicas

    def horizon(self) -> int:
        """Sync intervals a move may pay over (capped by what is left of the run)."""
        h = self.options.horizon_syncs
        wl = self.workload
        if wl.total_steps is not None:
            left = (wl.total_steps - self._steps) // wl.steps_per_sync
            h = min(h, max(0, left))
        return h

    def decide(self, split: RoleSplit, *, now: float) -> RoleMove | None:
        """The move to make at this sync boundary, or None (see the module docstring)."""
        if not self.ready() or self.horizon() <= 0:
            return None
        current = self.predict(split)
        if math.isnan(current.seconds):
            return None  # nothing to judge by (an infinite interval is judged: any
            # candidate that rolls out gains)
        best: RoleMove | None = None
        for cand in self.candidates(split):
            move = self._judge(split, cand, current, now)
            if move is not None and (
                best is None
                or move.predicted_gain_s - move.cost_s > best.predicted_gain_s - best.cost_s
            ):
                best = move
        return best

    def _judge(
        self, split: RoleSplit, cand: RoleSplit, current: IntervalPrediction, now: float
    ) -> RoleMove | None:
        """The move to ``cand`` if it pays for itself within the bound, else None."""
        o = self.options
        pred = self.predict(cand)
        if o.staleness_bound is not None and self.staleness_of(cand, pred) > o.staleness_bound:
            return None
        direction: MoveDirection = (
            "to_trainer" if cand.trainer_gpus > split.trainer_gpus else "to_rollout"
        )
        replicas = abs(cand.standalone_replicas - split.standalone_replicas)
        gain = (current.seconds - pred.high) * self.horizon()
        move = RoleMove(
            direction=direction,
            replicas=replicas,
            before=split,
            after=cand,
            predicted_gain_s=gain,
            reason=(
                f"t={now:.0f}s interval {current.seconds:.1f}s -> {pred.seconds:.1f}s "
                f"(<= {pred.high:.1f}s) over {self.horizon()} syncs"
            ),
        )
        cost = self.move_cost(move)
        if not gain > cost * (1.0 + o.margin):  # written so: a NaN gain never moves
            return None
        return attrs.evolve(move, cost_s=cost, reason=f"{move.reason} vs cost {cost:.1f}s")


class _Window:
    """Integrals of one sync interval: samples in flight, replica-seconds, produced."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.produced = 0
        self.in_flight_s = 0.0
        self.lent_s = 0.0
        self._active, self._t_active = 0, 0.0
        self._lent, self._t_lent = False, 0.0
        self._partial = False

    def active_at(self, t: float, active: int) -> None:
        if self.start is None:
            self.start = self._t_active = self._t_lent = t
        self.in_flight_s += self._active * (t - self._t_active)
        self._active, self._t_active = active, t

    def lent_at(self, t: float, lent: bool) -> None:
        if self.start is None:
            return
        if self._lent:
            self.lent_s += t - self._t_lent
        self._lent, self._t_lent = lent, t

    def close(self, t: float, model: RolloutSpeedModel, split: RoleSplit, hybrid: bool) -> bool:
        """End the window at ``t``; True when it was a whole interval, given to ``model``."""
        if self.start is None:
            return False
        self.active_at(t, self._active)
        self.lent_at(t, self._lent)
        hybrids = split.trainer_gpus // split.gpus_per_replica if hybrid else 0
        replica_s = split.standalone_replicas * (t - self.start) + hybrids * self.lent_s
        whole = not self._partial
        if whole:
            model.observe(in_flight_s=self.in_flight_s, produced=self.produced, replica_s=replica_s)
        self._begin(t)
        return whole

    def restart(self, t: float) -> None:
        """A move changed the replicas at ``t``: what follows until the next close is a
        partial interval, not observed (its replica-seconds would mix two splits)."""
        if self.start is not None:
            self.active_at(t, self._active)
            self.lent_at(t, self._lent)
            self._begin(t)
            self._partial = True

    def _begin(self, t: float) -> None:
        self.start, self.produced, self.in_flight_s, self.lent_s = t, 0, 0.0, 0.0
        self._partial = False
