"""Simulated jobs: ground truth (hidden) and observations (what schedulers see).

Two kinds:

* :class:`GpuJob` - an all-reduce GPU job from a Pollux workload; its truth comes from
  the measured profiles (:class:`~dynsched_optimus.cluster._data.ModelProfile`).
* :class:`PSJob` - a synthetic parameter-server job whose true step time follows the
  Optimus paper's step-time model and whose loss follows a noisy ``O(1/k)`` curve.

Schedulers that are not oracles must read only the *observation* attributes:
``name``, ``kind``, ``submit_time``, ``requested_workers``, ``requested_ps``,
``max_workers``, ``max_ps``, ``worker_demand``, ``ps_demand``, ``batch_size``,
``placement``, ``attained_service``, ``steps_done``, ``loss_points``,
``speed_samples``, ``step_samples``, ``grad_stats``, ``target_loss``, ``epochs_done``
and, for a GPU job whose batch the scheduler may choose (``adaptive``),
``batch_limits()``, ``local_limits()``, ``progress``, ``progress_per_epoch`` and
``progress_points``.
Oracle schedulers may call the ``true_*`` methods.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import numpy as np

from dynsched_optimus import StepTimeModel

from ._data import GpuJobSpec, ModelProfile
from ._spec import Placement, _nonneg, _positive

__all__ = ["GpuJob", "PSJob", "PSJobOptions", "PSJobType", "PSLossCurve", "SimJob"]

_GPU_REPLICA_DEMAND = np.array([4.0, 16.0, 1.0, 0.0])


class SimJob:
    """State shared by both job kinds (see the module docstring for the contract)."""

    kind = "base"

    def __init__(self, name: str, submit_time: float, rng: np.random.Generator) -> None:
        self.name = name
        self.submit_time = float(submit_time)
        self.rng = rng
        self.placement: Placement | None = None
        self.batch_size = 0
        self.requested_workers = 1
        self.requested_ps = 0
        self.max_workers = 1
        self.max_ps = 0
        self.worker_demand = _GPU_REPLICA_DEMAND.copy()
        self.ps_demand = np.zeros(4)
        self.ready_time = self.submit_time  # after pre-runs
        self.start_time: float | None = None
        self.completion_time: float | None = None
        self.restart_left = 0.0
        self.num_restarts = 0
        self.restart_seconds = 0.0
        self.startup_seconds = 0.0
        self.pause_is_restart = False
        self.held_seconds = 0.0
        self.attained_service = 0.0  # worker-seconds held
        self.steps_done = 0.0
        self.epochs_done = 0
        self.loss_points: list[tuple[float, float]] = []
        self.speed_samples: dict[tuple[int, ...], list[float]] = {}
        self.grad_stats: tuple[float, float] | None = None
        #: ``(nodes, replicas, micro-batch) -> (compute s, step s)``: the first measured
        #: compute time of a micro-step and time of an optimizer step (GPU jobs)
        self.step_samples: dict[tuple[int, int, int], tuple[float, float]] = {}
        self.target_loss: float | None = None
        self.speed_noise = 0.0

    @property
    def done(self) -> bool:
        """Whether the job completed."""
        return self.completion_time is not None

    #: whether a scheduler may change the job's global batch size
    adaptive = False

    def config_key(self, placement: Placement) -> tuple[int, ...]:
        """Key of a configuration for speed samples: ``(workers, ps, nodes_used)``."""
        return (placement.num_workers, placement.num_ps, placement.nodes_used)

    def max_workers_for(self, batch_size: int | None) -> int:
        """Most workers the job can use at ``batch_size`` (``None``: its current batch)."""
        return self.max_workers

    def set_batch_size(self, batch_size: int) -> None:
        """Train with ``batch_size`` from now on.

        Raises:
            ValueError: the job does not allow that batch.
        """
        if batch_size != self.batch_size:
            raise ValueError(
                f"job {self.name!r}: the batch size is fixed at {self.batch_size}, got {batch_size}"
            )

    def pause_s(self, default_s: float) -> float:
        """Seconds the job pauses when it gets new tasks (its first start included):
        ``default_s``, the simulator's restart delay, unless a job knows its own."""
        return default_s

    def record_speed(self, placement: Placement, speed: float) -> None:
        """Record a noisy measurement of ``speed`` (steps/s) on ``placement``."""
        noisy = speed * float(1.0 + self.speed_noise * self.rng.standard_normal())
        samples = self.speed_samples.setdefault(self.config_key(placement), [])
        samples.append(max(noisy, 1e-12))
        if len(samples) > 16:  # keep the most recent measurements
            del samples[0]

    def measured_speed(self, key: tuple[int, ...]) -> float | None:
        """Mean measured speed of a configuration, if any."""
        s = self.speed_samples.get(key)
        return float(np.mean(s)) if s else None

    # --- truth, implemented by subclasses --------------------------------------------
    def true_speed(self, placement: Placement, batch_size: int | None = None) -> float:
        """True steps per second on ``placement`` (oracle)."""
        raise NotImplementedError

    def true_remaining_steps(self, batch_size: int | None = None) -> float:
        """True steps left to completion (oracle)."""
        raise NotImplementedError

    def true_remaining_time(self, placement: Placement, batch_size: int | None = None) -> float:
        """True seconds left on ``placement``, ignoring restarts (oracle)."""
        return self.true_remaining_steps(batch_size) / self.true_speed(placement, batch_size)

    def advance(self, seconds: float, now: float) -> float:
        """Run for ``seconds`` from ``now`` on the current placement.

        Returns:
            Seconds actually used (less than ``seconds`` when the job completed).
        """
        if self.placement is None or self.placement.num_workers == 0:
            return 0.0
        used = 0.0
        pause = min(self.restart_left, seconds)
        self.restart_left -= pause
        if self.pause_is_restart:
            self.restart_seconds += pause
        else:
            self.startup_seconds += pause
        used += pause
        if seconds - pause > 0:
            used += self._train(seconds - pause, now + pause)
        self.held_seconds += used
        self.attained_service += used * self.placement.num_workers
        return used

    def _train(self, seconds: float, now: float) -> float:
        raise NotImplementedError


class GpuJob(SimJob):
    """All-reduce GPU job driven by a Pollux model profile.

    Progress is counted in initial-batch-equivalent steps: one step at global batch
    ``M`` adds ``gain(M, epoch)`` (statistical efficiency from the gradient statistics,
    :meth:`ModelProfile.efficiency_gain`); epoch ``e`` ends when progress reaches the
    profile's ``epoch_progress[e]``; the job completes at the end of the epoch whose
    validation metric reaches the target (``completion="target"``) or after all epochs.

    A scheduler may change the batch between the profile's initial and largest batch
    (``adaptive``), except for ``ncf``, whose batch the Pollux artifact keeps at the
    submitted one under every policy (its ``max_replicas`` is 1 as well).  Gradient
    statistics are measured while the job trains (those of the current epoch at the
    current batch, as Pollux' agent reports them).
    """

    kind = "gpu"

    def __init__(
        self,
        spec: GpuJobSpec,
        profile: ModelProfile,
        rng: np.random.Generator,
        *,
        completion: str = "target",
        speed_noise: float = 0.0,
    ) -> None:
        super().__init__(spec.name, spec.submit_time, rng)
        self.spec = spec
        self.profile = profile
        self.completion = completion
        self.batch_size = spec.batch_size
        self.requested_workers = spec.num_replicas
        self.adaptive = profile.name != "ncf"
        self.max_workers = self.max_workers_for(spec.batch_size)
        self.progress = 0.0
        #: ``(progress, loss)`` at the end of each epoch
        self.progress_points: list[tuple[float, float]] = []
        #: progress of one epoch (the profile's last epoch boundary / its epochs; the
        #: dataset size over the initial batch, which the job knows)
        self.progress_per_epoch = float(profile.epoch_progress[-1]) / profile.max_epochs
        self.speed_noise = speed_noise
        top = 100.0 if profile.target_metric > 1.0 else 1.0
        self._loss_top = top if profile.higher_is_better else 0.0
        self.target_loss = self._as_loss(profile.target_metric)

    def _as_loss(self, metric: float) -> float:
        return (self._loss_top - metric) if self.profile.higher_is_better else metric

    def batch_limits(self) -> tuple[int, int]:
        """Smallest and largest global batch the profile covers."""
        return self.profile.init_batch_size, self.profile.max_batch_size

    def local_limits(self) -> tuple[int, int]:
        """Smallest per-GPU batch and largest per-GPU micro-batch."""
        return self.profile.min_local_bsz, self.profile.max_local_bsz

    def max_workers_for(self, batch_size: int | None) -> int:
        """GPUs usable at ``batch_size`` (``None``: the current batch)."""
        if self.profile.name == "ncf":
            return 1
        return self.profile.max_replicas(batch_size or self.batch_size)

    def set_batch_size(self, batch_size: int) -> None:
        """Train with ``batch_size`` from now on (within :meth:`batch_limits`).

        Raises:
            ValueError: the job's batch is fixed, or ``batch_size`` is outside the range.
        """
        if batch_size == self.batch_size:
            return
        lo, hi = self.batch_limits()
        if not self.adaptive:
            super().set_batch_size(batch_size)
        if not lo <= batch_size <= hi:
            raise ValueError(
                f"job {self.name!r}: batch_size={batch_size} is outside the allowed range "
                f"[{lo}, {hi}]"
            )
        self.batch_size = int(batch_size)
        self.max_workers = self.max_workers_for(batch_size)

    def true_iter_time(self, shape: tuple[int, ...], batch_size: int | None = None) -> float:
        """True seconds per iteration on a per-node GPU ``shape``."""
        return self.profile.iter_time(shape, batch_size or self.batch_size)

    def true_speed(self, placement: Placement, batch_size: int | None = None) -> float:
        """True iterations per second."""
        return 1.0 / self.true_iter_time(placement.gpu_shape, batch_size)

    def config_key(self, placement: Placement) -> tuple[int, ...]:
        """``(workers, ps, nodes_used, batch)``: the batch changes under goodput schedulers."""
        return (placement.num_workers, placement.num_ps, placement.nodes_used, self.batch_size)

    def true_goodput(self, placement: Placement, batch_size: int | None = None) -> float:
        """True progress per second now (statistical efficiency of the current epoch)."""
        b = batch_size or self.batch_size
        eff_b = self.effective_batch(placement.num_workers, b)
        e = min(self.epochs_done, self.profile.max_epochs - 1)
        return self.profile.efficiency_gain(eff_b, e) / self.true_iter_time(placement.gpu_shape, b)

    def effective_batch(self, replicas: int, batch_size: int | None = None) -> int:
        """Global batch actually trained with on ``replicas`` GPUs."""
        return self.profile.step_config(replicas, batch_size or self.batch_size)[2]

    def remaining_progress(self, batch_size: int | None = None) -> float:
        """True progress units left (oracle)."""
        b = batch_size or self.batch_size
        n_ep = self.profile.completion_epochs(b, self.completion)
        return max(float(self.profile.epoch_progress[n_ep - 1]) - self.progress, 0.0)

    def true_remaining_steps(self, batch_size: int | None = None) -> float:
        """True iterations left at the job's batch (oracle)."""
        b = batch_size or self.batch_size
        n_ep = self.profile.completion_epochs(b, self.completion)
        left = 0.0
        e = self.epochs_done
        prog = self.progress
        while e < n_ep:
            end = float(self.profile.epoch_progress[e])
            left += (end - prog) / self.profile.efficiency_gain(b, e)
            prog = end
            e += 1
        return left

    def _record_step_times(self, shape: tuple[int, ...], batch_size: int) -> None:
        """Keep the first measurement of compute and step time on this configuration."""
        atomic = self.profile.step_config(sum(shape), batch_size)[0]
        key = (len(shape), sum(shape), atomic)
        if key not in self.step_samples:
            step, sync = self.profile.throughput(shape, float(atomic))
            self.step_samples[key] = (max(step - sync, 1e-6), max(step, 1e-6))

    def _train(self, seconds: float, now: float) -> float:
        assert self.placement is not None
        shape = self.placement.gpu_shape
        b = self.batch_size
        eff_b = self.effective_batch(sum(shape), b)
        it_time = self.true_iter_time(shape, b)
        self.record_speed(self.placement, 1.0 / it_time)
        self._record_step_times(shape, b)
        n_ep = self.profile.completion_epochs(b, self.completion)
        used = 0.0
        while seconds > 1e-12:
            e = self.epochs_done
            gain = self.profile.efficiency_gain(eff_b, e)
            self.grad_stats = self.profile.grad_stats(eff_b, e)
            rate = gain / it_time
            end = float(self.profile.epoch_progress[min(e, self.profile.max_epochs - 1)])
            if self.progress + rate * seconds < end:
                self.progress += rate * seconds
                self.steps_done += seconds / it_time
                used += seconds
                seconds = 0.0
                break
            dt = max((end - self.progress) / rate, 0.0)
            self.progress = end
            self.steps_done += dt / it_time
            used += dt
            seconds -= dt
            self.epochs_done += 1
            metric = self.profile.metric(eff_b, e)
            self.loss_points.append((self.steps_done, self._as_loss(metric)))
            self.progress_points.append((self.progress, self._as_loss(metric)))
            if self.epochs_done >= n_ep:
                self.completion_time = now + used
                break
        return used


def _positive_int(inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be an int >= 1, got {value!r}")


def _non_negative_int(inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be an int >= 0, got {value!r}")


@attrs.frozen
class PSJobType:
    """A synthetic parameter-server job type around dynsched-optimus' ``StepTimeModel``.

    The true per-step time is the paper's step-time model (Eqn. 2, implemented by
    :class:`dynsched_optimus.StepTimeModel`) with two placement effects the simulator
    adds: the parameter transfer term is scaled by ``(1 + cross) / 2`` where ``cross`` is
    the fraction of (worker, PS) pairs on different servers (co-located pairs still pay
    half: serialisation and copies), and transfer and PS-update terms are scaled by the
    load imbalance ``imb`` of the busiest PS (1 with PAA). Since both terms are linear in
    ``model_size`` and ``t_update``, this is ``StepTimeModel`` with ``model_size *
    (1 + cross) / 2 * imb`` and ``t_update * imb``. Each task reserves ``task_gbps`` of
    its server's network capacity.

    Args:
        name: type name.
        t_fwd, t_back, model_gb, t_update, delta, delta_ps, batch, sync: the model's
            coefficients (seconds, GB, samples), see ``StepTimeModel``.
        task_gbps: network reservation per task.
        link_gbps: link bandwidth used by the transfer term.
    """

    name: str
    t_fwd: float = attrs.field(kw_only=True, validator=_nonneg)
    t_back: float = attrs.field(kw_only=True, validator=_nonneg)
    model_gb: float = attrs.field(kw_only=True, validator=_nonneg)
    t_update: float = attrs.field(kw_only=True, validator=_nonneg)
    delta: float = attrs.field(kw_only=True, validator=_nonneg)
    delta_ps: float = attrs.field(kw_only=True, validator=_nonneg)
    batch: int = attrs.field(kw_only=True, validator=_positive_int)
    sync: bool = attrs.field(default=True, kw_only=True)
    task_gbps: float = attrs.field(default=1.0, kw_only=True, validator=_nonneg)
    link_gbps: float = attrs.field(default=10.0, kw_only=True, validator=_positive)
    model: StepTimeModel = attrs.field(init=False, eq=False, repr=False)
    _cache: dict[tuple[float, float], StepTimeModel] = attrs.field(
        init=False, factory=dict, eq=False, repr=False
    )

    def __attrs_post_init__(self) -> None:
        model = StepTimeModel(
            mode="sync" if self.sync else "async",
            batch=float(self.batch),
            t_forward=self.t_fwd,
            t_back=self.t_back,
            model_size=self.model_gb,
            bandwidth=self.link_gbps / 8.0,
            t_update=self.t_update,
            delta=self.delta,
            delta_ps=self.delta_ps,
        )
        object.__setattr__(self, "model", model)

    def _model(self, cross: float, imbalance: float) -> StepTimeModel:
        key = (round(cross, 9), round(imbalance, 9))
        m = self._cache.get(key)
        if m is None:
            m = attrs.evolve(
                self.model,
                model_size=self.model.model_size * (1.0 + cross) / 2.0 * imbalance,
                t_update=self.model.t_update * imbalance,
            )
            self._cache[key] = m
        return m

    def step_time(self, p: int, w: int, cross: float = 1.0, imbalance: float = 1.0) -> float:
        """Seconds per step (per worker step when async)."""
        return float(self._model(cross, imbalance).step_time(p, w))

    def speed(self, p: int, w: int, cross: float = 1.0, imbalance: float = 1.0) -> float:
        """Global steps per second."""
        return float(self._model(cross, imbalance).speed(p, w))


def cross_fraction(placement: Placement) -> float:
    """Fraction of (worker, PS) pairs on different servers."""
    w = np.asarray(placement.workers, dtype=float)
    p = np.asarray(placement.ps, dtype=float)
    tot = w.sum() * p.sum()
    if tot <= 0:
        return 1.0
    return float(1.0 - (w * p).sum() / tot)


@attrs.frozen
class PSLossCurve:
    """A PS job's true loss curve and how it is observed (see :class:`PSJob`).

    Args:
        b0, b1, b2: coefficients of ``l(k) = 1 / (b0 k + b1) + b2``.
        steps_per_epoch: steps between two loss observations (>= 1).
        delta_conv: convergence threshold on the normalised per-epoch improvement.
        loss_noise: relative noise of an observation.
        lr_decay_epoch: epoch after which the excess loss drops to 60% (``None``: never).
    """

    b0: float = attrs.field(validator=_nonneg)
    b1: float = attrs.field(validator=_nonneg)
    b2: float = attrs.field(validator=_nonneg)
    steps_per_epoch: int = attrs.field(validator=_positive_int)
    delta_conv: float = attrs.field(default=0.002, validator=_positive)
    loss_noise: float = attrs.field(default=0.03, validator=_nonneg)
    lr_decay_epoch: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(_nonneg)
    )


@attrs.frozen
class PSJobOptions:
    """What a PS job asks for and how noisy its speed is (see :class:`PSJob`).

    Args:
        requested_workers, requested_ps: the tasks it asks for (>= 0).
        max_tasks: most workers (and most PS) it may get (>= 1).
        imbalance: load imbalance of the busiest PS, or a function of the PS count.
        speed_noise: relative noise of a speed sample.
    """

    requested_workers: int = attrs.field(default=4, validator=_non_negative_int)
    requested_ps: int = attrs.field(default=4, validator=_non_negative_int)
    max_tasks: int = attrs.field(default=32, validator=_positive_int)
    imbalance: float | Callable[[int], float] = 1.0
    speed_noise: float = attrs.field(default=0.05, validator=_nonneg)


class PSJob(SimJob):
    """Synthetic parameter-server job.

    Loss ``l(k) = 1 / (b0 k + b1) + b2`` times ``1 + noise * N(0, 1)``, one observation
    per epoch of ``steps_per_epoch`` steps; the job converges at the first step where the
    true curve, normalised by its value after the first epoch, improves by less than
    ``delta_conv`` over one epoch (the same normalisation the scheduler's fit uses).
    The curve is a :class:`PSLossCurve`, the requests and noise a :class:`PSJobOptions`.
    """

    kind = "ps"

    def __init__(
        self,
        name: str,
        submit_time: float,
        jtype: PSJobType,
        rng: np.random.Generator,
        *,
        curve: PSLossCurve,
        options: PSJobOptions | None = None,
    ) -> None:
        super().__init__(name, submit_time, rng)
        opts = options if options is not None else PSJobOptions()
        self.jtype = jtype
        self.curve = curve
        self.options = opts
        self.b0, self.b1, self.b2 = curve.b0, curve.b1, curve.b2
        self.steps_per_epoch = curve.steps_per_epoch
        self.delta_conv = curve.delta_conv
        self.loss_noise = curve.loss_noise
        self.batch_size = jtype.batch
        self.requested_workers = opts.requested_workers
        self.requested_ps = opts.requested_ps
        self.max_workers = opts.max_tasks
        self.max_ps = opts.max_tasks
        self.worker_demand = np.array([5.0, 10.0, 0.0, jtype.task_gbps])
        self.ps_demand = np.array([5.0, 10.0, 0.0, jtype.task_gbps])
        self.imbalance = opts.imbalance
        self.speed_noise = opts.speed_noise
        self.lr_decay_epoch = curve.lr_decay_epoch
        self.total_steps = self._convergence_step()

    def true_loss(self, k: float) -> float:
        """Noise-free normalised loss after ``k`` steps."""
        val = 1.0 / (self.b0 * k + self.b1) + self.b2
        if self.lr_decay_epoch is not None and k > self.lr_decay_epoch * self.steps_per_epoch:
            val = self.b2 + 0.6 * (val - self.b2)
        return val

    def _convergence_step(self) -> float:
        # Step k where l(k) - l(k + epoch) < delta: solve on the analytic form.
        e = self.steps_per_epoch
        norm = self.true_loss(e)
        lo, hi = 0.0, 1.0
        while (self.true_loss(hi) - self.true_loss(hi + e)) / norm >= self.delta_conv:
            hi *= 2.0
            if hi > 1e12:
                break
        for _ in range(80):
            mid = (lo + hi) / 2
            if (self.true_loss(mid) - self.true_loss(mid + e)) / norm >= self.delta_conv:
                lo = mid
            else:
                hi = mid
        return max(math.ceil(hi / e) * e, e)

    def true_speed(self, placement: Placement, batch_size: int | None = None) -> float:
        """True steps per second on ``placement``."""
        p = max(placement.num_ps, 1)
        imb = self.imbalance(p) if callable(self.imbalance) else self.imbalance
        return self.jtype.speed(p, max(placement.num_workers, 1), cross_fraction(placement), imb)

    def true_remaining_steps(self, batch_size: int | None = None) -> float:
        """True steps left (oracle)."""
        return max(self.total_steps - self.steps_done, 0.0)

    def _train(self, seconds: float, now: float) -> float:
        assert self.placement is not None
        if self.placement.num_ps == 0:
            return 0.0
        speed = self.true_speed(self.placement)
        self.record_speed(self.placement, speed)
        used = 0.0
        while seconds > 1e-12:
            next_epoch = (self.epochs_done + 1) * self.steps_per_epoch
            target = min(next_epoch, self.total_steps)
            need = (target - self.steps_done) / speed
            if need > seconds:
                self.steps_done += seconds * speed
                used += seconds
                break
            self.steps_done = float(target)
            used += need
            seconds -= need
            if target >= next_epoch:
                self.epochs_done += 1
                noisy = self.true_loss(self.steps_done) * (
                    1.0 + self.loss_noise * float(self.rng.standard_normal())
                )
                self.loss_points.append((self.steps_done, max(noisy, 1e-9)))
            if self.steps_done >= self.total_steps:
                self.completion_time = now + used
                break
        return used
