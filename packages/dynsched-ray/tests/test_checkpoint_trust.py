"""Checkpoints hold no code, are resumed only into the run that wrote them, are checked
before Ray starts, are written whole (a failed write stops the run, the last good one
kept), metrics resume without a duplicated cycle, and one live run holds an output folder.

Everything but `test_failed_checkpoint_write_stops_dynsched_run_then_resume_has_each_cycle_once`
runs without Ray.
"""

from __future__ import annotations

import asyncio
import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
import torch
from dynsched_core import ConfigError, DynamicScheduleConfig
from dynsched_core.cli import main as dynsched_main
from dynsched_core.events import TrainStepEvent
from dynsched_core.storage import LOCK_NAME, RunLock, atomic_writer
from dynsched_ray import CheckpointWriteError, RayRunner, RayRunOptions
from dynsched_ray.cli import train as train_cli
from dynsched_ray.cli.run import DEMO_CONFIG, build_config
from dynsched_ray.runtime import runner as runner_mod
from dynsched_ray.runtime.runner import (
    CHECKPOINT_FORMAT,
    check_fingerprint,
    config_fingerprint,
    load_checkpoint,
    validate_checkpoint,
)
from dynsched_ray.training import (
    TrainSettings,
    TrainWorkload,
    load_trainer_state,
    resolve_checkpoint_file,
    train_fingerprint,
)

RUN_CONFIG = DynamicScheduleConfig.from_dict(DEMO_CONFIG)


def _driver_state(version: int = 2, cycles: int = 1) -> dict[str, Any]:
    from dynsched_core._driver import _INT_STATE

    return {
        **dict.fromkeys(_INT_STATE, 0),  # every counter this core version keeps
        "format": 1,
        "policy": RUN_CONFIG.build_policy().state_dict(),
        "requested_samples": 16,
        "param_version": version,
        "cycles": cycles,
        "activations": 1,
        "deactivations": 1,
        "skipped_hybrid_syncs": 0,
        "cycle_requested": 0,
        "failovers": 0,
        "wait_times": [0.1],
        "wait_samples": [4],
        "cycle_activate_s": 0.0,
        "cycle_deactivate_s": 0.0,
    }


def _run_checkpoint(steps: int = 4, config: DynamicScheduleConfig = RUN_CONFIG) -> dict[str, Any]:
    """What `RayRunner` writes after ``steps`` steps of the demo config."""
    return {
        "format": CHECKPOINT_FORMAT,
        "name": "dynsched",
        "driver": _driver_state(version=steps // 2, cycles=steps // 2),
        "param_version": steps // 2,
        "steps_done": steps,
        "consumed_sample_ids": [f"p{i}" for i in range(steps * config.required_samples)],
        "config": config.to_dict(),
        "fingerprint": config_fingerprint(config),
    }


def _write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _cli(argv: list[str], capsys: Any) -> tuple[int, str]:
    try:
        code = dynsched_main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.err


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------- no code in checkpoints
class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (Path(self.marker), "pwned"))


def _train_out(tmp_path: Path, trainer_state: str | None, **overrides: Any) -> Path:
    """An OUT folder whose checkpoint matches `dynsched train`'s demo config."""
    out = tmp_path / "out"
    config, tree = train_cli.load_train_config(None, [])
    settings = TrainSettings.from_verl(tree, out_dir=str(out))
    steps = 4
    data = {
        **_run_checkpoint(steps, config),
        "consumed_sample_ids": [f"t{i}" for i in range(steps * config.required_samples)],
        "config": config.to_dict(),
        "fingerprint": train_fingerprint(config, settings),
        "trainer_state": trainer_state,
        "metrics_rows": steps,
        "wall_s": 1.0,
        **overrides,
    }
    _write(out / "checkpoint" / "driver.json", data)
    return out


def test_crafted_trainer_pickle_is_refused_and_never_runs(tmp_path: Path, capsys: Any) -> None:
    marker = tmp_path / "marker"
    out = _train_out(tmp_path, "trainer-v2.pt")
    torch.save({"model": _Exploit(str(marker))}, out / "checkpoint" / "trainer-v2.pt")
    with pytest.raises(ConfigError, match="not a plain tensor checkpoint"):
        load_trainer_state(out / "checkpoint" / "trainer-v2.pt")
    assert not marker.exists()
    code, err = _cli(["train", "--resume", "--out", str(out)], capsys)
    line = _one_line(err)
    assert code == 2 and "trainer-v2.pt" in line and "refused" in line, line
    assert not marker.exists()


@pytest.mark.parametrize("name", ["../outside.pt", "/etc/passwd", "sub/x.pt", "..", "link.pt"])
def test_trainer_state_names_outside_the_folder_are_refused(
    name: str, tmp_path: Path, capsys: Any
) -> None:
    outside = tmp_path / "outside.pt"
    torch.save({"format": 1}, outside)
    out = _train_out(tmp_path, name)
    (out / "checkpoint" / "link.pt").symlink_to(outside)
    with pytest.raises(ConfigError, match="trainer_state|outside"):
        resolve_checkpoint_file(out / "checkpoint", name)
    code, err = _cli(["train", "--resume", "--out", str(out)], capsys)
    line = _one_line(err)
    assert code == 2 and "trainer_state" in line, line


def test_trainer_state_round_trips_with_weights_only(tmp_path: Path) -> None:
    """What the trainers save (tensors, optimizer state, plain values) loads back."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    state = {
        "format": 1,
        "trainer": "TorchTrainer",
        "version": 2,
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": opt.state_dict(),
    }
    path = tmp_path / "trainer-v2.pt"
    with atomic_writer(path) as fh:  # as `TrainWorkload.save_trainer` writes it
        torch.save(state, fh)
    loaded = load_trainer_state(resolve_checkpoint_file(tmp_path, "trainer-v2.pt"))
    assert loaded["version"] == 2 and torch.equal(loaded["model"]["weight"], model.weight)
    assert loaded["optimizer"]["param_groups"][0]["lr"] == 1e-3


# ---------------------------------------------------------------- config fingerprint
def test_fingerprint_diff_is_one_line_naming_each_field() -> None:
    data = _run_checkpoint()
    current = config_fingerprint(
        build_config(
            None,
            ["async_training.trigger_parameter_sync_step=4", "trainer.n_gpus_per_node=4"],
        )
    )
    line = check_fingerprint(data, current)
    assert line == (
        "--resume: checkpoint differs from this run: trainer.n_gpus_per_node 2 -> 4, "
        "trigger_parameter_sync_step 2 -> 4 (pass --allow-config-change to resume anyway)"
    )
    assert check_fingerprint(data, current, allow_change=True) is None
    assert check_fingerprint(data, config_fingerprint(RUN_CONFIG)) is None
    old = {k: v for k, v in data.items() if k != "fingerprint"}
    assert "no config fingerprint" in str(check_fingerprint(old, current))


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("actor_rollout_ref.actor.ppo_mini_batch_size=8", "ppo_mini_batch_size 4 -> 8"),
        ("rollout.n_gpus_per_node=4", "rollout.n_gpus_per_node 2 -> 4"),
        ("actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.n 2 -> 4"),
        ("async_training.staleness_threshold=1.0", "staleness_threshold 0.5 -> 1.0"),
        (
            "async_training.concurrent_samples_per_replica=8",
            "concurrent_samples_per_replica 4 -> 8",
        ),
    ],
)
def test_dynsched_run_resume_with_another_config_is_refused_before_ray(
    override: str, needle: str, tmp_path: Path, capsys: Any
) -> None:
    ckpt = _write(tmp_path / "ckpt.json", _run_checkpoint())
    argv = ["run", "--checkpoint", str(ckpt), "--resume", "--out", str(tmp_path), "--set", override]
    code, err = _cli(argv, capsys)
    line = _one_line(err)
    assert code == 2 and needle in line and "--allow-config-change" in line, line


def test_allow_config_change_and_old_checkpoints(tmp_path: Path) -> None:
    from dynsched_core.errors import UsageError
    from dynsched_ray.cli.run import _check_resume

    ckpt = _write(tmp_path / "ckpt.json", _run_checkpoint())
    changed = build_config(None, ["async_training.staleness_threshold=1.0"])
    with pytest.raises(UsageError, match="staleness_threshold 0.5 -> 1.0"):
        _check_resume(str(ckpt), changed)
    assert _check_resume(str(ckpt), changed, allow_config_change=True)["steps_done"] == 4
    old = _write(
        tmp_path / "old.json",
        {k: v for k, v in _run_checkpoint().items() if k != "fingerprint"},
    )
    with pytest.raises(UsageError, match="no config fingerprint"):
        _check_resume(str(old), RUN_CONFIG)
    assert _check_resume(str(old), RUN_CONFIG, allow_config_change=True)["steps_done"] == 4


def test_dynsched_train_resume_with_another_policy_or_config_is_one_line(
    tmp_path: Path, capsys: Any
) -> None:
    out = _train_out(tmp_path, None)
    code, err = _cli(
        ["train", "--resume", "--out", str(out), "--policy", "static_fully_async"], capsys
    )
    line = _one_line(err)
    assert code == 2 and "written by policy 'default'" in line, line
    code, err = _cli(["train", "--resume", "--out", str(out), "--lr", "0.5"], capsys)
    line = _one_line(err)
    assert code == 2 and "actor_rollout_ref.actor.optim.lr 0.001 -> 0.5" in line, line


# ---------------------------------------------------------------- checkpoint content
def _bad(**changes: Any) -> dict[str, Any]:
    data = _run_checkpoint()
    for key, value in changes.items():
        if key.startswith("driver__"):
            data["driver"][key.removeprefix("driver__")] = value
        else:
            data[key] = value
    return data


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (_bad(consumed_sample_ids=["p0"] * 16), "consumed_sample_ids"),  # duplicates
        (_bad(consumed_sample_ids=[f"q{i}" for i in range(16)]), "consumed_sample_ids"),
        (_bad(consumed_sample_ids=[]), "consumed_sample_ids"),  # emptied: would retrain
        (_bad(consumed_sample_ids=[f"p{i}" for i in range(15)]), "consumed_sample_ids"),
        (_bad(consumed_sample_ids=[True] * 16), "consumed_sample_ids"),
        (_bad(steps_done=10**15), "steps_done"),
        (_bad(steps_done=-1), "steps_done"),
        (_bad(param_version=-1, driver__param_version=-1), "param_version"),
        (_bad(param_version=3), "param_version"),  # driver says 2
        (_bad(param_version=9, driver__param_version=9), "param_version"),  # > steps
        (_bad(driver__activations=-3), "driver.activations"),
        (_bad(driver__wait_times=[float("nan")]), "driver.wait_times[0]"),
        (_bad(driver__cycle_activate_s=float("inf")), "driver.cycle_activate_s"),
    ],
)
def test_inconsistent_checkpoint_content_is_refused(
    data: dict[str, Any], field: str, tmp_path: Path, capsys: Any
) -> None:
    with pytest.raises(ConfigError) as err:
        validate_checkpoint(data, "ckpt.json", required_samples=4, id_prefix="p")
    assert f"{field!r}" in str(err.value)
    ckpt = _write(tmp_path / "ckpt.json", data)
    code, out = _cli(["run", "--checkpoint", str(ckpt), "--resume", "--out", str(tmp_path)], capsys)
    line = _one_line(out)
    assert code == 2 and field.split("[")[0] in line, line


def test_a_good_checkpoint_passes() -> None:
    validate_checkpoint(_run_checkpoint(), "c", required_samples=4, id_prefix="p")
    validate_checkpoint(_run_checkpoint(0), "c", required_samples=4, id_prefix="p")


# ---------------------------------------------------------------- failed writes stop the run
class _FakeDriver:
    param_version = 0

    def state_dict(self) -> dict[str, Any]:
        return _driver_state(version=self.param_version, cycles=self.param_version)


def _offline_runner(ckpt: Path) -> RayRunner:
    """A `RayRunner` whose loop is a stand-in (no Ray): events drive its checkpoints."""
    runner = RayRunner(RUN_CONFIG, RayRunOptions(checkpoint_path=str(ckpt), num_steps=8))
    runner.loop = SimpleNamespace(  # type: ignore[assignment]
        driver=_FakeDriver(), controller=SimpleNamespace(state="STANDALONE_ONLY")
    )
    runner._fatal = asyncio.Event()
    return runner


def _step(runner: RayRunner, step: int) -> None:
    runner._record_step([SimpleNamespace(sample_id=f"p{4 * (step - 1) + i}") for i in range(4)])
    sync = step % 2 == 0
    if sync:
        runner.loop.driver.param_version += 1  # type: ignore[union-attr]
    runner._on_event(
        TrainStepEvent(
            step=step, time=0.0, timings={}, allocated_s=0.0, mq_size=0, is_sync_step=sync
        )
    )


def test_failed_checkpoint_write_stops_the_run_and_keeps_the_last_good_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = tmp_path / "ckpt" / "driver.json"
    runner = _offline_runner(ckpt)
    real = runner_mod.atomic_write_text
    calls = []

    def disk_fills(path: Any, text: str) -> None:
        calls.append(path)
        if len(calls) >= 2:  # the 2nd checkpoint (step 4) and every later one
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, text)

    monkeypatch.setattr(runner_mod, "atomic_write_text", disk_fills)
    _step(runner, 1)
    _step(runner, 2)
    assert load_checkpoint(ckpt)["steps_done"] == 2
    _step(runner, 3)
    _step(runner, 4)  # the write fails: the bus would swallow an exception
    assert runner._fatal.is_set()
    err = runner._fatal_error
    assert isinstance(err, CheckpointWriteError)
    assert str(err) == (
        "checkpoint write failed at step 4: [Errno 28] No space left on device; "
        f"the last good checkpoint (step 2) is intact in {ckpt.parent}"
    )
    saved = load_checkpoint(ckpt)  # intact and loadable
    assert saved["steps_done"] == 2 and len(saved["consumed_sample_ids"]) == 8
    validate_checkpoint(saved, str(ckpt), required_samples=4, id_prefix="p")
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["driver.json"]  # no temp left
    _step(runner, 5)
    _step(runner, 6)  # nothing more is written after the failure
    assert len(calls) == 2 and load_checkpoint(ckpt)["steps_done"] == 2

    class _Loop:
        async def run(self, steps: int) -> None:
            await asyncio.Event().wait()  # would go on forever

    runner.replicas = SimpleNamespace(dead_ids=[])  # type: ignore[assignment]
    with pytest.raises(CheckpointWriteError, match="at step 4"):  # the loop is stopped
        asyncio.run(asyncio.wait_for(runner._run_loop(_Loop()), 60))  # type: ignore[arg-type]


def test_failed_metrics_write_stops_the_run_too(tmp_path: Path) -> None:
    runner = _offline_runner(tmp_path / "driver.json")
    sink = runner_mod._FailFastSink(
        SimpleNamespace(write=lambda r: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full"))),
        lambda exc: runner.output_failed("metrics write", exc),
    )
    sink.write(object())
    assert runner._fatal.is_set() and "metrics write failed at step 0" in str(runner._fatal_error)


# ---------------------------------------------------------------- metrics resume
def test_resume_after_a_crash_mid_cycle_writes_each_step_once(tmp_path: Path) -> None:
    """The crashed run wrote rows 1..5 and half of row 6; the checkpoint is at step 4."""
    metrics = tmp_path / "metrics.jsonl"
    with open(metrics, "w", encoding="utf-8") as fh:
        for step in range(1, 6):
            fh.write(json.dumps({"step": step, "reward": 0.5}) + "\n")
        fh.write('{"step": 6, "rew')
    fake = SimpleNamespace(settings=SimpleNamespace(metrics_path=metrics))
    TrainWorkload._truncate_metrics(fake, 4)  # type: ignore[arg-type]
    for step in (5, 6):  # the resumed run redoes them
        with open(metrics, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": step}) + "\n")
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    # the cycle records of `dynsched run` (RayRunner's metrics file) likewise
    cycles = tmp_path / "cycles.jsonl"
    cycles.write_text("".join(json.dumps({"cycle": c, "step": 2 * c + 2}) + "\n" for c in range(3)))
    runner = RayRunner(RUN_CONFIG, RayRunOptions(metrics_path=str(cycles)))
    runner._trim_metrics(4)
    assert [json.loads(x)["step"] for x in cycles.read_text().splitlines()] == [2, 4]


# ---------------------------------------------------------------- one live run per folder
def _hold(folder: Path, command: str) -> subprocess.Popen[str]:
    code = (
        "import sys; from dynsched_core.storage import RunLock; "
        f"lock = RunLock({str(folder)!r}, {command!r}).acquire(); print('held', flush=True); "
        "sys.stdin.readline()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:  # pragma: no cover
        proc.kill()
        proc.wait()


def test_an_output_folder_held_by_a_live_run_is_refused(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out"
    holder = _hold(out, "dynsched train")
    try:
        code, err = _cli(["train", "--out", str(out), "--engine", "hf"], capsys)
        line = _one_line(err)
        assert code == 2
        assert line.startswith("dynsched train: ") and line.endswith(
            f"{out} is in use by a running dynsched train (pid {holder.pid}); "
            "wait for it or choose another --out"
        ), line
        code, err = _cli(["run", "--out", str(out), "--name", "locked"], capsys)
        line = _one_line(err)
        assert code == 2 and f"in use by a running dynsched train (pid {holder.pid})" in line
        assert "choose another --out" in line
        # the first run is unaffected: it still holds the folder
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == holder.pid
        assert holder.poll() is None
    finally:
        _stop(holder)
    lock = RunLock(out).acquire()  # free again once the holder ended
    lock.release()


# ---------------------------------------------------------------- progress after a resume
def test_progress_after_resume_counts_restored_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray
    from dynsched_ray import training as _train

    seen: list[str] = []

    class _FakeRunner:
        def __init__(self, *args: Any, on_step: Any = None, **kwargs: Any) -> None:
            self.on_step = on_step

        async def train(self) -> Any:
            for step in (5, 6):
                self.on_step({"step": step})
            loop = SimpleNamespace(steps=2, activations=0, deactivations=0)
            result = SimpleNamespace(loop=loop, first_step=5, final_version=3)
            return SimpleNamespace(result=result, rows=[], lags=[], wall_s=0.1)

    monkeypatch.setattr(_train, "TrainRunner", _FakeRunner)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    config, tree = train_cli.load_train_config(None, [])
    settings = TrainSettings.from_verl(tree, out_dir=str(tmp_path), steps=2)
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    args = SimpleNamespace(quiet=False, name="t", namespace=None, resume=True, address=None)
    assert train_cli._run(args, config, settings, None, done=4) == 0  # type: ignore[arg-type]
    seen = stream.getvalue().splitlines()
    assert any("step 5/6" in x for x in seen) and any("step 6/6" in x for x in seen), seen


def test_fleet_line_counts_the_real_trainer_workers() -> None:
    from dynsched_ray.trainers.group import RayTrainerSpec

    fleet = SimpleNamespace(trainer_workers=[], spec=SimpleNamespace(trainer_gpus=2))
    spec = RayTrainerSpec(factory=object, make_batch=lambda s, v: None)
    runner = RayRunner(RUN_CONFIG, RayRunOptions(trainer=spec))
    assert runner._trainer_worker_count(fleet) == 2  # type: ignore[arg-type]
    stand_in = RayRunner(RUN_CONFIG, RayRunOptions())
    fleet.trainer_workers = ["w0", "w1", "w2"]
    assert stand_in._trainer_worker_count(fleet) == 3  # type: ignore[arg-type]


def _factory(replica_id: str, **kw: Any) -> Any:  # pragma: no cover - never called
    raise AssertionError


def test_fleet_spec_is_derived_from_the_options_and_the_config() -> None:
    """Every `FleetSpec` field the options share comes from them (no field dropped), the
    layout from the config, the replicas' keyword arguments from the workload."""
    from dynsched_core import InMemoryReplicaOptions
    from dynsched_ray.runtime.fleet import FleetSpec

    opt = RayRunOptions(
        name="derived",
        namespace="ns",
        trainer_workers=1,
        hybrid_gpu_fraction=0.25,
        placement_strategy="SPREAD",
        replica_factory=_factory,
        detached_router=True,
        batch_router_calls=False,
        call_timeout_s=7.0,
        generate_timeout_s=8.0,
        trainer_step_time_s=0.5,
        stream_tokens=None,
        restart_queue=False,
        restart_router=False,
        tokens_per_s=123.0,
        chunk_tokens=4,
        switch_delay_s=0.1,
    )
    kw = {"tokens_per_s": 123.0, "chunk_tokens": 4}
    delays = InMemoryReplicaOptions(sleep_delay_s=0.1, wake_delay_s=0.1, update_delay_s=0.1)
    expected = FleetSpec(  # written out field by field: the oracle
        name="derived",
        namespace="ns",
        trainer_gpus=RUN_CONFIG.hybrid_gpus,
        standalone_replicas=RUN_CONFIG.num_standalone_replicas,
        hybrid_replicas=RUN_CONFIG.num_hybrid_replicas,
        gpus_per_replica=RUN_CONFIG.rollout_tensor_parallel_size,
        trainer_workers=1,
        hybrid_gpu_fraction=0.25,
        replica_factory=_factory,
        standalone_kwargs=kw,
        hybrid_kwargs={**kw, "options": delays},
        queue_capacity=RUN_CONFIG.max_queue_size,
        detached_router=True,
        batch_router_calls=False,
        call_timeout_s=7.0,
        generate_timeout_s=8.0,
        trainer_step_time_s=0.5,
        stream_tokens=None,
        placement_strategy="SPREAD",
        restart_queue=False,
        restart_router=False,
    )
    assert RayRunner(RUN_CONFIG, opt).fleet_spec() == expected
    # real trainers start in their group, after the fleet: no stand-in workers
    from dynsched_ray.trainers.group import RayTrainerSpec

    spec = RayTrainerSpec(factory=object, make_batch=lambda s, v: None)
    with_trainer = RayRunner(RUN_CONFIG, attrs.evolve(opt, trainer=spec)).fleet_spec()
    assert with_trainer == attrs.evolve(expected, trainer_workers=0)


# ---------------------------------------------------------------- with Ray (one small run)
@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_failed_checkpoint_write_stops_dynsched_run_then_resume_has_each_cycle_once(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics, ckpt = tmp_path / "m.jsonl", tmp_path / "ckpt.json"
    common = [
        "run",
        "--name",
        "ckpt-enospc",
        "--trainer-workers",
        "1",
        "--trainer-step-time",
        "0.01",
        "--metrics",
        str(metrics),
        "--checkpoint",
        str(ckpt),
        "--quiet",
    ]
    real = runner_mod.atomic_write_text
    calls = []

    def disk_fills(path: Any, text: str) -> None:
        calls.append(path)
        if len(calls) == 2:  # the checkpoint after step 4
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, text)

    monkeypatch.setattr(runner_mod, "atomic_write_text", disk_fills)
    code, err = _cli([*common, "--steps", "8"], capsys)
    line = _one_line(err)
    assert code == 1
    assert line == (
        "dynsched run: error: checkpoint write failed at step 4: [Errno 28] No space left on "
        f"device; the last good checkpoint (step 2) is intact in {tmp_path}"
    )
    assert len(calls) == 2  # stopped: no later checkpoint was attempted
    assert load_checkpoint(ckpt)["steps_done"] == 2
    monkeypatch.undo()
    code, err = _cli([*common, "--steps", "6", "--resume"], capsys)
    assert code == 0, err
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows if "step" in r] == [2, 4, 6, 8]  # each cycle once
    assert load_checkpoint(ckpt)["steps_done"] == 8
