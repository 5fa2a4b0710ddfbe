"""SimReplica: processor sharing matches a brute-force reference; protocol behaviour."""

from __future__ import annotations

import asyncio

import pytest
from dynsched_core import GenerateRequest, RolloutReplica
from dynsched_sim import (
    EngineModel,
    HardwareModel,
    LLMModel,
    ReplicaNotServingError,
    SimReplica,
    SimReplicaOptions,
    run_virtual,
)
from hypothesis import given
from hypothesis import strategies as st

HW = HardwareModel()
LLM = LLMModel(params_b=7.0)


def _engine(max_num_seqs: int = 4, prefill: float = 0.0) -> EngineModel:
    return EngineModel(
        gpus_per_replica=1,
        decode_base_s=0.01,
        decode_per_seq_s=0.002,
        prefill_s_per_token=prefill,
        max_num_seqs=max_num_seqs,
        kv_tokens_per_seq=64.0,
    )


def _reference(engine: EngineModel, cap: int, jobs: list[tuple[float, int]]) -> list[float]:
    """O(n)-per-event fluid simulation: FIFO admission, equal per-sequence rate."""
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i][0], i))
    waiting: list[int] = []
    running: dict[int, float] = {}
    done = [0.0] * len(jobs)
    now = 0.0
    k = 0
    while k < len(order) or waiting or running:
        t_arr = jobs[order[k]][0] if k < len(order) else float("inf")
        if running:
            rate = engine.per_seq_rate(len(running))
            j = min(running, key=lambda i: (running[i], i))
            t_dep = now + running[j] / rate
        else:
            t_dep = float("inf")
        t = min(t_arr, t_dep)
        if running:
            rate = engine.per_seq_rate(len(running))
            for i in running:
                running[i] -= (t - now) * rate
        now = t
        if t_dep <= t_arr:
            for i in [i for i, r in running.items() if r <= 1e-9 * max(1.0, jobs[i][1])]:
                del running[i]
                done[i] = now
        else:
            waiting.append(order[k])
            k += 1
        while waiting and len(running) < cap:
            i = waiting.pop(0)
            running[i] = float(jobs[i][1])
    return done


def _simulate(engine: EngineModel, jobs: list[tuple[float, int]]) -> tuple[list[float], int]:
    async def main() -> tuple[list[float], int]:
        loop = asyncio.get_running_loop()
        rep = SimReplica("r", engine, HW, LLM)
        done = [0.0] * len(jobs)

        async def one(i: int, at: float, length: int) -> None:
            await asyncio.sleep(at)
            res = await rep.generate(
                GenerateRequest(request_id=f"q{i}", max_tokens=10**9, target_len=length)
            )
            assert res.num_tokens == length and res.finish_reason == "stop"
            done[i] = loop.time()

        await asyncio.gather(*(one(i, a, n) for i, (a, n) in enumerate(jobs)))
        return done, rep.max_running

    return run_virtual(main())


@given(
    st.lists(
        st.tuples(st.floats(0.0, 50.0).map(lambda x: round(x, 3)), st.integers(1, 400)),
        min_size=1,
        max_size=25,
    ),
    st.integers(1, 6),
)
def test_processor_sharing_matches_brute_force(jobs: list[tuple[float, int]], cap: int) -> None:
    # distinct arrival times (equal timers have no defined order in asyncio's heap)
    jobs = [(round(a, 2) + i * 1e-4, n) for i, (a, n) in enumerate(jobs)]
    engine = _engine(max_num_seqs=cap)
    got, max_running = _simulate(engine, jobs)
    assert max_running == cap
    want = _reference(engine, cap, jobs)
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, rel=1e-6, abs=1e-6)


def test_is_a_rollout_replica_and_reports_capabilities() -> None:
    rep = SimReplica("h", _engine(), HW, LLM, role="hybrid")
    assert isinstance(rep, RolloutReplica)
    assert rep.capabilities.role == "hybrid" and rep.capabilities.num_gpus == 1
    assert rep.state == "asleep"


def test_abort_returns_tokens_so_far_and_budget_gives_length() -> None:
    engine = _engine(max_num_seqs=8)

    async def main() -> list[tuple[int, str]]:
        rep = SimReplica("r", engine, HW, LLM)
        t1 = asyncio.ensure_future(
            rep.generate(GenerateRequest(request_id="a", max_tokens=10**6, target_len=10**5))
        )
        t2 = asyncio.ensure_future(
            rep.generate(GenerateRequest(request_id="b", max_tokens=50, target_len=10**5))
        )
        t3 = asyncio.ensure_future(
            rep.generate(
                GenerateRequest(request_id="c", max_tokens=100, partial_len=30, target_len=60)
            )
        )
        await asyncio.sleep(10.0)
        assert await rep.in_flight() == 1
        assert await rep.abort() == 1
        out = [await t for t in (t1, t2, t3)]
        return [(r.num_tokens, r.finish_reason) for r in out]

    (na, ra), (nb, rb), (nc, rc) = run_virtual(main())
    assert ra == "abort" and 0 < na < 10**5
    # 3 sequences for the first stretch, then fewer: tokens bounded by the 1-sequence rate
    assert na <= 10.0 * engine.per_seq_rate(1)
    assert (nb, rb) == (50, "length")
    assert (nc, rc) == (30, "stop")


def test_sleep_wake_resume_cycle_and_costs() -> None:
    engine = _engine()

    async def main() -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        rep = SimReplica(
            "h",
            engine,
            HW,
            LLM,
            role="hybrid",
            options=SimReplicaOptions(extra_wake_s=3.0, extra_sleep_s=1.0),
        )
        with pytest.raises(ReplicaNotServingError):
            await rep.generate(GenerateRequest(request_id="x", max_tokens=5))
        t0 = loop.time()
        await rep.wake_up()
        t_wake = loop.time() - t0
        assert rep.state == "paused"
        # awake but not resumed: accepted, held until resume
        early = asyncio.ensure_future(rep.generate(GenerateRequest(request_id="e", max_tokens=5)))
        t0 = loop.time()
        await rep.update_weights(3)
        t_sync = loop.time() - t0
        assert not early.done() and rep.requests_while_paused == 1
        await rep.resume()
        res = await rep.generate(GenerateRequest(request_id="x", max_tokens=5))
        assert res.num_tokens == 5 and res.param_version == 3
        assert (await early).num_tokens == 5
        t0 = loop.time()
        await rep.sleep()
        assert rep.state == "asleep"
        return t_wake, t_sync, loop.time() - t0

    t_wake, t_sync, t_sleep = run_virtual(main())
    assert t_wake == pytest.approx(engine.wake_s(HW, LLM) + 3.0)
    assert t_sync == pytest.approx(engine.local_sync_s(HW, LLM))
    assert t_sleep == pytest.approx(engine.sleep_s(HW, LLM) + 1.0)


def test_hybrid_has_less_kv_capacity_than_standalone() -> None:
    engine = EngineModel(
        gpus_per_replica=1,
        max_num_seqs=10_000,
        kv_tokens_per_seq=4096.0,
        standalone_memory_fraction=0.9,
        hybrid_memory_fraction=0.4,
    )
    assert engine.max_running("hybrid", HW, LLM) < engine.max_running("standalone", HW, LLM)
    assert engine.peak_throughput("hybrid", HW, LLM) < engine.peak_throughput("standalone", HW, LLM)


def test_weight_sync_pauses_decoding() -> None:
    engine = _engine()

    async def main() -> float:
        loop = asyncio.get_running_loop()
        rep = SimReplica("r", engine, HW, LLM)
        task = asyncio.ensure_future(
            rep.generate(GenerateRequest(request_id="a", max_tokens=100, target_len=100))
        )
        await asyncio.sleep(0.1)
        await rep.update_weights(1)
        await task
        return loop.time()

    alone = 100 / engine.per_seq_rate(1)
    assert run_virtual(main()) == pytest.approx(alone + engine.broadcast_sync_s(HW, LLM))


def test_event_count_grows_linearly_with_requests() -> None:
    """Processor sharing re-arms one timer per change: O(1) loop events per arrival/departure.

    A design that touched every running sequence on every change (one timer each) would
    schedule on the order of n^2 callbacks here.
    """
    engine = EngineModel(
        gpus_per_replica=1,
        max_num_seqs=4096,
        kv_tokens_per_seq=1.0,
        decode_base_s=0.01,
        decode_per_seq_s=1e-5,
    )
    n = 3000

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        rep = SimReplica("r", engine, HW, LLM)
        before = loop.callbacks_scheduled  # type: ignore[attr-defined]
        reqs = [
            GenerateRequest(request_id=f"q{i}", max_tokens=10**6, target_len=100 + i)
            for i in range(n)
        ]
        res = await asyncio.gather(*(rep.generate(r) for r in reqs))
        assert [r.num_tokens for r in res] == [100 + i for i in range(n)]
        return loop.callbacks_scheduled - before, rep.max_running  # type: ignore[attr-defined]

    events, running = run_virtual(main())
    assert running >= n
    assert events < 8 * n  # measured: 5 per request


@pytest.mark.parametrize("role", ["standalone", "hybrid"])
def test_identity_comes_from_the_core_base(role: str) -> None:
    from dynsched_core.rollout import ReplicaIdentity

    rep = SimReplica("r7", _engine(), HW, LLM, role=role, options=SimReplicaOptions(node="n2"))
    assert isinstance(rep, ReplicaIdentity) and isinstance(rep, RolloutReplica)
    assert (rep.replica_id, rep.role) == ("r7", role)
    assert (rep.capabilities.role, rep.capabilities.node) == (role, "n2")
    assert rep.capabilities.num_gpus == _engine().gpus_per_replica


@pytest.mark.parametrize("field", ["extra_wake_s", "extra_sleep_s"])
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_options_reject_bad_switch_costs_naming_the_field(field: str, bad: float) -> None:
    with pytest.raises(ValueError, match=field):
        SimReplicaOptions(**{field: bad})


def test_options_group_defaults_to_the_replica_id() -> None:
    rep = SimReplica("r9", _engine(), HW, LLM, options=SimReplicaOptions(node="n1"))
    assert rep._group == "r9" and rep.capabilities.node == "n1"
    grouped = SimReplica("r9", _engine(), HW, LLM, options=SimReplicaOptions(group="g"))
    assert grouped._group == "g"
