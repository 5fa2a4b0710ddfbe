"""`SimTrainer`: the simulated trainer backend plugged into the core's reference loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dynsched_sim._accounting import GroupAccountant
from dynsched_sim._models import TrainerModel
from dynsched_sim._replica import SimReplica

__all__ = ["SimTrainer"]


class SimTrainer:
    """Trainer on ``gpus`` GPUs whose micro-steps and weight syncs take simulated time.

    ``train_step`` sleeps `TrainerModel.step_s` on the loop clock and returns verl's
    timing keys; ``sync_weights`` broadcasts to the standalone replicas (each one pauses
    decoding for `EngineModel.broadcast_sync_s`). Hybrid replicas that are still awake
    while the trainer trains (a policy that never deactivates) are frozen for the step:
    a GPU cannot train and decode at once.

    Args:
        model: Cost model.
        gpus: Trainer GPUs.
        standalone: Standalone replicas (receive the broadcast).
        hybrid: Hybrid replicas living on the trainer GPUs.
        groups: Accounting groups of the trainer GPUs.
        accountant: Ground-truth accountant.
        tokens_of: Training tokens of one sample.
        ledger: The replicas' ``request_id -> tokens decoded`` ledger (optional).
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
    ) -> None:
        self.model = model
        self.gpus = gpus
        self._standalone = list(standalone)
        self._hybrid = list(hybrid)
        self._groups = list(groups)
        self._acct = accountant
        self._tokens_of = tokens_of
        self.steps = 0
        self.tokens_trained = 0
        self.train_s = 0.0
        self.sync_s = 0.0
        self.syncs = 0
        self.overlap_steps = 0
        self._ledger = ledger
        self.tokens_exact = True
        self.mismatched_responses = 0

    def _set(self, activity: str) -> None:
        if self._acct is not None:
            for g in self._groups:
                self._acct.set_trainer(g, activity)

    async def train_step(self, samples: Sequence[Any]) -> Mapping[str, float]:
        """Run one micro-step over ``samples``; returns ``timing_raw``-style seconds."""
        tokens = sum(self._tokens_of(s) for s in samples)
        for s in samples:
            self.check_sample(s)
        timings = self.model.timings(tokens, self.gpus)
        total = self.model.step_s(tokens, self.gpus)
        awake = [r for r in self._hybrid if r.state != "asleep"]
        if awake:
            self.overlap_steps += 1
        for r in awake:
            r.freeze()
        self._set("train")
        try:
            await asyncio.sleep(total)
        finally:
            self._set("")
            for r in awake:
                r.unfreeze()
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
