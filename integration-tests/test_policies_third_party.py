"""A policy shipped in a separate installed distribution is found by name and conforms."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
from importlib import metadata

from dynsched_core import POLICY_API_VERSION, available_policies, build_policy, get_policy_class
from dynsched_core.testing import check_policy


def test_example_policy_is_an_entry_point_of_its_own_distribution() -> None:
    eps = [
        (ep, dist.metadata["Name"])
        for dist in metadata.distributions()
        for ep in dist.entry_points
        if ep.group == "dynsched.policies" and ep.name == "example_threshold"
    ]
    assert [d for _, d in eps] == ["dynsched-example-policy"]
    assert "example_threshold" in available_policies()


def test_example_policy_builds_by_name_in_a_fresh_interpreter() -> None:
    code = textwrap.dedent(
        """
        import sys
        from dynsched_core import build_policy
        p = build_policy("example_threshold", threshold=0.25)
        assert "dynsched_example_policy" in sys.modules
        print(type(p).__module__, type(p).__name__, p.threshold)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["dynsched_example_policy", "ThresholdPolicy", "0.25"]


def test_example_policy_passes_check_policy() -> None:
    import dynsched_example_policy

    cls = get_policy_class("example_threshold")
    report = check_policy(
        lambda: build_policy("example_threshold"),
        colocated_factory=functools.partial(cls, only_hybrid=True),
        name="example_threshold",
    )
    # checked against this core's policy API, which serves the one the package is written for
    assert report.policy_api_version == POLICY_API_VERSION
    want = tuple(map(int, dynsched_example_policy.POLICY_API.split(".")))
    have = tuple(map(int, report.policy_api_version.split(".")))
    assert have[0] == want[0] and have[1] >= want[1]
    assert f"example_threshold conforms to dynsched policy API {POLICY_API_VERSION}" in str(report)
    check_policy(
        lambda: build_policy("example_threshold", threshold=0.9), name="example_threshold(0.9)"
    )
