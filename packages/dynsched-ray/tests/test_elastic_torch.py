"""Elastic data parallelism without Ray: `TrainerActor`s in plain processes, resized 2 -> 3 -> 2.

The resize test runs this file as a script in three processes (ranks 0 and 1 throughout,
rank 2 joins for the middle step), each hosting a `TrainerActor` as a plain object and
walking the steps `RayTrainerGroup.resize` drives: snapshot, leave, rejoin (or set up),
receive the state. Rank 0 and rank 2 save what they hold; the test compares it with one
process training on the same three global batches.

Tolerance (stated in advance of the reason, not fitted): every float32 parameter within
rtol 1e-5, atol 1e-5 (1% of one AdamW step, ``lr = 1e-3``), and at most 1 in 10,000 of
them further than 1e-6 from the single process. Reason: the ranks sum their gradients
with an all-reduce, a different order of float sums from the single process's backward
pass (another one for two and three ranks), ~1e-7 relative; AdamW divides each element's
step by its own gradient magnitude, so where a gradient is near AdamW's ``eps`` (1e-8)
that rounding moves the element's step by up to a few percent of ``lr``. A lost or
doubled prompt group, or a rank without the optimizer state, moves the parameters by
about ``lr``. Nothing else may differ: the ranks must agree among themselves bit for bit,
and the new rank's state must equal rank 0's bit for bit.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from dynsched_core.trainer import GpuHandOver, TrainBatch
from dynsched_ray.runtime.errors import TrainerOffloadedError
from dynsched_ray.runtime.ports import free_port
from dynsched_ray.trainers.base import TrainerOptions
from dynsched_ray.trainers.elastic import TrainerResizeError, _join, _split, broadcast_state
from dynsched_ray.trainers.fsdp.trainer import FSDPTrainer
from dynsched_ray.trainers.group import RayTrainerGroup, TrainerActor
from dynsched_ray.trainers.torch.trainer import TorchTrainer
from hypothesis import given
from hypothesis import strategies as st

OPTIONS = TrainerOptions(lr=1e-3, ppo_mini_batch_size=2)
GROUPS = 5  # uneven over two and over three ranks
RTOL, ATOL = 1e-5, 1e-5
TIGHT, TIGHT_SHARE = 1e-6, 1e-4  # at most this share of the elements beyond TIGHT
# The three rank processes each import torch (and Megatron) and build the model: 86 s for all
# three kinds on an idle two-core machine, over 300 s for one kind with the cores busy. The
# bound is for a hung collective, not a speed check.
PROCESS_BOUND_S = 900.0


TAKEN: list[list[int]] = []
"""Response indices each step of this process trained on (kept across a rebuild)."""


def _trainer_class(kind: str) -> type:
    """The trainer class of ``kind`` (Megatron imported only when asked for)."""
    if kind == "megatron":
        from dynsched_ray.trainers.megatron.trainer import MegatronTrainer

        return MegatronTrainer
    return {"torch": TorchTrainer, "fsdp": FSDPTrainer}[kind]


def _recording(kind: str) -> type:
    """``kind``'s trainer, recording in `TAKEN` the responses each of its steps trained on."""
    base = _trainer_class(kind)

    def _rank_groups(self: Any, batch: TrainBatch) -> list[Sequence[int]]:
        groups = base._rank_groups(self, batch)
        TAKEN.append(sorted(i for g in groups for i in g))
        return list(groups)

    return type(f"Recording{base.__name__}", (base,), {"_rank_groups": _rank_groups})


def _actor(kind: str, rank: int, world: int, folder: str) -> TrainerActor:
    return TrainerActor(_recording(kind), (folder,), {"options": OPTIONS}, rank, world, 120.0)


def _role_main(role: int, ports: list[int], folder: str, work: str, kind: str) -> None:
    """One process: ranks 0/1 train at world 2, 3, 2; rank 2 only at world 3. Every rank
    takes part in each snapshot (a sharded trainer gathers it; rank 0 keeps it)."""
    batches = pickle.loads(Path(work, "batches.pkl").read_bytes())
    addr = [("127.0.0.1", p) for p in ports]
    if role < 2:
        a = _actor(kind, role, 2, folder)
        a.setup(addr[0])
        a.train_step(batches[0])
        a.snapshot(role == 0)
        a.leave()
        a.rejoin(role, 3, addr[1])
    else:
        a = _actor(kind, 2, 3, folder)
        a.setup(addr[1])
    a.receive_state()
    grown = a.state_dict()
    a.train_step(batches[1])
    a.snapshot(role == 0)
    a.leave()
    out: dict[str, Any] = {"grown": grown}
    if role < 2:
        a.rejoin(role, 2, addr[2])
        a.receive_state()
        a.train_step(batches[2])
        out["final"] = a.call("export_weights")[1]  # a gather for a sharded trainer
        a.leave()
        out["version"] = a.describe()["version"]
    out["taken"] = TAKEN
    torch.save(out, Path(work, f"rank{role}.pt"))


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports below the ephemeral range (the third is used a while
    after it is picked: an ephemeral one could be handed to a gloo connection by then)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port("127.0.0.1")
        if port not in ports:
            ports.append(port)
    return ports


def _run_roles(folder: Path, work: Path, kind: str) -> None:
    ports = ",".join(str(p) for p in _free_ports(3))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, ports, str(folder), str(work), kind]
    procs = [
        subprocess.Popen([*cmd, str(r)], env=env, stderr=subprocess.PIPE, text=True)
        for r in range(3)
    ]
    errors = []
    deadline = time.monotonic() + PROCESS_BOUND_S  # one bound for all ranks together
    try:
        for p in procs:
            _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if p.returncode:
                errors.append(err[-3000:])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert not errors, "\n---\n".join(errors)


@pytest.mark.timeout(PROCESS_BOUND_S + 120)
@pytest.mark.parametrize("kind", ["torch", "fsdp", "megatron"])
def test_resized_two_three_two_equals_one_process_on_the_same_global_batches(
    tiny_model_dir: Path, tmp_path: Path, kind: str
) -> None:
    from ._trainer_helpers import make_rl_batch

    batches = [make_rl_batch(tiny_model_dir, groups=GROUPS, seed=s) for s in range(3)]
    (tmp_path / "batches.pkl").write_bytes(pickle.dumps(batches))
    _run_roles(tiny_model_dir, tmp_path, kind)
    r0, r1, r2 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(3))

    # the unsharded reference of its kind, in one process (Megatron's kernels differ from
    # transformers' by float rounding, so Megatron is compared with Megatron)
    ref = (TorchTrainer if kind == "fsdp" else _trainer_class(kind))(tiny_model_dir, OPTIONS)
    for b in batches:
        ref.train_step(b)
    want = ref.export_weights()[1]
    assert r0["version"] == r1["version"] == ref.version == 3
    assert r0["final"].keys() == want.keys()
    beyond = total = 0
    for k in want:
        torch.testing.assert_close(r0["final"][k], want[k], rtol=RTOL, atol=ATOL, msg=k)
        assert torch.equal(r0["final"][k], r1["final"][k]), k  # ranks agree bit for bit
        beyond += int(((r0["final"][k] - want[k]).abs() > TIGHT).sum())
        total += want[k].numel()
    assert beyond <= TIGHT_SHARE * total, (beyond, total)

    # the joining rank got rank 0's model and AdamW state bit for bit (moments, step)
    g0, g2 = r0["grown"], r2["grown"]
    assert g2["version"] == g0["version"] == 1
    for k in g0["model"]:
        assert torch.equal(g0["model"][k], g2["model"][k]), k
    s0, s2 = g0["optimizer"]["state"], g2["optimizer"]["state"]
    assert s0.keys() == s2.keys() and s0
    for i in s0:
        for key in s0[i]:
            assert torch.equal(s0[i][key], s2[i][key]), (i, key)

    # every response of every global batch trained exactly once per step
    n = len(batches[0].responses)
    steps = [
        [r0["taken"][0], r1["taken"][0]],
        [r0["taken"][1], r1["taken"][1], r2["taken"][0]],
        [r0["taken"][2], r1["taken"][2]],
    ]
    for shares in steps:
        together = sorted(i for share in shares for i in share)
        assert together == list(range(n)), shares
    assert len(r2["taken"]) == 1


# ---------------------------------------------------------------------- the state tree


def _trees() -> st.SearchStrategy[Any]:
    dtypes = st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bfloat16])
    shapes = st.lists(st.integers(0, 3), max_size=3)
    tensors = st.builds(
        lambda d, s, seed: (torch.randn(s, generator=torch.Generator().manual_seed(seed)) * 7).to(
            d
        ),
        dtypes,
        shapes,
        st.integers(0, 2**16),
    )
    leaves = st.one_of(tensors, st.integers(), st.text(max_size=4), st.none())
    return st.recursive(
        leaves,
        lambda kids: st.one_of(
            st.lists(kids, max_size=3),
            st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 9)), kids, max_size=3),
        ),
        max_leaves=8,
    )


def _same(a: Any, b: Any) -> bool:
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


@given(_trees())
def test_the_state_tree_splits_into_layout_and_tensors_and_joins_back(tree: Any) -> None:
    tensors: list[torch.Tensor] = []
    layout = pickle.loads(pickle.dumps(_split({"x": tree}, tensors)))  # the layout travels
    assert not any(torch.is_tensor(t) for t in _leaves(layout))
    assert _same(_join(layout, tensors), {"x": tree})


def _leaves(tree: Any) -> list[Any]:
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _leaves(v)]
    if isinstance(tree, list):
        return [x for v in tree for x in _leaves(v)]
    return [tree]


def test_broadcast_in_a_world_of_one_returns_the_state_and_needs_one() -> None:
    state = {"a": torch.ones(2)}
    assert broadcast_state(state)["a"] is state["a"]
    with pytest.raises(ValueError, match="source rank needs a state"):
        broadcast_state(None)


# ---------------------------------------------------------------------- refusals


class _Local:
    """A stand-in actor handle: ``handle.method.remote(*a)`` calls the object in process."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._obj, name)

        class _Remote:
            @staticmethod
            async def remote(*args: Any) -> Any:
                return method(*args)

        return _Remote


@pytest.mark.usefixtures("ray_cluster")  # the group's calls start Ray: the session's cluster
def test_resize_is_refused_outside_a_sync_boundary_and_outside_the_pool(
    tiny_model_dir: Path, rl_batch: TrainBatch
) -> None:
    actor = TrainerActor(TorchTrainer, (str(tiny_model_dir),), {"options": OPTIONS})
    actor.setup()
    handover = GpuHandOver()
    handover.register_trainer(0)
    group = RayTrainerGroup([_Local(actor)], [0], handover, bundles=3)

    async def scenario() -> None:
        for bad in (0, 4, -1):
            with pytest.raises(ValueError, match=r"workers must be in \[1, 3\].*got " + str(bad)):
                await group.resize(bad)
        with pytest.raises(TypeError, match="workers must be an int"):
            await group.resize(2.0)  # type: ignore[arg-type]
        assert await group.resize(1) == 0.0  # same size: nothing to do
        # no spawner (not built by launch): it cannot grow
        with pytest.raises(TrainerResizeError, match="cannot start workers"):
            await group.resize(2)
        await group.train_step(rl_batch)
        assert not group.at_sync_boundary
        with pytest.raises(TrainerResizeError, match="sync boundary"):
            await group.resize(1)
        await group.keep_synced(1)
        assert group.at_sync_boundary and await group.resize(1) == 0.0
        await group.release([0])
        with pytest.raises(TrainerOffloadedError, match=r"GPU\(s\) \[0\] are offloaded"):
            await group.resize(1)

    asyncio.run(scenario())


def test_resize_refuses_to_grow_onto_a_gpu_an_awake_hybrid_replica_holds() -> None:
    from dynsched_core.errors import HandOverError

    handover = GpuHandOver()
    handover.register_trainer(0)
    handover.register_hybrid("hybrid-1", [1], awake=True)
    group = RayTrainerGroup([object()], [0], handover, bundles=2, spawn=lambda *a: object())
    with pytest.raises(
        HandOverError, match=r"hybrid replica\(s\) \['hybrid-1'\] are awake on GPU 1"
    ):
        asyncio.run(group.resize(2))
    assert group.workers and len(group.workers) == 1


if __name__ == "__main__":
    ports = [int(p) for p in sys.argv[1].split(",")]
    _role_main(int(sys.argv[5]), ports, sys.argv[2], sys.argv[3], sys.argv[4])  # errors exit 1
    # The rank's work is done and saved: skip the interpreter's teardown, where a gloo or
    # torch worker thread still joinable can abort the process ("terminate called without
    # an active exception", as seen once in test_fsdp_trainer.py's ranks in CI).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
