"""Router, replica and queue proxies over real Ray actors."""

from __future__ import annotations

import asyncio

import pytest
import ray
from dynsched_core import GenerateRequest, ReplicaSet
from dynsched_core.errors import NoRoutableReplicaError, SampleWaitTimeoutError
from dynsched_core.testing import InMemoryReplica
from dynsched_ray import (
    ActorUnavailableError,
    QueueActor,
    RayQueue,
    RayReplica,
    RayRouter,
    RemoteCallTimeoutError,
    ReplicaActor,
    ReplicaActorDiedError,
    RouterActor,
    remote_class,
)
from dynsched_ray.runtime.remote import await_ref

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


def _router(**kw: object) -> object:
    return remote_class(RouterActor).options(num_cpus=0).remote(**kw)


async def test_router_proxy_routes_least_loaded_and_notifies_listeners() -> None:
    handle = _router()
    try:
        router = RayRouter(handle, call_timeout_s=30)
        seen: list[list[str]] = []
        router.add_listener(seen.append)
        await router.add_replicas(["b", "a"])
        assert router.routable_ids() == ["a", "b"]
        assert seen == [["a", "b"]]
        first = await router.acquire("r1")
        second = await router.acquire("r2")
        assert {first, second} == {"a", "b"}
        assert await router.in_flight_counts() == {"a": 1, "b": 1}
        assert router.in_flight_of(first) == 1
        await router.release("r1", first)
        await router.release("r1", first)  # exactly once
        assert await router.in_flight_counts() == {"a": 0, "b": 0} | {second: 1}
        # sticky: a retry of r2 goes back to its replica
        assert await router.acquire("r2") == second
        await router.add_replicas(["a"])  # idempotent: no new notification
        assert len(seen) == 1
        await router.remove_replicas(["a", "b"])
        assert seen[-1] == []
        with pytest.raises(NoRoutableReplicaError):
            await router.acquire("r3")
    finally:
        ray.kill(handle)


async def test_batched_router_coalesces_concurrent_calls() -> None:
    handle = _router(replica_ids=["x", "y", "z"])
    try:
        router = RayRouter(handle, batch=True)
        await router.refresh()
        chosen = await asyncio.gather(*(router.acquire(f"q{i}") for i in range(30)))
        counts = await router.in_flight_counts()
        assert counts == {"x": 10, "y": 10, "z": 10}
        assert router.calls < 30  # fewer actor round trips than requests
        await asyncio.gather(*(router.release(f"q{i}", c) for i, c in enumerate(chosen)))
        assert await router.in_flight_counts() == {"x": 0, "y": 0, "z": 0}
        await router.remove_replicas(["x", "y", "z"])
        with pytest.raises(NoRoutableReplicaError):
            await router.acquire("none")
        many = await router.acquire_many(["m1", "m2"])
        assert many == [None, None]
    finally:
        ray.kill(handle)


async def test_replica_proxy_generates_aborts_and_reports_death() -> None:
    handle = (
        remote_class(ReplicaActor)
        .options(num_cpus=0)
        .remote(InMemoryReplica, ("s0",), {"tokens_per_s": 400.0, "chunk_tokens": 4})
    )
    deaths: list[str] = []
    replica = await RayReplica.connect(
        handle, on_death=lambda rid, exc: deaths.append(rid), generate_timeout_s=30
    )
    assert replica.replica_id == "s0"
    assert replica.capabilities.role == "standalone"
    res = await replica.generate(GenerateRequest(request_id="a", max_tokens=12))
    assert res.output_tokens == tuple(range(12))
    assert res.finish_reason == "length"
    # abort mid-generation keeps the tokens so far
    task = asyncio.ensure_future(replica.generate(GenerateRequest(request_id="b", max_tokens=4000)))
    while await replica.in_flight() == 0:
        await asyncio.sleep(0.01)
    assert await replica.abort() == 1
    partial = await task
    assert partial.finish_reason == "abort"
    assert partial.output_tokens == tuple(range(partial.num_tokens))
    # kill the actor while a request runs: the call fails with a typed error, once reported
    task = asyncio.ensure_future(replica.generate(GenerateRequest(request_id="c", max_tokens=4000)))
    while await replica.in_flight() == 0:
        await asyncio.sleep(0.01)
    ray.kill(handle, no_restart=True)
    with pytest.raises(ReplicaActorDiedError):
        await task
    assert replica.is_dead
    with pytest.raises(ActorUnavailableError):
        await replica.sleep()
    assert deaths == ["s0"]
    assert not await replica.ping()


async def test_queue_proxy_is_bounded_and_end_of_stream_aware() -> None:
    handle = remote_class(QueueActor).options(num_cpus=0).remote(2)
    try:
        q = RayQueue(handle, call_timeout_s=30, grace_s=30)
        await q.put("s1")
        await q.put("s2", timeout=1)
        with pytest.raises(SampleWaitTimeoutError):
            await q.put("s3", timeout=0.05)
        assert q.qsize() == 2
        assert await q.get(1) == ["s1"]
        with pytest.raises(SampleWaitTimeoutError) as info:
            await q.wait_for(2, timeout=0.05)
        # raised inside the actor, it arrives with its own type and fields
        assert (info.value.wanted, info.value.available, info.value.timeout_s) == (2, 1, 0.05)
        await q.close()
        assert await q.wait_for(2, timeout=5) == 1
        assert await q.get(2, timeout=5) == ["s2"]
        st = await q.stats()
        assert (st.produced, st.consumed, st.closed, st.capacity) == (2, 2, True, 2)
    finally:
        ray.kill(handle)


async def test_remote_call_timeout_is_typed() -> None:
    handle = remote_class(QueueActor).options(num_cpus=0).remote(None)
    try:
        q = RayQueue(handle, grace_s=0.05)
        with pytest.raises(RemoteCallTimeoutError):
            # the actor waits 10 s, the call itself is bounded by 0 + 0.05 s of grace
            await q._call("wait_for", 1, 10.0, timeout_s=0.2)
    finally:
        ray.kill(handle)


async def test_streamed_generation_keeps_tokens_when_the_actor_dies() -> None:
    handle = (
        remote_class(ReplicaActor)
        .options(num_cpus=0)
        .remote(InMemoryReplica, ("s1",), {"tokens_per_s": 400.0, "chunk_tokens": 4}, 8)
    )
    deaths: list[str] = []
    replica = await RayReplica.connect(
        handle, stream=True, on_death=lambda rid, exc: deaths.append(rid), generate_timeout_s=30
    )
    # segments are stitched into one attempt
    res = await replica.generate(GenerateRequest(request_id="a", max_tokens=30, target_len=20))
    assert (res.output_tokens, res.finish_reason) == (tuple(range(20)), "stop")
    res = await replica.generate(GenerateRequest(request_id="b", max_tokens=12))
    assert (res.num_tokens, res.finish_reason) == (12, "length")
    # an abort lands inside a segment or between two
    task = asyncio.ensure_future(replica.generate(GenerateRequest(request_id="c", max_tokens=4000)))
    while await replica.in_flight() == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    assert await replica.abort(["c"]) == 1
    partial = await task
    assert partial.finish_reason == "abort" and partial.output_tokens == tuple(
        range(partial.num_tokens)
    )
    # the actor dies after some segments: the attempt returns aborted with those tokens
    task = asyncio.ensure_future(
        replica.generate(
            GenerateRequest(
                request_id="d", max_tokens=4000, partial_len=5, partial_output=tuple(range(5))
            )
        )
    )
    await asyncio.sleep(0.3)  # > 2 segments of 8 tokens at 400 tokens/s
    ray.kill(handle, no_restart=True)
    kept = await task
    assert kept.finish_reason == "abort" and kept.num_tokens >= 8
    assert kept.output_tokens == tuple(range(5, 5 + kept.num_tokens))
    assert replica.is_dead and deaths == ["s1"]
    with pytest.raises(ReplicaActorDiedError):
        await replica.generate(GenerateRequest(request_id="e", max_tokens=8))


async def test_router_recovery_re_applies_the_replica_sets_routable_members() -> None:
    handles = [_router()]

    async def respawn() -> object:
        handles.append(_router())
        return handles[-1]

    try:
        router = RayRouter(handles[0], call_timeout_s=30)
        router.respawn = respawn
        replicas = ReplicaSet(router, standalone=[InMemoryReplica(r) for r in ("a", "b", "c")])
        router.follow(replicas)
        await replicas.route(["a", "b", "c"])
        replicas.mark_dead("c")
        await replicas.settle(10.0)
        await router.add_replicas(["stray"])  # routed behind the set's back: no record of it
        ray.kill(handles[0], no_restart=True)
        for _ in range(200):  # ray.kill is asynchronous: wait until the actor is gone
            try:
                await await_ref(handles[0].ping.remote(), timeout_s=10.0, what="ping")
            except ActorUnavailableError:
                break
            await asyncio.sleep(0.05)
        assert await router.refresh() == ["a", "b"]  # the fresh actor got the set's members
        assert router.restarts == 1 and len(handles) == 2
    finally:
        for handle in handles:
            ray.kill(handle)
