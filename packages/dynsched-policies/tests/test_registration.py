"""The built-in policies are found by name through entry points, with no import."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from dynsched_core import available_policies, build_policy, get_policy_class
from dynsched_policies import (
    BUILTIN_POLICIES,
    DefaultDynamicSchedulePolicy,
    FixedRatioDynamicSchedulePolicy,
    StaticFullyAsyncPolicy,
)


def test_fixed_ratio_builds_in_a_fresh_interpreter_without_importing_the_package() -> None:
    code = textwrap.dedent(
        """
        import sys
        from dynsched_core import build_policy, available_policies
        assert "dynsched_policies" not in sys.modules
        names = available_policies()
        assert {"default", "static_fully_async", "fixed_ratio"} <= set(names), names
        assert "dynsched_policies" not in sys.modules  # discovery alone imports nothing
        p = build_policy("fixed_ratio", deactivate_ratio=0.4)
        print(type(p).__module__, type(p).__qualname__, p.deactivate_ratio, type(p).name)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "dynsched_policies._default",
        "FixedRatioDynamicSchedulePolicy",
        "0.4",
        "fixed_ratio",
    ]


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("default", DefaultDynamicSchedulePolicy),
        ("static_fully_async", StaticFullyAsyncPolicy),
        ("fixed_ratio", FixedRatioDynamicSchedulePolicy),
    ],
)
def test_names_map_to_classes(name: str, cls: type) -> None:
    assert name in available_policies()
    assert get_policy_class(name) is cls
    assert BUILTIN_POLICIES[name] is cls
    assert isinstance(build_policy(name), cls)


def test_same_config_kwargs_build_every_builtin() -> None:
    for name in BUILTIN_POLICIES:
        p = build_policy(name, deactivate_ratio=0.5, only_hybrid=False)
        assert p.should_deactivate(1, True, _ctx()) is True


def _ctx():  # type: ignore[no-untyped-def]
    from dynsched_core import DynamicScheduleContext

    return DynamicScheduleContext(required_samples=4)
