"""Type aliases shared by the modules of dynsched-optimus."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["FloatArray"]

#: A float64 NumPy array (rates, capacities, fitted curves).
FloatArray = npt.NDArray[np.float64]
