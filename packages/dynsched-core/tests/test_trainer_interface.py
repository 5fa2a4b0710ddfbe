"""The trainer interface: the batch type, its conversion from rollout samples, the loop backend."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import attrs
import pytest
from dynsched_core import ConfigError, Prompt, RolloutSample
from dynsched_core._client import RolloutOutcome
from dynsched_core.trainer import (
    GpuHandOver,
    HandOverError,
    MemoryReport,
    OffloadReport,
    TrainBatch,
    Trainer,
    TrainerLoopBackend,
    TrainMetrics,
    TrainResponse,
)
from hypothesis import given
from hypothesis import strategies as st


def _resp(group: int | str = 0, n: int = 2, reward: float = 1.0, **kw: Any) -> TrainResponse:
    return TrainResponse(
        prompt_ids=kw.pop("prompt_ids", (5, 6)),
        response_ids=kw.pop("response_ids", tuple(range(10, 10 + n))),
        logprobs=kw.pop("logprobs", (-0.5,) * n),
        reward=reward,
        group_id=group,
        **kw,
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prompt_ids": ()}, "prompt_ids"),
        ({"prompt_ids": (1, -2)}, "prompt_ids"),
        ({"logprobs": (-0.1,)}, "logprobs"),
        ({"logprobs": (-0.1, 0.5)}, "logprobs"),
        ({"logprobs": (-0.1, float("nan"))}, "logprobs"),
        ({"reward": float("inf")}, "reward"),
        ({"group": 1.5}, "group_id"),
        ({"versions": (-1,)}, "versions"),
    ],
)
def test_bad_response_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    group = kwargs.pop("group", 0)
    reward = kwargs.pop("reward", 1.0)
    with pytest.raises(ConfigError, match=field):
        _resp(group, reward=reward, **kwargs)


def test_batch_groups_split_and_staleness() -> None:
    rs = [_resp("a"), _resp("b"), _resp("a", versions=(3, 4)), _resp("c", versions=(5,))]
    batch = TrainBatch(responses=rs, version=6)
    assert batch.groups == {"a": [0, 2], "b": [1], "c": [3]}
    assert batch.num_response_tokens == 8
    assert batch.max_len == 4
    assert batch.staleness() == 3
    assert TrainBatch(responses=rs).staleness() is None
    chunks = batch.split(2)
    assert [list(c.groups) for c in chunks] == [["a", "b"], ["c"]]
    assert sum(len(c.responses) for c in chunks) == len(rs)
    with pytest.raises(ConfigError, match="groups_per_chunk"):
        batch.split(0)
    with pytest.raises(ConfigError, match="responses"):
        TrainBatch(responses=[])


@given(st.lists(st.integers(0, 5), min_size=1, max_size=20), st.integers(1, 7))
def test_split_keeps_every_response_once_and_groups_whole(groups: list[int], k: int) -> None:
    batch = TrainBatch(responses=[_resp(g, n=1, reward=float(i)) for i, g in enumerate(groups)])
    chunks = batch.split(k)
    rewards = sorted(r.reward for c in chunks for r in c.responses)
    assert rewards == [float(i) for i in range(len(groups))]
    seen: set[int | str] = set()
    for c in chunks:
        assert len(c.groups) <= k
        assert not seen & set(c.groups)  # a group lives in exactly one chunk
        seen |= set(c.groups)


def _sample(sid: str, prompt: Any, outcomes: list[RolloutOutcome]) -> RolloutSample:
    return RolloutSample(
        sample_id=sid,
        prompt=Prompt(prompt_id=sid, prompt=prompt, prompt_len=2),
        responses=tuple(outcomes),
        param_version=0,
        submitted_at=0.0,
        completed_at=1.0,
    )


@attrs.frozen(kw_only=True)
class _Outcome(RolloutOutcome):
    logprobs: tuple[float, ...] = ()


def test_from_samples_reads_tokens_logprobs_versions_and_rewards() -> None:
    o1 = _Outcome(
        request_id="p0/0",
        output_tokens=(7, 8),
        num_tokens=2,
        logprobs=(-0.1, -0.2),
        param_versions=(1, 2),
    )
    o2 = _Outcome(
        request_id="p0/1", output_tokens=(9,), num_tokens=1, logprobs=(-0.3,), param_versions=(2,)
    )
    batch = TrainBatch.from_samples(
        [_sample("p0", [3, 4], [o1, o2])],
        lambda s, o: float(len(o.output_tokens)),
        version=3,
    )
    assert [r.response_ids for r in batch.responses] == [(7, 8), (9,)]
    assert [r.prompt_ids for r in batch.responses] == [(3, 4), (3, 4)]
    assert [r.reward for r in batch.responses] == [2.0, 1.0]
    assert {r.group_id for r in batch.responses} == {"p0"}
    assert batch.staleness() == 2

    plain = RolloutOutcome(request_id="p1/0", output_tokens=(1,), num_tokens=1)
    with pytest.raises(ConfigError, match="logprobs"):
        TrainBatch.from_samples([_sample("p1", [3], [plain])], lambda s, o: 0.0)
    with pytest.raises(ConfigError, match="prompt token ids"):
        TrainBatch.from_samples([_sample("p2", "text", [o1])], lambda s, o: 0.0)
    ok = TrainBatch.from_samples(
        [_sample("p1", [3], [plain])], lambda s, o: 0.0, logprobs_of=lambda o: [-1.0]
    )
    assert ok.responses[0].logprobs == (-1.0,)


class _FakeTrainer:
    """Counts calls; holds 100 'device' bytes unless offloaded."""

    def __init__(self) -> None:
        self.version = 0
        self.is_offloaded = False
        self.calls: list[str] = []

    def _mem(self) -> MemoryReport:
        dev = 0 if self.is_offloaded else 100
        return MemoryReport(device="cpu", device_bytes=dev, host_bytes=100 - dev)

    def _move(self, direction: str, offloaded: bool) -> OffloadReport:
        before = self._mem()
        self.is_offloaded = offloaded
        self.calls.append(direction)
        return OffloadReport(
            direction=direction, before=before, after=self._mem(), moved_bytes=100, seconds=0.0
        )

    def train_step(self, batch: TrainBatch) -> TrainMetrics:
        assert not self.is_offloaded
        self.version += 1
        self.calls.append("train")
        return TrainMetrics(
            loss=0.0,
            grad_norm=0.0,
            compute_s=0.01,
            num_tokens=batch.num_response_tokens,
            num_responses=len(batch.responses),
            clip_fraction=0.0,
            ratio_mean=1.0,
            ratio_max=1.0,
            approx_kl=0.0,
            staleness=batch.staleness(),
            version=self.version,
        )

    def offload(self) -> OffloadReport:
        return self._move("offload", True)

    def reload(self) -> OffloadReport:
        return self._move("reload", False)

    def memory(self) -> MemoryReport:
        return self._mem()

    def export_weights(self, *, as_bytes: bool = False) -> tuple[int, Any]:
        self.calls.append("export")
        return self.version, (b"w" if as_bytes else {"w": self.version})

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.version}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.version = int(state["version"])


class _Replica:
    replica_id = "s0"

    def __init__(self) -> None:
        self.loaded: list[tuple[int, Any]] = []

    async def update_weights(self, version: int, weights: Any = None) -> None:
        self.loaded.append((version, weights))


def test_loop_backend_trains_syncs_and_hands_the_gpu_over() -> None:
    trainer = _FakeTrainer()
    assert isinstance(trainer, Trainer)
    replica = _Replica()
    handover = GpuHandOver()
    backend = TrainerLoopBackend(
        trainer,
        lambda samples, version: TrainBatch(responses=samples, version=version),
        {"s0": replica},
        handover=handover,
        gpu=0,
    )
    handover.register_hybrid("h0", [0])

    async def run() -> None:
        timings = await backend.train_step([_resp(0)])
        assert timings == {"update_actor": 0.01}
        weights = await backend.sync_weights(1)
        assert weights == {"w": 1} and replica.loaded == [(1, {"w": 1})]
        with pytest.raises(HandOverError):
            handover.hybrid_waking("h0")  # trainer still resident
        await backend.release()
        handover.hybrid_waking("h0")
        with pytest.raises(HandOverError, match="h0"):
            await backend.train_step([_resp(0)])  # hybrid awake: no reload
        handover.hybrid_asleep("h0")
        await backend.train_step([_resp(0)])

    asyncio.run(run())
    assert trainer.calls == ["train", "export", "offload", "reload", "train"]
    assert [m.version for m in backend.metrics] == [1, 2]
    assert backend.offloads[0].after.device_bytes == 0
    assert backend.metrics[0].as_dict()["version"] == 1.0


def test_from_samples_reads_segments_for_versions_and_logprobs() -> None:
    from types import SimpleNamespace

    seg = SimpleNamespace
    resumed = SimpleNamespace(  # resumed after an abort: the whole-response logprobs are empty
        request_id="p0/0",
        output_tokens=(7, 8, 9),
        output_logprobs=(),
        segments=(
            seg(param_version=1, num_tokens=2, output_logprobs=(-0.1, -0.2)),
            seg(param_version=2, num_tokens=1, output_logprobs=(-0.3,)),
        ),
        param_versions=(1, 2),
    )
    whole = SimpleNamespace(
        request_id="p0/1",
        output_tokens=(4,),
        output_logprobs=(-0.4,),
        segments=(),
        param_versions=(2,),
    )
    sample = SimpleNamespace(
        sample_id="p0", prompt=SimpleNamespace(prompt=[3]), responses=(resumed, whole)
    )
    batch = TrainBatch.from_samples([sample], lambda s, o: 1.0, version=4)
    assert batch.responses[0].logprobs == (-0.1, -0.2, -0.3)
    assert batch.responses[0].versions == (1, 1, 2)
    assert batch.responses[1].logprobs == (-0.4,) and batch.responses[1].versions == (2,)
    assert batch.staleness() == 3
    gap = SimpleNamespace(
        request_id="x",
        output_tokens=(1, 2),
        output_logprobs=(),
        segments=(seg(param_version=1, num_tokens=2, output_logprobs=()),),
    )
    with pytest.raises(ConfigError, match="logprobs"):
        TrainBatch.from_samples(
            [SimpleNamespace(sample_id="q", prompt=SimpleNamespace(prompt=[3]), responses=(gap,))],
            lambda s, o: 0.0,
        )
