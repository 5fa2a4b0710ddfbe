"""attrs validators whose errors name the field and the allowed range."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import attrs

__all__ = [
    "bool_",
    "float_ge",
    "float_in",
    "int_ge",
    "one_of",
    "tuple_of_floats_ge",
    "tuple_of_ints_ge",
]

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def _where(inst: Any, attr: attrs.Attribute[Any]) -> str:
    return f"{type(inst).__name__}.{attr.name}"


def int_ge(minimum: int) -> Validator:
    """Value must be an ``int`` (not ``bool``) and ``>= minimum``."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{_where(inst, attr)} must be an int >= {minimum}, got {value!r}")
        if value < minimum:
            raise ValueError(f"{_where(inst, attr)} must be >= {minimum}, got {value}")

    return check


def float_ge(minimum: float) -> Validator:
    """Value must be a finite real number ``>= minimum``."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{_where(inst, attr)} must be a number >= {minimum}, got {value!r}")
        if not math.isfinite(value) or value < minimum:
            raise ValueError(
                f"{_where(inst, attr)} must be a finite number >= {minimum}, got {value}"
            )

    return check


def float_in(lo: float, hi: float) -> Validator:
    """Value must be a finite real number in ``[lo, hi]``."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{_where(inst, attr)} must be a number in [{lo}, {hi}], got {value!r}")
        if not (math.isfinite(value) and lo <= value <= hi):
            raise ValueError(f"{_where(inst, attr)} must be in [{lo}, {hi}], got {value}")

    return check


def bool_() -> Validator:
    """Value must be a ``bool``."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"{_where(inst, attr)} must be a bool (true/false), got {value!r}")

    return check


def one_of(choices: Iterable[str]) -> Validator:
    """Value must be one of ``choices``."""
    allowed = tuple(choices)

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value not in allowed:
            raise ValueError(f"{_where(inst, attr)} must be one of {list(allowed)}, got {value!r}")

    return check


def tuple_of_floats_ge(minimum: float) -> Validator:
    """Value must be a tuple of finite numbers, each ``>= minimum``."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, tuple):
            raise TypeError(
                f"{_where(inst, attr)} must be a tuple of numbers, got {type(value).__name__}"
            )
        for i, v in enumerate(value):
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not math.isfinite(v)
                or v < minimum
            ):
                raise ValueError(
                    f"{_where(inst, attr)}[{i}] must be a finite number >= {minimum}, got {v!r}"
                )

    return check


def tuple_of_ints_ge(minimum: int) -> Validator:
    """Value must be a tuple of ints, each ``>= minimum``."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, tuple):
            raise TypeError(
                f"{_where(inst, attr)} must be a tuple of ints, got {type(value).__name__}"
            )
        for i, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
                raise ValueError(
                    f"{_where(inst, attr)}[{i}] must be an int >= {minimum}, got {v!r}"
                )

    return check
