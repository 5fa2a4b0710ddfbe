"""Repository-wide pytest settings: hypothesis profiles and thread limits."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass
else:
    # Bounded profile for CI (2 cores, whole run well under an hour).
    settings.register_profile(
        "ci",
        max_examples=40,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
        print_blob=True,
    )
    settings.register_profile("dev", max_examples=200, deadline=None)
    settings.register_profile("thorough", max_examples=2000, deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


#: Tests whose assertions include a wall-clock bound on a subprocess (Ctrl-C stops within
#: 3 s). They run first, on a quiet machine: later in the session the session-wide Ray
#: cluster and the engine processes of other tests share the same two cores.
_RUN_FIRST = ("test_cli_interrupt.py",)


def pytest_collection_modifyitems(session, config, items):  # type: ignore[no-untyped-def]
    first = [it for it in items if it.path.name in _RUN_FIRST]
    if first:
        rest = [it for it in items if it.path.name not in _RUN_FIRST]
        items[:] = [*first, *rest]
