"""Error types of dynsched-optimus."""

from __future__ import annotations

__all__ = ["InsufficientDataError", "OptimusError"]


class OptimusError(ValueError):
    """Base class of the errors raised by dynsched-optimus on bad input."""


class InsufficientDataError(OptimusError):
    """Raised when a model is asked to fit on fewer points than it needs."""
