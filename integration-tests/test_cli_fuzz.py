"""Fuzz pass over the ``dynsched`` commands' arguments and input files.

Hypothesis generates YAML / TOML / JSON / CSV inputs (structured values, random text,
truncated and corrupted copies of valid files) and argument lists, and runs each through
the ``dynsched`` dispatcher (`dynsched_core.cli.main`, in-process so that a bounded CI
pass stays fast; the subprocess tests check the installed command itself). A traceback is
an exception escaping ``main``; every run must end with exit status 0 (the input was
valid) or 2 (one ``error:`` line on stderr), and must not hang (pytest-timeout).

The CI pass is bounded (``DYNSCHED_FUZZ_EXAMPLES``, default 15 per test); a longer pass:
``DYNSCHED_FUZZ_EXAMPLES=300 hatch run test:all integration-tests/test_cli_fuzz.py``
(`scripts/fuzz_cli.sh`).

``dynsched run`` never reaches Ray here: ``_init_ray`` is replaced by a stand-in that
refuses, so a valid input ends with exit status 1 and "could not start" (input accepted).
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from dynsched_core import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("DYNSCHED_FUZZ_EXAMPLES", "15"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = (ROOT / "packages/dynsched-sim/src/dynsched_sim/scenarios/balanced.yaml").read_text()
SCENARIO_DATA = yaml.safe_load(SCENARIO)
VERL_CONFIG = (ROOT / "examples/verl/qwen35-dynamic-megatron.yaml").read_text()
VERL_DATA = yaml.safe_load(VERL_CONFIG)


def _driver_state() -> dict[str, Any]:
    """A driver state as `ScheduleDriver.state_dict` writes it (the ``default`` policy's)."""
    from dynsched_core import (
        AsyncSampleQueue,
        DynamicResourceController,
        DynamicScheduleConfig,
        ReplicaSet,
        ScheduleDriver,
    )

    cfg = DynamicScheduleConfig(ppo_mini_batch_size=2, trigger_parameter_sync_step=1)
    controller = DynamicResourceController(ReplicaSet())
    return ScheduleDriver(cfg.build_policy(), controller, AsyncSampleQueue(), cfg).state_dict()


CHECKPOINT = json.dumps(
    {
        "format": 1,
        "name": "dynsched",
        "driver": {**_driver_state(), "param_version": 1},
        "param_version": 1,
        "steps_done": 2,
        "consumed_sample_ids": ["p0-0", "p0-1"],
        "config": {"dynamic_schedule_policy": "default"},
    }
)
RUN_CONFIG = (
    "async_training:\n  use_dynamic_resource_scheduling: true\n  trigger_parameter_sync_step: 2\n"
    "trainer: {nnodes: 1, n_gpus_per_node: 2}\nrollout: {nnodes: 1, n_gpus_per_node: 2}\n"
    "actor_rollout_ref:\n  actor: {ppo_mini_batch_size: 4}\n  rollout: {n: 2}\n"
)
ALLOC = json.dumps(
    {
        "resources": ["cpu"],
        "capacity": [16],
        "jobs": [
            {
                "id": "a",
                "remaining_steps": 100,
                "speed": {"mode": "async", "theta": [1.0, 0.5, 0.5, 0.1]},
                "ps_demand": [1],
                "worker_demand": [1],
            }
        ],
    }
)
PLACE = json.dumps(
    {
        "resources": ["cpu"],
        "nodes": {"count": 2, "capacity": [4]},
        "jobs": [{"id": "a", "ps": 1, "workers": 2, "ps_demand": [1], "worker_demand": [1]}],
    }
)
LOSSES = "step,loss\n" + "".join(f"{k},{1 / (0.01 * k + 1) + 0.1:.5f}\n" for k in range(1, 40))
SPEEDS = "ps,workers,speed\n1,1,1.0\n1,2,1.8\n2,2,2.1\n2,4,3.5\n4,4,4.2\n"
BLOCKS = "name,size\nw1,1000\nw2,300\nb,10\n"
WORKLOAD = (
    "name,time,application,num_replicas,batch_size\ncifar10-0,0,cifar10,1,128\nncf-1,10,ncf,1,256\n"
)

# --------------------------------------------------------------------------- strategies
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _mutated(base: str) -> st.SearchStrategy[bytes]:
    """Truncated, corrupted or spliced copies of a valid file (never the file itself)."""
    raw = base.encode()
    truncated = st.integers(0, len(raw) - 1).map(lambda n: raw[:n])

    def corrupt(args: tuple[int, int]) -> bytes:
        i, b = args
        out = bytearray(raw)
        out[i % len(out)] = b if b != out[i % len(out)] else (b + 1) % 256
        return bytes(out)

    corrupted = st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)).map(corrupt)
    spliced = st.tuples(st.integers(0, len(raw)), st.binary(max_size=20)).map(
        lambda a: raw[: a[0]] + a[1] + raw[a[0] :]
    )
    return st.one_of(truncated, corrupted, spliced)


def _dump_yaml(v: Any) -> bytes:
    return yaml.safe_dump(v, allow_unicode=True).encode()


def _dump_toml(v: Any) -> bytes:
    if not isinstance(v, dict):
        v = {"value": v}
    lines = []
    for k, x in v.items():
        lines.append(f"{json.dumps(str(k))} = {json.dumps(x, default=str)}")
    return "\n".join(lines).encode()


def _scenario_values(v: Any) -> bytes:
    """The valid scenario with one field replaced by a generated value."""
    data = json.loads(json.dumps(SCENARIO_DATA))
    section = data.get("engine", {})
    key = sorted(section)[hash(json.dumps(v, default=str)) % len(section)]
    section[key] = v
    return yaml.safe_dump(data).encode()


def files(base: str, dump: Any) -> st.SearchStrategy[bytes]:
    return st.one_of(
        _mutated(base),
        values.map(dump),
        st.binary(max_size=64),
        st.text(max_size=64).map(str.encode),
    )


# --------------------------------------------------------------------------- running
def _main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        rc = cli.main(args)
    except SystemExit as exc:  # argparse: one line, status 2
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    return rc, out.err


def _accepted_or_one_line(rc: int, err: str, *, allow_ray_stub: bool = False) -> None:
    assert "Traceback" not in err, err
    if rc == 0:
        return
    if allow_ray_stub and rc == 1 and "could not start a local Ray cluster" in err:
        return
    assert rc == 2, f"exit {rc}: {err}"
    errors = [x for x in err.splitlines() if "error:" in x]
    assert len(errors) == 1 and errors[0].startswith("dynsched"), err


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dynsched run`` stops where it would start Ray, even when a Ray session of other
    tests is up in this process (the run would otherwise use that one)."""
    import dynsched_ray.cli.run as ray_cli
    import ray

    def refuse(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("fuzz: Ray is not started by the fuzz pass")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_cli, "_init_ray", refuse)
    monkeypatch.setattr(ray_cli, "_shutdown_ray", lambda _ray: None)


@pytest.mark.timeout(1800)
@FUZZ
@given(
    content=st.one_of(files(SCENARIO, _dump_yaml), values.map(_scenario_values)),
    suffix=st.sampled_from([".yaml", ".toml"]),
)
def test_simulate_scenario_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, suffix: str
) -> None:
    path = tmp_path / f"scenario{suffix}"
    path.write_bytes(content if suffix == ".yaml" else _tomlish(content))
    args = ["simulate", "--scenario", str(path), "--steps", "1", "--seeds", "1"]
    rc, err = _main([*args, "--no-plots", "--quiet", "--out", str(tmp_path / "o")], capsys)
    _accepted_or_one_line(rc, err)


def _verl_values(v: Any) -> bytes:
    """The example verl config with one key the simulator reads replaced by a generated
    value (a short run: 2 steps)."""
    from dynsched_sim import VERL_SCENARIO_KEYS

    data = json.loads(json.dumps(VERL_DATA))
    data["trainer"]["total_training_steps"] = 2
    keys = sorted(VERL_SCENARIO_KEYS)
    data[keys[hash(json.dumps(v, default=str)) % len(keys)]] = v  # dotted: merged by the core
    return yaml.safe_dump(data).encode()


@pytest.mark.timeout(1800)
@FUZZ
@given(
    content=st.one_of(_mutated(VERL_CONFIG), values.map(_verl_values)),
    command=st.sampled_from(["simulate", "plan"]),
)
def test_verl_config_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, command: str
) -> None:
    """A verl config (``dynsched plan FILE``, ``dynsched simulate --scenario FILE``):
    accepted, or one line."""
    path = tmp_path / "verl.yaml"
    path.write_bytes(content)
    out = ["--out", str(tmp_path / "o"), "--quiet", "--seeds", "1"]
    if command == "simulate":
        args = ["simulate", "--scenario", str(path), "--steps", "1", "--no-plots", *out]
    else:
        args = ["plan", str(path), "--gpus", "16", "--shortlist", "1", "--no-plot", *out]
    rc, err = _main(args, capsys)
    _accepted_or_one_line(rc, err)


def _tomlish(content: bytes) -> bytes:
    try:
        data = yaml.safe_load(content.decode())
    except Exception:
        return content
    return _dump_toml(data) if data is not None else content


@pytest.mark.timeout(1800)
@FUZZ
@given(
    config=files(RUN_CONFIG, _dump_yaml),
    checkpoint=files(CHECKPOINT, lambda v: json.dumps(v, default=str).encode()),
    which=st.sampled_from(["config", "checkpoint"]),
)
def test_run_config_and_checkpoint_files(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_ray: None,
    config: bytes,
    checkpoint: bytes,
    which: str,
) -> None:
    cfg, ckpt = tmp_path / "config.yaml", tmp_path / "ckpt.json"
    cfg.write_bytes(config if which == "config" else RUN_CONFIG.encode())
    ckpt.write_bytes(checkpoint if which == "checkpoint" else CHECKPOINT.encode())
    args = ["run", "--config", str(cfg), "--resume", "--checkpoint", str(ckpt)]
    rc, err = _main([*args, "--out", str(tmp_path / "o"), "--quiet"], capsys)
    _accepted_or_one_line(rc, err, allow_ray_stub=True)


FLAG_VALUES = st.one_of(
    st.integers(-3, 4).map(str),
    st.sampled_from(["", "x", "nan", "inf", "-0", "1e9", "0.5", "=", "a=b", "--"]),
    st.text(max_size=8),
)


@pytest.mark.timeout(1800)
@FUZZ
@given(
    argv=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "--steps",
                    "--prompts",
                    "--set",
                    "--policy",
                    "--trainer-workers",
                    "--num-cpus",
                    "--tokens-per-s",
                    "--trainer-step-time",
                    "--name",
                    "--metrics",
                    "--resume",
                ]
            ),
            FLAG_VALUES,
        ),
        max_size=4,
    )
)
def test_run_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_ray: None, argv: list[tuple[str, str]]
) -> None:
    args = ["run", "--out", str(tmp_path / "o"), "--quiet"]
    for flag, value in argv:
        args += [flag] if flag == "--resume" else [flag, value]
    rc, err = _main(args, capsys)
    _accepted_or_one_line(rc, err, allow_ray_stub=True)


@pytest.mark.timeout(1800)
@FUZZ
@given(
    argv=st.lists(
        st.tuples(
            st.sampled_from(["--steps", "--seeds", "--seed", "--policy", "--scenario"]),
            st.one_of(FLAG_VALUES, st.sampled_from(["balanced", "default", "colocated"])),
        ),
        max_size=3,
    )
)
def test_simulate_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[tuple[str, str]]
) -> None:
    args = ["simulate", "--scenario", "balanced", "--steps", "1", "--seeds", "1"]
    for flag, value in argv:
        if flag in ("--steps", "--seeds") and value.lstrip("-").isdigit() and int(value) > 2:
            value = "2"  # keep an accepted run short
        args += [flag, value]
    rc, err = _main([*args, "--no-plots", "--quiet", "--out", str(tmp_path / "o")], capsys)
    _accepted_or_one_line(rc, err)


OPTIMUS_FILES = {
    "allocate": ("jobs.json", ALLOC, lambda v: json.dumps(v, default=str).encode()),
    "place": ("place.json", PLACE, lambda v: json.dumps(v, default=str).encode()),
    "convergence": ("loss.csv", LOSSES, _dump_yaml),
    "async": ("speed.csv", SPEEDS, _dump_yaml),
    "blocks": ("blocks.csv", BLOCKS, _dump_yaml),
    "workload": ("workload.csv", WORKLOAD, _dump_yaml),
}


@pytest.mark.timeout(1800)
@FUZZ
@given(data=st.data(), kind=st.sampled_from(sorted(OPTIMUS_FILES)))
def test_optimus_input_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: st.DataObject, kind: str
) -> None:
    name, base, dump = OPTIMUS_FILES[kind]
    path = tmp_path / name
    path.write_bytes(data.draw(files(base, dump)))
    args = {
        "allocate": ["optimus", "allocate", str(path)],
        "place": ["optimus", "place", str(path)],
        "convergence": ["optimus", "fit", "convergence", str(path), "--bootstrap", "4"],
        "async": ["optimus", "fit", "async", str(path)],
        "blocks": ["optimus", "paa", "--blocks", str(path), "--ps", "2"],
        "workload": [
            "optimus",
            "simulate",
            "--workload",
            str(path),
            "--interval",
            "3600",
            "--quiet",
        ],
    }[kind]
    rc, err = _main(args, capsys)
    _accepted_or_one_line(rc, err)


@pytest.mark.timeout(1800)
@FUZZ
@given(
    argv=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "--num-jobs",
                    "--interval",
                    "--restart-delay",
                    "--lr-decay-share",
                    "--workloads",
                    "--schedulers",
                    "--seed",
                ]
            ),
            st.one_of(FLAG_VALUES, st.sampled_from(["workload-1,nosuch", "fifo,nosuch", ","])),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_optimus_compare_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[tuple[str, str]]
) -> None:
    args = ["optimus", "compare", "--ps", "--quiet", "--schedulers", "fifo"]
    ok_run = True
    for flag, value in argv:
        args += [flag, value]
    # An accepted PS comparison must stay small: cap the jobs.
    args += ["--num-jobs", "2"] if "--num-jobs" not in [f for f, _ in argv] else []
    for flag, value in argv:
        if flag == "--num-jobs" and value.lstrip("-").isdigit() and int(value) > 3:
            ok_run = False
    if not ok_run:
        return
    rc, err = _main(args, capsys)
    _accepted_or_one_line(rc, err)


def test_toml_dump_is_parseable() -> None:
    """The TOML writer of the strategies writes TOML (so the fuzz reaches the loader)."""
    assert tomllib.loads(_dump_toml({"a": [1, 2], "b": "x"}).decode()) == {"a": [1, 2], "b": "x"}
