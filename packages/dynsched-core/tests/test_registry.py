from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import dynsched_core._registry as reg
import pytest
from dynsched_core import (
    DynamicScheduleContext,
    DynamicSchedulePolicyBase,
    available_policies,
    build_policy,
    get_policy_class,
    register_policy,
)
from dynsched_core.errors import PolicyRegistryError


class _Base(DynamicSchedulePolicyBase):
    def __init__(self, ratio: float = 0.5) -> None:
        self.ratio = ratio

    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        return int(self.ratio * ctx.step_required_samples)

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return True


class PolicyA(_Base):
    pass


class PolicyB(_Base):
    pass


class _FakeDist:
    def __init__(self, name: str, eps: list[tuple[str, str]]) -> None:
        self.metadata = {"Name": name}
        self.entry_points = [metadata.EntryPoint(n, v, reg.ENTRY_POINT_GROUP) for n, v in eps]


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[_FakeDist]]:
    """An isolated registry whose installed distributions are the list it yields."""
    mod = types.ModuleType("_dynsched_test_policies")
    mod.PolicyA = PolicyA  # type: ignore[attr-defined]
    mod.PolicyB = PolicyB  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "_dynsched_test_policies", mod)
    fresh = reg._Registry()
    dists: list[_FakeDist] = []
    monkeypatch.setattr(reg, "_REGISTRY", fresh)
    monkeypatch.setattr(metadata, "distributions", lambda: list(dists))
    yield dists


def test_register_and_build(registry: list[_FakeDist]) -> None:
    register_policy("pol_a")(PolicyA)
    assert "pol_a" in available_policies()
    policy = build_policy("pol_a", ratio=0.25)
    assert isinstance(policy, PolicyA)
    assert policy.ratio == 0.25
    assert PolicyA.name == "pol_a"
    # re-registering the same class is harmless
    register_policy("pol_a")(PolicyA)


def test_unknown_name_lists_names_and_closest_match(registry: list[_FakeDist]) -> None:
    register_policy("fixed_ratio_x")(PolicyA)
    register_policy("other")(PolicyB)
    with pytest.raises(PolicyRegistryError) as err:
        build_policy("fixd_ratio_x")
    msg = str(err.value)
    assert "unknown policy 'fixd_ratio_x'" in msg
    assert "Did you mean 'fixed_ratio_x'?" in msg
    assert "['fixed_ratio_x', 'other']" in msg


def test_two_local_classes_under_one_name(registry: list[_FakeDist]) -> None:
    register_policy("dup")(PolicyA)
    with pytest.raises(PolicyRegistryError, match="registered twice"):
        register_policy("dup")(PolicyB)


def test_decorating_a_non_policy_fails(registry: list[_FakeDist]) -> None:
    with pytest.raises(PolicyRegistryError, match="not a subclass of DynamicSchedulePolicyBase"):
        register_policy("bad")(dict)  # type: ignore[type-var]


def test_bad_constructor_arguments(registry: list[_FakeDist]) -> None:
    register_policy("pol_a")(PolicyA)
    with pytest.raises(TypeError, match="cannot build policy 'pol_a'"):
        build_policy("pol_a", nope=1)


def test_entry_point_discovery_is_lazy_and_once(
    registry: list[_FakeDist], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.append(_FakeDist("dist-one", [("ep_a", "_dynsched_test_policies:PolicyA")]))
    calls: list[int] = []
    original = metadata.distributions

    def counting() -> Any:
        calls.append(1)
        return original()

    monkeypatch.setattr(metadata, "distributions", counting)
    assert available_policies() == ["ep_a"]
    assert get_policy_class("ep_a") is PolicyA
    assert get_policy_class("ep_a") is PolicyA
    assert len(calls) == 1  # discovered once


def test_two_distributions_one_name(registry: list[_FakeDist]) -> None:
    registry.append(_FakeDist("dist-one", [("same", "_dynsched_test_policies:PolicyA")]))
    registry.append(_FakeDist("dist-two", [("same", "_dynsched_test_policies:PolicyB")]))
    with pytest.raises(PolicyRegistryError) as err:
        build_policy("same")
    assert "'dist-one'" in str(err.value)
    assert "'dist-two'" in str(err.value)


def test_entry_point_to_non_policy_names_the_distribution(registry: list[_FakeDist]) -> None:
    registry.append(_FakeDist("broken-dist", [("notapolicy", "collections:OrderedDict")]))
    with pytest.raises(PolicyRegistryError, match="distribution 'broken-dist'.*not a subclass"):
        build_policy("notapolicy")


def test_entry_point_that_fails_to_import(registry: list[_FakeDist]) -> None:
    registry.append(_FakeDist("ghost-dist", [("ghost", "no_such_module_xyz:Policy")]))
    with pytest.raises(PolicyRegistryError, match="'ghost-dist'.*failed to import"):
        build_policy("ghost")


def test_local_and_entry_point_clash(registry: list[_FakeDist]) -> None:
    registry.append(_FakeDist("dist-one", [("clash", "_dynsched_test_policies:PolicyA")]))
    register_policy("clash")(PolicyB)
    with pytest.raises(PolicyRegistryError, match="registered twice"):
        get_policy_class("clash")


def test_default_hooks_of_the_base_class() -> None:
    p = PolicyA()
    ctx = DynamicScheduleContext(required_samples=4, trigger_parameter_sync_step=2)
    assert p.request_rebalance(1, ctx) is None
    assert p.update_after_step(1, ctx) is None
    assert p.state_dict() == {}
    p.load_state_dict({})
    with pytest.raises(ValueError, match="keeps no state"):
        p.load_state_dict({"x": 1})
    assert p.deactivate_wait_samples(ctx) == 4
