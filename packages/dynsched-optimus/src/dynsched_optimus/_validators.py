"""attrs validators shared by the records of dynsched-optimus (one message per rule)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from dynsched_optimus._errors import OptimusError

__all__ = [
    "int_at_least",
    "non_negative",
    "number_at_least",
    "one_of",
    "optional_positive",
    "positive",
]


def positive(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    """A finite number > 0."""
    if not (value > 0 and math.isfinite(value)):
        raise OptimusError(f"{attr.name} must be a finite number > 0, got {value!r}")


def non_negative(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    """A finite number >= 0."""
    if not (value >= 0 and math.isfinite(value)):
        raise OptimusError(f"{attr.name} must be a finite number >= 0, got {value!r}")


def optional_positive(
    _inst: object, attr: attrs.Attribute[float | None], value: float | None
) -> None:
    """``None`` or a finite number > 0."""
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise OptimusError(f"{attr.name} must be None or a finite number > 0, got {value!r}")


def int_at_least(n: int) -> Callable[[object, attrs.Attribute[int], int], None]:
    """An integer >= ``n``."""

    def check(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
        if not isinstance(value, int) or value < n:
            raise OptimusError(f"{attr.name} must be an integer >= {n}, got {value!r}")

    return check


def number_at_least(lo: float) -> Callable[[object, attrs.Attribute[Any], Any], None]:
    """A number (not a bool, not NaN) >= ``lo``; infinity allowed."""

    def check(_inst: object, attr: attrs.Attribute[Any], value: Any) -> None:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= lo
        if not ok:
            raise OptimusError(f"{attr.name} must be a number >= {lo}, got {value!r}")

    return check


def one_of(allowed: tuple[str, ...]) -> Callable[[object, attrs.Attribute[Any], Any], None]:
    """One of the strings ``allowed``."""

    def check(_inst: object, attr: attrs.Attribute[Any], value: Any) -> None:
        if value not in allowed:
            raise OptimusError(f"{attr.name} must be one of {list(allowed)}, got {value!r}")

    return check
