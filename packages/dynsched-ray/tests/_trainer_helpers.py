"""Helpers of the trainer tests: a fixed RL batch with on-policy logprobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def model_logprobs(model: Any, prompt: list[int], response: list[int]) -> list[float]:
    """Log-probability of each response token under a transformers causal LM."""
    import torch

    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
    return [float(x) for x in lp[len(prompt) - 1 :]]


def make_rl_batch(folder: Path, *, groups: int = 4, n: int = 4, seed: int = 0) -> Any:
    """``groups`` prompts x ``n`` responses of random tokens; rewards vary within groups.

    The rollout logprobs are the model's own (an on-policy batch at version 0).
    """
    import torch
    from dynsched_core.trainer import TrainBatch, TrainResponse
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for g in range(groups):
        prompt = torch.randint(3, 512, (3 + g,), generator=gen).tolist()
        for j in range(n):
            response = torch.randint(3, 512, (4 + (j * 3 + g) % 5,), generator=gen).tolist()
            out.append(
                TrainResponse(
                    prompt_ids=prompt,
                    response_ids=response,
                    logprobs=model_logprobs(model, prompt, response),
                    reward=float((j + g) % 3),
                    group_id=f"p{g}",
                    versions=(0,),
                )
            )
    return TrainBatch(responses=out, version=0)
