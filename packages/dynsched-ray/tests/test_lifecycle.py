"""`ReplicaLifecycle` against the two flags (asleep, accepting) the replicas kept before."""

from __future__ import annotations

import pytest
from dynsched_core.errors import ReplicaDeadError, ReplicaNotReadyError
from dynsched_ray.engines.lifecycle import TRANSITIONS, Phase, ReplicaLifecycle, mark_aborted
from hypothesis import given
from hypothesis import strategies as st

EVENTS = sorted(TRANSITIONS)


class _Flags:
    """The replicas' former bookkeeping: independent flags, moved by hand in each call."""

    def __init__(self, asleep: bool) -> None:
        self.asleep, self.accepting, self.closed = asleep, not asleep, False

    def apply(self, event: str) -> str | None:
        """The refusal's kind, or None when the call went through."""
        if self.closed:
            return None if event == "shutdown" else "dead"
        if event == "pause":
            self.accepting = False
        elif event == "resume":
            if self.asleep:
                return "not ready"
            self.accepting = True
        elif event == "sleep":
            self.accepting, self.asleep = False, True
        elif event == "wake_up":
            self.asleep = False
        else:
            self.closed = True
        return None

    @property
    def phase(self) -> Phase:
        if self.closed:
            return Phase.CLOSED
        if self.asleep:
            return Phase.ASLEEP
        return Phase.ACCEPTING if self.accepting else Phase.PAUSED


@given(st.booleans(), st.lists(st.sampled_from(EVENTS), max_size=30))
def test_the_state_machine_moves_as_the_flags_did(asleep: bool, events: list[str]) -> None:
    life, flags = ReplicaLifecycle("r", asleep=asleep), _Flags(asleep)
    for event in events:
        refused = flags.apply(event)
        if refused == "dead":
            with pytest.raises(ReplicaDeadError, match="was shut down"):
                life.apply(event)
        elif refused == "not ready":
            with pytest.raises(ReplicaNotReadyError, match=r"is asleep: resume refused \(wake_up"):
                life.apply(event)
        else:
            life.apply(event)
        assert life.phase is flags.phase
        assert (life.asleep, life.accepting, life.closed) == (
            flags.phase is Phase.ASLEEP,
            flags.phase is Phase.ACCEPTING,
            flags.phase is Phase.CLOSED,
        )


def test_refusals_name_the_replica_the_call_and_what_comes_first() -> None:
    life = ReplicaLifecycle("h0", asleep=True)
    with pytest.raises(
        ReplicaNotReadyError,
        match=r"'h0' is asleep: generate\('q'\) refused \(wake_up and resume first\)",
    ):
        life.require_serving("generate('q')")
    with pytest.raises(
        ReplicaNotReadyError, match=r"is asleep: update_weights\(2\) refused \(wake_up first\)"
    ):
        life.require_awake("update_weights(2)")
    life.apply("wake_up")
    life.require_awake("update_weights(2)")
    with pytest.raises(
        ReplicaNotReadyError, match=r"is paused: generate\('q'\) refused \(resume first\)"
    ):
        life.require_serving("generate('q')")
    life.apply("resume")
    life.require_serving("generate('q')")
    life.apply("shutdown")
    with pytest.raises(ReplicaDeadError, match=r"'h0' was shut down \(generate\('q'\) refused\)"):
        life.require_serving("generate('q')")
    assert repr(life) == "ReplicaLifecycle('h0', closed)"
    with pytest.raises(KeyError):
        life.apply("explode")


def test_the_engines_share_the_one_state_machine_of_core() -> None:
    from dynsched_core import _lifecycle as core
    from dynsched_core.testing import InMemoryReplica

    assert ReplicaLifecycle is core.ReplicaLifecycle and Phase is core.ReplicaPhase
    assert TRANSITIONS is core.TRANSITIONS
    assert isinstance(InMemoryReplica("r")._life, ReplicaLifecycle)


@given(st.booleans(), st.lists(st.sampled_from(EVENTS), max_size=20))
def test_require_and_allows_answer_as_apply_would(asleep: bool, events: list[str]) -> None:
    life = ReplicaLifecycle("r", asleep=asleep)
    for event in events:
        before = life.phase
        if life.allows(event):
            life.require(event)
            assert life.phase is before  # asking does not move
            life.apply(event)
        else:
            with pytest.raises((ReplicaNotReadyError, ReplicaDeadError)) as asked:
                life.require(event)
            with pytest.raises(type(asked.value)) as applied:
                life.apply(event)
            assert str(asked.value) == str(applied.value)
            assert life.phase is before


@pytest.mark.parametrize(
    ("replica_id", "role", "match"),
    [
        ("", "standalone", "replica_id must be a non-empty string, got ''"),
        (3, "hybrid", "replica_id must be a non-empty string, got 3"),
        ("r", "both", r"role must be one of \['standalone', 'hybrid'\], got 'both'"),
    ],
)
def test_a_bad_identity_is_named(replica_id: object, role: object, match: str) -> None:
    from dynsched_core._lifecycle import check_replica_identity

    with pytest.raises(ValueError, match=match):
        check_replica_identity(replica_id, role)
    check_replica_identity("r", "hybrid")


_IDS = st.sampled_from(["a", "b", "c", "d"])


@given(
    st.dictionaries(_IDS, st.booleans()),
    st.none() | st.lists(_IDS, max_size=6),
)
def test_mark_aborted_flags_exactly_the_tracked_targets(
    flags: dict[str, bool], request_ids: list[str] | None
) -> None:
    before = dict(flags)
    targets = list(before) if request_ids is None else [r for r in request_ids if r in before]
    assert mark_aborted(flags, request_ids) == len(targets)
    assert set(flags) == set(before)  # an untracked id is never added
    for rid, flag in flags.items():
        assert flag is (True if rid in targets else before[rid])
