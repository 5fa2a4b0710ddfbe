"""The core's in-memory end-to-end run, repeated over Ray actors, with failures injected."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest
import ray
from dynsched_core import ConfigError, DynamicScheduleConfig, FullyAsyncLoop, Prompt
from dynsched_core.events import TrainStepEvent
from dynsched_core.testing import InMemoryReplica
from dynsched_ray import (
    AllReplicasLostError,
    RayRunner,
    RayRunOptions,
    load_checkpoint,
    synthetic_prompts,
)
from dynsched_ray.runtime.workload import RunWorkload

from ._policies import AlwaysSwitchPolicy, ScriptedPolicy

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

CONFIG = DynamicScheduleConfig.from_dict(
    {
        "async_training": {
            "use_dynamic_resource_scheduling": True,
            "trigger_parameter_sync_step": 2,
            "staleness_threshold": 0.5,
            "concurrent_samples_per_replica": 2,
            "partial_rollout": True,
        },
        "trainer": {"nnodes": 1, "n_gpus_per_node": 2},
        "rollout": {"nnodes": 1, "n_gpus_per_node": 2},
        "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2}, "rollout": {"n": 2}},
    }
)
STEPS = 6


def _options(name: str, **kw: Any) -> RayRunOptions:
    base: dict[str, Any] = {
        "name": name,
        "num_steps": STEPS,
        "trainer_workers": 1,
        "tokens_per_s": 2000.0,
        "trainer_step_time_s": 0.02,
        "health_check_interval_s": 0.2,
        "call_timeout_s": 30.0,
        "wait_timeout_s": 60.0,
        "no_replica_timeout_s": 20.0,
    }
    base.update(kw)
    return RayRunOptions(**base)


class _Trainer:
    async def train_step(self, samples: Any) -> dict[str, float]:
        await asyncio.sleep(0.02)
        return {"update_actor": 0.02}

    async def sync_weights(self, version: int) -> None:
        return None


async def _in_process_transitions(opt: RayRunOptions) -> list[tuple[str, str]]:
    prompts = synthetic_prompts(
        2 * STEPS * CONFIG.required_samples + 8,
        max_tokens=opt.max_tokens,
        prompt_len=opt.prompt_len,
        n=CONFIG.n,
        min_len=opt.min_response_len,
        max_len=opt.max_response_len,
    )
    loop = FullyAsyncLoop.build(
        CONFIG,
        ScriptedPolicy(),
        _Trainer(),
        prompts=prompts,
        standalone=[
            InMemoryReplica(f"standalone-{i}", tokens_per_s=opt.tokens_per_s) for i in range(2)
        ],
        hybrid=[
            InMemoryReplica(f"hybrid-{i}", role="hybrid", tokens_per_s=opt.tokens_per_s)
            for i in range(2)
        ],
        max_tokens=opt.max_tokens,
        wait_timeout_s=60.0,
    )
    result = await loop.run(STEPS)
    assert result.steps == STEPS
    return [(t.source.name, t.target.name) for t in loop.controller.state_machine.history]


def _check_conservation(runner: RayRunner, res: Any) -> None:
    loop = res.loop
    assert loop.steps == STEPS
    assert loop.samples_failed == 0
    assert loop.samples_produced == loop.samples_consumed + loop.samples_left
    ids = res.consumed_sample_ids
    assert len(ids) == len(set(ids)) == STEPS * CONFIG.required_samples  # no duplicate
    for sample in runner.consumed_samples:
        for r in sample.responses:  # the whole response, across retries, in order
            assert r.output_tokens == tuple(range(r.num_tokens))


async def test_e2e_over_ray_matches_in_process_switch_sequence(tmp_path: Any) -> None:
    lines: list[str] = []
    opt = _options("e2e", metrics_path=str(tmp_path / "metrics.jsonl"))
    runner = RayRunner(
        CONFIG, opt, policy=ScriptedPolicy(), progress=lines.append, keep_samples=True
    )
    res = await runner.run()
    _check_conservation(runner, res)
    expected = await _in_process_transitions(opt)
    assert list(res.transitions) == expected
    assert ("ACTIVATING", "HYBRID_ACTIVE") in expected and (
        "DEACTIVATING",
        "STANDALONE_ONLY",
    ) in expected
    assert res.loop.activations >= 1 and res.loop.deactivations >= 1
    assert res.dead_replicas == ()
    # metrics: one JSON line per sync cycle, dynamic_resource/* keys
    assert len(res.metrics) == STEPS // CONFIG.trigger_parameter_sync_step
    text = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(text) == len(res.metrics)
    assert "dynamic_resource/resource_utilization" in text[0]
    assert any(line.startswith(f"step {STEPS}/{STEPS}") for line in lines)


async def test_standalone_replica_killed_mid_cycle_loses_nothing() -> None:
    runner: RayRunner | None = None
    killed: list[str] = []
    tasks: list[asyncio.Task[None]] = []

    async def kill_when_busy() -> None:
        # kill it while a request has been generating there for a while (a few segments)
        assert runner is not None and runner.fleet is not None
        loop = asyncio.get_running_loop()
        seen: dict[str, float] = {}
        while True:
            now = loop.time()
            on = set(runner.fleet.router.requests_on("standalone-0"))
            seen = {r: seen.get(r, now) for r in on}
            if any(now - t >= 0.05 for t in seen.values()):
                break
            await asyncio.sleep(0.005)
        killed.append("standalone-0")
        runner.fleet.kill_replica("standalone-0")

    def progress(line: str) -> None:
        # from the second cycle on, kill it while requests run on it
        if line.startswith("step 2/") and not tasks:
            tasks.append(asyncio.ensure_future(kill_when_busy()))

    opt = _options(
        "kill-standalone",
        tokens_per_s=400.0,
        stream_tokens=4,
        min_response_len=40,
        max_response_len=64,
    )
    runner = RayRunner(CONFIG, opt, policy=ScriptedPolicy(), progress=progress, keep_samples=True)
    res = await runner.run()
    assert killed == ["standalone-0"]
    assert res.dead_replicas == ("standalone-0",)
    _check_conservation(runner, res)
    # requests running there when it died were resumed elsewhere (tokens checked above)
    assert res.interrupted and {rid for rid, _, _ in res.interrupted} == {"standalone-0"}
    by_id = {r.request_id: r for s in runner.consumed_samples for r in s.responses}
    for _, request_id, kept in res.interrupted:
        r = by_id.get(request_id)
        if r is None:  # its sample was still in flight or queued at the end
            continue
        assert "standalone-0" in r.replica_ids[:-1] and r.replica_ids[-1] != "standalone-0"
        assert r.failures + r.aborts >= 1
        if kept:  # streamed tokens survived the death: resumed, not restarted
            assert r.reprefill_tokens >= kept
    assert any(kept > 0 for _, _, kept in res.interrupted)


async def test_hybrid_replica_killed_during_activation_falls_back_and_continues() -> None:
    runner: RayRunner | None = None
    activations = collections.Counter[str]()

    def on_transition(tr: Any) -> None:
        if tr.target.name == "ACTIVATING":
            activations["n"] += 1
            if activations["n"] == 2:  # second activation: hybrid-0 dies while waking
                assert runner is not None and runner.fleet is not None
                runner.fleet.kill_replica("hybrid-0")

    opt = _options("kill-hybrid", switch_delay_s=0.3)
    runner = RayRunner(
        CONFIG, opt, policy=AlwaysSwitchPolicy(), on_transition=on_transition, keep_samples=True
    )
    res = await runner.run()
    _check_conservation(runner, res)
    assert res.dead_replicas == ("hybrid-0",)
    assert res.failed_switches == ("activate",)
    tr = list(res.transitions)
    i = tr.index(("ACTIVATING", "STANDALONE_ONLY"))  # the failed activation fell back
    # the survivors are used again afterwards: a later activation succeeds
    assert ("ACTIVATING", "HYBRID_ACTIVE") in tr[i + 1 :]
    assert res.loop.switch_errors == 1
    late = [r.replica_ids[-1] for s in runner.consumed_samples[-4:] for r in s.responses]
    assert "hybrid-0" not in late


async def test_all_replicas_gone_stops_with_a_clear_error() -> None:
    runner: RayRunner | None = None

    def progress(line: str) -> None:
        if line.startswith("step 2/"):
            assert runner is not None and runner.fleet is not None
            for rid in list(runner.fleet.replicas):
                ray.kill(runner.fleet.replicas[rid].handle, no_restart=True)

    opt = _options("kill-all", num_steps=20, tokens_per_s=400.0)
    runner = RayRunner(CONFIG, opt, policy=ScriptedPolicy(), progress=progress)
    with pytest.raises(AllReplicasLostError, match="all rollout replicas are gone"):
        await asyncio.wait_for(runner.run(), 120)


class _CountingWorkload(RunWorkload):
    """A workload of its own: prompts ``q0, q1, ...``, a count of the steps it saw in
    the checkpoint, restored on resume, and in the fingerprint."""

    id_prefix = "q"

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.prepared: list[int | None] = []
        self.restored: int | None = None

    def prompts(self, runner: RayRunner) -> Any:
        skip = set(runner.consumed_sample_ids)
        return (
            Prompt(prompt_id=f"q{i}", prompt_len=8, max_tokens=16, target_lens=(8, 12))
            for i in range(400)
            if f"q{i}" not in skip
        )

    def checkpoint_extras(self, runner: RayRunner, state: Any) -> dict[str, Any]:
        return {"workload_steps": len(self.steps) + (self.restored or 0)}

    def fingerprint_extras(self, runner: RayRunner) -> dict[str, Any]:
        return {"workload.kind": "counting"}

    async def restore(self, runner: RayRunner, loop: Any, restored: Any) -> None:
        self.restored = int(restored["workload_steps"])

    def prepare_outputs(self, runner: RayRunner, steps_done: int | None) -> None:
        self.prepared.append(steps_done)

    def on_event(self, runner: RayRunner, event: Any) -> None:
        if isinstance(event, TrainStepEvent):
            self.steps.append(runner.step_offset + event.step)


async def test_a_workload_of_its_own_runs_and_resumes_through_the_one_runner(
    tmp_path: Any,
) -> None:
    ckpt = str(tmp_path / "driver.json")
    first = _CountingWorkload()
    built: list[Any] = []
    runner = RayRunner(
        CONFIG,
        _options("workload-a", num_steps=4, checkpoint_path=ckpt),
        workload=first,
        on_loop_built=built.append,
    )
    res = await runner.run()
    assert res.loop.steps == 4 and built == [runner.loop]
    assert first.steps == [1, 2, 3, 4] and first.prepared == [None]
    assert res.consumed_sample_ids and all(x.startswith("q") for x in res.consumed_sample_ids)
    saved = load_checkpoint(ckpt)
    assert saved["workload_steps"] == 4 and saved["fingerprint"]["workload.kind"] == "counting"
    assert saved["fingerprint"]["trigger_parameter_sync_step"] == 2  # the config's too
    # the stand-in workload's prompts are p0, p1, ...: it refuses this chain's checkpoint
    with pytest.raises(ConfigError, match="not an id of this prompt source"):
        await RayRunner(CONFIG, _options("workload-x", checkpoint_path=ckpt, resume=True)).run()

    second = _CountingWorkload()
    resumed = RayRunner(
        CONFIG,
        _options("workload-b", num_steps=2, checkpoint_path=ckpt, resume=True),
        workload=second,
    )
    res2 = await resumed.run()
    assert res2.resumed and res2.first_step == 5
    assert second.prepared == [4] and second.restored == 4 and second.steps == [5, 6]
    chain = res2.consumed_sample_ids
    assert len(chain) == len(set(chain)) == 6 * CONFIG.required_samples
    assert load_checkpoint(ckpt)["workload_steps"] == 6
