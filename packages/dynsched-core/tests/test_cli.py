from __future__ import annotations

import argparse
import subprocess
import sys
from importlib import metadata
from typing import Any

import pytest
from dynsched_core import cli


class _EP:
    def __init__(self, name: str, obj: Any, dist: str) -> None:
        self.name = name
        self.value = f"fake:{name}"
        self._obj = obj
        self.dist = type("D", (), {"name": dist})()

    def load(self) -> Any:
        if isinstance(self._obj, Exception):
            raise self._obj
        return self._obj


def _register_hello(sub: Any) -> None:
    p = sub.add_parser("hello", help="say hello")
    p.add_argument("--name", default="world")
    p.set_defaults(func=lambda a: print(f"hello {a.name}") or 0)


def test_plugins_listed_and_broken_one_reported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    eps = [
        _EP("hello", _register_hello, "dist-hello"),
        _EP("broken", ImportError("nope"), "dist-broken"),
    ]
    monkeypatch.setattr(
        cli.metadata,
        "entry_points",
        lambda group: eps if group == cli.CLI_ENTRY_POINT_GROUP else [],
    )
    parser, problems = cli.build_parser()
    assert isinstance(parser, argparse.ArgumentParser)
    assert len(problems) == 1 and "'broken'" in problems[0] and "dist-broken" in problems[0]
    assert cli.main(["hello", "--name", "x"]) == 0
    out = capsys.readouterr()
    assert "hello x" in out.out
    assert "broken" in out.err  # warned, not fatal
    assert cli.main(["broken"]) == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    help_text = capsys.readouterr().out
    assert "hello" in help_text and "broken" in help_text


def test_no_command_prints_help(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli.metadata, "entry_points", lambda group: [])
    assert cli.main([]) == 0
    assert "usage: dynsched" in capsys.readouterr().out


def test_installed_command_lists_installed_subcommands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dynsched_core.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "usage: dynsched" in out.stdout
    names = {ep.name for ep in metadata.entry_points(group=cli.CLI_ENTRY_POINT_GROUP)}
    for name in names:
        assert name in out.stdout
