"""Online speed form of an all-reduce GPU job (used by the composed Optimus scheduler).

Seconds per iteration for ``n`` GPUs on ``k`` nodes at global batch ``M`` trained in
``m`` micro-batches per GPU (``m = 1`` without gradient accumulation)::

    t(n, k, M) = th0 * m + th1 * M / n + th2 * [k > 1] + th3 * (k - 1) + th4 * log2(n)

fitted by NNLS with relative-error rows: a fixed cost per micro-batch, a cost per
sample of the local batch, and the synchronisation terms.  Unlike dynsched-optimus'
``AllReduceSpeedModel`` (seven coefficients, at least seven measurements, per atomic
local batch), it is usable from two measured configurations and predicts the time of a
whole iteration including gradient accumulation, which is what a scheduler that only
sees iteration rates can fit.  Measurements may be taken at different batch sizes (a job
whose batch the scheduler adapts): each is keyed by the batch it was measured at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.optimize import nnls

from dynsched_optimus._goodput import micro_steps
from dynsched_optimus._types import FloatArray

__all__ = ["fit_allreduce_speed", "predict_allreduce_time"]


def _features(n: FloatArray, k: FloatArray, batch: FloatArray, micro: FloatArray) -> FloatArray:
    return np.stack(
        [micro, batch / n, (k > 1).astype(float), k - 1.0, np.log2(n)],
        axis=-1,
    )


def fit_allreduce_speed(
    samples: Mapping[tuple[float, ...], Sequence[float]],
    batch: float,
    max_local: float | None = None,
) -> FloatArray | None:
    """Fit iteration-time coefficients.

    Args:
        samples: ``{(gpus, 0, nodes): [iterations/s]}`` or ``{(gpus, 0, nodes, batch):
            [...]}`` (a key without a batch was measured at ``batch``).
        batch: the global batch of keys that do not name one.
        max_local: largest per-GPU micro-batch (``None``: no gradient accumulation).

    Returns:
        The five coefficients, or ``None`` with fewer than two configurations.
    """
    if len(samples) < 2:
        return None
    keys = list(samples)
    n = np.array([kk[0] for kk in keys], dtype=float)
    k = np.array([kk[2] for kk in keys], dtype=float)
    b = np.array([kk[3] if len(kk) > 3 else batch for kk in keys], dtype=float)
    m = np.array([micro_steps(bb, int(nn), max_local) for bb, nn in zip(b, n, strict=True)])
    t = np.array([1.0 / float(np.mean(samples[kk])) for kk in keys])
    a = _features(n, k, b, m) / t[:, None]
    coef: FloatArray = nnls(a, np.ones_like(t))[0]
    return coef


def predict_allreduce_time(
    coef: FloatArray,
    n: int,
    k: int,
    batch: float | FloatArray,
    micro: float | FloatArray = 1.0,
) -> FloatArray:
    """Predicted seconds per iteration (an array when ``batch`` is one)."""
    b = np.asarray(batch, dtype=float)
    f = _features(
        np.full(b.shape, float(n)),
        np.full(b.shape, float(k)),
        b,
        np.broadcast_to(np.asarray(micro, dtype=float), b.shape),
    )
    return np.maximum(f @ coef, 1e-6)
