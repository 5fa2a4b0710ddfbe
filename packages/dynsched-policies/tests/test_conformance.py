"""Every built-in policy passes the conformance kit, plain and colocated."""

from __future__ import annotations

import functools

import pytest
from dynsched_core import build_policy
from dynsched_core.testing import check_policy
from dynsched_policies import BUILTIN_POLICIES


@pytest.mark.parametrize("name", sorted(BUILTIN_POLICIES))
def test_builtin_policy_passes_check_policy(name: str) -> None:
    cls = BUILTIN_POLICIES[name]
    check_policy(cls, colocated_factory=functools.partial(cls, only_hybrid=True))


@pytest.mark.parametrize("name", sorted(BUILTIN_POLICIES))
def test_policy_built_by_name_with_config_passes(name: str) -> None:
    check_policy(
        lambda: build_policy(name, deactivate_ratio=0.6),
        max_examples=15,
        name=f"build_policy({name!r})",
    )


def test_default_with_an_extreme_ratio_passes() -> None:
    check_policy(
        functools.partial(BUILTIN_POLICIES["default"], deactivate_ratio=1.0), max_examples=15
    )
