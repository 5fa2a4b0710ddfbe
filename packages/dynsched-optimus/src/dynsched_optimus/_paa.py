"""Parameter assignment to parameter servers: Optimus' PAA and two baselines.

Every piece of a parameter block stored on a PS costs one update request per worker per
step; the PS load is the number of parameters it stores.

* **PAA** (Optimus), in two phases.

  1. *The paper's rules*: blocks sorted by size, largest first; ``avg = total / #PS``.
     Blocks larger than ``avg`` are sliced into ``avg``-sized pieces (the last one
     smaller), each to the least-loaded PS; medium blocks (``tiny_fraction * avg`` to
     ``avg``) go best-fit to the PS with the least remaining capacity that still holds
     them (the least-loaded PS if none does); tiny blocks (below ``tiny_fraction * avg``,
     default 1 %) go to the PS with the fewest update requests (ties: least loaded).  One
     adjustment of ours: the best-fit capacity of a PS is ``avg`` minus its share of the
     tiny blocks (``tiny_total / #PS``), so the tiny blocks that come last find room.
  2. *Refinement* (beyond the paper, on by default, ``refine=False`` turns it off).  The
     reference is the two baselines below, computed with the same ``big_threshold`` and
     ``seed``: the *request budget* is the smaller of their total update requests and the
     *target* is the smaller of their maximum load differences.

     a. *Cycle cancelling* (loads unchanged, requests never up): in the bipartite graph of
        blocks and PS (one edge per piece), a cycle ``PS_0 - b_0 - PS_1 - b_1 - ... -
        PS_0`` lets ``delta`` of ``b_i`` move from ``PS_i`` to ``PS_i+1`` all round
        without changing any load; with ``delta`` the smallest piece on the cycle's
        losing side, at least one piece disappears.  Repeated until the graph is a
        forest, which has at most ``#blocks + #PS - 1`` pieces.
     b. *Budget*: while the request count exceeds the budget (the paper's slicing can
        cost more requests than the baselines on small models), the smallest piece of a
        split block is merged into the least-loaded other PS holding that block.
     c. *Free moves* (requests never up): repeatedly take the most-loaded PS (ties: lower
        index) and the partners in ascending load order; move the best of: part of a
        block both PS hold (merging the piece when it moves whole), a whole piece, or a
        swap of two whole pieces, choosing the transfer closest to half the gap; a
        transfer is only made when it lies strictly inside the gap (so the pair's spread
        shrinks and no load leaves the old ``[min, max]`` range).  When the most-loaded
        PS has no such move, the same is tried to raise the least-loaded PS.  Stops when
        no move helps or the spread is below ``1e-9 * avg``.
     d. *Splits* (one extra request each): while the spread is above the target, move
        ``min(max_load - avg, avg - min_load)`` from the most-loaded to the
        least-loaded PS, splitting a piece on the most-loaded PS (preferring a block the
        least-loaded PS already holds, then an already-split block, then the smallest
        piece that is large enough), then cancel cycles; each step puts one PS at
        exactly ``avg``, so at most ``#PS - 1`` steps reach a perfect balance.  Stops when
        a split would take the request count over the budget.  Then (c) once more.
     e. *Busiest PS and guarantee*: moves and splits may give a PS a new piece only while
        it has fewer pieces than the busiest PS of the starting layout, so the refinement
        never raises the busiest PS's request count.  If the result is above the target,
        over the budget, or its busiest PS has more requests than the better baseline's
        busiest PS, (a)-(d) are rerun allowing up to that baseline count per PS, then from
        each baseline's layout (better load difference first), and the first result that
        meets all three is kept (else the best: budget, target, busiest PS, spread).  So
        the refined PAA is never worse than either baseline on the maximum load
        difference, the total update requests or the busiest PS's requests.  On the four
        architectures of :mod:`dynsched_optimus._models_zoo` at 1 to 32 PS the first
        attempt succeeds in 127 of 128 cases (VGG-16 at 24 PS needs the second); on
        random block lists whose blocks are all below ``big_threshold`` (the budget then
        allows no split) or whose rules layout piles blocks on one PS, a baseline start
        is often needed (about 4 lists in 10 in our tests).

     The refinement only splits when the free moves leave the spread above the target,
     so a layout that already beats both baselines (ResNet-50 at 1 to 12 PS) keeps its
     whole blocks.
* **MXNet default**: blocks of at least ``big_threshold`` (10^6) parameters are sliced
  evenly over all PS; smaller blocks go whole to a random PS (seeded; MXNet hashes the key).
* **Round-robin**: blocks of at least ``big_threshold`` are sliced evenly over all PS as in
  MXNet; smaller blocks go whole to PS ``0, 1, 2, ...`` in turn (a deterministic version
  of MXNet's placement; without the slicing a single large block would dominate any load
  comparison).

Everything is deterministic: all ties between PS are broken by the lower PS index and
ties between blocks by the lower block index.  A refined layout lists its pieces by block
then PS, with at most one piece per (block, PS).
"""

from __future__ import annotations

import bisect
import heapq
import logging
import math
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from dynsched_optimus._errors import OptimusError
from dynsched_optimus._models_zoo import ParameterBlock

_LOG = logging.getLogger(__name__)

__all__ = [
    "PARAMETER_ASSIGNMENTS",
    "ParameterAssignment",
    "assign_mxnet_default",
    "assign_paa",
    "assign_paa_rules",
    "assign_parameters",
    "assign_round_robin",
]

BlockList = Sequence[int | float | ParameterBlock]

#: spread (relative to ``avg``) below which a layout counts as perfectly balanced
_BALANCE_TOL = 1e-9


@attrs.frozen
class ParameterAssignment:
    """Where the pieces of each block live, and the resulting balance.

    Attributes:
        method: the algorithm (``"paa"``, ``"paa_rules"``, ``"mxnet"`` or ``"round_robin"``).
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
    if not isinstance(num_ps, int) or isinstance(num_ps, bool) or num_ps < 1:
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


# ----------------------------------------------------------------------------- phase 1


def _paa_rules(
    sizes: list[float], num_ps: int, tiny_fraction: float
) -> list[tuple[int, int, float]]:
    """The paper's rules (phase 1): pieces in placement order."""
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
    return pieces


# ----------------------------------------------------------------------------- phase 2


class _Layout:
    """Mutable layout: pieces indexed by PS and by block, with the PS loads."""

    def __init__(self, num_ps: int) -> None:
        self.ps: list[dict[int, float]] = [{} for _ in range(num_ps)]
        self.blocks: dict[int, dict[int, float]] = {}
        self.loads = [0.0] * num_ps
        self.cap = 0  # most pieces a PS may be given by a move (busiest-PS request cap)

    @classmethod
    def from_pieces(cls, pieces: Sequence[tuple[int, int, float]], num_ps: int) -> _Layout:
        lay = cls(num_ps)
        for b, p, s in pieces:
            lay.ps[p][b] = lay.ps[p].get(b, 0.0) + s
            lay.blocks.setdefault(b, {})[p] = lay.ps[p][b]
            lay.loads[p] += s
        return lay

    def copy(self) -> _Layout:
        lay = _Layout(0)
        lay.ps = [dict(d) for d in self.ps]
        lay.blocks = {b: dict(d) for b, d in self.blocks.items()}
        lay.loads = list(self.loads)
        lay.cap = self.cap
        return lay

    @property
    def requests(self) -> int:
        return sum(len(d) for d in self.ps)

    def spread(self) -> float:
        return max(self.loads) - min(self.loads)

    def hi(self) -> int:
        return min(range(len(self.loads)), key=lambda p: (-self.loads[p], p))

    def lo(self) -> int:
        return min(range(len(self.loads)), key=lambda p: (self.loads[p], p))

    def move(self, b: int, src: int, dst: int, x: float) -> None:
        """Move ``x`` of block ``b`` from ``src`` to ``dst`` (the whole piece if ``x`` >= it)."""
        have = self.ps[src][b]
        if x >= have:
            x = have
            del self.ps[src][b]
            del self.blocks[b][src]
        else:
            self.ps[src][b] = have - x
            self.blocks[b][src] = have - x
        new = self.ps[dst].get(b, 0.0) + x
        self.ps[dst][b] = new
        self.blocks[b][dst] = new
        self.loads[src] -= x
        self.loads[dst] += x

    def pieces(self) -> list[tuple[int, int, float]]:
        return [
            (b, p, self.blocks[b][p]) for b in sorted(self.blocks) for p in sorted(self.blocks[b])
        ]


def _find_cycle(lay: _Layout) -> list[int] | None:
    """A cycle ``[ps_0, b_0, ps_1, b_1, ...]`` of the block-PS graph, or None (a forest)."""
    k = len(lay.ps)
    parent: dict[int, int] = {}  # union-find over nodes: PS p -> p, block b -> k + b

    def find(x: int) -> int:
        root = x
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(x, x) != root:
            parent[x], x = root, parent[x]
        return root

    adj: dict[int, list[int]] = {}
    for b in sorted(lay.blocks):
        for p in sorted(lay.blocks[b]):
            u, v = p, k + b
            ru, rv = find(u), find(v)
            if ru != rv:
                parent[ru] = rv
                adj.setdefault(u, []).append(v)
                adj.setdefault(v, []).append(u)
                continue
            # path from the PS u to the block v in the forest, then the edge (v, u)
            prev = {u: u}
            queue = [u]
            for node in queue:
                if node == v:
                    break
                for nxt in adj.get(node, ()):
                    if nxt not in prev:
                        prev[nxt] = node
                        queue.append(nxt)
            path = [v]
            while path[-1] != u:
                path.append(prev[path[-1]])
            path.reverse()  # u (PS), block, PS, ..., v (block)
            return path
    return None


def _cancel_cycles(lay: _Layout) -> None:
    """Remove pieces along cycles without changing any load, until the graph is a forest."""
    k = len(lay.ps)
    while (cycle := _find_cycle(lay)) is not None:
        m = len(cycle) // 2
        ps = [cycle[2 * i] for i in range(m)]
        blocks = [cycle[2 * i + 1] - k for i in range(m)]
        # forward: block i moves from ps[i] to ps[i+1]; backward: from ps[i+1] to ps[i]
        fwd = min(lay.ps[ps[i]][blocks[i]] for i in range(m))
        bwd = min(lay.ps[ps[(i + 1) % m]][blocks[i]] for i in range(m))
        for i in range(m):
            a, c = ps[i], ps[(i + 1) % m]
            if fwd <= bwd:
                lay.move(blocks[i], a, c, fwd)
            else:
                lay.move(blocks[i], c, a, bwd)


def _merge_to_budget(lay: _Layout, budget: int) -> None:
    while lay.requests > budget:
        s, b, p = min(
            (s, b, p) for b, hs in lay.blocks.items() if len(hs) > 1 for p, s in hs.items()
        )
        q = min((h for h in lay.blocks[b] if h != p), key=lambda h: (lay.loads[h], h))
        lay.move(b, p, q, s)


#: a transfer between two PS: a block piece moved ``("move", block, size)``, or two pieces
#: swapped ``("swap", block, other block)``
_Action = tuple[str, int, float]
#: ``(|gap - 2 x|, tie-break key, action)``
_Transfer = tuple[float, tuple[int, ...], _Action]


def _best_transfer(lay: _Layout, src: int, dst: int, gap: float, tol: float) -> _Transfer | None:
    """The request-neutral transfer from ``src`` to ``dst`` closest to ``gap / 2``."""
    half = gap / 2
    sd, dd = lay.ps[src], lay.ps[dst]
    room = len(dd) < lay.cap  # may dst take one more piece?
    best: _Transfer | None = None
    for b, s in sd.items():
        if b in dd:
            x = min(s, half)
            key = (0 if x == s else 1, b)  # a merge (one request fewer) first
        elif room:
            x = s
            key = (1, b)
        else:
            continue
        if tol < x < gap - tol:
            cand: _Transfer = (abs(gap - 2 * x), key, ("move", b, x))
            if best is None or cand[:2] < best[:2]:
                best = cand
    others = sorted((s, c) for c, s in dd.items() if c not in sd)
    if others:
        osizes = [s for s, _c in others]
        for a, sa in sd.items():
            if a in dd:
                continue
            i = bisect.bisect_left(osizes, sa - half)
            for j in (i - 1, i):
                if 0 <= j < len(others):
                    sc, c = others[j]
                    x = sa - sc
                    if tol < x < gap - tol:
                        cand = (abs(gap - 2 * x), (2, a, c), ("swap", a, c))
                        if best is None or cand[:2] < best[:2]:
                            best = cand
    return best


def _apply(lay: _Layout, src: int, dst: int, action: _Action) -> None:
    if action[0] == "move":
        lay.move(action[1], src, dst, action[2])
    else:
        _kind, a, other = action
        c = int(other)  # a block id (an int when the action is a swap)
        lay.move(a, src, dst, lay.ps[src][a])
        lay.move(c, dst, src, lay.ps[dst][c])


def _improve(lay: _Layout, tol: float, max_steps: int) -> None:
    """Free moves (c): lower the spread without adding requests."""
    k = len(lay.ps)
    for _ in range(max_steps):
        hi, lo = lay.hi(), lay.lo()
        if lay.loads[hi] - lay.loads[lo] <= tol:
            return
        # from the most loaded server to the least loaded one that takes something, else
        # to the least loaded server from the most loaded one that gives something
        if not (_relieve(lay, hi, k, tol, source=True) or _relieve(lay, lo, k, tol, source=False)):
            return


def _relieve(lay: _Layout, pivot: int, k: int, tol: float, *, source: bool) -> bool:
    """One transfer between ``pivot`` (the source, or the destination) and the first
    other server, in load order, that has a useful transfer; whether one was made."""
    sign = 1.0 if source else -1.0
    for q in sorted(range(k), key=lambda p: (sign * lay.loads[p], p)):
        src, dst = (pivot, q) if source else (q, pivot)
        gap = lay.loads[src] - lay.loads[dst]
        if q == pivot or gap <= tol:
            return False
        best = _best_transfer(lay, src, dst, gap, tol)
        if best is not None:
            _apply(lay, src, dst, best[2])
            return True
    return False


def _split_step(lay: _Layout, avg: float, tol: float) -> bool:
    """One water-filling split (d); False when nothing useful can be moved."""
    hi, lo = lay.hi(), lay.lo()
    amount = min(lay.loads[hi] - avg, avg - lay.loads[lo])
    if amount <= tol:
        return False
    pieces = lay.ps[hi]
    room = len(lay.ps[lo]) < lay.cap
    cands = [
        (b not in lay.ps[lo], len(lay.blocks[b]) == 1, s, b)
        for b, s in pieces.items()
        if (s > amount and room) or b in lay.ps[lo]
    ]
    if cands:
        b = min(cands)[3]
    elif room and pieces:  # every piece is small enough to move whole
        b = min(pieces, key=lambda c: (-pieces[c], c))
    else:
        return False
    lay.move(b, hi, lo, amount)
    return True


def _refine(
    lay: _Layout, avg: float, target: float, budget: int, cap: int, tol: float, n_blocks: int
) -> _Layout:
    k = len(lay.ps)
    steps = 20 * (n_blocks + k) + 100
    _cancel_cycles(lay)
    _merge_to_budget(lay, budget)
    lay.cap = max(cap, max(len(d) for d in lay.ps))
    _improve(lay, tol, steps)
    for _ in range(2 * k + 2):
        if lay.spread() <= target + tol:
            break
        trial = lay.copy()
        if not _split_step(trial, avg, tol):
            break
        _cancel_cycles(trial)
        if trial.requests > budget:
            break
        lay = trial
    _improve(lay, tol, steps)
    return lay


def assign_paa(
    blocks: BlockList,
    num_ps: int,
    *,
    tiny_fraction: float = 0.01,
    refine: bool = True,
    big_threshold: float = 1e6,
    seed: int = 0,
) -> ParameterAssignment:
    """Optimus' parameter assignment algorithm (see the module docstring).

    Args:
        blocks: block sizes (numbers or :class:`ParameterBlock`).
        num_ps: number of parameter servers.
        tiny_fraction: blocks below ``tiny_fraction * avg`` are "tiny".
        refine: run the refinement phase after the paper's rules (``False``: the rules
            only, as :func:`assign_paa_rules`).
        big_threshold: the baselines' slicing threshold, for the refinement's request
            budget and target.
        seed: MXNet's seed, for the refinement's target.

    Returns:
        The assignment, with ``method == "paa"`` (``"paa_rules"`` when ``refine`` is False).
    """
    _check_ps(num_ps)
    if not 0 <= tiny_fraction < 1:
        raise OptimusError(f"tiny_fraction must be in [0, 1), got {tiny_fraction}")
    sizes = _sizes(blocks)
    pieces = _paa_rules(sizes, num_ps, tiny_fraction)
    if not refine:
        return _result("paa_rules", num_ps, pieces)
    bases = sorted(
        (
            assign_mxnet_default(sizes, num_ps, big_threshold=big_threshold, seed=seed),
            assign_round_robin(sizes, num_ps, big_threshold=big_threshold),
        ),
        key=lambda a: a.max_load_difference,
    )
    target = bases[0].max_load_difference
    budget = min(a.total_requests for a in bases)
    cap = min(a.max_requests for a in bases)
    avg = sum(sizes) / num_ps
    tol = _BALANCE_TOL * avg

    def run(start: Sequence[tuple[int, int, float]], move_cap: int) -> _Layout:
        lay = _Layout.from_pieces(start, num_ps)
        return _refine(lay, avg, target, budget, move_cap, tol, len(sizes))

    def rank(lay: _Layout) -> tuple[bool, bool, bool, float, int]:
        over = max(len(d) for d in lay.ps) > cap
        return (
            lay.requests > budget,
            lay.spread() > target + tol,
            over,
            lay.spread(),
            lay.requests,
        )

    # (e): first without raising the busiest PS's request count, then up to the baselines'
    attempts = ((pieces, 0), (pieces, cap), (bases[0].pieces, cap), (bases[1].pieces, cap))
    best: _Layout | None = None
    used = 0
    for i, (start, move_cap) in enumerate(attempts):
        lay = run(start, move_cap)
        if best is None or rank(lay) < rank(best):
            best, used = lay, i
        if rank(best)[:3] == (False, False, False):
            break
    assert best is not None
    _LOG.debug("paa refinement: result of attempt %d (0: rules, no busier PS)", used)
    return _result("paa", num_ps, best.pieces())


def assign_paa_rules(
    blocks: BlockList, num_ps: int, *, tiny_fraction: float = 0.01
) -> ParameterAssignment:
    """PAA with the paper's rules only (``assign_paa(..., refine=False)``)."""
    return assign_paa(blocks, num_ps, tiny_fraction=tiny_fraction, refine=False)


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
PARAMETER_ASSIGNMENTS: dict[str, Callable[[BlockList, int], ParameterAssignment]] = {
    "paa": assign_paa,
    "paa_rules": assign_paa_rules,
    "mxnet": assign_mxnet_default,
    "round_robin": assign_round_robin,
}


def assign_parameters(blocks: BlockList, num_ps: int, method: str = "paa") -> ParameterAssignment:
    """Assign with the named method (``"paa"``, ``"paa_rules"``, ``"mxnet"``, ``"round_robin"``)."""
    fn = PARAMETER_ASSIGNMENTS.get(method)
    if fn is None:
        raise OptimusError(f"method must be one of {sorted(PARAMETER_ASSIGNMENTS)}, got {method!r}")
    return fn(blocks, num_ps)
