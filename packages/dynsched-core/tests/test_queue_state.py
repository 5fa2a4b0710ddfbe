"""`AsyncSampleQueue.state_dict` / `load_state_dict`: a rebuilt queue continues exactly."""

from __future__ import annotations

import asyncio

import pytest
from dynsched_core import AsyncSampleQueue
from hypothesis import given
from hypothesis import strategies as st


@given(st.lists(st.sampled_from(["put", "get"]), max_size=40))
def test_round_trip_keeps_contents_order_and_counters(ops: list[str]) -> None:
    async def run() -> None:
        q = AsyncSampleQueue(capacity=8)
        n = 0
        for op in ops:
            if op == "put" and q.qsize() < 8:
                await q.put(n)
                n += 1
            elif op == "get" and q.qsize():
                await q.get(1, timeout=0)
        state = q.state_dict()
        fresh = AsyncSampleQueue(capacity=8)
        fresh.load_state_dict(state)
        assert fresh.stats_nowait() == q.stats_nowait()
        assert fresh.get_nowait() == q.get_nowait()

    asyncio.run(run())


async def test_load_wakes_waiters_and_validates() -> None:
    q = AsyncSampleQueue(capacity=4)
    waiter = asyncio.ensure_future(q.wait_for(2, timeout=5.0))
    await asyncio.sleep(0)
    q.load_state_dict(
        {
            "format": 1,
            "items": ["a", "b"],
            "produced": 2,
            "consumed": 0,
            "dropped": 0,
            "closed": False,
        }
    )
    assert await waiter == 2
    with pytest.raises(ValueError, match="format"):
        q.load_state_dict({"format": 9})
    with pytest.raises(ValueError, match="lacks keys"):
        q.load_state_dict({"format": 1, "items": []})
    with pytest.raises(ValueError, match="capacity 4"):
        q.load_state_dict(
            {
                "format": 1,
                "items": list(range(5)),
                "produced": 5,
                "consumed": 0,
                "dropped": 0,
                "closed": False,
            }
        )
