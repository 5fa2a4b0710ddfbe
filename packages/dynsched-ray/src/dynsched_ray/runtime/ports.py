"""A free TCP port for a process group's rendezvous, chosen where the kernel does not hand
ports out on its own.

A port found by binding to port 0 comes from the kernel's ephemeral range, and the kernel
gives the same range to every outgoing connection and every other bind to port 0 on the
node. Between the moment a port is found and the moment rank 0 listens on it, a gloo
connection, a Ray worker or another test can be handed that very port, and the
rendezvous fails with ``EADDRINUSE`` (seen once in CI, at the third rendezvous of a
resize). `free_port` picks a port below the ephemeral range and above Ray's default
worker ports instead, checked free when picked: only a process that binds that exact
number can take it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["PORT_FLOOR", "ephemeral_range", "free_port"]

#: Lowest port `free_port` picks: above Ray's default worker ports (10002-19999).
PORT_FLOOR = 20_000
#: Linux's default ephemeral range, where /proc does not say.
_DEFAULT_EPHEMERAL = (32_768, 60_999)
_TRIES = 64


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        low, high = (int(x) for x in Path(path).read_text().split())
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL
    return low, high


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "", *, rng: random.Random | None = None) -> int:
    """A port of ``host`` that is free now, below the ephemeral range where one is (see
    the module docstring); else one the kernel picks (port 0).

    Args:
        host: The address to bind (``""``: every interface).
        rng: Where the candidates come from (default: a fresh, OS-seeded one).
    """
    pick = rng if rng is not None else random.Random()
    low = ephemeral_range()[0]
    if low - PORT_FLOOR >= _TRIES:
        for _ in range(_TRIES):
            port = pick.randrange(PORT_FLOOR, low)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
