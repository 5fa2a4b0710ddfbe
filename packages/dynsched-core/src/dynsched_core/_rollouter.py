"""`Rollouter`: turns prompts into finished samples under staleness and concurrency limits.

Each prompt is expanded into a group of ``n`` requests sent through a retrying client;
when the last response of the group finishes, one sample (the group) goes into the
queue. Two limits gate the admission of a new prompt:

- *staleness*: at most ``max_required_samples = (1 + staleness_threshold) *
  required_samples * T`` samples are admitted per parameter version. The window opened
  by `Rollouter.reset_staleness` starts with the samples that still count against the
  new version's budget, chosen by ``staleness_rule``:

  - ``"in_flight_and_queued"`` (default, verl's rule: its ``reset_staleness`` sets
    ``staleness_samples = len(active_tasks) + queue size``): samples in flight *and*
    samples finished but still waiting in the queue count, so ``in flight + queued <=
    max_required_samples`` at all times and at most ``max_required_samples`` samples
    generated under older weights ever wait for the trainer;
  - ``"in_flight"``: only samples still in flight count; finished samples in the queue
    are bounded by the queue's capacity alone (its backpressure pauses the rollouter),
    so a rollout-rich configuration keeps the queue full. Admits more samples per
    version than verl does, hence staler ones; an explicit option, never the default;
- *concurrency*: at most ``min(routable * concurrent_samples_per_replica,
  max_required_samples)`` samples in flight. The routable count comes from the
  `ReplicaSet` (the rollouter subscribes to it), so added capacity is used the moment a
  replica joins routing.

In-flight samples are counted explicitly (``dispatched - finished``), and the admission
loop waits for an event without holding any lock. When the prompt source is exhausted
and every admitted sample has finished, the queue is closed (end-of-stream).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
from typing import Any, Literal, Protocol, get_args

import attrs

from dynsched_core import derived
from dynsched_core import validators as v
from dynsched_core._client import RolloutOutcome
from dynsched_core._clock import Clock
from dynsched_core._events import (
    EventBus,
    RolloutEvent,
    RolloutEventKind,
    SampleEvent,
    StalenessResetEvent,
    sample_key,
)
from dynsched_core._protocols import GenerateRequest, SampleQueue
from dynsched_core._replicas import MembershipEvent, MembershipFollower, ReplicaSet

__all__ = [
    "STALENESS_RULES",
    "GenerateClient",
    "Prompt",
    "RolloutSample",
    "Rollouter",
    "RollouterOptions",
    "RollouterStats",
    "StalenessRule",
]

logger = logging.getLogger(__name__)

StalenessRule = Literal["in_flight_and_queued", "in_flight"]
"""What a new staleness window starts with (see the module docstring)."""

STALENESS_RULES: tuple[str, ...] = get_args(StalenessRule)
"""The allowed values of ``staleness_rule``, the default (verl's rule) first."""


class GenerateClient(Protocol):
    """What the rollouter needs from a client (e.g. `RetryingClient`)."""

    async def generate(self, request: GenerateRequest) -> RolloutOutcome:
        """Run one request to completion (retrying as needed)."""
        ...


def _opt_tuple(value: Iterable[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(value)


@attrs.frozen(kw_only=True)
class Prompt:
    """One prompt of the data source.

    Attributes:
        prompt_id: Unique id; becomes the sample id.
        prompt: Opaque payload for the engine (token ids, text, ...).
        prompt_len: Prompt length in tokens (>= 0).
        max_tokens: Response token budget (>= 0).
        target_lens: For simulated engines: the natural length of each response (one
            entry per response of the group), or None.
        metadata: Free-form data carried into the sample.
    """

    prompt_id: str
    prompt: Any = None
    prompt_len: int = attrs.field(default=0, validator=v.int_ge(0))
    max_tokens: int = attrs.field(default=256, validator=v.int_ge(0))
    target_lens: tuple[int, ...] | None = attrs.field(default=None, converter=_opt_tuple)
    metadata: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class RolloutSample:
    """A finished prompt group, as the trainer consumes it.

    Attributes:
        sample_id: The prompt id (unique).
        prompt: The prompt.
        responses: One outcome per response, in request order.
        param_version: Weight version when the sample was admitted.
        submitted_at: Loop time of the admission.
        completed_at: Loop time when the last response finished.
    """

    sample_id: str
    prompt: Prompt
    responses: tuple[RolloutOutcome, ...]
    param_version: int
    submitted_at: float
    completed_at: float

    @property
    def num_tokens(self) -> int:
        """Response tokens over the group."""
        return sum(r.num_tokens for r in self.responses)

    @property
    def max_param_version(self) -> int:
        """Newest weight version that produced a token of this sample."""
        seen = [ver for r in self.responses for ver in r.param_versions]
        return max(seen, default=self.param_version)

    @property
    def min_param_version(self) -> int:
        """Oldest weight version that produced a token of this sample."""
        seen = [ver for r in self.responses for ver in r.param_versions]
        return min(seen, default=self.param_version)


@attrs.frozen(kw_only=True)
class RollouterStats:
    """Counters of a `Rollouter` (samples are prompt groups)."""

    admitted: int
    completed: int
    failed: int
    cancelled: int
    active: int
    capacity: int
    routable_replicas: int
    param_version: int
    window_admitted: int
    step_generated_samples: int
    max_required_samples: int
    source_exhausted: bool
    finished: bool


@attrs.frozen(kw_only=True)
class RollouterOptions:
    """Settings of a `Rollouter`.

    Attributes:
        required_samples: Samples per trainer micro-step (>= 1).
        n: Responses per prompt (>= 1).
        trigger_parameter_sync_step: Micro-steps per weight sync, ``T`` (>= 1).
        staleness_threshold: Extra admission per version, as a fraction (>= 0).
        concurrent_samples_per_replica: In-flight samples per routable replica (>= 1).
        staleness_rule: What a new staleness window starts with:
            ``"in_flight_and_queued"`` (default, verl's rule) or ``"in_flight"`` (queued
            samples do not count; see the module docstring).
        max_tokens: Response budget for raw payloads (>= 0; a `Prompt` carries its own).
        put_timeout_s: Bound of one wait for room in the queue (> 0); the wait is retried
            (with a log line) until the queue has room or the rollouter stops.
    """

    required_samples: int = attrs.field(validator=v.int_ge(1))
    n: int = attrs.field(default=1, validator=v.int_ge(1))
    trigger_parameter_sync_step: int = attrs.field(default=1, validator=v.int_ge(1))
    staleness_threshold: float = attrs.field(default=0.0, validator=v.float_ge(0.0))
    concurrent_samples_per_replica: int = attrs.field(default=16, validator=v.int_ge(1))
    staleness_rule: StalenessRule = attrs.field(
        default="in_flight_and_queued", validator=v.one_of(STALENESS_RULES)
    )
    max_tokens: int = attrs.field(default=256, validator=v.int_ge(0))
    put_timeout_s: float = attrs.field(default=60.0, validator=v.float_gt(0.0))

    @property
    def max_required_samples(self) -> int:
        """Admission budget per parameter version (`dynsched_core.derived`)."""
        return derived.max_required_samples(
            self.required_samples, self.trigger_parameter_sync_step, self.staleness_threshold
        )

    def capacity(self, routable_replicas: int) -> int:
        """Concurrency cap with ``routable_replicas`` routable (`dynsched_core.derived`)."""
        return derived.concurrency_cap(
            routable_replicas, self.concurrent_samples_per_replica, self.max_required_samples
        )

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> RollouterOptions:
        """The options a `DynamicScheduleConfig` implies (``overrides`` win)."""
        values: dict[str, Any] = {
            "required_samples": config.required_samples,
            "n": config.n,
            "trigger_parameter_sync_step": config.trigger_parameter_sync_step,
            "staleness_threshold": config.staleness_threshold,
            "concurrent_samples_per_replica": config.concurrent_samples_per_replica,
            "staleness_rule": config.staleness_rule,
        }
        values.update(overrides)
        return cls(**values)


class Rollouter(MembershipFollower):
    """Produces samples into a `SampleQueue` under staleness admission and a concurrency cap.

    Args:
        source: Prompts, as a (sync or async) iterable of `Prompt` or of raw payloads
            (wrapped as ``Prompt(prompt_id=f"p{i}", prompt=payload)``).
        client: Sends requests (a `RetryingClient` or anything with ``generate``).
        replicas: The replicas whose routable count sizes the concurrency cap.
        queue: Where finished samples go; closed at end-of-stream.
        options: Admission settings (e.g. ``RollouterOptions.from_config(config)``).
        clock: Time source (default: the running loop).
        events: Bus receiving `RolloutEvent` and `StalenessResetEvent`.

    Example:
        >>> import asyncio
        >>> from dynsched_core import AsyncSampleQueue, InMemoryReplica, ReplicaSet, RetryingClient
        >>> async def demo() -> list[str]:
        ...     replicas = ReplicaSet(standalone=[InMemoryReplica("s0", tokens_per_s=1e5)])
        ...     await replicas.route(["s0"])
        ...     queue = AsyncSampleQueue()
        ...     prompts = [Prompt(prompt_id=f"p{i}", max_tokens=16) for i in range(3)]
        ...     options = RollouterOptions(required_samples=3, n=2)
        ...     rollouter = Rollouter(prompts, RetryingClient(replicas), replicas, queue, options)
        ...     await rollouter.run()  # returns at end-of-stream (3 <= admission budget)
        ...     return [s.sample_id for s in await queue.get(3, timeout=1.0)]
        >>> sorted(asyncio.run(demo()))
        ['p0', 'p1', 'p2']
    """

    def __init__(
        self,
        source: Iterable[Any] | AsyncIterable[Any],
        client: GenerateClient,
        replicas: ReplicaSet,
        queue: SampleQueue,
        options: RollouterOptions,
        *,
        clock: Clock | None = None,
        events: EventBus | None = None,
    ) -> None:
        super().__init__(replicas, clock)
        v.expect_instance("options", options, RollouterOptions)
        self._source = source
        self._client = client
        self._queue = queue
        self.options = options
        self.max_required_samples = options.max_required_samples
        self._events = events
        # Explicit counters: in flight = dispatched - finished.
        self._dispatched = 0
        self._finished_groups = 0
        self._completed = 0
        self._failed = 0
        self._cancelled = 0
        self._window_admitted = 0
        self._step_generated = 0
        self._param_version = 0
        self._routable = 0
        self._capacity = 0
        self._paused = False
        self._stopping = False
        self._source_exhausted = False
        self._finished = False
        self._wake = asyncio.Event()
        self._done = asyncio.Event()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._run_task: asyncio.Task[None] | None = None
        self._follow()

    @classmethod
    def from_config(
        cls,
        config: Any,
        source: Iterable[Any] | AsyncIterable[Any],
        client: GenerateClient,
        replicas: ReplicaSet,
        queue: SampleQueue,
        *,
        clock: Clock | None = None,
        events: EventBus | None = None,
        **overrides: Any,
    ) -> Rollouter:
        """Build from a `DynamicScheduleConfig` (``overrides`` are `RollouterOptions` fields)."""
        options = RollouterOptions.from_config(config, **overrides)
        return cls(source, client, replicas, queue, options, clock=clock, events=events)

    @property
    def client(self) -> GenerateClient:
        """The client that sends the requests."""
        return self._client

    @property
    def queue(self) -> SampleQueue:
        """The queue finished samples go to."""
        return self._queue

    # ------------------------------------------------------------------ properties
    @property
    def active(self) -> int:
        """Samples in flight (admitted, not finished)."""
        return self._dispatched - self._finished_groups

    @property
    def capacity(self) -> int:
        """Current concurrency cap."""
        return self._capacity

    @property
    def param_version(self) -> int:
        """Version of the current staleness window."""
        return self._param_version

    @property
    def total_generated_samples(self) -> int:
        """Samples put into the queue since the start."""
        return self._completed

    @property
    def finished(self) -> bool:
        """True once the run ended and the queue was closed."""
        return self._finished

    @property
    def paused(self) -> bool:
        """True between `pause` and `resume`."""
        return self._paused

    def stats(self) -> RollouterStats:
        """Snapshot of the counters."""
        return RollouterStats(
            admitted=self._dispatched,
            completed=self._completed,
            failed=self._failed,
            cancelled=self._cancelled,
            active=self.active,
            capacity=self._capacity,
            routable_replicas=self._routable,
            param_version=self._param_version,
            window_admitted=self._window_admitted,
            step_generated_samples=self._step_generated,
            max_required_samples=self.max_required_samples,
            source_exhausted=self._source_exhausted,
            finished=self._finished,
        )

    # ------------------------------------------------------------------ control
    def start(self) -> asyncio.Task[None]:
        """Run `run` in a background task and return it."""
        if self._run_task is None:
            self._run_task = asyncio.get_running_loop().create_task(self.run(), name="rollouter")
        return self._run_task

    async def run(self) -> None:
        """Admit prompts until the source ends or `stop`; then close the queue."""
        if self._finished:
            raise RuntimeError("this Rollouter already ran; build a new one")
        self._emit("seed")  # capacity may still be the placeholder 0, as in verl
        self._set_routable(self._replicas.num_routable)
        try:
            await self._admit_all()
            await self._wait_idle()
        finally:
            await self._cancel_groups()
            self._finished = True
            self._done.set()
            await self._queue.close()
            logger.info("rollouter finished: %s", self.stats())

    async def stop(self, *, drain_timeout_s: float = 0.0) -> None:
        """Stop admitting; let in-flight samples finish for ``drain_timeout_s``, cancel the rest.

        The queue is closed when the run ends. Safe to call more than once.
        """
        self._stopping = True
        self._wake.set()
        if drain_timeout_s > 0 and self.active:
            try:
                await asyncio.wait_for(self._wait_idle(), drain_timeout_s)
            except TimeoutError:
                logger.info("rollouter stop: %d sample(s) still in flight, cancelling", self.active)
        await self._cancel_groups()
        if self._run_task is not None:
            if not self._run_task.done():
                await asyncio.sleep(0)  # let the run notice the stop and close the queue
            if not self._run_task.done():
                self._run_task.cancel()  # e.g. blocked on an async prompt source
            await asyncio.gather(self._run_task, return_exceptions=True)
        elif not self._finished:
            self._finished = True
            self._done.set()
            await self._queue.close()

    async def wait_finished(self, timeout: float | None = None) -> bool:
        """Wait until the run ended; return False on timeout."""
        try:
            await asyncio.wait_for(self._done.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def pause(self) -> None:
        """Stop admitting new prompts (in-flight samples continue and drain)."""
        self._paused = True

    def resume(self) -> None:
        """Admit again after `pause`."""
        self._paused = False
        self._wake.set()

    async def reset_staleness(self, version: int) -> StalenessResetEvent:
        """Open the admission window of ``version`` (call at each weight sync).

        The new window starts with the samples still in flight plus, under the default
        ``staleness_rule="in_flight_and_queued"`` (verl's rule), the samples waiting in
        the queue: they were admitted under older weights and count against the new
        version's budget. Under ``"in_flight"`` queued samples do not count. Emits a
        ``reset`` `RolloutEvent` (closing the window) and a `StalenessResetEvent` carrying
        the samples generated during the closed window.
        """
        rule = self.options.staleness_rule
        queued = await self._queue.size() if rule == "in_flight_and_queued" else 0
        event = StalenessResetEvent(self._clock.now(), version, self._step_generated)
        self._emit("reset")
        self._param_version = version
        self._step_generated = 0
        self._window_admitted = self.active + queued
        if self._events is not None:
            self._events.emit(event)
        logger.debug(
            "staleness reset to v%d: window starts at %d/%d (generated %d in the last window)",
            version,
            self._window_admitted,
            self.max_required_samples,
            event.step_generated_samples,
        )
        self._wake.set()
        return event

    # ------------------------------------------------------------------ admission
    async def _admit_all(self) -> None:
        async for prompt in self._prompts():
            if not await self._wait_admissible():
                return
            self._dispatch(prompt)
        self._source_exhausted = True
        logger.info("prompt source exhausted after %d prompt(s)", self._dispatched)

    def _admissible(self) -> bool:
        return (
            not self._paused
            and self.active < self._capacity
            and self._window_admitted < self.max_required_samples
        )

    async def _wait_admissible(self) -> bool:
        """Wait (no lock held) until a prompt may be admitted; False when stopping."""
        while not self._stopping:
            if self._admissible():
                return True
            self._wake.clear()
            await self._wake.wait()
        return False

    async def _wait_idle(self) -> None:
        while self.active > 0:
            self._wake.clear()
            await self._wake.wait()

    def _dispatch(self, prompt: Prompt) -> None:
        if prompt.prompt_id in self._tasks:
            raise ValueError(f"prompt id {prompt.prompt_id!r} is already in flight")
        self._dispatched += 1
        self._window_admitted += 1
        task = asyncio.get_running_loop().create_task(
            self._run_group(prompt, self._param_version), name=f"sample-{prompt.prompt_id}"
        )
        self._tasks[prompt.prompt_id] = task
        self._emit("submit")

    async def _prompts(self) -> AsyncIterator[Prompt]:
        source = self._source
        index = 0
        if isinstance(source, AsyncIterable):
            async for item in source:
                yield self._as_prompt(item, index)
                index += 1
        else:
            for item in source:
                yield self._as_prompt(item, index)
                index += 1

    def _as_prompt(self, item: Any, index: int) -> Prompt:
        if isinstance(item, Prompt):
            return item
        return Prompt(prompt_id=f"p{index}", prompt=item, max_tokens=self.options.max_tokens)

    # ------------------------------------------------------------------ one sample
    async def _run_group(self, prompt: Prompt, version: int) -> None:
        submitted = self._clock.now()
        try:
            responses = await self._generate_group(prompt, version)
            if responses is not None:
                sample = RolloutSample(
                    sample_id=prompt.prompt_id,
                    prompt=prompt,
                    responses=responses,
                    param_version=version,
                    submitted_at=submitted,
                    completed_at=self._clock.now(),
                )
                await self._put(sample)
                self._completed += 1
                self._step_generated += 1
        except asyncio.CancelledError:
            self._cancelled += 1
            raise
        except Exception:
            self._failed += 1
            logger.exception("sample %s could not be queued", prompt.prompt_id)
        finally:
            self._finished_groups += 1
            self._tasks.pop(prompt.prompt_id, None)
            self._emit("drain" if self._paused or self._stopping else "complete")
            self._wake.set()

    async def _generate_group(
        self, prompt: Prompt, version: int
    ) -> tuple[RolloutOutcome, ...] | None:
        requests = [self._request(prompt, i, version) for i in range(self.options.n)]
        results = await asyncio.gather(
            *(self._client.generate(r) for r in requests), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        for err in errors:
            if not isinstance(err, Exception):
                raise err
        if errors:
            self._failed += 1
            logger.warning(
                "sample %s failed: %d of %d response(s) failed (first: %r)",
                prompt.prompt_id,
                len(errors),
                self.options.n,
                errors[0],
            )
            return None
        return tuple(r for r in results if isinstance(r, RolloutOutcome))

    def _request(self, prompt: Prompt, index: int, version: int) -> GenerateRequest:
        target = None
        if prompt.target_lens is not None:
            target = prompt.target_lens[index % len(prompt.target_lens)]
        return GenerateRequest(
            request_id=f"{prompt.prompt_id}/{index}",
            prompt=prompt.prompt,
            prompt_len=prompt.prompt_len,
            max_tokens=prompt.max_tokens,
            target_len=target,
            param_version=version,
            metadata={"sample_id": prompt.prompt_id, "index": index},
        )

    async def _put(self, sample: RolloutSample) -> None:
        while True:
            try:
                await self._queue.put(sample, timeout=self.options.put_timeout_s)
            except TimeoutError:
                if self._stopping:
                    raise
                # backpressure is the steady state of a training-bound run
                logger.info(
                    "queue full for %.0f s; still waiting to queue %s",
                    self.options.put_timeout_s,
                    sample.sample_id,
                )
            else:
                if self._events is not None:
                    self._events.emit(
                        SampleEvent(self._clock.now(), "produced", (sample_key(sample),))
                    )
                return

    async def _cancel_groups(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ capacity
    def _on_membership(self, event: MembershipEvent) -> None:
        if event.routable_changed:
            self._set_routable(len(event.routable))

    def _set_routable(self, count: int) -> None:
        self._routable = count
        capacity = self.options.capacity(count)
        if capacity != self._capacity:
            self._capacity = capacity
            self._emit("capacity")
            self._wake.set()

    def _emit(self, kind: RolloutEventKind) -> None:
        if self._events is not None:
            self._events.emit(RolloutEvent(self._clock.now(), self.active, self._capacity, kind))

    def __repr__(self) -> str:
        return (
            f"Rollouter(active={self.active}, capacity={self._capacity}, "
            f"v{self._param_version}, completed={self._completed})"
        )
