"""Per-token logprobs and version-stamped segments travel from attempts into the outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from dynsched_core import (
    GenerateRequest,
    GenerateResult,
    InMemoryReplica,
    ReplicaCapabilities,
    ReplicaSet,
    RetryingClient,
)
from dynsched_core.rollout import RolloutOutcome, TokenSegment
from dynsched_core.trainer import TrainBatch


class ScriptedReplica:
    """Returns scripted attempts: (tokens, logprobs or None, version, aborted)."""

    def __init__(self, rid: str, script: list[tuple[list[int], list[float] | None, int, bool]]):
        self._id = rid
        self._script = list(script)
        self.requests: list[GenerateRequest] = []

    @property
    def replica_id(self) -> str:
        return self._id

    @property
    def capabilities(self) -> ReplicaCapabilities:
        return ReplicaCapabilities()

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.requests.append(request)
        tokens, lps, version, aborted = self._script.pop(0)
        seg = TokenSegment(
            num_tokens=len(tokens),
            param_version=version,
            output_tokens=tokens,
            output_logprobs=lps or (),
            replica_id=self._id,
        )
        return GenerateResult(
            request_id=request.request_id,
            replica_id=self._id,
            output_tokens=tuple(tokens),
            num_tokens=len(tokens),
            finish_reason="abort" if aborted else "length",
            param_version=version,
            output_logprobs=lps or (),
            segments=(seg,) if lps is not None else (),
        )

    async def abort(self, request_ids: Sequence[str] | None = None) -> int:
        return 0

    async def sleep(self) -> None: ...
    async def wake_up(self) -> None: ...
    async def resume(self) -> None: ...
    async def update_weights(self, version: int, weights: Any = None) -> None: ...
    async def in_flight(self) -> int:
        return 0


async def _run(script: list[Any], **req: Any) -> RolloutOutcome:
    rs = ReplicaSet(standalone=[ScriptedReplica("a", script)])
    await rs.route(["a"])
    client = RetryingClient(rs)
    return await client.generate(GenerateRequest(request_id="r", max_tokens=5, **req))


async def test_logprobs_and_segments_are_joined_over_attempts() -> None:
    out = await _run([([1, 2], [-0.5, -0.25], 3, True), ([3, 4, 5], [-1.0, -2.0, -3.0], 4, False)])
    assert out.output_tokens == (1, 2, 3, 4, 5)
    assert out.output_logprobs == (-0.5, -0.25, -1.0, -2.0, -3.0)
    assert [(s.num_tokens, s.param_version) for s in out.segments] == [(2, 3), (3, 4)]
    assert out.param_versions == (3, 4)
    # the trainer reads them: per-token versions and logprobs
    sample = type("S", (), {"sample_id": 0, "prompt": type("P", (), {"prompt": (7,)})()})()
    sample.responses = (out,)
    batch = TrainBatch.from_samples([sample], lambda s, o: 1.0)
    assert batch.responses[0].versions == (3, 3, 4, 4, 4)
    assert batch.responses[0].logprobs == out.output_logprobs


async def test_an_attempt_without_logprobs_drops_them_but_keeps_a_stamped_segment() -> None:
    out = await _run([([1, 2], None, 1, True), ([3, 4, 5], [-1.0, -2.0, -3.0], 2, False)])
    assert out.output_logprobs == ()
    assert [(s.num_tokens, s.param_version) for s in out.segments] == [(2, 1), (3, 2)]


async def test_partial_output_of_the_caller_has_no_logprobs() -> None:
    out = await _run(
        [([3, 4, 5], [-1.0, -2.0, -3.0], 0, False)], partial_output=(1, 2), partial_len=2
    )
    assert out.output_tokens == (1, 2, 3, 4, 5) and out.output_logprobs == ()
    assert sum(s.num_tokens for s in out.segments) == 3


async def test_inmemory_replica_outcomes_get_one_segment_per_attempt() -> None:
    rep = InMemoryReplica("m", tokens_per_s=2000.0)
    rs = ReplicaSet(standalone=[rep])
    await rs.route(["m"])
    client = RetryingClient(rs)
    task = asyncio.create_task(client.generate(GenerateRequest(request_id="x", max_tokens=40)))
    await asyncio.sleep(0.005)
    await rep.abort()
    out = await task
    assert out.num_tokens == 40 and out.output_logprobs == ()
    assert sum(s.num_tokens for s in out.segments) == 40
    assert all(s.replica_id == "m" and s.param_version == 0 for s in out.segments)


def test_segment_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="output_logprobs"):
        TokenSegment(num_tokens=2, output_logprobs=(0.0,))
    with pytest.raises(ValueError, match="output_tokens"):
        TokenSegment(num_tokens=1, output_tokens=(1, 2))
    with pytest.raises(ValueError, match="num_tokens"):
        TokenSegment(num_tokens=-1)
    res = GenerateResult(request_id="r", replica_id="a", output_tokens=(1,), num_tokens=1)
    (seg,) = res.token_segments()
    assert seg.output_tokens == (1,) and seg.output_logprobs == () and seg.param_version == 0
    assert GenerateResult(request_id="r", replica_id="a").token_segments() == ()
