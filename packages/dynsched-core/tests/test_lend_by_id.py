"""Partial lending by name: `hybrid_replica_ids_to_activate`, the nodes in the context,
`DynamicScheduleContext.hybrid_ids_per_node`, and the guard rails on a wrong answer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from dynsched_core import (
    AsyncSampleQueue,
    DriverOptions,
    DynamicResourceController,
    DynamicScheduleConfig,
    DynamicScheduleContext,
    DynamicSchedulePolicyBase,
    EventBus,
    InMemoryReplica,
    ReplicaSet,
    ScheduleDriver,
)
from dynsched_core.events import GuardRailEvent
from hypothesis import given
from hypothesis import strategies as st

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
NODES = {"h0": "n0", "h1": "n0", "h2": "n1", "h3": "n1"}


class Chooser(DynamicSchedulePolicyBase):
    """Lends after every sync; names the replicas with ``choose(ctx)``; optional count."""

    def __init__(self, choose: Any, k: Any = None) -> None:
        self.choose, self.k = choose, k
        self.seen: list[DynamicScheduleContext] = []

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: Any) -> int:
        return 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        return True

    def hybrid_replica_ids_to_activate(self, global_steps: int, ctx: DynamicScheduleContext) -> Any:
        self.seen.append(ctx)
        return self.choose(ctx)

    def hybrid_replicas_to_activate(self, global_steps: int, ctx: DynamicScheduleContext) -> Any:
        return self.k


async def make(policy: DynamicSchedulePolicyBase) -> tuple[ScheduleDriver, list[Any]]:
    events = EventBus()
    seen: list[Any] = []
    events.subscribe(seen.append)
    hyb = [InMemoryReplica(r, role="hybrid", node=n) for r, n in NODES.items()]
    replicas = ReplicaSet(standalone=[InMemoryReplica("s0", node="r0")], hybrid=hyb)
    await replicas.route(["s0"])
    ctrl = DynamicResourceController(replicas, events=events)
    config = DynamicScheduleConfig(
        use_dynamic_resource_scheduling=True, ppo_mini_batch_size=2, trigger_parameter_sync_step=2
    )
    driver = ScheduleDriver(
        policy, ctrl, AsyncSampleQueue(), config, DriverOptions(wait_timeout_s=5.0), events=events
    )
    return driver, seen


def test_the_base_class_names_no_replica() -> None:
    class Plain(Chooser):
        hybrid_replica_ids_to_activate = DynamicSchedulePolicyBase.hybrid_replica_ids_to_activate

    assert (
        Plain(None).hybrid_replica_ids_to_activate(1, DynamicScheduleContext(required_samples=1))
        is None
    )


async def test_the_context_names_each_hybrid_replica_and_its_node() -> None:
    driver, _ = await make(Chooser(lambda ctx: None))
    ctx = await driver.context(0)
    assert ctx.hybrid_replica_ids == ("h0", "h1", "h2", "h3")
    assert ctx.hybrid_replica_nodes == ("n0", "n0", "n1", "n1")
    driver.replicas.mark_dead("h1")  # the context follows the live membership
    ctx = await driver.context(0)
    assert ctx.hybrid_replica_ids == ("h0", "h2", "h3") and ctx.num_hybrid_replicas == 3
    assert ctx.hybrid_replica_nodes == ("n0", "n1", "n1")


async def test_one_replica_per_trainer_node_is_lent() -> None:
    policy = Chooser(lambda ctx: ctx.hybrid_ids_per_node(1), k=4)  # the names win over the count
    driver, seen = await make(policy)
    after = await driver.after_weight_sync(1, 1)
    assert after.activated
    assert driver.controller.active_hybrid_ids == ("h0", "h2")
    assert sorted(await driver.replicas.router.routable()) == ["h0", "h2", "s0"]
    assert not [e for e in seen if isinstance(e, GuardRailEvent)]
    ctx = await driver.context(1)
    assert ctx.num_active_hybrid_replicas == 2
    before = await driver.before_train_step(1)
    assert before.deactivated and await driver.replicas.router.routable() == ["s0"]


async def test_naming_every_live_replica_is_the_published_activation() -> None:
    driver, _ = await make(Chooser(lambda ctx: reversed(ctx.hybrid_replica_ids)))
    await driver.after_weight_sync(1, 1)
    assert driver.controller.active_hybrid_ids == ("h0", "h1", "h2", "h3")


@pytest.mark.parametrize(
    ("answer", "lent", "rule_reason"),
    [
        (["h3", "ghost"], ("h3",), "not live hybrid replicas: ['ghost']"),
        (["h2", "h2", "h0"], ("h0", "h2"), "duplicates"),
        ([], ("h0",), "nothing left, lending the first"),
        (["s0"], ("h0",), "not live hybrid replicas: ['s0']"),
    ],
)
async def test_a_wrong_choice_is_corrected_and_reported(
    answer: list[str], lent: tuple[str, ...], rule_reason: str
) -> None:
    driver, seen = await make(Chooser(lambda ctx: answer))
    await driver.after_weight_sync(1, 1)
    assert driver.controller.active_hybrid_ids == lent
    rails = [e for e in seen if isinstance(e, GuardRailEvent)]
    assert len(rails) == 1
    o = rails[0].override
    assert o.decision == "hybrid_replica_ids_to_activate" and o.rule == "live_hybrid_replicas"
    assert o.proposed == tuple(answer) and o.applied == lent
    assert rule_reason in o.reason
    assert driver.overrides == 1


async def test_a_dead_replica_named_is_not_lent() -> None:
    driver, _ = await make(Chooser(lambda ctx: ["h1", "h2"]))
    driver.replicas.mark_dead("h1")
    await driver.replicas.settle()
    await driver.after_weight_sync(1, 1)
    assert driver.controller.active_hybrid_ids == ("h2",)


@pytest.mark.parametrize("answer", ["h0", 3, [1], [None]])
async def test_an_answer_of_the_wrong_type_is_refused(answer: Any) -> None:
    driver, _ = await make(Chooser(lambda ctx: answer))
    with pytest.raises(TypeError, match="hybrid_replica_ids_to_activate must return"):
        await driver.after_weight_sync(1, 1)


@given(
    nodes=st.lists(st.sampled_from(["a", "b", "c", ""]), min_size=0, max_size=12),
    per_node=st.integers(1, 4),
)
def test_hybrid_ids_per_node_takes_at_most_k_per_node_in_order(
    nodes: list[str], per_node: int
) -> None:
    ids = tuple(f"h{i}" for i in range(len(nodes)))
    ctx = DynamicScheduleContext(
        required_samples=1, hybrid_replica_ids=ids, hybrid_replica_nodes=nodes
    )
    got = ctx.hybrid_ids_per_node(per_node)
    node_of = dict(zip(ids, nodes, strict=True))
    assert list(got) == [i for i in ids if i in got]  # context order kept
    for node in set(nodes):
        on = [i for i in ids if node_of[i] == node]
        assert [i for i in got if node_of[i] == node] == on[:per_node]  # the first k of each


@pytest.mark.parametrize("per_node", [0, -1, 1.5, True])
def test_hybrid_ids_per_node_refuses_a_bad_count(per_node: Any) -> None:
    ctx = DynamicScheduleContext(required_samples=1)
    with pytest.raises(ValueError, match="per_node must be an int >= 1"):
        ctx.hybrid_ids_per_node(per_node)


def test_the_context_refuses_nodes_that_do_not_match_the_ids() -> None:
    with pytest.raises(ValueError, match="hybrid_replica_nodes must name the node of each"):
        DynamicScheduleContext(required_samples=1, hybrid_replica_ids=("h0",))
    with pytest.raises(ValueError, match="hybrid_replica_ids must be distinct"):
        DynamicScheduleContext(
            required_samples=1, hybrid_replica_ids=("h0", "h0"), hybrid_replica_nodes=("", "")
        )
    with pytest.raises(TypeError, match="the string 'h0'"):
        DynamicScheduleContext(required_samples=1, hybrid_replica_ids="h0")
    with pytest.raises(TypeError, match="must hold strings"):
        DynamicScheduleContext(
            required_samples=1, hybrid_replica_ids=(1,), hybrid_replica_nodes=("",)
        )


async def test_the_readme_example_lends_one_replica_per_node() -> None:
    (block,) = [
        b for b in re.findall(r"```python\n(.*?)```", README, flags=re.S) if "OnePerNode" in b
    ]
    scope: dict[str, Any] = {}
    exec(compile(block, "README.md", "exec"), scope)
    driver, _ = await make(scope["OnePerNode"]())
    await driver.after_weight_sync(1, 1)
    assert driver.controller.active_hybrid_ids == ("h0", "h2")
