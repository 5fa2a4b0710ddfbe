"""Trainers: offload/reload time against bytes moved, and the trainer interface's overhead.

For `TorchTrainer` and `MegatronTrainer` (CPU by default, ``--device cuda`` on a GPU):

1. **Offload / reload.** After one training step (so AdamW state exists) the trainer's
   parameters, gradients and optimizer state are offloaded and reloaded ``--repeats``
   times, at two model sizes. Reported: bytes moved, median seconds, GB/s, and the ratio
   to a baseline measured in the same run: one plain copy of the same number of bytes
   each way into a pre-allocated flat buffer (CPU: host to host; CUDA: device to pinned
   host and back), i.e. the memory-bandwidth floor; offload allocates its destination,
   the baseline does not.
2. **Step overhead.** ``trainer.train_step(batch)`` against the same step written by hand
   without the trainer interface: the same model object, the same pre-packed tensors,
   forward, the same loss, backward, gradient clipping and the optimizer step. The
   difference is what the interface adds (advantages, packing, metrics, chunking).

Every figure is the median over ``--repeats`` runs with min and max; ratios are of
medians. Usage: ``hatch run test:python benchmarks/trainers_offload_overhead.py [--out F]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from dynsched_core.trainer import TrainBatch, TrainResponse
from dynsched_ray import (
    MegatronTrainer,
    TinyModelSpec,
    TorchTrainer,
    TrainerOptions,
    build_tiny_model,
)
from dynsched_ray.task.objective import (
    batch_advantages,
    pack_responses,
    policy_loss,
    token_logprobs,
)

warnings.filterwarnings("ignore")

SIZES = {
    # judgement: the CI model and a 4x wider, 2x deeper one (about 16x the bytes)
    "tiny (h128, 2 layers)": TinyModelSpec(),
    "small (h256, 4 layers)": TinyModelSpec(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
    ),
}


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def _timed(fn: Callable[[], Any], repeats: int, device: torch.device) -> list[float]:
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out.append(time.perf_counter() - t0)
    return out


def _batch(groups: int, n: int, vocab: int, seed: int = 0) -> TrainBatch:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for g in range(groups):
        prompt = torch.randint(3, vocab, (16,), generator=gen).tolist()
        for j in range(n):
            resp = torch.randint(3, vocab, (32 + 4 * j,), generator=gen).tolist()
            lp = (-torch.rand(len(resp), generator=gen) * 4 - 2).tolist()
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


def _copy_baseline(nbytes: int, device: torch.device) -> Callable[[], None]:
    n = nbytes // 4
    if device.type == "cuda":
        src = torch.empty(n, dtype=torch.float32, device=device)
        host = torch.empty(n, dtype=torch.float32, pin_memory=True)

        def both() -> None:
            host.copy_(src, non_blocking=True)
            src.copy_(host, non_blocking=True)

        return both
    src = torch.rand(n)
    dst = torch.zeros(n)  # pre-allocated and touched: a pure memory copy, the floor

    def both_cpu() -> None:
        dst.copy_(src)
        src.copy_(dst)

    return both_cpu


def _hand_step(trainer: Any, batch: TrainBatch) -> Callable[[], None]:
    """The same step without the trainer interface (pre-packed tensors)."""
    obj = trainer.options.objective
    adv = batch_advantages(batch, obj)
    packed = pack_responses(batch.responses, adv, pad_id=trainer.pad_token_id).to(trainer.device)
    params = trainer._params()
    opt = trainer.optimizer

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        logits = trainer._logits(packed.input_ids)
        logp = token_logprobs(logits, packed.input_ids)
        loss, _ = policy_loss(logp, packed.rollout_logprobs, packed.advantages, packed.loss_mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, trainer.options.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    options = TrainerOptions(lr=1e-5, device=args.device)
    results: dict[str, Any] = {"device": str(device), "repeats": args.repeats, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        print(f"device {device}, {args.repeats} repeats (median [min-max])")
        print(
            f"{'trainer':<9} {'model':<23} {'MB moved':>8} {'offload ms':>18} "
            f"{'reload ms':>18} {'GB/s':>6} {'vs copy':>7}"
        )
        for size, spec in SIZES.items():
            folder = build_tiny_model(Path(tmp) / size.split()[0], spec)
            batch = _batch(4, 4, spec.vocab_size)
            for kind, cls in (("torch", TorchTrainer), ("megatron", MegatronTrainer)):
                trainer = cls(folder, options)
                trainer.train_step(batch)
                offs, rels, copy, moved = [], [], [], 0
                baseline = None
                for _ in range(args.repeats):  # interleaved: machine noise hits all alike
                    off = trainer.offload()
                    rel = trainer.reload()
                    offs.append(off.seconds)
                    rels.append(rel.seconds)
                    moved = off.moved_bytes
                    assert off.after.device_bytes == 0
                    if baseline is None:
                        baseline = _copy_baseline(moved, device)
                    copy += _timed(baseline, 1, device)
                total = statistics.median(offs) + statistics.median(rels)
                gbps = 2 * moved / total / 1e9
                ratio = total / statistics.median(copy)
                row = {
                    "trainer": kind,
                    "model": size,
                    "bytes_moved": moved,
                    "offload_s": _stats(offs),
                    "reload_s": _stats(rels),
                    "copy_baseline_s": _stats(copy),
                    "gb_per_s": gbps,
                    "ratio_to_copy": ratio,
                }
                o, r = row["offload_s"], row["reload_s"]
                print(
                    f"{kind:<9} {size:<23} {moved / 1e6:>8.1f} "
                    f"{o['median'] * 1e3:>6.2f} [{o['min'] * 1e3:.2f}-{o['max'] * 1e3:.2f}] "
                    f"{r['median'] * 1e3:>6.2f} [{r['min'] * 1e3:.2f}-{r['max'] * 1e3:.2f}] "
                    f"{gbps:>6.2f} {ratio:>6.2f}x"
                )
                results["rows"].append(row)
                del trainer
        print()
        print(
            f"{'trainer':<9} {'model':<23} {'train_step ms':>22} {'hand-written ms':>22} {'overhead':>8}"
        )
        folder = Path(tmp) / "tiny"
        batch = _batch(4, 4, TinyModelSpec().vocab_size)
        for kind, cls in (("torch", TorchTrainer), ("megatron", MegatronTrainer)):
            trainer = cls(folder, options)
            hand = _hand_step(trainer, batch)
            hand()
            trainer.train_step(batch)  # warm-up both
            # interleave so machine noise hits both alike
            t_iface, t_hand = [], []
            for _ in range(args.repeats):
                t_iface += _timed(lambda t=trainer: t.train_step(batch), 1, device)
                t_hand += _timed(hand, 1, device)
            a, b = _stats(t_iface), _stats(t_hand)
            over = a["median"] / b["median"] - 1.0
            print(
                f"{kind:<9} {'tiny (h128, 2 layers)':<23} "
                f"{a['median'] * 1e3:>8.1f} [{a['min'] * 1e3:.1f}-{a['max'] * 1e3:.1f}] "
                f"{b['median'] * 1e3:>8.1f} [{b['min'] * 1e3:.1f}-{b['max'] * 1e3:.1f}] "
                f"{over * 100:>+7.1f}%"
            )
            results["rows"].append(
                {"trainer": kind, "train_step_s": a, "hand_step_s": b, "overhead": over}
            )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
