"""Argument and state validation shared by the built-in policies."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dynsched_core import ConfigError

__all__ = [
    "check_bool",
    "check_number",
    "check_state_keys",
    "clamp_ratio",
    "round_ratio",
]

#: Ratios are kept rounded to this many decimals so that repeated ``+0.05``/``-0.02``
#: steps land exactly on the decimal value (``0.55 - 0.02 == 0.53``) and never drift.
RATIO_DECIMALS = 12


def check_number(owner: str, name: str, value: Any, lo: float, hi: float) -> float:
    """Return ``value`` as a float after checking it is a finite number in ``[lo, hi]``.

    Raises:
        TypeError: ``value`` is not a real number (bools and strings are refused).
        ConfigError: ``value`` is outside ``[lo, hi]`` or not finite; the message names
            ``owner.name`` and the allowed range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner}: {name} must be a number in [{lo:g}, {hi:g}], got {value!r}")
    if not (math.isfinite(value) and lo <= value <= hi):
        raise ConfigError(f"{owner}: {name} must be in [{lo:g}, {hi:g}], got {value!r}", key=name)
    return float(value)


def check_bool(owner: str, name: str, value: Any) -> bool:
    """Return ``value`` after checking it is a bool.

    Raises:
        TypeError: ``value`` is not a bool.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: {name} must be a bool (true/false), got {value!r}")
    return value


def check_state_keys(owner: str, state: Mapping[str, Any], keys: frozenset[str]) -> None:
    """Check that ``state`` is a mapping holding exactly ``keys``.

    Raises:
        TypeError: ``state`` is not a mapping.
        ValueError: keys are missing or unknown (both are listed).
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"{owner}.load_state_dict expects a mapping, got {type(state).__name__}")
    missing = sorted(keys - set(state))
    unknown = sorted(set(state) - keys)
    if missing or unknown:
        raise ValueError(
            f"{owner}.load_state_dict: expected keys {sorted(keys)}; missing {missing}, "
            f"unknown {unknown}"
        )


def round_ratio(value: float) -> float:
    """Round a ratio to `RATIO_DECIMALS` decimals (see there)."""
    return round(value, RATIO_DECIMALS)


def clamp_ratio(value: float) -> float:
    """A ratio kept in its own domain ``[0, 1]`` (the framework's guard-rail range is the
    driver's to apply, not the policy's)."""
    return min(max(value, 0.0), 1.0)
