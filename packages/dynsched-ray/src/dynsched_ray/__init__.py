"""dynsched-ray: Ray actors and adapters that run the dynsched core across a Ray cluster."""

from __future__ import annotations

__version__ = "0.1.0"

__all__: list[str] = []
