"""PAA against MXNet's default and round-robin on block lists derived from architectures."""

from __future__ import annotations

import pytest
from dynsched_optimus import (
    MODEL_ZOO,
    PARAMETER_ASSIGNMENTS,
    OptimusError,
    ParameterAssignment,
    assign_mxnet_default,
    assign_paa,
    assign_parameters,
    assign_round_robin,
    model_blocks,
)
from dynsched_optimus._paa import assign_paa_rules
from hypothesis import given
from hypothesis import strategies as st

#: every PS count the zoo comparison is asserted on
PS_COUNTS = range(1, 33)


def _check_no_worse(paa: ParameterAssignment, sizes: list[float]) -> None:
    """PAA no worse than both baselines on load difference and update requests."""
    k = paa.num_ps
    total = sum(sizes)
    bases = (assign_mxnet_default(sizes, k), assign_round_robin(sizes, k))
    eps = 1e-9 * total  # float tolerance only
    assert paa.max_load_difference <= min(b.max_load_difference for b in bases) + eps
    assert paa.total_requests <= min(b.total_requests for b in bases)
    assert paa.max_requests <= min(b.max_requests for b in bases)
    # a valid layout: every block fully placed, positive pieces, one piece per (block, PS)
    assert sum(paa.loads) == pytest.approx(total, rel=1e-12)
    placed = [0.0] * len(sizes)
    for b, p, s in paa.pieces:
        assert s > 0 and 0 <= p < k
        placed[b] += s
    assert placed == pytest.approx(sizes, rel=1e-9)
    assert len({(b, p) for b, p, _s in paa.pieces}) == len(paa.pieces)


def test_resnet50_block_list() -> None:
    blocks = model_blocks("resnet50")
    assert len(blocks) == 157
    assert 25.0e6 < sum(b.size for b in blocks) < 26.0e6
    for ps in range(1, 11):
        for a in (assign_paa(blocks, ps), assign_paa(blocks, ps, refine=False)):
            assert a.blocks_split == 0  # PAA splits none of the 157 blocks up to 10 PS
            assert a.total_requests == 157  # the minimum for 157 blocks
    # from 11 PS on the largest blocks (2.0 M classifier, 2.4 M 3x3 convolutions) exceed avg
    assert assign_paa(blocks, 11).blocks_split > 0


def test_other_architectures() -> None:
    sizes = {name: sum(b.size for b in model_blocks(name)) for name in MODEL_ZOO}
    assert 138.0e6 < sizes["vgg16"] < 138.5e6
    assert 105e6 < sizes["bert_base"] < 115e6
    assert 10e6 < sizes["inception_bn"] < 14e6
    assert len(model_blocks("vgg16")) == 32
    assert len(model_blocks("bert_base")) == 199
    with pytest.raises(OptimusError, match="known models"):
        model_blocks("alexnet")


@pytest.mark.parametrize("name", sorted(MODEL_ZOO))
def test_paa_no_worse_than_both_baselines_on_the_zoo(name: str) -> None:
    blocks = model_blocks(name)
    sizes = [float(b.size) for b in blocks]
    for ps in PS_COUNTS:
        paa = assign_paa(blocks, ps)
        _check_no_worse(paa, sizes)
        rules = assign_paa(blocks, ps, refine=False)
        # the refinement never loses against the paper's rules on balance; it adds pieces
        # only where the rules lose against a baseline (VGG-16 at 2, 3 and 23+ PS, ...)
        assert paa.max_load_difference <= rules.max_load_difference + 1e-9 * sum(sizes)
        rr = assign_round_robin(blocks, ps)
        mx = assign_mxnet_default(blocks, ps)
        if rules.max_load_difference <= min(rr.max_load_difference, mx.max_load_difference):
            assert paa.max_requests <= rules.max_requests
            assert paa.total_requests <= rules.total_requests
            assert paa.blocks_split <= rules.blocks_split


def test_the_paper_rules_alone_lose_where_the_refinement_wins() -> None:
    # VGG-16 on 2 PS: the rules leave 3.5 M of difference, both baselines do better
    blocks = model_blocks("vgg16")
    rules = assign_paa(blocks, 2, refine=False)
    refined = assign_paa(blocks, 2)
    rr = assign_round_robin(blocks, 2)
    assert rules.max_load_difference > rr.max_load_difference > refined.max_load_difference
    assert refined.total_requests == rules.total_requests == 33
    # BERT-base on 11 PS: 0.60 M for the rules against 0.59 M for round-robin
    blocks = model_blocks("bert_base")
    assert (
        assign_paa(blocks, 11, refine=False).max_load_difference
        > assign_round_robin(blocks, 11).max_load_difference
        >= assign_paa(blocks, 11).max_load_difference
    )


_SIZE = st.one_of(
    st.integers(1, 100),  # tiny
    st.integers(100, 999_999),  # below the baselines' slicing threshold
    st.integers(1_000_000, 400_000_000),  # huge
)


@given(sizes=st.lists(_SIZE, min_size=1, max_size=50), num_ps=st.integers(1, 40))
def test_paa_no_worse_than_both_baselines_on_random_lists(sizes: list[int], num_ps: int) -> None:
    paa = assign_paa(sizes, num_ps)
    _check_no_worse(paa, [float(s) for s in sizes])
    assert assign_paa(sizes, num_ps) == paa  # deterministic


@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=30), num_ps=st.integers(1, 8))
def test_whole_blocks_only_when_no_block_is_big(sizes: list[int], num_ps: int) -> None:
    # no block reaches 10^6: the baselines need one request per block, so must PAA
    paa = assign_paa(sizes, num_ps)
    assert paa.total_requests == len(sizes) and paa.blocks_split == 0
    _check_no_worse(paa, [float(s) for s in sizes])


def test_rules_on_a_hand_made_list() -> None:
    # total 1000 on 2 PS: avg 500, tiny below 5 (blocks 4 and 3, 3.5 reserved per PS, so
    # the best-fit capacity is 496.5)
    a = assign_paa([700, 250, 43, 4, 3], 2, refine=False)
    # large: 700 > avg is sliced into an avg-sized piece and the rest, least-loaded first
    # medium: 250 and 43 best-fit into PS 1 (PS 0 has no room left)
    # tiny: 4 and 3 go to the PS with the fewest update requests (PS 0: 1 request)
    assert a.method == "paa_rules"
    assert a.pieces == (
        (0, 0, 500.0),
        (0, 1, 200.0),
        (1, 1, 250.0),
        (2, 1, 43.0),
        (3, 0, 4.0),
        (4, 0, 3.0),
    )
    assert a.loads == (507.0, 493.0)
    assert a.requests == (3, 3)
    assert a.max_load_difference == 14.0
    assert a.blocks_split == 1
    assert assign_paa_rules([700, 250, 43, 4, 3], 2) == a
    # refined: the baselines need 5 requests (no block reaches 10^6), so the split of the
    # 700 block is merged back and the rest is balanced with whole blocks only
    r = assign_paa([700, 250, 43, 4, 3], 2)
    assert r.method == "paa"
    assert r.total_requests == 5 and r.blocks_split == 0
    assert r.max_load_difference == 406.0  # 703 vs 297: the best whole-block split
    assert assign_round_robin([700, 250, 43, 4, 3], 2).max_load_difference == 492.0


def test_refinement_splits_to_balance_when_the_budget_allows() -> None:
    # three 3 M blocks on 2 PS: the rules keep them whole (6 M vs 3 M); the baselines slice
    # all three (6 requests, equal loads); refined PAA splits one block (4 requests)
    sizes = [3e6, 3e6, 3e6]
    rules = assign_paa(sizes, 2, refine=False)
    assert rules.max_load_difference == 3e6 and rules.total_requests == 3
    paa = assign_paa(sizes, 2)
    assert paa.loads == (4.5e6, 4.5e6)
    assert paa.total_requests == 4 and paa.blocks_split == 1
    _check_no_worse(paa, sizes)
    assert assign_round_robin(sizes, 2).total_requests == 6


def test_cycle_cancelling_keeps_loads_and_drops_pieces() -> None:
    # on 3 PS the rules slice the 5 M block; whatever the start, the refined layout is a
    # forest of blocks and PS: at most #blocks + #PS - 1 pieces
    sizes = [5e6, 2e6, 2e6, 2e6, 1.5e6, 0.5e6]
    for ps in range(1, 7):
        paa = assign_paa(sizes, ps)
        assert paa.total_requests <= len(sizes) + ps - 1
        _check_no_worse(paa, sizes)


def test_refine_flag_and_registry() -> None:
    blocks = model_blocks("inception_bn")
    assert assign_paa(blocks, 2, refine=False) == PARAMETER_ASSIGNMENTS["paa_rules"](blocks, 2)
    assert assign_parameters(blocks, 2, "paa") == assign_paa(blocks, 2)
    assert assign_paa(blocks, 2, refine=False).max_load_difference > 0.5e6
    assert assign_paa(blocks, 2).max_load_difference < 100.0  # 24 parameters


def test_baselines_behave_as_documented() -> None:
    sizes = [2e6, 1e6, 10.0, 20.0, 30.0]
    mx = assign_mxnet_default(sizes, 4, seed=1)
    rr = assign_round_robin(sizes, 4)
    for a in (mx, rr):
        assert a.blocks_split == 2  # both big blocks sliced evenly over all PS
        assert a.total_requests == 2 * 4 + 3
    assert [p for b, p, _s in rr.pieces if b >= 2] == [0, 1, 2]
    assert assign_parameters(sizes, 4, "round_robin") == rr


def test_bad_input() -> None:
    with pytest.raises(OptimusError, match="num_ps"):
        assign_paa([1, 2], 0)
    with pytest.raises(OptimusError, match="block 1"):
        assign_paa([1, -2], 2)
    with pytest.raises(OptimusError, match="empty"):
        assign_round_robin([], 2)
    with pytest.raises(OptimusError, match="method must be one of"):
        assign_parameters([1], 1, "hash")
    with pytest.raises(OptimusError, match="tiny_fraction"):
        assign_paa([1, 2], 2, tiny_fraction=1.5)
