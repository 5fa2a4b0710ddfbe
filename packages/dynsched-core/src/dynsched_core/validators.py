"""attrs validators whose errors name the field and the allowed range.

The one validator module of dynsched: every config, options and value class of the core
validates through these (the sibling packages' options classes too), so one message
format holds everywhere: ``"<Class>.<field> must be <allowed>, got <value>"``. Range
errors are `dynsched_core.ConfigError` (a ``ValueError``), type errors
`dynsched_core.errors.ConfigTypeError` (also a ``TypeError``); both carry the field
name in ``key``. A validator of its own builds its error with `field_error`, so it keeps
that format. `expect_instance` and `options_or_default` check the constructor
arguments of the runtime classes (a plain `TypeError` naming the argument).

Example:
    >>> import attrs
    >>> from dynsched_core import validators as v
    >>> @attrs.frozen
    ... class Options:
    ...     timeout_s: float = attrs.field(default=1.0, validator=v.float_gt(0.0))
    >>> Options(timeout_s=0.0)
    Traceback (most recent call last):
    ...
    dynsched_core._errors.ConfigError: Options.timeout_s must be a finite number > 0, got 0.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs

from dynsched_core._errors import ConfigError, ConfigTypeError

__all__ = [
    "Validator",
    "bool_",
    "field_error",
    "float_ge",
    "float_gt",
    "float_in",
    "int_ge",
    "non_empty_str",
    "one_of",
    "tuple_of_floats_ge",
    "tuple_of_ints_ge",
]

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def field_error(
    inst: Any, attr: attrs.Attribute[Any], message: str, *, wrong_type: bool = False
) -> ConfigError:
    """The error of an attrs validator: ``"<Class>.<field> <message>"`` keyed by the field.

    Args:
        inst: The instance being validated.
        attr: The attribute being validated.
        message: What is wrong, starting with ``"must be ..."`` (or with ``"[i] must be ..."``
            for item ``i`` of a tuple field).
        wrong_type: A `ConfigTypeError` (the value has the wrong type) instead of a
            `ConfigError` (a value out of range).

    Example:
        >>> import attrs
        >>> def even(inst, attr, value):
        ...     if value % 2:
        ...         raise field_error(inst, attr, f"must be even, got {value!r}")
        >>> @attrs.frozen
        ... class Pair:
        ...     size: int = attrs.field(validator=even)
        >>> Pair(3)
        Traceback (most recent call last):
        ...
        dynsched_core._errors.ConfigError: Pair.size must be even, got 3
    """
    cls = ConfigTypeError if wrong_type else ConfigError
    sep = "" if message.startswith("[") else " "  # "field[3] must ..." for tuple items
    return cls(f"{type(inst).__name__}.{attr.name}{sep}{message}", key=attr.name)


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def int_ge(minimum: int, *, maximum: int | None = None, optional: bool = False) -> Validator:
    """Value must be an ``int`` (not ``bool``) and ``>= minimum`` (or None if ``optional``).

    With ``maximum``, also ``<= maximum`` (the message then gives the range
    ``[minimum, maximum]``).
    """
    rng = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum:,}]"
    what = f"an int {rng}" + (" or null" if optional else "")

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise field_error(inst, attr, f"must be {what}, got {_show(value)}", wrong_type=True)
        if value < minimum:
            raise field_error(inst, attr, f"must be >= {minimum}, got {_show(value)}")
        if maximum is not None and value > maximum:
            raise field_error(inst, attr, f"must be <= {maximum:,} ({what}), got {_show(value)}")

    return check


def _finite(value: int | float) -> bool:
    """``math.isfinite`` that also takes an int too large for a float (it is finite)."""
    return isinstance(value, int) or math.isfinite(value)


def _show(value: Any) -> str:
    """``repr`` of a value, shortened (a 5,000-digit number is not printed whole)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return "an integer of more than 30 digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def float_ge(minimum: float) -> Validator:
    """Value must be a finite real number ``>= minimum``."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if not _is_number(value):
            raise field_error(
                inst, attr, f"must be a number >= {minimum}, got {value!r}", wrong_type=True
            )
        if not _finite(value) or value < minimum:
            raise field_error(
                inst, attr, f"must be a finite number >= {minimum}, got {_show(value)}"
            )

    return check


def float_gt(minimum: float, *, optional: bool = False) -> Validator:
    """Value must be a finite real number ``> minimum`` (or None if ``optional``)."""
    what = f"a number > {minimum:g}" + (" or null" if optional else "")

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if optional and value is None:
            return
        if not _is_number(value):
            raise field_error(inst, attr, f"must be {what}, got {value!r}", wrong_type=True)
        if not _finite(value) or value <= minimum:
            raise field_error(
                inst, attr, f"must be a finite number > {minimum:g}, got {_show(value)}"
            )

    return check


def float_in(lo: float, hi: float = math.inf, *, lo_open: bool = False) -> Validator:
    """Value must be a finite real number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{']' if math.isfinite(hi) else ')'}"

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if not _is_number(value):
            raise field_error(
                inst, attr, f"must be a number in {rng}, got {value!r}", wrong_type=True
            )
        below = value <= lo if lo_open else value < lo
        if not _finite(value) or below or value > hi:
            raise field_error(inst, attr, f"must be a number in {rng}, got {_show(value)}")

    return check


def bool_() -> Validator:
    """Value must be a ``bool``."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, bool):
            raise field_error(
                inst, attr, f"must be a bool (true/false), got {value!r}", wrong_type=True
            )

    return check


def non_empty_str(what: str = "a non-empty string") -> Validator:
    """Value must be a string with non-blank content."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, str) or not value.strip():
            raise field_error(
                inst, attr, f"must be {what}, got {value!r}", wrong_type=not isinstance(value, str)
            )

    return check


def one_of(choices: Iterable[str]) -> Validator:
    """Value must be one of ``choices``."""
    allowed = tuple(choices)

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value not in allowed:
            raise field_error(inst, attr, f"must be one of {list(allowed)}, got {value!r}")

    return check


def tuple_of_floats_ge(minimum: float) -> Validator:
    """Value must be a tuple of finite numbers, each ``>= minimum``."""
    return _tuple_of(
        "numbers",
        lambda x: _is_number(x) and _finite(x) and x >= minimum,
        f"a finite number >= {minimum}",
    )


def tuple_of_ints_ge(minimum: int) -> Validator:
    """Value must be a tuple of ints, each ``>= minimum``."""
    return _tuple_of(
        "ints",
        lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= minimum,
        f"an int >= {minimum}",
    )


def _tuple_of(items: str, ok: Callable[[Any], bool], element: str) -> Validator:
    """Value must be a tuple (of ``items``) whose every element passes ``ok`` (``element``)."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, tuple):
            raise field_error(
                inst,
                attr,
                f"must be a tuple of {items}, got {type(value).__name__}",
                wrong_type=True,
            )
        for i, x in enumerate(value):
            if not ok(x):
                raise field_error(inst, attr, f"[{i}] must be {element}, got {x!r}")

    return check


_T = TypeVar("_T")


def expect_instance(name: str, value: Any, cls: type[_T], *, by_type: bool = False) -> _T:
    """``value`` when it is a ``cls``; otherwise a `TypeError` naming the argument, the class
    and what came instead (its type's name when ``by_type``, else its repr)."""
    if not isinstance(value, cls):
        got = type(value).__name__ if by_type else repr(value)
        raise TypeError(f"{name} must be a {cls.__name__}, got {got}")
    return value


def options_or_default(options: _T | None, cls: type[_T]) -> _T:
    """``options``, or ``cls()`` when ``None``; a `TypeError` when it is not a ``cls``."""
    return expect_instance("options", cls() if options is None else options, cls)
