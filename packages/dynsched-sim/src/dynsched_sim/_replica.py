"""`SimReplica`: a simulated continuous-batching inference engine.

Processor-sharing bookkeeping: all decoding sequences of a replica advance at the same
per-sequence rate (see `EngineModel`), so the replica keeps one *virtual service clock*
``V`` (tokens each running sequence has produced since the replica started) and a heap of
finish points ``V_start + tokens_to_generate``. An arrival or a departure changes ``n``;
``V`` is advanced lazily to "now" and the single departure timer is re-armed for the heap
head. Each arrival, departure or abort therefore costs ``O(log n)``; nothing iterates over
the running sequences.

Context-dependent decode (``decode_per_kv_token_s = k > 0``): the running sequences hold
``L(V) = n V + C`` tokens of context (``C``: the sum over them of their context at decode
start minus their ``V_start``), so between two events an iteration takes ``a_n + k L(V)``
(``a_n = decode_base_s + decode_per_seq_s n``) and ``dt/dV = a_n + k (n V + C)``: reaching
``V + x`` takes ``x (b + k n x / 2)`` with ``b = a_n + k L(V)``, and ``t`` seconds advance
``V`` by ``2 t / (b + sqrt(b^2 + 2 k n t))``. With ``k = 0`` the rate ``r(n)`` is used as
before.

Prefill and decode share the GPUs: while a prefill runs (the serial prefill stage is
busy) ``V`` stands still, so a request resumed after an abort costs the replica its
re-prefill (`EngineModel`).

States (`state`): ``serving``, ``paused`` (awake, not accepting), ``falling_asleep``
(its sleep runs: it still holds its memory), ``asleep`` (only once the sleep finished, and
until a wake-up starts) and ``waking`` (its wake-up runs: memory held, not serving).
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import attrs
from dynsched_core import DynschedError, GenerateRequest, GenerateResult, ReplicaCapabilities
from dynsched_core import validators as v
from dynsched_core.rollout import ReplicaIdentity

from dynsched_sim._accounting import GroupAccountant
from dynsched_sim._models import EngineModel, HardwareModel, LLMModel

__all__ = ["ReplicaNotServingError", "SimReplica", "SimReplicaOptions"]

_WAITING, _PREFILL, _DECODE, _DONE = 0, 1, 2, 3
#: States in which the engine does not serve (its weights are not, or not yet, loaded).
_NOT_AWAKE = ("falling_asleep", "asleep", "waking")


class ReplicaNotServingError(DynschedError, RuntimeError):
    """``generate`` was called on a replica that is asleep or not resumed."""


class _Seq:
    __slots__ = ("ctx0", "finish", "fut", "handle", "req", "state", "todo", "v_start")

    def __init__(
        self, req: GenerateRequest, fut: asyncio.Future[GenerateResult], todo: int, finish: str
    ):
        self.req = req
        self.fut = fut
        self.todo = todo
        self.finish = finish
        self.state = _WAITING
        self.v_start = 0.0
        self.ctx0 = float(req.prompt_len + req.partial_len)  # context at decode start
        self.handle: asyncio.TimerHandle | None = None


@attrs.frozen
class SimReplicaOptions:
    """Where a `SimReplica` sits and what its switches cost on top of the engine model.

    Args:
        group: Accounting group of its GPUs (``None``: the replica id).
        node: The server its GPUs are on (`ReplicaCapabilities.node`).
        extra_wake_s: Added to every wake-up (hybrid: trainer state offload), >= 0.
        extra_sleep_s: Added to every sleep (hybrid: trainer state onload), >= 0.
    """

    group: str | None = None
    node: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    extra_wake_s: float = attrs.field(default=0.0, validator=v.float_ge(0.0))
    extra_sleep_s: float = attrs.field(default=0.0, validator=v.float_ge(0.0))


class SimReplica(ReplicaIdentity):
    """A simulated inference replica implementing `dynsched_core.RolloutReplica`.

    Args:
        replica_id: Unique id.
        engine: Engine cost model.
        hardware: Hardware model.
        llm: Served model.
        role: ``"standalone"`` (serving from the start) or ``"hybrid"`` (asleep at start,
            lives on trainer GPUs, runs with the smaller hybrid memory fraction).
        accountant: Ground-truth accountant (optional).
        ledger: Shared ``request_id -> tokens decoded`` over every attempt on every
            replica (conservation checks: a response's attempts must add up to its length).
        first_tokens: Shared ``request_id -> weight version of its first decoded token``
            (set once per request, by the attempt that decoded its first token; the
            run's staleness, `StalenessLedger`).
        options: Accounting group, node and extra switch costs (`SimReplicaOptions`).

    Attributes:
        tokens_generated: Decode tokens produced, aborted attempts included.
        prefill_tokens: Tokens prefilled (prompt + re-prefilled partial outputs).
        requests_finished: Attempts that ended by ``stop`` or ``length``.
        requests_aborted: Attempts that ended by ``abort``.
        requests_while_paused: Requests received awake but before `resume` (queued
            until then; a router that exposes a replica before resuming it shows up here).
    """

    def __init__(
        self,
        replica_id: str,
        engine: EngineModel,
        hardware: HardwareModel,
        llm: LLMModel,
        *,
        role: str = "standalone",
        accountant: GroupAccountant | None = None,
        ledger: dict[str, int] | None = None,
        options: SimReplicaOptions | None = None,
        first_tokens: dict[str, int] | None = None,
    ) -> None:
        if role not in ("standalone", "hybrid"):
            raise ValueError(f"role must be 'standalone' or 'hybrid', got {role!r}")
        opts = options if options is not None else SimReplicaOptions()
        node = opts.node
        self._id = replica_id
        self._engine = engine
        self._caps = ReplicaCapabilities(role=role, num_gpus=engine.gpus_per_replica, node=node)  # type: ignore[arg-type]
        self.max_running = engine.max_running(role, hardware, llm)
        self._rate = [0.0] + [engine.per_seq_rate(n) for n in range(1, self.max_running + 1)]
        self._iter = [1.0 / r if r else 0.0 for r in self._rate]  # a_n (context-free part)
        self._kv = engine.decode_per_kv_token_s
        self._ctx_c = 0.0  # C: sum of (context at decode start - V_start) over decoding seqs
        self._prefilling = False
        self._prefill_timer: asyncio.TimerHandle | None = None
        self._switch_done: asyncio.Future[None] | None = None
        self._prefill_c = engine.prefill_s_per_token
        self._sync_s = (
            engine.local_sync_s(hardware, llm)
            if role == "hybrid"
            else engine.broadcast_sync_s(hardware, llm)
        )
        self._sleep_s = engine.sleep_s(hardware, llm) + opts.extra_sleep_s
        self._wake_s = engine.wake_s(hardware, llm) + opts.extra_wake_s
        self._group = opts.group or replica_id
        self._acct = accountant
        self._state = "serving" if role == "standalone" else "asleep"
        self._switching = False
        self._frozen = 0
        self._waiting: deque[_Seq] = deque()
        self._slots = 0
        self._n = 0
        self._v = 0.0
        self._vt = 0.0
        self._heap: list[tuple[float, int, _Seq]] = []
        self._dead = 0
        self._seqno = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._prefill_free_at = 0.0
        self._seqs: dict[str, _Seq] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ledger = ledger
        self._first_tokens = first_tokens
        # weight versions on the virtual service clock: ``V`` at each change, new version
        self._version_v: list[float] = []
        self._versions: list[int] = []
        self.version = 0
        self.tokens_generated = 0
        self.prefill_tokens = 0
        self.requests_finished = 0
        self.requests_aborted = 0
        self.requests_while_paused = 0

    # --- protocol (replica_id, capabilities and role come from ReplicaIdentity) -----
    @property
    def state(self) -> str:
        """``serving``, ``paused`` (awake, not accepting), ``falling_asleep``, ``asleep``
        (its sleep finished, no wake-up started) or ``waking``."""
        return self._state

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if self._state in _NOT_AWAKE:
            raise ReplicaNotServingError(
                f"replica {self._id!r} is {self._state.replace('_', ' ')}, cannot generate"
            )
        if self._state == "paused":
            # awake but not resumed: the engine queues the request until `resume`
            self.requests_while_paused += 1
        if request.request_id in self._seqs:
            raise ValueError(f"request {request.request_id!r} already running on {self._id!r}")
        loop = self._get_loop()
        if request.target_len is not None:
            left = max(0, request.target_len - request.partial_len)
            todo, finish = (
                (left, "stop") if left <= request.max_tokens else (request.max_tokens, "length")
            )
        else:
            todo, finish = request.max_tokens, "length"
        if todo <= 0:
            return GenerateResult(
                request_id=request.request_id,
                replica_id=self._id,
                finish_reason=finish,  # type: ignore[arg-type]
                param_version=self.version,
            )
        fut: asyncio.Future[GenerateResult] = loop.create_future()
        seq = _Seq(request, fut, todo, finish)
        self._seqs[request.request_id] = seq
        self._waiting.append(seq)
        self._admit()
        self._activity()
        try:
            return await fut
        except asyncio.CancelledError:
            if seq.state != _DONE:
                self._abort_seq(seq, notify=False)
                self._reschedule()
                self._activity()
            raise

    async def abort(self, request_ids: Sequence[str] | None = None) -> int:
        seqs = (
            list(self._seqs.values())
            if request_ids is None
            else [self._seqs[r] for r in request_ids if r in self._seqs]
        )
        for seq in seqs:
            self._abort_seq(seq, notify=True)
        if seqs:
            self._admit()
            self._reschedule()
            self._activity()
        return len(seqs)

    async def sleep(self) -> None:
        """Abort everything, then offload: ``falling_asleep`` for `EngineModel.sleep_s`,
        ``asleep`` after (a sleep already under way is awaited, not repeated)."""
        await self._settle()
        if self._state == "asleep":
            return
        await self.abort()
        self._state = "falling_asleep"
        try:
            await self._switch(self._sleep_s)
        finally:
            self._state = "asleep"

    async def wake_up(self) -> None:
        """Reload: ``waking`` for `EngineModel.wake_s`, ``paused`` after (a wake-up already
        under way is awaited, not repeated; interrupted, the replica stays asleep)."""
        await self._settle()
        if self._state != "asleep":
            return
        self._state = "waking"
        try:
            await self._switch(self._wake_s)
        except BaseException:
            self._state = "asleep"
            raise
        self._state = "paused"

    async def _settle(self) -> None:
        """Wait for a sleep or wake-up under way to finish."""
        while self._switch_done is not None:
            await asyncio.shield(self._switch_done)

    async def resume(self) -> None:
        if self._state in _NOT_AWAKE:
            raise ReplicaNotServingError(
                f"replica {self._id!r} is {self._state.replace('_', ' ')}; wake_up before resume"
            )
        self._state = "serving"
        if self._waiting:
            self._get_loop()
            self._admit()
            self._reschedule()
            self._activity()

    async def update_weights(self, version: int, weights: Any = None) -> None:
        self.freeze()
        try:
            await asyncio.sleep(self._sync_s)
        finally:
            self.unfreeze()
        if version > self.version:
            self._version_v.append(self._v)  # V stood still during the update (frozen)
            self._versions.append(version)
        self.version = max(self.version, version)

    async def in_flight(self) -> int:
        return len(self._seqs)

    def freeze(self) -> None:
        """Stop decoding until `unfreeze` (the GPUs are busy with something else)."""
        self._get_loop()
        self._advance()
        self._frozen += 1
        self._reschedule()
        self._activity()

    def unfreeze(self) -> None:
        """Undo one `freeze`."""
        self._advance()
        self._frozen -= 1
        self._reschedule()
        self._activity()

    # --- introspection ---------------------------------------------------------------
    @property
    def running(self) -> int:
        """Sequences decoding now."""
        return self._n

    @property
    def sync_s(self) -> float:
        """Duration of one `update_weights`."""
        return self._sync_s

    # --- internals -------------------------------------------------------------------
    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._vt = self._loop.time()
        return self._loop

    async def _switch(self, seconds: float) -> None:
        done = self._get_loop().create_future()
        self._switch_done = done
        self._switching = True
        self._activity()
        try:
            await asyncio.sleep(seconds)
        finally:
            self._switching = False
            self._switch_done = None
            done.set_result(None)
            self._activity()

    def _activity(self) -> None:
        if self._acct is None:
            return
        if self._switching:
            act = "switching"
        elif self._frozen:
            act = "weight_sync"
        elif self._slots:
            act = "rollout"
        else:
            act = "idle"
        self._acct.set_engine(self._group, act)

    def _stalled(self) -> bool:
        """No decode progress: a weight update or a prefill holds the GPUs."""
        return bool(self._frozen) or self._prefilling

    def _advance(self) -> None:
        now = self._loop.time()  # type: ignore[union-attr]
        if self._n and not self._stalled():
            dt = now - self._vt
            if not self._kv:
                self._v += dt * self._rate[self._n]
            else:
                b = self._iter[self._n] + self._kv * (self._n * self._v + self._ctx_c)
                self._v += 2.0 * dt / (b + math.sqrt(b * b + 2.0 * self._kv * self._n * dt))
        self._vt = now

    def _time_to(self, target: float) -> float:
        """Seconds of decoding until ``V`` reaches ``target`` (``n`` running, not stalled)."""
        x = target - self._v
        if not self._kv:
            return x / self._rate[self._n]
        b = self._iter[self._n] + self._kv * (self._n * self._v + self._ctx_c)
        return x * (b + 0.5 * self._kv * self._n * x)

    def _admit(self) -> None:
        loop = self._loop
        assert loop is not None
        while self._waiting and self._slots < self.max_running and self._state == "serving":
            seq = self._waiting.popleft()
            if seq.state != _WAITING:
                continue
            self._slots += 1
            ptoks = seq.req.prompt_len + seq.req.partial_len
            self.prefill_tokens += ptoks
            dur = ptoks * self._prefill_c
            if dur > 0:
                now = loop.time()
                start = max(now, self._prefill_free_at)
                self._prefill_free_at = start + dur
                seq.state = _PREFILL
                seq.handle = loop.call_at(self._prefill_free_at, self._start_decode, seq)
                self._prefill_busy(loop)
            else:
                self._start_decode(seq)

    def _prefill_busy(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stall decoding until the prefill stage is free (``_prefill_free_at``)."""
        if not self._prefilling:
            self._advance()
            self._prefilling = True
            self._reschedule()
        if self._prefill_timer is not None:
            self._prefill_timer.cancel()
        self._prefill_timer = loop.call_at(self._prefill_free_at, self._prefill_end)

    def _prefill_end(self) -> None:
        self._prefill_timer = None
        self._advance()
        self._prefilling = False
        self._reschedule()

    def _start_decode(self, seq: _Seq) -> None:
        seq.handle = None
        self._advance()
        seq.state = _DECODE
        seq.v_start = self._v
        heapq.heappush(self._heap, (self._v + seq.todo, next(self._seqno), seq))
        self._n += 1
        self._ctx_c += seq.ctx0 - seq.v_start
        self._reschedule()

    def _left_decode(self, seq: _Seq) -> None:
        """Drop ``seq``'s context from ``C`` (it stopped decoding)."""
        self._n -= 1
        self._ctx_c = self._ctx_c - (seq.ctx0 - seq.v_start) if self._n else 0.0

    def _note_first_token(self, seq: _Seq) -> None:
        """Record the version of ``seq``'s first token (once per request, over attempts).

        The first token is complete at ``V = v_start + 1``; it was decoded with the
        newest version installed strictly before that point (a version installed at
        exactly that ``V`` came after it: ``V`` does not move during an update).
        """
        if self._first_tokens is None or seq.req.request_id in self._first_tokens:
            return
        i = bisect.bisect_left(self._version_v, seq.v_start + 1.0 - 1e-9)
        self._first_tokens[seq.req.request_id] = self._versions[i - 1] if i else 0

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        heap = self._heap
        while heap and heap[0][2].state != _DECODE:
            heapq.heappop(heap)
            self._dead -= 1
        if heap and self._n and not self._stalled():
            loop = self._loop
            assert loop is not None
            dt = self._time_to(heap[0][0])
            self._timer = loop.call_at(self._vt + max(0.0, dt), self._on_departure)

    def _on_departure(self) -> None:
        self._timer = None
        self._advance()
        heap = self._heap
        while heap and heap[0][2].state != _DECODE:
            heapq.heappop(heap)
            self._dead -= 1
        if heap and heap[0][0] > self._v:
            self._v = heap[0][0]  # the timer was armed for the head: absorb rounding
        limit = self._v + 1e-9 * max(1.0, abs(self._v))
        while heap and heap[0][0] <= limit:
            _, _, seq = heapq.heappop(heap)
            if seq.state != _DECODE:
                self._dead -= 1
                continue
            seq.state = _DONE
            self._left_decode(seq)
            self._slots -= 1
            del self._seqs[seq.req.request_id]
            self.tokens_generated += seq.todo
            self.requests_finished += 1
            if self._ledger is not None:
                rid = seq.req.request_id
                self._ledger[rid] = self._ledger.get(rid, 0) + seq.todo
            self._note_first_token(seq)
            seq.fut.set_result(
                GenerateResult(
                    request_id=seq.req.request_id,
                    replica_id=self._id,
                    num_tokens=seq.todo,
                    finish_reason=seq.finish,  # type: ignore[arg-type]
                    param_version=self.version,
                )
            )
        self._admit()
        self._reschedule()
        self._activity()

    def _abort_seq(self, seq: _Seq, *, notify: bool) -> None:
        tokens = 0
        if seq.state == _PREFILL:
            if seq.handle is not None:
                seq.handle.cancel()
            self._slots -= 1
        elif seq.state == _DECODE:
            self._advance()
            tokens = min(seq.todo, math.floor(self._v - seq.v_start + 1e-9))
            self._left_decode(seq)
            self._slots -= 1
            self._dead += 1
        seq.state = _DONE
        self._seqs.pop(seq.req.request_id, None)
        self.tokens_generated += tokens
        self.requests_aborted += 1
        if self._ledger is not None and tokens:
            rid = seq.req.request_id
            self._ledger[rid] = self._ledger.get(rid, 0) + tokens
        if tokens:
            self._note_first_token(seq)
        if self._dead > 64 and self._dead * 2 > len(self._heap):
            self._heap = [e for e in self._heap if e[2].state == _DECODE]
            heapq.heapify(self._heap)
            self._dead = 0
        if notify and not seq.fut.done():
            seq.fut.set_result(
                GenerateResult(
                    request_id=seq.req.request_id,
                    replica_id=self._id,
                    num_tokens=tokens,
                    finish_reason="abort",
                    param_version=self.version,
                )
            )
