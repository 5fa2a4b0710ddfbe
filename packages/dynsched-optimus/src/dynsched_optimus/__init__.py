"""dynsched-optimus: Optimus-style cluster scheduling: convergence and speed models, allocation, placement, PAA and a cluster simulator."""

from __future__ import annotations

__version__ = "0.1.0"

__all__: list[str] = []
