"""dynsched-policies: Built-in dynamic scheduling policies of dynsched (default, static_fully_async, fixed_ratio)."""

from __future__ import annotations

__version__ = "0.1.0"

__all__: list[str] = []
