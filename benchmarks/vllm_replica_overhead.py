"""vLLM replicas: adapter + actor overhead, one switch cycle, weight update against size.

On the real vLLM build installed (the CPU build in CI; the GPU build where lent):

1. **Adapter + actor overhead.** Generated tokens per second of a batch of concurrent
   greedy requests sent from the driver through `VLLMReplica` hosted by a Ray
   `ReplicaActor` (``RayReplica.generate``), against the *same engine* called directly
   (``AsyncLLM.generate`` with the same sampling parameters) inside that actor, in the
   same run, rounds interleaved. Overhead = ``1 - actor_tps / direct_tps`` (target <= 10%).
2. **Switch cycle.** One deactivate + activate (with a weight update from bytes) of a
   hybrid vLLM replica beside a standalone one, driven by `DynamicResourceController`
   through Ray actors; requests are in flight at each deactivation.
3. **Weight update against model size.** ``update_weights(version, safetensors bytes)``
   on engines of three model sizes (in process), against the bytes delivered.

Each figure: median over ``--rounds`` with min and max. Judgement parameters: batch of 16
requests of 64 tokens, tiny-model sizes below. Usage:
``hatch run test:python benchmarks/vllm_replica_overhead.py [--rounds N] [--out F]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")

BATCH = 16  # judgement: concurrent requests per round
TOKENS = 64  # judgement: tokens per request
SIZES = {  # judgement: the CI model and two wider/deeper ones
    "tiny (h128, 2 layers)": {},
    "small (h256, 4 layers)": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
    "medium (h512, 6 layers)": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 6,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
    },
}


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def _prompts() -> list[list[int]]:
    return [[3 + (i * 37) % 500, 3 + (i * 91) % 500, 3 + (i * 13) % 500, 42] for i in range(BATCH)]


def _bench_actor_class() -> Any:
    from dynsched_ray import ReplicaActor

    class BenchReplicaActor(ReplicaActor):
        """`ReplicaActor` plus the baseline: the hosted engine called directly."""

        async def direct(
            self, prompts: list[list[int]], tokens: int, tag: str
        ) -> tuple[int, float]:
            from vllm import SamplingParams
            from vllm.sampling_params import RequestOutputKind

            replica = await self._ready()
            engine = replica._engine
            params = SamplingParams(
                max_tokens=tokens,
                temperature=0.0,
                logprobs=0,
                ignore_eos=True,
                output_kind=RequestOutputKind.DELTA,
            )

            async def one(i: int, ids: list[int]) -> int:
                n = 0
                async for out in engine.generate(
                    {"prompt_token_ids": ids}, params, request_id=f"{tag}-{i}"
                ):
                    n += len(out.outputs[0].token_ids)
                return n

            t0 = time.perf_counter()
            counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
            return sum(counts), time.perf_counter() - t0

    return BenchReplicaActor


async def overhead(folder: Path, rounds: int) -> dict[str, Any]:
    import ray
    from dynsched_core import GenerateRequest
    from dynsched_ray import RayReplica, remote_class
    from dynsched_ray.engines.vllm.replica import VLLMReplica

    handle = (
        remote_class(_bench_actor_class())
        .options(num_cpus=0)
        .remote(VLLMReplica, ("bench",), {"model": str(folder)}, 16)
    )
    proxy = await RayReplica.connect(handle, timeout_s=900, generate_timeout_s=600)
    prompts = _prompts()

    async def via_actor(tag: str) -> tuple[int, float]:
        t0 = time.perf_counter()
        res = await asyncio.gather(
            *(
                proxy.generate(
                    GenerateRequest(
                        request_id=f"{tag}-{i}",
                        prompt=p,
                        prompt_len=len(p),
                        max_tokens=TOKENS,
                        temperature=0.0,
                        metadata={"sampling": {"ignore_eos": True}},
                    )
                )
                for i, p in enumerate(prompts)
            )
        )
        return sum(r.num_tokens for r in res), time.perf_counter() - t0

    await via_actor("warm")
    await handle.direct.remote(prompts, TOKENS, "warm-direct")
    actor_tps, direct_tps, actor_s, direct_s = [], [], [], []
    for k in range(rounds):  # interleaved, alternating which goes first
        order = ("actor", "direct") if k % 2 == 0 else ("direct", "actor")
        for which in order:
            if which == "actor":
                n, s = await via_actor(f"a{k}")
                actor_tps.append(n / s)
                actor_s.append(s)
            else:
                n, s = await handle.direct.remote(prompts, TOKENS, f"d{k}")
                direct_tps.append(n / s)
                direct_s.append(s)
    await handle.shutdown.remote()
    ray.kill(handle, no_restart=True)
    a, d = statistics.median(actor_tps), statistics.median(direct_tps)
    return {
        "batch": BATCH,
        "tokens": TOKENS,
        "actor_tokens_per_s": _stats(actor_tps),
        "direct_tokens_per_s": _stats(direct_tps),
        "overhead": 1.0 - a / d,
        "per_round_overhead": [1.0 - x / y for x, y in zip(actor_tps, direct_tps, strict=True)],
        # the adapter + actor cost per round of BATCH concurrent requests, in seconds
        "added_s_per_round": statistics.median(actor_s) - statistics.median(direct_s),
        "direct_round_s": _stats(direct_s),
    }


async def _until_in_flight(proxy: Any, timeout_s: float = 120.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if await proxy.in_flight() > 0:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("no request reached the hybrid replica")


async def switch_cycle(folder: Path, rounds: int) -> dict[str, Any]:
    import ray
    from dynsched_core import (
        ControllerOptions,
        DynamicResourceController,
        GenerateRequest,
        LoadBalancer,
        ReplicaSet,
        RetryingClient,
    )
    from dynsched_ray import RayReplica, ReplicaActor, remote_class
    from dynsched_ray.engines.vllm.replica import VLLMReplica

    handles = {
        rid: remote_class(ReplicaActor)
        .options(num_cpus=0)
        .remote(VLLMReplica, (rid,), {"model": str(folder), "role": role}, 8)
        for rid, role in (("s0", "standalone"), ("h0", "hybrid"))
    }
    proxies = {
        rid: await RayReplica.connect(h, timeout_s=900, call_timeout_s=120, stream=True)
        for rid, h in handles.items()
    }
    rs = ReplicaSet(LoadBalancer(), standalone=[proxies["s0"]], hybrid=[proxies["h0"]])
    await rs.route(["s0"])
    ctrl = DynamicResourceController(rs, ControllerOptions(call_timeout_s=120))
    client = RetryingClient(rs)
    weights = (folder / "model.safetensors").read_bytes()
    deact, act = [], []
    prompts = _prompts()
    for k in range(rounds + 1):
        t0 = time.perf_counter()
        await ctrl.activate(k + 1, weights)
        t1 = time.perf_counter()
        tasks = [
            asyncio.create_task(
                client.generate(
                    GenerateRequest(
                        request_id=f"c{k}-{i}", prompt=p, prompt_len=len(p), max_tokens=TOKENS
                    )
                )
            )
            for i, p in enumerate(prompts[:8])
        ]
        await _until_in_flight(proxies["h0"])
        t2 = time.perf_counter()
        await ctrl.deactivate()
        t3 = time.perf_counter()
        await asyncio.gather(*tasks)
        if k:  # the first cycle wakes the engine for the first time: warm-up
            act.append(t1 - t0)
            deact.append(t3 - t2)
    for h in handles.values():
        await h.shutdown.remote()
        ray.kill(h, no_restart=True)
    cycle = [a + d for a, d in zip(act, deact, strict=True)]
    return {
        "weights_bytes": len(weights),
        "activate_s": _stats(act),
        "deactivate_s": _stats(deact),
        "cycle_s": _stats(cycle),
        "note": "on CPU, sleep frees nothing (no vLLM sleep mode): the cycle is routing,"
        " abort, the weight update and the actor round trips",
    }


async def weight_update(tmp: Path, rounds: int, sizes: int) -> list[dict[str, Any]]:
    from dynsched_ray import TinyModelSpec, build_tiny_model
    from dynsched_ray.engines.vllm.replica import VLLMReplica

    rows = []
    for name, kw in list(SIZES.items())[:sizes]:
        folder = build_tiny_model(tmp / name.split()[0], TinyModelSpec(**kw))
        blob = (folder / "model.safetensors").read_bytes()
        replica = VLLMReplica(name.split()[0], model=folder)
        await replica.start()
        try:
            secs = []
            for k in range(rounds + 1):
                t0 = time.perf_counter()
                await replica.update_weights(k + 1, blob)
                if k:
                    secs.append(time.perf_counter() - t0)
        finally:
            await replica.shutdown()
        med = statistics.median(secs)
        rows.append(
            {
                "model": name,
                "bytes": len(blob),
                "update_s": _stats(secs),
                "mb_per_s": len(blob) / med / 1e6,
            }
        )
        print(
            f"  {name:<24} {len(blob) / 1e6:8.1f} MB  {med * 1e3:8.1f} ms  "
            f"[{min(secs) * 1e3:.1f}-{max(secs) * 1e3:.1f}]  {len(blob) / med / 1e6:7.1f} MB/s",
            flush=True,
        )
    return rows


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from dynsched_ray import TinyModelSpec, build_tiny_model

    ray.init(
        address="local",  # a new local cluster, never another process's
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    results: dict[str, Any] = {"rounds": args.rounds}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = build_tiny_model(Path(tmp) / "tiny")
            if "overhead" in args.parts:
                print("1. adapter + actor overhead", flush=True)
                results["overhead_by_model"] = {}
                for name, kw in SIZES.items():
                    short = name.split()[0]
                    if short not in args.overhead_models:
                        continue
                    where = folder if short == "tiny" else Path(tmp) / f"o-{short}"
                    if short != "tiny":
                        build_tiny_model(where, TinyModelSpec(**kw))
                    o = await overhead(where, args.rounds)
                    results["overhead_by_model"][name] = o
                    if short == "tiny":
                        results["overhead"] = o
                    print(
                        f"  {name:<24} direct {o['direct_tokens_per_s']['median']:.0f} tok/s,"
                        f" through the actor {o['actor_tokens_per_s']['median']:.0f} tok/s:"
                        f" overhead {o['overhead'] * 100:.1f}%, +{o['added_s_per_round'] * 1e3:.0f}"
                        f" ms per round of {BATCH} (direct round"
                        f" {o['direct_round_s']['median'] * 1e3:.0f} ms;"
                        f" rounds {[round(x * 100, 1) for x in o['per_round_overhead']]})",
                        flush=True,
                    )
            if "switch" in args.parts:
                print("2. deactivate + activate cycle", flush=True)
                c = await switch_cycle(folder, args.rounds)
                results["switch_cycle"] = c
                print(
                    f"  activate {c['activate_s']['median'] * 1e3:.0f} ms,"
                    f" deactivate {c['deactivate_s']['median'] * 1e3:.0f} ms,"
                    f" cycle {c['cycle_s']['median'] * 1e3:.0f} ms"
                    f" [{c['cycle_s']['min'] * 1e3:.0f}-{c['cycle_s']['max'] * 1e3:.0f}]",
                    flush=True,
                )
            if "weights" in args.parts:
                print("3. weight update against model size", flush=True)
                results["weight_update"] = await weight_update(Path(tmp), args.rounds, args.sizes)
    finally:
        ray.shutdown()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["overhead", "switch", "weights"],
        choices=["overhead", "switch", "weights"],
    )
    parser.add_argument("--sizes", type=int, default=len(SIZES), help="model sizes (first N)")
    parser.add_argument(
        "--overhead-models",
        nargs="+",
        default=["tiny", "medium"],
        choices=[name.split()[0] for name in SIZES],
        help="models of part 1 (the overhead is a fixed cost per request: it weighs less "
        "as the model's compute per token grows)",
    )
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
