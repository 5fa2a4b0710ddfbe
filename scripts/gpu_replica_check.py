"""GPU check of `VLLMReplica` (run where a GPU is lent; about 3-5 minutes on one GPU).

What it does, on ``--device cuda`` (the default), with the tiny model built locally:

1. Start a `VLLMReplica` on the GPU build (``vllm==0.32.0``, extra ``dynsched-ray[vllm]``);
   greedy outputs against transformers' with the same weights.
2. Weight update: model B's weights as safetensors bytes, timed; the outputs become model
   B's (against transformers); model A's again (as a path) restores A's outputs exactly.
3. Sleep mode, per level (1: weights offloaded to host memory, 2: weights dropped): the
   device memory released by ``sleep`` and taken back by ``wake_up``, measured from the
   driver's free memory (``torch.cuda.mem_get_info``); after waking, the outputs are A's
   again (level 2 reloads the last weights).

``--device cpu`` runs the same steps on the CPU build, where vLLM has no sleep mode: the
replica must then say that no memory was freed. The test suite runs `check_replica` that way
on its shared engine. Prints one JSON document; exits 1 when a check fails, 2 when the
device is missing.

Usage: ``hatch run test:python scripts/gpu_replica_check.py [--device cuda] [--out report.json]``
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

PROMPTS = [[5, 17, 42, 7], [9, 8, 300, 12, 77], [100, 3, 250]]
TOKENS = 12


def _hf_greedy(folder: Path, device: str, state: Any = None) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(  # nosec B615: a local folder, no download
        str(folder), dtype=torch.float32, local_files_only=True
    ).to(device)
    if state is not None:
        model.load_state_dict(state, strict=True)
    out = []
    for ids in PROMPTS:
        with torch.no_grad():
            gen = model.generate(
                torch.tensor([ids], device=device),
                max_new_tokens=TOKENS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=2,
            )
        out.append([int(x) for x in gen[0, len(ids) :]])
    return out


async def _greedy(replica: Any, tag: str) -> list[list[int]]:
    from dynsched_core import GenerateRequest

    out = []
    for i, ids in enumerate(PROMPTS):
        res = await replica.generate(
            GenerateRequest(
                request_id=f"{tag}-{i}",
                prompt=ids,
                prompt_len=len(ids),
                max_tokens=TOKENS,
                temperature=0.0,
                metadata={"sampling": {"ignore_eos": True}},
            )
        )
        out.append(list(res.output_tokens))
    return out


async def check_replica(replica: Any, model_a: Path, model_b: Path, device: str) -> dict[str, Any]:
    """Weight update and sleep checks on a started, serving replica of model A.

    Leaves the replica serving model A's weights (as a path), awake and resumed.
    """
    from safetensors.torch import load

    blob_b = (model_b / "model.safetensors").read_bytes()
    out: dict[str, Any] = {"state_before": _state(replica)}
    a0 = await _greedy(replica, "a0")
    hf_a = _hf_greedy(model_a, device)
    t0 = time.perf_counter()
    version = replica.weights_version + 1
    await replica.update_weights(version, blob_b)
    out["update_bytes_s"] = time.perf_counter() - t0
    out["weights_bytes"] = len(blob_b)
    b1 = await _greedy(replica, "b1")
    hf_b = _hf_greedy(model_a, device, state=load(blob_b))
    t0 = time.perf_counter()
    await replica.update_weights(version + 1, str(model_a / "model.safetensors"))
    out["update_path_s"] = time.perf_counter() - t0
    a2 = await _greedy(replica, "a2")
    checks: dict[str, bool] = {
        "vllm_matches_transformers_model_a": a0 == hf_a,
        "after_update_outputs_are_model_b": b1 == hf_b and b1 != a0,
        "model_a_again_restores_outputs": a2 == a0,
        "version_reported": replica.weights_version == version + 1,
    }
    levels = {}
    for level in (1, 2):
        replica.sleep_level = level
        await replica.sleep()
        asleep = _state(replica)
        await replica.wake_up()
        await replica.resume()
        after = await _greedy(replica, f"wake{level}")
        sleep_rep, wake_rep = replica.sleep_reports[-2], replica.sleep_reports[-1]
        if device == "cuda":
            levels[level] = {
                "freed_bytes": sleep_rep.freed_bytes,
                "taken_back_bytes": None if wake_rep.freed_bytes is None else -wake_rep.freed_bytes,
                "sleep_s": sleep_rep.seconds,
                "wake_s": wake_rep.seconds,
                "state_asleep": asleep,
            }
            checks[f"level{level}_released_memory"] = bool(
                sleep_rep.memory_released and (sleep_rep.freed_bytes or 0) > 0
            )
        else:
            levels[level] = {"report": _plain(sleep_rep), "state_asleep": asleep}
            checks[f"level{level}_cpu_says_nothing_freed"] = (
                sleep_rep.memory_released is False
                and sleep_rep.freed_bytes is None
                and asleep["memory_released"] is False
            )
        checks[f"level{level}_outputs_after_wake_are_model_a"] = after == a0
    replica.sleep_level = 1
    out["sleep"] = levels
    out["checks"] = checks
    return out


def _plain(x: Any) -> Any:
    import attrs

    return attrs.asdict(x) if attrs.has(type(x)) else x


def _state(replica: Any) -> dict[str, Any]:
    return dict(_plain(replica.state()))


async def _run(device: str, model_a: Path, model_b: Path) -> dict[str, Any]:
    from dynsched_ray import VLLMReplica

    replica = VLLMReplica("gpu-replica-check", model=str(model_a), device=device)
    t0 = time.perf_counter()
    await replica.start()
    start_s = time.perf_counter() - t0
    try:
        report = await check_replica(replica, model_a, model_b, device)
    finally:
        await replica.shutdown()
    report["start_s"] = start_s
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    args = parser.parse_args(argv)
    import torch
    from dynsched_ray import TinyModelSpec, build_tiny_model

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device visible; nothing ran"}))
        return 2
    device = "cuda" if args.device.startswith("cuda") else "cpu"
    report: dict[str, Any] = {
        "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "torch": torch.__version__,
    }
    with tempfile.TemporaryDirectory() as tmp:
        model_a = build_tiny_model(Path(tmp) / "a")
        model_b = build_tiny_model(Path(tmp) / "b", TinyModelSpec(seed=1))
        try:
            report["replica"] = asyncio.run(_run(device, model_a, model_b))
        except Exception as exc:  # report, do not hide: counted as a failure below
            report["replica"] = {"error": f"{type(exc).__name__}: {exc}"}
    failed = [n for n, ok in report["replica"].get("checks", {}).items() if not ok]
    if "error" in report["replica"]:
        failed.append("replica.error")
    report["failed"] = failed
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
