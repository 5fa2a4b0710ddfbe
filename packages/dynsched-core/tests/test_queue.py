"""AsyncSampleQueue: bounded, counted, end-of-stream-aware waits with timeouts."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest
from dynsched_core import AsyncSampleQueue, SampleQueue
from dynsched_core._protocols import QueueStats
from dynsched_core.errors import SampleWaitTimeoutError
from hypothesis import given
from hypothesis import strategies as st


async def test_implements_sample_queue_protocol() -> None:
    assert isinstance(AsyncSampleQueue(), SampleQueue)


async def test_fifo_and_counters() -> None:
    q = AsyncSampleQueue(capacity=10)
    for i in range(5):
        await q.put(i)
    assert await q.get(3) == [0, 1, 2]
    assert q.qsize() == 2
    assert await q.size() == 2
    assert await q.stats() == QueueStats(
        size=2, produced=5, consumed=3, dropped=0, closed=False, capacity=10
    )
    assert len(q) == 2


async def test_offer_counts_dropped_when_full() -> None:
    q = AsyncSampleQueue(capacity=2)
    assert q.offer("a")
    assert q.offer("b")
    assert not q.offer("c")
    assert not q.offer("d")
    s = q.stats_nowait()
    assert (s.size, s.produced, s.dropped) == (2, 2, 2)
    assert q.get_nowait() == ["a", "b"]


async def test_bounded_put_waits_for_room() -> None:
    q = AsyncSampleQueue(capacity=1)
    await q.put(1)
    putter = asyncio.create_task(q.put(2, timeout=5.0))
    await asyncio.sleep(0.005)
    assert not putter.done()
    assert q.qsize() == 1
    assert await q.get(1) == [1]
    await asyncio.wait_for(putter, 1.0)
    assert q.get_nowait() == [2]
    assert q.produced == 2
    assert q.consumed == 2


async def test_bounded_put_times_out_without_adding() -> None:
    q = AsyncSampleQueue(capacity=1)
    await q.put(1)
    with pytest.raises(SampleWaitTimeoutError):
        await q.put(2, timeout=0.005)
    assert q.qsize() == 1
    assert q.produced == 1
    with pytest.raises(SampleWaitTimeoutError):
        await q.put(3, timeout=0)


async def test_wait_for_returns_when_enough() -> None:
    q = AsyncSampleQueue()

    async def produce() -> None:
        for i in range(3):
            await asyncio.sleep(0.002)
            await q.put(i)

    task = asyncio.create_task(produce())
    assert await q.wait_for(3, timeout=5.0) == 3
    await task
    assert await q.wait_for(0) == 3
    assert q.consumed == 0  # waiting does not consume


async def test_wait_for_returns_at_end_of_stream() -> None:
    q = AsyncSampleQueue()
    await q.put("x")

    async def finish() -> None:
        await asyncio.sleep(0.005)
        await q.close()

    task = asyncio.create_task(finish())
    assert await q.wait_for(10, timeout=5.0) == 1
    await task
    assert q.closed
    # already closed: immediate, even with a zero timeout
    assert await q.wait_for(10, timeout=0) == 1


async def test_wait_for_raises_on_timeout() -> None:
    q = AsyncSampleQueue()
    await q.put(1)
    with pytest.raises(SampleWaitTimeoutError) as info:
        await q.wait_for(2, timeout=0.005)
    assert info.value.wanted == 2
    assert info.value.available == 1
    assert isinstance(info.value, TimeoutError)


async def test_get_returns_fewer_only_at_end_of_stream_and_removes_nothing_on_timeout() -> None:
    q = AsyncSampleQueue()
    await q.put(1)
    await q.put(2)
    with pytest.raises(SampleWaitTimeoutError):
        await q.get(3, timeout=0.003)
    assert q.qsize() == 2
    await q.close()
    assert await q.get(3, timeout=0.003) == [1, 2]
    assert await q.get(3, timeout=0.003) == []
    assert q.consumed == 2


async def test_closed_queue_refuses_samples() -> None:
    q = AsyncSampleQueue(capacity=1)
    await q.close()
    await q.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await q.put(1)
    with pytest.raises(RuntimeError, match="closed"):
        q.offer(1)


async def test_close_wakes_blocked_producer_with_error() -> None:
    q = AsyncSampleQueue(capacity=1)
    await q.put(1)
    putter = asyncio.create_task(q.put(2, timeout=5.0))
    await asyncio.sleep(0.002)
    q.close_nowait()
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(putter, 1.0)


async def test_several_waiters_all_woken() -> None:
    q = AsyncSampleQueue()
    waiters = [asyncio.create_task(q.wait_for(2, timeout=5.0)) for _ in range(3)]
    await asyncio.sleep(0)
    await q.put(1)
    await q.put(2)
    assert await asyncio.gather(*waiters) == [2, 2, 2]


async def test_competing_getters_each_get_whole_batches() -> None:
    q = AsyncSampleQueue()
    g1 = asyncio.create_task(q.get(2, timeout=5.0))
    g2 = asyncio.create_task(q.get(2, timeout=5.0))
    await asyncio.sleep(0)
    for i in range(4):
        await q.put(i)
    got = sorted([await g1, await g2])
    assert got == [[0, 1], [2, 3]]


async def test_unbounded_by_default() -> None:
    q = AsyncSampleQueue()
    for i in range(1000):
        assert q.offer(i)
    assert q.capacity is None
    assert q.dropped == 0


@pytest.mark.parametrize("cap", [0, -1, True, 2.0])
def test_bad_capacity(cap: object) -> None:
    with pytest.raises(ValueError, match="capacity"):
        AsyncSampleQueue(capacity=cap)  # type: ignore[arg-type]


async def test_bad_n_and_timeout() -> None:
    q = AsyncSampleQueue(capacity=4)
    with pytest.raises(ValueError, match="capacity"):
        await q.wait_for(5)
    with pytest.raises(ValueError):
        await q.wait_for(-1)
    with pytest.raises(ValueError, match="timeout"):
        await q.wait_for(1, timeout=-1.0)
    with pytest.raises(ValueError):
        q.get_nowait(-2)


# --------------------------------------------------------------------------- property
ops = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers()),
        st.tuples(st.just("get"), st.integers(min_value=0, max_value=5)),
    ),
    max_size=60,
)


@given(capacity=st.one_of(st.none(), st.integers(min_value=1, max_value=6)), script=ops)
def test_counters_and_order_match_a_model(
    capacity: int | None, script: list[tuple[str, int]]
) -> None:
    q = AsyncSampleQueue(capacity=capacity)
    model: deque[int] = deque()
    produced = consumed = dropped = 0
    for op, arg in script:
        if op == "offer":
            accepted = q.offer(arg)
            assert accepted == (capacity is None or len(model) < capacity)
            if accepted:
                model.append(arg)
                produced += 1
            else:
                dropped += 1
        else:
            got = q.get_nowait(arg)
            want = [model.popleft() for _ in range(min(arg, len(model)))]
            assert got == want
            consumed += len(got)
        s = q.stats_nowait()
        assert (s.size, s.produced, s.consumed, s.dropped) == (
            len(model),
            produced,
            consumed,
            dropped,
        )
        assert s.produced - s.consumed == s.size
        assert capacity is None or s.size <= capacity


async def test_the_in_process_queue_implements_the_protocol() -> None:
    q = AsyncSampleQueue(capacity=2)
    assert isinstance(q, SampleQueue)
    await q.put("a")
    await q.close()
    assert await q.wait_for(2, timeout=1.0) == 1  # end-of-stream ends the wait
