"""``dynsched optimus serve|submit|status|cancel`` without dynsched-ray: one clear line."""

from __future__ import annotations

import sys

import pytest
from dynsched_optimus.cli import main


@pytest.mark.parametrize("command", ["serve", "submit", "status", "cancel"])
def test_the_ray_commands_name_the_missing_package(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    monkeypatch.setitem(sys.modules, "dynsched_ray.optimus.cli", None)  # import fails
    assert main([command, "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dynsched optimus {command}: error: needs the dynsched-ray package")
    assert "\n" not in err
