"""A goodput job: noisy linear regression whose batch the scheduler may change while it runs.

Every step trains on ``ctx.local_batch_size`` fresh examples (so a batch changed in place
by the service applies from the next step) and measures the gradient statistics Pollux's
goodput needs, from micro-batches:

* each rank splits its local batch into ``micro`` micro-batches (at least 2, each at most
  ``max_local`` examples) and computes each one's mean gradient ``g_i`` over its ``n_i``
  examples;
* the ranks sum ``n_i * g_i`` (a vector) and ``n_i * |g_i|**2`` (a number) with
  torch.distributed; with ``N`` examples and ``k`` micro-batches in all, ``G = sum(n_i g_i)
  / N`` is the step's gradient and ``var = (sum(n_i |g_i|**2) - N |G|**2) / (k - 1)`` is an
  unbiased estimate of the variance (trace of the covariance) of one example's gradient;
  ``sqr = |G|**2 - var / N`` estimates the squared norm of the true gradient;
* ``ctx.report(..., grad_sqr=sqr, grad_var=var)`` hands them to the scheduler, and every
  rank applies ``G`` (the same on all ranks: data-parallel SGD without DDP).

The label noise keeps the per-example gradient variance up near the optimum while the
true gradient shrinks, so the gradient noise scale grows as the loss falls: larger batches
become efficient late in training, as in the models Pollux measured.
Submit it with `dynsched optimus submit examples/optimus_jobs/adaptive.yaml`.
"""

from __future__ import annotations

import torch
from dynsched_optimus import jobs


def gradient_stats(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, micro: int, world: int
) -> tuple[float, float, float]:
    """Set the parameters' ``.grad`` to the step's gradient over every rank's examples;
    return ``(loss, grad_sqr, grad_var)`` (see the module docstring)."""
    params = [p for p in model.parameters()]
    total = [torch.zeros_like(p) for p in params]
    sq_sum, loss_sum = 0.0, 0.0
    for xs, ys in zip(torch.tensor_split(x, micro), torch.tensor_split(y, micro), strict=True):
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        grads = torch.autograd.grad(loss, params)
        n = len(xs)
        sq_sum += n * float(sum((g * g).sum() for g in grads))
        loss_sum += n * float(loss.detach())
        for t, g in zip(total, grads, strict=True):
            t += n * g
    counts = torch.tensor([float(len(x)), float(micro), sq_sum, loss_sum], dtype=torch.float64)
    if world > 1:
        import torch.distributed as dist

        for t in total:
            dist.all_reduce(t)
        dist.all_reduce(counts)
    n_all, k_all, sq_all, loss_all = (float(v) for v in counts)
    if k_all < 2:  # one micro-batch in all (a local batch of 1 on one rank)
        raise ValueError("gradient_stats needs >= 2 micro-batches over all ranks, got 1")
    g_sqr = 0.0
    for p, t in zip(params, total, strict=True):
        p.grad = t / n_all
        g_sqr += float((p.grad * p.grad).sum())
    var = max((sq_all - n_all * g_sqr) / (k_all - 1), 0.0)
    return loss_all / n_all, max(g_sqr - var / n_all, 0.0), var


def main() -> None:
    ctx = jobs.context()
    seed = int(ctx.args.get("seed", 0))
    noise = float(ctx.args.get("noise", 0.5))
    max_local = int(ctx.args.get("max_local", 128))
    torch.manual_seed(seed)  # the same teacher and initial parameters on every rank
    teacher = torch.randn(16, 1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=float(ctx.args.get("lr", 0.05)))
    state = ctx.restore()
    step = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
    while not ctx.should_stop():
        step += 1
        local = ctx.local_batch_size  # read every step: the batch may change in place
        g = torch.Generator().manual_seed(seed * 10**6 + step * 1000 + ctx.rank)
        x = torch.randn(local, 16, generator=g)
        y = x @ teacher + noise * torch.randn(local, 1, generator=g)
        micro = max(2, -(-local // max_local))
        opt.zero_grad()
        loss, sqr, var = gradient_stats(model, x, y, min(micro, local), ctx.world_size)
        opt.step()
        ctx.report(step=step, loss=loss, samples=ctx.batch_size, grad_sqr=sqr, grad_var=var)
        if ctx.should_checkpoint():
            ctx.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()})


if __name__ == "__main__":
    main()
