"""The RL objective both trainers share: GRPO advantages and a clipped, token-level,
off-policy-corrected policy-gradient loss.

For a batch of responses ``i`` (each with reward ``r_i``, in the group ``g(i)`` of its
prompt) and response tokens ``t``:

- **Group-normalised advantage** (GRPO): ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)``
  with the unbiased standard deviation over the group's responses (``normalize_by_std``;
  without it ``A_i = r_i - mean_g(r)``). A group of one response has no spread: it is
  taken with mean 0 and std 1, as verl does (``A_i = r_i / (1 + eps)``). Every token of a response carries ``A_i``.
- **Importance ratio** against the rollout's own log-probabilities:
  ``rho_t = exp(log pi_theta(y_t) - log pi_rollout(y_t))``, where ``pi_rollout`` is the
  weight version that generated the token (fully-async staleness up to
  ``staleness_threshold``), so stale tokens are re-weighted, not ignored. The log-ratio is
  clamped to ``[-20, 20]`` before the exponential (numerical guard, as verl).
- **PPO clipping**: ``l_t = max(-A rho_t, -A clip(rho_t, 1 - eps_low, 1 + eps_high))``.
- **Masking and aggregation** (token-mean): prompt tokens and padding carry no loss;
  ``L = sum_t m_t l_t / sum_t m_t`` over every response token of the whole batch. With
  gradient accumulation over mini-batches, each mini-batch adds ``sum m l / N_batch``, so
  the accumulated gradient is the whole batch's.

Defaults: ``clip_ratio_low = clip_ratio_high = 0.2`` (verl's ``clip_ratio``),
``eps = 1e-6``, ``normalize_by_std = True``.

With ``pi_theta == pi_rollout`` (on-policy) ``rho = 1``: the loss value is ``-mean(A)`` and
its gradient is the plain policy-gradient (REINFORCE) gradient
``-mean_t(A grad log pi_theta(y_t))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch
from dynsched_core.trainer import TrainBatch, TrainResponse

__all__ = [
    "PackedBatch",
    "PolicyLossStats",
    "RLObjective",
    "group_advantages",
    "pack_responses",
    "policy_loss",
    "token_logprobs",
]

LOG_RATIO_CLAMP = 20.0


def _clip(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ValueError(f"RLObjective.{attr.name} must be a number in [0, 1), got {value!r}")


def _pos(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"RLObjective.{attr.name} must be a number > 0, got {value!r}")


@attrs.frozen(kw_only=True)
class RLObjective:
    """Settings of the shared RL loss (see the module docstring for the formula).

    Attributes:
        clip_ratio_low: ``eps_low``: the ratio is clipped below at ``1 - eps_low``.
        clip_ratio_high: ``eps_high``: the ratio is clipped above at ``1 + eps_high``.
        normalize_by_std: Divide by the group's standard deviation (GRPO); off gives
            ``r - mean`` (Dr. GRPO).
        eps: Added to the standard deviation.
    """

    clip_ratio_low: float = attrs.field(default=0.2, validator=_clip)
    clip_ratio_high: float = attrs.field(default=0.2, validator=_clip)
    normalize_by_std: bool = True
    eps: float = attrs.field(default=1e-6, validator=_pos)


def group_advantages(
    rewards: torch.Tensor,
    groups: Sequence[Any],
    *,
    normalize_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Per-response GRPO advantages.

    Args:
        rewards: ``[N]`` rewards.
        groups: ``N`` group ids (hashable); responses with the same id form a group.
        normalize_by_std: Divide by the group's unbiased standard deviation.
        eps: Added to the standard deviation.

    Returns:
        ``[N]`` advantages (float64 math, returned in ``rewards``' dtype).
    """
    if rewards.dim() != 1 or rewards.numel() != len(groups):
        raise ValueError(
            f"rewards must be a 1-D tensor with one value per group id, got shape "
            f"{tuple(rewards.shape)} for {len(groups)} group ids"
        )
    r = rewards.detach().to(torch.float64)
    out = torch.empty_like(r)
    members: dict[Any, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    for idx in members.values():
        sel = torch.tensor(idx, dtype=torch.long)
        vals = r[sel]
        if len(idx) == 1:
            mean, std = torch.zeros((), dtype=r.dtype), torch.ones((), dtype=r.dtype)
        else:
            mean, std = vals.mean(), vals.std(unbiased=True)
        adv = vals - mean
        if normalize_by_std:
            adv = adv / (std + eps)
        out[sel] = adv
    return out.to(rewards.dtype)


@attrs.frozen
class PolicyLossStats:
    """Sums over the masked tokens of one loss call (sums, so mini-batches add up).

    Attributes:
        tokens: Masked (response) tokens.
        loss_sum: ``sum m l`` (unnormalised).
        clipped: Tokens where the clipped branch was taken.
        ratio_sum: Sum of the importance ratios.
        ratio_max: Largest ratio (0 without tokens).
        kl_sum: Sum of ``rollout logprob - current logprob``.
    """

    tokens: float
    loss_sum: float
    clipped: float
    ratio_sum: float
    ratio_max: float
    kl_sum: float

    def __add__(self, other: PolicyLossStats) -> PolicyLossStats:
        return PolicyLossStats(
            self.tokens + other.tokens,
            self.loss_sum + other.loss_sum,
            self.clipped + other.clipped,
            self.ratio_sum + other.ratio_sum,
            max(self.ratio_max, other.ratio_max),
            self.kl_sum + other.kl_sum,
        )


def policy_loss(
    logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """Clipped token-level policy loss with importance ratios against the rollout.

    Args:
        logprobs: ``[B, T]`` current log-probabilities of the taken tokens (with grad).
        rollout_logprobs: ``[B, T]`` the rollout engine's log-probabilities.
        advantages: ``[B, T]`` (or ``[B, 1]``) advantages.
        mask: ``[B, T]``; 1 on response tokens, 0 on prompt and padding.
        clip_ratio_low: ``eps_low``.
        clip_ratio_high: ``eps_high``.
        normalizer: Divide the masked sum by this (default: ``mask.sum()``); gradient
            accumulation passes the whole batch's token count.

    Returns:
        ``(loss, stats)``: the scalar loss and sums for metrics.
    """
    mask = mask.to(logprobs.dtype)
    log_ratio = torch.clamp(logprobs - rollout_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    per_token = torch.maximum(unclipped, clipped)
    loss_sum = (per_token * mask).sum()
    denom = float(normalizer) if normalizer is not None else float(mask.sum().item())
    loss = loss_sum / max(denom, 1.0)
    with torch.no_grad():
        on = mask > 0
        tokens = float(mask.sum().item())
        stats = PolicyLossStats(
            tokens=tokens,
            loss_sum=float(loss_sum.item()),
            clipped=float(((clipped > unclipped) & on).sum().item()),
            ratio_sum=float((ratio * mask).sum().item()),
            ratio_max=float(ratio[on].max().item()) if tokens else 0.0,
            kl_sum=float(((rollout_logprobs - logprobs) * mask).sum().item()),
        )
    return loss, stats


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``[B, L-1]`` log-probability of each next token: ``log softmax(logits[:, t])[ids[:, t+1]]``."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


@attrs.frozen
class PackedBatch:
    """Responses as right-padded tensors, aligned with next-token targets.

    Attributes:
        input_ids: ``[B, L]`` prompt + response + padding.
        loss_mask: ``[B, L-1]``; 1 where the target ``input_ids[:, t+1]`` is a response
            token.
        rollout_logprobs: ``[B, L-1]`` rollout log-probabilities at the masked places.
        advantages: ``[B, L-1]`` the response's advantage at the masked places.
    """

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor

    def to(self, device: torch.device | str) -> PackedBatch:
        """The same tensors on ``device``."""
        return PackedBatch(*(t.to(device) for t in attrs.astuple(self, recurse=False)))


def pack_responses(
    responses: Sequence[TrainResponse], advantages: Sequence[float], *, pad_id: int
) -> PackedBatch:
    """Right-pad ``prompt + response`` per row; build mask, rollout logprobs, advantages.

    Right padding keeps every real token's causal context free of padding, so no padding
    mask is needed beyond the loss mask.
    """
    if len(responses) != len(advantages):
        raise ValueError(f"{len(responses)} responses but {len(advantages)} advantages")
    length = max(r.num_tokens for r in responses)
    b = len(responses)
    ids = torch.full((b, length), int(pad_id), dtype=torch.long)
    mask = torch.zeros((b, length - 1), dtype=torch.float32)
    old = torch.zeros((b, length - 1), dtype=torch.float32)
    adv = torch.zeros((b, length - 1), dtype=torch.float32)
    for row, (r, a) in enumerate(zip(responses, advantages, strict=True)):
        p, n = len(r.prompt_ids), len(r.response_ids)
        ids[row, :p] = torch.tensor(r.prompt_ids, dtype=torch.long)
        if n:
            ids[row, p : p + n] = torch.tensor(r.response_ids, dtype=torch.long)
            # target at position t is input_ids[t+1]: response token k sits at p + k
            mask[row, p - 1 : p - 1 + n] = 1.0
            old[row, p - 1 : p - 1 + n] = torch.tensor(r.logprobs, dtype=torch.float32)
            adv[row, p - 1 : p - 1 + n] = float(a)
    return PackedBatch(ids, mask, old, adv)


def batch_advantages(batch: TrainBatch, objective: RLObjective) -> list[float]:
    """The GRPO advantage of every response of ``batch`` (whole groups, whole batch)."""
    rewards = torch.tensor([r.reward for r in batch.responses], dtype=torch.float64)
    adv = group_advantages(
        rewards,
        [r.group_id for r in batch.responses],
        normalize_by_std=objective.normalize_by_std,
        eps=objective.eps,
    )
    return [float(x) for x in adv]
