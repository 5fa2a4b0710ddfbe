"""A small CNN classifying synthetic 8x8 images (the dynsched optimus job contract).

The label of an image is its brightest quadrant; the student CNN learns it with Adam. Runs on
CPU in seconds; torch DDP (gloo) with several workers. The optional arg
`emulate_gpu_s_per_sample` (default 0: off) sleeps that long per local sample after each
step, an emulated GPU whose time governs the speed (benchmarks/optimus_ray_jobs.py).
"""

from __future__ import annotations

import time

import torch
from dynsched_optimus import jobs


def _student(channels: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, channels, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(channels * 16, 4),
    )


def main() -> None:
    ctx = jobs.context()
    seed = int(ctx.args.get("seed", 0))
    torch.manual_seed(seed)  # the same initial parameters on every rank
    model = _student(int(ctx.args.get("channels", 8)))
    opt = torch.optim.Adam(model.parameters(), lr=float(ctx.args.get("lr", 0.01)))
    # seconds of emulated GPU compute per sample (0: off); the loss stays the real one
    emulate_s = float(ctx.args.get("emulate_gpu_s_per_sample", 0.0))
    state = ctx.restore()
    step = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
    net = torch.nn.parallel.DistributedDataParallel(model) if ctx.world_size > 1 else model
    while not ctx.should_stop():
        step += 1
        g = torch.Generator().manual_seed(
            seed * 10**6 + step * 1000 + ctx.rank
        )  # this rank's shard
        x = torch.randn(ctx.local_batch_size, 1, 8, 8, generator=g)
        y = x.unfold(2, 4, 4).unfold(3, 4, 4).mean(dim=(-1, -2)).flatten(1).argmax(dim=1)
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if emulate_s > 0:  # an emulated GPU's compute time for this worker's samples
            time.sleep(emulate_s * ctx.local_batch_size)
        ctx.report(step=step, loss=loss.item(), samples=ctx.batch_size)
        if ctx.should_checkpoint():
            ctx.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()})


if __name__ == "__main__":
    main()
