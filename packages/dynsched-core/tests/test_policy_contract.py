"""The policy contract is derived from the code, versioned by rule and recorded."""

from __future__ import annotations

import abc
import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import attrs
import dynsched_core
import pytest
from dynsched_core import (
    POLICY_API_VERSION,
    DynamicScheduleContext,
    DynamicSchedulePolicyBase,
    require_policy_api,
)
from dynsched_core import _contract as c
from dynsched_core.errors import PolicyAPIError
from dynsched_core.testing import PolicyConformanceError, check_policy
from hypothesis import given
from hypothesis import strategies as st

RECORD = c.load_recorded_contract()
CODE = c.derive_policy_contract()
HOOKS = sorted(CODE["policy_hooks"])
FIELDS = sorted(CODE["context_fields"])
# relative to the record, so these tests keep passing after each recorded bump
MINOR_NEXT = c.next_policy_api_version(RECORD["version"], [c.ContractChange("minor", "")])
MAJOR_NEXT = c.next_policy_api_version(RECORD["version"], [c.ContractChange("major", "")])
LAST_CORE = RECORD["history"][-1]["core"]
NEXT_PATCH = c._suggest(LAST_CORE, breaking=False)  # a newer core of the same series
NEXT_SERIES = c._suggest(LAST_CORE, breaking=True)  # a core of the next series


# ----------------------------------------------------------------------------------
# Variants of the two classes, built from the real ones
# ----------------------------------------------------------------------------------
def policy_base_variant(drop: str | None = None, **add: Any) -> type:
    """`DynamicSchedulePolicyBase` without hook ``drop`` and with the members ``add``."""
    ns = {
        k: v
        for k, v in vars(DynamicSchedulePolicyBase).items()
        if k not in ("__dict__", "__weakref__", "__abstractmethods__", "_abc_impl", drop)
    }
    ns.update(add)
    return abc.ABCMeta("DynamicSchedulePolicyBase", (abc.ABC,), ns)


def context_variant(drop: str | None = None, **add: Any) -> type:
    """`DynamicScheduleContext` without field ``drop`` and with the fields ``add``."""
    these = {
        f.name: attrs.field(
            type=f.type, default=f.default, kw_only=f.kw_only, validator=f.validator
        )
        for f in attrs.fields(DynamicScheduleContext)
        if f.name != drop
    }
    these.update(add)
    members = {
        k: v
        for k, v in vars(DynamicScheduleContext).items()
        if isinstance(v, property) or (callable(v) and not k.startswith("_"))
    }
    base = type("_Members", (), members)
    return attrs.make_class("DynamicScheduleContext", these, bases=(base,), frozen=True)


def version_of(
    policy_base: type = DynamicSchedulePolicyBase, context: type = DynamicScheduleContext
) -> str:
    return c.policy_api_version(RECORD, c.derive_policy_contract(policy_base, context))


# ----------------------------------------------------------------------------------
# The record is up to date and the version is the derived one
# ----------------------------------------------------------------------------------
def test_recorded_policy_contract_matches_the_code() -> None:
    message = c.explain_contract_change(RECORD, CODE)
    assert not message, "\n" + message


def test_version_is_derived_and_exported() -> None:
    assert POLICY_API_VERSION == c.policy_api_version() == RECORD["version"]
    assert re.fullmatch(r"\d+\.\d+", POLICY_API_VERSION)
    assert dynsched_core.POLICY_API_VERSION is POLICY_API_VERSION
    # the variants reproduce the real classes exactly (so the tests below change one thing)
    assert c.derive_policy_contract(policy_base_variant(), context_variant()) == CODE


def test_contract_covers_every_hook_and_field() -> None:
    assert (
        sorted(n for n in dir(DynamicSchedulePolicyBase) if not n.startswith("_") and n != "name")
        == HOOKS
    )
    assert sorted(f.name for f in attrs.fields(DynamicScheduleContext)) == FIELDS
    assert CODE["policy_hooks"]["should_deactivate"] == {
        "signature": "(self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext) -> bool",
        "required": True,
    }
    assert CODE["policy_hooks"]["update_after_step"]["required"] is False
    assert CODE["context_fields"]["required_samples"] == {
        "type": "int",
        "required": True,
        "kw_only": True,
    }
    assert CODE["context_members"]["step_required_samples"] == {
        "kind": "property",
        "returns": "int",
    }


def test_history_follows_the_rule() -> None:
    history = RECORD["history"]
    assert history and history[-1]["version"] == RECORD["version"]
    for before, after in itertools.pairwise(history):
        b, a = c._parse(before["version"]), c._parse(after["version"])
        assert a > b, f"policy API versions must increase: {before} then {after}"
        assert c._core_key(after["core"]) > c._core_key(before["core"]), (
            f"policy API {after['version']} must ship in a newer dynsched-core than {before['core']}"
        )
        if a[0] != b[0]:
            assert c._breaking(after["core"]) > c._breaking(before["core"]), (
                f"policy API {after['version']} is a major change: it needs a breaking "
                f"dynsched-core release, but {after['core']} follows {before['core']}"
            )
    assert c._core_key(history[-1]["core"]) <= c._core_key(dynsched_core.__version__), (
        f"policy API {history[-1]['version']} is recorded for dynsched-core "
        f"{history[-1]['core']}, newer than this core ({dynsched_core.__version__})"
    )


# ----------------------------------------------------------------------------------
# The rule: removing or changing is major, adding optional is minor
# ----------------------------------------------------------------------------------
@given(hook=st.sampled_from(HOOKS))
def test_removing_any_hook_is_a_major_change(hook: str) -> None:
    variant = policy_base_variant(drop=hook)
    assert not hasattr(variant, hook)
    assert version_of(policy_base=variant) == MAJOR_NEXT
    changes = c.diff_policy_contracts(CODE, c.derive_policy_contract(variant))
    assert [str(x) for x in changes] == [f"major: removed policy hook `{hook}`"]


@given(field=st.sampled_from(FIELDS))
def test_removing_any_context_field_is_a_major_change(field: str) -> None:
    variant = context_variant(drop=field)
    assert field not in attrs.fields_dict(variant)
    assert version_of(context=variant) == MAJOR_NEXT
    changes = c.diff_policy_contracts(CODE, c.derive_policy_contract(context=variant))
    assert [str(x) for x in changes] == [f"major: removed context field `{field}`"]


@given(hook=st.sampled_from(HOOKS))
def test_changing_a_hook_signature_is_a_major_change(hook: str) -> None:
    def changed(self: Any, global_steps: int, extra: int = 0) -> None:
        return None

    variant = policy_base_variant(**{hook: changed})
    assert version_of(policy_base=variant) == MAJOR_NEXT


def test_changing_a_context_field_type_or_default_is_a_major_change() -> None:
    retyped = context_variant(queue_size=attrs.field(type="float", default=0, kw_only=True))
    assert version_of(context=retyped) == MAJOR_NEXT
    redefaulted = context_variant(
        trigger_parameter_sync_step=attrs.field(type="int", default=2, kw_only=True)
    )
    assert version_of(context=redefaulted) == MAJOR_NEXT


def test_adding_an_optional_hook_or_field_is_a_minor_change() -> None:
    def migrate_requests(self: Any, global_steps: int, ctx: DynamicScheduleContext) -> bool:
        return False

    hooked = policy_base_variant(migrate_requests=migrate_requests)
    assert version_of(policy_base=hooked) == MINOR_NEXT
    widened = context_variant(lend_fraction=attrs.field(type="float", default=1.0, kw_only=True))
    assert version_of(context=widened) == MINOR_NEXT
    both = c.derive_policy_contract(hooked, widened)
    assert c.policy_api_version(RECORD, both) == MINOR_NEXT  # two additions: one minor bump
    assert {x.level for x in c.diff_policy_contracts(CODE, both)} == {"minor"}


def test_adding_a_required_hook_or_field_is_a_major_change() -> None:
    @abc.abstractmethod
    def must_implement(self: Any, ctx: DynamicScheduleContext) -> int: ...

    assert version_of(policy_base=policy_base_variant(must_implement=must_implement)) == MAJOR_NEXT
    required = context_variant(cluster=attrs.field(type="str", kw_only=True))
    assert version_of(context=required) == MAJOR_NEXT


def test_a_required_hook_made_optional_is_a_minor_change() -> None:
    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return bool(is_hybrid_active)

    variant = policy_base_variant(should_deactivate=should_deactivate)
    assert version_of(policy_base=variant) == MINOR_NEXT


def test_next_version_arithmetic_and_bad_versions() -> None:
    major, minor = c.ContractChange("major", "x"), c.ContractChange("minor", "y")
    assert c.next_policy_api_version("1.4", []) == "1.4"
    assert c.next_policy_api_version("1.4", [minor]) == "1.5"
    assert c.next_policy_api_version("1.4", [minor, major]) == "2.0"
    for bad in ("1", "1.0.0", "v1.0", "01.0", "", None):
        with pytest.raises(ValueError, match="MAJOR.MINOR"):
            c.next_policy_api_version(bad, [])  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------
# End to end: edit the source, the installed constant follows
# ----------------------------------------------------------------------------------
def _version_of_edited_core(tmp_path: Path, module: str, edit: Any) -> str:
    src = Path(dynsched_core.__file__).parent
    dst = tmp_path / "dynsched_core"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    path = dst / module
    before = path.read_text(encoding="utf-8")
    after = edit(before)
    assert after != before, f"the edit of {module} changed nothing"
    path.write_text(after, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import dynsched_core as d; print(d.__file__); print(d.POLICY_API_VERSION)",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    where, version = out.stdout.split()
    assert where.startswith(str(tmp_path)), where
    return version


def _drop_method(name: str) -> Any:
    def edit(text: str) -> str:
        # the method from its `def` line to the next member of the class
        return re.sub(rf"\n    def {name}\(.*?(?=\n    (?:@|def )|\Z)", "\n", text, flags=re.S)

    return edit


def test_removing_a_hook_from_the_source_changes_the_version(tmp_path: Path) -> None:
    assert (
        _version_of_edited_core(tmp_path, "_policy.py", _drop_method("update_after_step"))
        == MAJOR_NEXT
    )


def test_removing_a_field_from_the_source_changes_the_version(tmp_path: Path) -> None:
    def drop_queue_size(text: str) -> str:
        return re.sub(r"\n    queue_size: int = attrs\.field\([^\n]*\)", "", text)

    assert _version_of_edited_core(tmp_path, "_context.py", drop_queue_size) == MAJOR_NEXT


def test_adding_an_optional_hook_in_the_source_is_a_minor_bump(tmp_path: Path) -> None:
    def add_hook(text: str) -> str:
        return text.replace(
            "    def state_dict(self)",
            "    def migrate_on_deactivate(self, ctx: DynamicScheduleContext) -> bool:\n"
            '        """Optional: migrate long requests."""\n'
            "        return False\n\n"
            "    def state_dict(self)",
        )

    assert _version_of_edited_core(tmp_path, "_policy.py", add_hook) == MINOR_NEXT


# ----------------------------------------------------------------------------------
# Recording a new version, and what the test above says when it fails
# ----------------------------------------------------------------------------------
def test_explanation_says_what_to_bump() -> None:
    minor = c.derive_policy_contract(
        context=context_variant(lend_fraction=attrs.field(type="float", default=1.0, kw_only=True))
    )
    text = c.explain_contract_change(RECORD, minor, core_version=LAST_CORE)
    assert "added optional context field `lend_fraction`" in text
    assert f"MINOR change: the policy API becomes {MINOR_NEXT}" in text
    assert f"bump dynsched-core from {LAST_CORE} to {NEXT_PATCH}" in text
    assert "tools/policy_contract.py record" in text
    # once core is bumped, only the changelog and the record are left to do
    text = c.explain_contract_change(RECORD, minor, core_version=NEXT_PATCH)
    assert f"dynsched-core is {NEXT_PATCH}" in text and "bump dynsched-core" not in text
    major = c.derive_policy_contract(policy_base_variant(drop="request_rebalance"))
    text = c.explain_contract_change(RECORD, major, core_version=NEXT_PATCH)
    assert "removed policy hook `request_rebalance`" in text
    assert f"MAJOR change: the policy API becomes {MAJOR_NEXT}" in text
    assert f"bump dynsched-core from {NEXT_PATCH} to {NEXT_SERIES}" in text
    assert "starts a new series" in text and "range to the new series" in text
    assert c.explain_contract_change(RECORD, CODE) == ""


def test_updated_record_needs_a_newer_core() -> None:
    minor = c.derive_policy_contract(
        context=context_variant(lend_fraction=attrs.field(type="float", default=1.0, kw_only=True))
    )
    with pytest.raises(ValueError, match="Bump dynsched-core's version first"):
        c.updated_record(RECORD, minor, LAST_CORE)
    new = c.updated_record(RECORD, minor, NEXT_PATCH)
    assert new["version"] == MINOR_NEXT and new["contract"] == minor
    assert new["history"][:-1] == RECORD["history"]
    assert new["history"][-1] == {
        "version": MINOR_NEXT,
        "core": NEXT_PATCH,
        "change": "minor: added optional context field `lend_fraction` "
        "(default=1.0, kw_only=True, required=False, type=float)",
    }
    assert c.load_recorded_contract() == RECORD  # the input is left alone
    assert c.policy_api_version(new, minor) == MINOR_NEXT

    major = c.derive_policy_contract(policy_base_variant(drop="request_rebalance"))
    with pytest.raises(ValueError, match="breaking dynsched-core release"):
        c.updated_record(RECORD, major, NEXT_PATCH)
    assert c.updated_record(RECORD, major, NEXT_SERIES)["version"] == MAJOR_NEXT

    with pytest.raises(ValueError, match="nothing to record"):
        c.updated_record(RECORD, CODE, NEXT_PATCH)
    forced = c.updated_record(RECORD, CODE, NEXT_SERIES, bump="major", change="wait counts tokens")
    assert forced["version"] == MAJOR_NEXT
    assert forced["history"][-1]["change"] == "wait counts tokens"
    with pytest.raises(ValueError, match="bump must be"):
        c.updated_record(RECORD, CODE, NEXT_SERIES, bump="patch")


# ----------------------------------------------------------------------------------
# Checking it: third-party packages and the conformance kit
# ----------------------------------------------------------------------------------
def test_require_policy_api() -> None:
    major, minor = map(int, POLICY_API_VERSION.split("."))
    require_policy_api(f"{major}.0")
    require_policy_api(POLICY_API_VERSION, by="my-policies")
    with pytest.raises(PolicyAPIError) as err:
        require_policy_api(f"{major}.{minor + 1}", by="my-policies")
    message = str(err.value)
    assert f"my-policies needs dynsched policy API {major}.{minor + 1}" in message
    assert f"provides policy API {POLICY_API_VERSION}" in message
    assert dynsched_core.__version__ in message
    with pytest.raises(PolicyAPIError, match=f"{major + 1}.x"):
        require_policy_api(f"{major + 1}.0")
    with pytest.raises(ValueError, match=r"require_policy_api\(version\) must be"):
        require_policy_api("1")


class _Lends(DynamicSchedulePolicyBase):
    name: ClassVar[str] = "lends"

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: Any) -> int:
        return int(ctx.step_required_samples // 2)

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        return True


def test_check_policy_reports_the_policy_api_version() -> None:
    report = check_policy(_Lends, max_examples=5, name="lends")
    assert report.policy_api_version == POLICY_API_VERSION
    assert report.core_version == dynsched_core.__version__
    assert report.policy == "lends" and report.max_examples == 5
    assert "only_hybrid_no_deadlock" in report.properties
    assert f"conforms to dynsched policy API {POLICY_API_VERSION}" in str(report)

    class Raises(_Lends):
        def deactivate_wait_samples(self, ctx: Any) -> int:
            raise RuntimeError("boom")

    with pytest.raises(PolicyConformanceError) as err:
        check_policy(Raises, max_examples=5, shrink=False)
    assert err.value.policy_api_version == POLICY_API_VERSION
    assert f"checked against dynsched policy API {POLICY_API_VERSION}" in str(err.value)
