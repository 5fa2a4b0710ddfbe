"""GPU check of the FSDP trainer and of an SGLang engine (run where a GPU is lent; ~3 min).

Neither runs fully on this project's CPU machines: the FSDP trainer does (gloo), but its
offload only moves bytes on a GPU; SGLang does not start on CPU here (see
``packages/dynsched-ray/src/dynsched_ray/engines/sglang/README.md`` for the exact error).

What it does, on ``--device cuda`` (the default):

1. ``FSDPTrainer`` (FSDP2 ``fully_shard``, NCCL, a one-rank group: one GPU): one RL step
   compared with the unsharded ``TorchTrainer`` on the same batch (loss, gradient norm,
   exported weights); offload and reload with the device memory measured by the
   allocator; the step after the round trip compared bit for bit with a twin that never
   offloaded; a checkpoint saved and loaded with ``torch.load(weights_only=True)``.
2. SGLang (``sglang.Engine``, when the ``sglang`` package is importable): start on the
   tiny model, greedy generation, ``release_memory_occupation`` / ``resume_memory_occupation``
   with the free device memory measured (``torch.cuda.mem_get_info``), generation after
   the resume equal to before, and ``update_weights_from_tensor`` with the FSDP trainer's
   exported weights. Reported as skipped, with the reason, where sglang is missing.

``--device cpu --skip-sglang`` runs part 1 on CPU (gloo; no allocator figures): the test
suite runs it that way. Prints one JSON document; exits 1 when a check fails, 2 when the
device is missing.

Usage: ``python scripts/gpu_fsdp_sglang_check.py [--device cuda] [--out report.json]``
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")

PROMPTS = [[5, 17, 42, 7], [9, 8, 300, 12, 77]]


def _batch(vocab: int) -> Any:
    """The RL batch of ``gpu_trainer_check.py`` (the sibling script, loaded by path)."""
    import importlib.util

    path = Path(__file__).resolve().with_name("gpu_trainer_check.py")
    spec = importlib.util.spec_from_file_location("gpu_trainer_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._batch(vocab)


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    if a.keys() != b.keys():
        return math.inf
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _weights(trainer: Any) -> dict[str, Any]:
    return {k: t.clone() for k, t in trainer.export_weights()[1].items()}


def _allocated(device: str) -> int | None:
    import torch

    return torch.cuda.memory_allocated() if device.startswith("cuda") else None


def _offload_figures(trainer: Any, device: str) -> tuple[dict[str, Any], Any, Any]:
    before = _allocated(device)
    off = trainer.offload()
    offloaded = _allocated(device)
    rel = trainer.reload()
    figures = {
        "device_bytes_before": off.before.device_bytes,
        "device_bytes_after": off.after.device_bytes,
        "moved_bytes": off.moved_bytes,
        "offload_seconds": off.seconds,
        "reload_seconds": rel.seconds,
        "allocator_before": before,
        "allocator_after_offload": offloaded,
        "allocator_after_reload": _allocated(device),
    }
    return figures, off, rel


def check_fsdp(folder: Path, device: str) -> dict[str, Any]:
    """FSDP step vs the unsharded trainer, offload/reload, bit identity, checkpoint."""
    import torch
    from dynsched_ray.trainers.base import TrainerOptions
    from dynsched_ray.trainers.fsdp import FSDPTrainer
    from dynsched_ray.trainers.torch.trainer import TorchTrainer

    options = TrainerOptions(lr=1e-4, device=device, ppo_mini_batch_size=2)
    batch = _batch(512)
    ref, trainer, twin = (cls(folder, options) for cls in (TorchTrainer, FSDPTrainer, FSDPTrainer))
    want, first = ref.train_step(batch), trainer.train_step(batch)
    twin.train_step(batch)
    out: dict[str, Any] = {"device": device, "world_size": trainer.world_size}
    out["first_step"] = first.as_dict()
    out["loss_diff_vs_unsharded"] = abs(first.loss - want.loss)
    out["grad_norm_diff_vs_unsharded"] = abs(first.grad_norm - want.grad_norm)
    out["weights_max_diff_vs_unsharded"] = _max_diff(_weights(trainer), _weights(ref))
    out["offload"], off, rel = _offload_figures(trainer, device)
    a, b = trainer.train_step(batch), twin.train_step(batch)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fsdp.pt"
        t0 = time.perf_counter()
        torch.save(trainer.state_dict(), path)
        state = torch.load(path, map_location="cpu", weights_only=True)
        twin.load_state_dict(state)
        out["checkpoint_seconds"] = time.perf_counter() - t0
    c, d = trainer.train_step(batch), twin.train_step(batch)
    checks = {
        "step_close_to_unsharded": out["loss_diff_vs_unsharded"] <= 1e-4
        and out["grad_norm_diff_vs_unsharded"] <= 1e-3 * max(1.0, want.grad_norm),
        "offload_empties_device": off.after.device_bytes == 0,
        "reload_restores_bytes": rel.after.device_bytes == off.before.device_bytes,
        "step_after_round_trip_bit_identical": a.loss == b.loss
        and _max_diff(_weights(trainer), _weights(twin)) == 0.0,
        "checkpoint_round_trip_bit_identical": c.loss == d.loss,
    }
    fig = out["offload"]
    if fig["allocator_before"] is not None:
        released = fig["allocator_before"] - fig["allocator_after_offload"]
        checks["allocator_released_trainer_bytes"] = released >= 0.9 * off.before.device_bytes
    out["checks"] = checks
    out["exported"] = _weights(trainer)  # for the SGLang check; dropped from the report
    return out


def _sglang_generate(engine: Any) -> list[list[int]]:
    outs = engine.generate(
        input_ids=PROMPTS,
        sampling_params={"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True},
    )
    return [list(o["output_ids"]) for o in outs]


def _free_bytes() -> int:
    import torch

    return int(torch.cuda.mem_get_info()[0])


def check_sglang(folder: Path, weights: dict[str, Any], backend: str) -> dict[str, Any]:
    """SGLang engine: start, generate, release/resume memory, update weights."""
    try:
        import sglang
    except Exception as exc:  # missing or broken install: say so, run nothing
        return {"skipped": f"sglang is not importable: {type(exc).__name__}: {exc}"}
    t0 = time.perf_counter()
    engine = sglang.Engine(
        model_path=str(folder),
        attention_backend=backend,
        mem_fraction_static=0.2,
        enable_memory_saver=True,
        disable_cuda_graph=True,
        skip_server_warmup=True,
        random_seed=0,
        log_level="error",
    )
    out: dict[str, Any] = {"sglang": sglang.__version__, "start_seconds": time.perf_counter() - t0}
    try:
        before = _sglang_generate(engine)
        free0 = _free_bytes()
        t0 = time.perf_counter()
        engine.release_memory_occupation()
        out["release_seconds"] = time.perf_counter() - t0
        free1 = _free_bytes()
        t0 = time.perf_counter()
        engine.resume_memory_occupation()
        out["resume_seconds"] = time.perf_counter() - t0
        again = _sglang_generate(engine)
        t0 = time.perf_counter()
        engine.update_weights_from_tensor(named_tensors=list(weights.items()))
        out["update_seconds"] = time.perf_counter() - t0
        after = _sglang_generate(engine)
    finally:
        engine.shutdown()
    out["released_bytes"] = free1 - free0
    out["weights_changed_the_output"] = after != before
    out["checks"] = {
        "generated_tokens": all(len(x) == 12 for x in before),
        "release_frees_memory": free1 - free0 > 0,
        "same_output_after_resume": again == before,
    }
    return out


def _run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from dynsched_ray.task.tiny_model import TinyModelSpec, build_tiny_model

    report: dict[str, Any] = {
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "torch": torch.__version__,
    }
    with tempfile.TemporaryDirectory() as tmp:
        # head_dim 64: what every SGLang attention backend takes
        spec = TinyModelSpec(hidden_size=256, intermediate_size=512)
        folder = Path(args.model) if args.model else build_tiny_model(Path(tmp) / "tiny", spec)
        fsdp = check_fsdp(folder, args.device)
        weights = fsdp.pop("exported")
        report["fsdp"] = fsdp
        if args.skip_sglang:
            report["sglang"] = {"skipped": "--skip-sglang"}
        else:
            try:
                report["sglang"] = check_sglang(folder, weights, args.attention_backend)
            except Exception as exc:  # report, do not hide: counted as a failure below
                report["sglang"] = {"error": f"{type(exc).__name__}: {exc}"}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--skip-sglang", action="store_true", help="skip the SGLang check")
    parser.add_argument("--attention-backend", default="triton", help="SGLang attention kernels")
    parser.add_argument("--model", default=None, help="model folder (default: build a tiny one)")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    args = parser.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device visible; nothing ran"}))
        return 2
    report = _run(args)
    failed = [
        f"{part}.{name}"
        for part in ("fsdp", "sglang")
        for name, ok in report[part].get("checks", {}).items()
        if not ok
    ]
    if "error" in report["sglang"]:
        failed.append("sglang.error")
    report["failed"] = failed
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
