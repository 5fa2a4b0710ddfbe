"""Workload: prompt groups of ``n`` responses with seeded long-tailed lengths.

The workload can change over training: prompts are admitted and consumed (roughly) in
order, so prompt ``i`` of a run consuming ``S`` samples sits at training progress
``p_i = i / (S - 1)`` (clipped to ``[0, 1]``). A *length trajectory* multiplies every
response length of prompt ``i`` by a piecewise-linear ``m(p_i)`` (math RL grows response
lengths over training), a *difficulty trajectory* sets the spread of the per-prompt
difficulty factor ``exp(g(p_i) * Z_i)`` (the mix of easy and hard prompts can drift). Both
are optional; without them the workload is stationary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
from dynsched_core import validators as v

__all__ = ["LengthDistribution", "PromptGroup", "Workload", "WorkloadModel", "interpolate"]

_KINDS = ("lognormal", "empirical", "constant")


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

    kind: str = attrs.field(default="lognormal", validator=v.one_of(_KINDS))
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


def _points(value: Any) -> tuple[tuple[float, float], ...]:
    if value is None:
        return ()
    out = []
    for p in value:
        if (
            not isinstance(p, list | tuple)
            or len(p) != 2
            or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in p)
        ):
            raise ValueError(f"trajectory points must be [progress, value] pairs, got {p!r}")
        out.append((float(p[0]), float(p[1])))
    return tuple(out)


def _check_trajectory(name: str, points: tuple[tuple[float, float], ...], lo: float) -> None:
    xs = [p for p, _ in points]
    if any(not 0.0 <= x <= 1.0 for x in xs) or xs != sorted(xs) or len(set(xs)) != len(xs):
        raise ValueError(
            f"{name} must be [progress, value] points with progress strictly increasing "
            f"in [0, 1], got {[list(p) for p in points]}"
        )
    if any(not v >= lo for _, v in points):
        raise ValueError(f"{name} values must be >= {lo}, got {[v for _, v in points]}")


def interpolate(points: Sequence[tuple[float, float]], x: np.ndarray, default: float) -> np.ndarray:
    """Piecewise-linear ``points`` at ``x`` (constant beyond the ends; ``default`` if empty)."""
    if not points:
        return np.full(x.shape, float(default))
    xs = np.array([p for p, _ in points], dtype=float)
    ys = np.array([v for _, v in points], dtype=float)
    out: np.ndarray = np.interp(x, xs, ys)
    return out


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
        length_trajectory: ``[progress, multiplier]`` points: response lengths of the
            prompts at that training progress are multiplied by the (piecewise-linear)
            multiplier (empty: stationary).
        difficulty_trajectory: ``[progress, group_sigma]`` points replacing the constant
            ``group_sigma`` (empty: ``group_sigma`` throughout).
    """

    n: int = attrs.field(default=8)
    prompt_len: LengthDistribution = attrs.field(
        factory=lambda: LengthDistribution(median=200, sigma=0.3)
    )
    response_len: LengthDistribution = attrs.field(factory=LengthDistribution)
    group_sigma: float = attrs.field(default=0.0)
    max_response_len: int = attrs.field(default=8192)
    length_trajectory: tuple[tuple[float, float], ...] = attrs.field(default=(), converter=_points)
    difficulty_trajectory: tuple[tuple[float, float], ...] = attrs.field(
        default=(), converter=_points
    )

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.max_response_len, int) or self.max_response_len < 1:
            raise ValueError(
                f"max_response_len must be an integer >= 1, got {self.max_response_len!r}"
            )
        if self.group_sigma < 0:
            raise ValueError(f"group_sigma must be >= 0, got {self.group_sigma!r}")
        _check_trajectory("length_trajectory", self.length_trajectory, 0.0)
        if any(v <= 0 for _, v in self.length_trajectory):
            raise ValueError("length_trajectory multipliers must be > 0")
        _check_trajectory("difficulty_trajectory", self.difficulty_trajectory, 0.0)

    @property
    def stationary(self) -> bool:
        """No trajectory: every prompt is drawn from the same distribution."""
        return not self.length_trajectory and not self.difficulty_trajectory

    def progress(self, num_prompts: int, run_samples: int | None = None) -> np.ndarray:
        """Training progress ``p_i`` of each prompt (see the module docstring)."""
        span = max(1, (run_samples if run_samples is not None else num_prompts) - 1)
        return np.clip(np.arange(num_prompts, dtype=float) / span, 0.0, 1.0)

    def generate(self, num_prompts: int, seed: int, *, run_samples: int | None = None) -> Workload:
        """Draw ``num_prompts`` prompt groups from a seeded PCG64 generator.

        Args:
            num_prompts: Prompt groups to draw.
            seed: Generator seed.
            run_samples: Samples the run consumes (sets the progress of each prompt for
                the trajectories; default ``num_prompts``).
        """
        rng = np.random.Generator(np.random.PCG64(seed))
        plen = np.clip(np.rint(self.prompt_len.sample(rng, num_prompts)), 1, None).astype(np.int64)
        raw = self.response_len.sample(rng, (num_prompts, self.n))
        prog = self.progress(num_prompts, run_samples)
        sigma = interpolate(self.difficulty_trajectory, prog, self.group_sigma)
        if np.any(sigma > 0):
            raw = raw * np.exp(sigma[:, None] * rng.standard_normal((num_prompts, 1)))
        if self.length_trajectory:
            raw = raw * interpolate(self.length_trajectory, prog, 1.0)[:, None]
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
        tokens: np.ndarray = n * self.prompt_lens + self.response_lens.sum(axis=1)
        return tokens
