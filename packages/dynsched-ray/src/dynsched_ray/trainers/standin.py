"""`RayTrainerBackend`: the reference loop's trainer, driving trainer worker actors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dynsched_core import ReplicaSet

from dynsched_ray.runtime.errors import ActorUnavailableError
from dynsched_ray.runtime.remote import await_ref

__all__ = ["RayTrainerBackend", "push_weights"]

logger = logging.getLogger(__name__)


class RayTrainerBackend:
    """Implements the core loop's ``TrainerBackend`` over Ray actors.

    ``train_step`` runs one step on every trainer worker actor at once (a stand-in for a
    data-parallel optimizer step); ``sync_weights`` records the version on the workers and
    pushes it to the live standalone members of the run's `ReplicaSet` (a replica found
    dead during the push is skipped: the set already knows). Without workers a step
    sleeps ``step_time_s`` in the driver.

    Args:
        workers: Trainer worker actor handles.
        replicas: The run's replicas (their live standalone members get the weights).
        call_timeout_s: Timeout of every actor call.
        step_time_s: Step time when there are no worker actors.
        on_step: Called with the samples of every step (e.g. to record consumed ids).
    """

    def __init__(
        self,
        workers: Sequence[Any],
        replicas: ReplicaSet,
        *,
        call_timeout_s: float = 600.0,
        step_time_s: float = 0.05,
        on_step: Callable[[Sequence[Any]], None] | None = None,
    ) -> None:
        self.workers = list(workers)
        self.replicas = replicas
        self.call_timeout_s = float(call_timeout_s)
        self.step_time_s = float(step_time_s)
        self._on_step = on_step
        self.version = 0
        self.steps = 0

    async def train_step(self, samples: Sequence[Any]) -> Mapping[str, float]:
        """Train on ``samples`` on every worker; timings are the slowest worker's."""
        if self._on_step is not None:
            self._on_step(samples)
        self.steps += 1
        if not self.workers:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await asyncio.sleep(self.step_time_s)
            return {"update_actor": loop.time() - t0}
        timings = await asyncio.gather(
            *(
                await_ref(
                    w.train_step.remote(len(samples)),
                    timeout_s=self.call_timeout_s,
                    what="trainer.train_step",
                )
                for w in self.workers
            )
        )
        out: dict[str, float] = {}
        for t in timings:
            for k, v in t.items():
                out[k] = max(out.get(k, 0.0), float(v))
        return out

    async def sync_weights(self, version: int) -> Any:
        """Record ``version`` on the workers and load it into the live standalone replicas."""
        self.version = version
        await asyncio.gather(
            *(
                await_ref(
                    w.set_version.remote(version),
                    timeout_s=self.call_timeout_s,
                    what="trainer.set_version",
                )
                for w in self.workers
            )
        )
        await push_weights(self.replicas.of_role("standalone"), version)
        return None


async def push_weights(replicas: Sequence[Any], version: int, weights: Any = None) -> None:
    """``update_weights(version, weights)`` on every replica at once (a weight sync).

    A replica found dead meanwhile (`ActorUnavailableError`) is skipped with a warning:
    the run's `ReplicaSet` already knows. Any other failure is raised once all are done.
    """
    results = await asyncio.gather(
        *(r.update_weights(version, weights) for r in replicas), return_exceptions=True
    )
    for replica, res in zip(replicas, results, strict=True):
        if isinstance(res, ActorUnavailableError):
            logger.warning("weight sync v%d skipped dead replica %s", version, replica.replica_id)
        elif isinstance(res, BaseException):
            raise res
