"""Exceptions raised inside actors arrive on the driver with their own type and fields."""

from __future__ import annotations

import pickle

import pytest
from dynsched_core import SampleWaitTimeoutError, SwitchError
from dynsched_ray._remote import PortableError, portable_errors, restore_error, to_portable


def test_core_errors_survive_pickling_through_portable_error() -> None:
    inner = SampleWaitTimeoutError(4, 1, 2.5)
    err = SwitchError("activate", "wake_up", "hybrid-0", inner)
    wire = pickle.loads(pickle.dumps(to_portable(err)))
    back = restore_error(wire)
    assert type(back) is SwitchError
    assert (back.operation, back.step, back.replica_id) == ("activate", "wake_up", "hybrid-0")
    assert str(back) == str(err)
    assert isinstance(back.cause, SampleWaitTimeoutError)
    assert (back.cause.wanted, back.cause.available, back.cause.timeout_s) == (4, 1, 2.5)


def test_unknown_error_type_becomes_runtime_error() -> None:
    back = restore_error(PortableError("no.such.module", "Boom", "it broke", {}))
    assert type(back) is RuntimeError
    assert "Boom: it broke" in str(back)


async def test_portable_errors_wraps_public_async_methods_only() -> None:
    @portable_errors
    class Actor:
        async def fail(self) -> None:
            raise SampleWaitTimeoutError(1, 0, 1.0)

        async def _private(self) -> None:
            raise KeyError("x")

    with pytest.raises(PortableError) as info:
        await Actor().fail()
    assert info.value.qualname == "SampleWaitTimeoutError"
    with pytest.raises(KeyError):
        await Actor()._private()
