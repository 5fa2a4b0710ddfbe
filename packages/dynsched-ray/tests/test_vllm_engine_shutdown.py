"""An engine shut down by `VLLMReplica` is not shut down again by its finaliser.

vLLM's ``AsyncLLM.__del__`` calls ``shutdown()`` again; for an engine that lives until the
interpreter exits, that call runs after the module globals it uses are gone and printed
a traceback after pytest's summary ("Exception ignored in: AsyncLLM.__del__"). No vLLM
needed: a stand-in engine with the same ``__del__``.
"""

from __future__ import annotations

import gc

from dynsched_ray.engines.vllm.replica import _shutdown_engine


class AsyncLLM:
    """Like vLLM's: ``__del__`` calls ``shutdown()``."""

    calls = 0

    def __del__(self) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        AsyncLLM.calls += 1


def test_the_finaliser_of_a_shut_down_engine_does_nothing() -> None:
    AsyncLLM.calls = 0
    engine = AsyncLLM()
    _shutdown_engine(engine)
    _shutdown_engine(engine)  # twice is fine
    assert isinstance(engine, AsyncLLM) and type(engine).__name__ == "AsyncLLM"
    assert AsyncLLM.calls == 2
    del engine
    gc.collect()
    assert AsyncLLM.calls == 2  # before: 3 (the finaliser shut it down once more)
