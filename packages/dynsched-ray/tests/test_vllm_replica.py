"""`VLLMReplica` on the real vLLM CPU build, two engines shared by the module.

The engines run in this process (their engine-core processes beside it) on one event loop
in a background thread (see `_vllm_helpers.LoopThread`). The last test shuts them down and
checks that no engine process is left.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from dynsched_core import GenerateRequest, ReplicaSet, RetryingClient, RolloutReplica
from dynsched_core._inmemory import ReplicaNotReadyError
from dynsched_ray import EngineStartError, ModelFilesError, TinyModelSpec, build_tiny_model
from dynsched_ray.engines.vllm.replica import VLLMReplica, check_model_folder

from ._vllm_helpers import PROMPTS, LoopThread, greedy, hf_greedy

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="session")
def tiny_model_b_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ "Model B": the tiny model with other random weights (seed 1)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model-b"), TinyModelSpec(seed=1))


async def _stop(*replicas: VLLMReplica) -> None:
    await asyncio.gather(*(r.shutdown() for r in replicas))


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path) -> Iterator[tuple[LoopThread, VLLMReplica, VLLMReplica]]:
    """Two started replicas of model A ("a" and "b") on one loop thread."""
    lt = LoopThread()
    a = VLLMReplica("a", model=tiny_model_dir)
    b = VLLMReplica("b", model=tiny_model_dir)

    async def start() -> None:
        await a.start()
        await b.start()

    lt.run(start())
    yield lt, a, b
    lt.run(_stop(a, b))
    lt.close()


def test_protocol_and_capabilities_on_cpu(engines: Any) -> None:
    _, a, _ = engines
    assert isinstance(a, RolloutReplica)
    caps = a.capabilities
    assert caps.role == "standalone" and caps.supports_sleep is False  # no sleep mode on CPU
    st = a.state()
    assert st.device == "cpu" and st.started and st.alive and st.accepting
    assert st.sleep_supported is False and st.memory_released is False


def test_greedy_is_deterministic_and_every_token_has_a_logprob(engines: Any) -> None:
    lt, a, b = engines
    first = lt.run(greedy(a, "g1"))
    again = lt.run(greedy(a, "g2"))
    other = lt.run(greedy(b, "g3"))
    for x, y, z in zip(first, again, other, strict=True):
        assert x.output_tokens == y.output_tokens == z.output_tokens
        assert x.num_tokens == 16 == len(x.output_tokens)
        assert len(x.output_logprobs) == 16
        assert all(math.isfinite(v) and v <= 0.0 for v in x.output_logprobs)
        assert x.output_logprobs == y.output_logprobs
        assert x.finish_reason == "length"
        (seg,) = x.segments
        assert seg.param_version == 0 and seg.replica_id == "a"
        assert seg.output_tokens == x.output_tokens and seg.output_logprobs == x.output_logprobs
    assert len({r.output_tokens for r in first}) == len(PROMPTS)  # prompts matter


def test_vllm_greedy_matches_transformers(engines: Any, tiny_model_dir: Path) -> None:
    lt, a, _ = engines
    got = [list(r.output_tokens) for r in lt.run(greedy(a, "hf", n=12))]
    assert got == hf_greedy(tiny_model_dir, PROMPTS, 12)


def test_abort_after_k_tokens_and_resume_on_another_replica_gives_identical_tokens(
    engines: Any,
) -> None:
    lt, a, b = engines
    prompt = [11, 22, 33, 44, 55]
    n = 160

    def req(rid: str, **kw: Any) -> GenerateRequest:
        return GenerateRequest(
            request_id=rid,
            prompt=prompt,
            prompt_len=len(prompt),
            max_tokens=n,
            metadata={"sampling": {"ignore_eos": True}},
            **kw,
        )

    async def scenario() -> tuple[Any, Any, Any, int]:
        full = await a.generate(req("full"))
        start = a.generated_tokens
        task = asyncio.create_task(a.generate(req("cut")))
        while a.generated_tokens - start < 8:  # k >= 8 tokens produced
            await asyncio.sleep(0.005)
        assert a.running == ["cut"]
        aborted_count = await a.abort(["cut"])
        cut = await task
        rest = await b.generate(
            attrs.evolve(
                req("cut"),
                max_tokens=n - cut.num_tokens,
                partial_output=cut.output_tokens,
                partial_len=cut.num_tokens,
            )
        )
        return full, cut, rest, aborted_count

    full, cut, rest, count = lt.run(scenario())
    assert count == 1
    assert cut.finish_reason == "abort" and 8 <= cut.num_tokens < n
    assert len(cut.output_logprobs) == cut.num_tokens  # what was produced comes back
    assert rest.replica_id == "b" and rest.finish_reason == "length"
    assert cut.output_tokens + rest.output_tokens == full.output_tokens
    assert a.running == [] and b.running == []


def test_retrying_client_resumes_an_aborted_request_exactly(engines: Any) -> None:
    lt, a, b = engines
    prompt = [7, 7, 300, 41]

    async def scenario() -> tuple[Any, Any]:
        rs = ReplicaSet(standalone=[a, b])
        await rs.route(["a"])
        client = RetryingClient(rs)
        r = GenerateRequest(
            request_id="client-1",
            prompt=prompt,
            prompt_len=len(prompt),
            max_tokens=120,
            metadata={"sampling": {"ignore_eos": True}},
        )
        reference = await a.generate(attrs.evolve(r, request_id="client-ref"))
        start = a.generated_tokens
        task = asyncio.create_task(client.generate(r))
        while a.generated_tokens - start < 5:
            await asyncio.sleep(0.005)
        await rs.route(["b"])
        await rs.unroute(["a"])
        await a.abort(None)
        out = await task
        await rs.route(["a"])
        return reference, out

    reference, out = lt.run(scenario())
    assert out.aborts == 1 and out.replica_ids == ("a", "b")
    assert out.output_tokens == reference.output_tokens
    assert out.output_logprobs == pytest.approx(reference.output_logprobs, abs=1e-4)
    assert [s.replica_id for s in out.segments] == ["a", "b"]


def test_unknown_abort_is_a_noop(engines: Any) -> None:
    lt, a, _ = engines
    assert lt.run(a.abort(["no-such-request"])) == 0
    assert lt.run(a.abort(None)) == 0
    assert lt.run(a.in_flight()) == 0
    assert a.state().accepting


def test_weight_update_b_then_a_restores_a_exactly(
    engines: Any, tiny_model_dir: Path, tiny_model_b_dir: Path
) -> None:
    from safetensors.torch import load_file, save

    lt, a, _ = engines
    before = lt.run(greedy(a, "wa0"))
    digest_a = lt.run(a.weight_digest())
    blob_b = save(load_file(str(tiny_model_b_dir / "model.safetensors")))

    lt.run(a.update_weights(1, blob_b))
    on_b = lt.run(greedy(a, "wb"))
    assert a.weights_version == 1 and a.state().weights_source == "bytes"
    assert lt.run(a.weight_digest()) != digest_a
    assert [list(r.output_tokens) for r in on_b] == hf_greedy(tiny_model_b_dir, PROMPTS, 16)
    assert all(r.param_version == 1 and r.segments[0].param_version == 1 for r in on_b)
    assert [r.output_tokens for r in on_b] != [r.output_tokens for r in before]

    lt.run(a.update_weights(2, str(tiny_model_dir / "model.safetensors")))  # as a path
    restored = lt.run(greedy(a, "wa1"))
    assert a.weights_version == 2 and a.state().weights_source == "path"
    assert lt.run(a.weight_digest()) == digest_a
    for x, y in zip(before, restored, strict=True):
        assert x.output_tokens == y.output_tokens
        assert x.output_logprobs == y.output_logprobs
        assert y.segments[0].param_version == 2
    (v, seconds, nbytes), *_ = a.weight_updates
    assert v == 1 and seconds > 0 and nbytes > 0


def test_weight_update_refuses_bad_payloads(engines: Any, tmp_path: Path) -> None:
    lt, a, _ = engines
    with pytest.raises(ValueError, match="weights must be"):
        lt.run(a.update_weights(3, 12345))
    with pytest.raises(ValueError, match="loading weights failed"):
        lt.run(a.update_weights(3, str(tmp_path / "missing.safetensors")))
    assert a.weights_version == 2  # unchanged


def test_sleep_on_cpu_stops_serving_and_says_no_memory_was_freed(engines: Any) -> None:
    lt, _, b = engines
    lt.run(b.sleep())
    st = b.state()
    assert st.asleep and not st.accepting
    assert st.memory_released is False  # never reported as freed on CPU
    report = b.sleep_reports[-1]
    assert report.action == "sleep" and report.memory_released is False
    assert report.freed_bytes is None and report.level == 0
    with pytest.raises(ReplicaNotReadyError, match="asleep"):
        lt.run(b.generate(GenerateRequest(request_id="z", prompt=[1, 2], max_tokens=2)))
    with pytest.raises(ReplicaNotReadyError, match="asleep"):
        lt.run(b.update_weights(9, b"x"))
    with pytest.raises(ReplicaNotReadyError, match="wake_up"):
        lt.run(b.resume())
    lt.run(b.wake_up())
    with pytest.raises(ReplicaNotReadyError, match="paused"):
        lt.run(b.generate(GenerateRequest(request_id="z", prompt=[1, 2], max_tokens=2)))
    lt.run(b.resume())
    assert b.state().accepting
    assert lt.run(greedy(b, "after-wake", n=4))[0].num_tokens == 4


def test_bad_requests_are_refused_with_the_field_named(engines: Any) -> None:
    lt, a, _ = engines
    with pytest.raises(TypeError, match="prompt"):
        lt.run(a.generate(GenerateRequest(request_id="t", prompt="text", max_tokens=2)))
    with pytest.raises(ValueError, match="metadata\\['sampling'\\]"):
        lt.run(
            a.generate(
                GenerateRequest(
                    request_id="t", prompt=[1], max_tokens=2, metadata={"sampling": {"bogus": 1}}
                )
            )
        )
    # a zero budget returns at once, finished
    res = lt.run(a.generate(GenerateRequest(request_id="t0", prompt=[1, 2], max_tokens=0)))
    assert res.num_tokens == 0 and res.finish_reason == "length"


def test_sampling_comes_from_the_request(engines: Any) -> None:
    lt, a, _ = engines

    def r(rid: str, **kw: Any) -> GenerateRequest:
        return GenerateRequest(request_id=rid, prompt=[4, 5, 6], max_tokens=12, **kw)

    s1 = lt.run(a.generate(r("s1", temperature=1.0, top_p=0.9, seed=3)))
    s2 = lt.run(a.generate(r("s2", temperature=1.0, top_p=0.9, seed=3)))
    s3 = lt.run(a.generate(r("s3", temperature=1.0, top_p=0.9, seed=4)))
    assert s1.output_tokens == s2.output_tokens  # same seed, same sample
    assert s1.output_tokens != s3.output_tokens  # the seed matters
    assert len(s1.output_logprobs) == s1.num_tokens


def test_malformed_or_missing_model_files_fail_fast_with_a_clear_error(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    with pytest.raises(ModelFilesError, match="not a folder") as err:
        check_model_folder(tmp_path / "nope")
    assert err.value.key == "model"
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(ModelFilesError, match="config.json"):
        check_model_folder(bad)
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ModelFilesError, match="not valid JSON"):
        check_model_folder(bad)
    (bad / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelFilesError, match="no weight file"):
        check_model_folder(bad)
    (bad / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelFilesError, match="empty weight"):
        check_model_folder(bad)
    assert check_model_folder(tiny_model_dir) == tiny_model_dir

    replica = VLLMReplica("m", model=bad)
    with pytest.raises(ModelFilesError):
        asyncio.run(replica.start())
    assert not replica.is_started and replica.engine_pids == []
    with pytest.raises(ValueError, match="sleep_level"):
        VLLMReplica("m", model=bad, sleep_level=3)
    with pytest.raises(ValueError, match="sampling keys"):
        VLLMReplica("m", model=bad, sampling={"temprature": 0.0})


def test_startup_timeout_stops_what_was_started(tiny_model_dir: Path) -> None:
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    replica = VLLMReplica("slow", model=tiny_model_dir)
    with pytest.raises(EngineStartError, match="did not start within") as err:
        asyncio.run(replica.start(timeout_s=3.0))
    assert err.value.timed_out and err.value.replica_id == "slow"
    assert not replica.is_started

    def leftovers() -> list[int]:
        return [
            p.pid
            for p in me.children(recursive=True)
            if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE
        ]

    psutil.wait_procs([psutil.Process(p) for p in leftovers()], timeout=30)
    assert leftovers() == []


def test_torch_trainer_weights_drive_the_vllm_replica_like_transformers(
    engines: Any, tiny_model_dir: Path, rl_batch: Any
) -> None:
    """Cross test: TorchTrainer steps -> export_weights -> VLLMReplica.update_weights."""
    from dynsched_ray import TorchTrainer, TrainerOptions
    from safetensors.torch import load

    lt, a, _ = engines
    lt.run(a.update_weights(10, str(tiny_model_dir)))  # model A (a folder path)
    before = [list(r.output_tokens) for r in lt.run(greedy(a, "tr0", n=12))]
    trainer = TorchTrainer(tiny_model_dir, TrainerOptions(lr=5e-2, device="cpu"))
    for _ in range(3):
        trainer.train_step(rl_batch)
    version, blob = trainer.export_weights(as_bytes=True)
    assert version == 3 and isinstance(blob, bytes)
    lt.run(a.update_weights(version, blob))
    after = lt.run(greedy(a, "tr1", n=12))
    assert all(r.param_version == 3 for r in after)
    got = [list(r.output_tokens) for r in after]
    assert got == hf_greedy(tiny_model_dir, PROMPTS, 12, state=load(blob))
    assert got != before  # the trained weights changed the output
    lt.run(a.update_weights(11, str(tiny_model_dir)))
    assert [list(r.output_tokens) for r in lt.run(greedy(a, "tr2", n=12))] == before


def test_gpu_replica_check_script_cpu_path(
    engines: Any, tiny_model_dir: Path, tiny_model_b_dir: Path, capsys: Any
) -> None:
    """The prepared GPU script's checks run here on CPU (no GPU is lent to CI)."""
    import importlib.util

    script = Path(__file__).resolve().parents[3] / "scripts" / "gpu_replica_check.py"
    spec = importlib.util.spec_from_file_location("gpu_replica_check", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lt, _, b = engines
    report = lt.run(module.check_replica(b, tiny_model_dir, tiny_model_b_dir, "cpu"))
    assert report["checks"] and all(report["checks"].values()), report["checks"]
    assert report["sleep"][1]["report"]["memory_released"] is False
    assert module.main(["--device", "cuda"]) == 2  # no CUDA here: says so, runs nothing
    assert "no CUDA device" in capsys.readouterr().out


def test_weight_update_with_a_request_in_flight_stamps_both_versions(
    engines: Any, tiny_model_dir: Path, tiny_model_b_dir: Path
) -> None:
    """A weight update while a request generates: the engine pauses (keeping the request),
    loads, resets the cache and resumes; the request finishes with every token, in two
    segments stamped with the old and the new version, and the new weights take effect."""
    lt, a, _ = engines
    lt.run(a.update_weights(20, str(tiny_model_dir)))  # model A
    ids, n = PROMPTS[0], 200
    (uninterrupted,) = hf_greedy(tiny_model_dir, [ids], n)
    blob_b = (tiny_model_b_dir / "model.safetensors").read_bytes()

    async def update_mid_way() -> tuple[Any, bool]:
        start = a.generated_tokens
        task = asyncio.ensure_future(
            a.generate(
                GenerateRequest(
                    request_id="inflight-0",
                    prompt=ids,
                    prompt_len=len(ids),
                    max_tokens=n,
                    metadata={"sampling": {"ignore_eos": True}},
                )
            )
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while a.generated_tokens - start < 8 and not task.done() and loop.time() < deadline:
            await asyncio.sleep(0.002)
        early = task.done()
        await a.update_weights(21, blob_b)
        return await task, early

    res, finished_early = lt.run(update_mid_way())
    assert not finished_early, "the request ended before the update: nothing was tested"
    assert res.num_tokens == n and res.finish_reason == "length"
    assert [s.param_version for s in res.segments] == [20, 21]
    assert sum(s.num_tokens for s in res.segments) == n
    assert list(res.output_tokens) == [t for s in res.segments for t in s.output_tokens]
    assert len(res.output_logprobs) == n
    k = res.segments[0].num_tokens
    assert k >= 8
    # the first segment is model A's greedy output; model B's weights changed the rest
    assert list(res.segments[0].output_tokens) == uninterrupted[:k]
    assert list(res.output_tokens) != uninterrupted
    assert a.weights_version == 21


def test_shutdown_leaves_no_engine_process(engines: Any) -> None:
    import psutil

    lt, a, b = engines
    pids = a.engine_pids + b.engine_pids
    assert pids and all(psutil.pid_exists(p) for p in pids)
    lt.run(_stop(a, b))
    _gone, alive = psutil.wait_procs(
        [psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=30
    )
    assert [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    assert not a.state().alive and a.engine_pids == []
    with pytest.raises(Exception, match="shut down"):
        lt.run(a.generate(GenerateRequest(request_id="late", prompt=[1], max_tokens=1)))
