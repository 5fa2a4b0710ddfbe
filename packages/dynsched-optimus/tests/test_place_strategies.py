"""``place(strategy=..., order=...)``: the baselines' load-balancing and Tetris placements
and a scheduler's priority order, through the one public placement."""

from __future__ import annotations

import numpy as np
import pytest
from dynsched_optimus import STRATEGIES, JobPlacement, OptimusError, PlacementRequest, place
from dynsched_optimus.testing import place_reference
from hypothesis import given
from hypothesis import strategies as st

ZERO = (0.0, 0.0, 0.0, 0.0)
GPU = (4.0, 16.0, 1.0, 0.0)
PS_TASK = (4.0, 8.0, 0.0, 2.0)
WORKER = (4.0, 8.0, 0.0, 1.0)


def _nodes(*gpus: float) -> np.ndarray:
    return np.array([[32.0, 256.0, float(g), 10.0] for g in gpus])


def test_bad_strategy_and_order_name_the_field_and_allowed_values() -> None:
    job = [PlacementRequest("j", 0, 1, ZERO, GPU)]
    with pytest.raises(OptimusError, match=r"strategy='pack'.*fewest.*spread.*align"):
        place(job, _nodes(4), strategy="pack")
    with pytest.raises(OptimusError, match=r"order: job_id 'x'"):
        place(job, _nodes(4), order=["x"])
    assert STRATEGIES == ("fewest", "spread", "align")


def test_spread_balances_load_where_fewest_packs() -> None:
    jobs = [PlacementRequest("j", 0, 4, ZERO, GPU)]
    nodes = _nodes(4, 4, 4, 4)
    assert place(jobs, nodes).placements["j"].workers_per_node == (4,)
    pl = place(jobs, nodes, strategy="spread").placements["j"]
    assert pl.nodes == (0, 1, 2, 3) and pl.workers_per_node == (1, 1, 1, 1)


def test_spread_prefers_the_emptiest_server_by_its_scarcest_resource() -> None:
    # node 0: 3 of 4 GPUs free but almost no CPU; node 1: 2 of 4 GPUs, all CPU free
    nodes = np.array([[32.0, 256.0, 4.0, 10.0], [32.0, 256.0, 4.0, 10.0]])
    prev = {
        "busy0": JobPlacement("busy0", (0,), (0,), (1,)),
        "busy1": JobPlacement("busy1", (1,), (0,), (2,)),
    }
    jobs = [
        PlacementRequest("busy0", 0, 1, ZERO, (28.0, 16.0, 1.0, 0.0)),
        PlacementRequest("busy1", 0, 2, ZERO, (1.0, 1.0, 1.0, 0.0)),
        PlacementRequest("new", 0, 1, ZERO, (2.0, 1.0, 1.0, 0.0)),
    ]
    res = place(jobs, nodes, previous=prev, strategy="spread")
    assert set(res.kept) == {"busy0", "busy1"}
    # smallest free share: node 0 has 4/32 CPU left, node 1 has 2/4 GPUs: node 1 wins
    assert res.placements["new"].nodes == (1,)


def test_align_puts_a_task_where_its_demand_matches_what_is_free() -> None:
    # node 0 has free CPU only, node 1 free GPUs: a GPU-heavy task aligns with node 1
    nodes = np.array([[32.0, 256.0, 0.0, 10.0], [4.0, 16.0, 4.0, 10.0]])
    jobs = [PlacementRequest("g", 0, 2, ZERO, (1.0, 4.0, 1.0, 0.0))]
    pl = place(jobs, nodes, strategy="align").placements["g"]
    assert pl.nodes == (1,) and pl.workers_per_node == (2,)


def test_order_gives_the_first_listed_job_the_room() -> None:
    # 4 GPUs: by default the smaller job is placed first and the big one does not fit
    jobs = [PlacementRequest("big", 0, 4, ZERO, GPU), PlacementRequest("small", 0, 1, ZERO, GPU)]
    nodes = _nodes(4)
    assert place(jobs, nodes).unplaced == ("big",)
    res = place(jobs, nodes, order=["big"])  # big listed, small follows by default
    assert res.unplaced == ("small",) and res.placements["big"].workers == 4
    for strategy in STRATEGIES:
        assert place(jobs, nodes, order=["big", "small"], strategy=strategy).unplaced == ("small",)


def test_greedy_shrink_keeps_what_fits_and_needs_a_ps() -> None:
    nodes = _nodes(3)
    job = [PlacementRequest("j", 0, 5, ZERO, GPU)]
    assert place(job, nodes, strategy="spread").unplaced == ("j",)
    res = place(job, nodes, strategy="spread", shrink=True)
    assert dict(res.shrunk) == {"j": (0, 3)} and res.placements["j"].workers == 3
    # a PS job whose PS does not fit after its workers is not kept without a PS
    tight = np.array([[8.0, 256.0, 0.0, 10.0]])
    ps_job = [PlacementRequest("p", 1, 2, PS_TASK, WORKER)]
    assert place(ps_job, tight, strategy="spread", shrink=True).unplaced == ("p",)


@st.composite
def _cases(draw):  # type: ignore[no-untyped-def]
    n = draw(st.integers(1, 6))
    nodes = np.array(
        [
            [float(draw(st.integers(0, 32))), 256.0, float(draw(st.integers(0, 8))), 10.0]
            for _ in range(n)
        ]
    )
    jobs = []
    for i in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            jobs.append(PlacementRequest(f"g{i}", 0, draw(st.integers(1, 10)), ZERO, GPU))
        else:
            jobs.append(
                PlacementRequest(
                    f"p{i}", draw(st.integers(1, 4)), draw(st.integers(1, 6)), PS_TASK, WORKER
                )
            )
    order = draw(st.permutations([j.job_id for j in jobs]))
    return jobs, nodes, order


@given(_cases(), st.sampled_from(STRATEGIES), st.booleans())
def test_every_strategy_stays_within_capacity_and_equals_reference(case, strategy, shrink) -> None:  # type: ignore[no-untyped-def]
    jobs, nodes, order = case
    res = place(jobs, nodes, strategy=strategy, order=order, shrink=shrink, fill=True)
    ref = place_reference(jobs, nodes, strategy=strategy, order=order, shrink=shrink, fill=True)
    assert res.placements == ref.placements and res.unplaced == ref.unplaced
    used = np.zeros_like(nodes)
    by_id = {j.job_id: j for j in jobs}
    for jid, pl in res.placements.items():
        j = by_id[jid]
        want = dict(res.shrunk).get(jid, (j.ps, j.workers))
        assert (pl.ps, pl.workers) == want
        assert pl.workers >= 1 and (j.ps == 0 or pl.ps >= 1)
        for nd, p, w in zip(pl.nodes, pl.ps_per_node, pl.workers_per_node, strict=True):
            used[nd] += p * np.asarray(j.ps_demand) + w * np.asarray(j.worker_demand)
    assert np.all(used <= nodes + 1e-6)  # never over capacity
    assert np.allclose(res.free, nodes - used)
    assert set(res.placements) | set(res.unplaced) == set(by_id)


@given(
    st.lists(st.integers(0, 8), min_size=1, max_size=8),
    st.integers(1, 40),
    st.sampled_from(STRATEGIES),
)
def test_a_gpu_job_is_placed_exactly_when_the_free_gpus_suffice(gpus, count, strategy) -> None:  # type: ignore[no-untyped-def]
    # identical one-GPU tasks: any server with a free GPU is a slot, so each strategy
    # (with the fill fallback for "fewest") places the job iff the cluster has the GPUs
    nodes = _nodes(*gpus)
    res = place([PlacementRequest("j", 0, count, ZERO, GPU)], nodes, strategy=strategy, fill=True)
    assert ("j" in res.placements) == (count <= sum(gpus))
    shrunk = place(
        [PlacementRequest("j", 0, count, ZERO, GPU)],
        nodes,
        strategy=strategy,
        fill=True,
        shrink=True,
    )
    if sum(gpus):
        assert shrunk.placements["j"].workers == min(count, sum(gpus))
    else:
        assert shrunk.unplaced == ("j",)


def test_readme_placement_example_runs() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if 'strategy="spread"' in b]
    assert len(blocks) == 1
    exec(compile(blocks[0], "README.md", "exec"), {"__name__": "readme"})
