"""A small verifiable RL task shipped with dynsched: two-number addition.

- `AdditionTask`: a seeded prompt generator (``"37+45="``), the exact answer, and a
  reward with partial credit;
- `warm_up`: a short supervised warm-up of the tiny model (`build_tiny_model`) on the
  task, cached in a folder the user names, so the first RL step already earns a
  non-zero reward.

The reward of a response (its text up to the end-of-sequence token, surrounding spaces
stripped) against the answer ``a + b`` written in decimal:

- ``1.0`` when it equals the answer exactly;
- otherwise partial credit ``0.5 * same / max(len(response), len(answer))``, where
  ``same`` counts the positions (from the left) where response and answer hold the same
  character: a response with the right number of digits and some right digits earns a
  little, an empty or over-long one little or nothing. Partial credit stays below the
  smallest exact-match reward, so a policy that maximises the reward answers exactly.

torch and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
from dynsched_core import ConfigError, Prompt

__all__ = ["AdditionTask", "TaskTokenizer", "WarmUpOptions", "warm_up"]

logger = logging.getLogger(__name__)

_WARM_MARKER = "dynsched-warm-up.json"


def _int_ge(low: int) -> Any:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(
                f"{type(instance).__name__}.{attribute.name} must be an int >= {low}, got "
                f"{value!r}",
                key=attribute.name,
            )

    return check


@attrs.frozen(kw_only=True)
class AdditionTask:
    """Two-number addition: prompt ``"{a}+{b}="``, answer ``str(a + b)``.

    Attributes:
        max_operand: Operands are drawn uniformly from ``[0, max_operand]``.
        seed: Seed of the prompt generator: the same seed gives the same prompts.
        partial_credit: Give partial credit (see the module docstring); False: exact
            match only (0 or 1).
    """

    max_operand: int = attrs.field(default=4, validator=_int_ge(1))
    seed: int = attrs.field(default=0, validator=_int_ge(0))
    partial_credit: bool = True

    def problem(self, index: int, *, stream: str = "rl") -> tuple[int, int]:
        """The operands of prompt ``index`` (deterministic in seed, stream and index)."""
        digest = hashlib.sha256(f"{stream}:{self.seed}:{index}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        return rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)

    @staticmethod
    def prompt_text(a: int, b: int) -> str:
        """The prompt of ``a + b``."""
        return f"{a}+{b}="

    @staticmethod
    def answer(a: int, b: int) -> str:
        """The exact answer."""
        return str(a + b)

    def reward(self, response: str, answer: str) -> float:
        """Reward of a decoded response against the answer (see the module docstring)."""
        text = response.strip()
        if text == answer:
            return 1.0
        if not self.partial_credit or not text:
            return 0.0
        same = sum(1 for x, y in zip(text, answer, strict=False) if x == y)
        return 0.5 * same / max(len(text), len(answer))

    def prompts(
        self,
        tokenizer: TaskTokenizer,
        count: int,
        *,
        max_tokens: int,
        skip: frozenset[str] = frozenset(),
        start: int = 0,
    ) -> Iterator[Prompt]:
        """Prompts ``t0, t1, ...`` (ids ``t<index>``) as token ids, skipping ``skip``.

        Each prompt's metadata holds its text and answer, which the reward reads.
        """
        for i in range(start, start + count):
            pid = f"t{i}"
            if pid in skip:
                continue
            a, b = self.problem(i)
            ids = tokenizer.encode_prompt(self.prompt_text(a, b))
            yield Prompt(
                prompt_id=pid,
                prompt=ids,
                prompt_len=len(ids),
                max_tokens=max_tokens,
                metadata={"text": self.prompt_text(a, b), "answer": self.answer(a, b)},
            )

    def sample_reward(self, tokenizer: TaskTokenizer, sample: Any, outcome: Any) -> float:
        """``reward_fn`` of `dynsched_core.TrainBatch.from_samples` for this task."""
        answer = str(sample.prompt.metadata["answer"])
        return self.reward(tokenizer.decode_response(outcome.output_tokens), answer)


class TaskTokenizer:
    """The tiny model's tokenizer, with the task's conventions.

    A prompt is ``<s>`` followed by the prompt text's tokens; a response ends with
    ``</s>`` (the model's end-of-sequence token), which decoding drops.

    Args:
        folder: A Hugging Face model folder (e.g. `build_tiny_model`'s).
    """

    def __init__(self, folder: str | Path) -> None:
        from transformers import PreTrainedTokenizerFast

        self._tok = PreTrainedTokenizerFast.from_pretrained(  # nosec B615: a local folder, no download
            str(folder), local_files_only=True
        )
        self.bos_id = int(self._tok.bos_token_id)
        self.eos_id = int(self._tok.eos_token_id)

    def encode_prompt(self, text: str) -> tuple[int, ...]:
        """Token ids of a prompt (``<s>`` first)."""
        return (self.bos_id, *self._tok.encode(text, add_special_tokens=False))

    def encode_answer(self, text: str) -> tuple[int, ...]:
        """Token ids of a target response (``</s>`` last)."""
        return (*self._tok.encode(text, add_special_tokens=False), self.eos_id)

    def decode_response(self, ids: Sequence[int]) -> str:
        """Text of a response, up to its first ``</s>``."""
        out = list(ids)
        if self.eos_id in out:
            out = out[: out.index(self.eos_id)]
        return str(self._tok.decode(out, skip_special_tokens=True))


@attrs.frozen(kw_only=True)
class WarmUpOptions:
    """Supervised warm-up settings (judgement: sized so that a warmed-up tiny model
    answers part of the prompts exactly, leaving room for RL to improve).

    Attributes:
        steps: AdamW steps of supervised training.
        batch_size: Examples per step.
        lr: Learning rate.
        seed: Seed of the examples (drawn from the task's ``"warmup"`` stream, distinct
            from the RL prompts) and of the model build.
    """

    steps: int = attrs.field(default=40, validator=_int_ge(0))
    batch_size: int = attrs.field(default=32, validator=_int_ge(1))
    lr: float = 3e-3
    seed: int = attrs.field(default=0, validator=_int_ge(0))


def warm_up(
    folder: str | Path,
    task: AdditionTask | None = None,
    options: WarmUpOptions | None = None,
    *,
    spec: Any = None,
) -> Path:
    """Build the tiny model and fine-tune it on the task; cache it in ``folder``.

    The result is a Hugging Face folder (``folder/model``) that the replicas and the
    trainers load. A folder already holding a warm-up with the same task, options and
    model spec is reused as is (a marker file records them).

    Args:
        folder: Cache folder the user names.
        task: The task (default `AdditionTask()`).
        options: Warm-up settings.
        spec: `TinyModelSpec` of the base model (default: its defaults).

    Returns:
        The warmed-up model folder.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from dynsched_ray.task.tiny_model import (
        TinyModelSpec,
        build_tiny_model,
        marker_matches,
        seeded_torch,
    )

    task = task or AdditionTask()
    options = options or WarmUpOptions()
    spec = spec or TinyModelSpec()
    root = Path(folder)
    out = root / "model"
    wanted = {
        "task": attrs.asdict(task),
        "options": attrs.asdict(options),
        "spec": attrs.asdict(spec),
    }
    marker = out / _WARM_MARKER
    if marker_matches(marker, wanted, key="wanted"):
        return out
    base = build_tiny_model(root / "base", spec)
    tok = TaskTokenizer(base)
    with seeded_torch(options.seed):
        model = AutoModelForCausalLM.from_pretrained(  # nosec B615: a local folder, no download
            str(base), dtype=torch.float32, local_files_only=True
        )
        losses = _fine_tune(model, task, tok, options)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tok._tok.save_pretrained(str(out))
    marker.write_text(
        json.dumps({"wanted": wanted, "final_loss": losses[-1] if losses else None}, indent=2)
    )
    logger.info("warm-up: %d steps, final loss %s, in %s", options.steps, losses[-1:], out)
    return out


def _fine_tune(
    model: Any, task: AdditionTask, tok: TaskTokenizer, options: WarmUpOptions
) -> list[float]:
    """``options.steps`` AdamW steps on the task's warm-up stream; the loss of each."""
    import torch

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=options.lr, weight_decay=0.0)
    losses: list[float] = []
    for step in range(options.steps):
        ids, labels = _warm_up_batch(task, tok, options, start=step * options.batch_size)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _warm_up_batch(
    task: AdditionTask, tok: TaskTokenizer, options: WarmUpOptions, *, start: int
) -> tuple[Any, Any]:
    """``(input ids, labels)`` of examples ``start, start + 1, ...``: prompt and answer
    right-padded with ``</s>``, the loss on the answer only (labels -100 elsewhere)."""
    import torch

    seqs, starts = [], []
    for index in range(start, start + options.batch_size):
        a, b = task.problem(index, stream=f"warmup{options.seed}")
        p = tok.encode_prompt(task.prompt_text(a, b))
        r = tok.encode_answer(task.answer(a, b))
        seqs.append(p + r)
        starts.append(len(p))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), int(tok.eos_id))
    labels = torch.full((len(seqs), width), -100)
    for i, (s, st) in enumerate(zip(seqs, starts, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, st : len(s)] = torch.tensor(s[st:])
    return ids, labels
