"""Repository-wide pytest settings: hypothesis profiles and thread limits."""

from __future__ import annotations

import contextlib
import os

# torch.utils.cpp_extension (imported by megatron-core and vLLM) imports setuptools, whose
# distutils override then asserts that `distutils` resolves to setuptools' copy. In one
# CI run (the first on a fresh machine) that assertion failed mid-session, 24 Megatron and
# vLLM tests in a row, with stdlib distutils found instead; the same commit passed on the
# next run and every test passes alone (trigger not found). Importing setuptools once
# here, in a clean interpreter, makes the override happen before any test runs.
with contextlib.suppress(ImportError):
    import setuptools  # noqa: F401

os.environ.setdefault("OMP_NUM_THREADS", "1")

# Ray starts its worker processes (every actor: replicas, trainers, queue, router) at
# niceness 15 by default. Beside other work on the same cores (the CI check with two busy
# processes) such a worker gets about 3 % of a core: one test's fleet took 3 min to start
# instead of 10 s and ran into its timeout. The tests' clusters (the session-wide one and
# those the CLI subprocesses start, which inherit this environment) start their workers at
# the tests' own priority. Production runs keep Ray's default.
os.environ.setdefault("RAY_worker_niceness", "0")

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
#: 3 s) run first, on a quiet machine: later in the session the session-wide Ray cluster
#: and the engine processes of other tests share the same two cores. Then the
#: allocation-heavy property tests of pure-Python code: run after the in-process vLLM
#: engines and models have grown this process's heap to millions of objects, every
#: garbage collection walks that heap and a 3 s test took over 300 s (its timeout).
_RUN_FIRST = ("test_cli_interrupt.py", "test_verl_policy_source.py")


def pytest_collection_modifyitems(session, config, items):  # type: ignore[no-untyped-def]
    rank = {name: i for i, name in enumerate(_RUN_FIRST)}
    items.sort(key=lambda it: rank.get(it.path.name, len(rank)))  # stable: the rest keep order
