"""The one plug-in loader of dynsched: entry points found by name, with one collision rule.

Every plug-in kind of dynsched is an entry-point group: policies
(``dynsched.policies``), ``dynsched`` sub-commands (``dynsched.cli``) and metric sinks
(``dynsched.metrics_sinks``). Each is read through a `PluginGroup`, so they all follow the
same rules:

- discovery happens once per group, on first use; only the entry point asked for is
  imported;
- **a name provided by two or more distributions is a conflict**: asking for it raises
  an error naming every provider, and nothing is loaded (uninstall one of them or rename
  its entry point). The same distribution found twice on ``sys.path`` counts once;
- an unknown name is answered with the known names and the closest match;
- an entry point that fails to import raises an error naming its distribution.

Example:
    >>> group = PluginGroup("dynsched.no_such_group", kind="widget")
    >>> group.names()
    []
    >>> group.load("spinner")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dynsched_core._errors.PluginError: unknown widget 'spinner'. Available: [] ...
"""

from __future__ import annotations

import difflib
import threading
from importlib import metadata
from typing import Any

import attrs

from dynsched_core._errors import PluginError

__all__ = ["Plugin", "PluginError", "PluginGroup"]


@attrs.frozen
class Plugin:
    """One entry point of a group.

    Attributes:
        name: The entry point's name (the plug-in's name).
        value: ``module:attribute`` it points at.
        distribution: Name of the distribution that declares it.
        entry_point: The entry point itself.
    """

    name: str
    value: str
    distribution: str
    entry_point: metadata.EntryPoint = attrs.field(eq=False, repr=False)


class PluginGroup:
    """The entry points of one group, looked up by name under the module's rules.

    Args:
        group: Entry-point group, e.g. ``"dynsched.policies"``.
        kind: What a plug-in is called in messages (``"policy"``, ``"sub-command"``).
        error: Exception type raised for unknown, conflicting or broken plug-ins (a
            `PluginError` subclass, so callers can catch one type per plug-in kind).
    """

    def __init__(
        self, group: str, *, kind: str = "plug-in", error: type[PluginError] = PluginError
    ) -> None:
        self.group = group
        self.kind = kind
        self.error = error
        self._lock = threading.RLock()
        self._found: dict[str, list[Plugin]] | None = None
        self._loaded: dict[str, Any] = {}

    def discover(self) -> dict[str, list[Plugin]]:
        """Name -> providers (more than one means a conflict), read once."""
        with self._lock:
            if self._found is None:
                found: dict[str, list[Plugin]] = {}
                for dist in metadata.distributions():
                    dist_name = dist.metadata["Name"] or "<unknown distribution>"
                    for ep in dist.entry_points:
                        if ep.group != self.group:
                            continue
                        providers = found.setdefault(ep.name, [])
                        if all(p.distribution != dist_name for p in providers):
                            providers.append(Plugin(ep.name, ep.value, dist_name, ep))
                self._found = found
            return self._found

    def refresh(self) -> None:
        """Forget what was discovered and loaded; rediscover on the next lookup."""
        with self._lock:
            self._found = None
            self._loaded.clear()

    def names(self) -> list[str]:
        """Every name in the group (conflicting ones included), sorted."""
        return sorted(self.discover())

    def conflicts(self) -> dict[str, list[str]]:
        """Conflicting names -> the distributions that provide them."""
        return {
            name: [p.distribution for p in providers]
            for name, providers in sorted(self.discover().items())
            if len(providers) > 1
        }

    def get(self, name: str) -> Plugin:
        """The one provider of ``name``.

        Raises:
            PluginError: unknown name (with the known names and a close match), or a name
                provided by more than one distribution.
        """
        providers = self.discover().get(name)
        if not providers:
            raise self.error(self.unknown_message(name, self.names()))
        if len(providers) > 1:
            raise self.error(self.conflict_message(name, providers))
        return providers[0]

    def load(self, name: str) -> Any:
        """Import and return the object ``name`` points at (cached).

        Raises:
            PluginError: see `get`, or the entry point failed to import.
        """
        with self._lock:
            if name in self._loaded:
                return self._loaded[name]
            plugin = self.get(name)
            try:
                obj = plugin.entry_point.load()
            except Exception as exc:
                raise self.error(
                    f"{self.kind} {name!r} from distribution {plugin.distribution!r} "
                    f"({plugin.value}) failed to import: {exc!r}"
                ) from exc
            self._loaded[name] = obj
            return obj

    def conflict_message(self, name: str, providers: list[Plugin]) -> str:
        """The error message for a name provided by several distributions."""
        dists = " and ".join(repr(p.distribution) for p in providers)
        return (
            f"{self.kind} name {name!r} is provided by more than one distribution: {dists}; "
            "uninstall one of them or rename its entry point"
        )

    def unknown_message(self, name: str, known: list[str]) -> str:
        """The error message for an unknown name."""
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return (
            f"unknown {self.kind} {name!r}.{hint} Available: {known} (entry-point group "
            f"{self.group!r})."
        )

    def __repr__(self) -> str:
        return f"PluginGroup({self.group!r})"
