"""`dynsched train`: real RL on Ray with real engines and trainers, faults and resume.

The runs use the transformers engine (`HFReplica`): real sampling from the warmed-up tiny
model, with the engine's log-probabilities, at a start-up cost that fits CI; the vLLM
engine runs the same code path (see ``integration-tests/test_train_vllm.py``).
"""

from __future__ import annotations

import asyncio
import collections
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from dynsched_core import DynamicScheduleConfig
from dynsched_ray import RayRunOptions
from dynsched_ray.task.addition import AdditionTask, TaskTokenizer, WarmUpOptions, warm_up
from dynsched_ray.training import TrainRunner, TrainSettings, lag_bound, read_metrics

from ._policies import AlwaysSwitchPolicy, PartialMidCyclePolicy

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


def _config(*, standalone: int, trainer_gpus: int, **async_kw: Any) -> DynamicScheduleConfig:
    at = {
        "use_dynamic_resource_scheduling": trainer_gpus > 0,
        "dynamic_schedule_policy": "default",
        "trigger_parameter_sync_step": 2,
        "staleness_threshold": 0.5,
        "concurrent_samples_per_replica": 4,
        "partial_rollout": True,
        **async_kw,
    }
    return DynamicScheduleConfig.from_dict(
        {
            "async_training": at,
            "trainer": {"nnodes": 1, "n_gpus_per_node": max(1, trainer_gpus)},
            "rollout": {"nnodes": 1, "n_gpus_per_node": standalone},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 4}},
        }
    )


def _settings(tmp: Path, steps: int, **kw: Any) -> TrainSettings:
    return TrainSettings(
        out_dir=str(tmp / "out"), model_cache=str(tmp / "cache"), engine="hf", steps=steps, **kw
    )


def _check_run(runner: TrainRunner, summary: Any, steps: int, first_step: int = 1) -> None:
    res = summary.result
    loop = res.loop
    assert loop.steps == steps and loop.samples_failed == 0
    # conservation by id: every consumed sample once, produced = consumed + left
    ids = list(res.consumed_sample_ids)
    assert len(ids) == len(set(ids))
    assert loop.samples_produced == loop.samples_consumed + loop.samples_left
    # a reward for every step, in [0, 1]
    rows = summary.rows
    assert [r["step"] for r in rows] == list(range(first_step, first_step + steps))
    assert all(0.0 <= r["reward"] <= 1.0 and "loss" in r for r in rows)
    # every consumed sample's weight-version lag within the staleness bound
    assert summary.lags and max(summary.lags) <= lag_bound(runner.config)
    assert all(r["lag_max"] <= lag_bound(runner.config) for r in rows)


async def test_train_two_standalone_two_hybrid(tmp_path: Path, warm_model: Path) -> None:
    config = _config(standalone=2, trainer_gpus=2)
    runner = TrainRunner(
        config,
        _settings(tmp_path, 4),
        RayRunOptions(name="train-e2e"),
        model=warm_model,
        policy=AlwaysSwitchPolicy(),
    )
    summary = await runner.train()
    _check_run(runner, summary, 4)
    res = summary.result
    assert res.loop.activations >= 1 and res.loop.deactivations >= 1
    assert "activate" in res.switches and "deactivate" in res.switches
    # the hybrid replicas generated: some consumed sample came from one of them
    rows = read_metrics(runner.settings.metrics_path)
    assert len(rows) == 4 and rows[1]["is_sync_step"]
    assert "dynamic_resource/resource_utilization" in rows[1]
    # the warmed-up model already earns a reward at the first step
    assert rows[0]["reward"] > 0
    # the engine's logprobs reached the trainer: step 1 is on-policy (version 0 weights)
    assert rows[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    # checkpoints: driver state with the consumed ids, trainer model + optimizer
    ckpt = json.loads((runner.settings.checkpoint_dir / "driver.json").read_text())
    assert ckpt["trainer_state"] == "trainer-v2.pt" and ckpt["param_version"] == 2
    assert sorted(ckpt["consumed_sample_ids"]) == sorted(res.consumed_sample_ids)
    assert "policy" in ckpt["driver"]
    assert (runner.settings.checkpoint_dir / "trainer-v2.pt").is_file()


async def test_mid_cycle_lend_loads_weights_from_the_trainer_gpu(
    tmp_path: Path, warm_model: Path
) -> None:
    """A hybrid replica lent at a step boundary inside a cycle (one of two: partial
    lending) loads the synced copy its own trainer worker keeps, never the driver's."""
    config = _config(standalone=1, trainer_gpus=2)
    policy = PartialMidCyclePolicy()
    runner = TrainRunner(
        config,
        _settings(tmp_path, 4),
        RayRunOptions(name="train-mid-cycle"),
        model=warm_model,
        policy=policy,
    )
    summary = await runner.train()
    _check_run(runner, summary, 4)
    assert runner.loop is not None and runner.loop.driver.mid_cycle_activations >= 1
    assert policy.lent_counts and set(policy.lent_counts) == {1}
    hybrids = [r for r in runner.loop.replicas.of_role("hybrid")]
    loads = [load for h in hybrids for load in h.loads]
    # version 0 is the model folder every replica starts from; every later load (each
    # one a mid-cycle lend: this policy never lends after a sync) is the trainer's copy
    assert any(src == "trainer" for _, src in loads)
    assert all(src == "trainer" for v, src in loads if v > 0), loads
    group = runner.trainer_group
    assert group is not None and group.synced_version == summary.result.loop.steps // 2
    # rank 0 (the standalone replicas' weights) and each worker under a hybrid replica
    assert group._kept_ranks == {0, 1}


async def test_fault_standalone_replica_killed_mid_generation(
    tmp_path: Path, warm_model: Path
) -> None:
    config = _config(standalone=2, trainer_gpus=1)
    runner: TrainRunner | None = None
    tasks: list[asyncio.Task[None]] = []

    async def kill_when_busy() -> None:
        assert runner is not None and runner.fleet is not None
        while not runner.fleet.router.requests_on("standalone-0"):
            await asyncio.sleep(0.001)
        runner.fleet.kill_replica("standalone-0")

    def on_step(row: dict[str, Any]) -> None:
        if row["step"] == 1 and not tasks:
            tasks.append(asyncio.ensure_future(kill_when_busy()))

    runner = TrainRunner(
        config,
        _settings(tmp_path, 4),
        RayRunOptions(name="train-kill-standalone"),
        model=warm_model,
        on_step=on_step,
    )
    summary = await runner.train()
    assert summary.result.dead_replicas == ("standalone-0",)
    _check_run(runner, summary, 4)


async def test_fault_hybrid_replica_killed_during_activation(
    tmp_path: Path, warm_model: Path
) -> None:
    config = _config(standalone=1, trainer_gpus=2)
    runner: TrainRunner | None = None
    activations = collections.Counter[str]()

    def on_transition(tr: Any) -> None:
        if tr.target.name == "ACTIVATING":
            activations["n"] += 1
            if activations["n"] == 2:
                assert runner is not None and runner.fleet is not None
                runner.fleet.kill_replica("hybrid-0")

    runner = TrainRunner(
        config,
        _settings(tmp_path, 6),
        RayRunOptions(name="train-kill-hybrid"),
        model=warm_model,
        policy=AlwaysSwitchPolicy(),
        on_transition=on_transition,
    )
    summary = await runner.train()
    res = summary.result
    assert res.dead_replicas == ("hybrid-0",)
    assert "activate" in res.failed_switches
    tr = list(res.transitions)
    i = tr.index(("ACTIVATING", "STANDALONE_ONLY"))  # the failed activation fell back
    assert ("ACTIVATING", "HYBRID_ACTIVE") in tr[i + 1 :]  # the survivor lends again
    _check_run(runner, summary, 6)


async def test_driver_restart_resumes_with_the_same_next_step(
    tmp_path: Path, warm_model: Path
) -> None:
    """A deterministic configuration (static, one replica, T=1, no staleness): the step
    after a resume equals the uninterrupted run's step, and no sample is lost or trained
    twice over the restart."""
    config = _config(
        standalone=1,
        trainer_gpus=0,
        trigger_parameter_sync_step=1,
        staleness_threshold=0.0,
        dynamic_schedule_policy="static_fully_async",
    )
    saved = tmp_path / "saved"

    def keep_step2_checkpoint(row: dict[str, Any]) -> None:
        # at row 3 the checkpoint on disk is still the one written after step 2
        if row["step"] == 3:
            src = uninterrupted.settings.checkpoint_dir
            dst = saved / "out" / "checkpoint"
            dst.mkdir(parents=True)
            shutil.copy(src / "driver.json", dst / "driver.json")
            shutil.copy(src / "trainer-v2.pt", dst / "trainer-v2.pt")
            # the crashed driver had already written step 3's row: the resume redoes it
            with open(uninterrupted.settings.metrics_path) as fh:
                lines = fh.readlines()[:3]
            (saved / "out" / "metrics.jsonl").write_text("".join(lines))

    uninterrupted = TrainRunner(
        config,
        _settings(tmp_path / "a", 3),
        RayRunOptions(name="train-det-a"),
        model=warm_model,
        on_step=keep_step2_checkpoint,
    )
    full = await uninterrupted.train()
    _check_run(uninterrupted, full, 3)

    resumed = TrainRunner(
        config,
        _settings(saved, 1),
        RayRunOptions(name="train-det-b"),
        model=warm_model,
        resume=True,
    )
    part = await resumed.train()
    assert part.result.resumed and part.result.first_step == 3
    _check_run(resumed, part, 1, first_step=3)
    a, b = full.rows[2], part.rows[0]
    assert b["sample_ids"] == a["sample_ids"]  # the same prompts
    assert b["reward"] == a["reward"]  # the same responses (same weights, same sampling)
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-6, abs=1e-9)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    # the chain: every sample of steps 1-3 consumed once, the curve continues at step 3
    chain = list(part.result.consumed_sample_ids)
    assert len(chain) == len(set(chain)) == 3 * config.required_samples
    assert sorted(chain) == sorted(full.result.consumed_sample_ids)
    assert [r["step"] for r in read_metrics(resumed.settings.metrics_path)] == [1, 2, 3]


def test_task_reward_and_prompts(warm_model: Path) -> None:
    task = AdditionTask(max_operand=9, seed=3)
    assert task.reward("12", "12") == 1.0 and task.reward(" 12 ", "12") == 1.0
    assert task.reward("13", "12") == pytest.approx(0.25)  # one of two positions
    assert task.reward("", "12") == 0.0 and task.reward("99", "12") == 0.0
    assert AdditionTask(partial_credit=False).reward("13", "12") == 0.0
    assert 0 < task.reward("123", "12") < 0.5  # over-long: diluted partial credit
    tok = TaskTokenizer(warm_model)
    a = list(task.prompts(tok, 5, max_tokens=6))
    b = list(task.prompts(tok, 5, max_tokens=6, skip=frozenset({"t1"})))
    assert [p.prompt_id for p in a] == ["t0", "t1", "t2", "t3", "t4"]
    assert [p.prompt_id for p in b] == ["t0", "t2", "t3", "t4"]
    assert a[2] == b[1]  # the same seed gives the same prompts
    for p in a:
        x, y = (int(v) for v in p.metadata["text"].rstrip("=").split("+"))
        assert p.metadata["answer"] == str(x + y) and p.prompt[0] == tok.bos_id
    assert tok.decode_response([*tok.encode_answer("7")]) == "7"


def test_warm_up_is_cached_and_earns_a_reward(tmp_path: Path, warm_model: Path) -> None:
    # the same options reuse the folder (marker), other options rebuild
    again = warm_up(warm_model.parent, AdditionTask(), WarmUpOptions())
    assert again == warm_model
    stamp = (warm_model / "model.safetensors").stat().st_mtime_ns
    assert warm_up(warm_model.parent) == warm_model
    assert (warm_model / "model.safetensors").stat().st_mtime_ns == stamp


async def test_hf_replica_samples_with_logprobs_and_loads_weights(warm_model: Path) -> None:
    import torch
    from dynsched_core import GenerateRequest
    from dynsched_ray.engines.hf.replica import HFReplica
    from safetensors.torch import save

    tok = TaskTokenizer(warm_model)
    rep = HFReplica("s0", model=warm_model, seed=1)
    prompt = tok.encode_prompt("2+3=")
    req = GenerateRequest(request_id="r/0", prompt=prompt, prompt_len=len(prompt), max_tokens=6)
    out = await rep.generate(req)
    again = await rep.generate(req)
    assert out.output_tokens == again.output_tokens  # seeded per request
    assert len(out.output_logprobs) == out.num_tokens > 0
    assert all(lp <= 0 for lp in out.output_logprobs)
    # the logprobs are the model's own
    ids = torch.tensor([[*prompt, *out.output_tokens]])
    with torch.no_grad():
        logp = rep.model(input_ids=ids).logits[0].log_softmax(-1)
    want = [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(out.output_tokens)]
    assert list(out.output_logprobs) == pytest.approx(want, abs=1e-4)
    # a resumed request continues after its partial output
    cont = await rep.generate(
        GenerateRequest(
            request_id="r/1",
            prompt=prompt,
            prompt_len=len(prompt),
            max_tokens=3,
            partial_output=(5, 6),
            partial_len=2,
        )
    )
    assert cont.num_tokens <= 3
    # new weights: zeroed lm_head gives uniform logprobs
    state = {k: v.clone() for k, v in rep.model.state_dict().items()}
    state["lm_head.weight"].zero_()
    await rep.update_weights(7, save(state))
    flat = await rep.generate(GenerateRequest(request_id="r/2", prompt=prompt, max_tokens=2))
    assert flat.param_version == 7
    vocab = rep.model.config.vocab_size
    assert flat.output_logprobs[0] == pytest.approx(-torch.log(torch.tensor(float(vocab))).item())
    # hybrid replicas start asleep; sleep stops serving
    hyb = HFReplica("h0", model=warm_model, role="hybrid")
    from dynsched_core.errors import ReplicaNotReadyError

    with pytest.raises(ReplicaNotReadyError):
        await hyb.generate(req)
    await hyb.wake_up()
    await hyb.resume()
    assert (await hyb.generate(req)).num_tokens > 0
