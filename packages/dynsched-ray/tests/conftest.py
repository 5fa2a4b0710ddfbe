"""One local Ray cluster for the whole test session (GPUs are bookkeeping on CPU)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """Start (or join) one small local Ray cluster: 4 CPUs, 8 bookkeeping GPUs."""
    import ray

    started = False
    if not ray.is_initialized():
        ray.init(
            num_cpus=4,
            num_gpus=8,
            include_dashboard=False,
            object_store_memory=200 * 1024 * 1024,
            namespace="dynsched-tests",
            log_to_driver=False,
            configure_logging=False,
        )
        started = True
    yield
    if started:
        ray.shutdown()
