"""Policy registry: in-process registration plus entry-point discovery.

Policies are found by name from two sources:

* classes decorated with `register_policy` in modules that have been imported;
* the entry-point group ``dynsched.policies`` of installed distributions, read through
  the one plug-in loader (`dynsched_core.plugins`): discovered once on the first lookup,
  imported lazily (only the policy asked for is loaded), a name two distributions provide
  refused with both named.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from dynsched_core._errors import PolicyRegistryError
from dynsched_core._policy import DynamicSchedulePolicyBase
from dynsched_core.plugins import PluginGroup

__all__ = [
    "ENTRY_POINT_GROUP",
    "available_policies",
    "build_policy",
    "get_policy_class",
    "register_policy",
]

ENTRY_POINT_GROUP = "dynsched.policies"

P = TypeVar("P", bound=type[DynamicSchedulePolicyBase])


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        # name -> (class, where it was registered)
        self._local: dict[str, tuple[type[DynamicSchedulePolicyBase], str]] = {}
        self._plugins = PluginGroup(ENTRY_POINT_GROUP, kind="policy", error=PolicyRegistryError)

    def refresh(self) -> None:
        """Forget discovered entry points (not local registrations); rediscover on next lookup."""
        self._plugins.refresh()

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
            return sorted(set(self._local) | set(self._plugins.names()))

    def get(self, name: str) -> type[DynamicSchedulePolicyBase]:
        with self._lock:
            local = self._local.get(name)
            if name not in self._plugins.discover():
                if local is not None:
                    return local[0]
                raise PolicyRegistryError(
                    self._plugins.unknown_message(name, self.names())
                    + " A policy is found when its distribution declares it in that "
                    "entry-point group or when the module that decorates it with "
                    "@register_policy has been imported."
                )
            plugin = self._plugins.get(name)  # raises on a name two distributions provide
            obj: Any = self._plugins.load(name)
            if not (isinstance(obj, type) and issubclass(obj, DynamicSchedulePolicyBase)):
                raise PolicyRegistryError(
                    f"entry point {name!r} of distribution {plugin.distribution!r} "
                    f"({plugin.value}) is {obj!r}, not a subclass of "
                    "dynsched_core.DynamicSchedulePolicyBase"
                )
            if not obj.__dict__.get("name"):
                obj.name = name
            if local is not None and local[0] is not obj and _qualname(local[0]) != _qualname(obj):
                raise PolicyRegistryError(
                    f"policy name {name!r} is registered twice: by {local[1]} and by "
                    f"distribution {plugin.distribution!r} ({plugin.value})"
                )
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
