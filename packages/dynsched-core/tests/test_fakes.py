"""In-memory fakes: InMemoryReplica, CallRecorder, RecordingRouter."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from dynsched_core import (
    GenerateRequest,
    InMemoryReplicaOptions,
    LoadBalancer,
    RolloutReplica,
    Router,
)
from dynsched_core._clock import ManualClock
from dynsched_core.testing import (
    CallRecorder,
    InMemoryReplica,
    RecordingRouter,
    ReplicaDeadError,
    ReplicaNotReadyError,
)
from hypothesis import given
from hypothesis import strategies as st

FAST = 20_000.0  # tokens/s: a 64-token response takes ~3 ms


def req(rid: str = "r", **kw: object) -> GenerateRequest:
    kw.setdefault("max_tokens", 32)
    return GenerateRequest(request_id=rid, **kw)  # type: ignore[arg-type]


async def test_implements_protocol_and_capabilities() -> None:
    r = InMemoryReplica("h0", role="hybrid", num_gpus=4)
    assert isinstance(r, RolloutReplica)
    assert r.replica_id == "h0"
    assert r.capabilities.role == "hybrid"
    assert r.capabilities.num_gpus == 4


async def test_generates_to_target_len_with_stop() -> None:
    r = InMemoryReplica("a", tokens_per_s=FAST, chunk_tokens=4)
    res = await r.generate(req(max_tokens=50, target_len=10))
    assert res.finish_reason == "stop"
    assert res.output_tokens == tuple(range(10))
    assert res.num_tokens == 10
    assert res.replica_id == "a"
    assert r.completed == 1
    assert r.generated_tokens == 10


async def test_budget_caps_length() -> None:
    r = InMemoryReplica("a", tokens_per_s=FAST)
    res = await r.generate(req(max_tokens=12, target_len=100))
    assert (res.finish_reason, res.num_tokens) == ("length", 12)
    res = await r.generate(req("r2", max_tokens=9))
    assert (res.finish_reason, res.num_tokens) == ("length", 9)


async def test_continues_partial_output_positions() -> None:
    r = InMemoryReplica("a", tokens_per_s=FAST)
    res = await r.generate(
        req(partial_output=tuple(range(5)), partial_len=5, max_tokens=20, target_len=12)
    )
    assert res.output_tokens == tuple(range(5, 12))
    assert res.finish_reason == "stop"
    assert r.received[-1].partial_len == 5


async def test_custom_token_fn() -> None:
    r = InMemoryReplica(
        "a", tokens_per_s=FAST, options=InMemoryReplicaOptions(token_fn=lambda rid, pos: 1000 + pos)
    )
    res = await r.generate(req(max_tokens=3))
    assert res.output_tokens == (1000, 1001, 1002)


async def test_abort_mid_generation_returns_tokens_so_far() -> None:
    r = InMemoryReplica("a", tokens_per_s=2000.0, chunk_tokens=4)
    task = asyncio.create_task(r.generate(req(max_tokens=10_000)))
    await asyncio.sleep(0.01)
    assert await r.in_flight() == 1
    assert r.running == ["r"]
    assert await r.abort() == 1
    res = await task
    assert res.finish_reason == "abort"
    assert res.aborted
    assert 0 < res.num_tokens < 10_000
    assert res.output_tokens == tuple(range(res.num_tokens))
    assert await r.in_flight() == 0
    assert r.aborted == 1


async def test_abort_selected_requests_only() -> None:
    r = InMemoryReplica("a", tokens_per_s=2000.0)
    t1 = asyncio.create_task(r.generate(req("r1", max_tokens=10_000)))
    t2 = asyncio.create_task(r.generate(req("r2", max_tokens=20)))
    await asyncio.sleep(0.002)
    assert await r.abort(["r1", "unknown"]) == 1
    assert (await t1).finish_reason == "abort"
    assert (await t2).finish_reason == "length"
    assert r.max_concurrency == 2


async def test_duplicate_running_request_refused() -> None:
    r = InMemoryReplica("a", tokens_per_s=2000.0)
    t = asyncio.create_task(r.generate(req(max_tokens=10_000)))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="already running"):
        await r.generate(req(max_tokens=5))
    await r.abort()
    await t


async def test_hybrid_lifecycle() -> None:
    rec = CallRecorder()
    r = InMemoryReplica("h", role="hybrid", tokens_per_s=FAST, recorder=rec)
    assert r.is_asleep and not r.is_accepting
    with pytest.raises(ReplicaNotReadyError, match="asleep"):
        await r.generate(req())
    with pytest.raises(ReplicaNotReadyError, match="asleep"):
        await r.update_weights(3)
    with pytest.raises(ReplicaNotReadyError, match="asleep"):
        await r.resume()
    await r.wake_up()
    assert not r.is_asleep and not r.is_accepting
    with pytest.raises(ReplicaNotReadyError, match="paused"):
        await r.generate(req())
    await r.update_weights(3)
    await r.resume()
    assert r.is_accepting
    res = await r.generate(req(max_tokens=4))
    assert res.param_version == 3
    assert r.weights_version == 3
    await r.sleep()
    assert r.is_asleep and not r.is_accepting
    assert rec.methods("h") == [
        "generate",
        "update_weights",
        "resume",
        "wake_up",
        "generate",
        "update_weights",
        "resume",
        "generate",
        "sleep",
    ]


async def test_standalone_starts_awake_and_can_pause() -> None:
    r = InMemoryReplica("s")
    assert r.is_accepting
    await r.pause()
    with pytest.raises(ReplicaNotReadyError, match="paused"):
        await r.generate(req())
    await r.resume()
    assert r.is_accepting
    assert InMemoryReplica("h", role="hybrid", asleep=False).is_accepting


async def test_sleep_aborts_running_requests() -> None:
    r = InMemoryReplica("h", role="hybrid", asleep=False, tokens_per_s=2000.0)
    task = asyncio.create_task(r.generate(req(max_tokens=10_000)))
    await asyncio.sleep(0.002)
    await r.sleep()
    res = await task
    assert res.finish_reason == "abort"
    assert r.is_asleep


async def test_delays_are_slept_on_the_loop() -> None:
    r = InMemoryReplica(
        "h", role="hybrid", options=InMemoryReplicaOptions(wake_delay_s=0.003, update_delay_s=0.002)
    )
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await r.wake_up()
    await r.update_weights(1)
    assert loop.time() - t0 >= 0.0049  # lower bound only (clock resolution)


async def test_fail_next_injects_failures() -> None:
    r = InMemoryReplica("a", tokens_per_s=FAST)
    r.fail_next("generate")
    with pytest.raises(RuntimeError, match="injected"):
        await r.generate(req())
    assert (await r.generate(req(max_tokens=2))).num_tokens == 2
    r.fail_next("sleep", ValueError("custom"), times=2)
    for _ in range(2):
        with pytest.raises(ValueError, match="custom"):
            await r.sleep()
    await r.sleep()
    with pytest.raises(ValueError, match="method"):
        r.fail_next("nope")
    with pytest.raises(ValueError, match="times"):
        r.fail_next("abort", times=0)


async def test_kill_fails_every_call_and_running_generation() -> None:
    r = InMemoryReplica("a", tokens_per_s=2000.0)
    task = asyncio.create_task(r.generate(req(max_tokens=10_000)))
    await asyncio.sleep(0.002)
    r.kill()
    with pytest.raises(ReplicaDeadError):
        await task
    assert not r.is_alive
    for call in (r.generate(req()), r.abort(), r.sleep(), r.wake_up(), r.resume(), r.in_flight()):
        with pytest.raises(ReplicaDeadError):
            await call
    with pytest.raises(ReplicaDeadError):
        await r.update_weights(1)
    r.revive()
    assert (await r.generate(req(max_tokens=1))).num_tokens == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"role": "trainer"},
        {"tokens_per_s": 0},
        {"tokens_per_s": float("inf")},
        {"chunk_tokens": 0},
    ],
)
def test_bad_replica_args(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        InMemoryReplica("a", **kwargs)  # type: ignore[arg-type]


def test_recorder_queries() -> None:
    clock = ManualClock()
    rec = CallRecorder(clock)
    rec.record("a", "x", 1)
    clock.advance(1.0)
    rec.record("b", "y")
    rec.record("a", "z")
    assert len(rec) == 3
    assert [c.time for c in rec.calls] == [0.0, 1.0, 1.0]
    assert rec.calls[0].args == (1,)
    assert rec.methods("a") == ["x", "z"]
    assert rec.methods() == ["x", "y", "z"]
    assert rec.sequence(exclude_methods=["y"]) == [("a", "x"), ("a", "z")]
    assert rec.index("b", "y") == 1
    assert [c.method for c in rec.filter(method="z")] == ["z"]
    with pytest.raises(ValueError):
        rec.index("b", "x")
    rec.clear()
    assert rec.calls == []


async def test_recording_router_shares_recorder_with_replicas() -> None:
    rec = CallRecorder()
    router = RecordingRouter(LoadBalancer(), recorder=rec)
    assert isinstance(router, Router)
    hyb = InMemoryReplica("h", role="hybrid", recorder=rec, tokens_per_s=FAST)
    # an activation in the documented order
    await hyb.wake_up()
    await hyb.update_weights(1)
    await hyb.resume()
    await router.add_replicas(["h"])
    rid = await router.acquire("q")
    await hyb.generate(req("q", max_tokens=1))
    await router.release("q", rid)
    await router.clear_sticky()
    await router.remove_replicas(["h"])
    await hyb.abort()
    await hyb.sleep()
    assert rec.sequence() == [
        ("h", "wake_up"),
        ("h", "update_weights"),
        ("h", "resume"),
        ("router", "add_replicas"),
        ("router", "acquire"),
        ("h", "generate"),
        ("router", "release"),
        ("router", "clear_sticky"),
        ("router", "remove_replicas"),
        ("h", "abort"),
        ("h", "sleep"),
    ]
    assert rec.filter("router", "acquire")[0].args == ("q", "h")
    times = [c.time for c in rec.calls]
    assert times == sorted(times)
    # the wrapped LoadBalancer's helpers are reachable, queries are not recorded
    assert router.routable_ids() == []
    assert await router.routable() == []
    assert await router.in_flight_counts() == {}


async def test_recording_router_can_skip_leases_and_forwards_listeners() -> None:
    router = RecordingRouter(record_leases=False)
    seen: list[list[str]] = []
    router.add_listener(lambda ids: seen.append(list(ids)))
    await router.add_replicas(["a"])
    await router.release("q", await router.acquire("q"))
    assert router.recorder.methods() == ["add_replicas"]
    assert seen == [["a"]]
    assert "RecordingRouter" in repr(router)


async def test_abort_mid_chunk_keeps_only_elapsed_tokens() -> None:
    # one chunk of 1000 tokens takes 1 s; an abort right away keeps (almost) nothing
    r = InMemoryReplica("a", tokens_per_s=1000.0, chunk_tokens=1000)
    task = asyncio.create_task(r.generate(req(max_tokens=1000)))
    await asyncio.sleep(0.002)
    await r.abort()
    res = await task
    assert res.finish_reason == "abort"
    assert res.num_tokens < 1000
    assert res.output_tokens == tuple(range(res.num_tokens))


@pytest.mark.parametrize(
    "field", ["sleep_delay_s", "wake_delay_s", "resume_delay_s", "update_delay_s", "abort_delay_s"]
)
@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), True, "1"])
def test_options_reject_bad_delays_naming_the_field(field: str, bad: object) -> None:
    with pytest.raises(ValueError, match=field):
        InMemoryReplicaOptions(**{field: bad})  # type: ignore[arg-type]


def test_options_reach_the_replica() -> None:
    opts = InMemoryReplicaOptions(wake_delay_s=2, weights_version=7, token_fn=lambda r, p: -p)
    r = InMemoryReplica("h", role="hybrid", options=opts)
    assert r.wake_delay_s == 2.0 and isinstance(r.wake_delay_s, float)
    assert r.weights_version == 7 and r.sleep_delay_s == 0.0
    with pytest.raises(ValueError, match="weights_version"):
        InMemoryReplicaOptions(weights_version=1.5)  # type: ignore[arg-type]


class _OldFlags:
    """The replica's former bookkeeping (asleep, accepting, alive flags) and its messages."""

    def __init__(self, rid: str, asleep: bool) -> None:
        self.rid, self.asleep, self.accepting, self.alive = rid, asleep, not asleep, True

    def call(self, method: str) -> str | None:
        """The expected error message of ``method``, or None when it goes through."""
        if method in ("kill", "revive"):
            self.alive = method == "revive"
            return None
        if not self.alive:
            return f"replica {self.rid!r} is dead ({method} refused)"
        first = {"generate": "wake_up and resume", "update_weights": "wake_up", "resume": "wake_up"}
        call = {"generate": "generate('q')", "update_weights": "update_weights(1)"}.get(
            method, method
        )
        if self.asleep and method in first:
            return f"replica {self.rid!r} is asleep: {call} refused ({first[method]} first)"
        if method == "generate" and not self.accepting:
            return f"replica {self.rid!r} is paused: {call} refused (resume first)"
        if method in ("pause", "sleep"):
            self.accepting = False
        self.asleep = {"sleep": True, "wake_up": False}.get(method, self.asleep)
        self.accepting = self.accepting or method == "resume"
        return None

    @property
    def state(self) -> str:
        if not self.alive:
            return "dead"
        return "asleep" if self.asleep else "accepting" if self.accepting else "paused"


_CALLS = ["pause", "resume", "sleep", "wake_up", "update_weights", "generate", "kill", "revive"]


@given(
    role=st.sampled_from(["standalone", "hybrid"]),
    asleep=st.sampled_from([None, True, False]),
    calls=st.lists(st.sampled_from(_CALLS), max_size=25),
)
def test_the_lifecycle_state_machine_keeps_the_former_flags_behaviour(
    role: str, asleep: bool | None, calls: list[str]
) -> None:
    async def scenario() -> None:
        r = InMemoryReplica("x", role=role, tokens_per_s=FAST, asleep=asleep)  # type: ignore[arg-type]
        old = _OldFlags("x", (role == "hybrid") if asleep is None else asleep)
        for method in calls:
            expected = old.call(method)
            if method in ("kill", "revive"):
                getattr(r, method)()
            else:
                args = {"generate": (req("q", max_tokens=2),), "update_weights": (1,)}
                error = ReplicaDeadError if not old.alive else ReplicaNotReadyError
                with pytest.raises(error) if expected else contextlib.nullcontext() as info:
                    await getattr(r, method)(*args.get(method, ()))
                if expected:
                    assert str(info.value) == expected
            assert (r.is_asleep, r.is_accepting) == (
                old.asleep,
                old.alive and old.accepting and not old.asleep,
            )
            assert f", {old.state}, " in repr(r)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"abort_delay_s": -1.0},
            r"^InMemoryReplicaOptions\.abort_delay_s must be a finite number",
        ),
        ({"resume_delay_s": "1"}, r"^InMemoryReplicaOptions\.resume_delay_s must be a number"),
        ({"weights_version": True}, r"^InMemoryReplicaOptions\.weights_version must be an int"),
    ],
)
def test_options_errors_share_the_validators_format(
    changes: dict[str, object], message: str
) -> None:
    from dynsched_core.errors import ConfigError

    with pytest.raises(ConfigError, match=message) as info:
        InMemoryReplicaOptions(**changes)  # type: ignore[arg-type]
    assert info.value.key == next(iter(changes))
