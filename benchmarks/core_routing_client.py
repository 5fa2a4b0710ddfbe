"""Overhead of the core routing layer, as ratios against baselines measured in the same run.

1. ``LoadBalancer`` acquire+release (leases, sticky LRU, exclusion) versus a bare
   least-loaded dict router (same O(replicas) scan, no leases, no stickiness).
2. ``RetryingClient.generate`` over in-memory replicas versus calling
   ``replica.generate`` directly (same replicas, same requests).

Usage: ``hatch run python benchmarks/core_routing_client.py [--out FILE.json] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable

from dynsched_core import (
    GenerateRequest,
    InMemoryReplica,
    LoadBalancer,
    ReplicaSet,
    RetryingClient,
)


class BareRouter:
    """Baseline: least in-flight by counter, ties by id; nothing else."""

    def __init__(self, ids: list[str]) -> None:
        self.load = dict.fromkeys(ids, 0)

    def acquire(self) -> str:
        rid = min(self.load, key=lambda r: (self.load[r], r))
        self.load[rid] += 1
        return rid

    def release(self, rid: str) -> None:
        self.load[rid] -= 1


def best_of(fn: Callable[[], None], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_router(n_replicas: int, ops: int) -> dict[str, float]:
    ids = [f"r{i:04d}" for i in range(n_replicas)]
    window = 4 * n_replicas  # requests kept in flight

    def run_lb() -> None:
        lb = LoadBalancer(ids, sticky_capacity=10 * window)
        live: list[tuple[str, str]] = []
        for i in range(ops):
            req = f"q{i}"
            live.append((req, lb.acquire_nowait(req)))
            if len(live) > window:
                lb.release_nowait(*live.pop(0))

    def run_bare() -> None:
        br = BareRouter(ids)
        live: list[str] = []
        for _ in range(ops):
            live.append(br.acquire())
            if len(live) > window:
                br.release(live.pop(0))

    t_lb = best_of(run_lb)
    t_bare = best_of(run_bare)
    return {
        "replicas": n_replicas,
        "ops": ops,
        "lb_us_per_op": 1e6 * t_lb / ops,
        "bare_us_per_op": 1e6 * t_bare / ops,
        "ratio": t_lb / t_bare,
    }


def bench_client(n_requests: int) -> dict[str, float]:
    ids = ["a", "b", "c", "d"]

    async def direct() -> None:
        reps = {i: InMemoryReplica(i, tokens_per_s=1e12, chunk_tokens=64) for i in ids}
        await asyncio.gather(
            *(
                reps[ids[k % 4]].generate(GenerateRequest(request_id=f"q{k}", max_tokens=16))
                for k in range(n_requests)
            )
        )

    async def via_client() -> None:
        reps = {i: InMemoryReplica(i, tokens_per_s=1e12, chunk_tokens=64) for i in ids}
        replicas = ReplicaSet(standalone=list(reps.values()))
        await replicas.route(ids)
        client = RetryingClient(replicas)
        await asyncio.gather(
            *(
                client.generate(GenerateRequest(request_id=f"q{k}", max_tokens=16))
                for k in range(n_requests)
            )
        )

    t_direct = best_of(lambda: asyncio.run(direct()), repeat=3)
    t_client = best_of(lambda: asyncio.run(via_client()), repeat=3)
    return {
        "requests": n_requests,
        "direct_us_per_request": 1e6 * t_direct / n_requests,
        "client_us_per_request": 1e6 * t_client / n_requests,
        "ratio": t_client / t_direct,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None, help="write results as JSON here")
    parser.add_argument("--quick", action="store_true", help="fewer operations")
    args = parser.parse_args()
    ops = 5_000 if args.quick else 50_000
    results: dict[str, list[dict[str, float]]] = {"router": [], "client": []}
    print(f"{'replicas':>8} {'LoadBalancer us/op':>19} {'bare us/op':>11} {'ratio':>6}")
    for n in (4, 32, 256):
        r = bench_router(n, ops if n < 256 else ops // 5)
        results["router"].append(r)
        print(
            f"{r['replicas']:>8} {r['lb_us_per_op']:>19.2f} {r['bare_us_per_op']:>11.2f}"
            f" {r['ratio']:>6.2f}"
        )
    c = bench_client(500 if args.quick else 5_000)
    results["client"].append(c)
    print(
        f"\nRetryingClient: {c['client_us_per_request']:.1f} us/request vs direct replica call"
        f" {c['direct_us_per_request']:.1f} us/request (ratio {c['ratio']:.2f})"
    )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
