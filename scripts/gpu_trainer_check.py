"""GPU check of the trainers (run where a GPU is lent; about 3-5 minutes on one GPU).

What it does, on ``--device cuda`` (the default):

1. ``MegatronTrainer``: one RL step with Megatron's own DDP and optimizer
   (``get_megatron_optimizer``); offload and reload with the device memory measured by the
   allocator (``torch.cuda.memory_allocated``) and by the trainer's own accounting; the
   step after the round trip compared bit for bit with a twin trainer that never
   offloaded.
2. ``TorchTrainer``: the same offload/reload/bit-identity check.
3. Weight export into a GPU vLLM replica (``VLLMReplica``, from the replica issue): the
   trained weights, as safetensors bytes, change the replica's greedy output exactly as
   the same weights do in ``transformers``. Skipped, with the reason printed, where
   ``VLLMReplica`` is not available.

``--device cpu`` runs the same checks on CPU (Megatron through its CPU substitutes; no
allocator figures); the test suite runs it that way with ``--skip-vllm``. Prints one JSON
document; exits 1 when a check fails, 2 when the device is missing.

Usage: ``hatch run test:python scripts/gpu_trainer_check.py [--device cuda] [--out report.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")


def _batch(vocab: int, groups: int = 4, n: int = 4, seed: int = 0) -> Any:
    import torch
    from dynsched_core.trainer import TrainBatch, TrainResponse

    gen = torch.Generator().manual_seed(seed)
    out = []
    for g in range(groups):
        prompt = torch.randint(3, vocab, (8,), generator=gen).tolist()
        for j in range(n):
            resp = torch.randint(3, vocab, (16 + 2 * j,), generator=gen).tolist()
            lp = (-torch.rand(len(resp), generator=gen) * 3 - 3).tolist()
            out.append(
                TrainResponse(
                    prompt_ids=prompt,
                    response_ids=resp,
                    logprobs=lp,
                    reward=float((g + j) % 3),
                    group_id=g,
                )
            )
    return TrainBatch(responses=out)


def _equal_weights(a: Any, b: Any) -> bool:
    _, wa = a.export_weights()
    _, wb = b.export_weights()
    return wa.keys() == wb.keys() and all(bool((wa[k] == wb[k]).all()) for k in wa)


def check_trainer(kind: str, folder: Path, device: str) -> dict[str, Any]:
    """Step, offload/reload with memory measured, bit-identity against a twin."""
    import torch
    from dynsched_ray import MegatronTrainer, TorchTrainer, TrainerOptions

    cls = MegatronTrainer if kind == "megatron" else TorchTrainer
    options = TrainerOptions(lr=1e-4, device=device, ppo_mini_batch_size=2)
    batch = _batch(512)
    twin, trainer = cls(folder, options), cls(folder, options)
    out: dict[str, Any] = {"trainer": kind, "device": device}
    if kind == "megatron":
        out["megatron_optimizer"] = type(getattr(trainer, "_megatron_opt", None)).__name__
        out["cpu_substitutes"] = list(trainer.cpu_substitutes)
    first = trainer.train_step(batch)
    twin.train_step(batch)
    out["first_step"] = first.as_dict()

    def allocated() -> int | None:
        return torch.cuda.memory_allocated() if device.startswith("cuda") else None

    alloc_before = allocated()
    off = trainer.offload()
    alloc_offloaded = allocated()
    rel = trainer.reload()
    alloc_reloaded = allocated()
    out["offload"] = {
        "device_bytes_before": off.before.device_bytes,
        "device_bytes_after": off.after.device_bytes,
        "host_bytes_after": off.after.host_bytes,
        "moved_bytes": off.moved_bytes,
        "seconds": off.seconds,
        "allocator_before": alloc_before,
        "allocator_after_offload": alloc_offloaded,
        "allocator_after_reload": alloc_reloaded,
        "allocator_released": None
        if alloc_before is None or alloc_offloaded is None
        else alloc_before - alloc_offloaded,
    }
    out["reload"] = {"moved_bytes": rel.moved_bytes, "seconds": rel.seconds}
    a, b = trainer.train_step(batch), twin.train_step(batch)
    checks = {
        "offload_empties_device": off.after.device_bytes == 0,
        "reload_restores_bytes": rel.after.device_bytes == off.before.device_bytes,
        "step_after_round_trip_bit_identical": a.loss == b.loss and _equal_weights(trainer, twin),
        "loss_finite": all(
            x == x and abs(x) != float("inf") for x in (first.loss, a.loss, first.grad_norm)
        ),
    }
    if alloc_before is not None and alloc_offloaded is not None:
        # the allocator must see (nearly) all of the trainer's bytes go
        checks["allocator_released_trainer_bytes"] = (
            alloc_before - alloc_offloaded >= 0.9 * off.before.device_bytes
        )
    out["checks"] = checks
    return out


async def _vllm_check(folder: Path, device: str) -> dict[str, Any]:
    import torch
    from dynsched_core import GenerateRequest
    from dynsched_ray import TorchTrainer, TrainerOptions
    from safetensors.torch import load
    from transformers import AutoModelForCausalLM

    try:
        from dynsched_ray import VLLMReplica
    except ImportError as exc:
        return {"skipped": f"VLLMReplica is not available on this branch ({exc})"}

    prompts = [[5, 17, 42, 7], [9, 8, 300, 12, 77]]
    trainer = TorchTrainer(folder, TrainerOptions(lr=1e-2, device=device))
    for _ in range(3):
        trainer.train_step(_batch(512))
    version, blob = trainer.export_weights(as_bytes=True)

    hf = AutoModelForCausalLM.from_pretrained(  # nosec B615: a local folder, no download
        str(folder), dtype=torch.float32, local_files_only=True
    ).to(device)

    def hf_greedy(ids: list[int]) -> list[int]:
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([ids], device=device),
                max_new_tokens=12,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=2,
            )
        return [int(x) for x in out[0, len(ids) :]]

    replica = VLLMReplica(
        "gpu-check", model=str(folder), sampling={"temperature": 0.0, "ignore_eos": True}
    )
    await replica.start()
    try:

        async def vllm_greedy(tag: str) -> list[list[int]]:
            res = []
            for i, ids in enumerate(prompts):
                r = await replica.generate(
                    GenerateRequest(
                        request_id=f"{tag}-{i}", prompt=ids, prompt_len=len(ids), max_tokens=12
                    )
                )
                res.append(list(r.output_tokens))
            return res

        before = await vllm_greedy("before")
        hf_before = [hf_greedy(p) for p in prompts]
        t0 = time.perf_counter()
        await replica.update_weights(version, blob)
        update_s = time.perf_counter() - t0
        after = await vllm_greedy("after")
        hf.load_state_dict(load(blob), strict=True)
        hf_after = [hf_greedy(p) for p in prompts]
    finally:
        await replica.shutdown()
    return {
        "update_seconds": update_s,
        "weights_bytes": len(blob),
        "checks": {
            "vllm_matches_transformers_before": before == hf_before,
            "vllm_matches_transformers_after": after == hf_after,
            "weights_changed_the_output": after != before,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--skip-vllm", action="store_true", help="skip the vLLM export check")
    parser.add_argument("--model", default=None, help="model folder (default: build the tiny one)")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    args = parser.parse_args(argv)
    import torch
    from dynsched_ray import build_tiny_model

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device visible; nothing ran"}))
        return 2
    report: dict[str, Any] = {
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "torch": torch.__version__,
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.model) if args.model else build_tiny_model(Path(tmp) / "tiny")
        report["megatron"] = check_trainer("megatron", folder, args.device)
        report["torch"] = check_trainer("torch", folder, args.device)
        if args.skip_vllm:
            report["vllm"] = {"skipped": "--skip-vllm"}
        else:
            try:
                report["vllm"] = asyncio.run(_vllm_check(folder, args.device))
            except Exception as exc:  # report, do not hide: counted as a failure below
                report["vllm"] = {"error": f"{type(exc).__name__}: {exc}"}
    failed = [
        f"{part}.{name}"
        for part in ("megatron", "torch", "vllm")
        for name, ok in report[part].get("checks", {}).items()
        if not ok
    ]
    if "error" in report["vllm"]:
        failed.append("vllm.error")
    report["failed"] = failed
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
