"""RetryingClient: partial-rollout resume, truncation, failures, backoff, waiting for replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import attrs
import pytest
from dynsched_core import (
    ClientOptions,
    GenerateRequest,
    GenerateResult,
    InMemoryReplica,
    LoadBalancer,
    ReplicaCapabilities,
    ReplicaSet,
    RetryingClient,
)
from dynsched_core._client import RolloutOutcome
from dynsched_core.errors import NoRoutableReplicaError, ReplicaDeadError, RequestFailedError
from hypothesis import given
from hypothesis import strategies as st

FAST = 20_000.0
SLOW = 2_000.0  # 2 tokens per ms: long requests stay in flight for a while


def options(**kw: object) -> ClientOptions:
    kw.setdefault("backoff_initial_s", 0.001)
    kw.setdefault("backoff_max_s", 0.004)
    kw.setdefault("no_replica_timeout_s", 1.0)
    return ClientOptions(**kw)  # type: ignore[arg-type]


async def set_of(replicas: Sequence[object], routed: Sequence[str] = ()) -> ReplicaSet:
    """A ReplicaSet over ``replicas`` (standalone) with ``routed`` routable."""
    rs = ReplicaSet(standalone=replicas)  # type: ignore[arg-type]
    await rs.route(list(routed))
    return rs


async def make(
    ids: Sequence[str] = ("a", "b"),
    tokens_per_s: float = FAST,
    on_replica_failure: object = None,
    **client_kw: object,
) -> tuple[ReplicaSet, dict[str, InMemoryReplica], RetryingClient]:
    reps = {i: InMemoryReplica(i, tokens_per_s=tokens_per_s) for i in ids}
    rs = await set_of(list(reps.values()), ids)
    client = RetryingClient(rs, options(**client_kw), on_replica_failure=on_replica_failure)  # type: ignore[arg-type]
    return rs, reps, client


async def wait_running(rep: InMemoryReplica, request_id: str, min_tokens: int = 1) -> None:
    """Wait until ``request_id`` runs on ``rep`` and had time for ``min_tokens`` tokens."""
    for _ in range(2000):
        if request_id in rep.running:
            break
        await asyncio.sleep(0.0005)
    else:
        raise AssertionError(f"{request_id} never ran on {rep.replica_id}")
    await asyncio.sleep(min_tokens / rep.tokens_per_s + rep.chunk_tokens / rep.tokens_per_s)


async def deactivate(rs: ReplicaSet, rep: InMemoryReplica) -> None:
    """The controller's order: out of routing, then abort."""
    await rs.unroute([rep.replica_id])
    await rep.abort()


async def test_plain_completion() -> None:
    rs, _, client = await make()
    out = await client.generate(GenerateRequest(request_id="q", max_tokens=40, target_len=25))
    assert isinstance(out, RolloutOutcome)
    assert out.output_tokens == tuple(range(25))
    assert (out.num_tokens, out.finish_reason, out.truncated) == (25, "stop", False)
    assert (out.attempts, out.aborts, out.failures) == (1, 0, 0)
    assert out.replica_ids == ("a",)
    assert out.reprefill_tokens == 0
    assert out.param_versions == (0,)
    assert out.finished_at >= out.started_at
    assert await rs.router.in_flight_counts() == {"a": 0, "b": 0}
    assert (client.completed, client.failed, client.in_flight) == (1, 0, 0)


async def test_budget_exhausted_is_length() -> None:
    _, _, client = await make()
    out = await client.generate(GenerateRequest(request_id="q", max_tokens=7))
    assert (out.num_tokens, out.finish_reason) == (7, "length")


async def test_partial_rollout_resume_keeps_tokens_and_reduces_budget() -> None:
    rs, reps, client = await make(tokens_per_s=SLOW)
    request = GenerateRequest(request_id="q", prompt_len=10, max_tokens=100, target_len=60)
    task = asyncio.create_task(client.generate(request))
    await wait_running(reps["a"], "q", min_tokens=8)
    await deactivate(rs, reps["a"])
    out = await task

    first = reps["a"].received[0]
    second = reps["b"].received[0]
    done_first = second.partial_len
    assert 0 < done_first < 60
    assert first.max_tokens == 100 and first.partial_len == 0
    # the resubmission carries the tokens so far and the remaining budget
    assert second.partial_output == tuple(range(done_first))
    assert second.max_tokens == 100 - done_first
    assert second.request_id == "q"
    # the final response is continuous and complete
    assert out.output_tokens == tuple(range(60))
    assert (out.num_tokens, out.finish_reason, out.truncated) == (60, "stop", False)
    assert (out.attempts, out.aborts) == (2, 1)
    assert out.replica_ids == ("a", "b")
    assert out.reprefill_tokens == 10 + done_first
    assert out.resumed
    assert client.total_reprefill_tokens == 10 + done_first
    assert client.total_aborts == 1
    assert await rs.router.in_flight_counts() == {"b": 0}


async def test_truncated_when_partial_rollout_off() -> None:
    rs, reps, client = await make(tokens_per_s=SLOW, partial_rollout=False)
    task = asyncio.create_task(
        client.generate(GenerateRequest(request_id="q", max_tokens=1000, target_len=900))
    )
    await wait_running(reps["a"], "q", min_tokens=4)
    await deactivate(rs, reps["a"])
    out = await task
    assert out.truncated
    assert out.finish_reason == "abort"
    assert (out.attempts, out.aborts) == (1, 1)
    assert 0 < out.num_tokens < 900
    assert out.output_tokens == tuple(range(out.num_tokens))
    assert not out.resumed
    assert reps["b"].received == []
    assert client.truncated == 1


async def test_abort_at_exhausted_budget_finishes_with_length() -> None:
    class AbortsAtEnd:
        """Produces the whole budget but reports an abort."""

        replica_id = "x"
        capabilities = ReplicaCapabilities()

        async def generate(self, request: GenerateRequest) -> GenerateResult:
            return GenerateResult(
                request_id=request.request_id,
                replica_id="x",
                output_tokens=tuple(range(request.max_tokens)),
                num_tokens=request.max_tokens,
                finish_reason="abort",
            )

    client = RetryingClient(await set_of([AbortsAtEnd()], ["x"]))
    out = await client.generate(GenerateRequest(request_id="q", max_tokens=5))
    assert (out.finish_reason, out.num_tokens, out.attempts, out.truncated) == (
        "length",
        5,
        1,
        False,
    )


async def test_replica_failure_is_reported_excluded_and_retried_elsewhere() -> None:
    reports: list[tuple[str, str]] = []
    rs, reps, client = await make(
        on_replica_failure=lambda rid, exc: reports.append((rid, str(exc)))
    )
    reps["a"].fail_next("generate")
    out = await client.generate(GenerateRequest(request_id="q", max_tokens=5))
    assert out.replica_ids == ("a", "b")
    assert (out.failures, out.attempts, out.num_tokens) == (1, 2, 5)
    assert out.backoff_s == pytest.approx(0.001)
    assert reports and reports[0][0] == "a" and "injected" in reports[0][1]
    assert client.total_failures == 1
    assert await rs.router.in_flight_counts() == {"a": 0, "b": 0}


async def test_async_failure_callback_and_callback_errors_are_contained() -> None:
    removed: list[str] = []
    reps = {i: InMemoryReplica(i, tokens_per_s=FAST) for i in ("a", "b")}
    rs = await set_of(list(reps.values()), ["a", "b"])

    async def drop(rid: str, exc: BaseException) -> None:
        removed.append(rid)
        rs.mark_dead(rid)
        await rs.settle(1.0)
        raise RuntimeError("callback bug")  # logged, not propagated

    client = RetryingClient(rs, ClientOptions(backoff_initial_s=0.0), on_replica_failure=drop)
    reps["a"].kill()
    out = await client.generate(GenerateRequest(request_id="q", max_tokens=3))
    assert removed == ["a"]
    assert out.replica_ids == ("a", "b")
    assert await rs.router.routable() == ["b"] == rs.routable_ids
    assert rs.dead_ids == ["a"]


async def test_dead_replica_mid_generation_is_a_failure() -> None:
    _, reps, client = await make(tokens_per_s=SLOW)
    task = asyncio.create_task(
        client.generate(GenerateRequest(request_id="q", max_tokens=50, target_len=40))
    )
    await wait_running(reps["a"], "q")
    reps["a"].kill()
    out = await task
    assert out.failures == 1
    assert out.replica_ids == ("a", "b")
    # tokens of the failed attempt are lost: b regenerates everything
    assert reps["b"].received[0].partial_len == 0
    assert out.output_tokens == tuple(range(40))


async def test_bounded_failures_then_request_failed_error() -> None:
    rs, reps, client = await make(max_failures=3)
    for r in reps.values():
        r.kill()
    with pytest.raises(RequestFailedError) as info:
        await client.generate(GenerateRequest(request_id="q", max_tokens=5))
    assert info.value.request_id == "q"
    assert info.value.attempts == 3
    assert isinstance(info.value.cause, ReplicaDeadError)
    assert await rs.router.in_flight_counts() == {"a": 0, "b": 0}
    assert (client.failed, client.completed, client.in_flight) == (1, 0, 0)


async def test_single_replica_is_retried_when_every_replica_was_excluded() -> None:
    _, reps, client = await make(ids=("a",), max_failures=3)
    reps["a"].fail_next("generate", times=2)
    out = await client.generate(GenerateRequest(request_id="q", max_tokens=4))
    assert out.replica_ids == ("a", "a", "a")
    assert out.failures == 2
    assert out.num_tokens == 4


def test_backoff_delays_grow_and_are_capped() -> None:
    client = RetryingClient(
        ReplicaSet(), ClientOptions(backoff_initial_s=0.01, backoff_factor=3.0, backoff_max_s=0.05)
    )
    delays = [client.backoff_delay(k) for k in range(1, 7)]
    assert delays == pytest.approx([0.01, 0.03, 0.05, 0.05, 0.05, 0.05])
    assert client.backoff_delay(0) == 0.0
    assert client.backoff_delay(10_000) == pytest.approx(0.05)  # no overflow on long streaks


async def test_backoff_is_applied_and_capped_between_failures() -> None:
    _, reps, client = await make(
        ids=("a",),
        max_failures=5,
        backoff_initial_s=0.001,
        backoff_factor=10.0,
        backoff_max_s=0.002,
    )
    reps["a"].fail_next("generate", times=4)
    out = await client.generate(GenerateRequest(request_id="q", max_tokens=1))
    # four retries after failures: 0.001, then capped at 0.002
    assert out.backoff_s == pytest.approx(0.001 + 0.002 * 3)
    assert out.latency_s >= out.backoff_s * 0.99


async def test_waits_for_a_routable_replica() -> None:
    rs = await set_of([InMemoryReplica("a", tokens_per_s=FAST)])
    client = RetryingClient(rs, ClientOptions(no_replica_timeout_s=5.0))
    task = asyncio.create_task(client.generate(GenerateRequest(request_id="q", max_tokens=3)))
    await asyncio.sleep(0.005)
    assert not task.done()
    await rs.route(["a"])
    out = await asyncio.wait_for(task, 2.0)
    assert out.num_tokens == 3


async def test_no_routable_replica_times_out() -> None:
    client = RetryingClient(ReplicaSet(), ClientOptions(no_replica_timeout_s=0.005))
    with pytest.raises(NoRoutableReplicaError, match="within"):
        await client.generate(GenerateRequest(request_id="q", max_tokens=3))
    assert client.failed == 1


async def test_resume_waits_when_aborted_replica_was_the_last_one() -> None:
    rs, reps, client = await make(ids=("a",), tokens_per_s=SLOW, no_replica_timeout_s=5.0)
    reps["b"] = InMemoryReplica("b", tokens_per_s=FAST)
    rs.add(reps["b"])  # a member, not routable yet
    task = asyncio.create_task(
        client.generate(GenerateRequest(request_id="q", max_tokens=100, target_len=50))
    )
    await wait_running(reps["a"], "q", min_tokens=4)
    await deactivate(rs, reps["a"])
    await asyncio.sleep(0.005)
    assert not task.done()  # waiting for a routable replica
    await rs.route(["b"])
    out = await asyncio.wait_for(task, 2.0)
    assert out.output_tokens == tuple(range(50))
    assert out.replica_ids == ("a", "b")


async def test_routed_replica_that_is_not_a_live_member_is_a_failure() -> None:
    lb = LoadBalancer(["ghost"])  # a router that routes to an id the set does not hold
    rs = ReplicaSet(lb, standalone=[InMemoryReplica("a", tokens_per_s=FAST)])
    await rs.route(["a"])
    client = RetryingClient(rs, ClientOptions(backoff_initial_s=0.0))
    await lb.acquire(
        "other"
    )  # "a" sorts first, so it takes this lease; "ghost" is now least loaded
    out = await client.generate(GenerateRequest(request_id="q", max_tokens=2))
    assert out.replica_ids == ("ghost", "a")
    assert out.failures == 1


async def test_max_aborts_bounds_bouncing() -> None:
    class AlwaysAborts:
        replica_id = "x"
        capabilities = ReplicaCapabilities()

        async def generate(self, request: GenerateRequest) -> GenerateResult:
            return GenerateResult(
                request_id=request.request_id,
                replica_id="x",
                output_tokens=(0,),
                num_tokens=1,
                finish_reason="abort",
            )

    client = RetryingClient(await set_of([AlwaysAborts()], ["x"]), ClientOptions(max_aborts=3))
    with pytest.raises(RequestFailedError, match="aborted 4 times"):
        await client.generate(GenerateRequest(request_id="q", max_tokens=100))


async def test_aborts_without_progress_back_off() -> None:
    class AbortsEmpty:
        replica_id = "x"
        capabilities = ReplicaCapabilities()
        calls = 0

        async def generate(self, request: GenerateRequest) -> GenerateResult:
            AbortsEmpty.calls += 1
            done = AbortsEmpty.calls >= 3
            return GenerateResult(
                request_id=request.request_id,
                replica_id="x",
                num_tokens=request.max_tokens if done else 0,
                finish_reason="length" if done else "abort",
            )

    client = RetryingClient(
        await set_of([AbortsEmpty()], ["x"]),
        ClientOptions(backoff_initial_s=0.001, backoff_max_s=1.0),
    )
    out = await client.generate(GenerateRequest(request_id="q", max_tokens=4))
    assert out.aborts == 2
    assert out.backoff_s == pytest.approx(0.001 + 0.002)
    assert out.num_tokens == 4


async def test_param_versions_seen_across_attempts() -> None:
    rs, reps, client = await make(tokens_per_s=SLOW)
    await reps["b"].update_weights(7)
    task = asyncio.create_task(
        client.generate(GenerateRequest(request_id="q", max_tokens=100, target_len=30))
    )
    await wait_running(reps["a"], "q")
    await deactivate(rs, reps["a"])
    out = await task
    assert out.param_versions == (0, 7)
    assert out.param_version == 7


async def test_lease_released_on_cancellation() -> None:
    rs, reps, client = await make(tokens_per_s=SLOW)
    task = asyncio.create_task(client.generate(GenerateRequest(request_id="q", max_tokens=10_000)))
    await wait_running(reps["a"], "q")
    assert rs.router.in_flight_of("a") == 1  # type: ignore[attr-defined]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rs.router.in_flight_of("a") == 0  # type: ignore[attr-defined]
    assert client.in_flight == 0


async def test_incoming_partial_output_is_part_of_the_outcome() -> None:
    _, _, client = await make()
    out = await client.generate(
        GenerateRequest(
            request_id="q", partial_output=(0, 1, 2), partial_len=3, max_tokens=10, target_len=8
        )
    )
    assert out.output_tokens == tuple(range(8))
    assert out.num_tokens == 8


async def test_concurrent_requests_balance_and_release() -> None:
    rs, reps, client = await make(ids=("a", "b", "c"), tokens_per_s=SLOW)
    reqs = [GenerateRequest(request_id=f"q{i}", max_tokens=20) for i in range(9)]
    outs = await asyncio.gather(*(client.generate(r) for r in reqs))
    assert all(o.num_tokens == 20 for o in outs)
    assert sorted(r.max_concurrency for r in reps.values()) == [3, 3, 3]
    assert await rs.router.in_flight_counts() == {"a": 0, "b": 0, "c": 0}


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"max_failures": 0}, "max_failures"),
        ({"max_aborts": -1}, "max_aborts"),
        ({"backoff_factor": 0.5}, "backoff_factor"),
        ({"backoff_initial_s": -1.0}, "backoff_initial_s"),
        ({"no_replica_timeout_s": float("inf")}, "no_replica_timeout_s"),
        ({"max_failures": 1.5}, "max_failures"),
        ({"partial_rollout": "yes"}, "partial_rollout"),
    ],
)
def test_bad_options_name_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises((TypeError, ValueError), match=f"ClientOptions.{field}"):
        ClientOptions(**kw)  # type: ignore[arg-type]


def test_client_takes_a_replica_set() -> None:
    with pytest.raises(TypeError, match="ReplicaSet"):
        RetryingClient(LoadBalancer(), ClientOptions())  # type: ignore[arg-type]


def test_outcome_is_frozen_and_validated() -> None:
    out = RolloutOutcome(request_id="q", num_tokens=1)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        out.num_tokens = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="num_tokens"):
        RolloutOutcome(request_id="q", num_tokens=-1)
    assert out.param_version is None


# --------------------------------------------------------------------------- property
@given(
    target=st.integers(min_value=1, max_value=120),
    abort_after_ms=st.lists(st.floats(min_value=0.0, max_value=3.0), max_size=4),
)
def test_resume_never_loses_or_duplicates_tokens(target: int, abort_after_ms: list[float]) -> None:
    """Whatever the abort schedule, the response is 0..target-1 and leases are released."""

    async def scenario() -> None:
        ids = ["a", "b", "c"]
        reps = {i: InMemoryReplica(i, tokens_per_s=40_000.0, chunk_tokens=4) for i in ids}
        rs = await set_of(list(reps.values()), ids)
        lb = rs.router
        client = RetryingClient(rs, ClientOptions(backoff_initial_s=0.0))
        task = asyncio.create_task(
            client.generate(
                GenerateRequest(request_id="q", max_tokens=target + 5, target_len=target)
            )
        )
        for delay in abort_after_ms:
            await asyncio.sleep(delay / 1000)
            for r in reps.values():
                await r.abort()
        out = await asyncio.wait_for(task, 5.0)
        assert out.output_tokens == tuple(range(target))
        assert out.num_tokens == target
        assert out.finish_reason == "stop"
        assert out.attempts == out.aborts + 1
        assert lb.total_in_flight() == 0
        served = sum(len(r.received) for r in reps.values())
        assert served == out.attempts

    asyncio.run(scenario())


class GuardedReplica(InMemoryReplica):
    """Asserts, at every generate call, that the router considers it routable."""

    def __init__(self, replica_id: str, lb: object, **kw: object) -> None:
        super().__init__(replica_id, **kw)  # type: ignore[arg-type]
        self.lb = lb
        self.unroutable_calls = 0

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if not self.lb.is_routable(self.replica_id):
            self.unroutable_calls += 1
        return await super().generate(request)


churn = st.lists(
    st.tuples(
        st.sampled_from(["remove", "add", "abort", "kill", "pause"]),
        st.sampled_from(["s0", "s1", "h0", "h1"]),
        st.floats(min_value=0.0, max_value=1.5),
    ),
    max_size=8,
)


@given(
    script=churn,
    n_requests=st.integers(min_value=1, max_value=8),
    partial=st.booleans(),
)
def test_every_request_ends_exactly_once_under_churn(
    script: list[tuple[str, str, float]], n_requests: int, partial: bool
) -> None:
    """Random removals/additions/aborts/kills while requests run.

    Invariants: no generate call reaches a replica outside routing; every request ends
    exactly once (an outcome; the test restores capacity at the end so none can fail);
    complete outcomes are exactly 0..target-1; no lease is left behind.
    """

    async def scenario() -> None:
        ids = ["s0", "s1", "h0", "h1"]
        lb = LoadBalancer()
        reps = {i: GuardedReplica(i, lb, tokens_per_s=30_000.0, chunk_tokens=4) for i in ids}
        reps["spare"] = GuardedReplica("spare", lb, tokens_per_s=30_000.0)
        rs = ReplicaSet(lb, standalone=list(reps.values()))
        await rs.route(ids)

        async def on_failure(rid: str, exc: BaseException) -> None:
            if reps[rid].is_alive:
                await rs.unroute([rid])
            else:
                rs.mark_dead(rid)

        client = RetryingClient(
            rs,
            ClientOptions(
                partial_rollout=partial,
                max_failures=len(reps) + 1,
                backoff_initial_s=0.0,
                no_replica_timeout_s=5.0,
            ),
            on_replica_failure=on_failure,
        )
        targets = [20 + 13 * i for i in range(n_requests)]
        tasks = [
            asyncio.create_task(
                client.generate(
                    GenerateRequest(request_id=f"q{i}", max_tokens=t + 10, target_len=t)
                )
            )
            for i, t in enumerate(targets)
        ]
        for op, rid, delay_ms in script:
            await asyncio.sleep(delay_ms / 1000)
            rep = reps[rid]
            if op == "remove":
                await rs.unroute([rid])
                if rep.is_alive:
                    await rep.abort()
            elif op == "add" and rep.is_alive and rep.is_accepting:
                await rs.route([rid])
            elif op == "abort" and rep.is_alive:
                await rep.abort()
            elif op == "kill":
                rep.kill()
            elif op == "pause" and rep.is_alive:
                await rs.unroute([rid])  # never expose a paused replica
                await rep.pause()
        await rs.route(["spare"])  # capacity is restored: everyone can finish
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10.0)

        assert all(isinstance(r, RolloutOutcome) for r in results), results
        outcomes = [r for r in results if isinstance(r, RolloutOutcome)]
        assert sorted(o.request_id for o in outcomes) == [f"q{i}" for i in range(n_requests)]
        for o, t in zip(outcomes, targets, strict=True):
            assert o.output_tokens == tuple(range(o.num_tokens))
            if o.truncated:
                assert not partial and o.finish_reason == "abort" and o.num_tokens < t
            else:
                assert o.num_tokens == t and o.finish_reason == "stop"
        assert sum(r.unroutable_calls for r in reps.values()) == 0
        assert lb.total_in_flight() == 0
        assert client.in_flight == 0
        assert client.completed == n_requests

    asyncio.run(scenario())
