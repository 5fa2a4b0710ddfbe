"""`HFReplica.abort` flags exactly its running requests (`mark_aborted`), no Ray started:
an abort of unknown ids is a no-op, an abort of all ends the running request with its
tokens so far and ``finish_reason="abort"``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from dynsched_core import GenerateRequest
from dynsched_ray.engines.hf.replica import HFReplica
from dynsched_ray.task.addition import TaskTokenizer


async def test_abort_flags_only_the_running_requests(warm_model: Path) -> None:
    # no stop token: the request runs until its budget or an abort
    rep = HFReplica("s0", model=warm_model, temperature=0.0, eos_token_id=-1)
    prompt = TaskTokenizer(warm_model).encode_prompt("2+3=")
    assert await rep.abort(None) == 0  # nothing runs
    long = GenerateRequest(request_id="long", prompt=prompt, max_tokens=400)
    task = asyncio.ensure_future(rep.generate(long))
    while await rep.in_flight() == 0:  # it starts at its first event-loop turn
        await asyncio.sleep(0)
    # the replica's calls below do not yield: the request cannot finish in between
    assert await rep.abort(["someone-else", "nobody"]) == 0
    assert await rep.in_flight() == 1 and not task.done()
    assert await rep.abort(None) == 1
    out = await asyncio.wait_for(task, 120)
    assert out.finish_reason == "abort" and out.num_tokens < 400
    assert await rep.in_flight() == 0


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-0.5B", "no-such-folder"])
def test_the_hf_engine_loads_a_local_folder_only(tmp_path: Path, model: str) -> None:
    """A name that is not a local model folder (e.g. a model hub id) is one clear error,
    never a download."""
    with pytest.raises(FileNotFoundError, match=r"HFReplica model must be .* config\.json"):
        HFReplica("s0", model=tmp_path / model)
    with pytest.raises(FileNotFoundError, match=r"HFReplica model"):
        HFReplica("s0", model=model)
