"""`RetryingClient`: sends one logical request to a `ReplicaSet` until it finishes.

Per attempt: lease a replica from the set's router, call ``replica.generate``, release the
lease (always, in ``finally``). Then:

- finished (``stop``/``length``): return a `RolloutOutcome`;
- aborted, partial rollout on: re-submit prompt + tokens generated so far with the
  remaining token budget (the router picks a routable replica; a replica that left
  routing is not picked again); the re-prefilled tokens are counted;
- aborted, partial rollout off: return the truncated outcome, ``truncated=True``;
- the replica raised: a *failure* — reported through ``on_replica_failure``, that
  replica excluded for this request, retried elsewhere after an exponential backoff
  (capped); after ``max_failures`` failures `RequestFailedError` is raised.

When no replica is routable the client waits for the set's routable replicas to change
(it subscribes to the `ReplicaSet`), up to ``no_replica_timeout_s``, then raises
`NoRoutableReplicaError`.
All waits use ``asyncio.sleep``/``asyncio.wait_for`` so a virtual-time loop drives them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from dynsched_core import validators as v
from dynsched_core._clock import Clock, LoopClock
from dynsched_core._errors import NoRoutableReplicaError, RequestFailedError
from dynsched_core._protocols import FinishReason, GenerateRequest, GenerateResult
from dynsched_core._replicas import MembershipEvent, ReplicaSet

__all__ = ["ClientOptions", "ReplicaFailureCallback", "RetryingClient", "RolloutOutcome"]

logger = logging.getLogger(__name__)

ReplicaFailureCallback = Callable[[str, BaseException], "Awaitable[None] | None"]
"""``on_replica_failure(replica_id, exc)``; may be a plain function or a coroutine function."""


@attrs.frozen(kw_only=True)
class RolloutOutcome:
    """Result of one logical request over all its attempts.

    Attributes:
        request_id: Id of the request.
        output_tokens: Token ids of the whole response: the request's own
            ``partial_output`` followed by every attempt's tokens, in order.
        num_tokens: Response length in tokens (``partial_len`` of the request plus the
            tokens of every attempt); may exceed ``len(output_tokens)`` for engines that
            do not expose token ids.
        finish_reason: ``stop``/``length`` when finished, ``abort`` when truncated.
        truncated: True when an abort ended the request (partial rollout off).
        attempts: Number of ``generate`` calls made.
        aborts: Number of attempts that ended aborted.
        failures: Number of attempts that raised.
        replica_ids: Replica of each attempt, in order (repeats kept).
        reprefill_tokens: Tokens prefilled again because of resumptions: for each
            re-submission after an abort, prompt length + tokens generated so far.
        param_versions: Distinct weight versions reported by the attempts, in order.
        started_at: Loop time when `RetryingClient.generate` started.
        finished_at: Loop time when it returned.
        backoff_s: Total time slept in backoff between retries.
    """

    request_id: str
    output_tokens: tuple[int, ...] = ()
    num_tokens: int = attrs.field(default=0, validator=v.int_ge(0))
    finish_reason: FinishReason = "stop"
    truncated: bool = False
    attempts: int = attrs.field(default=0, validator=v.int_ge(0))
    aborts: int = attrs.field(default=0, validator=v.int_ge(0))
    failures: int = attrs.field(default=0, validator=v.int_ge(0))
    replica_ids: tuple[str, ...] = ()
    reprefill_tokens: int = attrs.field(default=0, validator=v.int_ge(0))
    param_versions: tuple[int, ...] = ()
    started_at: float = 0.0
    finished_at: float = 0.0
    backoff_s: float = 0.0

    @property
    def latency_s(self) -> float:
        """``finished_at - started_at``."""
        return self.finished_at - self.started_at

    @property
    def resumed(self) -> bool:
        """True when the response was continued after at least one abort."""
        return self.aborts > 0 and not self.truncated

    @property
    def param_version(self) -> int | None:
        """Latest weight version seen (``None`` when no attempt reported one)."""
        return self.param_versions[-1] if self.param_versions else None


@attrs.define
class _Progress:
    """Mutable bookkeeping of one `RetryingClient.generate` call."""

    tokens: list[int]
    length: int
    attempts: int = 0
    aborts: int = 0
    failures: int = 0
    streak: int = 0  # consecutive retries without progress (drives the backoff)
    replica_ids: list[str] = attrs.Factory(list)
    versions: list[int] = attrs.Factory(list)
    reprefill: int = 0
    backoff_s: float = 0.0


@attrs.frozen(kw_only=True)
class ClientOptions:
    """Settings of a `RetryingClient`.

    Attributes:
        partial_rollout: Resume aborted requests elsewhere, keeping generated tokens.
            When False an abort ends the request with a truncated outcome.
        max_failures: Failed attempts (replica raised) tolerated per request (>= 1); the
            ``max_failures``-th failure raises `RequestFailedError`.
        max_aborts: Aborts tolerated per request before `RequestFailedError` (>= 0;
            guards against a request bouncing forever).
        backoff_initial_s: Delay before the first retry without progress (>= 0).
        backoff_max_s: Cap of the delay (>= 0).
        backoff_factor: Growth of the delay per consecutive retry without progress (>= 1).
        no_replica_timeout_s: How long to wait for a routable replica before raising
            `NoRoutableReplicaError` (>= 0).

    A resubmission after an abort that made progress happens immediately (that is the
    point of partial rollout); retries after a failure, or after an abort that produced
    no token, wait ``min(backoff_initial_s * backoff_factor**(k-1), backoff_max_s)`` for
    the k-th such retry in a row.
    """

    partial_rollout: bool = attrs.field(default=True, validator=v.bool_())
    max_failures: int = attrs.field(default=3, validator=v.int_ge(1))
    max_aborts: int = attrs.field(default=1000, validator=v.int_ge(0))
    backoff_initial_s: float = attrs.field(default=0.05, validator=v.float_ge(0.0))
    backoff_max_s: float = attrs.field(default=2.0, validator=v.float_ge(0.0))
    backoff_factor: float = attrs.field(default=2.0, validator=v.float_ge(1.0))
    no_replica_timeout_s: float = attrs.field(default=60.0, validator=v.float_ge(0.0))

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> ClientOptions:
        """``partial_rollout`` from a `DynamicScheduleConfig`, the rest from ``overrides``."""
        return cls(**{"partial_rollout": config.partial_rollout, **overrides})


class RetryingClient:
    """Retrying, partial-rollout-aware generation client over a `ReplicaSet`.

    Requests are placed by the set's router and sent to the replicas it holds; a routed
    id that is not a live member counts as a failed attempt.

    Args:
        replicas: The replicas of the run (their router places the requests).
        options: Retry settings (default: `ClientOptions()`).
        on_replica_failure: Called with ``(replica_id, exc)`` when a replica raises (e.g.
            to check whether it died); may be a coroutine function. Its errors are logged.
        clock: Time source for outcome timestamps (default: the running loop).
    """

    def __init__(
        self,
        replicas: ReplicaSet,
        options: ClientOptions | None = None,
        *,
        on_replica_failure: ReplicaFailureCallback | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(replicas, ReplicaSet):
            raise TypeError(f"replicas must be a ReplicaSet, got {type(replicas).__name__}")
        self.options = options if options is not None else ClientOptions()
        if not isinstance(self.options, ClientOptions):
            raise TypeError(f"options must be a ClientOptions, got {self.options!r}")
        self._replicas = replicas
        self._router = replicas.router
        self._on_replica_failure = on_replica_failure
        self._clock: Clock = clock if clock is not None else LoopClock()
        # Woken whenever the set's routable replicas change.
        self._routable_version = 0
        # insertion-ordered (a dict, not a set): waiters wake in arrival order, so runs
        # on a virtual-time loop are reproducible bit for bit
        self._waiters: dict[asyncio.Future[None], None] = {}
        replicas.subscribe(self._on_membership)
        # Counters over every request.
        self._in_flight = 0
        self._completed = 0
        self._truncated = 0
        self._failed = 0
        self._total_aborts = 0
        self._total_failures = 0
        self._total_reprefill = 0

    @property
    def partial_rollout(self) -> bool:
        """Resume aborted requests elsewhere (`ClientOptions.partial_rollout`)."""
        return self.options.partial_rollout

    @property
    def replicas(self) -> ReplicaSet:
        """The replicas this client sends to."""
        return self._replicas

    # ----------------------------------------------------------------------- API
    async def generate(self, request: GenerateRequest) -> RolloutOutcome:
        """Run ``request`` to completion (or truncation), retrying as configured.

        Raises:
            RequestFailedError: ``max_failures`` attempts raised, or ``max_aborts``
                exceeded.
            NoRoutableReplicaError: no routable replica for ``no_replica_timeout_s``.
        """
        started = self._clock.now()
        p = _Progress(tokens=list(request.partial_output), length=request.partial_len)
        budget_end = request.partial_len + request.max_tokens
        excluded: set[str] = set()
        self._in_flight += 1
        try:
            while True:
                replica_id = await self._acquire(request.request_id, excluded)
                attempt = attrs.evolve(
                    request,
                    max_tokens=budget_end - p.length,
                    partial_output=tuple(p.tokens),
                    partial_len=p.length,
                )
                p.attempts += 1
                p.replica_ids.append(replica_id)
                try:
                    replica = self._replicas.get(replica_id)
                    if replica is None:
                        raise KeyError(
                            f"replica {replica_id!r} was routed but is not a live member"
                        )
                    result = await replica.generate(attempt)
                except Exception as exc:
                    error: Exception | None = exc
                else:
                    error = None
                finally:
                    await self._router.release(request.request_id, replica_id)

                if error is not None:
                    await self._on_failure(request, replica_id, error, p, excluded)
                    continue
                outcome = self._after_result(request, result, p, budget_end, started)
                if outcome is not None:
                    return outcome
                if p.streak:
                    await self._backoff(p)
        except BaseException:
            self._failed += 1
            raise
        finally:
            self._in_flight -= 1

    def backoff_delay(self, retry: int) -> float:
        """Delay before the ``retry``-th consecutive retry without progress (1-based)."""
        if retry < 1:
            return 0.0
        # Stop growing once the cap is hit (avoids float overflow on long streaks).
        delay = self.options.backoff_initial_s
        for _ in range(retry - 1):
            if delay >= self.options.backoff_max_s:
                break
            delay *= self.options.backoff_factor
        return min(delay, self.options.backoff_max_s)

    # ------------------------------------------------------------------- counters
    @property
    def in_flight(self) -> int:
        """Requests currently inside `generate`."""
        return self._in_flight

    @property
    def completed(self) -> int:
        """Requests that returned an outcome (truncated ones included)."""
        return self._completed

    @property
    def truncated(self) -> int:
        """Requests that returned a truncated outcome."""
        return self._truncated

    @property
    def failed(self) -> int:
        """Requests that ended with an exception (or were cancelled)."""
        return self._failed

    @property
    def total_aborts(self) -> int:
        """Aborted attempts over every request."""
        return self._total_aborts

    @property
    def total_failures(self) -> int:
        """Failed (raising) attempts over every request."""
        return self._total_failures

    @property
    def total_reprefill_tokens(self) -> int:
        """Re-prefilled tokens over every request (cost of resumption)."""
        return self._total_reprefill

    # ------------------------------------------------------------------ internals
    def _after_result(
        self,
        request: GenerateRequest,
        result: GenerateResult,
        p: _Progress,
        budget_end: int,
        started: float,
    ) -> RolloutOutcome | None:
        p.tokens.extend(result.output_tokens)
        p.length += result.num_tokens
        if result.param_version not in p.versions:
            p.versions.append(result.param_version)
        if not result.aborted:
            return self._finish(request, p, result.finish_reason, False, started)
        p.aborts += 1
        self._total_aborts += 1
        if not self.options.partial_rollout:
            return self._finish(request, p, "abort", True, started)
        if p.length >= budget_end:
            return self._finish(request, p, "length", False, started)
        if p.aborts > self.options.max_aborts:
            raise RequestFailedError(
                request.request_id,
                p.attempts,
                RuntimeError(f"aborted {p.aborts} times (max_aborts={self.options.max_aborts})"),
            )
        p.streak = 0 if result.num_tokens > 0 else p.streak + 1
        reprefill = request.prompt_len + p.length
        p.reprefill += reprefill
        self._total_reprefill += reprefill
        logger.debug(
            "request %s aborted on %s after %d token(s); resuming with %d left",
            request.request_id,
            result.replica_id,
            p.length,
            budget_end - p.length,
        )
        return None

    async def _on_failure(
        self,
        request: GenerateRequest,
        replica_id: str,
        exc: Exception,
        p: _Progress,
        excluded: set[str],
    ) -> None:
        p.failures += 1
        p.streak += 1
        self._total_failures += 1
        excluded.add(replica_id)
        logger.warning(
            "request %s failed on replica %s (%d/%d): %r",
            request.request_id,
            replica_id,
            p.failures,
            self.options.max_failures,
            exc,
        )
        await self._report_failure(replica_id, exc)
        if p.failures >= self.options.max_failures:
            raise RequestFailedError(request.request_id, p.attempts, exc) from exc
        await self._backoff(p)

    async def _backoff(self, p: _Progress) -> None:
        delay = self.backoff_delay(p.streak)
        if delay > 0:
            p.backoff_s += delay
            await asyncio.sleep(delay)

    async def _report_failure(self, replica_id: str, exc: BaseException) -> None:
        if self._on_replica_failure is None:
            return
        try:
            maybe = self._on_replica_failure(replica_id, exc)
            if inspect.isawaitable(maybe):
                await maybe
        except Exception:
            logger.exception("on_replica_failure callback failed for %s", replica_id)

    def _finish(
        self,
        request: GenerateRequest,
        p: _Progress,
        reason: FinishReason,
        truncated: bool,
        started: float,
    ) -> RolloutOutcome:
        self._completed += 1
        if truncated:
            self._truncated += 1
        return RolloutOutcome(
            request_id=request.request_id,
            output_tokens=tuple(p.tokens),
            num_tokens=p.length,
            finish_reason=reason,
            truncated=truncated,
            attempts=p.attempts,
            aborts=p.aborts,
            failures=p.failures,
            replica_ids=tuple(p.replica_ids),
            reprefill_tokens=p.reprefill,
            param_versions=tuple(p.versions),
            started_at=started,
            finished_at=self._clock.now(),
            backoff_s=p.backoff_s,
        )

    async def _acquire(self, request_id: str, excluded: set[str]) -> str:
        """Lease a replica, waiting up to ``no_replica_timeout_s`` for one to be routable.

        Exclusions are a preference: when every routable replica is excluded (they all
        failed this request once), they are tried again rather than waiting.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.no_replica_timeout_s
        while True:
            seen = self._routable_version
            # the router may not have caught up with a death yet: never pick a dead member
            dead = self._replicas.dead_ids
            try:
                return await self._router.acquire(
                    request_id, exclude=sorted(excluded.union(dead)) if dead else sorted(excluded)
                )
            except NoRoutableReplicaError:
                if excluded:
                    try:
                        chosen = await self._router.acquire(request_id, exclude=sorted(dead))
                    except NoRoutableReplicaError:
                        pass
                    else:
                        logger.info(
                            "request %s: every routable replica failed it once; retrying %s",
                            request_id,
                            chosen,
                        )
                        excluded.clear()
                        return chosen
            if self._routable_version != seen:
                continue  # the routable set changed while we were asking
            remaining = deadline - loop.time()
            if remaining <= 0 or not await self._wait_routable_change(remaining):
                raise NoRoutableReplicaError(
                    f"no routable replica for request {request_id!r} within"
                    f" {self.options.no_replica_timeout_s:g} s (excluded: {sorted(excluded)})"
                )

    async def _wait_routable_change(self, limit_s: float) -> bool:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[fut] = None
        try:
            await asyncio.wait_for(fut, limit_s)
            return True
        except TimeoutError:
            return False
        finally:
            self._waiters.pop(fut, None)

    def _on_membership(self, event: MembershipEvent) -> None:
        if not event.routable_changed:
            return
        self._routable_version += 1
        waiters, self._waiters = self._waiters, {}
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def __repr__(self) -> str:
        return (
            f"RetryingClient(partial_rollout={self.options.partial_rollout},"
            f" in_flight={self._in_flight},"
            f" completed={self._completed}, failed={self._failed})"
        )
