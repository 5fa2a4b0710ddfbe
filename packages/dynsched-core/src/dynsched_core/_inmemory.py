"""`InMemoryReplica`: an in-process `RolloutReplica` that generates on the loop clock.

A legitimate engine for demos, tests and the Ray runtime's default replicas (CPU only,
no model): it produces deterministic token ids chunk by chunk with ``asyncio.sleep``, so
it runs in real time in a process and on virtual time in the simulator's loop. It can
be aborted mid-generation, slept, woken, resumed and given new weights like a real
engine, and made to fail (`InMemoryReplica.fail_next`) or die (`InMemoryReplica.kill`)
for fault drills.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs

from dynsched_core import validators as v
from dynsched_core._clock import Clock, LoopClock
from dynsched_core._lifecycle import (
    ReplicaDeadError,
    ReplicaLifecycle,
    ReplicaNotReadyError,
    check_replica_identity,
)
from dynsched_core._protocols import (
    FinishReason,
    GenerateRequest,
    GenerateResult,
    ReplicaCapabilities,
    ReplicaIdentity,
    ReplicaRole,
)

__all__ = [
    "REPLICA_METHODS",
    "CallSink",
    "InMemoryReplica",
    "InMemoryReplicaOptions",
    "ReplicaDeadError",
    "ReplicaNotReadyError",
    "TokenFn",
    "position_token",
]

logger = logging.getLogger(__name__)

TokenFn = Callable[[str, int], int]
"""``token_fn(request_id, position) -> token id`` (position counted over the whole response)."""

REPLICA_METHODS = ("generate", "abort", "sleep", "wake_up", "resume", "update_weights", "in_flight")


class CallSink(Protocol):
    """Receives the calls made on a replica (e.g. ``dynsched_core.testing.CallRecorder``)."""

    def record(self, who: str, method: str, *args: Any) -> Any:
        """Record that ``who.method(*args)`` was called."""
        ...


def position_token(request_id: str, position: int) -> int:
    """Default `TokenFn`: the token id is its position in the response (0, 1, 2, ...)."""
    return position


_ABORT = "abort"
_DEAD = "dead"


def _version(inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise v.field_error(inst, attribute, f"must be an int, got {value!r}", wrong_type=True)


@attrs.frozen
class InMemoryReplicaOptions:
    """How long an `InMemoryReplica`'s switches take, and its weights and tokens.

    Args:
        sleep_delay_s: Duration of ``sleep`` (finite, >= 0).
        wake_delay_s: Duration of ``wake_up`` (finite, >= 0).
        resume_delay_s: Duration of ``resume`` (finite, >= 0).
        update_delay_s: Duration of ``update_weights`` (finite, >= 0).
        abort_delay_s: Duration of ``abort`` (finite, >= 0).
        weights_version: Initial weight version.
        token_fn: Token id function (default: `position_token`).
    """

    sleep_delay_s: float = attrs.field(default=0.0, validator=v.float_ge(0.0))
    wake_delay_s: float = attrs.field(default=0.0, validator=v.float_ge(0.0))
    resume_delay_s: float = attrs.field(default=0.0, validator=v.float_ge(0.0))
    update_delay_s: float = attrs.field(default=0.0, validator=v.float_ge(0.0))
    abort_delay_s: float = attrs.field(default=0.0, validator=v.float_ge(0.0))
    weights_version: int = attrs.field(default=0, validator=_version)
    token_fn: TokenFn = position_token


class InMemoryReplica(ReplicaIdentity):
    """An in-process `RolloutReplica` that generates on the loop clock.

    Generation: the response reaches ``request.target_len`` tokens in total when given
    (``finish_reason="stop"``), else it uses the whole ``max_tokens`` budget
    (``"length"``); either way at most ``max_tokens`` tokens are produced by one attempt.
    Tokens come in chunks of ``chunk_tokens`` taking ``chunk_tokens / tokens_per_s``
    seconds each; an abort mid-chunk keeps the tokens that elapsed time accounts for and
    returns ``finish_reason="abort"``. Token ids are ``token_fn(request_id, position)``
    with the position counted over the whole response (``partial_len`` first), so a
    resumed response is checkable: with the default function it is ``0, 1, 2, ...``.

    State: a hybrid replica starts asleep and paused (as on the trainer's GPUs); a
    standalone one starts awake and accepting. ``sleep`` aborts what is still running,
    then leaves the replica asleep and paused; ``wake_up`` reloads (still paused);
    ``update_weights`` and ``resume`` require it awake; ``generate`` requires it awake and
    resumed, otherwise `ReplicaNotReadyError`. A killed replica raises `ReplicaDeadError`
    on every call, running generations included.

    Args:
        replica_id: Stable id.
        role: ``"standalone"`` or ``"hybrid"``.
        tokens_per_s: Decoding speed (> 0).
        chunk_tokens: Tokens emitted per step (>= 1).
        num_gpus: Reported in the capabilities.
        recorder: Receives every call (``in_flight`` excluded), e.g. a shared
            ``dynsched_core.testing.CallRecorder``.
        asleep: Initial state; ``None`` means asleep for hybrid, awake for standalone.
        clock: Time source (default: the running loop).
        node: The node it reports in its capabilities (`ReplicaCapabilities.node`).
        options: Switch durations, initial weight version and token id function
            (`InMemoryReplicaOptions`; default: instant switches, version 0, positions).
    """

    def __init__(
        self,
        replica_id: str,
        *,
        role: ReplicaRole = "standalone",
        tokens_per_s: float = 1000.0,
        chunk_tokens: int = 8,
        num_gpus: int = 1,
        recorder: CallSink | None = None,
        asleep: bool | None = None,
        clock: Clock | None = None,
        node: str = "",
        options: InMemoryReplicaOptions | None = None,
    ) -> None:
        check_replica_identity(replica_id, role)
        if not (isinstance(tokens_per_s, int | float) and math.isfinite(tokens_per_s)):
            raise ValueError(f"tokens_per_s must be a finite number > 0, got {tokens_per_s!r}")
        if tokens_per_s <= 0:
            raise ValueError(f"tokens_per_s must be a finite number > 0, got {tokens_per_s!r}")
        if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be an int >= 1, got {chunk_tokens!r}")
        opts = options if options is not None else InMemoryReplicaOptions()
        self._id = replica_id
        self._caps = ReplicaCapabilities(role=role, num_gpus=num_gpus, node=node)
        self.tokens_per_s = float(tokens_per_s)
        self.chunk_tokens = chunk_tokens
        self._recorder = recorder
        #: Serving phase (accepting, paused, asleep): the one state machine.
        self._life = ReplicaLifecycle(
            replica_id, asleep=(role == "hybrid") if asleep is None else bool(asleep)
        )
        self._alive = True  # fault injection (`kill` / `revive`), beside the phase
        self._version = opts.weights_version
        # Mutable copies: drills and tests change a live replica's switch durations.
        self.sleep_delay_s = float(opts.sleep_delay_s)
        self.wake_delay_s = float(opts.wake_delay_s)
        self.resume_delay_s = float(opts.resume_delay_s)
        self.update_delay_s = float(opts.update_delay_s)
        self.abort_delay_s = float(opts.abort_delay_s)
        self._token_fn: TokenFn = opts.token_fn
        self._clock: Clock = clock if clock is not None else LoopClock()
        self._running: dict[str, asyncio.Future[str]] = {}
        self._failures: dict[str, deque[BaseException]] = {}
        # Observable counters.
        self.received: list[GenerateRequest] = []
        self.completed = 0
        self.aborted = 0
        self.generated_tokens = 0
        self.max_concurrency = 0

    # --------------------------------------------------------------- properties
    # replica_id, capabilities (role and GPU count; every feature supported) and role
    # come from ReplicaIdentity.
    @property
    def is_asleep(self) -> bool:
        """True after `sleep` (or at start for a hybrid replica) until `wake_up`."""
        return self._life.asleep

    @property
    def is_accepting(self) -> bool:
        """True when `generate` is accepted (awake and resumed)."""
        return self._life.accepting and self._alive

    @property
    def is_alive(self) -> bool:
        """False after `kill`."""
        return self._alive

    @property
    def weights_version(self) -> int:
        """Version of the loaded weights."""
        return self._version

    @property
    def running(self) -> list[str]:
        """Ids of the requests generating now, sorted."""
        return sorted(self._running)

    # ----------------------------------------------------------- fault injection
    def fail_next(self, method: str, exc: BaseException | None = None, *, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` raise ``exc``.

        Args:
            method: One of ``generate``, ``abort``, ``sleep``, ``wake_up``, ``resume``,
                ``update_weights``, ``in_flight``.
            exc: Exception to raise (default: a `RuntimeError` naming the method).
            times: How many calls fail (>= 1).
        """
        if method not in REPLICA_METHODS:
            raise ValueError(f"method must be one of {list(REPLICA_METHODS)}, got {method!r}")
        if times < 1:
            raise ValueError(f"times must be >= 1, got {times}")
        queue = self._failures.setdefault(method, deque())
        for _ in range(times):
            queue.append(
                exc if exc is not None else RuntimeError(f"injected failure in {self._id}.{method}")
            )

    def kill(self) -> None:
        """Kill the replica: every later call and every running generation raises."""
        self._alive = False
        for fut in self._running.values():
            if not fut.done():
                fut.set_result(_DEAD)

    def revive(self) -> None:
        """Undo `kill` (state otherwise unchanged)."""
        self._alive = True

    async def pause(self) -> None:
        """Stop accepting generation requests (running ones continue)."""
        self._record("pause")
        self._check("pause")
        self._life.apply("pause")

    # ------------------------------------------------------------ RolloutReplica
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate a response, continuing ``request.partial_output``.

        Raises:
            ReplicaNotReadyError: asleep or paused.
            ReplicaDeadError: killed (also while generating).
        """
        rid = request.request_id
        self._record("generate", rid, request.partial_len, request.max_tokens)
        self._check("generate")
        self._life.require_serving(f"generate({rid!r})")
        if rid in self._running:
            raise RuntimeError(f"request {rid!r} is already running on replica {self._id!r}")
        self.received.append(request)

        to_generate = request.max_tokens
        natural_end = False
        if request.target_len is not None:
            left = max(request.target_len - request.partial_len, 0)
            if left <= request.max_tokens:
                to_generate, natural_end = left, True

        loop = asyncio.get_running_loop()
        stop: asyncio.Future[str] = loop.create_future()
        self._running[rid] = stop
        self.max_concurrency = max(self.max_concurrency, len(self._running))
        tokens: list[int] = []
        start_pos = request.partial_len
        reason: FinishReason = "stop" if natural_end else "length"
        try:
            while len(tokens) < to_generate:
                n = min(self.chunk_tokens, to_generate - len(tokens))
                t0 = loop.time()
                await asyncio.wait({stop}, timeout=n / self.tokens_per_s)
                if stop.done():
                    if stop.result() == _DEAD:
                        raise ReplicaDeadError(
                            f"replica {self._id!r} died while generating {rid!r}"
                        )
                    k = min(n, int((loop.time() - t0) * self.tokens_per_s))
                    self._emit(rid, start_pos, tokens, k)
                    if len(tokens) < to_generate:  # an abort after the last token is too late
                        reason = "abort"
                    break
                self._emit(rid, start_pos, tokens, n)
        finally:
            self._running.pop(rid, None)
        if reason == "abort":
            self.aborted += 1
        else:
            self.completed += 1
        return GenerateResult(
            request_id=rid,
            replica_id=self._id,
            output_tokens=tuple(tokens),
            num_tokens=len(tokens),
            finish_reason=reason,
            param_version=self._version,
        )

    async def abort(self, request_ids: Sequence[str] | None = None) -> int:
        """Abort running requests (all when ``None``); return how many were aborted."""
        self._record("abort", None if request_ids is None else tuple(request_ids))
        self._check("abort")
        await asyncio.sleep(self.abort_delay_s)
        return self._abort_now(request_ids)

    async def sleep(self) -> None:
        """Abort what still runs, then release memory (asleep and paused)."""
        self._record("sleep")
        self._check("sleep")
        self._life.apply("pause")
        left = self._abort_now(None)
        if left:
            logger.debug("replica %s: sleep aborted %d running request(s)", self._id, left)
        await asyncio.sleep(self.sleep_delay_s)
        self._life.apply("sleep")

    async def wake_up(self) -> None:
        """Reload memory (still paused until `resume`)."""
        self._record("wake_up")
        self._check("wake_up")
        await asyncio.sleep(self.wake_delay_s)
        self._life.apply("wake_up")

    async def resume(self) -> None:
        """Accept generation again.

        Raises:
            ReplicaNotReadyError: the replica is asleep.
        """
        self._record("resume")
        self._check("resume")
        self._life.require("resume")
        await asyncio.sleep(self.resume_delay_s)
        if self._life.allows("resume"):  # a sleep that came meanwhile wins
            self._life.apply("resume")

    async def update_weights(self, version: int, weights: Any = None) -> None:
        """Load weights of ``version``.

        Raises:
            ReplicaNotReadyError: the replica is asleep.
        """
        self._record("update_weights", version)
        self._check("update_weights")
        self._life.require_awake(f"update_weights({version})")
        await asyncio.sleep(self.update_delay_s)
        self._version = version

    async def in_flight(self) -> int:
        """Number of requests generating now."""
        self._check("in_flight")
        return len(self._running)

    # --------------------------------------------------------------- internals
    def _record(self, method: str, *args: Any) -> None:
        if self._recorder is not None:
            self._recorder.record(self._id, method, *args)

    def _check(self, method: str) -> None:
        if not self._alive:
            raise ReplicaDeadError(f"replica {self._id!r} is dead ({method} refused)")
        queue = self._failures.get(method)
        if queue:
            raise queue.popleft()

    def _abort_now(self, request_ids: Sequence[str] | None) -> int:
        targets = list(self._running) if request_ids is None else list(request_ids)
        count = 0
        for rid in targets:
            fut = self._running.get(rid)
            if fut is not None and not fut.done():
                fut.set_result(_ABORT)
                count += 1
        return count

    def _emit(self, rid: str, start_pos: int, tokens: list[int], k: int) -> None:
        base = start_pos + len(tokens)
        tokens.extend(self._token_fn(rid, base + i) for i in range(k))
        self.generated_tokens += k

    def __repr__(self) -> str:
        state = self._life.phase.value if self._alive else "dead"
        return (
            f"InMemoryReplica({self._id!r}, role={self.role!r}, {state},"
            f" v{self._version}, running={len(self._running)})"
        )
