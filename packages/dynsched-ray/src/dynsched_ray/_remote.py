"""Awaiting Ray object refs from asyncio code: always with a timeout, errors unwrapped."""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import logging
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

import ray
from ray import exceptions as rex

from dynsched_ray._errors import ActorUnavailableError, RemoteCallTimeoutError

__all__ = ["PortableError", "await_ref", "is_actor_gone", "portable_errors", "restore_error"]

logger = logging.getLogger(__name__)


_T = TypeVar("_T")


class PortableError(Exception):
    """Carries an exception across Ray when the exception itself does not pickle.

    Several exceptions (the core's typed errors among them) take constructor arguments
    that differ from their ``args``, so Ray cannot rebuild them on the driver. Actor
    methods raise this instead (see `portable_errors`); `await_ref` rebuilds the
    original type with its message and attributes.
    """

    def __init__(self, module: str, qualname: str, message: str, state: dict[str, Any]) -> None:
        super().__init__(module, qualname, message, state)
        self.module = module
        self.qualname = qualname
        self.message = message
        self.state = state

    def __str__(self) -> str:
        return f"{self.qualname}: {self.message}"


def _portable_value(value: Any) -> Any:
    if isinstance(value, BaseException):
        return to_portable(value)
    try:
        pickle.dumps(value)
    except Exception:
        return repr(value)
    return value


def to_portable(exc: BaseException) -> PortableError:
    """Describe ``exc`` as a `PortableError`."""
    if isinstance(exc, PortableError):
        return exc
    state = {k: _portable_value(v) for k, v in vars(exc).items()}
    return PortableError(type(exc).__module__, type(exc).__qualname__, str(exc), state)


def restore_error(err: PortableError) -> Exception:
    """Rebuild the exception described by ``err`` (a `RuntimeError` when its type is unknown)."""
    try:
        cls: Any = importlib.import_module(err.module)
        for part in err.qualname.split("."):
            cls = getattr(cls, part)
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            raise TypeError(cls)
        exc: Exception = cls.__new__(cls)
        Exception.__init__(exc, err.message)
        for k, v in err.state.items():
            setattr(exc, k, restore_error(v) if isinstance(v, PortableError) else v)
        return exc
    except Exception:
        return RuntimeError(f"{err.module}.{err.qualname}: {err.message}")


def portable_errors(cls: type[_T]) -> type[_T]:
    """Class decorator for actor classes: public async methods raise `PortableError`."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def method(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                raise to_portable(exc) from None

        return method

    def wrap_gen(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def method(*args: Any, **kwargs: Any) -> Any:
            try:
                async for item in fn(*args, **kwargs):
                    yield item
            except Exception as exc:
                raise to_portable(exc) from None

        return method

    for name, fn in list(vars(cls).items()):
        if name.startswith("_"):
            continue
        if inspect.isasyncgenfunction(fn):
            setattr(cls, name, wrap_gen(fn))
        elif inspect.iscoroutinefunction(fn):
            setattr(cls, name, wrap(fn))
    return cls


def is_actor_gone(exc: BaseException) -> bool:
    """True when ``exc`` says the actor itself is dead or unreachable."""
    return isinstance(exc, rex.RayActorError | ActorUnavailableError)


async def await_ref(
    ref: Any, *, timeout_s: float, what: str, cancel_on_timeout: bool = True
) -> Any:
    """Await a Ray ``ObjectRef`` without blocking the event loop.

    Args:
        ref: The object ref returned by ``actor.method.remote(...)``.
        timeout_s: Seconds to wait at most (every remote call is bounded).
        what: Name of the call, for error messages (``"router.acquire"``).
        cancel_on_timeout: Ask Ray to cancel the remote task after a timeout.

    Returns:
        The remote method's return value.

    Raises:
        RemoteCallTimeoutError: no answer within ``timeout_s``.
        ActorUnavailableError: the actor died or cannot be reached.
        Exception: the exception the remote method raised (unwrapped from Ray's
            ``RayTaskError``).
    """
    try:
        return await asyncio.wait_for(ref, timeout_s)
    except TimeoutError:
        if cancel_on_timeout:
            try:
                ray.cancel(ref)
            except Exception:  # cancelling is best effort
                logger.debug("could not cancel %s after its timeout", what, exc_info=True)
        raise RemoteCallTimeoutError(what, timeout_s) from None
    except rex.RayActorError as exc:
        raise ActorUnavailableError(what, exc) from exc
    except rex.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, PortableError):
            raise restore_error(cause) from None
        if isinstance(cause, Exception):
            raise cause from None
        raise
