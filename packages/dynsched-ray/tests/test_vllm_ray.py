"""vLLM replicas hosted by `ReplicaActor`s on the local Ray cluster (real vLLM CPU build).

Three actors (one standalone, two hybrid replicas of the tiny model) are shared by the
module: the controller switches the hybrid ones with requests in flight, then one actor is
killed mid-generation. Every request must complete exactly once, with the tokens of an
uninterrupted greedy run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from dynsched_core import (
    ControllerOptions,
    DynamicResourceController,
    GenerateRequest,
    HybridState,
    LoadBalancer,
    ReplicaSet,
    RetryingClient,
)
from dynsched_ray import RayReplica, ReplicaActor, remote_class
from dynsched_ray.engines.vllm.replica import VLLMReplica

pytestmark = [pytest.mark.ray, pytest.mark.timeout(1500)]

ROLES = {"vs-0": "standalone", "vh-0": "hybrid", "vh-1": "hybrid"}
TOKENS = 96


@pytest.fixture(scope="module")
def vllm_actors(ray_cluster: None, tiny_model_dir: Path) -> Iterator[dict[str, Any]]:
    """One `ReplicaActor` hosting a `VLLMReplica` per id of ``ROLES`` (engines started)."""
    handles = {
        rid: remote_class(ReplicaActor)
        .options(num_cpus=0)
        .remote(VLLMReplica, (rid,), {"model": str(tiny_model_dir), "role": role}, 8)
        for rid, role in ROLES.items()
    }
    ray.get([h.describe.remote() for h in handles.values()], timeout=1200)  # engines up
    yield handles
    for h in handles.values():
        with contextlib.suppress(Exception):
            ray.get(h.shutdown.remote(), timeout=60)
        ray.kill(h, no_restart=True)


def _prompt(i: int) -> list[int]:
    return [3 + (i * 37) % 500, 3 + (i * 91) % 500, 3 + (i * 13) % 500, 42]


def _request(i: int, tag: str) -> GenerateRequest:
    ids = _prompt(i)
    return GenerateRequest(
        request_id=f"{tag}-{i}",
        prompt=ids,
        prompt_len=len(ids),
        max_tokens=TOKENS,
        metadata={"sampling": {"ignore_eos": True}},
    )


async def _connect(handles: dict[str, Any]) -> tuple[ReplicaSet, dict[str, RayReplica]]:
    proxies = {
        rid: await RayReplica.connect(
            h, timeout_s=600, call_timeout_s=120, generate_timeout_s=300, stream=True
        )
        for rid, h in handles.items()
    }
    rs = ReplicaSet(
        LoadBalancer(),
        standalone=[proxies["vs-0"]],
        hybrid=[proxies["vh-0"], proxies["vh-1"]],
    )
    for p in proxies.values():
        p.add_death_callback(lambda rid, _exc: rs.mark_dead(rid))
    await rs.route(["vs-0"])
    return rs, proxies


async def _reference(proxy: RayReplica, n: int, tag: str) -> dict[int, tuple[int, ...]]:
    """Uninterrupted greedy tokens of each prompt, on one replica."""
    out = {}
    for i in range(n):
        res = await proxy.generate(_request(i, f"{tag}-ref"))
        assert res.num_tokens == TOKENS
        out[i] = res.output_tokens
    return out


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _wait_in_flight(proxies: list[RayReplica], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counts = await asyncio.gather(*(p.in_flight() for p in proxies))
        if all(c > 0 for c in counts):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("hybrid replicas never had requests in flight")


async def test_controller_switches_two_vllm_hybrids_beside_a_standalone_exactly_once(
    vllm_actors: dict[str, Any], tiny_model_dir: Path
) -> None:
    rs, proxies = await _connect(vllm_actors)
    hybrids = [proxies["vh-0"], proxies["vh-1"]]
    ctrl = DynamicResourceController(rs, ControllerOptions(call_timeout_s=120.0))
    client = RetryingClient(rs)
    weights = (tiny_model_dir / "model.safetensors").read_bytes()  # model A again, as bytes
    n = 12
    reference = await _reference(proxies["vs-0"], n, "ctl")

    assert ctrl.state is HybridState.STANDALONE_ONLY
    assert await ctrl.activate(1, weights) is True  # wake -> weights -> resume -> route
    assert sorted(await rs.router.routable()) == ["vh-0", "vh-1", "vs-0"]
    for h in hybrids:
        st = await h.handle.call.remote("state")
        assert st.accepting and st.weights_version == 1 and st.weights_source == "bytes"

    tasks = [asyncio.create_task(client.generate(_request(i, "ctl"))) for i in range(n)]
    await _wait_in_flight(hybrids)
    assert await ctrl.deactivate() is True  # unroute -> abort -> sleep, requests in flight
    assert await rs.router.routable() == ["vs-0"]
    for h in hybrids:
        st = await h.handle.call.remote("state")
        assert st.asleep and not st.accepting and st.memory_released is False  # CPU: nothing freed
        assert await h.handle.call.remote("in_flight") == 0  # abort waits for the engine
    outcomes = await asyncio.gather(*tasks)
    for h in hybrids:  # the actor's streams have delivered their last (aborted) segment
        assert await h.in_flight() == 0

    # every request exactly once, with the uninterrupted tokens
    assert sorted(o.request_id for o in outcomes) == sorted(f"ctl-{i}" for i in range(n))
    for i, o in enumerate(outcomes):
        assert o.output_tokens == reference[i], o.request_id
        assert o.num_tokens == TOKENS and o.failures == 0 and not o.truncated
        assert len(o.output_logprobs) == TOKENS
        assert sum(s.num_tokens for s in o.segments) == TOKENS
    resumed = [o for o in outcomes if o.aborts]
    assert resumed, "requests on the hybrid replicas must have been aborted and resumed"
    for o in resumed:
        assert o.replica_ids[0] in ("vh-0", "vh-1") and o.replica_ids[-1] == "vs-0"
        # the hybrid's tokens carry version 1, the standalone's version 0
        assert {s.param_version for s in o.segments} <= {0, 1}

    # activate again with requests in flight on the standalone replica
    more = [asyncio.create_task(client.generate(_request(i, "ctl2"))) for i in range(4)]
    assert await ctrl.activate(2) is True
    outcomes2 = await asyncio.gather(*more)
    assert [o.output_tokens for o in outcomes2] == [reference[i] for i in range(4)]
    assert await ctrl.deactivate() is True
    assert ctrl.activate_count == 2 and ctrl.deactivate_count == 2


async def test_killed_vllm_actor_mid_generation_resumes_elsewhere_exactly_once(
    vllm_actors: dict[str, Any],
) -> None:
    rs, proxies = await _connect(vllm_actors)
    ctrl = DynamicResourceController(rs, ControllerOptions(call_timeout_s=120.0))
    client = RetryingClient(rs)
    n = 10
    reference = await _reference(proxies["vs-0"], n, "kill")
    await ctrl.activate(3)
    victim = proxies["vh-1"]
    pids = list(await victim.handle.call.remote("engine_pids"))
    assert pids

    tasks = [asyncio.create_task(client.generate(_request(i, "kill"))) for i in range(n)]
    await _wait_in_flight([victim])
    await asyncio.sleep(0.3)  # let it stream some segments
    ray.kill(victim.handle, no_restart=True)
    outcomes = await asyncio.gather(*tasks)

    assert sorted(o.request_id for o in outcomes) == sorted(f"kill-{i}" for i in range(n))
    for i, o in enumerate(outcomes):
        assert o.output_tokens == reference[i], o.request_id  # nothing lost or duplicated
        assert o.num_tokens == TOKENS
    hit = [o for o in outcomes if "vh-1" in o.replica_ids]
    assert hit and all(o.replica_ids[-1] != "vh-1" for o in hit)
    assert victim.is_dead and "vh-1" in rs.dead_ids
    # the engine processes of the killed actor do not outlive it
    deadline = time.monotonic() + 60
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if _running(p)]
        await asyncio.sleep(0.5)
    assert alive == []
    await ctrl.deactivate()
