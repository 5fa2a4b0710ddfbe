"""dynsched-sim: Discrete-event simulation of a fully-async RL cluster on virtual time, running the real dynsched core."""

from __future__ import annotations

__version__ = "0.1.0"

__all__: list[str] = []
