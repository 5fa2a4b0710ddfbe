"""The helpers several core modules share: replica identity, override wording, tuple checks."""

from __future__ import annotations

import attrs
import pytest
from dynsched_core import ReplicaCapabilities
from dynsched_core import validators as v
from dynsched_core._guards import guard_override
from dynsched_core._loading import LoadLimits, check_tree
from dynsched_core.errors import ConfigError
from dynsched_core.rollout import ReplicaIdentity
from dynsched_core.testing import InMemoryReplica
from hypothesis import given
from hypothesis import strategies as st


class _Named(ReplicaIdentity):
    def __init__(self, replica_id: str, caps: ReplicaCapabilities) -> None:
        self._id = replica_id
        self._caps = caps


@given(
    replica_id=st.text(min_size=1, max_size=8),
    role=st.sampled_from(["standalone", "hybrid"]),
    gpus=st.integers(0, 8),
)
def test_replica_identity_reads_the_id_and_capabilities(
    replica_id: str, role: str, gpus: int
) -> None:
    caps = ReplicaCapabilities(role=role, num_gpus=gpus)  # type: ignore[arg-type]
    replica = _Named(replica_id, caps)
    assert (replica.replica_id, replica.capabilities, replica.role) == (replica_id, caps, role)


def test_in_memory_replica_takes_its_identity_from_the_base() -> None:
    replica = InMemoryReplica("h0", role="hybrid", num_gpus=2, node="n1")
    assert isinstance(replica, ReplicaIdentity)
    assert replica.replica_id == "h0" and replica.role == "hybrid"
    assert replica.capabilities == ReplicaCapabilities(role="hybrid", num_gpus=2, node="n1")
    with pytest.raises(AttributeError):
        replica.replica_id = "x"  # type: ignore[misc]


@given(proposed=st.integers(0, 10**6), applied=st.integers(0, 10**6), why=st.text(max_size=20))
def test_wait_override_reads_as_before(proposed: int, applied: int, why: str) -> None:
    o = guard_override("deactivate_wait_samples", "ratio_range", proposed, applied, why)
    assert (o.decision, o.rule, o.proposed, o.applied) == (
        "deactivate_wait_samples",
        "ratio_range",
        proposed,
        applied,
    )
    assert o.reason == f"deactivate_wait_samples {proposed} {why}: waiting for {applied}"


@given(proposed=st.booleans(), applied=st.booleans(), why=st.text(max_size=20))
def test_activation_override_reads_as_before(proposed: bool, applied: bool, why: str) -> None:
    o = guard_override("should_activate_after_step", "colocated", proposed, applied, why)
    assert o.reason == f"should_activate_after_step {proposed} overridden ({why}): {applied}"


@given(
    proposed=st.lists(st.text(max_size=3), max_size=3).map(tuple),
    applied=st.lists(st.text(max_size=3), max_size=3).map(tuple),
)
def test_lending_override_shows_lists(proposed: tuple[str, ...], applied: tuple[str, ...]) -> None:
    o = guard_override(
        "hybrid_replica_ids_to_activate", "live_hybrid_replicas", proposed, applied, "dup"
    )
    assert o.proposed == proposed and o.applied == applied
    assert o.reason == (
        f"hybrid_replica_ids_to_activate {list(proposed)} corrected (dup): lending {list(applied)}"
    )


@attrs.frozen
class _Tuples:
    floats: tuple[float, ...] = attrs.field(validator=v.tuple_of_floats_ge(0.5))
    ints: tuple[int, ...] = attrs.field(validator=v.tuple_of_ints_ge(2))


@given(st.lists(st.floats(allow_nan=True), max_size=4), st.lists(st.integers(-3, 5), max_size=4))
def test_tuple_validators_accept_exactly_the_valid_elements(
    floats: list[float], ints: list[int]
) -> None:
    bad_float = next(
        (i for i, x in enumerate(floats) if not (x >= 0.5 and x != float("inf"))), None
    )
    bad_int = next((i for i, x in enumerate(ints) if x < 2), None)
    if bad_float is not None:
        with pytest.raises(
            ValueError, match=rf"floats\[{bad_float}\] must be a finite number >= 0.5"
        ):
            _Tuples(tuple(floats), (2,))
    if bad_int is not None:
        with pytest.raises(ValueError, match=rf"ints\[{bad_int}\] must be an int >= 2"):
            _Tuples((1.0,), tuple(ints))
    if bad_float is None and bad_int is None:
        _Tuples(tuple(floats), tuple(ints))


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"floats": [1.0], "ints": (2,)}, "floats must be a tuple of numbers, got list"),
        ({"floats": (1.0,), "ints": [2]}, "ints must be a tuple of ints, got list"),
        ({"floats": (1.0,), "ints": (True,)}, r"ints\[0\] must be an int >= 2, got True"),
        ({"floats": ("1",), "ints": (2,)}, r"floats\[0\] must be a finite number >= 0.5"),
    ],
)
def test_tuple_validators_name_the_field(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises((TypeError, ValueError), match=needle):
        _Tuples(**kwargs)  # type: ignore[arg-type]


def test_check_tree_counts_a_shared_part_each_time_it_is_used() -> None:
    shared = [1, 2, 3]
    check_tree({"a": shared, "b": shared}, limits=LoadLimits(max_nodes=17))  # 1 + 2 * (1 + 7)
    with pytest.raises(ConfigError, match="at b;"):
        check_tree({"a": shared, "b": shared}, limits=LoadLimits(max_nodes=16))
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ConfigError, match=r"^\[0\] contains itself"):
        check_tree(loop)


class _Opts:
    pass


def test_expect_instance_names_the_argument_and_what_came() -> None:
    opts = _Opts()
    assert v.expect_instance("options", opts, _Opts) is opts
    with pytest.raises(TypeError, match=r"^options must be a _Opts, got 3$"):
        v.expect_instance("options", 3, _Opts)
    with pytest.raises(TypeError, match=r"^replicas must be a _Opts, got list$"):
        v.expect_instance("replicas", [1], _Opts, by_type=True)
    assert isinstance(v.options_or_default(None, _Opts), _Opts)
    assert v.options_or_default(opts, _Opts) is opts
    with pytest.raises(TypeError, match=r"^options must be a _Opts, got 'x'$"):
        v.options_or_default("x", _Opts)  # type: ignore[arg-type]


def test_runtime_classes_refuse_wrong_arguments_by_name() -> None:
    from dynsched_core import DynamicResourceController, ReplicaSet

    with pytest.raises(TypeError, match=r"^replicas must be a ReplicaSet, got dict$"):
        DynamicResourceController({})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^options must be a ControllerOptions, got 1$"):
        DynamicResourceController(ReplicaSet(), 1)  # type: ignore[arg-type]


@given(
    message=st.sampled_from(["must be even, got 3", "[2] must be >= 0, got -1"]),
    wrong_type=st.booleans(),
)
def test_field_error_names_the_class_and_field(message: str, wrong_type: bool) -> None:
    def check(inst: object, attr: attrs.Attribute[object], value: object) -> None:
        raise v.field_error(inst, attr, message, wrong_type=wrong_type)

    @attrs.frozen
    class Pair:
        size: int = attrs.field(validator=check)

    with pytest.raises(ConfigError) as info:
        Pair(3)
    sep = "" if message.startswith("[") else " "
    assert str(info.value) == f"Pair.size{sep}{message}"
    assert info.value.key == "size"
    assert isinstance(info.value, TypeError) is wrong_type


def test_trainer_validators_keep_the_field_format() -> None:
    from dynsched_core.trainer import TrainResponse

    with pytest.raises(ConfigError, match=r"^TrainResponse\.reward must be a finite number"):
        TrainResponse(prompt_ids=[1], response_ids=[], logprobs=[], reward=float("nan"), group_id=0)
    with pytest.raises(ConfigError, match=r"^TrainResponse\.logprobs\[1\] must be a finite log-"):
        TrainResponse(
            prompt_ids=[1], response_ids=[2, 3], logprobs=[-1.0, 0.5], reward=0, group_id=0
        )
    with pytest.raises(ConfigError, match=r"^TrainResponse\.group_id must be an int or a str"):
        TrainResponse(prompt_ids=[1], response_ids=[], logprobs=[], reward=0, group_id=1.5)


def test_validators_examples_run() -> None:
    import doctest

    assert doctest.testmod(v).failed == 0


def _followers(replicas: object) -> list[object]:
    from dynsched_core import (
        AsyncSampleQueue,
        DynamicResourceController,
        RetryingClient,
        Rollouter,
        RollouterOptions,
    )

    client = RetryingClient(replicas)  # type: ignore[arg-type]
    return [
        client,
        DynamicResourceController(replicas),  # type: ignore[arg-type]
        Rollouter([], client, replicas, AsyncSampleQueue(), RollouterOptions(required_samples=1)),  # type: ignore[arg-type]
    ]


def test_the_parts_that_follow_a_replica_set_share_one_base() -> None:
    from dynsched_core import ReplicaSet
    from dynsched_core._replicas import MembershipFollower

    replicas = ReplicaSet()
    parts = _followers(replicas)
    assert all(isinstance(p, MembershipFollower) for p in parts)
    assert all(p.replicas is replicas for p in parts)  # type: ignore[attr-defined]
    assert len(replicas._listeners) == len(parts)  # each subscribed once
    for wrong in ({}, None):
        with pytest.raises(TypeError, match=r"^replicas must be a ReplicaSet, got "):
            _followers(wrong)


async def test_followers_hear_routable_changes_once_built() -> None:
    from dynsched_core import ReplicaSet
    from dynsched_core.testing import InMemoryReplica

    replicas = ReplicaSet(standalone=[InMemoryReplica("s0", tokens_per_s=1e5)])
    client, _controller, rollouter = _followers(replicas)
    await replicas.route(["s0"])
    assert client._routable_version == 1  # type: ignore[attr-defined]
    assert rollouter.capacity > 0  # type: ignore[attr-defined]
    await replicas.unroute(["s0"])
    assert client._routable_version == 2  # type: ignore[attr-defined]
    assert rollouter.capacity == 0  # type: ignore[attr-defined]
