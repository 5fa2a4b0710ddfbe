"""TorchTrainer and MegatronTrainer on CPU: training, offload/reload, export, checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from dynsched_core.trainer import TrainBatch, Trainer
from dynsched_ray import (
    LlamaShape,
    MegatronTrainer,
    TorchTrainer,
    TrainerOffloadedError,
    TrainerOptions,
    hf_llama_to_megatron,
    megatron_to_hf_llama,
)
from dynsched_ray.trainers.base import Offloader, hf_model_folder
from hypothesis import given
from hypothesis import strategies as st

# a large learning rate so a few steps move the tiny model visibly
OPTIONS = TrainerOptions(lr=1e-3, ppo_mini_batch_size=2)
KINDS = {"torch": TorchTrainer, "megatron": MegatronTrainer}


def _new(kind: str, folder: Path, options: TrainerOptions = OPTIONS) -> Any:
    return KINDS[kind](folder, options)


def _weights(trainer: Any) -> dict[str, torch.Tensor]:
    _, w = trainer.export_weights()
    return dict(w)


def _assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("kind", ["torch", "megatron"])
def test_offload_reload_step_is_bit_identical(
    kind: str, tiny_model_dir: Path, rl_batch: TrainBatch
) -> None:
    plain, moved = _new(kind, tiny_model_dir), _new(kind, tiny_model_dir)
    assert isinstance(plain, Trainer)
    for t in (plain, moved):
        t.train_step(rl_batch)  # AdamW state exists from here on
    resident = moved.memory()
    off = moved.offload()
    # everything it held on the "device" went to host memory, nothing stayed
    assert off.before.device_bytes == resident.device_bytes > 0
    assert off.after.device_bytes == 0
    assert off.after.host_bytes == off.moved_bytes == resident.device_bytes
    assert moved.is_offloaded and moved.offload().moved_bytes == 0  # idempotent
    with pytest.raises(TrainerOffloadedError, match="reload"):
        moved.train_step(rl_batch)
    with pytest.raises(TrainerOffloadedError):
        moved.load_state_dict(plain.state_dict())
    # export and checkpoint still work from the host copies
    _assert_bitwise_equal(_weights(moved), _weights(plain))
    back = moved.reload()
    assert back.after.device_bytes == resident.device_bytes and back.after.host_bytes == 0
    m1, m2 = plain.train_step(rl_batch), moved.train_step(rl_batch)
    assert (m1.loss, m1.grad_norm, m1.version) == (m2.loss, m2.grad_norm, m2.version)
    _assert_bitwise_equal(_weights(plain), _weights(moved))
    # AdamW state too: a third step stays identical
    assert plain.train_step(rl_batch).loss == moved.train_step(rl_batch).loss


@pytest.mark.parametrize("kind", ["torch", "megatron"])
def test_training_steps_reduce_the_loss_on_a_fixed_batch(
    kind: str, tiny_model_dir: Path, rl_batch: TrainBatch
) -> None:
    trainer = _new(kind, tiny_model_dir)
    losses = [trainer.train_step(rl_batch).loss for _ in range(4)]
    assert losses[-1] < losses[0] - 0.05, losses
    first = trainer.train_step(rl_batch)
    assert first.version == 5 and first.num_tokens == rl_batch.num_response_tokens
    assert first.ratio_mean > 1.0 and 0 < first.clip_fraction <= 1  # moved off-policy
    assert first.compute_s > 0 and first.staleness == 0


def test_state_dict_round_trip_continues_identically(
    tiny_model_dir: Path, rl_batch: TrainBatch
) -> None:
    a, b = _new("torch", tiny_model_dir), _new("torch", tiny_model_dir)
    a.train_step(rl_batch)
    state = a.state_dict()
    b.load_state_dict(state)
    assert b.version == 1
    assert a.train_step(rl_batch).loss == b.train_step(rl_batch).loss
    _assert_bitwise_equal(_weights(a), _weights(b))
    with pytest.raises(ValueError, match="MegatronTrainer"):
        _new("megatron", tiny_model_dir).load_state_dict(state)


def test_megatron_checkpoint_round_trip(tiny_model_dir: Path, rl_batch: TrainBatch) -> None:
    a, b = _new("megatron", tiny_model_dir), _new("megatron", tiny_model_dir)
    a.train_step(rl_batch)
    b.load_state_dict(a.state_dict())
    assert a.train_step(rl_batch).loss == b.train_step(rl_batch).loss


def test_mini_batch_accumulation_matches_the_whole_batch(
    tiny_model_dir: Path, rl_batch: TrainBatch
) -> None:
    grads: dict[str, list[torch.Tensor]] = {}

    def record(name: str, trainer: Any) -> None:
        step = trainer.optimizer.step

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            grads[name] = [p.grad.clone() for p in trainer.model.parameters()]
            return step(*args, **kwargs)

        trainer.optimizer.step = wrapped

    whole = _new("torch", tiny_model_dir, TrainerOptions(lr=1e-3, max_grad_norm=1e9))
    one = _new(
        "torch", tiny_model_dir, TrainerOptions(lr=1e-3, max_grad_norm=1e9, ppo_mini_batch_size=1)
    )
    record("whole", whole)
    record("one", one)
    mw, m1 = whole.train_step(rl_batch), one.train_step(rl_batch)
    assert m1.loss == pytest.approx(mw.loss, abs=1e-6)
    assert m1.grad_norm == pytest.approx(mw.grad_norm, rel=1e-5)
    # the gradient accumulated over 4 mini-batches (one group each) is the whole batch's
    for gw, g1 in zip(grads["whole"], grads["one"], strict=True):
        assert torch.allclose(gw, g1, atol=1e-7, rtol=1e-4)


def test_exported_weights_give_the_trainers_logits_in_transformers(
    tiny_model_dir: Path, rl_batch: TrainBatch
) -> None:
    from safetensors.torch import load
    from transformers import AutoModelForCausalLM

    ids = torch.tensor(
        [list(rl_batch.responses[0].prompt_ids + rl_batch.responses[0].response_ids)]
    )
    for kind in ("torch", "megatron"):
        trainer = _new(kind, tiny_model_dir)
        trainer.train_step(rl_batch)
        version, blob = trainer.export_weights(as_bytes=True)
        assert version == 1 and isinstance(blob, bytes)
        hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
        hf.load_state_dict(load(blob), strict=True)
        with torch.no_grad():
            expected = hf(ids).logits
        got = trainer.logits(ids)
        if kind == "torch":
            assert torch.equal(got, expected)
        else:  # Megatron's kernels differ from transformers' only by float rounding
            assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()


def test_megatron_forward_equals_transformers_on_converted_weights(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    trainer = _new("megatron", tiny_model_dir)
    assert trainer.cpu_substitutes and "gloo" in trainer.cpu_substitutes[0]
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    ids = torch.randint(3, 512, (3, 21), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
    assert torch.allclose(trainer.logits(ids), expected, atol=1e-5, rtol=0)
    # the loaded weights are the folder's, exactly (conversion is a permutation)
    _assert_bitwise_equal(_weights(trainer), {k: v for k, v in hf.state_dict().items()})


def test_megatron_and_torch_trainers_take_the_same_step(
    tiny_model_dir: Path, rl_batch: TrainBatch
) -> None:
    a, b = _new("torch", tiny_model_dir), _new("megatron", tiny_model_dir)
    for _ in range(2):
        ma, mb = a.train_step(rl_batch), b.train_step(rl_batch)
        assert mb.loss == pytest.approx(ma.loss, abs=1e-5)
        assert mb.grad_norm == pytest.approx(ma.grad_norm, rel=1e-4)


@given(
    st.integers(1, 3),
    st.sampled_from([(4, 1), (4, 2), (4, 4), (6, 3)]),
    st.integers(1, 3),
    st.integers(0, 1000),
)
def test_conversion_round_trips_exactly(
    layers: int, heads: tuple[int, int], hd: int, seed: int
) -> None:
    nh, nkv = heads
    shape = LlamaShape(
        num_layers=layers,
        hidden_size=8,
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=hd,
        intermediate_size=5,
        vocab_size=11,
    )
    gen = torch.Generator().manual_seed(seed)
    hf: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(11, 8, generator=gen),
        "model.norm.weight": torch.randn(8, generator=gen),
        "lm_head.weight": torch.randn(11, 8, generator=gen),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        hf |= {
            p + "input_layernorm.weight": torch.randn(8, generator=gen),
            p + "post_attention_layernorm.weight": torch.randn(8, generator=gen),
            p + "self_attn.q_proj.weight": torch.randn(nh * hd, 8, generator=gen),
            p + "self_attn.k_proj.weight": torch.randn(nkv * hd, 8, generator=gen),
            p + "self_attn.v_proj.weight": torch.randn(nkv * hd, 8, generator=gen),
            p + "self_attn.o_proj.weight": torch.randn(8, nh * hd, generator=gen),
            p + "mlp.gate_proj.weight": torch.randn(5, 8, generator=gen),
            p + "mlp.up_proj.weight": torch.randn(5, 8, generator=gen),
            p + "mlp.down_proj.weight": torch.randn(8, 5, generator=gen),
        }
    mg = hf_llama_to_megatron(hf, shape)
    assert len(mg) == 3 + 6 * layers
    qkv = mg["decoder.layers.0.self_attention.linear_qkv.weight"].reshape(nkv, nh // nkv + 2, hd, 8)
    # group g holds query heads g*q..(g+1)*q-1, then its key head, then its value head
    q = hf["model.layers.0.self_attn.q_proj.weight"].reshape(nh, hd, 8)
    assert torch.equal(qkv[0, 0], q[0])
    assert torch.equal(
        qkv[-1, -2], hf["model.layers.0.self_attn.k_proj.weight"].reshape(nkv, hd, 8)[-1]
    )
    back = megatron_to_hf_llama({"module." + k: v for k, v in mg.items()}, shape)
    _assert_bitwise_equal(back, hf)


def test_bad_options_and_inputs_are_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ppo_mini_batch_size"):
        TrainerOptions(ppo_mini_batch_size=0)
    with pytest.raises(ValueError, match="lr"):
        TrainerOptions(lr=0)
    with pytest.raises(ValueError, match="device"):
        TrainerOptions(device="tpu").resolve_device()
    with pytest.raises(ValueError, match="CUDA"):
        TrainerOptions(device="cuda").resolve_device()
    with pytest.raises(FileNotFoundError, match="config.json"):
        TorchTrainer(tmp_path)
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        LlamaShape.from_hf_config(
            {
                "model_type": "llama",
                "tie_word_embeddings": True,
                "num_attention_heads": 4,
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "intermediate_size": 4,
                "vocab_size": 4,
            }
        )
    trainer = _new("torch", tiny_model_dir)
    with pytest.raises(TypeError, match="TrainBatch"):
        trainer.train_step([1, 2, 3])


def test_readme_trainers_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    readme = Path(__file__).resolve().parents[1] / "README.md"
    section = readme.read_text(encoding="utf-8").split("## Trainers", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {"__name__": "readme"}
    exec(compile(block.group(1), str(readme), "exec"), scope)
    assert scope["metrics"].staleness == 1 and scope["metrics"].num_tokens == 3
    assert scope["report"].after.device_bytes == 0
    assert scope["version"] == 1 and isinstance(scope["blob"], bytes)


async def test_reference_loop_drives_a_real_trainer_through_the_hand_over(
    tiny_model_dir: Path,
) -> None:
    """The core's in-process loop trains a TorchTrainer; the hybrid wakes only after it offloads."""
    from dynsched_core import (
        DynamicScheduleConfig,
        FullyAsyncLoop,
        InMemoryReplica,
        Prompt,
    )
    from dynsched_core.trainer import (
        GpuHandOver,
        HandOverReplica,
        TrainerLoopBackend,
        TrainResponse,
    )

    from ._policies import AlwaysSwitchPolicy

    def make_batch(samples: Any, version: int) -> TrainBatch:
        # the in-memory engine reports no logprobs: stand in uniform ones
        return TrainBatch(
            responses=[
                TrainResponse(
                    prompt_ids=s.prompt.prompt,
                    response_ids=[3 + t % 500 for t in o.output_tokens],
                    logprobs=[-6.0] * len(o.output_tokens),
                    reward=float(k),
                    group_id=s.sample_id,
                    versions=o.param_versions,
                )
                for s in samples
                for k, o in enumerate(s.responses)
            ],
            version=version,
        )

    config = DynamicScheduleConfig.from_dict(
        {
            "async_training": {
                "use_dynamic_resource_scheduling": True,
                "trigger_parameter_sync_step": 1,
                "staleness_threshold": 0.5,
            },
            "trainer": {"nnodes": 1, "n_gpus_per_node": 1},
            "rollout": {"nnodes": 1, "n_gpus_per_node": 1},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2}, "rollout": {"n": 2}},
        }
    )
    standalone = {"s0": InMemoryReplica("s0", tokens_per_s=3000.0)}
    handover = GpuHandOver()
    trainer = TorchTrainer(tiny_model_dir, OPTIONS)
    backend = TrainerLoopBackend(trainer, make_batch, standalone, as_bytes=True, handover=handover)
    hybrid = HandOverReplica(
        InMemoryReplica("h0", role="hybrid", tokens_per_s=3000.0),
        handover,
        [0],
        before_wake=backend.release,
    )
    prompts = [
        Prompt(
            prompt_id=f"p{i}", prompt=[5 + i, 6, 7], prompt_len=3, max_tokens=8, target_lens=(4, 6)
        )
        for i in range(40)
    ]
    loop = FullyAsyncLoop.build(
        config,
        AlwaysSwitchPolicy(),
        backend,
        prompts=prompts,
        standalone=standalone,
        hybrid={"h0": hybrid},
        wait_timeout_s=60.0,
    )
    result = await loop.run(3)
    assert result.steps == 3 and result.activations >= 2
    assert [m.version for m in backend.metrics] == [1, 2, 3] and trainer.version == 3
    log = [e for e, _ in handover.log]
    for i, e in enumerate(log):
        trainer_events = [x for x in log[:i] if x.startswith("trainer_")]
        if e.startswith("hybrid_waking"):
            assert trainer_events and trainer_events[-1] == "trainer_offloaded", log
    assert "trainer_reloading" in log and backend.offloads


class _Counting(Offloader):
    """An `Offloader` whose moves are counted (each moves 10 bytes)."""

    def __init__(self) -> None:
        self.moves: list[str] = []

    def _offload(self) -> int:
        self.moves.append("offload")
        return 10

    def _reload(self) -> int:
        self.moves.append("reload")
        return 10


@given(st.lists(st.sampled_from(["offload", "reload"]), max_size=12))
def test_every_offloader_moves_once_each_way(calls: list[str]) -> None:
    off = _Counting()
    expected: list[str] = []
    for call in calls:
        due = (call == "offload") != off.offloaded
        assert getattr(off, call)() == (10 if due else 0)
        expected += [call] if due else []
        assert off.offloaded is (expected[-1:] == ["offload"])
    assert off.moves == expected


def test_the_trainers_name_themselves_and_the_folder_they_need(tmp_path: Path) -> None:
    with pytest.raises(
        FileNotFoundError,
        match=r"^TorchTrainer model must be a Hugging Face model folder with config.json, got",
    ):
        TorchTrainer(tmp_path)
    with pytest.raises(
        FileNotFoundError, match=r"^MegatronTrainer model must be a Hugging Face Llama folder"
    ):
        MegatronTrainer(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert hf_model_folder(str(tmp_path), "X") == tmp_path


def test_the_options_build_the_trainers_adamw() -> None:
    opts = TrainerOptions(lr=2e-3, betas=(0.8, 0.9), adam_eps=1e-6, weight_decay=0.5)
    group = opts.adamw([torch.nn.Parameter(torch.zeros(2))]).param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (
        2e-3,
        (0.8, 0.9),
        1e-6,
        0.5,
    )
