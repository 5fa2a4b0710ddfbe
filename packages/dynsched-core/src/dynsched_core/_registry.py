"""Policy registry: in-process registration plus entry-point discovery.

Policies are found by name from two sources:

* classes decorated with `register_policy` in modules that have been imported;
* the entry-point group ``dynsched.policies`` of installed distributions, discovered
  once on the first lookup and imported lazily (only the policy asked for is loaded).
"""

from __future__ import annotations

import difflib
import logging
import threading
from collections.abc import Callable
from importlib import metadata
from typing import Any, TypeVar

from dynsched_core._errors import PolicyRegistryError
from dynsched_core._policy import DynamicSchedulePolicyBase

__all__ = [
    "ENTRY_POINT_GROUP",
    "available_policies",
    "build_policy",
    "get_policy_class",
    "register_policy",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "dynsched.policies"

P = TypeVar("P", bound=type[DynamicSchedulePolicyBase])


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        # name -> (class, where it was registered)
        self._local: dict[str, tuple[type[DynamicSchedulePolicyBase], str]] = {}
        # name -> [(entry point, distribution name)], filled on first lookup
        self._eps: dict[str, list[tuple[metadata.EntryPoint, str]]] | None = None
        self._loaded: dict[str, type[DynamicSchedulePolicyBase]] = {}

    # -- discovery -----------------------------------------------------------------
    def _discover(self) -> dict[str, list[tuple[metadata.EntryPoint, str]]]:
        with self._lock:
            if self._eps is None:
                found: dict[str, list[tuple[metadata.EntryPoint, str]]] = {}
                for dist in metadata.distributions():
                    dist_name = dist.metadata["Name"] or "<unknown distribution>"
                    for ep in dist.entry_points:
                        if ep.group != ENTRY_POINT_GROUP:
                            continue
                        entries = found.setdefault(ep.name, [])
                        # one distribution installed twice on sys.path is not a collision
                        if all(d != dist_name for _, d in entries):
                            entries.append((ep, dist_name))
                self._eps = found
            return self._eps

    def refresh(self) -> None:
        """Forget discovered entry points (not local registrations); rediscover on next lookup."""
        with self._lock:
            self._eps = None
            self._loaded.clear()

    # -- registration --------------------------------------------------------------
    def register(self, name: str, cls: type[DynamicSchedulePolicyBase], where: str) -> None:
        if not isinstance(name, str) or not name:
            raise PolicyRegistryError(f"policy name must be a non-empty string, got {name!r}")
        if not (isinstance(cls, type) and issubclass(cls, DynamicSchedulePolicyBase)):
            raise PolicyRegistryError(
                f"register_policy({name!r}) was applied to {cls!r} ({where}), which is not a "
                "subclass of DynamicSchedulePolicyBase"
            )
        with self._lock:
            prev = self._local.get(name)
            if prev is not None and prev[0] is not cls and _qualname(prev[0]) != _qualname(cls):
                raise PolicyRegistryError(
                    f"policy name {name!r} is registered twice: by {prev[1]} and by {where}"
                )
            self._local[name] = (cls, where)
            cls.name = name

    # -- lookup --------------------------------------------------------------------
    def names(self) -> list[str]:
        with self._lock:
            return sorted(set(self._local) | set(self._discover()))

    def get(self, name: str) -> type[DynamicSchedulePolicyBase]:
        with self._lock:
            eps = self._discover().get(name, [])
            if len(eps) > 1:
                dists = " and ".join(repr(d) for _, d in eps)
                raise PolicyRegistryError(
                    f"policy name {name!r} is provided by more than one distribution: {dists}; "
                    "uninstall one of them or rename its entry point"
                )
            local = self._local.get(name)
            if eps:
                cls = self._loaded.get(name)
                if cls is None:
                    cls = self._load(name, *eps[0])
                    self._loaded[name] = cls
                if (
                    local is not None
                    and local[0] is not cls
                    and _qualname(local[0]) != _qualname(cls)
                ):
                    raise PolicyRegistryError(
                        f"policy name {name!r} is registered twice: by {local[1]} and by "
                        f"distribution {eps[0][1]!r} ({eps[0][0].value})"
                    )
                return cls
            if local is not None:
                return local[0]
        known = self.names()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise PolicyRegistryError(
            f"unknown policy {name!r}.{hint} Available policies: {known}. A policy is found when "
            f"its distribution declares it in the entry-point group {ENTRY_POINT_GROUP!r} or when "
            "the module that decorates it with @register_policy has been imported."
        )

    def _load(
        self, name: str, ep: metadata.EntryPoint, dist: str
    ) -> type[DynamicSchedulePolicyBase]:
        try:
            obj: Any = ep.load()
        except Exception as exc:
            raise PolicyRegistryError(
                f"policy {name!r} from distribution {dist!r} ({ep.value}) failed to import: {exc!r}"
            ) from exc
        if not (isinstance(obj, type) and issubclass(obj, DynamicSchedulePolicyBase)):
            raise PolicyRegistryError(
                f"entry point {name!r} of distribution {dist!r} ({ep.value}) is {obj!r}, not a "
                "subclass of dynsched_core.DynamicSchedulePolicyBase"
            )
        if not obj.__dict__.get("name"):
            obj.name = name
        return obj


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


_REGISTRY = _Registry()


def register_policy(name: str) -> Callable[[P], P]:
    """Class decorator that registers a policy under ``name``.

    Registration by decorator only takes effect once the module is imported. To make a
    policy findable by name in a fresh interpreter, also declare it in your
    distribution's entry points::

        [project.entry-points."dynsched.policies"]
        my_policy = "my_pkg.policy:MyPolicy"

    Raises:
        PolicyRegistryError: ``name`` is already taken by another class, or the decorated
            object is not a `DynamicSchedulePolicyBase` subclass.
    """

    def deco(cls: P) -> P:
        _REGISTRY.register(name, cls, f"module {getattr(cls, '__module__', '?')!r}")
        return cls

    return deco


def get_policy_class(name: str) -> type[DynamicSchedulePolicyBase]:
    """Return the policy class registered under ``name``.

    Raises:
        PolicyRegistryError: unknown name (the message lists the known names and the
            closest match), a name provided by two distributions, or an entry point that
            is not a policy class.
    """
    return _REGISTRY.get(name)


def build_policy(name: str, **kwargs: Any) -> DynamicSchedulePolicyBase:
    """Instantiate the policy registered under ``name`` with ``kwargs``.

    Raises:
        PolicyRegistryError: see `get_policy_class`.
        TypeError: ``kwargs`` do not match the policy's constructor.
    """
    cls = get_policy_class(name)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise TypeError(
            f"cannot build policy {name!r} ({_qualname(cls)}) with {kwargs}: {exc}"
        ) from exc


def available_policies() -> list[str]:
    """Sorted names of every policy that can be built (entry points and imported modules)."""
    return _REGISTRY.names()


def _registry() -> _Registry:
    """The process-wide registry (for tests and tooling)."""
    return _REGISTRY
