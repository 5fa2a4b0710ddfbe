"""``dynsched optimus submit|status|cancel``: the job table only, no Ray."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from dynsched_optimus.cli import main

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "optimus_jobs"


def test_submit_status_cancel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "jobs.sqlite")
    assert main(["submit", str(EXAMPLES / "mlp.yaml"), "--db", db]) == 0
    assert main(["submit", str(EXAMPLES / "cnn.yaml"), "--db", db]) == 0
    capsys.readouterr()
    assert main(["submit", str(EXAMPLES / "mlp.yaml"), "--db", db]) == 2
    assert capsys.readouterr().err.strip() == (
        "dynsched optimus submit: error: a job named 'mlp' was already submitted"
    )
    assert main(["status", "--db", db]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:3] == ["mlp", "queued", "0"] and out[-1] == "2 job(s): 2 queued"
    assert main(["cancel", "cnn", "--db", db]) == 0
    assert main(["cancel", "nope", "--db", db]) == 2
    assert capsys.readouterr().err.strip() == "dynsched optimus cancel: error: no job named 'nope'"
    assert main(["status", "--db", db, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["state"]) for r in rows] == [("mlp", "queued"), ("cnn", "queued")]
    from dynsched_ray.optimus import JobStore

    assert [r.cancel for r in JobStore(db).jobs()] == [False, True]


def test_submit_and_status_do_not_import_ray(tmp_path: Path) -> None:
    import subprocess

    code = (
        "import sys; from dynsched_optimus.cli import main; "
        f"main(['submit', {str(EXAMPLES / 'mlp.yaml')!r}, '--db', {str(tmp_path / 'j.sqlite')!r}]); "
        f"main(['status', '--db', {str(tmp_path / 'j.sqlite')!r}]); "
        "print('RAY' if 'ray' in sys.modules else 'NO-RAY')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("NO-RAY"), out.stderr
