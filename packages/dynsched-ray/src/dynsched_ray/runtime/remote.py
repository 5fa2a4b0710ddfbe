"""Awaiting Ray object refs from asyncio code: always with a timeout, errors unwrapped."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray
from ray import exceptions as rex

from dynsched_ray.runtime.errors import ActorUnavailableError, RemoteCallTimeoutError

__all__ = ["await_ref", "inject_call_delay", "is_actor_gone"]

logger = logging.getLogger(__name__)


#: Fault injection: ``(delay_s, until)`` on the loop clock; see `inject_call_delay`.
_CALL_DELAY: list[tuple[float, float]] = []


def inject_call_delay(delay_s: float, duration_s: float) -> None:
    """Fault injection: delay every actor call awaited through `await_ref` by ``delay_s``
    for the next ``duration_s`` seconds (a transient network delay). Call it from the
    driver's event loop.

    Raises:
        ValueError: a negative delay or duration.
    """
    if not delay_s >= 0 or not duration_s >= 0:
        raise ValueError(f"delay_s and duration_s must be >= 0, got {delay_s!r} and {duration_s!r}")
    until = asyncio.get_running_loop().time() + duration_s
    _CALL_DELAY[:] = [(float(delay_s), until)]


def _injected_delay() -> float:
    if not _CALL_DELAY:
        return 0.0
    delay, until = _CALL_DELAY[0]
    if asyncio.get_running_loop().time() >= until:
        _CALL_DELAY.clear()
        return 0.0
    return delay


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
    delay = _injected_delay()
    if delay:
        await asyncio.sleep(min(delay, timeout_s))
    try:
        return await asyncio.wait_for(ref, timeout_s)
    except rex.RayActorError as exc:
        raise ActorUnavailableError(what, exc) from exc
    except rex.RayTaskError as exc:
        # Checked before TimeoutError: Ray's task error also derives from the remote
        # exception's type, so a remote SampleWaitTimeoutError *is* a TimeoutError.
        # The core's typed errors pickle with their fields: re-raise the original.
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None
        raise
    except TimeoutError:
        if cancel_on_timeout:
            try:
                ray.cancel(ref)
            except Exception:  # cancelling is best effort
                logger.debug("could not cancel %s after its timeout", what, exc_info=True)
        raise RemoteCallTimeoutError(what, timeout_s) from None
