"""Parameter assignment to parameter servers: Optimus' PAA and two baselines.

Every piece of a parameter block stored on a PS costs one update request per worker per
step; the PS load is the number of parameters it stores.

* **PAA** (Optimus): blocks sorted by size, largest first; ``avg = total / #PS``.
  Blocks larger than ``avg`` are sliced into ``avg``-sized pieces (the last one smaller),
  each to the least-loaded PS; medium blocks (``tiny_fraction * avg`` to ``avg``) go
  best-fit to the PS with the least remaining capacity that still holds them (the
  least-loaded PS if none does); tiny blocks (below ``tiny_fraction * avg``, default 1 %)
  go to the PS with the fewest update requests (ties: least loaded).  One refinement of
  ours: the best-fit capacity of a PS is ``avg`` minus its share of the tiny blocks
  (``tiny_total / #PS``), so the tiny blocks that come last find room; with few PS the
  tiny blocks add up to a sizeable part of the model and would otherwise unbalance it.
* **MXNet default**: blocks of at least ``big_threshold`` (10^6) parameters are sliced
  evenly over all PS; smaller blocks go whole to a random PS (seeded; MXNet hashes the key).
* **Round-robin**: blocks of at least ``big_threshold`` are sliced evenly over all PS as in
  MXNet; smaller blocks go whole to PS ``0, 1, 2, ...`` in turn (a deterministic version
  of MXNet's placement; without the slicing a single large block would dominate any load
  comparison).

All ties between PS are broken by the lower PS index.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import attrs
import numpy as np

from dynsched_optimus._errors import OptimusError
from dynsched_optimus._models_zoo import ParameterBlock

__all__ = [
    "PARAMETER_ASSIGNMENTS",
    "ParameterAssignment",
    "assign_mxnet_default",
    "assign_paa",
    "assign_parameters",
    "assign_round_robin",
]

BlockList = Sequence[int | float | ParameterBlock]


@attrs.frozen
class ParameterAssignment:
    """Where the pieces of each block live, and the resulting balance.

    Attributes:
        method: the algorithm (``"paa"``, ``"mxnet"`` or ``"round_robin"``).
        num_ps: number of parameter servers.
        pieces: ``(block_index, ps, size)`` for every piece.
        loads: parameters stored on each PS.
        requests: update requests (pieces) handled by each PS per worker per step.
    """

    method: str
    num_ps: int
    pieces: tuple[tuple[int, int, float], ...]
    loads: tuple[float, ...]
    requests: tuple[int, ...]

    @property
    def max_load_difference(self) -> float:
        """Largest minus smallest PS load (parameters)."""
        return max(self.loads) - min(self.loads)

    @property
    def total_requests(self) -> int:
        """Update requests over all PS (per worker per step)."""
        return sum(self.requests)

    @property
    def max_requests(self) -> int:
        """Update requests of the busiest PS."""
        return max(self.requests)

    @property
    def blocks_split(self) -> int:
        """Number of blocks stored in more than one piece."""
        counts: dict[int, int] = {}
        for b, _ps, _s in self.pieces:
            counts[b] = counts.get(b, 0) + 1
        return sum(1 for c in counts.values() if c > 1)

    def summary(self) -> dict[str, float | int | str]:
        """The metrics as a flat dictionary."""
        return {
            "method": self.method,
            "num_ps": self.num_ps,
            "max_load_difference": self.max_load_difference,
            "max_load": max(self.loads),
            "min_load": min(self.loads),
            "total_requests": self.total_requests,
            "max_requests": self.max_requests,
            "blocks_split": self.blocks_split,
        }


def _sizes(blocks: BlockList) -> list[float]:
    out = []
    for i, b in enumerate(blocks):
        s = float(b.size if isinstance(b, ParameterBlock) else b)
        if not (s > 0 and math.isfinite(s)):
            raise OptimusError(f"block {i}: size must be a finite number > 0, got {s!r}")
        out.append(s)
    if not out:
        raise OptimusError("the block list is empty")
    return out


def _check_ps(num_ps: int) -> None:
    if not isinstance(num_ps, int) or num_ps < 1:
        raise OptimusError(f"num_ps must be an integer >= 1, got {num_ps!r}")


def _result(method: str, num_ps: int, pieces: list[tuple[int, int, float]]) -> ParameterAssignment:
    loads = [0.0] * num_ps
    req = [0] * num_ps
    for _b, ps, s in pieces:
        loads[ps] += s
        req[ps] += 1
    return ParameterAssignment(
        method=method, num_ps=num_ps, pieces=tuple(pieces), loads=tuple(loads), requests=tuple(req)
    )


def assign_paa(
    blocks: BlockList, num_ps: int, *, tiny_fraction: float = 0.01
) -> ParameterAssignment:
    """Optimus' parameter assignment algorithm (see the module docstring).

    Args:
        blocks: block sizes (numbers or :class:`ParameterBlock`).
        num_ps: number of parameter servers.
        tiny_fraction: blocks below ``tiny_fraction * avg`` are "tiny".
    """
    _check_ps(num_ps)
    if not 0 <= tiny_fraction < 1:
        raise OptimusError(f"tiny_fraction must be in [0, 1), got {tiny_fraction}")
    sizes = _sizes(blocks)
    avg = sum(sizes) / num_ps
    tiny_total = sum(s for s in sizes if s < tiny_fraction * avg)
    fit_cap = avg - tiny_total / num_ps
    loads = [0.0] * num_ps
    req = [0] * num_ps
    pieces: list[tuple[int, int, float]] = []
    # min-heap of (load, ps) for the least-loaded PS; entries refreshed lazily
    heap = [(0.0, p) for p in range(num_ps)]

    def least_loaded() -> int:
        while True:
            load, p = heap[0]
            if load == loads[p]:
                return p
            heapq.heapreplace(heap, (loads[p], p))

    def put(b: int, p: int, s: float) -> None:
        loads[p] += s
        req[p] += 1
        pieces.append((b, p, s))
        heapq.heappush(heap, (loads[p], p))

    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    for b in order:
        s = sizes[b]
        if s > avg * (1 + 1e-12):
            n = math.ceil(s / avg - 1e-9)
            rest = s
            for _ in range(n):
                piece = min(avg, rest)
                put(b, least_loaded(), piece)
                rest -= piece
                if rest <= 0:
                    break
        elif s >= tiny_fraction * avg:
            best = -1
            best_rem = math.inf
            for p in range(num_ps):
                rem = fit_cap - loads[p]
                if rem >= s * (1 - 1e-12) and rem < best_rem:
                    best, best_rem = p, rem
            put(b, best if best >= 0 else least_loaded(), s)
        else:
            p = min(range(num_ps), key=lambda q: (req[q], loads[q], q))
            put(b, p, s)
    return _result("paa", num_ps, pieces)


def _even_slices(b: int, s: float, num_ps: int) -> list[tuple[int, int, float]]:
    return [(b, p, s / num_ps) for p in range(num_ps)]


def assign_mxnet_default(
    blocks: BlockList, num_ps: int, *, big_threshold: float = 1e6, seed: int = 0
) -> ParameterAssignment:
    """MXNet's default: big blocks sliced evenly over all PS, small ones to a random PS."""
    _check_ps(num_ps)
    sizes = _sizes(blocks)
    rng = np.random.default_rng(seed)
    pieces: list[tuple[int, int, float]] = []
    for b, s in enumerate(sizes):
        if s >= big_threshold:
            pieces.extend(_even_slices(b, s, num_ps))
        else:
            pieces.append((b, int(rng.integers(num_ps)), s))
    return _result("mxnet", num_ps, pieces)


def assign_round_robin(
    blocks: BlockList, num_ps: int, *, big_threshold: float = 1e6
) -> ParameterAssignment:
    """Round-robin: big blocks sliced evenly as in MXNet, small ones to PS in turn."""
    _check_ps(num_ps)
    sizes = _sizes(blocks)
    pieces: list[tuple[int, int, float]] = []
    nxt = 0
    for b, s in enumerate(sizes):
        if s >= big_threshold:
            pieces.extend(_even_slices(b, s, num_ps))
        else:
            pieces.append((b, nxt, s))
            nxt = (nxt + 1) % num_ps
    return _result("round_robin", num_ps, pieces)


#: method name -> assignment function
PARAMETER_ASSIGNMENTS = {
    "paa": assign_paa,
    "mxnet": assign_mxnet_default,
    "round_robin": assign_round_robin,
}


def assign_parameters(blocks: BlockList, num_ps: int, method: str = "paa") -> ParameterAssignment:
    """Assign with the named method (``"paa"``, ``"mxnet"`` or ``"round_robin"``)."""
    fn = PARAMETER_ASSIGNMENTS.get(method)
    if fn is None:
        raise OptimusError(f"method must be one of {sorted(PARAMETER_ASSIGNMENTS)}, got {method!r}")
    return fn(blocks, num_ps)  # type: ignore[operator]
