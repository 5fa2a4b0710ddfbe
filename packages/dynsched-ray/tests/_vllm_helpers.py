"""Helpers of the vLLM tests: an event loop in a thread that owns in-process engines.

vLLM's ``AsyncLLM`` binds its output handler to the event loop it first runs on, while
pytest-asyncio gives each test a fresh loop. Engines shared by a module therefore live on
one loop in a background thread, and each test submits a coroutine to it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

PROMPTS: list[list[int]] = [[5, 17, 42, 7], [9, 8, 300, 12, 77], [100, 3, 250]]


class LoopThread:
    """An asyncio loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 600.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def hf_greedy(
    folder: Path | str, prompts: Sequence[list[int]], n: int, state: Any = None
) -> list[list[int]]:
    """transformers' greedy continuation of each prompt (``state``: weights to load first)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    if state is not None:
        model.load_state_dict(state, strict=True)
    out = []
    for ids in prompts:
        with torch.no_grad():
            gen = model.generate(
                torch.tensor([ids]),
                max_new_tokens=n,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=2,
            )
        out.append([int(x) for x in gen[0, len(ids) :]])
    return out


async def greedy(
    replica: Any, tag: str, n: int = 16, prompts: Sequence[list[int]] = PROMPTS
) -> list[Any]:
    """Greedy results of ``replica`` for each prompt (ignore_eos: always ``n`` tokens)."""
    from dynsched_core import GenerateRequest

    out = []
    for i, ids in enumerate(prompts):
        out.append(
            await replica.generate(
                GenerateRequest(
                    request_id=f"{tag}-{i}",
                    prompt=ids,
                    prompt_len=len(ids),
                    max_tokens=n,
                    temperature=0.0,
                    metadata={"sampling": {"ignore_eos": True}},
                )
            )
        )
    return out
