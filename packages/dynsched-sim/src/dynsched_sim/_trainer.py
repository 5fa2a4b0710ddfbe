"""`SimTrainer`: the simulated trainer backend plugged into the core's reference loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from dynsched_sim._accounting import GroupAccountant
from dynsched_sim._models import HardwareModel, LLMModel, TrainerModel
from dynsched_sim._replica import SimReplica

__all__ = ["MemoryConservationError", "SimTrainer"]


class MemoryConservationError(RuntimeError):
    """The trainer was about to train on GPUs whose hybrid engine is still awake."""


class SimTrainer:
    """Trainer on ``gpus`` GPUs whose micro-steps and weight syncs take simulated time.

    ``train_step`` sleeps `TrainerModel.step_s` on the loop clock (with the trainer-state
    swap when ``offload_state`` is set) and returns verl's timing keys; ``sync_weights``
    broadcasts to the standalone replicas (each one pauses decoding for
    `EngineModel.broadcast_sync_s`).

    Memory is conserved: a hybrid replica that is not asleep holds its share of the
    trainer GPUs' memory, so the trainer cannot train while one is awake. When a policy
    skipped the deactivation, ``reclaim`` is awaited first: it performs the deactivation
    the policy skipped (routing cut, requests aborted and resumed elsewhere, engines put to
    sleep, at their normal cost), so skipping a deactivation can never save its cost. If
    an engine is still awake afterwards, `MemoryConservationError` is raised.

    Args:
        model: Cost model.
        gpus: Trainer GPUs.
        standalone: Standalone replicas (receive the broadcast).
        hybrid: Hybrid replicas living on the trainer GPUs.
        groups: Accounting groups of the trainer GPUs.
        accountant: Ground-truth accountant.
        tokens_of: Training tokens of one sample.
        ledger: The replicas' ``request_id -> tokens decoded`` ledger (optional).
        hardware: Hardware model (for the state swap; optional without offload).
        llm: Model (for the state swap; optional without offload).

    The coroutine awaited before a step while a hybrid engine is awake (see above) is
    set with `set_reclaim`, since it needs objects built after the trainer. An observer
    set with `set_sample_observer` sees every micro-batch with the trainer's parameter
    ``version`` (the run's staleness, `StalenessLedger`).
    """

    def __init__(
        self,
        model: TrainerModel,
        gpus: int,
        *,
        standalone: Sequence[SimReplica],
        hybrid: Sequence[SimReplica] = (),
        groups: Iterable[str] = (),
        accountant: GroupAccountant | None = None,
        tokens_of: Callable[[Any], int],
        ledger: Mapping[str, int] | None = None,
        hardware: HardwareModel | None = None,
        llm: LLMModel | None = None,
    ) -> None:
        self.model = model
        self.gpus = gpus
        self._standalone = list(standalone)
        self._hybrid = list(hybrid)
        self._groups = list(groups)
        self._acct = accountant
        self._tokens_of = tokens_of
        if model.offload_state and (hardware is None or llm is None):
            raise ValueError("offload_state needs the hardware and llm models")
        self._hw, self._llm = hardware, llm
        self._swap_s = self._state_swap_s()
        self._reclaim: Callable[[], Awaitable[None]] | None = None
        self._observer: Callable[[int, Sequence[Any]], None] | None = None
        self.version = 0
        self.steps = 0
        self.tokens_trained = 0
        self.train_s = 0.0
        self.sync_s = 0.0
        self.syncs = 0
        self.reclaims = 0
        self._ledger = ledger
        self.tokens_exact = True
        self.mismatched_responses = 0

    def _state_swap_s(self) -> float:
        if self._hw is None or self._llm is None:
            return 0.0
        return self.model.state_swap_s(self._hw, self._llm, self.gpus)

    @property
    def standalone(self) -> list[SimReplica]:
        """The standalone replicas the weights are broadcast to."""
        return list(self._standalone)

    @property
    def hybrid(self) -> list[SimReplica]:
        """The hybrid replicas living on the trainer's GPUs."""
        return list(self._hybrid)

    @property
    def groups(self) -> list[str]:
        """The accounting groups of the trainer's GPUs."""
        return list(self._groups)

    def regroup(
        self,
        gpus: int,
        *,
        groups: Iterable[str],
        standalone: Sequence[SimReplica],
        hybrid: Sequence[SimReplica],
    ) -> None:
        """A role move changed the trainer (at a sync boundary): its data-parallel size
        ``gpus`` (step times follow `TrainerModel` at the new size; global batch kept),
        the accounting groups of its GPUs, the standalone replicas it broadcasts to and
        the hybrid replicas living on its GPUs.

        Raises:
            ValueError: ``gpus < 1``.
        """
        if gpus < 1:
            raise ValueError(f"SimTrainer.regroup: gpus must be >= 1, got {gpus}")
        self.gpus = gpus
        self._groups = list(groups)
        self._standalone = list(standalone)
        self._hybrid = list(hybrid)
        self._swap_s = self._state_swap_s()

    def set_reclaim(self, reclaim: Callable[[], Awaitable[None]]) -> None:
        """Set the coroutine that puts awake hybrid engines to sleep before a step."""
        self._reclaim = reclaim

    def set_sample_observer(self, observer: Callable[[int, Sequence[Any]], None]) -> None:
        """Call ``observer(version, samples)`` with each micro-batch as a step consumes it
        (``version``: the trainer's parameter version, the number of weight syncs so far)."""
        self._observer = observer

    def _set(self, activity: str) -> None:
        if self._acct is not None:
            for g in self._groups:
                self._acct.set_trainer(g, activity)

    def _awake(self) -> list[SimReplica]:
        return [r for r in self._hybrid if r.state != "asleep"]

    async def train_step(self, samples: Sequence[Any]) -> Mapping[str, float]:
        """Run one micro-step over ``samples``; returns ``timing_raw``-style seconds.

        Raises:
            MemoryConservationError: a hybrid engine on the trainer GPUs is still awake
                after ``reclaim`` (or there is no ``reclaim``).
        """
        tokens = sum(self._tokens_of(s) for s in samples)
        for s in samples:
            self.check_sample(s)
        if self._observer is not None:
            self._observer(self.version, samples)
        if self._awake() and self._reclaim is not None:
            self.reclaims += 1
            await self._reclaim()
        awake = self._awake()
        if awake:
            raise MemoryConservationError(
                f"cannot train: hybrid replica(s) {[r.replica_id for r in awake]} still hold "
                "memory on the trainer GPUs"
            )
        timings = self.model.timings(tokens, self.gpus, self._swap_s)
        total = self.model.step_s(tokens, self.gpus, self._swap_s)
        self._set("train")
        try:
            await asyncio.sleep(total)
        finally:
            self._set("")
        self.steps += 1
        self.tokens_trained += tokens
        self.train_s += total
        return timings

    def check_sample(self, sample: Any) -> None:
        """Every response must have exactly its natural length (no token lost or doubled)."""
        targets = getattr(getattr(sample, "prompt", None), "target_lens", None)
        if targets is None:
            return
        got = tuple(o.num_tokens for o in sample.responses)
        if self._ledger is not None:
            decoded = tuple(self._ledger.get(o.request_id, 0) for o in sample.responses)
        else:
            decoded = got
        if got != tuple(targets) or decoded != tuple(targets):
            self.tokens_exact = False
            self.mismatched_responses += sum(
                1 for a, b, t in zip(got, decoded, targets, strict=False) if a != t or b != t
            )

    async def sync_weights(self, version: int) -> None:
        """Broadcast weights ``version`` to every standalone replica."""
        self.version = version
        if not self._standalone:
            return
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        self._set("weight_sync")
        try:
            await asyncio.gather(*(r.update_weights(version) for r in self._standalone))
        finally:
            self._set("")
        self.syncs += 1
        self.sync_s += loop.time() - t0
