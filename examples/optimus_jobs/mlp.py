"""A tiny MLP regression job on synthetic data (the dynsched optimus job contract).

A fixed random "teacher" network labels Gaussian inputs; the student MLP learns it with
Adam. Runs on CPU in seconds; with several workers, torch DDP (gloo) averages gradients.
The optional arg `emulate_gpu_s_per_sample` (default 0: off) sleeps that long per local
sample after each step, an emulated GPU whose time governs the speed (the loss stays the
real one; benchmarks/optimus_ray_jobs.py turns it on).
Submit it with `dynsched optimus submit examples/optimus_jobs/mlp.yaml`.
"""

from __future__ import annotations

import time

import torch
from dynsched_optimus import jobs


def main() -> None:
    ctx = jobs.context()
    hidden = int(ctx.args.get("hidden", 64))
    seed = int(ctx.args.get("seed", 0))
    torch.manual_seed(seed)  # the same initial parameters on every rank
    teacher = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    model = torch.nn.Sequential(
        torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
    )
    opt = torch.optim.Adam(model.parameters(), lr=float(ctx.args.get("lr", 3e-3)))
    # seconds of emulated GPU compute per sample (0: off); the loss stays the real one
    emulate_s = float(ctx.args.get("emulate_gpu_s_per_sample", 0.0))
    state = ctx.restore()
    step = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
    net = model
    if ctx.world_size > 1:
        net = torch.nn.parallel.DistributedDataParallel(model)
    while not ctx.should_stop():
        step += 1
        g = torch.Generator().manual_seed(
            seed * 10**6 + step * 1000 + ctx.rank
        )  # this rank's shard
        x = torch.randn(ctx.local_batch_size, 16, generator=g)
        with torch.no_grad():
            y = teacher(x)
        loss = torch.nn.functional.mse_loss(net(x), y)
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
