"""The one plug-in loader: discovery, the collision rule, errors naming the providers."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from importlib import metadata

import pytest
from dynsched_core.errors import PluginError
from dynsched_core.plugins import Plugin, PluginGroup

GROUP = "dynsched.test_plugins"


class _FakeDist:
    def __init__(self, name: str, eps: list[tuple[str, str]], group: str = GROUP) -> None:
        self.metadata = {"Name": name}
        self.entry_points = [metadata.EntryPoint(n, v, group) for n, v in eps]


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[_FakeDist]]:
    mod = types.ModuleType("_dynsched_test_plugins")
    mod.one = "the first plug-in"  # type: ignore[attr-defined]
    mod.two = "the second plug-in"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "_dynsched_test_plugins", mod)
    dists: list[_FakeDist] = []
    calls: list[int] = []

    def distributions() -> list[_FakeDist]:
        calls.append(1)
        return list(dists)

    monkeypatch.setattr(metadata, "distributions", distributions)
    yield dists


class WidgetError(PluginError):
    """The error type of one plug-in kind."""


def test_lookup_load_and_cache(installed: list[_FakeDist]) -> None:
    installed.append(_FakeDist("dist-a", [("one", "_dynsched_test_plugins:one")]))
    installed.append(_FakeDist("other-group", [("two", "x:y")], group="elsewhere"))
    group = PluginGroup(GROUP, kind="widget", error=WidgetError)
    assert group.names() == ["one"]
    assert group.get("one") == Plugin("one", "_dynsched_test_plugins:one", "dist-a", None)  # type: ignore[arg-type]
    assert group.load("one") == "the first plug-in"
    installed.clear()  # discovered once: later lookups do not rescan
    assert group.load("one") == "the first plug-in" and group.names() == ["one"]
    group.refresh()
    assert group.names() == []


def test_a_name_two_distributions_provide_is_refused_naming_both(
    installed: list[_FakeDist],
) -> None:
    installed.append(_FakeDist("dist-a", [("one", "_dynsched_test_plugins:one")]))
    installed.append(_FakeDist("dist-b", [("one", "_dynsched_test_plugins:two")]))
    group = PluginGroup(GROUP, kind="widget", error=WidgetError)
    assert group.conflicts() == {"one": ["dist-a", "dist-b"]}
    with pytest.raises(WidgetError, match="'dist-a' and 'dist-b'"):
        group.load("one")
    with pytest.raises(PluginError, match="more than one distribution"):
        group.get("one")


def test_the_same_distribution_twice_counts_once(installed: list[_FakeDist]) -> None:
    installed.append(_FakeDist("dist-a", [("one", "_dynsched_test_plugins:one")]))
    installed.append(_FakeDist("dist-a", [("one", "_dynsched_test_plugins:one")]))
    group = PluginGroup(GROUP)
    assert group.conflicts() == {}
    assert group.load("one") == "the first plug-in"


def test_unknown_and_broken_plugins_are_explained(installed: list[_FakeDist]) -> None:
    installed.append(_FakeDist("dist-a", [("spinner", "_dynsched_test_plugins:one")]))
    installed.append(_FakeDist("dist-ghost", [("ghost", "no_such_module_xyz:thing")]))
    group = PluginGroup(GROUP, kind="widget", error=WidgetError)
    with pytest.raises(WidgetError, match=r"unknown widget 'spiner'\. Did you mean 'spinner'\?"):
        group.load("spiner")
    with pytest.raises(WidgetError, match="'dist-ghost'.*failed to import"):
        group.load("ghost")
