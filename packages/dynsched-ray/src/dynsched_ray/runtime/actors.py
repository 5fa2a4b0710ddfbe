"""Actor classes: router, rollout replica host, sample queue, trainer worker.

The classes are plain Python (testable without Ray); `remote_class` turns one into a
Ray actor class. Every hosted object is built lazily *inside* the actor's event loop on
first use, so asyncio primitives bind to the loop that runs them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import ray
from dynsched_core import GenerateRequest, GenerateResult
from dynsched_core._protocols import FinishReason, QueueStats, TokenSegment
from dynsched_core.errors import NoRoutableReplicaError

from dynsched_ray.engines.lifecycle import mark_aborted

if TYPE_CHECKING:
    from dynsched_core import AsyncSampleQueue, LoadBalancer

__all__ = [
    "QueueActor",
    "ReplicaActor",
    "RouterActor",
    "TrainerWorkerActor",
    "placement_info",
    "remote_class",
]

logger = logging.getLogger(__name__)


def placement_info() -> dict[str, Any]:
    """Where the calling actor runs: node, placement group, GPU ids, assigned resources."""
    try:
        ctx = ray.get_runtime_context()
        pg = ctx.get_placement_group_id()
        return {
            "node_id": ctx.get_node_id(),
            "placement_group_id": pg,
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "assigned_resources": dict(ctx.get_assigned_resources()),
            "actor_id": ctx.get_actor_id(),
            "pid": os.getpid(),
        }
    except Exception:  # outside Ray (plain-object tests)
        return {"node_id": None, "placement_group_id": None, "gpu_ids": [], "pid": os.getpid()}


@functools.cache
def remote_class(cls: type) -> Any:
    """The Ray actor class of ``cls`` (built once per class)."""
    return ray.remote(cls)


class RouterActor:
    """Hosts a core `LoadBalancer`; found by name so a restarted driver can reuse it.

    Args:
        replica_ids: Replicas routable from the start.
        sticky_capacity: Sticky-session LRU size of the load balancer.
    """

    def __init__(self, replica_ids: Sequence[str] = (), sticky_capacity: int | None = None) -> None:
        self._init_ids = list(replica_ids)
        self._sticky_capacity = sticky_capacity
        self._lb: Any = None
        self._epoch = 0
        self._meta: dict[str, Any] = {}

    def _balancer(self) -> LoadBalancer:
        if self._lb is None:
            from dynsched_core import LoadBalancer

            kwargs = (
                {} if self._sticky_capacity is None else {"sticky_capacity": self._sticky_capacity}
            )
            self._lb = LoadBalancer(self._init_ids, **kwargs)
            self._lb.add_listener(self._on_change)
        lb: LoadBalancer = self._lb
        return lb

    def _on_change(self, _ids: Sequence[str]) -> None:
        self._epoch += 1

    async def ping(self) -> bool:
        """Liveness check."""
        return True

    async def add_replicas(self, replica_ids: Sequence[str]) -> tuple[int, list[str]]:
        """Make replicas routable; return ``(epoch, routable ids)``."""
        await self._balancer().add_replicas(list(replica_ids))
        return self._epoch, self._lb.routable_ids()

    async def remove_replicas(self, replica_ids: Sequence[str]) -> tuple[int, list[str]]:
        """Stop routing to replicas; return ``(epoch, routable ids)``."""
        await self._balancer().remove_replicas(list(replica_ids))
        return self._epoch, self._lb.routable_ids()

    async def set_routable(self, replica_ids: Sequence[str]) -> tuple[int, list[str]]:
        """Make exactly ``replica_ids`` routable (used when a driver re-attaches)."""
        lb = self._balancer()
        wanted = set(replica_ids)
        stale = [r for r in lb.routable_ids() if r not in wanted]
        if stale:
            await lb.remove_replicas(stale)
        await lb.add_replicas(sorted(wanted))
        return self._epoch, lb.routable_ids()

    async def acquire(self, request_id: str, exclude: Sequence[str] = ()) -> str:
        """Route one request (see `LoadBalancer.acquire`)."""
        return await self._balancer().acquire(request_id, tuple(exclude))

    async def acquire_batch(self, items: Sequence[tuple[str, Sequence[str]]]) -> list[str | None]:
        """Route many requests in one call; ``None`` where no replica was routable."""
        lb = self._balancer()
        out: list[str | None] = []
        for request_id, exclude in items:
            try:
                out.append(lb.acquire_nowait(request_id, tuple(exclude)))
            except NoRoutableReplicaError:
                out.append(None)
        return out

    async def release(self, request_id: str, replica_id: str) -> None:
        """Drop one lease (no-op when absent)."""
        await self._balancer().release(request_id, replica_id)

    async def release_batch(self, items: Sequence[tuple[str, str]]) -> None:
        """Drop many leases in one call."""
        lb = self._balancer()
        for request_id, replica_id in items:
            lb.release_nowait(request_id, replica_id)

    async def clear_sticky(self) -> None:
        """Forget every sticky session."""
        await self._balancer().clear_sticky()

    async def in_flight_counts(self) -> dict[str, int]:
        """In-flight requests per routable replica."""
        return await self._balancer().in_flight_counts()

    async def routable(self) -> tuple[int, list[str]]:
        """``(epoch, routable ids)``."""
        return self._epoch, await self._balancer().routable()

    async def set_meta(self, meta: Mapping[str, Any]) -> None:
        """Store small driver metadata (run name, parameter version) with the router."""
        self._meta.update(meta)

    async def get_meta(self) -> dict[str, Any]:
        """The metadata stored with `set_meta`."""
        return dict(self._meta)


class ReplicaActor:
    """Hosts any `RolloutReplica`, built inside the actor by ``factory(*args, **kwargs)``.

    Async actor: many ``generate`` calls run concurrently on the actor's event loop, and
    ``abort``/``sleep``/... interleave with them.

    ``generate_stream`` runs one attempt as consecutive segments of at most
    ``stream_tokens`` tokens (each segment continues the previous one's output through
    ``partial_output``) and yields the tokens generated so far after each segment, so a
    driver keeps them even if this actor dies. An abort (or a sleep) takes effect inside
    the running segment or before the next one. Per-token logprobs and version-stamped
    segments of the hosted replica's results are carried along.

    A hosted replica with an async ``start()`` (e.g. `VLLMReplica`, whose engine takes a
    while to come up) is started on the first call, before anything else runs on it;
    ``shutdown()`` stops it (and its engine processes) before the actor is killed.

    Args:
        factory: Builds the hosted replica (a class or picklable callable).
        args: Positional arguments of ``factory``.
        kwargs: Keyword arguments of ``factory``.
        stream_tokens: Segment size of `generate_stream` (>= 1).
    """

    def __init__(
        self,
        factory: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        stream_tokens: int = 16,
    ) -> None:
        if (
            isinstance(stream_tokens, bool)
            or not isinstance(stream_tokens, int)
            or stream_tokens < 1
        ):
            raise ValueError(f"stream_tokens must be an int >= 1, got {stream_tokens!r}")
        self._factory = factory
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        self._stream_tokens = stream_tokens
        self._replica: Any = None
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        # request id -> abort requested, for requests inside generate_stream
        self._streams: dict[str, bool] = {}
        # fault injection (`set_straggler`): generation slowed by this factor until then
        self._slow: tuple[float, float] = (1.0, 0.0)

    def _built(self) -> Any:
        if self._replica is None:
            self._replica = self._factory(*self._args, **self._kwargs)
        return self._replica

    async def _ready(self) -> Any:
        """The hosted replica, started (``await replica.start()``) when it has a start."""
        r = self._built()
        if self._started:
            return r
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if not self._started:
                start = getattr(r, "start", None)
                if start is not None:
                    out = start()
                    if asyncio.iscoroutine(out):
                        await out
                self._started = True
        return r

    def _r(self) -> Any:
        return self._built()

    async def describe(self) -> dict[str, Any]:
        """Replica id, capabilities and placement of this actor (starts the replica)."""
        r = await self._ready()
        return {
            "replica_id": r.replica_id,
            "capabilities": r.capabilities,
            "placement": placement_info(),
        }

    async def ping(self) -> bool:
        """Liveness check."""
        return True

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Run one generation attempt on the hosted replica."""
        result: GenerateResult = await self._slowed((await self._ready()).generate(request))
        return result

    async def set_straggler(self, factor: float, duration_s: float) -> None:
        """Fault injection: generation takes ``factor`` times as long for ``duration_s``."""
        if not factor >= 1.0 or not duration_s >= 0.0:
            raise ValueError(f"need factor >= 1 and duration_s >= 0, got {factor}, {duration_s}")
        self._slow = (float(factor), asyncio.get_running_loop().time() + duration_s)

    async def _slowed(self, work: Any) -> Any:
        loop = asyncio.get_running_loop()
        start = loop.time()
        out = await work
        factor, until = self._slow
        if factor > 1.0 and start < until:
            await asyncio.sleep((factor - 1.0) * (loop.time() - start))
        return out

    async def generate_stream(
        self, request: GenerateRequest
    ) -> AsyncIterator[tuple[str, GenerateResult]]:
        """Run one attempt in segments; yield ``("progress", so_far)`` then ``("final", result)``.

        Every yielded result covers the whole attempt so far (tokens of all segments).
        """
        r = await self._ready()
        rid = request.request_id
        if rid in self._streams:
            raise RuntimeError(f"request {rid!r} is already streaming on replica {r.replica_id!r}")
        self._streams[rid] = False
        tokens: list[int] = []
        logprobs: list[float] | None = []
        segments: list[TokenSegment] = []
        produced = 0
        budget = request.max_tokens
        version = request.param_version
        reason: FinishReason

        def so_far(finish: FinishReason) -> GenerateResult:
            return GenerateResult(
                request_id=rid,
                replica_id=r.replica_id,
                output_tokens=tuple(tokens),
                num_tokens=produced,
                finish_reason=finish,
                param_version=version,
                output_logprobs=tuple(logprobs) if logprobs is not None else (),
                segments=tuple(segments),
            )

        try:
            while True:
                if self._streams.get(rid):
                    reason = "abort"
                else:
                    seg = attrs.evolve(
                        request,
                        max_tokens=min(self._stream_tokens, budget - produced),
                        partial_output=tuple(request.partial_output) + tuple(tokens),
                        partial_len=request.partial_len + produced,
                    )
                    try:
                        res = await self._slowed(r.generate(seg))
                    except Exception:
                        if produced == 0:
                            raise
                        # keep what earlier segments produced: end this attempt as aborted
                        logger.warning(
                            "segment of %s failed after %d token(s)", rid, produced, exc_info=True
                        )
                        res = GenerateResult(
                            request_id=rid, replica_id=r.replica_id, finish_reason="abort"
                        )
                    tokens.extend(res.output_tokens)
                    if logprobs is not None and res.num_tokens:
                        if len(res.output_logprobs) == res.num_tokens:
                            logprobs.extend(res.output_logprobs)
                        else:
                            logprobs = None
                    segments.extend(res.token_segments())
                    produced += res.num_tokens
                    version = res.param_version if res.num_tokens or produced == 0 else version
                    reason = res.finish_reason
                    if reason == "length" and produced < budget and res.num_tokens > 0:
                        yield ("progress", so_far("abort"))
                        continue
                yield ("final", so_far(reason))
                return
        finally:
            self._streams.pop(rid, None)

    async def abort(self, request_ids: Sequence[str] | None = None) -> int:
        """Abort in-flight requests (all when ``None``), streamed ones included."""
        ids = None if request_ids is None else list(request_ids)
        marked = mark_aborted(self._streams, ids)
        hosted = await (await self._ready()).abort(ids)
        return max(int(hosted), marked)

    async def sleep(self) -> None:
        """Release memory (see `RolloutReplica.sleep`); streamed requests end aborted."""
        mark_aborted(self._streams, None)
        await (await self._ready()).sleep()

    async def wake_up(self) -> None:
        """Reload after `sleep`."""
        await (await self._ready()).wake_up()

    async def resume(self) -> None:
        """Accept generation requests again."""
        await (await self._ready()).resume()

    async def update_weights(self, version: int, weights: Any = None) -> None:
        """Load weights of ``version``."""
        await (await self._ready()).update_weights(version, weights)

    async def in_flight(self) -> int:
        """Requests running on the hosted replica (streamed ones counted between segments)."""
        return max(int(await (await self._ready()).in_flight()), len(self._streams))

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call any other method of the hosted replica (awaiting it when it is async); a
        non-callable attribute (a property) is returned as is."""
        attr = getattr(await self._ready(), method)
        if not callable(attr):
            return attr
        out = attr(*args, **kwargs)
        if asyncio.iscoroutine(out):
            out = await out
        return out

    async def shutdown(self) -> None:
        """Stop the hosted replica (its ``shutdown()``, when it has one); idempotent."""
        if self._replica is None:
            return
        mark_aborted(self._streams, None)
        stop = getattr(self._replica, "shutdown", None)
        if stop is not None:
            out = stop()
            if asyncio.iscoroutine(out):
                await out


class QueueActor:
    """Hosts a core `AsyncSampleQueue`.

    Args:
        capacity: Maximum number of buffered samples (``None``: unbounded).
    """

    def __init__(self, capacity: int | None = None) -> None:
        self._capacity = capacity
        self._q: Any = None

    def _queue(self) -> AsyncSampleQueue:
        if self._q is None:
            from dynsched_core import AsyncSampleQueue

            self._q = AsyncSampleQueue(self._capacity)
        q: AsyncSampleQueue = self._q
        return q

    async def ping(self) -> bool:
        """Liveness check."""
        return True

    async def put(self, sample: Any, timeout: float | None = None) -> int:
        """Append a sample; return the size after it."""
        q = self._queue()
        await q.put(sample, timeout)
        return q.qsize()

    async def offer(self, sample: Any) -> bool:
        """Append without waiting; False when full."""
        return bool(self._queue().offer(sample))

    async def get(self, n: int, timeout: float | None = None) -> list[Any]:
        """Remove and return ``n`` samples (fewer only after end-of-stream)."""
        return await self._queue().get(n, timeout)

    async def get_nowait(self, n: int | None = None) -> list[Any]:
        """Remove and return up to ``n`` samples without waiting."""
        return self._queue().get_nowait(n)

    async def wait_for(self, n: int, timeout: float | None = None) -> int:
        """Wait for ``n`` buffered samples or end-of-stream."""
        return await self._queue().wait_for(n, timeout)

    async def size(self) -> int:
        """Samples buffered."""
        return self._queue().qsize()

    async def close(self) -> None:
        """Mark end-of-stream."""
        await self._queue().close()

    async def stats(self) -> QueueStats:
        """Counters."""
        return await self._queue().stats()

    async def state_dict(self) -> dict[str, Any]:
        """Contents and counters (see `AsyncSampleQueue.state_dict`)."""
        return self._queue().state_dict()

    async def held_sample_ids(self) -> list[str]:
        """Ids of the buffered samples, in order (nothing is taken)."""
        return list(await self._queue().held_sample_ids())

    async def load_state_dict(self, state: Mapping[str, Any]) -> int:
        """Replace contents and counters (a replacement actor continuing a dead one's
        queue); return the size after it."""
        q = self._queue()
        q.load_state_dict(state)
        return q.qsize()


class TrainerWorkerActor:
    """A stand-in trainer worker (one per trainer GPU bundle) for CPU runs.

    It sleeps ``step_time_s`` per training step (real time inside the actor) and reports
    verl-style timings; `TrainerActor` hosts real trainers (`TorchTrainer`, `MegatronTrainer`).
    """

    def __init__(self, rank: int, step_time_s: float = 0.05) -> None:
        self._rank = rank
        self._step_time_s = float(step_time_s)
        self._version = 0
        self._steps = 0

    async def describe(self) -> dict[str, Any]:
        """Rank and placement of this worker."""
        return {"rank": self._rank, "placement": placement_info()}

    async def train_step(self, num_samples: int) -> dict[str, float]:
        """One (fake) optimizer step over ``num_samples`` samples."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.sleep(self._step_time_s)
        self._steps += 1
        dt = loop.time() - t0
        return {"update_actor": dt}

    async def set_version(self, version: int) -> int:
        """Record the parameter version after a sync; return it."""
        self._version = int(version)
        return self._version
