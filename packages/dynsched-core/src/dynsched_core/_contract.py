"""The policy contract and its version, derived from the code.

The *policy contract* is what a third-party policy package relies on: the hooks of
`DynamicSchedulePolicyBase` (name, signature, required or optional), its public class
attributes, and the fields and public members of `DynamicScheduleContext`. It is read from
the classes themselves (`derive_policy_contract`), never typed by hand, and compared to the
contract recorded in ``policy_contract.json`` next to this module, which holds the version
of the last recorded contract and the history of versions:

- **major** change (``1.x -> 2.0``): a hook or context field removed or changed (name,
  signature, type, default, required/optional), a *required* hook or a context field
  without a default added. Policies written against the old contract may break.
- **minor** change (``1.0 -> 1.1``): an *optional* hook (with a default implementation), a
  context field with a default, a class attribute or a context property added, or a
  required hook made optional. Old policies keep working; a policy that uses the
  addition needs the new version.

`POLICY_API_VERSION` is the recorded version when the code matches the record, else the
version the rule gives for the difference, so it never understates a change. The test
suite demands that the record be brought up to date (``tools/policy_contract.py record``).
"""

from __future__ import annotations

import abc
import inspect
import json
import os
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

from dynsched_core._context import DynamicScheduleContext
from dynsched_core._errors import PolicyAPIError
from dynsched_core._policy import DynamicSchedulePolicyBase

__all__ = [
    "CONTRACT_FILE",
    "POLICY_API_VERSION",
    "ContractChange",
    "derive_policy_contract",
    "diff_policy_contracts",
    "explain_contract_change",
    "load_recorded_contract",
    "next_policy_api_version",
    "policy_api_version",
    "require_policy_api",
    "updated_record",
]

#: The recorded contract, next to this module (shipped in the wheel).
CONTRACT_FILE: Final = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "policy_contract.json"
)

#: A contract: section -> member name -> description (plain JSON data).
Contract = dict[str, dict[str, dict[str, Any]]]

_VERSION_RE = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)$")
_SKIPPED_BASES = (object, abc.ABC)


class _Raw(str):
    """An annotation string shown as written (``int``, not ``'int'``) in a signature."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


def _signature(fn: Any) -> str:
    sig = inspect.signature(fn)

    def raw(annotation: Any) -> Any:
        if annotation is inspect.Parameter.empty:
            return annotation
        return _Raw(
            annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
        )

    params = [p.replace(annotation=raw(p.annotation)) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=raw(sig.return_annotation)))


def _annotations(cls: type) -> dict[str, str]:
    out: dict[str, str] = {}
    for klass in reversed(inspect.getmro(cls)):
        for name, ann in vars(klass).get("__annotations__", {}).items():
            out[name] = ann if isinstance(ann, str) else inspect.formatannotation(ann)
    return out


def _public_members(cls: type) -> dict[str, Any]:
    """Public names defined by ``cls`` and its bases (not `object`/`abc.ABC`), first wins."""
    members: dict[str, Any] = {}
    for klass in inspect.getmro(cls):
        if klass in _SKIPPED_BASES:
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and name not in members:
                members[name] = value
    return members


def derive_policy_contract(
    policy_base: type = DynamicSchedulePolicyBase, context: type = DynamicScheduleContext
) -> Contract:
    """Read the policy contract from the classes.

    Args:
        policy_base: The policy base class (default: `DynamicSchedulePolicyBase`).
        context: The attrs context class (default: `DynamicScheduleContext`).

    Returns:
        Plain data, sorted by name: ``policy_hooks`` (each hook's ``signature`` and whether
        it is ``required``, i.e. abstract), ``policy_attributes`` (public class attributes
        and their annotation), ``context_fields`` (each field's ``type``, ``required``
        when it has no default, the ``default``'s repr and ``kw_only``) and
        ``context_members`` (public properties and methods of the context).
    """
    abstract: frozenset[str] = getattr(policy_base, "__abstractmethods__", frozenset())
    annotations = _annotations(policy_base)
    hooks: dict[str, dict[str, Any]] = {}
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in _public_members(policy_base).items():
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value):
            hooks[name] = {"signature": _signature(value), "required": name in abstract}
        else:
            attributes[name] = {"annotation": annotations.get(name, type(value).__name__)}

    fields: dict[str, dict[str, Any]] = {}
    for f in attrs.fields(context):
        required = f.default is attrs.NOTHING
        entry: dict[str, Any] = {
            "type": f.type if isinstance(f.type, str) else inspect.formatannotation(f.type),
            "required": required,
            "kw_only": bool(f.kw_only),
        }
        if not required:
            default = f.default
            if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                default = f"Factory({getattr(default.factory, '__qualname__', default.factory)})"
            else:
                default = repr(default)
            entry["default"] = default
        fields[f.name] = entry
    field_names = set(fields)
    members: dict[str, dict[str, Any]] = {}
    for name, value in _public_members(context).items():
        if name in field_names:
            continue
        if isinstance(value, property):
            returns = _signature(value.fget).rpartition(" -> ")[2] if value.fget else ""
            members[name] = {"kind": "property", "returns": returns}
        elif inspect.isfunction(value):
            members[name] = {"kind": "method", "signature": _signature(value)}
    return {
        "policy_hooks": dict(sorted(hooks.items())),
        "policy_attributes": dict(sorted(attributes.items())),
        "context_fields": dict(sorted(fields.items())),
        "context_members": dict(sorted(members.items())),
    }


_SECTION_LABEL = {
    "policy_hooks": "policy hook",
    "policy_attributes": "policy class attribute",
    "context_fields": "context field",
    "context_members": "context member",
}


@attrs.frozen
class ContractChange:
    """One difference between two policy contracts.

    Attributes:
        level: ``"major"`` or ``"minor"``.
        description: What changed, e.g. ``removed policy hook `update_after_step```.
    """

    level: str
    description: str

    def __str__(self) -> str:
        return f"{self.level}: {self.description}"


def _describe(entry: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(entry.items()))


def diff_policy_contracts(old: Contract, new: Contract) -> list[ContractChange]:
    """Classify every difference between two contracts (see the module docstring).

    Args:
        old: The recorded contract.
        new: The contract of the code.

    Returns:
        One `ContractChange` per added, removed or changed member, in a stable order;
        empty when the contracts are equal.
    """
    changes: list[ContractChange] = []
    for section in sorted(set(old) | set(new)):
        label = _SECTION_LABEL.get(section, section)
        before, after = old.get(section, {}), new.get(section, {})
        for name in sorted(set(before) | set(after)):
            a, b = before.get(name), after.get(name)
            if a == b:
                continue
            if b is None:
                changes.append(ContractChange("major", f"removed {label} `{name}`"))
            elif a is None:
                if section in ("policy_hooks", "context_fields") and b.get("required"):
                    why = (
                        "existing policies do not implement it"
                        if section == "policy_hooks"
                        else "contexts built without it fail"
                    )
                    changes.append(
                        ContractChange("major", f"added required {label} `{name}` ({why})")
                    )
                else:
                    changes.append(
                        ContractChange("minor", f"added optional {label} `{name}` ({_describe(b)})")
                    )
            elif (
                section == "policy_hooks"
                and a.get("signature") == b.get("signature")
                and a.get("required")
                and not b.get("required")
            ):
                changes.append(ContractChange("minor", f"{label} `{name}` became optional"))
            else:
                changes.append(
                    ContractChange(
                        "major", f"changed {label} `{name}`: {_describe(a)} -> {_describe(b)}"
                    )
                )
    return changes


def _parse(version: str, what: str = "version") -> tuple[int, int]:
    match = _VERSION_RE.match(version) if isinstance(version, str) else None
    if match is None:
        raise ValueError(
            f"{what} must be a policy API version 'MAJOR.MINOR' (e.g. '1.0'), got {version!r}"
        )
    return int(match.group(1)), int(match.group(2))


def next_policy_api_version(version: str, changes: list[ContractChange]) -> str:
    """The version after ``changes``: major bump if any is major, minor if any is minor.

    Args:
        version: The version before the changes, ``"MAJOR.MINOR"``.
        changes: Output of `diff_policy_contracts`.

    Returns:
        ``version`` itself when there are no changes.
    """
    major, minor = _parse(version)
    levels = {c.level for c in changes}
    if "major" in levels:
        return f"{major + 1}.0"
    if "minor" in levels:
        return f"{major}.{minor + 1}"
    return version


def load_recorded_contract(path: str = CONTRACT_FILE) -> dict[str, Any]:
    """Read the recorded contract file (``version``, ``history``, ``contract``)."""
    with open(path, encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def policy_api_version(
    record: Mapping[str, Any] | None = None, contract: Contract | None = None
) -> str:
    """The policy API version of a contract, measured against the record.

    Args:
        record: The recorded contract file's data (default: `load_recorded_contract`).
        contract: The contract to version (default: `derive_policy_contract` of the code).

    Returns:
        The recorded version if ``contract`` equals the recorded one, else the version
        `next_policy_api_version` gives for the differences.
    """
    record = load_recorded_contract() if record is None else record
    contract = derive_policy_contract() if contract is None else contract
    return next_policy_api_version(
        str(record["version"]), diff_policy_contracts(record["contract"], contract)
    )


def updated_record(
    record: Mapping[str, Any],
    contract: Contract,
    core_version: str,
    *,
    bump: str | None = None,
    change: str | None = None,
) -> dict[str, Any]:
    """A new record for ``contract``, with its version and a history entry.

    Args:
        record: The current record.
        contract: The contract to record (normally the code's).
        core_version: The dynsched-core version that will ship it; must be newer than the
            core version of the last history entry (a contract change ships in a new
            core release, so third-party packages can pin it).
        bump: ``"major"`` or ``"minor"`` to force a bump the code does not show (a change
            of meaning with unchanged signatures); by default the rule decides.
        change: One line for the history; default: the changes found.

    Returns:
        The new record (the input is not modified).

    Raises:
        ValueError: nothing to record, a bad ``bump``, or ``core_version`` not newer than
            the last recorded one.
    """
    changes = diff_policy_contracts(record["contract"], contract)
    if bump is not None:
        if bump not in ("major", "minor"):
            raise ValueError(f"bump must be 'major' or 'minor', got {bump!r}")
        changes = [*changes, ContractChange(bump, change or "change of meaning (forced)")]
    if not changes:
        raise ValueError(
            f"the code's policy contract equals the recorded one (version {record['version']}); "
            "nothing to record"
        )
    version = next_policy_api_version(str(record["version"]), changes)
    history = list(record.get("history", []))
    if history and _core_key(core_version) <= _core_key(str(history[-1]["core"])):
        raise ValueError(
            f"policy API {version} must ship in a new dynsched-core release: dynsched-core is "
            f"{core_version}, and policy API {history[-1]['version']} was recorded for "
            f"{history[-1]['core']}. Bump dynsched-core's version first (see 'Releasing' in "
            "the root README)"
        )
    if (
        history
        and version.split(".")[0] != str(history[-1]["version"]).split(".")[0]
        and _breaking(core_version) <= _breaking(str(history[-1]["core"]))
    ):
        raise ValueError(
            f"policy API {version} is a major change: it must ship in a breaking dynsched-core "
            f"release, but {core_version} is in the same series as {history[-1]['core']} "
            "(0.x: bump the minor, e.g. 0.1.3 -> 0.2.0; from 1.0: bump the major)"
        )
    history.append(
        {
            "version": version,
            "core": core_version,
            "change": change or "; ".join(str(c) for c in changes),
        }
    )
    return {**record, "version": version, "history": history, "contract": contract}


def explain_contract_change(
    record: Mapping[str, Any], contract: Contract, core_version: str | None = None
) -> str:
    """What to do when the code's contract differs from the record (empty when equal).

    Args:
        record: The recorded contract file's data.
        contract: The code's contract.
        core_version: The dynsched-core version of the code (default: this core's).

    Returns:
        A message listing the changes, the policy API bump they demand and the release
        steps, with the dynsched-core version to release it in.
    """
    changes = diff_policy_contracts(record["contract"], contract)
    if not changes:
        return ""
    if core_version is None:
        from dynsched_core import __version__

        core_version = __version__
    old = str(record["version"])
    new = next_policy_api_version(old, changes)
    major = new.split(".")[0] != old.split(".")[0]
    history = record.get("history") or [{"core": "0.0.0"}]
    last_core = str(history[-1]["core"])
    fits = _core_key(core_version) > _core_key(last_core) and (
        not major or _breaking(core_version) > _breaking(last_core)
    )
    kind = (
        "a release that starts a new series (0.x: next minor; from 1.0: next major)"
        if major
        else "a release of the same series (0.x: next patch; from 1.0: next minor)"
    )
    step1 = (
        f"dynsched-core is {core_version}, {kind}: add a CHANGELOG entry for it that "
        f"names policy API {new};"
        if fits
        else f"bump dynsched-core from {core_version} to {_suggest(core_version, major)}, "
        f"{kind} after {last_core} (which shipped policy API {old}), in its pyproject.toml "
        f"and __version__, with a CHANGELOG entry that names policy API {new}"
        + ("; then move every sibling's dynsched-core range to the new series;" if major else ";")
    )
    lines = [
        f"The policy contract in the code differs from the recorded policy API {old} "
        "(dynsched_core/policy_contract.json):",
        *(f"  - {c}" for c in changes),
        f"This is a {'MAJOR' if major else 'MINOR'} change: the policy API becomes {new}. "
        "To record it:",
        f"  1. {step1}",
        "  2. run `hatch run python tools/policy_contract.py record` (writes the contract, "
        f"version {new} and a history line).",
        "The rule is in the root README, section 'Releasing'.",
    ]
    return "\n".join(lines)


def _suggest(core_version: str, breaking: bool) -> str:
    """The next dynsched-core version: of the next series, or the next in the same one."""
    key = (*_core_key(core_version), 0, 0, 0)[:3]
    if breaking:
        return f"0.{key[1] + 1}.0" if key[0] == 0 else f"{key[0] + 1}.0.0"
    return f"0.{key[1]}.{key[2] + 1}" if key[0] == 0 else f"{key[0]}.{key[1] + 1}.0"


def _core_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def _breaking(version: str) -> tuple[int, ...]:
    """The release series inside which versions are compatible: ``(0, minor)`` or ``(major,)``."""
    key = _core_key(version)
    return key[:2] if key and key[0] == 0 else key[:1]


def require_policy_api(version: str, *, by: str | None = None) -> None:
    """Fail early when the installed core's policy API cannot serve a policy package.

    A policy package written against policy API ``M.m`` works with every core whose
    policy API has major ``M`` and minor ``>= m``. Call this at import time of your
    package, next to a ``dynsched-core`` range in its dependencies.

    Args:
        version: The policy API version the caller was written against, ``"MAJOR.MINOR"``.
        by: Who asks (shown in the error), e.g. your distribution's name.

    Raises:
        PolicyAPIError: the installed core provides an incompatible policy API.
        ValueError: ``version`` is not ``"MAJOR.MINOR"``.

    Example:
        >>> require_policy_api("1.0", by="my-policies")
    """
    want = _parse(version, "require_policy_api(version)")
    have = _parse(POLICY_API_VERSION)
    if want[0] != have[0] or want[1] > have[1]:
        from dynsched_core import __version__

        who = by or "this package"
        raise PolicyAPIError(
            f"{who} needs dynsched policy API {version} (major {want[0]}, minor >= {want[1]}), "
            f"but the installed dynsched-core {__version__} provides policy API "
            f"{POLICY_API_VERSION}. Install a dynsched-core release whose policy API is "
            f"{want[0]}.x with x >= {want[1]} (each release's policy API is in the "
            "dynsched-core CHANGELOG)."
        )


#: Version (``"MAJOR.MINOR"``) of the policy contract this core provides.
POLICY_API_VERSION: Final[str] = policy_api_version()
