"""The shared RL objective: GRPO advantages, clipped token-level ratios, masking."""

from __future__ import annotations

import math

import pytest
import torch
from dynsched_core.trainer import TrainBatch, TrainResponse
from dynsched_ray import RLObjective
from dynsched_ray.task.objective import (
    batch_advantages,
    group_advantages,
    pack_responses,
    policy_loss,
    token_logprobs,
)
from hypothesis import given
from hypothesis import strategies as st

# Hand-computed batch. Groups: "a" = {r0 (reward 1), r1 (reward 0)}, "b" = {r2 (reward 2)}.
# Advantages without std normalisation: r0 +0.5, r1 -0.5, r2 = 2 (a group of one: A = r).
# Ratios chosen per response token; eps_low = eps_high = 0.2.
#   r0: A=+0.5, ratios 1.5 (clipped: -0.5*1.2=-0.6), 1.1 (-0.55)
#   r1: A=-0.5, ratio 0.5 (clipped: +0.5*0.8=+0.4)
#   r2: A=+2,   ratios 0.9 (-1.8), 1.0 (-2.0), 1.3 (clipped: -2*1.2=-2.4)
# Token-mean over the 6 response tokens: (-0.6-0.55+0.4-1.8-2.0-2.4)/6 = -6.95/6.
RESPONSES = [
    TrainResponse(
        prompt_ids=(1, 2, 3), response_ids=(4, 5), logprobs=(-1.0, -2.0), reward=1.0, group_id="a"
    ),
    TrainResponse(prompt_ids=(1, 2), response_ids=(6,), logprobs=(-0.5,), reward=0.0, group_id="a"),
    TrainResponse(
        prompt_ids=(7,),
        response_ids=(8, 9, 10),
        logprobs=(-1.0, -1.0, -1.0),
        reward=2.0,
        group_id="b",
    ),
]
RATIOS = [(1.5, 1.1), (0.5,), (0.9, 1.0, 1.3)]


def _current_logprobs(packed_mask: torch.Tensor) -> torch.Tensor:
    """Rollout logprob + log(ratio) on response places, garbage (+5) elsewhere."""
    cur = torch.full(packed_mask.shape, 5.0)
    for row, (r, ratios) in enumerate(zip(RESPONSES, RATIOS, strict=True)):
        p = len(r.prompt_ids)
        for k, (lp, ratio) in enumerate(zip(r.logprobs, ratios, strict=True)):
            cur[row, p - 1 + k] = lp + math.log(ratio)
    return cur


def test_hand_computed_batch_advantages_clipping_and_masking() -> None:
    batch = TrainBatch(responses=RESPONSES)
    adv = batch_advantages(batch, RLObjective(normalize_by_std=False))
    assert adv == pytest.approx([0.5, -0.5, 2.0])
    adv_std = batch_advantages(batch, RLObjective())
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # unbiased std of {1, 0} is sqrt(0.5)
    assert adv_std == pytest.approx([a, -a, 2.0 / (1.0 + 1e-6)], rel=1e-9)

    packed = pack_responses(RESPONSES, adv, pad_id=0)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 2, 6, 0, 0], [7, 8, 9, 10, 0]]
    # the target of place t is token t+1: only response tokens are in the loss
    assert packed.loss_mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0], [1, 1, 1, 0]]
    cur = _current_logprobs(packed.loss_mask).requires_grad_(True)
    loss, stats = policy_loss(cur, packed.rollout_logprobs, packed.advantages, packed.loss_mask)
    assert loss.item() == pytest.approx(-6.95 / 6, abs=1e-6)
    assert stats.tokens == 6 and stats.clipped == 3
    assert stats.ratio_max == pytest.approx(1.5)
    loss.backward()
    assert cur.grad is not None
    # no gradient through prompt, padding, or clipped tokens
    g = cur.grad
    assert g[0, :2].abs().sum() == 0 and g[1, 2:].abs().sum() == 0 and g[2, 3] == 0
    assert g[0, 2] == 0 and g[1, 1] == 0 and g[2, 2] == 0  # clipped: ratio outside the range
    # unclipped tokens: d/dlogp (-A * ratio) / 6
    assert g[0, 3].item() == pytest.approx(-0.5 * 1.1 / 6, rel=1e-5)
    assert g[2, 0].item() == pytest.approx(-2.0 * 0.9 / 6, rel=1e-5)
    # gradient accumulation: two halves normalised by the whole batch add up to the whole
    half = [
        policy_loss(
            cur[i : i + 1],
            packed.rollout_logprobs[i : i + 1],
            packed.advantages[i : i + 1],
            packed.loss_mask[i : i + 1],
            normalizer=6.0,
        )[0]
        for i in range(3)
    ]
    assert sum(h.item() for h in half) == pytest.approx(loss.item(), abs=1e-6)


def test_group_advantages_edge_cases() -> None:
    r = torch.tensor([3.0, 3.0, 1.0])
    adv = group_advantages(r, ["x", "x", "y"])
    # no spread: 0; alone: mean 0 and std 1 (verl's rule), so A = r / (1 + eps)
    assert adv.tolist() == [0.0, 0.0, pytest.approx(1.0 / (1.0 + 1e-6), rel=1e-7)]
    assert group_advantages(r, ["x", "x", "y"], normalize_by_std=False).tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="one value per group id"):
        group_advantages(r, ["x"])
    with pytest.raises(ValueError, match="clip_ratio_low"):
        RLObjective(clip_ratio_low=1.5)


@given(
    st.lists(st.integers(0, 3), min_size=2, max_size=12),
    st.randoms(use_true_random=False),
)
def test_group_advantages_are_centred_per_group(groups: list[int], rnd: object) -> None:
    rewards = torch.tensor([rnd.uniform(-3, 3) for _ in groups], dtype=torch.float64)  # type: ignore[attr-defined]
    adv = group_advantages(rewards, groups)
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        if len(idx) > 1:
            assert abs(float(adv[idx].sum())) < 1e-9
            spread = float(rewards[idx].std())
            if spread > 1e-3:
                assert float(adv[idx].std()) == pytest.approx(spread / (spread + 1e-6), rel=1e-6)


@given(
    st.integers(1, 4),
    st.integers(1, 6),
    st.integers(0, 2**31 - 1),
    st.floats(0.05, 0.5),
)
def test_on_policy_loss_equals_plain_policy_gradient(
    b: int, t: int, seed: int, clip: float
) -> None:
    """Rollout logprobs == current logprobs: the loss is the policy-gradient loss."""
    gen = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(b, t, generator=gen, dtype=torch.float64) * 5).requires_grad_(True)
    adv = torch.randn(b, t, generator=gen, dtype=torch.float64)
    mask = (torch.rand(b, t, generator=gen) > 0.3).to(torch.float64)
    mask[0, 0] = 1.0
    loss, stats = policy_loss(
        logp, logp.detach().clone(), adv, mask, clip_ratio_low=clip, clip_ratio_high=clip
    )
    (grad,) = torch.autograd.grad(loss, logp)
    pg_logp = logp.detach().clone().requires_grad_(True)
    pg = -(adv * pg_logp * mask).sum() / mask.sum()  # REINFORCE surrogate
    (pg_grad,) = torch.autograd.grad(pg, pg_logp)
    assert loss.item() == pytest.approx(float(-(adv * mask).sum() / mask.sum()), abs=1e-12)
    assert torch.allclose(grad, pg_grad, atol=1e-12, rtol=0)
    assert stats.clipped == 0 and stats.kl_sum == 0 and stats.ratio_max == 1.0


def test_token_logprobs_aligns_targets() -> None:
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = 10.0  # place 0 predicts token 2
    logits[0, 1, 1] = 10.0
    ids = torch.tensor([[0, 2, 3]])
    lp = token_logprobs(logits, ids)
    assert lp.shape == (1, 2)
    assert lp[0, 0].item() > -1e-3 and lp[0, 1].item() < -9.0
