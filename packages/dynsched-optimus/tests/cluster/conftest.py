"""Fixtures for the cluster-simulator tests."""

from __future__ import annotations

import pytest
from dynsched_optimus.cluster import ModelProfile, PolluxDataError, find_pollux_data, load_profiles


@pytest.fixture(scope="session")
def pollux_root():  # type: ignore[no-untyped-def]
    try:
        return find_pollux_data()
    except PolluxDataError as exc:  # pragma: no cover - data is vendored next to the repo
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def profiles(pollux_root) -> dict[str, ModelProfile]:  # type: ignore[no-untyped-def]
    return load_profiles(pollux_root)
