"""Assemble the simulated cluster of one configuration: replicas, trainer, accounting."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs
from dynsched_core import DynamicScheduleConfig, EventBus, Prompt, RolloutSample

from dynsched_sim._accounting import GroupAccountant
from dynsched_sim._bound import admissible_prompts
from dynsched_sim._replica import SimReplica, SimReplicaOptions
from dynsched_sim._scenario import Configuration, Scenario
from dynsched_sim._trainer import SimTrainer
from dynsched_sim._versions import StalenessLedger
from dynsched_sim._workload import Workload

__all__ = ["RunLedgers", "SimCluster", "build_cluster", "prompt_source"]


@attrs.frozen
class RunLedgers:
    """What every replica and the trainer of one run share: the GPU-time accountant, the
    token ledger (``request_id -> tokens decoded`` over every attempt on every replica)
    and the per-sample staleness ledger."""

    accountant: GroupAccountant
    ledger: dict[str, int] = attrs.Factory(dict)
    staleness: StalenessLedger = attrs.Factory(StalenessLedger)


@attrs.define
class SimCluster:
    """Everything simulated in one run (the core objects are built by the loop)."""

    scenario: Scenario
    conf: Configuration
    config: DynamicScheduleConfig
    workload: Workload
    shared: RunLedgers
    standalone: list[SimReplica]
    hybrid: list[SimReplica]
    trainer: SimTrainer
    trainer_groups: list[str]
    #: Replicas a role move retired (their records stay readable).
    retired: list[SimReplica] = attrs.field(factory=list, init=False)

    @property
    def accountant(self) -> GroupAccountant:
        """The run's GPU-time accountant."""
        return self.shared.accountant

    @property
    def ledger(self) -> dict[str, int]:
        """The run's ``request_id -> tokens decoded`` ledger."""
        return self.shared.ledger

    @property
    def staleness(self) -> StalenessLedger:
        """The run's per-sample staleness ledger."""
        return self.shared.staleness

    @property
    def replicas(self) -> dict[str, SimReplica]:
        """All replicas by id (standalone first; replicas a role move retired last)."""
        return {r.replica_id: r for r in (*self.standalone, *self.hybrid, *self.retired)}

    def make_replica(self, role: str, i: int, node: str, group: str | None = None) -> SimReplica:
        """Replica ``i`` of ``role`` on the ``node`` server holding its first GPU, sharing
        the run's ledgers and accountant (accounting group ``group``, default its id)."""
        return _replica(self.scenario, self.shared, role, i, node, group)


def _replica(
    scenario: Scenario,
    shared: RunLedgers,
    role: str,
    i: int,
    node: str,
    group: str | None = None,
) -> SimReplica:
    """Replica ``i`` of ``role`` (see `SimCluster.make_replica`)."""
    eng, hw = scenario.engine, scenario.hardware
    g = eng.gpus_per_replica
    return SimReplica(
        f"{role}-{i}",
        eng,
        hw,
        scenario.model,
        role=role,
        accountant=shared.accountant,
        ledger=shared.ledger,
        options=SimReplicaOptions(group=group, node=f"{node}-node-{(i * g) // hw.gpus_per_node}"),
        first_tokens=shared.staleness.first_token,
    )


def _tokens_of(n: int) -> Callable[[RolloutSample], int]:
    """Training tokens of a sample: ``n * prompt_len + response tokens``."""

    def tokens(sample: RolloutSample) -> int:
        return n * sample.prompt.prompt_len + sample.num_tokens

    return tokens


def run_workload(
    scenario: Scenario, conf: Configuration, cfg: DynamicScheduleConfig, seed: int
) -> Workload:
    """The workload a run of ``conf`` with schedule config ``cfg`` draws for ``seed``:
    every prompt it can admit, lengths drawn for the samples it trains."""
    return scenario.workload.generate(
        admissible_prompts(scenario, conf, cfg),
        seed,
        run_samples=scenario.steps * cfg.required_samples,
    )


def build_cluster(
    scenario: Scenario,
    conf: Configuration,
    *,
    seed: int,
    events: EventBus,
    clock: Callable[[], float],
    config: DynamicScheduleConfig | None = None,
) -> SimCluster:
    """Build the replicas, trainer and accountant of ``conf`` (call inside the loop).

    ``config``: the run's schedule config, when already built (default: built here).
    """
    cfg = config if config is not None else scenario.schedule_config(conf)
    eng = scenario.engine
    workload = run_workload(scenario, conf, cfg, seed)
    acct = GroupAccountant(clock, events)
    g = eng.gpus_per_replica
    if conf.trainer_gpus % g == 0:
        trainer_groups = [f"trainer-{i}" for i in range(conf.trainer_gpus // g)]
        for name in trainer_groups:
            acct.add_group(name, g, "trainer")
    else:
        trainer_groups = ["trainer"]
        acct.add_group("trainer", conf.trainer_gpus, "trainer")
    shared = RunLedgers(acct)
    standalone = []
    for i in range(conf.rollout_gpus // g):
        acct.add_group(f"standalone-{i}", g, "standalone")
        standalone.append(_replica(scenario, shared, "standalone", i, "rollout"))
    hybrid = []
    if conf.hybrid:
        hybrid = [
            _replica(scenario, shared, "hybrid", i, "trainer", grp)
            for i, grp in enumerate(trainer_groups)
        ]
    trainer = SimTrainer(
        scenario.trainer,
        conf.trainer_gpus,
        standalone=standalone,
        hybrid=hybrid,
        groups=trainer_groups,
        accountant=acct,
        tokens_of=_tokens_of(scenario.workload.n),
        ledger=shared.ledger,
        hardware=scenario.hardware,
        llm=scenario.model,
    )
    trainer.set_sample_observer(shared.staleness.consume)
    return SimCluster(
        scenario, conf, cfg, workload, shared, standalone, hybrid, trainer, trainer_groups
    )


def prompt_source(workload: Workload, max_tokens: int) -> Iterator[Prompt]:
    """The workload's prompt groups as core `Prompt` objects, in order."""
    plens = workload.prompt_lens.tolist()
    rlens = workload.response_lens.tolist()
    for i in range(len(plens)):
        yield Prompt(
            prompt_id=f"p{i}",
            prompt_len=plens[i],
            max_tokens=max_tokens,
            target_lens=tuple(rlens[i]),
        )
