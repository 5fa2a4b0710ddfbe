"""Ray token authentication: always on; any other ``RAY_AUTH_MODE`` is refused before Ray.

The subprocess tests start a real ``dynsched run --backend ray``, wait for its first
step line, then look at it from outside: clients without the token are refused, a client
with it joins; with ``--node-ip-address 127.0.0.1`` every listener of the run's processes
is on 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
from dynsched_core.errors import UsageError
from dynsched_ray.runtime.security import LOOPBACK, plan_ray_start
from hypothesis import given
from hypothesis import strategies as st

DYNSCHED = str(Path(sys.executable).with_name("dynsched"))
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")
START_BOUND_S = 240.0  # a loaded 2-core machine starts Ray in 3-30 s
CLIENT_BOUND_S = 240.0  # a refused client retries for about 20 s before it gives up


# -- the plan (no Ray) ---------------------------------------------------------------


def test_plan_default_is_a_token_cluster_where_ray_chooses_the_address() -> None:
    for environ in ({}, {"RAY_AUTH_MODE": "token"}):
        plan = plan_ray_start(None, environ=environ)
        assert not plan.loopback and plan.node_ip_address is None and plan.address is None


def test_plan_pins_a_new_local_cluster_to_loopback_when_asked() -> None:
    plan = plan_ray_start(None, LOOPBACK, environ={})
    assert plan.loopback and plan.node_ip_address == LOOPBACK
    assert not plan_ray_start("auto", LOOPBACK, environ={}).loopback  # joining: its settings


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("foo", "must be an IP address"),
        ("0.0.0.0", "one address of this machine"),
        ("::", "one address of this machine"),
        ("192.0.2.254", "not an address of this machine"),
    ],
)
def test_plan_refuses_a_bad_node_ip_address(value: str, match: str) -> None:
    if value in _local_addresses():
        pytest.skip(f"{value} is an address of this machine")
    with pytest.raises(UsageError, match=match):
        plan_ray_start(None, value, environ={})


REFUSED = (
    "RAY_AUTH_MODE must be 'token' or unset: dynsched runs Ray only with token authentication on"
)


@given(st.text(max_size=12) | st.sampled_from(["disabled", "DISABLED", "Token", " token", ""]))
def test_plan_refuses_every_ray_auth_mode_but_token(value: str) -> None:
    """Ray reads any RAY_AUTH_MODE but 'token' as off: dynsched refuses them all."""
    if value == "token":
        assert not plan_ray_start(None, environ={"RAY_AUTH_MODE": value}).loopback
    else:
        with pytest.raises(UsageError, match=REFUSED):
            plan_ray_start(None, environ={"RAY_AUTH_MODE": value})


@pytest.mark.parametrize("command", ["run", "train"])
@pytest.mark.parametrize(
    ("env_mode", "flags", "message"),
    [
        ("disabled", [], f"{REFUSED} (Ray reads any other value as off), got 'disabled'"),
        ("disable", [], f"{REFUSED} (Ray reads any other value as off), got 'disable'"),
        ("", [], f"{REFUSED} (Ray reads any other value as off), got ''"),
        (
            None,
            ["--node-ip-address", "foo"],
            "--node-ip-address must be an IP address of this machine (e.g. 127.0.0.1 or "
            "10.0.0.5), got 'foo'",
        ),
    ],
)
def test_cli_refuses_bad_auth_input_in_one_line_before_ray(
    tmp_path: Path, command: str, env_mode: str | None, flags: list[str], message: str
) -> None:
    env = _env_without_auth()
    if env_mode is not None:
        env["RAY_AUTH_MODE"] = env_mode
    args = ["--backend", "ray"] if command == "run" else []
    proc = subprocess.run(
        [DYNSCHED, command, *args, "--out", str(tmp_path), *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dynsched {command}: "), lines
    assert lines[0].endswith(message), lines
    assert "Ray instance" not in proc.stdout + proc.stderr


# -- a real run, looked at from outside ------------------------------------------------


def _local_addresses() -> set[str]:
    return {
        a.address.split("%")[0]
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family in (2, 10)  # AF_INET, AF_INET6
    }


def _env_without_auth(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


class _Run:
    """A ``dynsched run --backend ray`` subprocess whose output lines are collected."""

    def __init__(self, out: Path, env: dict[str, str], flags: Sequence[str] = ()) -> None:
        self.proc = subprocess.Popen(
            [
                DYNSCHED,
                "run",
                "--backend",
                "ray",
                "--steps",
                "2000",  # far more than the test needs: it is interrupted
                "--trainer-step-time",
                "0.2",
                "--num-cpus",
                "2",
                "--out",
                str(out),
                *flags,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text: str, bound_s: float = START_BOUND_S) -> None:
        """Block until a line containing ``text`` is printed (the run's own event)."""
        deadline = time.monotonic() + bound_s
        while not any(text in line for line in self.lines):
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no {text!r} line in {bound_s:.0f} s:\n" + "\n".join(self.lines))
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                pytest.fail(f"the run ended before {text!r}:\n" + "\n".join(self.lines))
            self.lines.append(line)

    def processes(self) -> list[psutil.Process]:
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def gcs_address(self) -> str:
        """The GCS address, as the raylet under the run was given it."""
        for p in self.processes():
            with _gone_ok():
                for arg in p.cmdline():
                    if arg.startswith("--gcs-address="):
                        return arg.split("=", 1)[1]
        pytest.fail("no Ray process under the run names the GCS address")

    def listeners(self) -> list[tuple[str, int, str]]:
        found = []
        for p in self.processes():
            with _gone_ok():
                name = p.name()
                for c in p.net_connections(kind="tcp"):
                    if c.status == psutil.CONN_LISTEN:
                        found.append((c.laddr.ip, c.laddr.port, name))
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C: the run's clean way out
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=60)


class _gone_ok:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, *_: Any) -> bool:
        return kind is not None and issubclass(kind, psutil.Error)


@pytest.fixture
def run_factory(tmp_path: Path) -> Iterator[Any]:
    runs: list[_Run] = []

    def start(env: dict[str, str], flags: Sequence[str] = ()) -> _Run:
        run = _Run(tmp_path / f"out{len(runs)}", env, flags)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.stop()


CLIENT = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
print("JOINED", sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)))
"""

JOIN_LIKE_THE_CLI = """
import sys, ray
from dynsched_ray.runtime.security import init_ray, plan_ray_start
init_ray(ray, plan_ray_start(sys.argv[1]), namespace=None, prog="client")
print("JOINED", sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)))
"""


def _client(code: str, address: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, address],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_a_run_refuses_clients_without_its_token(tmp_path: Path, run_factory: Any) -> None:
    home = tmp_path / "home"  # the run's own ~/.ray/auth_token, made by Ray
    home.mkdir()
    stranger = tmp_path / "stranger"  # no token anywhere
    stranger.mkdir()
    run = run_factory(_env_without_auth(HOME=str(home)))
    run.wait_for("step 1/")
    token_file = home / ".ray" / "auth_token"
    token = token_file.read_text().strip()
    assert len(token) >= 32
    assert token_file.stat().st_mode & 0o077 == 0  # Ray writes it 0644; dynsched: 0600
    address = run.gcs_address()

    refused = {
        "no token": _client(CLIENT, address, _env_without_auth(HOME=str(stranger))),
        "a wrong token": _client(
            CLIENT,
            address,
            _env_without_auth(HOME=str(stranger), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="f" * 32),
        ),
    }
    cli_join = subprocess.Popen(
        [DYNSCHED, "run", "--backend", "ray", "--address", address, "--out", str(tmp_path / "j")],
        env=_env_without_auth(HOME=str(stranger)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for why, client in refused.items():
        out, _ = client.communicate(timeout=CLIENT_BOUND_S)
        assert client.returncode != 0, f"{why}: joined\n{out}"
        assert "JOINED" not in out
        assert "Unauthenticated" in out or "InvalidAuthToken" in out, f"{why}:\n{out}"
    out, err = cli_join.communicate(timeout=CLIENT_BOUND_S)
    assert cli_join.returncode == 1, out + err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if "dynsched run" in line] == [
        f"dynsched run: error: could not join the Ray cluster at {address!r}: no Ray auth "
        "token on this machine: copy the cluster's token (`ray get-auth-token` on its head "
        "node) into ~/.ray/auth_token, or set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
    ]

    for env in (
        _env_without_auth(HOME=str(stranger), RAY_AUTH_TOKEN=token),
        _env_without_auth(HOME=str(home)),
    ):
        client = _client(JOIN_LIKE_THE_CLI, address, env)
        out, _ = client.communicate(timeout=CLIENT_BOUND_S)
        assert client.returncode == 0, out
        assert "JOINED" in out and "dynsched" in out.split("JOINED", 1)[1], out  # its actors
    assert run.proc.poll() is None  # the run went on


def _is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


@pytest.mark.slow
def test_node_ip_loopback_keeps_every_listener_on_this_machine(run_factory: Any) -> None:
    run = run_factory(_env_without_auth(), ["--node-ip-address", LOOPBACK])
    run.wait_for("step 1/")
    listeners = run.listeners()
    names = {name for _, _, name in listeners}
    assert {"gcs_server", "raylet"} <= names, listeners  # the cluster's own, and workers'
    assert len(listeners) >= 4, listeners
    assert run.gcs_address().startswith(f"{LOOPBACK}:")
    open_ = [(ip, port, name) for ip, port, name in listeners if not _is_loopback(ip)]
    assert open_ == [], f"listening beyond loopback: {open_}"


def test_nothing_in_the_repository_turns_ray_authentication_off() -> None:
    """Every script, config, benchmark or test that sets RAY_AUTH_MODE sets it to token."""
    import re

    root = Path(__file__).resolve().parents[3]
    # Python/TOML: an assignment, dict entry or keyword (the name, `=` or `:`, a quoted
    # value), or a setdefault/setenv/putenv call with the name and a quoted value;
    # shell: an assignment
    setting = re.compile(
        r"""RAY_AUTH_MODE["'\]]*\s*[:=]\s*["']([^"']*)["']"""
        r"""|(?:setdefault|setenv|putenv)\(\s*["']RAY_AUTH_MODE["']\s*,\s*["']([^"']*)["']"""
    )
    shell = re.compile(r"RAY_AUTH_MODE=([^\s;]*)")
    found = []
    for pattern in ("**/*.py", "**/*.toml", "**/*.sh", ".ci/*", "**/*.cfg", "**/*.ini"):
        for path in root.glob(pattern):
            parts = set(path.relative_to(root).parts)
            if parts & {".git", ".hatch", ".venv", "build"} or not path.is_file():
                continue
            text = path.read_text(errors="replace")
            is_shell = path.suffix == ".sh" or path.parent.name == ".ci"
            values = ["".join(m) for m in setting.findall(text)]
            values += shell.findall(text) if is_shell else []
            found += [f"{path.relative_to(root)}: {v}" for v in values if v.strip("\"'") != "token"]
    assert found == []
