"""Ray overhead of the dynamic scheduler: switch cycle and router throughput.

1. One deactivate + activate cycle of 4 hybrid replicas through the core
   `DynamicResourceController`, (a) over Ray actors (`RayReplica` + `RayRouter` proxies)
   and (b) over in-process `InMemoryReplica` + `LoadBalancer` objects, measured in the
   same run; reports both medians and the ratio Ray / in-process.
2. Router throughput through the router actor: requests routed (acquire + release) per
   second, unbatched (one actor call per acquire/release) and batched (the proxy
   coalesces concurrent calls), plus the in-process `LoadBalancer` as the baseline.

Usage: ``hatch run test:python benchmarks/ray_switch_and_router.py [--cycles 20] [--requests 2000]
[--out result.json]``. Starts a local Ray cluster (4 CPUs, 8 bookkeeping GPUs) unless
``--address`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import ray
from dynsched_core import (
    ControllerOptions,
    DynamicResourceController,
    InMemoryReplica,
    LoadBalancer,
    ReplicaSet,
)
from dynsched_ray import FleetSpec, RayFleet, RayRouter, RouterActor, remote_class

HYBRID = 4


async def _cycles(ctrl: DynamicResourceController, cycles: int) -> list[float]:
    out = []
    for version in range(1, cycles + 1):
        t0 = time.perf_counter()
        await ctrl.deactivate()
        await ctrl.activate(version)
        out.append(time.perf_counter() - t0)
    return out


async def bench_switch(cycles: int) -> dict[str, Any]:
    # in-process baseline
    hybrid = [InMemoryReplica(f"hybrid-{i}", role="hybrid") for i in range(HYBRID)]
    members = ReplicaSet(standalone=[InMemoryReplica("standalone-0")], hybrid=hybrid)
    await members.route(["standalone-0"])
    ctrl = DynamicResourceController(members)
    await ctrl.activate(0)
    local = await _cycles(ctrl, cycles)

    spec = FleetSpec(
        name="bench-switch",
        trainer_gpus=HYBRID,
        standalone_replicas=1,
        trainer_workers=0,
        batch_router_calls=False,
    )
    fleet = await RayFleet.launch(spec)
    try:
        members = ReplicaSet(fleet.router, standalone=fleet.standalone, hybrid=fleet.hybrid)
        await members.route(members.standalone_ids)
        ctrl = DynamicResourceController(members, ControllerOptions(call_timeout_s=60))
        await ctrl.activate(0)
        await _cycles(ctrl, 2)  # warm-up
        remote = await _cycles(ctrl, cycles)
    finally:
        fleet.shutdown()
    lm, rm = statistics.median(local), statistics.median(remote)
    return {
        "hybrid_replicas": HYBRID,
        "cycles": cycles,
        "in_process_median_s": lm,
        "ray_median_s": rm,
        "ray_p90_s": sorted(remote)[int(0.9 * (len(remote) - 1))],
        "ratio_ray_over_in_process": rm / lm if lm > 0 else float("inf"),
    }


async def _route(router: Any, n: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            rid = await router.acquire(f"r{i}")
            await router.release(f"r{i}", rid)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - t0)


async def bench_router(requests: int, concurrency: int) -> dict[str, Any]:
    ids = [f"replica-{i}" for i in range(8)]
    local = await _route(LoadBalancer(ids), requests, concurrency)
    handle = remote_class(RouterActor).options(num_cpus=0).remote(ids)
    try:
        unbatched_router = RayRouter(handle, batch=False)
        await unbatched_router.refresh()
        await _route(unbatched_router, 100, concurrency)  # warm-up
        unbatched = await _route(unbatched_router, requests, concurrency)
        batched_router = RayRouter(handle, batch=True)
        await batched_router.refresh()
        await _route(batched_router, 100, concurrency)
        batched = await _route(batched_router, requests, concurrency)
        # explicit batches: acquire_many / release_many
        t0 = time.perf_counter()
        done = 0
        while done < requests:
            names = [f"b{done + i}" for i in range(min(256, requests - done))]
            chosen = await batched_router.acquire_many(names)
            await batched_router.release_many(
                [(n, c) for n, c in zip(names, chosen, strict=True) if c is not None]
            )
            done += len(names)
        explicit = requests / (time.perf_counter() - t0)
        calls = {"unbatched": unbatched_router.calls, "batched": batched_router.calls}
    finally:
        ray.kill(handle)
    return {
        "requests": requests,
        "concurrency": concurrency,
        "in_process_per_s": local,
        "ray_unbatched_per_s": unbatched,
        "ray_batched_per_s": batched,
        "ray_acquire_many_256_per_s": explicit,
        "batched_over_unbatched": batched / unbatched,
        "actor_calls": calls,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "switch_cycle": await bench_switch(args.cycles),
        "router_throughput": await bench_router(args.requests, args.concurrency),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--address", default=None, help="join this Ray cluster instead")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    if args.address:  # token authentication on, as `dynsched run --address` joins
        from dynsched_ray.runtime.security import init_ray, plan_ray_start

        init_ray(ray, plan_ray_start(args.address), namespace=None, prog="benchmark")
    else:
        ray.init(
            num_cpus=4,
            num_gpus=8,
            include_dashboard=False,
            object_store_memory=200 * 1024 * 1024,
            log_to_driver=False,
        )
    try:
        res = asyncio.run(main_async(args))
    finally:
        ray.shutdown()
    sw, rt = res["switch_cycle"], res["router_throughput"]
    print(
        f"deactivate+activate cycle of {sw['hybrid_replicas']} hybrid replicas ({sw['cycles']} cycles, median):"
    )
    print(f"  in-process objects : {sw['in_process_median_s'] * 1e3:9.3f} ms")
    print(
        f"  Ray actors         : {sw['ray_median_s'] * 1e3:9.3f} ms (p90 {sw['ray_p90_s'] * 1e3:.3f} ms)"
    )
    print(f"  ratio Ray/in-proc  : {sw['ratio_ray_over_in_process']:9.1f} x")
    print(f"router throughput ({rt['requests']} acquire+release, concurrency {rt['concurrency']}):")
    print(f"  in-process LoadBalancer : {rt['in_process_per_s']:12.0f} req/s")
    print(f"  router actor, unbatched : {rt['ray_unbatched_per_s']:12.0f} req/s")
    print(
        f"  router actor, batched   : {rt['ray_batched_per_s']:12.0f} req/s"
        f" ({rt['batched_over_unbatched']:.1f}x unbatched)"
    )
    print(f"  acquire_many(256)       : {rt['ray_acquire_many_256_per_s']:12.0f} req/s")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
