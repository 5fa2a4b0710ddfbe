"""Workload: prompt groups of ``n`` responses with seeded long-tailed lengths."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

__all__ = ["LengthDistribution", "PromptGroup", "Workload", "WorkloadModel"]

_KINDS = ("lognormal", "empirical", "constant")


def _kind(_i: object, a: attrs.Attribute[Any], v: str) -> None:
    if v not in _KINDS:
        raise ValueError(f"{a.name} must be one of {list(_KINDS)}, got {v!r}")


@attrs.frozen(kw_only=True)
class LengthDistribution:
    """A token-length distribution.

    ``lognormal``: ``median * exp(sigma * Z)``, ``Z ~ N(0, 1)``; ``empirical``: draws
    uniformly from ``values``; ``constant``: always ``median``. Draws are rounded to
    integers and clipped to ``[1, cap]`` by the caller.

    Attributes:
        kind: ``lognormal``, ``empirical`` or ``constant``.
        median: Median (lognormal) or the constant value.
        sigma: Log-space standard deviation (lognormal).
        values: Observed lengths (empirical).
    """

    kind: str = attrs.field(default="lognormal", validator=_kind)
    median: float = attrs.field(default=1000.0)
    sigma: float = attrs.field(default=1.0)
    values: tuple[int, ...] = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self) -> None:
        if self.kind == "empirical" and not self.values:
            raise ValueError("values must be a non-empty list of lengths when kind is 'empirical'")
        if self.kind != "empirical" and not self.median > 0:
            raise ValueError(f"median must be > 0, got {self.median!r}")
        if self.sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {self.sigma!r}")
        if any((not isinstance(x, int)) or x < 0 for x in self.values):
            raise ValueError("values must be integers >= 0")

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        """Draw raw (unrounded, unclipped) lengths."""
        if self.kind == "lognormal":
            return self.median * np.exp(self.sigma * rng.standard_normal(size))
        if self.kind == "empirical":
            return np.asarray(self.values, dtype=float)[rng.integers(0, len(self.values), size)]
        return np.full(size, float(self.median))


@attrs.frozen(kw_only=True)
class WorkloadModel:
    """How prompts and responses look.

    Attributes:
        n: Responses per prompt (the group size).
        prompt_len: Prompt length distribution.
        response_len: Response length distribution (before the cap).
        group_sigma: Log-space spread of a per-prompt difficulty factor multiplied into
            every response of the prompt (0: responses independent).
        max_response_len: Cap on a response (the rollout's max response length).
    """

    n: int = attrs.field(default=8)
    prompt_len: LengthDistribution = attrs.field(
        factory=lambda: LengthDistribution(median=200, sigma=0.3)
    )
    response_len: LengthDistribution = attrs.field(factory=LengthDistribution)
    group_sigma: float = attrs.field(default=0.0)
    max_response_len: int = attrs.field(default=8192)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.max_response_len, int) or self.max_response_len < 1:
            raise ValueError(
                f"max_response_len must be an integer >= 1, got {self.max_response_len!r}"
            )
        if self.group_sigma < 0:
            raise ValueError(f"group_sigma must be >= 0, got {self.group_sigma!r}")

    def generate(self, num_prompts: int, seed: int) -> Workload:
        """Draw ``num_prompts`` prompt groups from a seeded PCG64 generator."""
        rng = np.random.Generator(np.random.PCG64(seed))
        plen = np.clip(np.rint(self.prompt_len.sample(rng, num_prompts)), 1, None).astype(np.int64)
        raw = self.response_len.sample(rng, (num_prompts, self.n))
        if self.group_sigma > 0:
            raw = raw * np.exp(self.group_sigma * rng.standard_normal((num_prompts, 1)))
        rlen = np.clip(np.rint(raw), 1, self.max_response_len).astype(np.int64)
        return Workload(prompt_lens=plen, response_lens=rlen)


@attrs.frozen
class PromptGroup:
    """One prompt and the lengths its ``n`` responses will reach."""

    index: int
    prompt_len: int
    response_lens: tuple[int, ...]

    @property
    def tokens(self) -> int:
        """Training tokens of the group: ``n * prompt_len + sum(response_lens)``."""
        return len(self.response_lens) * self.prompt_len + sum(self.response_lens)


@attrs.frozen(eq=False)
class Workload:
    """A drawn workload: arrays of prompt lengths ``(P,)`` and response lengths ``(P, n)``."""

    prompt_lens: np.ndarray
    response_lens: np.ndarray

    def __len__(self) -> int:
        return int(self.prompt_lens.shape[0])

    def group(self, i: int) -> PromptGroup:
        """The ``i``-th prompt group."""
        return PromptGroup(
            i, int(self.prompt_lens[i]), tuple(int(x) for x in self.response_lens[i])
        )

    def groups(self) -> Sequence[PromptGroup]:
        """All groups, in order."""
        return [self.group(i) for i in range(len(self))]

    def group_tokens(self) -> np.ndarray:
        """Training tokens per group."""
        n = self.response_lens.shape[1]
        return n * self.prompt_lens + self.response_lens.sum(axis=1)
