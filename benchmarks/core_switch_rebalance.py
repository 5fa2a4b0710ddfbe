"""Rebalance cost and reference-loop overhead, as ratios against baselines run alongside.

1. Rebalance after activating hybrid replicas: dynsched's excess-only rebalance versus the
   published one (clear sticky sessions, abort every in-flight request on every replica).
   Measured on in-memory replicas on a virtual-time loop: requests moved, tokens
   re-prefilled (counted by the retrying client) and the in-flight spread afterwards.
2. Real-time cost of the reference loop with dynamic scheduling (driver, controller,
   switches every cycle) versus the same loop with scheduling off, both on virtual time.
   (In-memory replicas have no batch limit, so no virtual speed-up is expected here;
   throughput effects are the simulator's subject.)

Usage: ``hatch run python benchmarks/core_switch_rebalance.py [--out FILE.json] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import selectors
import time
from collections.abc import Sequence
from typing import Any

from dynsched_core import (
    DynamicResourceController,
    DynamicScheduleConfig,
    DynamicSchedulePolicyBase,
    FullyAsyncLoop,
    GenerateRequest,
    InMemoryReplica,
    Prompt,
    ReplicaSet,
    RetryingClient,
)


class _VirtualSelector:
    def __init__(self, loop: VirtualTimeLoop, inner: selectors.BaseSelector) -> None:
        self._loop, self._inner = loop, inner

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise RuntimeError("virtual-time loop deadlock")
        self._loop.vtime += max(timeout, 0.0)
        return self._inner.select(0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self.vtime = 0.0
        self._selector = _VirtualSelector(self, self._selector)  # type: ignore[has-type]

    def time(self) -> float:
        return self.vtime


def run_virtual(coro: Any) -> Any:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


# --------------------------------------------------------------------------- 1. rebalance
async def rebalance_scenario(
    mode: str, per_replica: int, standalone: int, hybrid: int
) -> dict[str, float]:
    replicas = {
        f"s{i}": InMemoryReplica(f"s{i}", tokens_per_s=50.0, chunk_tokens=4)
        for i in range(standalone)
    }
    hyb = [
        InMemoryReplica(f"h{i}", role="hybrid", tokens_per_s=50.0, chunk_tokens=4)
        for i in range(hybrid)
    ]
    members = ReplicaSet(standalone=list(replicas.values()), hybrid=hyb)
    replicas.update({h.replica_id: h for h in hyb})
    await members.route(members.standalone_ids)
    router = members.router
    client = RetryingClient(members)
    ctrl = DynamicResourceController(members)
    tasks = [
        asyncio.create_task(
            client.generate(GenerateRequest(request_id=f"r{i}", prompt_len=512, max_tokens=400))
        )
        for i in range(per_replica * standalone)
    ]
    await asyncio.sleep(2.0)  # ~100 tokens into every response
    await ctrl.activate(1, rebalance=(mode == "excess"))
    if mode == "abort_all":  # the published rebalance
        await router.clear_sticky()
        for rid in await router.routable():
            await replicas[rid].abort(None)
    await asyncio.sleep(0.5)
    spread = await router.in_flight_counts()
    await asyncio.gather(*tasks)
    moved = ctrl.last_rebalance.moved if ctrl.last_rebalance else client.total_aborts
    return {
        "moved": float(moved),
        "reprefill_tokens": float(client.total_reprefill_tokens),
        "max_in_flight_after": float(max(spread.values())),
        "min_in_flight_after": float(min(spread.values())),
    }


# --------------------------------------------------------------------------- 2. loop cost
class AlwaysActivate(DynamicSchedulePolicyBase):
    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: Any) -> int:
        return ctx.required_samples  # type: ignore[no-any-return]

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        return True


class Trainer:
    def __init__(self, standalone: Sequence[InMemoryReplica]) -> None:
        self.standalone = standalone

    async def train_step(self, samples: Sequence[Any]) -> dict[str, float]:
        await asyncio.sleep(1.0)
        return {"update_actor": 1.0}

    async def sync_weights(self, version: int) -> None:
        for r in self.standalone:
            await r.update_weights(version)


def loop_run(dynamic: bool, steps: int) -> tuple[float, float, int]:
    cfg = DynamicScheduleConfig(
        use_dynamic_resource_scheduling=dynamic,
        ppo_mini_batch_size=8,
        trigger_parameter_sync_step=2,
        staleness_threshold=0.5,
        n=4,
        concurrent_samples_per_replica=4,
    )
    standalone = [InMemoryReplica(f"s{i}", tokens_per_s=10.0, chunk_tokens=16) for i in range(4)]
    hybrid = [
        InMemoryReplica(f"h{i}", role="hybrid", tokens_per_s=10.0, chunk_tokens=16)
        for i in range(4)
    ]
    prompts = [
        Prompt(prompt_id=f"p{i}", max_tokens=128, target_lens=(32, 64, 96, 128))
        for i in range(100_000)
    ]
    fa = FullyAsyncLoop.build(
        cfg,
        AlwaysActivate(),
        Trainer(standalone),
        prompts=prompts,
        standalone=standalone,
        hybrid=hybrid,
    )
    t0 = time.perf_counter()
    result = run_virtual(fa.run(num_steps=steps))
    return time.perf_counter() - t0, result.duration_s, result.activations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    out: dict[str, Any] = {}

    print("1. rebalance after activation (2 standalone x 16 in flight, +2 hybrid)")
    excess = run_virtual(rebalance_scenario("excess", 16, 2, 2))
    abort_all = run_virtual(rebalance_scenario("abort_all", 16, 2, 2))
    for name, row in (("dynsched excess-only", excess), ("published abort-all", abort_all)):
        print(
            f"   {name:22s} moved={row['moved']:5.0f} reprefill={row['reprefill_tokens']:8.0f} "
            f"in-flight after: {row['min_in_flight_after']:.0f}..{row['max_in_flight_after']:.0f}"
        )
    ratio = excess["reprefill_tokens"] / max(abort_all["reprefill_tokens"], 1.0)
    print(f"   re-prefill tokens, excess-only / abort-all = {ratio:.2f}")
    out["rebalance"] = {"excess": excess, "abort_all": abort_all, "reprefill_ratio": ratio}

    steps = 20 if args.quick else 80
    print(f"2. reference loop, {steps} micro-steps on virtual time")
    dyn_real, dyn_virtual, acts = loop_run(True, steps)
    static_real, static_virtual, _ = loop_run(False, steps)
    print(f"   dynamic: {dyn_real:.2f} s real for {dyn_virtual:.0f} s virtual ({acts} activations)")
    print(f"   static:  {static_real:.2f} s real for {static_virtual:.0f} s virtual")
    print(f"   real-time cost dynamic / static = {dyn_real / static_real:.2f}")
    out["loop"] = {
        "steps": steps,
        "dynamic_real_s": dyn_real,
        "static_real_s": static_real,
        "dynamic_virtual_s": dyn_virtual,
        "static_virtual_s": static_virtual,
        "activations": acts,
    }
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
