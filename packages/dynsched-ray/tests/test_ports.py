"""`free_port`: a rendezvous port outside the kernel's ephemeral range, free when picked."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest
from dynsched_ray.runtime import ports
from dynsched_ray.runtime.ports import PORT_FLOOR, ephemeral_range, free_port


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    low, _high = ephemeral_range()
    for seed in range(20):
        port = free_port("127.0.0.1", rng=random.Random(seed))
        assert PORT_FLOOR <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # free: binding it works


def test_a_taken_port_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", free_port("127.0.0.1")))
        held.listen()
        taken = held.getsockname()[1]
        first = iter([taken])
        real = random.Random(1)

        class Scripted(random.Random):
            def randrange(self, *a: int) -> int:  # type: ignore[override]
                return next(first, None) or real.randrange(*a)

        port = free_port("127.0.0.1", rng=Scripted())
        assert port != taken and PORT_FLOOR <= port < ephemeral_range()[0]


def test_without_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (PORT_FLOOR + 10, 60_999))
    port = free_port("127.0.0.1")
    assert port > 0


def test_the_range_is_read_and_defaults_where_it_cannot_be(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ephemeral_range(str(f)) == (40_000, 50_000)
    assert ephemeral_range(str(tmp_path / "missing")) == (32_768, 60_999)
    f.write_text("garbage")
    assert ephemeral_range(str(f)) == (32_768, 60_999)
