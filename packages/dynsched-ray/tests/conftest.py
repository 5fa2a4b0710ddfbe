"""One local Ray cluster for the whole test session (GPUs are bookkeeping on CPU)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """Start (or join) one small local Ray cluster: 4 CPUs, 8 bookkeeping GPUs."""
    import ray

    started = False
    if not ray.is_initialized():
        for attempt in range(3):  # a loaded machine can time out the node's start-up
            try:
                ray.init(
                    address="local",  # never a `ray start` cluster found on the machine
                    num_cpus=4,
                    num_gpus=8,
                    include_dashboard=False,
                    object_store_memory=200 * 1024 * 1024,
                    namespace="dynsched-tests",
                    log_to_driver=False,
                    configure_logging=False,
                )
                break
            except Exception:
                ray.shutdown()
                if attempt == 2:
                    raise
        started = True
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama model ("model A"), built once per session."""
    from dynsched_ray import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model-a"))


@pytest.fixture(scope="session")
def rl_batch(tiny_model_dir: Path) -> Any:
    """A fixed RL batch on the tiny model: 4 prompt groups of 4 responses, on-policy logprobs."""
    from ._trainer_helpers import make_rl_batch

    return make_rl_batch(tiny_model_dir)


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after the addition task's supervised warm-up, built once per session."""
    from dynsched_ray.task.addition import AdditionTask, WarmUpOptions, warm_up

    return warm_up(tmp_path_factory.mktemp("warm"), AdditionTask(), WarmUpOptions())
