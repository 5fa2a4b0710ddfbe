"""Cluster, node and placement value types."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import numpy as np

__all__ = ["RESOURCES", "ClusterSpec", "NodeSpec", "Placement", "SimConfig"]

#: Resource dimensions, in this order, of every demand and capacity vector.
RESOURCES = ("cpu", "mem_gb", "gpu", "net_gbps")


def _nonneg(_inst: object, attr: attrs.Attribute, value: float) -> None:  # type: ignore[type-arg]
    if not value >= 0:
        raise ValueError(f"{attr.name}={value!r}: must be >= 0")


def _positive(_inst: object, attr: attrs.Attribute, value: float) -> None:  # type: ignore[type-arg]
    if not value > 0:
        raise ValueError(f"{attr.name}={value!r}: must be > 0")


@attrs.frozen
class NodeSpec:
    """Capacity of one server.

    Attributes:
        cpu: cores.
        mem_gb: memory in GB.
        gpu: GPUs.
        net_gbps: network bandwidth in Gbit/s.
    """

    cpu: float = attrs.field(default=32.0, validator=_nonneg)
    mem_gb: float = attrs.field(default=256.0, validator=_nonneg)
    gpu: int = attrs.field(default=4, validator=_nonneg)
    net_gbps: float = attrs.field(default=10.0, validator=_nonneg)

    def vector(self) -> np.ndarray:
        """Capacity as a vector over :data:`RESOURCES`."""
        return np.array([self.cpu, self.mem_gb, self.gpu, self.net_gbps], dtype=float)


def _node_tuple(nodes: Iterable[NodeSpec]) -> tuple[NodeSpec, ...]:
    return tuple(nodes)


def _int_tuple(values: Iterable[Any]) -> tuple[int, ...]:
    return tuple(int(x) for x in values)


@attrs.frozen
class ClusterSpec:
    """A set of servers.

    Attributes:
        nodes: the servers.
    """

    nodes: tuple[NodeSpec, ...] = attrs.field(converter=_node_tuple)

    @nodes.validator
    def _check(self, attribute: attrs.Attribute, value: tuple[NodeSpec, ...]) -> None:  # type: ignore[type-arg]
        if not value:
            raise ValueError("nodes: at least one node is required")

    @classmethod
    def homogeneous(cls, num_nodes: int, node: NodeSpec | None = None) -> ClusterSpec:
        """``num_nodes`` copies of ``node``."""
        if num_nodes < 1:
            raise ValueError(f"num_nodes={num_nodes}: must be >= 1")
        return cls(nodes=(node or NodeSpec(),) * num_nodes)

    @classmethod
    def pollux(cls, num_nodes: int = 16, gpus_per_node: int = 4) -> ClusterSpec:
        """The Pollux simulator's cluster: 16 nodes with 4 GPUs each."""
        return cls.homogeneous(num_nodes, NodeSpec(cpu=32, mem_gb=256, gpu=gpus_per_node))

    @classmethod
    def paper_ps(cls) -> ClusterSpec:
        """A 13-server cluster in the spirit of the Optimus testbed (CPU tasks, 10 GbE)."""
        return cls.homogeneous(13, NodeSpec(cpu=32, mem_gb=128, gpu=0, net_gbps=10.0))

    @property
    def num_nodes(self) -> int:
        """Number of servers."""
        return len(self.nodes)

    def capacity(self) -> np.ndarray:
        """``(num_nodes, 4)`` capacity matrix."""
        return np.stack([n.vector() for n in self.nodes])

    @property
    def total_gpus(self) -> int:
        """GPUs in the cluster."""
        return int(sum(n.gpu for n in self.nodes))


@attrs.frozen
class Placement:
    """Tasks of one job per node.

    Attributes:
        workers: worker (or GPU replica) count per node, one entry per node.
        ps: parameter-server count per node (all zero for all-reduce jobs).
        batch_size: global batch to train with, ``None`` to keep the job's current one.
    """

    workers: tuple[int, ...] = attrs.field(converter=_int_tuple)
    ps: tuple[int, ...] = attrs.field(converter=_int_tuple)
    batch_size: int | None = None

    def __attrs_post_init__(self) -> None:
        if len(self.workers) != len(self.ps):
            raise ValueError("workers and ps must have one entry per node")
        if any(x < 0 for x in self.workers) or any(x < 0 for x in self.ps):
            raise ValueError("task counts must be >= 0")

    @classmethod
    def of(
        cls, num_nodes: int, workers: dict[int, int], ps: dict[int, int] | None = None
    ) -> Placement:
        """Build from sparse ``{node: count}`` maps."""
        w = [0] * num_nodes
        p = [0] * num_nodes
        for k, v in workers.items():
            w[k] += v
        for k, v in (ps or {}).items():
            p[k] += v
        return cls(w, p)

    @property
    def num_workers(self) -> int:
        """Workers in total."""
        return sum(self.workers)

    @property
    def num_ps(self) -> int:
        """Parameter servers in total."""
        return sum(self.ps)

    @property
    def nodes_used(self) -> int:
        """Servers holding at least one task."""
        return sum(1 for w, p in zip(self.workers, self.ps, strict=True) if w or p)

    @property
    def gpu_shape(self) -> tuple[int, ...]:
        """Per-node worker counts of the used nodes (the Pollux placement form)."""
        return tuple(w for w in self.workers if w)

    def same_tasks(self, other: Placement | None) -> bool:
        """Whether ``other`` places the same tasks on the same nodes."""
        return other is not None and self.workers == other.workers and self.ps == other.ps

    def usage(self, worker_demand: np.ndarray, ps_demand: np.ndarray) -> np.ndarray:
        """``(num_nodes, 4)`` resources this placement uses."""
        w = np.asarray(self.workers, dtype=float)[:, None]
        p = np.asarray(self.ps, dtype=float)[:, None]
        used: np.ndarray = w * worker_demand[None, :] + p * ps_demand[None, :]
        return used


@attrs.frozen
class SimConfig:
    """Simulator settings.

    Attributes:
        interval_s: scheduling interval in seconds (default 60).
        restart_delay_s: pause of a job whose placement changes (checkpoint-restart).
        seed: seed of every random draw (noise, synthetic jobs).
        completion: ``"target"`` (validation metric reaches the model's target) or
            ``"epochs"`` (all profiled epochs, the Pollux artifact's rule) for GPU jobs.
        max_time_s: safety stop of the simulated clock.
        speed_noise: relative noise of measured speeds the schedulers see.
    """

    interval_s: float = attrs.field(default=60.0, validator=_positive)
    restart_delay_s: float = attrs.field(default=30.0, validator=_nonneg)
    seed: int = 0
    completion: str = attrs.field(
        default="target", validator=attrs.validators.in_(("target", "epochs"))
    )
    max_time_s: float = attrs.field(default=60 * 86400.0, validator=_positive)
    speed_noise: float = attrs.field(default=0.02, validator=_nonneg)
