"""PAA against MXNet's default and round-robin on block lists derived from architectures."""

from __future__ import annotations

import pytest
from dynsched_optimus import (
    MODEL_ZOO,
    OptimusError,
    assign_mxnet_default,
    assign_paa,
    assign_parameters,
    assign_round_robin,
    model_blocks,
)

#: PS counts the comparison is asserted on (README: where PAA loses outside this range)
PS_COUNTS = (4, 6, 8, 10, 12, 16)


def test_resnet50_block_list() -> None:
    blocks = model_blocks("resnet50")
    assert len(blocks) == 157
    assert 25.0e6 < sum(b.size for b in blocks) < 26.0e6
    for ps in (1, 2, 4, 8, 10):
        a = assign_paa(blocks, ps)
        assert a.blocks_split == 0  # PAA splits none of the 157 blocks
        assert a.total_requests == 157  # the minimum for 157 blocks


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
@pytest.mark.parametrize("ps", PS_COUNTS)
def test_paa_no_worse_than_both_baselines(name: str, ps: int) -> None:
    blocks = model_blocks(name)
    paa = assign_paa(blocks, ps)
    for base in (assign_mxnet_default(blocks, ps), assign_round_robin(blocks, ps)):
        assert paa.max_load_difference <= base.max_load_difference
        assert paa.total_requests <= base.total_requests
        assert paa.max_requests <= base.max_requests
    total = sum(b.size for b in blocks)
    assert sum(paa.loads) == pytest.approx(total)


def test_rules_on_a_hand_made_list() -> None:
    # total 1000 on 2 PS: avg 500, tiny below 5 (blocks 4 and 3, 3.5 reserved per PS, so
    # the best-fit capacity is 496.5)
    a = assign_paa([700, 250, 43, 4, 3], 2)
    # large: 700 > avg is sliced into an avg-sized piece and the rest, least-loaded first
    # medium: 250 and 43 best-fit into PS 1 (PS 0 has no room left)
    # tiny: 4 and 3 go to the PS with the fewest update requests (PS 0: 1 request)
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
