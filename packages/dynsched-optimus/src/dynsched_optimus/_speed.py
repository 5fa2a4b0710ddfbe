"""Resource-to-speed models of Optimus (parameter-server jobs) and an all-reduce GPU form.

Parameter-server jobs with ``p`` servers and ``w`` workers (Optimus, Eqns. 3 and 4)::

    async:  f(p, w) = w * (t0 + t1*w/p + t2*w + t3*p)^-1
    sync:   f(p, w) = (t0*M/w + t1 + t2*w/p + t3*w + t4*p)^-1

``f`` is in training steps per second (for asynchronous training, steps of all workers
together).  Both forms are linear in their non-negative coefficients after taking the
reciprocal (``w/f`` for async, ``1/f`` for sync); the fit solves that linear system by
NNLS with each row divided by its target, so the residuals are relative errors.

:class:`StepTimeModel` is the paper's synthetic step-time model (Eqn. 2) used to generate
ground truth; :func:`plan_sampling` picks which ``(p, w)`` configurations to pre-run;
:class:`AllReduceSpeedModel` models GPU all-reduce jobs as a function of GPU count, node
count and local batch size.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import attrs
import numpy as np
import numpy.typing as npt
from scipy.optimize import least_squares, nnls

from dynsched_optimus._errors import InsufficientDataError, OptimusError
from dynsched_optimus._types import FloatArray
from dynsched_optimus._validators import non_negative, positive

__all__ = [
    "AllReduceSpeedModel",
    "PSSpeedModel",
    "StepTimeModel",
    "fit_speed",
    "placement_shape",
    "plan_sampling",
]

logger = logging.getLogger(__name__)

Mode = Literal["async", "sync"]
ArrayLike = float | int | npt.ArrayLike

#: minimum number of distinct measurements for each parameter-server form
MIN_POINTS: dict[str, int] = {"async": 4, "sync": 5}


def _check_mode(mode: str) -> None:
    if mode not in MIN_POINTS:
        raise OptimusError(f"mode must be one of {sorted(MIN_POINTS)}, got {mode!r}")


def _mode_validator(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
    _check_mode(value)  # every record names the field ``mode``


# ---------------------------------------------------------------------------------------
# Synthetic ground truth: the paper's step-time model
# ---------------------------------------------------------------------------------------


@attrs.frozen
class StepTimeModel:
    """The Optimus step-time model (Eqn. 2), a generator of ground-truth speeds.

    The time of one training step with ``p`` parameter servers and ``w`` workers is::

        T(p, w) = m*t_forward + t_back + 2*(model_size/p) / (bandwidth/w')
                  + t_update*w'/p + delta*w + delta_ps*p

    where ``m`` is the per-worker mini-batch (``batch / w`` in synchronous mode, where
    ``batch`` is the global batch ``M``; ``batch`` itself in asynchronous mode) and ``w'``
    the number of workers a server talks to concurrently (``w``: every worker pushes to
    every server each step).  Speed in steps per second is ``1/T`` (sync) or ``w/T``
    (async: every worker completes steps independently).  The fitted forms of
    :class:`PSSpeedModel` are exact for this model; :meth:`theta` gives the coefficients.

    Attributes:
        mode: ``"sync"`` or ``"async"``.
        batch: global batch ``M`` (sync) or per-worker mini-batch ``m`` (async), samples.
        t_forward: forward time per sample, seconds.
        t_back: backward time per step, seconds.
        model_size: model size ``S`` (any unit consistent with ``bandwidth``).
        bandwidth: per-server bandwidth ``B`` (model-size units per second).
        t_update: server-side update time for one worker's gradients, seconds.
        delta: connection overhead per worker, seconds.
        delta_ps: connection overhead per server, seconds.
    """

    mode: str = attrs.field(default="sync", validator=_mode_validator)
    batch: float = attrs.field(default=256.0, validator=positive)
    t_forward: float = attrs.field(default=0.002, validator=non_negative)
    t_back: float = attrs.field(default=0.2, validator=non_negative)
    model_size: float = attrs.field(default=100.0, validator=non_negative)
    bandwidth: float = attrs.field(default=1250.0, validator=positive)
    t_update: float = attrs.field(default=0.005, validator=non_negative)
    delta: float = attrs.field(default=0.003, validator=non_negative)
    delta_ps: float = attrs.field(default=0.002, validator=non_negative)

    def step_time(self, p: ArrayLike, w: ArrayLike) -> FloatArray:
        """Seconds per step of one worker with ``p`` servers and ``w`` workers."""
        pa = np.asarray(p, dtype=np.float64)
        wa = np.asarray(w, dtype=np.float64)
        m = self.batch / wa if self.mode == "sync" else self.batch
        w_conc = wa
        return (
            m * self.t_forward
            + self.t_back
            + 2.0 * (self.model_size / pa) / (self.bandwidth / w_conc)
            + self.t_update * w_conc / pa
            + self.delta * wa
            + self.delta_ps * pa
        )

    def speed(self, p: ArrayLike, w: ArrayLike) -> FloatArray:
        """True training speed, steps per second (all workers together in async mode)."""
        t = self.step_time(p, w)
        if self.mode == "sync":
            return 1.0 / t
        return np.asarray(w, dtype=np.float64) / t

    def sample(
        self,
        p: ArrayLike,
        w: ArrayLike,
        *,
        noise: float = 0.05,
        rng: np.random.Generator | int | None = None,
    ) -> FloatArray:
        """Measured speeds: the true speed times ``1 + noise * N(0, 1)`` (kept > 0)."""
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        true = self.speed(p, w)
        factor = 1.0 + noise * gen.standard_normal(np.shape(true))
        return np.asarray(true * np.maximum(factor, 0.05), dtype=np.float64)

    def theta(self) -> tuple[float, ...]:
        """The exact coefficients of the matching :class:`PSSpeedModel` form."""
        comm = 2.0 * self.model_size / self.bandwidth + self.t_update
        if self.mode == "sync":
            return (self.t_forward, self.t_back, comm, self.delta, self.delta_ps)
        return (self.batch * self.t_forward + self.t_back, comm, self.delta, self.delta_ps)

    def as_speed_model(self) -> PSSpeedModel:
        """The exact (oracle) :class:`PSSpeedModel` of this job."""
        return PSSpeedModel(
            mode=self.mode,
            theta=self.theta(),
            global_batch=self.batch if self.mode == "sync" else None,
        )

    @classmethod
    def random(
        cls, rng: np.random.Generator | int | None = None, mode: str = "sync"
    ) -> StepTimeModel:
        """A plausible random job type (for tests, benchmarks and simulations).

        Parameters are drawn log-uniformly around ResNet/Inception-like values on a
        10 Gbit/s network so that the best configuration lies well inside ``[1, 20]^2``.
        """
        _check_mode(mode)
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)

        def lu(lo: float, hi: float) -> float:
            return float(math.exp(gen.uniform(math.log(lo), math.log(hi))))

        return cls(
            mode=mode,
            batch=lu(64, 1024) if mode == "sync" else lu(16, 128),
            t_forward=lu(2e-4, 4e-3),
            t_back=lu(0.02, 0.5),
            model_size=lu(20, 600),
            bandwidth=1250.0,
            t_update=lu(1e-3, 2e-2),
            delta=lu(1e-3, 1e-2),
            delta_ps=lu(1e-3, 1e-2),
        )


# ---------------------------------------------------------------------------------------
# Fitted parameter-server speed model
# ---------------------------------------------------------------------------------------


def _features(mode: str, p: FloatArray, w: FloatArray, global_batch: float | None) -> FloatArray:
    if mode == "async":
        return np.stack([np.ones_like(w), w / p, w, p], axis=-1)
    assert global_batch is not None
    return np.stack([global_batch / w, np.ones_like(w), w / p, w, p], axis=-1)


def fit_speed(
    mode: str,
    p: ArrayLike,
    w: ArrayLike,
    speed: ArrayLike,
    *,
    global_batch: float | None = None,
) -> PSSpeedModel:
    """Fit a parameter-server speed model by NNLS on the linearised reciprocal.

    Each row ``x . theta = y`` (``y = w/f`` async, ``1/f`` sync) is divided by ``y`` so
    that the least-squares residuals are relative errors.

    Args:
        mode: ``"async"`` or ``"sync"``.
        p: parameter-server counts of the measurements (>= 1).
        w: worker counts (>= 1).
        speed: measured speeds, steps per second (> 0).
        global_batch: the sync form's global batch ``M`` (required for ``"sync"``).

    Returns:
        The fitted model, with ``fit_error`` (RMS relative speed error on the points),
        ``n_points`` and ``configs``.

    Raises:
        InsufficientDataError: fewer than 4 (async) / 5 (sync) measurements, or fewer
            distinct configurations than coefficients.
        OptimusError: bad values.
    """
    _check_mode(mode)
    pa = np.atleast_1d(np.asarray(p, dtype=np.float64)).ravel()
    wa = np.atleast_1d(np.asarray(w, dtype=np.float64)).ravel()
    fa = np.atleast_1d(np.asarray(speed, dtype=np.float64)).ravel()
    if not (pa.shape == wa.shape == fa.shape):
        raise OptimusError(
            f"p, w and speed must have the same length, got {pa.size}, {wa.size}, {fa.size}"
        )
    need = MIN_POINTS[mode]
    if pa.size < need:
        raise InsufficientDataError(
            f"the {mode} speed model has {need} coefficients and needs at least {need} "
            f"measurements, got {pa.size}"
        )
    if np.any(~np.isfinite(fa)) or np.any(fa <= 0):
        raise OptimusError("speed must be finite and > 0 for every measurement")
    if np.any(pa < 1) or np.any(wa < 1):
        raise OptimusError("p and w must be >= 1 for every measurement")
    if mode == "sync" and not (global_batch is not None and global_batch > 0):
        raise OptimusError("global_batch must be given and > 0 for the sync form")
    configs = sorted({(int(a), int(b)) for a, b in zip(pa, wa, strict=True)})
    x = _features(mode, pa, wa, global_batch)
    y = wa / fa if mode == "async" else 1.0 / fa
    theta, _ = nnls(x / y[:, None], np.ones_like(y))
    if not np.any(theta > 0):
        raise OptimusError("the fit degenerated to all-zero coefficients")
    model = PSSpeedModel(mode=mode, theta=tuple(theta), global_batch=global_batch)
    rel = model.predict(pa, wa) / fa - 1.0
    err = float(np.sqrt(np.mean(rel**2)))
    if len(configs) < need:
        logger.warning(
            "speed model fitted on %d distinct configurations for %d coefficients: "
            "coefficients are not identified",
            len(configs),
            need,
        )
    return attrs.evolve(model, fit_error=err, n_points=int(pa.size), configs=tuple(configs))


def _float_tuple(values: Iterable[Any]) -> tuple[float, ...]:
    return tuple(float(x) for x in values)


@attrs.frozen
class PSSpeedModel:
    """A fitted (or exact) speed function ``f(p, w)`` of a parameter-server job.

    Attributes:
        mode: ``"async"`` (4 coefficients) or ``"sync"`` (5 coefficients).
        theta: the non-negative coefficients ``t0..t3`` (async) or ``t0..t4`` (sync).
        global_batch: ``M`` for the sync form, ``None`` for async.
        fit_error: root-mean-square relative speed error on the fitted points.
        n_points: number of measurements the fit used.
        configs: the distinct ``(p, w)`` configurations it was fitted on.
    """

    mode: str = attrs.field(validator=_mode_validator)
    theta: tuple[float, ...] = attrs.field(converter=_float_tuple)
    global_batch: float | None = None
    fit_error: float = 0.0
    n_points: int = 0
    configs: tuple[tuple[int, int], ...] = ()

    def __attrs_post_init__(self) -> None:
        want = 4 if self.mode == "async" else 5
        if len(self.theta) != want:
            raise OptimusError(
                f"theta must have {want} coefficients for mode {self.mode!r}, got {len(self.theta)}"
            )
        if any(not (t >= 0 and math.isfinite(t)) for t in self.theta):
            raise OptimusError(f"theta must be finite and >= 0, got {self.theta}")
        if self.mode == "sync" and not (self.global_batch and self.global_batch > 0):
            raise OptimusError("global_batch must be > 0 for the sync form")
        if sum(self.theta) <= 0:
            raise OptimusError("theta must not be all zero")

    @property
    def num_coefficients(self) -> int:
        """4 for async, 5 for sync."""
        return len(self.theta)

    def reciprocal(self, p: ArrayLike, w: ArrayLike) -> FloatArray:
        """The linear form: ``w/f`` (async) or ``1/f`` (sync)."""
        pa = np.asarray(p, dtype=np.float64)
        wa = np.asarray(w, dtype=np.float64)
        return np.asarray(_features(self.mode, pa, wa, self.global_batch) @ np.array(self.theta))

    def predict(self, p: ArrayLike, w: ArrayLike) -> FloatArray:
        """Predicted speed (steps per second) at ``p`` servers and ``w`` workers."""
        wa = np.asarray(w, dtype=np.float64)
        r = self.reciprocal(p, w)
        num = wa if self.mode == "async" else 1.0
        with np.errstate(divide="ignore"):
            return np.asarray(num / r, dtype=np.float64)

    __call__ = predict

    def coefficient_vector(self) -> tuple[tuple[float, float, float, float, float], bool]:
        """Coefficients on the common features ``[1/w, 1, w/p, w, p]``.

        Returns:
            ``(c, async_numerator)``: the reciprocal is ``c . [1/w, 1, w/p, w, p]`` and the
            speed is ``w / reciprocal`` when ``async_numerator`` else ``1 / reciprocal``.
            Used by the vectorised allocator.
        """
        t = self.theta
        if self.mode == "async":
            return (0.0, t[0], t[1], t[2], t[3]), True
        assert self.global_batch is not None
        return (t[0] * self.global_batch, t[1], t[2], t[3], t[4]), False

    #: Fit the ``mode`` form to measured speeds; see :func:`fit_speed`.
    fit = staticmethod(fit_speed)


# ---------------------------------------------------------------------------------------
# Sampling planner
# ---------------------------------------------------------------------------------------


def plan_sampling(
    n_configs: int = 10,
    *,
    max_ps: int = 16,
    max_workers: int = 16,
    mode: str = "sync",
    max_tasks: int | None = None,
    global_batch: float = 256.0,
    start: Sequence[tuple[int, int]] = ((1, 1),),
) -> list[tuple[int, int]]:
    """Choose the ``(p, w)`` configurations to pre-run before fitting a speed model.

    Greedy D-optimal design on the features of the linearised model (columns scaled to
    unit maximum over the candidates): each step adds the candidate that most increases
    ``log det`` of the information matrix.  Diagonal-only sampling (``p == w``) makes
    ``w/p`` constant and ``w``, ``p`` collinear; the design therefore spreads the points
    over both sides of the diagonal and across the range of ``w/p``.

    Args:
        n_configs: number of configurations to return (>= the number of coefficients).
        max_ps: largest number of servers to consider.
        max_workers: largest number of workers to consider.
        mode: ``"async"`` or ``"sync"`` (which features are to be identified).
        max_tasks: optional cap on ``p + w`` of a pre-run (pre-running is not free).
        global_batch: ``M`` for the sync features (only scales a column).
        start: configurations always included first.

    Returns:
        Distinct configurations, ``start`` first, in the order chosen.
    """
    _check_mode(mode)
    if max_ps < 1 or max_workers < 1:
        raise OptimusError("max_ps and max_workers must be >= 1")
    need = MIN_POINTS[mode]
    if n_configs < need:
        raise OptimusError(f"n_configs must be >= {need} for the {mode} form, got {n_configs}")
    grid = [
        (pp, ww)
        for pp in range(1, max_ps + 1)
        for ww in range(1, max_workers + 1)
        if max_tasks is None or pp + ww <= max_tasks
    ]
    if len(grid) < n_configs:
        raise OptimusError(
            f"only {len(grid)} candidate configurations for n_configs={n_configs}; "
            "raise max_ps/max_workers/max_tasks"
        )
    cand = np.array(grid, dtype=np.float64)
    feats = _features(mode, cand[:, 0], cand[:, 1], global_batch)
    feats = feats / np.max(np.abs(feats), axis=0)
    k = feats.shape[1]
    info = 1e-6 * np.eye(k)
    chosen: list[int] = []
    index = {c: i for i, c in enumerate(grid)}
    for c in start:
        i = index.get((int(c[0]), int(c[1])))
        if i is not None and i not in chosen:
            chosen.append(i)
            info += np.outer(feats[i], feats[i])
    while len(chosen) < n_configs:
        inv = np.linalg.inv(info)
        gain = np.einsum("ij,jk,ik->i", feats, inv, feats)
        gain[chosen] = -np.inf
        i = int(np.argmax(gain))
        chosen.append(i)
        info += np.outer(feats[i], feats[i])
    return [grid[i] for i in chosen]


# ---------------------------------------------------------------------------------------
# All-reduce GPU jobs
# ---------------------------------------------------------------------------------------

_AR_COEFS = ("c0", "c_bsz", "s_local", "s_local_gpu", "s_net", "s_net_gpu", "s_net_node")


def _ar_parts(
    coef: FloatArray, gpus: FloatArray, nodes: FloatArray, bsz: FloatArray
) -> tuple[FloatArray, FloatArray]:
    compute = coef[0] + coef[1] * bsz
    local = (gpus > 1) & (nodes <= 1)
    net = nodes > 1
    sync = np.where(local, coef[2] + coef[3] * (gpus - 2), 0.0) + np.where(
        net, coef[4] + coef[5] * (gpus - 2) + coef[6] * (nodes - 2), 0.0
    )
    return compute, sync


@attrs.frozen
class AllReduceSpeedModel:
    """Step time of a data-parallel all-reduce GPU job vs GPU count, node count and batch.

    ``compute = c0 + c_bsz * local_bsz``; ``sync`` is 0 on one GPU, ``s_local +
    s_local_gpu*(gpus-2)`` on several GPUs of one node and ``s_net + s_net_gpu*(gpus-2) +
    s_net_node*(nodes-2)`` across nodes (ring all-reduce time grows with the ring); the
    two overlap as ``step = (compute^gamma + sync^gamma)^(1/gamma)`` with ``gamma >= 1``
    (``gamma = 1``: no overlap).  All coefficients are non-negative.  Fitted by NNLS on
    the additive form (relative-error rows) followed by a bounded least-squares
    refinement of the log step time including ``gamma``.

    Attributes:
        coefficients: the seven coefficients, in the order named above.
        gamma: overlap exponent.
        fit_error: median relative step-time error on the fitted points.
        n_points: number of measurements fitted.
    """

    coefficients: tuple[float, ...] = attrs.field(converter=_float_tuple)
    gamma: float = 1.0
    fit_error: float = 0.0
    n_points: int = 0

    def __attrs_post_init__(self) -> None:
        if len(self.coefficients) != len(_AR_COEFS):
            raise OptimusError(f"coefficients must have {len(_AR_COEFS)} values {_AR_COEFS}")
        if self.gamma < 1:
            raise OptimusError(f"gamma must be >= 1, got {self.gamma}")

    def step_time(self, gpus: ArrayLike, nodes: ArrayLike, local_bsz: ArrayLike) -> FloatArray:
        """Predicted seconds per step."""
        g = np.asarray(gpus, dtype=np.float64)
        n = np.asarray(nodes, dtype=np.float64)
        b = np.asarray(local_bsz, dtype=np.float64)
        compute, sync = _ar_parts(np.array(self.coefficients), g, n, b)
        gam = self.gamma
        return np.asarray((compute**gam + sync**gam) ** (1.0 / gam), dtype=np.float64)

    def throughput(self, gpus: ArrayLike, nodes: ArrayLike, local_bsz: ArrayLike) -> FloatArray:
        """Predicted samples per second: ``gpus * local_bsz / step_time``."""
        g = np.asarray(gpus, dtype=np.float64)
        b = np.asarray(local_bsz, dtype=np.float64)
        return np.asarray(g * b / self.step_time(gpus, nodes, local_bsz), dtype=np.float64)

    @classmethod
    def fit(
        cls,
        gpus: ArrayLike,
        nodes: ArrayLike,
        local_bsz: ArrayLike,
        step_time: ArrayLike,
    ) -> AllReduceSpeedModel:
        """Fit to measured step times (at least 7 points).

        Raises:
            InsufficientDataError: fewer than 7 measurements.
            OptimusError: bad values (non-positive step times, ``nodes > gpus``...).
        """
        g = np.atleast_1d(np.asarray(gpus, dtype=np.float64)).ravel()
        n = np.atleast_1d(np.asarray(nodes, dtype=np.float64)).ravel()
        b = np.atleast_1d(np.asarray(local_bsz, dtype=np.float64)).ravel()
        t = np.atleast_1d(np.asarray(step_time, dtype=np.float64)).ravel()
        if not (g.shape == n.shape == b.shape == t.shape):
            raise OptimusError("gpus, nodes, local_bsz and step_time must have the same length")
        if g.size < len(_AR_COEFS):
            raise InsufficientDataError(
                f"the all-reduce model needs at least {len(_AR_COEFS)} measurements, got {g.size}"
            )
        if np.any(t <= 0) or np.any(~np.isfinite(t)):
            raise OptimusError("step_time must be finite and > 0")
        if np.any(g < 1) or np.any(n < 1) or np.any(n > g) or np.any(b <= 0):
            raise OptimusError("need gpus >= nodes >= 1 and local_bsz > 0 for every point")
        local = ((g > 1) & (n <= 1)).astype(np.float64)
        net = (n > 1).astype(np.float64)
        x = np.stack(
            [np.ones_like(g), b, local, local * (g - 2), net, net * (g - 2), net * (n - 2)],
            axis=1,
        )
        coef0, _ = nnls(x / t[:, None], np.ones_like(t))

        def resid(v: FloatArray) -> FloatArray:
            c = v[:-1]
            gam = v[-1]
            compute, sync = _ar_parts(c, g, n, b)
            pred = (np.maximum(compute, 1e-12) ** gam + sync**gam) ** (1.0 / gam)
            return np.asarray(np.log(pred) - np.log(t), dtype=np.float64)

        start = np.concatenate([np.maximum(coef0, 1e-9), [1.5]])
        lo = np.zeros(start.size)
        lo[-1] = 1.0
        hi = np.full(start.size, np.inf)
        hi[-1] = 10.0
        try:
            sol = least_squares(resid, start, bounds=(lo, hi), method="trf")
            coef, gam = sol.x[:-1], float(sol.x[-1])
        except (ValueError, np.linalg.LinAlgError):  # pragma: no cover - solver failure
            coef, gam = coef0, 1.0
        model = cls(coefficients=tuple(coef), gamma=gam)
        err = float(np.median(np.abs(model.step_time(g, n, b) / t - 1.0)))
        return attrs.evolve(model, fit_error=err, n_points=int(g.size))


def placement_shape(placement: str | int | Iterable[int]) -> tuple[int, int]:
    """``(gpus, nodes)`` of a Pollux placement string such as ``"1234"`` (GPUs per node)."""
    if isinstance(placement, str | int):
        digits = [int(c) for c in str(placement)]
    else:
        digits = [int(d) for d in placement]
    if not digits or any(d < 0 for d in digits):
        raise OptimusError(f"bad placement {placement!r}")
    used = [d for d in digits if d > 0]
    return sum(used), len(used)
