"""A parameter-server job through torch's RPC framework (CPU, TensorPipe).

Rank 0 hosts the parameter server (the model and its optimizer); every rank, rank 0
included, is a worker: it fetches the parameters by RPC, computes the gradient of a linear
regression on its shard of synthetic data and pushes it back, and the server applies each
gradient as it arrives (asynchronous, as the Optimus paper's MXNet PS jobs). The job
contract's ``report`` keeps the ranks in step and agrees when to stop; rank 0 checkpoints
the server's state. The scheduler still counts the job's workers only (no PS tasks).
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
from dynsched_optimus import jobs
from ps_server import ParameterServer, fetch, push, start


def _node_address() -> str:
    """This node's address as Ray knows it (the host name's address outside Ray)."""
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # not in a Ray worker, or no Ray
        return socket.gethostbyname(socket.gethostname())


def _rpc_address(ctx: jobs.JobContext) -> tuple[str, int]:
    """Rank 0's address and a free port, shared with the others over the job's group."""
    box: list[object] = [None]
    if ctx.rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        box = [(_node_address() if ctx.world_size > 1 else "127.0.0.1", port)]
    if ctx.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    host, port = box[0]  # type: ignore[misc]
    return str(host), int(port)


def main() -> None:
    ctx = jobs.context()
    dim, seed = 8, int(ctx.args.get("seed", 0))
    true_w = torch.randn(dim, 1, generator=torch.Generator().manual_seed(seed))
    state = ctx.restore()
    step = 0 if state is None else int(state["step"])
    server: ParameterServer | None = None
    if ctx.rank == 0:
        server = start(dim, float(ctx.args.get("lr", 0.02)), state)
    host, port = _rpc_address(ctx)
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://{host}:{port}", rpc_timeout=60)
    rpc.init_rpc(
        f"worker{ctx.rank}", rank=ctx.rank, world_size=ctx.world_size, rpc_backend_options=opts
    )
    try:
        while not ctx.should_stop():
            step += 1
            g = torch.Generator().manual_seed(seed * 10**6 + step * 1000 + ctx.rank)
            x = torch.randn(ctx.local_batch_size, dim, generator=g)
            w = rpc.rpc_sync("worker0", fetch).requires_grad_()
            loss = torch.nn.functional.mse_loss(x @ w, x @ true_w)
            loss.backward()
            rpc.rpc_sync("worker0", push, args=(w.grad,))
            ctx.report(step=step, loss=loss.item(), samples=ctx.batch_size)
            if ctx.should_checkpoint():
                ctx.save({"step": step, **({} if server is None else server.state())})
    finally:
        rpc.shutdown()


if __name__ == "__main__":
    main()
