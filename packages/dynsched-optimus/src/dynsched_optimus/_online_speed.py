"""Online speed form of an all-reduce GPU job (used by the composed Optimus scheduler).

Seconds per iteration for ``n`` GPUs on ``k`` nodes at global batch ``M``::

    t(n, k) = th0 + th1 * M / n + th2 * [k > 1] + th3 * (k - 1) + th4 * log2(n)

fitted by NNLS with relative-error rows. Unlike dynsched-optimus'
``AllReduceSpeedModel`` (seven coefficients, at least seven measurements, per atomic
local batch), it is usable from two measured configurations and predicts the time of a
whole iteration including gradient accumulation (the ``M / n`` term), which is what a
scheduler that only sees iteration rates can fit. Convergence and PS speed models come
from dynsched-optimus itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.optimize import nnls

__all__ = ["fit_allreduce_speed", "predict_allreduce_time"]


def _features_allreduce(n: np.ndarray, k: np.ndarray, batch: float) -> np.ndarray:
    return np.stack(
        [np.ones_like(n), batch / n, (k > 1).astype(float), k - 1.0, np.log2(n)], axis=1
    )


def fit_allreduce_speed(
    samples: Mapping[tuple[int, int, int], Sequence[float]], batch: float
) -> np.ndarray | None:
    """Fit iteration-time coefficients from ``{(gpus, 0, nodes): [iterations/s]}``."""
    if len(samples) < 2:
        return None
    keys = list(samples)
    n = np.array([kk[0] for kk in keys], dtype=float)
    k = np.array([kk[2] for kk in keys], dtype=float)
    t = np.array([1.0 / float(np.mean(samples[kk])) for kk in keys])
    a = _features_allreduce(n, k, batch) / t[:, None]
    coef, _ = nnls(a, np.ones_like(t))
    return coef


def predict_allreduce_time(coef: np.ndarray, n: int, k: int, batch: float) -> float:
    """Predicted seconds per iteration."""
    f = _features_allreduce(np.array([float(n)]), np.array([float(k)]), batch)[0]
    return float(max(f @ coef, 1e-6))
