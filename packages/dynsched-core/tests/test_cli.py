from __future__ import annotations

import argparse
import subprocess
import sys
import types
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from dynsched_core import cli
from dynsched_core.errors import UsageError


class _FakeDist:
    def __init__(self, name: str, eps: list[tuple[str, str]]) -> None:
        self.metadata = {"Name": name}
        self.entry_points = [metadata.EntryPoint(n, v, cli.CLI_ENTRY_POINT_GROUP) for n, v in eps]


def _register_hello(sub: Any) -> None:
    p = sub.add_parser("hello", help="say hello")
    p.add_argument("--name", default="world")
    p.set_defaults(func=lambda a: print(f"hello {a.name}") or 0)


@pytest.fixture
def dists(monkeypatch: pytest.MonkeyPatch) -> list[_FakeDist]:
    """The installed distributions, as far as the plug-in loader can tell."""
    mod = types.ModuleType("_dynsched_test_cli")
    mod.register_hello = _register_hello  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "_dynsched_test_cli", mod)
    installed: list[_FakeDist] = []
    monkeypatch.setattr(metadata, "distributions", lambda: list(installed))
    return installed


def test_plugins_listed_and_broken_one_reported(
    dists: list[_FakeDist], capsys: pytest.CaptureFixture[str]
) -> None:
    dists.append(_FakeDist("dist-hello", [("hello", "_dynsched_test_cli:register_hello")]))
    dists.append(_FakeDist("dist-broken", [("broken", "no_such_module_xyz:register")]))
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


def test_a_sub_command_two_distributions_provide_is_refused(
    dists: list[_FakeDist], capsys: pytest.CaptureFixture[str]
) -> None:
    """The one plug-in rule: both providers named, neither used."""
    dists.append(_FakeDist("dist-one", [("hello", "_dynsched_test_cli:register_hello")]))
    dists.append(_FakeDist("dist-two", [("hello", "_dynsched_test_cli:register_hello")]))
    _, problems = cli.build_parser()
    assert len(problems) == 1
    assert "'dist-one'" in problems[0] and "'dist-two'" in problems[0]
    assert cli.main(["hello"]) == 2
    assert "more than one distribution" in capsys.readouterr().err


def test_no_command_prints_help(dists: list[_FakeDist], capsys: pytest.CaptureFixture[str]) -> None:
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


def test_a_known_subcommand_that_is_not_installed_names_its_package(
    dists: list[_FakeDist], capsys: pytest.CaptureFixture[str]
) -> None:
    """Without plug-ins, `dynsched simulate ...` says to install dynsched-sim (any arguments)."""
    assert set(cli.KNOWN_SUBCOMMANDS) == {"simulate", "plan", "optimus", "run", "train"}
    for name, dist in cli.KNOWN_SUBCOMMANDS.items():
        for argv in ([name], [name, "--help"], [name, "--policy", "default", "-x", "y"]):
            assert cli.main(argv) == 2, argv
            err = capsys.readouterr().err
            assert (
                f"the sub-command {name!r} is provided by {dist}, which is not installed: "
                f"pip install {dist}"
            ) in err
            assert f"hatch run test:dynsched {name}" in err
            assert "invalid choice" not in err
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    help_text = capsys.readouterr().out
    for dist in cli.KNOWN_SUBCOMMANDS.values():
        assert f"(not installed: pip install {dist})" in help_text
    # an unknown sub-command is still refused by argparse, naming the known ones
    with pytest.raises(SystemExit) as exc:
        cli.main(["simulat"])
    assert exc.value.code == 2
    assert "'simulate'" in capsys.readouterr().err


def _register_simulate(sub: Any) -> None:
    p = sub.add_parser("simulate", help="a simulator")
    p.add_argument("--steps", type=int, default=1)
    p.set_defaults(func=lambda a: print(f"simulated {a.steps}") or 0)


def _register_plan(sub: Any) -> None:
    sub.add_parser("plan", help="a planner").set_defaults(func=lambda a: 0)


def test_an_installed_known_subcommand_is_the_plugin(
    dists: list[_FakeDist], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = sys.modules["_dynsched_test_cli"]
    monkeypatch.setattr(mod, "register_simulate", _register_simulate, raising=False)
    monkeypatch.setattr(mod, "register_plan", _register_plan, raising=False)
    dists.append(
        _FakeDist(
            "dynsched-sim",
            [
                ("simulate", "_dynsched_test_cli:register_simulate"),
                ("plan", "_dynsched_test_cli:register_plan"),
            ],
        )
    )
    assert cli.main(["simulate", "--steps", "3"]) == 0
    assert "simulated 3" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli.main(["simulate", "--bogus"])  # its own arguments are checked as before
    assert exc.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    help_text = capsys.readouterr().out
    assert "pip install dynsched-sim" not in help_text
    assert "(not installed: pip install dynsched-ray)" in help_text


def test_ensure_output_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dynsched_core.cli import ensure_output_folder

    made = ensure_output_folder(tmp_path / "a" / "b", "--out")
    assert made.is_dir()
    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(UsageError) as err:
        ensure_output_folder(a_file / "sub", "--out")
    assert (
        str(err.value) == f"--out {str(a_file / 'sub')!r}: {str(a_file)!r} is a file, not a folder"
    )
    with pytest.raises(UsageError, match=r"^--metrics-out 'm/x.jsonl': .* is a file, not a folder"):
        ensure_output_folder(a_file, "--metrics-out", given="m/x.jsonl")
    # not writable (root writes anywhere: the check itself is what is tested)
    monkeypatch.setattr("dynsched_core.cli.os.access", lambda *_a: False)
    with pytest.raises(UsageError, match=r"^--out '.*': the folder '.*' is not writable$"):
        ensure_output_folder(tmp_path / "c", "--out")

    def refuse(*_a: object, **_k: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(UsageError, match=r"cannot create the folder '.*' \(Permission denied\)"):
        ensure_output_folder(tmp_path / "d", "--out")
