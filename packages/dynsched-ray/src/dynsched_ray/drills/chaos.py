"""Chaos under load: seeded fault injection into a `RayRunner` and a checking soak harness.

`ChaosSchedule.generate` draws, from a seed, which fault strikes after which training
step and how long after it; `ChaosMonkey` injects them into a running `RayRunner`;
`run_chaos_soak` runs a long training run (restarting the driver from its checkpoint
when the schedule says so) and checks, continuously:

- every sample id is put into the queue at most once per driver lifetime (samples lost
  with a driver restart are produced again and counted as re-generated) and trained on
  at most once over the whole run (the final checkpoint's list);
- no sample is trained more than ``staleness_bound`` weight versions after the oldest
  version that generated it;
- no wait for samples lasts longer than its timeout;
- driver memory (RSS) and live Ray object references owned by the driver stay bounded;
- the run finishes its steps.

Fault kinds (`FAULT_KINDS`):

``kill_standalone``
    a standalone replica is killed while it generates (restarted by the supervisor);
``kill_all_standalone``
    every standalone replica at once (hybrid replicas take over by failover when asleep);
``kill_during_activation`` / ``kill_during_deactivation``
    a hybrid replica is killed at the next switch's start;
``router_restart`` / ``queue_restart``
    the router / queue actor is killed (replaced; the queue reloads its journal);
``driver_restart``
    the driver is cancelled mid-step and a new one resumes from the checkpoint;
``straggler``
    a replica generates ``straggler_factor`` times slower for a while;
``network_delay``
    every actor call is delayed for a while.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import math
import os
import random
import statistics
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

import attrs
import ray
from dynsched_core import DynamicScheduleConfig, DynamicSchedulePolicyBase
from dynsched_core import validators as v
from dynsched_core.events import SampleEvent, TrainStepEvent

from dynsched_ray.runtime.remote import inject_call_delay
from dynsched_ray.runtime.runner import RayRunner, RayRunOptions, load_checkpoint

__all__ = [
    "FAULT_KINDS",
    "ChaosFault",
    "ChaosMonkey",
    "ChaosReport",
    "ChaosSchedule",
    "SampleAccounting",
    "account_samples",
    "run_chaos_soak",
]

logger = logging.getLogger(__name__)

FAULT_KINDS: tuple[str, ...] = (
    "kill_standalone",
    "kill_all_standalone",
    "kill_during_activation",
    "kill_during_deactivation",
    "router_restart",
    "queue_restart",
    "driver_restart",
    "straggler",
    "network_delay",
)


@attrs.frozen(kw_only=True)
class ChaosFault:
    """One fault of a schedule.

    Attributes:
        step: It strikes after this global training step (its `TrainStepEvent`).
        kind: One of `FAULT_KINDS`.
        delay_s: Seconds after that step's event.
        target: Index used to pick the victim among the candidates (modulo their count).
    """

    step: int
    kind: str = attrs.field(validator=v.one_of(FAULT_KINDS))
    delay_s: float = 0.0
    target: int = 0


@attrs.frozen(kw_only=True)
class ChaosSchedule:
    """A seeded list of faults, sorted by step.

    Attributes:
        seed: The seed it was drawn from.
        faults: The faults.
    """

    seed: int
    faults: tuple[ChaosFault, ...]

    @classmethod
    def generate(
        cls,
        seed: int,
        num_steps: int,
        *,
        faults_per_10_steps: float = 1.5,
        kinds: Sequence[str] = FAULT_KINDS,
        first_step: int = 2,
        max_delay_s: float = 0.3,
    ) -> ChaosSchedule:
        """Draw a schedule: every kind once (in random order), then random kinds.

        Faults strike after steps in ``[first_step, num_steps - 2]``, at most one per
        step, ``faults_per_10_steps`` per ten steps on average (at least one per kind).

        Raises:
            ValueError: an unknown kind, or too few steps for one fault per kind.
        """
        unknown = sorted(set(kinds) - set(FAULT_KINDS))
        if unknown:
            raise ValueError(f"kinds: unknown {unknown}; allowed: {list(FAULT_KINDS)}")
        rng = random.Random(seed)
        steps = list(range(first_step, num_steps - 1))
        count = max(len(kinds), round(num_steps * faults_per_10_steps / 10))
        if count > len(steps):
            raise ValueError(
                f"num_steps={num_steps}: room for {len(steps)} fault(s), {count} wanted"
                f" (at least one per kind: {len(kinds)})"
            )
        chosen = sorted(rng.sample(steps, count))
        drawn = list(kinds)
        rng.shuffle(drawn)
        drawn += [rng.choice(list(kinds)) for _ in range(count - len(kinds))]
        faults = tuple(
            ChaosFault(
                step=step,
                kind=kind,
                delay_s=round(rng.uniform(0.0, max_delay_s), 3),
                target=rng.randrange(1 << 16),
            )
            for step, kind in zip(chosen, drawn, strict=True)
        )
        return cls(seed=seed, faults=faults)

    def by_step(self) -> dict[int, ChaosFault]:
        """The faults keyed by step."""
        return {f.step: f for f in self.faults}


@attrs.define
class _Injected:
    fault: ChaosFault
    index: int
    time: float = 0.0
    detail: str = ""
    recovery_s: float | None = None
    fired_after_step: int | None = None
    deferred: list[str] = attrs.Factory(list)
    state: str = "scheduled"


class ChaosMonkey:
    """Injects a `ChaosSchedule`'s faults into the `RayRunner` it is attached to.

    Feed it every finished global training step (`on_step`; the soak does this from the
    runner's `TrainStepEvent`) and hook `on_transition` up as the runner's
    ``on_transition`` callback; `attach` it to each new runner of a restarted driver.

    Every scheduled fault fires exactly once: a fault that cannot fire when it is due (no
    driver running, a driver restart under way, no victim alive, a switch fault already
    armed) is *deferred* to the next step, never dropped, and each deferral is recorded
    with its reason. `executed` lists the faults that fired, `not_executed` those still
    waiting at the end.

    Args:
        schedule: The faults.
        straggler_factor: Slow-down of a straggler.
        straggler_s: How long a straggler stays slow.
        network_delay_s: Delay added to every actor call during a network fault.
        network_s: How long a network fault lasts.
        on_driver_restart: Called when a ``driver_restart`` fault strikes.
    """

    def __init__(
        self,
        schedule: ChaosSchedule,
        *,
        straggler_factor: float = 4.0,
        straggler_s: float = 2.0,
        network_delay_s: float = 0.05,
        network_s: float = 1.0,
        on_driver_restart: Callable[[], None] | None = None,
    ) -> None:
        self.schedule = schedule
        self.straggler_factor = straggler_factor
        self.straggler_s = straggler_s
        self.network_delay_s = network_delay_s
        self.network_s = network_s
        self._records = [_Injected(f, i) for i, f in enumerate(schedule.faults)]
        self._pending = sorted(self._records, key=lambda r: (r.fault.step, r.index))
        self._deferred: list[_Injected] = []
        self._on_driver_restart = on_driver_restart
        self.runner: RayRunner | None = None
        self.injected: list[_Injected] = []
        self._armed: dict[str, _Injected] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._restarting = False
        self._last_step = 0

    def attach(self, runner: RayRunner) -> None:
        """Inject into ``runner`` from now on (a resumed driver gets a new runner).

        Armed switch faults stay armed: they strike at the new driver's next switch.
        """
        self.runner = runner
        self._restarting = False

    def on_step(self, step: int) -> None:
        """A global training step finished: fire the faults due by now.

        Deferred faults are retried first, then every scheduled fault whose step is
        ``<= step`` (a resumed driver repeats steps: a fault fires at the first time its
        step is reached).
        """
        self._last_step = step
        due, self._deferred = self._deferred, []
        while self._pending and self._pending[0].fault.step <= step:
            due.append(self._pending.pop(0))
        for record in due:
            task = asyncio.ensure_future(self._fire(record, step))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def on_transition(self, tr: Any) -> None:
        """The runner's ``on_transition`` callback: fire armed switch faults."""
        target = getattr(tr.target, "name", str(tr.target))
        kind = {"ACTIVATING": "kill_during_activation", "DEACTIVATING": "kill_during_deactivation"}
        armed = self._armed.get(kind.get(target, ""))
        if armed is None:
            return
        victim = self._pick(self._live("hybrid"), armed.fault.target)
        if victim is None:  # stays armed for the next switch
            armed.deferred.append(f"at {target} after step {self._last_step}: no live hybrid")
            return
        del self._armed[armed.fault.kind]
        armed.detail = f"killed {victim} at {target}"
        armed.time = asyncio.get_running_loop().time()
        self._done(armed, self._last_step)
        self._kill(victim)

    @property
    def executed(self) -> list[dict[str, Any]]:
        """The faults that fired, in schedule order (kind, scheduled step, when, deferrals)."""
        return [self._as_dict(r) for r in self._records if r.fired_after_step is not None]

    @property
    def not_executed(self) -> list[dict[str, Any]]:
        """Scheduled faults that have not fired (yet), in schedule order."""
        return [self._as_dict(r) for r in self._records if r.fired_after_step is None]

    @property
    def deferrals(self) -> int:
        """Deferrals so far (a fault deferred twice counts twice)."""
        return sum(len(r.deferred) for r in self._records)

    async def settle(self, timeout_s: float = 60.0) -> None:
        """Wait (bounded) until the faults due so far have fired or been deferred.

        The soak calls this before each training step trains, so a fault scheduled after
        step N strikes before step N+1 is trained: the run cannot outpace its schedule.
        """
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    async def cancel(self) -> None:
        """Cancel injections in progress (bounded)."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _as_dict(r: _Injected) -> dict[str, Any]:
        return {
            "step": r.fault.step,
            "kind": r.fault.kind,
            "fired_after_step": r.fired_after_step,
            "deferred": list(r.deferred),
            "detail": r.detail,
            "state": r.state,
        }

    def _done(self, record: _Injected, step: int) -> None:
        record.state = "fired"
        record.fired_after_step = step
        self.injected.append(record)

    def _defer(self, record: _Injected, step: int, reason: str) -> None:
        record.state = "deferred"
        record.deferred.append(f"after step {step}: {reason}")
        logger.info(
            "chaos: %s (step %d) deferred: %s", record.fault.kind, record.fault.step, reason
        )
        self._deferred.append(record)

    def _live(self, role: str) -> list[str]:
        runner = self.runner
        if runner is None or runner.replicas is None:
            return []
        return runner.replicas.ids(role)  # type: ignore[arg-type]

    @staticmethod
    def _pick(candidates: Sequence[str], index: int) -> str | None:
        return candidates[index % len(candidates)] if candidates else None

    def _kill(self, replica_id: str) -> None:
        runner = self.runner
        if runner is not None and runner.fleet is not None:
            try:
                runner.fleet.kill_replica(replica_id)
            except Exception as exc:  # already gone
                logger.debug("chaos: kill of %s failed: %r", replica_id, exc)

    async def _fire(self, record: _Injected, step: int) -> None:
        record.state = "due"
        await asyncio.sleep(record.fault.delay_s)
        runner = self.runner
        if self._restarting:
            self._defer(record, step, "a driver restart is under way")
        elif runner is None or runner.fleet is None or runner.replicas is None:
            self._defer(record, step, "no driver running")
        else:
            record.state = "injecting"
            try:
                reason = await self._inject(record, runner)
            except Exception as exc:  # e.g. the driver's fleet went away meanwhile
                reason = f"{type(exc).__name__}: {exc}"
            if reason is not None:
                self._defer(record, step, reason)
            elif (
                record.fault.kind not in self._armed or self._armed[record.fault.kind] is not record
            ):
                self._done(record, step)

    async def _inject(self, record: _Injected, runner: RayRunner) -> str | None:
        """Inject ``record``'s fault; the reason it cannot fire now, or None."""
        fleet = runner.fleet
        assert fleet is not None
        loop = asyncio.get_running_loop()
        fault = record.fault
        record.time = loop.time()
        kind = fault.kind
        if kind == "kill_standalone":
            # a replica that is generating: wait (bounded) for a request on one
            busy: list[str] = []
            for _ in range(200):
                busy = [r for r in self._live("standalone") if fleet.router.requests_on(r)]
                if busy:
                    break
                await asyncio.sleep(0.01)
            victim = self._pick(busy or self._live("standalone"), fault.target)
            if victim is None:
                return "no live standalone replica"
            record.detail = f"killed {victim}" + (" while generating" if busy else "")
            record.time = loop.time()
            self._kill(victim)
        elif kind == "kill_all_standalone":
            victims = self._live("standalone")
            if not victims:
                return "no live standalone replica"
            record.detail = f"killed {victims}"
            for rid in victims:
                self._kill(rid)
        elif kind in ("kill_during_activation", "kill_during_deactivation"):
            if kind in self._armed:
                return f"a {kind} fault is already armed"
            record.detail = "armed"
            record.state = "armed"
            self._armed[kind] = record  # fires (and counts) at the next such switch
        elif kind == "router_restart":
            record.detail = "killed the router actor"
            ray.kill(fleet.router.handle, no_restart=True)
        elif kind == "queue_restart":
            record.detail = f"killed the queue actor holding ~{fleet.queue.qsize()} sample(s)"
            ray.kill(fleet.queue.handle, no_restart=True)
        elif kind == "driver_restart":
            record.detail = "driver cancelled"
            self._restarting = True
            if self._on_driver_restart is not None:
                self._on_driver_restart()
        elif kind == "straggler":
            victim = self._pick(sorted(fleet.replicas), fault.target)
            if victim is None:
                return "no replica"
            record.detail = f"{victim} x{self.straggler_factor:g} for {self.straggler_s:g} s"
            handle = fleet.replicas[victim].handle
            try:
                await asyncio.wait_for(
                    handle.set_straggler.remote(self.straggler_factor, self.straggler_s), 10.0
                )
            except Exception as exc:
                record.detail += f" (not applied: {type(exc).__name__})"
        elif kind == "network_delay":
            record.detail = f"+{self.network_delay_s:g} s per actor call for {self.network_s:g} s"
            inject_call_delay(self.network_delay_s, self.network_s)
        return None


@attrs.frozen(kw_only=True)
class ChaosReport:
    """What a chaos soak did and found (`run_chaos_soak`). `as_dict` is the JSON form."""

    seed: int
    steps_requested: int
    steps_completed: int
    segments: int
    wall_s: float
    faults_by_kind: Mapping[str, int]
    faults: tuple[Mapping[str, Any], ...]
    schedule: tuple[Mapping[str, Any], ...]
    faults_not_executed: tuple[Mapping[str, Any], ...]
    fault_deferrals: int
    samples: Mapping[str, Any]
    recoveries: Mapping[str, Any]
    time_lost_s_by_kind: Mapping[str, float]
    samples_produced: int
    samples_consumed: int
    samples_lost: int
    samples_duplicated: int
    samples_regenerated_after_driver_restart: int
    requests_resumed_after_replica_death: int
    steps_redone_after_driver_restart: int
    staleness_bound: int
    max_staleness: int
    staleness_violations: int
    stale_samples: tuple[Mapping[str, Any], ...]
    wait_timeout_s: float
    max_wait_s: float
    waits_over_timeout: int
    memory: Mapping[str, Any]
    failures: tuple[str, ...]

    @property
    def executed_faults(self) -> list[tuple[str, int]]:
        """``(kind, scheduled step)`` of every fault that fired, in schedule order."""
        return [(str(f["kind"]), int(f["step"])) for f in self.faults]

    @property
    def ok(self) -> bool:
        """Every check passed."""
        return not self.failures

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready)."""
        out = attrs.asdict(self)
        out["ok"] = self.ok
        return out


@attrs.define
class _Lifetime:
    """What one driver lifetime did with sample ids (from its `SampleEvent` s)."""

    produced: list[str] = attrs.Factory(list)
    consumed: list[str] = attrs.Factory(list)
    left: list[str] | None = None
    committed: list[str] = attrs.Factory(list)
    finished: bool = False

    def record(self, event: SampleEvent) -> None:
        if event.kind == "produced":
            self.produced.extend(event.sample_ids)
        elif event.kind == "consumed":
            self.consumed.extend(event.sample_ids)
        elif event.kind == "left":
            self.left = list(event.sample_ids)


@attrs.frozen(kw_only=True)
class SampleAccounting:
    """Per-id accounting of a soak over every driver lifetime (`account_samples`).

    Attributes:
        produced: Distinct sample ids put into a queue (acknowledged), over every driver.
        consumed: Distinct ids trained and kept by the final checkpoint.
        regenerated: Ids produced again by a later driver after a driver restart
            discarded them (not trained, or trained after the last checkpoint).
        left: Ids still in the last driver's queue when it ended (not trained).
        returned: Ids discarded with a restarted driver and not produced again before
            the run ended (their prompts are not in the checkpoint: a resume makes them).
        lost: Ids produced and then neither trained, nor in the final queue, nor
            discarded with a driver restart.
        duplicated: Ids produced twice by one driver, taken twice, trained twice, or
            produced again after a checkpoint had recorded them trained.
        problems: One line per violation, naming the ids.
    """

    produced: int
    consumed: int
    regenerated: int
    left: int
    returned: int
    lost: tuple[str, ...]
    duplicated: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """No id lost, duplicated or otherwise unexplained."""
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready); ``lost`` and ``duplicated`` as counts and id lists."""
        return {
            "produced": self.produced,
            "consumed": self.consumed,
            "regenerated": self.regenerated,
            "left": self.left,
            "returned": self.returned,
            "lost": len(self.lost),
            "duplicated": len(self.duplicated),
            "lost_ids": list(self.lost),
            "duplicated_ids": list(self.duplicated),
            "problems": list(self.problems),
        }


def _ids(xs: Any, limit: int = 20) -> str:
    xs = sorted(xs, key=_natural)
    more = f" (+{len(xs) - limit} more)" if len(xs) > limit else ""
    return ", ".join(xs[:limit]) + more


def _natural(x: str) -> tuple[str, int]:
    head = x.rstrip("0123456789")
    tail = x[len(head) :]
    return head, int(tail) if tail else -1


@attrs.define
class _IdChecks:
    """The findings `account_samples` gathers while it walks the driver lifetimes."""

    problems: list[str] = attrs.Factory(list)
    duplicated: set[str] = attrs.Factory(set)
    lost: set[str] = attrs.Factory(set)

    def duplicate(self, ids: Collection[str], message: str) -> None:
        """Count ``ids`` (if any) as duplicated, with one problem line."""
        if ids:
            self.duplicated.update(ids)
            self.problems.append(f"{message}: {_ids(ids)}")

    def lose(self, ids: Collection[str], message: str) -> None:
        """Count ``ids`` (if any) as lost, with one problem line."""
        if ids:
            self.lost.update(ids)
            self.problems.append(f"{message}: {_ids(ids)}")

    def check_lifetime(self, i: int, life: _Lifetime, before: set[str]) -> set[str]:
        """Check driver lifetime ``i`` (``before``: committed when it started); its ids."""
        for what, ids in (("produced", life.produced), ("taken from the queue", life.consumed)):
            again = sorted(sid for sid, n in Counter(ids).items() if n > 1)
            self.duplicate(again, f"{what} twice by driver lifetime {i}")
        produced = set(life.produced)
        self.duplicate(
            set(life.consumed) - produced, f"taken but never produced in driver lifetime {i}"
        )
        self.duplicate(
            produced & before,
            f"produced again by driver lifetime {i} after a checkpoint recorded them trained",
        )
        return produced

    def check_last(self, last: _Lifetime, final: set[str]) -> set[str]:
        """Check the last driver's ending; the ids left in its queue (not trained)."""
        if last.left is None:
            self.problems.append("the last driver did not report the samples left in its queue")
        left = set(last.left or ()) - final
        self.lose(set(last.consumed) - final, "trained by the last driver but not checkpointed")
        return left

    def sort_out_the_rest(
        self,
        lifetimes: Sequence[_Lifetime],
        last_made: Mapping[str, int],
        final: set[str],
        left: set[str],
    ) -> set[str]:
        """Ids neither trained nor left: returned (discarded with a restarted driver) or
        lost; the returned ones."""
        n = len(lifetimes)
        returned: set[str] = set()
        vanished: set[str] = set()
        for sid, where in last_made.items():
            if sid in final or sid in left or sid in self.lost:
                continue
            if where < n and not lifetimes[where - 1].finished:
                returned.add(sid)  # discarded with a restarted driver, prompt still pending
                continue
            vanished.add(sid)
        self.lose(vanished, "lost (produced, never trained, not in the final queue)")
        return returned


def account_samples(lifetimes: Sequence[_Lifetime]) -> SampleAccounting:
    """Check every sample id across every driver lifetime.

    Each produced id must end one way: trained exactly once and kept by the final
    checkpoint, still in the last driver's queue, or discarded with a driver restart
    (then produced again by a later driver at most once per restart, or left to the
    prompt source). Anything else is lost or duplicated.
    """
    checks = _IdChecks()
    final = lifetimes[-1].committed if lifetimes else []
    final_set = set(final)
    twice = sorted(sid for sid, n in Counter(final).items() if n > 1)
    checks.duplicate(twice, "trained twice (final checkpoint)")
    last_made: dict[str, int] = {}
    made_in: Counter[str] = Counter()
    before: set[str] = set()  # committed when a lifetime started
    for i, life in enumerate(lifetimes, start=1):
        for sid in checks.check_lifetime(i, life, before):
            made_in[sid] += 1
            last_made[sid] = i
        checks.lose(
            set(life.committed) - final_set, f"checkpointed after lifetime {i}, missing later"
        )
        before = set(life.committed)
    left = checks.check_last(lifetimes[-1], final_set) if lifetimes else set()
    returned = checks.sort_out_the_rest(lifetimes, last_made, final_set, left)
    never = final_set - set(last_made)
    if never:
        checks.problems.append(f"in the final checkpoint but never produced: {_ids(never)}")
    return SampleAccounting(
        produced=len(last_made),
        consumed=len(final_set),
        regenerated=sum(1 for c in made_in.values() if c > 1),
        left=len(left),
        returned=len(returned),
        lost=tuple(sorted(checks.lost, key=_natural)),
        duplicated=tuple(sorted(checks.duplicated, key=_natural)),
        problems=tuple(checks.problems),
    )


def gate_training(gate: Callable[[], Awaitable[None]]) -> Callable[[Any], None]:
    """A `RayRunner` ``on_loop_built`` hook: before each training step, the loop's
    trainer awaits ``gate()`` (the soak: the faults due so far fire first)."""

    def on_loop_built(loop: Any) -> None:
        trainer = loop.trainer
        train_step = trainer.train_step

        async def gated(samples: Any) -> Any:
            await gate()
            return await train_step(samples)

        trainer.train_step = gated

    return on_loop_built


class _ChaosPolicy(DynamicSchedulePolicyBase):
    """Switches every cycle: hybrid replicas generate while the trainer waits, sleep while
    it trains (so switch faults always find a switch)."""

    name = "chaos-always-switch"

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: Any) -> int:
        return 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        return True


def chaos_config() -> DynamicScheduleConfig:
    """The soak's scheduler settings: 2 trainer GPUs (2 hybrid), 2 standalone replicas."""
    return DynamicScheduleConfig.from_dict(
        {
            "async_training": {
                "use_dynamic_resource_scheduling": True,
                "trigger_parameter_sync_step": 2,
                "staleness_threshold": 0.5,
                "concurrent_samples_per_replica": 2,
                "partial_rollout": True,
            },
            "trainer": {"nnodes": 1, "n_gpus_per_node": 2},
            "rollout": {"nnodes": 1, "n_gpus_per_node": 2},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2}, "rollout": {"n": 2}},
        }
    )


def _rss_mb() -> float:
    try:
        with open(f"/proc/{os.getpid()}/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def _ray_refs() -> int:
    try:
        worker = ray._private.worker.global_worker
        return len(worker.core_worker.get_all_reference_counts())
    except Exception:
        return -1


async def run_chaos_soak(
    seed: int,
    num_steps: int,
    *,
    name: str = "chaos",
    kinds: Sequence[str] = FAULT_KINDS,
    faults_per_10_steps: float = 1.5,
    checkpoint_dir: str,
    wait_timeout_s: float = 120.0,
    staleness_bound: int | None = None,
    options: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ChaosReport:
    """Run ``num_steps`` training steps under the seeded faults; check and report.

    Ray must be initialised. In-memory replicas (`InMemoryReplica`) in actors, stand-in
    trainer workers, the `_ChaosPolicy` that switches every cycle, supervisor restarts on.

    Args:
        seed: Seeds the fault schedule.
        num_steps: Training steps of the whole run (over driver restarts).
        name: Actor name prefix.
        kinds: Fault kinds to draw from (each at least once).
        faults_per_10_steps: Fault rate.
        checkpoint_dir: Where the driver checkpoint goes.
        wait_timeout_s: The bound of every wait for samples.
        staleness_bound: Largest allowed ``trained version - oldest generating version``
            (default ``ceil(1 + staleness_threshold) + 1``: a sample may be admitted up
            to ``staleness_threshold`` windows early, plus the window it is trained in).
        options: Overrides of the `RayRunOptions`.
        progress: Called with every progress line.
    """
    soak = _Soak(
        seed,
        num_steps,
        name=name,
        kinds=kinds,
        faults_per_10_steps=faults_per_10_steps,
        checkpoint_dir=checkpoint_dir,
        wait_timeout_s=wait_timeout_s,
        staleness_bound=staleness_bound,
        options=options,
        progress=progress,
    )
    while soak.steps_done < num_steps:
        if not await soak.run_lifetime():
            break
    await soak.monkey.cancel()
    return soak.report(soak.loop.time() - soak.start)


def _soak_options(
    name: str, ckpt: str, wait_timeout_s: float, options: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The `RayRunOptions` of every driver of a soak (but its steps and resume flag)."""
    base: dict[str, Any] = {
        "name": name,
        "trainer_workers": 1,
        "tokens_per_s": 1500.0,
        "trainer_step_time_s": 0.03,
        "health_check_interval_s": 0.25,
        "call_timeout_s": 20.0,
        "wait_timeout_s": wait_timeout_s,
        "no_replica_timeout_s": wait_timeout_s,
        "checkpoint_path": ckpt,
        "keep_router": True,
        "replica_restarts": 1000,
        "restart_timeout_s": 30.0,
        "stream_tokens": 8,
        "switch_delay_s": 0.01,
    }
    base.update(options or {})
    return base


def _committed(saved: Mapping[str, Any] | None) -> list[str]:
    """The sample ids a driver checkpoint records trained."""
    return [str(x) for x in (saved or {}).get("consumed_sample_ids", [])]


class _Soak:
    """The running state of one `run_chaos_soak`: its set-up, the facts collected from
    every driver lifetime (segment), and the final checks and report."""

    def __init__(
        self,
        seed: int,
        num_steps: int,
        *,
        name: str,
        kinds: Sequence[str],
        faults_per_10_steps: float,
        checkpoint_dir: str,
        wait_timeout_s: float,
        staleness_bound: int | None,
        options: Mapping[str, Any] | None,
        progress: Callable[[str], None] | None,
    ) -> None:
        self.seed, self.num_steps, self.kinds = seed, num_steps, kinds
        self.wait_timeout_s, self.progress = wait_timeout_s, progress
        self.config = chaos_config()
        self.bound = (
            staleness_bound
            if staleness_bound is not None
            else math.ceil(1 + self.config.staleness_threshold) + 1
        )
        self.schedule = ChaosSchedule.generate(
            seed, num_steps, faults_per_10_steps=faults_per_10_steps, kinds=kinds
        )
        self.restart_requested = asyncio.Event()
        self.monkey = ChaosMonkey(self.schedule, on_driver_restart=self.restart_requested.set)
        self.loop = asyncio.get_running_loop()
        self.ckpt = os.path.join(checkpoint_dir, f"{name}-driver.json")
        self.start = self.loop.time()
        self.base = _soak_options(name, self.ckpt, wait_timeout_s, options)
        self.failures: list[str] = []
        self.lifetimes: list[_Lifetime] = []
        self.step_times: list[tuple[int, float]] = []
        self.waits: list[float] = []
        self.memory: list[dict[str, float]] = []
        self.staleness: list[int] = []
        self.resumed_requests = 0
        self.restarts: list[Any] = []
        self.failovers = 0
        self.router_recovery: list[float] = []
        self.queue_recovery: list[float] = []
        self.driver_cancels: list[float] = []
        self.stale: list[dict[str, Any]] = []
        self.steps_redone = 0
        self.segments = 0
        self.steps_done = 0

    # ------------------------------------------------------------ one driver lifetime
    def on_step(self, step: int, event: TrainStepEvent) -> None:
        """A global training step finished: its time, its wait, faults, memory."""
        self.step_times.append((step, self.loop.time()))
        self.waits.append(float(event.timings.get("gen", 0.0)))
        self.monkey.on_step(step)
        if step % 10 == 0:
            gc.collect()
            self.memory.append(
                {
                    "step": step,
                    "t": self.loop.time() - self.start,
                    "rss_mb": _rss_mb(),
                    "ray_refs": _ray_refs(),
                }
            )

    async def run_lifetime(self) -> bool:
        """Run one driver until it ends or a driver restart fault cancels it, and collect
        its facts; False when the driver failed (the soak stops)."""
        self.segments += 1
        self.restart_requested.clear()
        life = _Lifetime()
        self.lifetimes.append(life)
        offset = self.steps_done  # the resumed driver numbers its steps from the checkpoint's
        runner = self._new_runner(life, offset)
        self.monkey.attach(runner)
        task = asyncio.ensure_future(runner.run())
        waiter = asyncio.ensure_future(self.restart_requested.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not task.done():  # driver restart: cancel it mid-step
            saved = await self._cancel_driver(runner, task, offset)
        else:
            try:
                res = task.result()
            except Exception as exc:
                self.failures.append(f"segment {self.segments} failed: {type(exc).__name__}: {exc}")
                saved = _read_checkpoint(self.ckpt)
                self.steps_done = int(saved["steps_done"]) if saved is not None else 0
                life.committed = _committed(saved)
                return False
            saved = self._driver_finished(res, life)
        life.committed = _committed(saved)
        self._collect_recoveries(runner)
        self._collect_staleness(runner)
        return True

    def _new_runner(self, life: _Lifetime, offset: int) -> RayRunner:
        opt = RayRunOptions(
            **{
                **self.base,
                "num_steps": self.num_steps - self.steps_done,
                "resume": self.steps_done > 0,
            }
        )

        def on_event(event: Any) -> None:
            if isinstance(event, SampleEvent):
                life.record(event)
            elif isinstance(event, TrainStepEvent):
                self.on_step(offset + event.step, event)

        return RayRunner(
            self.config,
            opt,
            on_loop_built=gate_training(self.monkey.settle),
            policy=_ChaosPolicy(),
            keep_samples=True,
            progress=self.progress,
            on_transition=self.monkey.on_transition,
            on_event=on_event,
        )

    async def _cancel_driver(
        self, runner: RayRunner, task: asyncio.Future[Any], offset: int
    ) -> dict[str, Any] | None:
        """Cancel the driver mid-step; the checkpoint the next driver resumes from."""
        cancelled_at = self.loop.time()
        trained = len(runner.consumed_samples) // self.config.required_samples
        task.cancel()
        await asyncio.wait({task}, timeout=60.0)
        saved = _read_checkpoint(self.ckpt)
        kept = int(saved["steps_done"]) if saved is not None else 0
        self.steps_redone += max(0, offset + trained - kept)
        self.steps_done = kept
        self.driver_cancels.append(cancelled_at)
        return saved

    def _driver_finished(self, res: Any, life: _Lifetime) -> dict[str, Any] | None:
        """The driver ran its steps: check its counters; its last checkpoint."""
        life.finished = True
        self.steps_done = res.first_step - 1 + res.loop.steps
        if res.loop.samples_failed:
            self.failures.append(
                f"segment {self.segments}: {res.loop.samples_failed} sample(s) failed"
            )
        if res.loop.samples_produced != res.loop.samples_consumed + res.loop.samples_left:
            self.failures.append(f"segment {self.segments}: queue counters do not add up")
        return _read_checkpoint(self.ckpt)

    # ------------------------------------------------------------ collecting the facts
    def _collect_recoveries(self, runner: RayRunner) -> None:
        """Recoveries of every driver lifetime, the cancelled ones included."""
        if runner.supervisor is not None:
            self.restarts.extend(runner.supervisor.history)
        if runner.loop is not None:
            # per driver lifetime (the counter itself is checkpointed)
            self.failovers += sum(1 for e in runner.loop.driver.failover_events if e.ok)
        if runner.fleet is not None:
            self.router_recovery += runner.fleet.router.recovery_s
            self.queue_recovery += runner.fleet.queue.recovery_s
            self.resumed_requests += sum(
                len(r.interrupted) for r in [*runner.fleet.retired, *runner.fleet.replicas.values()]
            )

    def _collect_staleness(self, runner: RayRunner) -> None:
        """Staleness of every sample trained in this segment."""
        for sample, version in zip(runner.consumed_samples, runner.consumed_versions, strict=True):
            lag = version - int(sample.min_param_version)
            self.staleness.append(lag)
            if lag > self.bound and len(self.stale) < 20:
                self.stale.append(
                    {
                        "sample_id": str(sample.sample_id),
                        "trained_version": version,
                        "admitted_version": int(sample.param_version),
                        "oldest_version": int(sample.min_param_version),
                        "replicas": sorted({x for r in sample.responses for x in r.replica_ids}),
                        "segment": self.segments,
                    }
                )

    # ------------------------------------------------------------ accounting and report
    def _check_run(self, accounting: SampleAccounting) -> tuple[list[int], list[float]]:
        """Failures of samples, steps, staleness and waits; the stale lags, the long waits."""
        self.failures.extend(f"samples: {p}" for p in accounting.problems)
        if self.steps_done < self.num_steps:
            self.failures.append(f"finished {self.steps_done}/{self.num_steps} steps")
        expected = self.steps_done * self.config.required_samples
        if accounting.consumed != expected:
            self.failures.append(f"{accounting.consumed} sample(s) trained, {expected} expected")
        over = [s for s in self.staleness if s > self.bound]
        if over:
            self.failures.append(f"{len(over)} sample(s) staler than {self.bound} version(s)")
        long_waits = [w for w in self.waits if w > self.wait_timeout_s]
        if long_waits:
            self.failures.append(f"{len(long_waits)} wait(s) longer than {self.wait_timeout_s} s")
        return over, long_waits

    def _check_faults(
        self, by_kind: Mapping[str, int], not_executed: Sequence[Mapping[str, Any]]
    ) -> None:
        missing = [k for k in self.kinds if k not in by_kind]
        if missing:
            self.failures.append(f"fault kinds never injected: {missing}")
        if not_executed:
            self.failures.append(
                f"{len(not_executed)} scheduled fault(s) never executed: "
                + ", ".join(f"{f['kind']}@{f['step']}" for f in not_executed)
            )

    def _recoveries(self) -> dict[str, Any]:
        # driver restart recovery: cancel -> the next step's line
        fixed: list[float] = []
        for t0 in self.driver_cancels:
            later = [t for _, t in self.step_times if t > t0]
            fixed.append((later[0] - t0) if later else float("nan"))
        restarts = self.restarts
        return {
            "replica_restarts": len([r for r in restarts if r.ok]),
            "replica_restarts_failed": len([r for r in restarts if not r.ok]),
            "replica_downtime_s": _spread([r.downtime_s for r in restarts if r.ok]),
            "failovers": self.failovers,
            "router_replacements": len(self.router_recovery),
            "router_recovery_s": _spread(self.router_recovery),
            "queue_replacements": len(self.queue_recovery),
            "queue_recovery_s": _spread(self.queue_recovery),
            "driver_restarts": len(fixed),
            "driver_recovery_s": _spread(fixed),
        }

    def report(self, wall: float) -> ChaosReport:
        """Run the final checks (adding to the failures) and build the report."""
        accounting = account_samples(self.lifetimes)
        over, long_waits = self._check_run(accounting)
        mem = _memory_summary(self.memory)
        if mem.get("leak"):
            self.failures.append(f"memory grows: {mem['leak']}")
        executed = self.monkey.executed
        by_kind = Counter(str(f["kind"]) for f in executed)
        not_executed = self.monkey.not_executed
        self._check_faults(by_kind, not_executed)
        return ChaosReport(
            seed=self.seed,
            steps_requested=self.num_steps,
            steps_completed=self.steps_done,
            segments=self.segments,
            wall_s=round(wall, 2),
            faults_by_kind=dict(sorted(by_kind.items())),
            faults=tuple(executed),
            schedule=tuple(
                {"step": f.step, "kind": f.kind, "delay_s": f.delay_s, "target": f.target}
                for f in self.schedule.faults
            ),
            faults_not_executed=tuple(not_executed),
            fault_deferrals=self.monkey.deferrals,
            samples=accounting.as_dict(),
            recoveries=self._recoveries(),
            time_lost_s_by_kind=_time_lost(self.monkey.injected, self.step_times),
            samples_produced=accounting.produced,
            samples_consumed=accounting.consumed,
            samples_lost=len(accounting.lost),
            samples_duplicated=len(accounting.duplicated),
            samples_regenerated_after_driver_restart=accounting.regenerated,
            requests_resumed_after_replica_death=self.resumed_requests,
            steps_redone_after_driver_restart=self.steps_redone,
            staleness_bound=self.bound,
            max_staleness=max(self.staleness, default=0),
            staleness_violations=len(over),
            stale_samples=tuple(self.stale),
            wait_timeout_s=self.wait_timeout_s,
            max_wait_s=round(max(self.waits, default=0.0), 3),
            waits_over_timeout=len(long_waits),
            memory=mem,
            failures=tuple(self.failures),
        )


def _read_checkpoint(path: str) -> dict[str, Any] | None:
    """The driver checkpoint, or None before the first one was written."""
    try:
        return load_checkpoint(path)
    except FileNotFoundError:
        return None


def _spread(values: Sequence[float | None]) -> dict[str, float]:
    xs = [float(x) for x in values if x is not None and not math.isnan(float(x))]
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "mean": round(statistics.fmean(xs), 3),
        "max": round(max(xs), 3),
        "min": round(min(xs), 3),
    }


def _time_lost(
    injected: Sequence[_Injected], step_times: Sequence[tuple[int, float]]
) -> dict[str, float]:
    """Excess wall time of the 3 steps after each fault over the run's median step time."""
    times = sorted(t for _, t in step_times)
    gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
    if not gaps:
        return {}
    median = statistics.median(gaps)
    lost: dict[str, float] = {}
    for rec in injected:
        after = [t for t in times if t >= rec.time][:3]
        if not after:
            continue
        prev = [t for t in times if t < rec.time]
        start = prev[-1] if prev else rec.time
        excess = max(0.0, (after[-1] - start) - median * len(after))
        lost[rec.fault.kind] = round(lost.get(rec.fault.kind, 0.0) + excess, 3)
    return dict(sorted(lost.items()))


def _memory_summary(samples: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    if len(samples) < 4:
        return {"samples": list(samples)}
    quarter = max(1, len(samples) // 4)
    first, last = samples[:quarter], samples[-quarter:]
    rss0 = max(s["rss_mb"] for s in first)
    rss1 = max(s["rss_mb"] for s in last)
    ref0 = max(s["ray_refs"] for s in first)
    ref1 = max(s["ray_refs"] for s in last)
    leak = []
    # judgement: after warm-up, the last quarter may exceed the first by 25 % + 64 MiB
    # of RSS and by 2x + 50 references before it counts as growth
    if rss1 > 1.25 * rss0 + 64:
        leak.append(f"rss {rss0:.0f} -> {rss1:.0f} MiB")
    if ref1 > 2 * ref0 + 50:
        leak.append(f"ray refs {ref0} -> {ref1}")
    return {
        "rss_mb_start": round(samples[0]["rss_mb"], 1),
        "rss_mb_end": round(samples[-1]["rss_mb"], 1),
        "rss_mb_first_quarter_max": round(rss0, 1),
        "rss_mb_last_quarter_max": round(rss1, 1),
        "ray_refs_start": samples[0]["ray_refs"],
        "ray_refs_end": samples[-1]["ray_refs"],
        "ray_refs_first_quarter_max": ref0,
        "ray_refs_last_quarter_max": ref1,
        "leak": "; ".join(leak),
        "series": [dict(s) for s in samples],
    }
