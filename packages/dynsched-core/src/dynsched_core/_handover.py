"""The hand-over of a trainer GPU between the trainer and the hybrid replicas on it.

A hybrid replica lives on a trainer GPU. Memory on that GPU is held either by the
trainer (parameters, gradients, optimizer state) or by the awake hybrid replicas (weights,
KV cache), never by both. The order is:

- the trainer offloads **before** a hybrid replica on its GPU wakes;
- every hybrid replica on the GPU sleeps (and releases its memory) **before** the trainer
  reloads.

`GpuHandOver` records who holds each GPU and raises `HandOverError` on any call that
would break the order, instead of letting two parties allocate on one GPU.
`HandOverReplica` wraps a hybrid `RolloutReplica` so its ``wake_up`` / ``sleep`` go
through the record (optionally asking the trainer to offload first).

A hybrid replica's death reaches the record through the run's `ReplicaSet`:
`GpuHandOver.follow` subscribes to its membership events and forgets every hybrid
replica the set reports dead or removed (its memory went with its process).

State is recorded conservatively: a party counts as holding the GPU from the moment it
starts taking it (before its ``wake_up`` / ``reload`` returns) until its release has
finished (after ``sleep`` / ``offload`` returned), and a failed release leaves it holding.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from dynsched_core._errors import DynschedError
from dynsched_core._protocols import GenerateRequest, GenerateResult, ReplicaCapabilities

if TYPE_CHECKING:
    from dynsched_core._replicas import MembershipEvent, ReplicaSet

__all__ = ["GpuHandOver", "GpuHolders", "HandOverError", "HandOverReplica"]

logger = logging.getLogger(__name__)


class HandOverError(DynschedError, RuntimeError):
    """A trainer or a hybrid replica tried to take a GPU another party still holds.

    Attributes:
        gpu: The GPU.
        holders: Who holds it (``"trainer"`` and/or hybrid replica ids).
    """

    def __init__(self, message: str, gpu: Hashable = None, holders: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.gpu = gpu
        self.holders = tuple(holders)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.gpu, self.holders))


@attrs.frozen
class GpuHolders:
    """Who holds one GPU.

    Attributes:
        gpu: The GPU key.
        trainer_resident: The trainer holds its state there (not offloaded).
        awake: Hybrid replicas holding memory there (awake, waking, or asleep without
            having released their memory).
    """

    gpu: Hashable
    trainer_resident: bool
    awake: tuple[str, ...]


class GpuHandOver:
    """Records who holds each trainer GPU and enforces the hand-over order.

    Args:
        allow_unreleased_sleep: Count a hybrid replica that slept *without* releasing its
            memory (vLLM on CPU has no sleep mode) as released. Off by default: then such
            a replica keeps its GPU and the trainer's reload raises. Turn it on only
            where the "GPU" is bookkeeping (CPU runs).

    Example:
        >>> h = GpuHandOver()
        >>> h.register_trainer(0)
        >>> h.register_hybrid("hybrid-0", [0])
        >>> h.hybrid_waking("hybrid-0")
        Traceback (most recent call last):
        ...
        dynsched_core._handover.HandOverError: hybrid replica 'hybrid-0' cannot wake on GPU 0: the trainer has not offloaded
        >>> h.trainer_offloaded(0); h.hybrid_waking("hybrid-0")
        >>> h.holders(0)
        GpuHolders(gpu=0, trainer_resident=False, awake=('hybrid-0',))
    """

    def __init__(self, *, allow_unreleased_sleep: bool = False) -> None:
        self.allow_unreleased_sleep = bool(allow_unreleased_sleep)
        self._trainer: dict[Hashable, bool] = {}
        self._hybrid_gpus: dict[str, tuple[Hashable, ...]] = {}
        self._awake: set[str] = set()
        self.log: list[tuple[str, Hashable]] = []

    # ------------------------------------------------------------------ registration
    def register_trainer(self, gpu: Hashable, *, resident: bool = True) -> None:
        """Declare the trainer (worker) of ``gpu``; ``resident``: it holds its state now."""
        if resident:
            self._refuse_trainer(gpu, "be registered resident")
        self._trainer[gpu] = bool(resident)

    def register_hybrid(
        self, replica_id: str, gpus: Sequence[Hashable], *, awake: bool = False
    ) -> None:
        """Declare a hybrid replica on ``gpus``; ``awake``: it holds memory now."""
        gpus = tuple(gpus)
        if not gpus:
            raise ValueError(f"hybrid replica {replica_id!r} must sit on at least one GPU")
        self._hybrid_gpus[replica_id] = gpus
        if awake:
            self._refuse_hybrid(replica_id, "be registered awake")
            self._awake.add(replica_id)

    def forget_hybrid(self, replica_id: str) -> None:
        """Drop a replica whose process is gone (its memory went with it); idempotent."""
        if self._hybrid_gpus.pop(replica_id, None) is None:
            return
        self._awake.discard(replica_id)
        self.log.append((f"forget:{replica_id}", None))

    def follow(self, replicas: ReplicaSet) -> Callable[[], None]:
        """Forget each hybrid replica ``replicas`` reports dead or removed, from now on.

        Returns:
            A function that stops following.
        """

        def on_change(event: MembershipEvent) -> None:
            if event.kind in ("died", "removed"):
                for replica_id in event.replica_ids:
                    self.forget_hybrid(replica_id)

        return replicas.subscribe(on_change)

    # ------------------------------------------------------------------ trainer side
    def trainer_offloaded(self, gpu: Hashable) -> None:
        """The trainer of ``gpu`` finished offloading."""
        self._trainer[gpu] = False
        self.log.append(("trainer_offloaded", gpu))

    def trainer_reloading(self, gpu: Hashable) -> None:
        """The trainer of ``gpu`` is about to reload.

        Raises:
            HandOverError: a hybrid replica on ``gpu`` has not slept (released) yet.
        """
        self._refuse_trainer(gpu, "reload")
        self._trainer[gpu] = True
        self.log.append(("trainer_reloading", gpu))

    # ------------------------------------------------------------------ hybrid side
    def hybrid_waking(self, replica_id: str) -> None:
        """A hybrid replica is about to wake.

        Raises:
            HandOverError: the trainer of one of its GPUs has not offloaded.
            KeyError: the replica was never registered.
        """
        self._refuse_hybrid(replica_id, "wake")
        self._awake.add(replica_id)
        self.log.append((f"hybrid_waking:{replica_id}", self._hybrid_gpus[replica_id]))

    def hybrid_asleep(self, replica_id: str, *, released: bool = True) -> None:
        """A hybrid replica finished sleeping; ``released``: its memory was freed."""
        if replica_id not in self._hybrid_gpus:
            raise KeyError(f"unknown hybrid replica {replica_id!r}")
        if released or self.allow_unreleased_sleep:
            self._awake.discard(replica_id)
        else:
            logger.warning(
                "hybrid replica %s slept without releasing memory; it keeps GPU(s) %s",
                replica_id,
                self._hybrid_gpus[replica_id],
            )
        self.log.append((f"hybrid_asleep:{replica_id}", self._hybrid_gpus[replica_id]))

    # ------------------------------------------------------------------ queries
    def holders(self, gpu: Hashable) -> GpuHolders:
        """Who holds ``gpu`` now."""
        awake = tuple(
            sorted(r for r in self._awake if gpu in self._hybrid_gpus.get(r, ())),
        )
        return GpuHolders(gpu, bool(self._trainer.get(gpu, False)), awake)

    @property
    def gpus(self) -> list[Hashable]:
        """Every GPU known (trainer or hybrid)."""
        seen: dict[Hashable, None] = dict.fromkeys(self._trainer)
        for gpus in self._hybrid_gpus.values():
            seen.update(dict.fromkeys(gpus))
        return list(seen)

    def _refuse_trainer(self, gpu: Hashable, action: str) -> None:
        awake = self.holders(gpu).awake
        if awake:
            raise HandOverError(
                f"trainer cannot {action} on GPU {gpu!r}: hybrid replica(s) {list(awake)} "
                "still hold it (sleep them first)",
                gpu,
                awake,
            )

    def _refuse_hybrid(self, replica_id: str, action: str) -> None:
        try:
            gpus = self._hybrid_gpus[replica_id]
        except KeyError:
            raise KeyError(f"unknown hybrid replica {replica_id!r}") from None
        for gpu in gpus:
            if self._trainer.get(gpu, False):
                raise HandOverError(
                    f"hybrid replica {replica_id!r} cannot {action} on GPU {gpu!r}: the "
                    "trainer has not offloaded",
                    gpu,
                    ("trainer",),
                )


class HandOverReplica:
    """A hybrid `RolloutReplica` whose ``wake_up`` / ``sleep`` follow a `GpuHandOver`.

    ``wake_up`` first awaits ``before_wake`` (e.g. the trainer's offload on the same GPU),
    then asks the record (which raises `HandOverError` while the trainer still holds the
    GPU), then wakes the replica. ``sleep`` sleeps the replica, then records the release
    (a replica whose capabilities say it cannot sleep keeps holding its GPU). Every other
    call goes straight to the replica.

    Args:
        replica: The hybrid replica.
        handover: The record shared with the trainer side.
        gpus: The GPUs the replica sits on.
        before_wake: Awaited before every ``wake_up``.
        awake: The replica holds memory now.
    """

    def __init__(
        self,
        replica: Any,
        handover: GpuHandOver,
        gpus: Sequence[Hashable],
        *,
        before_wake: Callable[[], Awaitable[Any]] | None = None,
        awake: bool = False,
    ) -> None:
        self.inner = replica
        self.handover = handover
        self.gpus = tuple(gpus)
        self.before_wake = before_wake
        handover.register_hybrid(replica.replica_id, self.gpus, awake=awake)

    @property
    def replica_id(self) -> str:
        """The wrapped replica's id."""
        return str(self.inner.replica_id)

    @property
    def capabilities(self) -> ReplicaCapabilities:
        """The wrapped replica's capabilities."""
        caps: ReplicaCapabilities = self.inner.capabilities
        return caps

    def __getattr__(self, name: str) -> Any:
        # proxies carry more than the protocol (is_dead, placement, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate on the wrapped replica."""
        result: GenerateResult = await self.inner.generate(request)
        return result

    async def abort(self, request_ids: Sequence[str] | None = None) -> int:
        """Abort on the wrapped replica."""
        return int(await self.inner.abort(request_ids))

    async def wake_up(self) -> None:
        """Take the GPU (after ``before_wake``), then wake the replica.

        Raises:
            HandOverError: the trainer on one of its GPUs still holds it.
        """
        if self.before_wake is not None:
            await self.before_wake()
        self.handover.hybrid_waking(self.replica_id)
        await self.inner.wake_up()

    async def sleep(self) -> None:
        """Sleep the replica, then record the release of its GPUs."""
        await self.inner.sleep()
        self.handover.hybrid_asleep(
            self.replica_id, released=bool(self.capabilities.supports_sleep)
        )

    async def resume(self) -> None:
        """Resume the wrapped replica."""
        await self.inner.resume()

    async def update_weights(self, version: int, weights: Any = None) -> None:
        """Load weights into the wrapped replica."""
        await self.inner.update_weights(version, weights)

    async def in_flight(self) -> int:
        """In-flight requests of the wrapped replica."""
        return int(await self.inner.in_flight())
