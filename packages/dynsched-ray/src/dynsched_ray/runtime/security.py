"""How ``dynsched run`` and ``dynsched train`` start or join Ray: token authentication on.

Ray runs code sent to any of its listeners (the GCS, every raylet, every worker and the
driver). With token authentication on (Ray's default for a new local cluster, and what
this module asks for explicitly) a client must present the cluster's token, kept in
``~/.ray/auth_token`` (or ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``), or it is
refused. A user who turns authentication off (``RAY_AUTH_MODE=disabled``) gets a local
cluster whose every listener binds to ``127.0.0.1``, unless they name the address to
listen on (``--node-ip-address``) or join a cluster of their own (``--address``); the
command says so in one line.

Both commands call `plan_ray_start` while they check their flags (bad values are a
`UsageError`, before Ray starts) and `init_ray` to start or join the cluster.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from dynsched_core.errors import UsageError

__all__ = ["LOOPBACK", "RayStartPlan", "init_ray", "plan_ray_start"]

logger = logging.getLogger(__name__)

#: Every listener of a local cluster without authentication binds here.
LOOPBACK = "127.0.0.1"

AUTH_MODE_ENV = "RAY_AUTH_MODE"

#: Where a joining machine finds the cluster's token (what the one-line errors name).
TOKEN_HINT = (
    "copy the cluster's token (`ray get-auth-token` on its head node) into "
    "~/.ray/auth_token, or set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
)

# Ray binds its gRPC servers to 127.0.0.1 only when the node's address is 127.0.0.1, and
# rewrites a loopback ``_node_ip_address`` to the machine's address unless Ray clusters
# are "not enabled" on this platform (its Windows/macOS switch, read once at import).
_LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@attrs.frozen
class RayStartPlan:
    """How to start or join Ray, decided from the flags and the environment.

    Attributes:
        address: the cluster to join (``--address``); None starts a new local one.
        node_ip_address: the address Ray's listeners advertise (and, for ``127.0.0.1``,
            bind to); None lets Ray choose.
        token_auth: whether Ray token authentication is on.
        loopback: every listener of the new local cluster binds to ``127.0.0.1``.
        note: the one line the command prints about it, or None.
    """

    address: str | None
    node_ip_address: str | None
    token_auth: bool
    loopback: bool
    note: str | None


def _auth_mode(environ: Mapping[str, str]) -> str | None:
    """``RAY_AUTH_MODE`` normalised to ``token``/``disabled``, or None when unset."""
    raw = environ.get(AUTH_MODE_ENV)
    if raw is None:
        return None
    mode = raw.strip().lower()
    if mode not in ("token", "disabled") or raw != raw.strip():
        # Ray reads any other value (an empty one, a typo) as "disabled", silently.
        raise UsageError(
            f"{AUTH_MODE_ENV} must be 'token' (also when unset; keep it) or Ray's exact "
            f"off value, got {raw!r}"
        )
    return mode


def _check_node_ip(value: str) -> str:
    try:
        ip = ipaddress.ip_address(value.strip())
    except ValueError:
        raise UsageError(
            "--node-ip-address must be an IP address of this machine (e.g. 127.0.0.1 or "
            f"10.0.0.5), got {value!r}"
        ) from None
    if ip.is_unspecified or ip.is_multicast:
        raise UsageError(
            f"--node-ip-address must be one address of this machine, not {value!r} "
            "(Ray listens on every interface unless the address is 127.0.0.1)"
        )
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(ip), 0))
    except OSError:
        raise UsageError(f"--node-ip-address {value!r} is not an address of this machine") from None
    return str(ip)


def plan_ray_start(
    address: str | None,
    node_ip_address: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> RayStartPlan:
    """Decide how to start or join Ray; cheap, and called before Ray starts.

    Args:
        address: ``--address`` (a cluster to join), or None for a new local cluster.
        node_ip_address: ``--node-ip-address``, or None.
        environ: the environment (default ``os.environ``).

    Returns:
        The plan `init_ray` follows.

    Raises:
        UsageError: a ``RAY_AUTH_MODE`` Ray would silently read as "disabled", or a
            ``--node-ip-address`` that is not an address of this machine.
    """
    env = os.environ if environ is None else environ
    mode = _auth_mode(env)
    ip = _check_node_ip(node_ip_address) if node_ip_address is not None else None
    token_auth = mode != "disabled"
    loopback = ip is not None and ipaddress.ip_address(ip).is_loopback
    note = None
    if not token_auth:
        if address:
            note = (
                f"Ray token authentication is off ({AUTH_MODE_ENV}=disabled): joining the "
                f"cluster at {address} without a token"
            )
        elif ip is None or loopback:
            loopback = True
            note = (
                f"Ray token authentication is off ({AUTH_MODE_ENV}=disabled): the local Ray "
                f"cluster listens on {LOOPBACK} only (--node-ip-address ADDR would open it "
                "to the network without a token)"
            )
        else:
            note = (
                f"Ray token authentication is off ({AUTH_MODE_ENV}=disabled) and the local "
                f"Ray cluster listens on every interface (--node-ip-address {ip}): anyone "
                "who reaches this machine can run code as you"
            )
    if loopback:
        ip = LOOPBACK
    return RayStartPlan(
        address=address or None,
        node_ip_address=ip,
        token_auth=token_auth,
        loopback=loopback and not address,
        note=note,
    )


def _say_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _set_auth_mode(mode: str) -> None:
    """Make this process and its children use Ray auth ``mode``.

    Ray caches its settings when it is imported; ``ray.init`` itself re-reads them the
    same way when it turns authentication on by default.
    """
    if os.environ.get(AUTH_MODE_ENV) == mode:
        return
    os.environ[AUTH_MODE_ENV] = mode
    from ray._raylet import Config

    Config.initialize("")


def _keep_token_private() -> None:
    """Make the token file readable by its owner only (Ray writes it with the umask)."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(
        os.path.expanduser("~"), ".ray", "auth_token"
    )
    try:
        info = os.stat(path)
        mine = info.st_uid == getattr(os, "getuid", lambda: info.st_uid)()
        if info.st_mode & 0o077 and mine:
            os.chmod(path, 0o600)
            logger.info("made the Ray token file %s readable by its owner only", path)
    except OSError as exc:  # no file (RAY_AUTH_TOKEN), another owner's: leave it
        logger.debug("token file %s left as it is: %s", path, exc)


def _pin_loopback() -> None:
    """Make Ray take ``127.0.0.1`` as this node's address (its listeners then bind there)."""
    os.environ[_LOCAL_ONLY_ENV] = "0"  # Ray's child processes read it at import
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported Ray already


def init_ray(
    ray: Any,
    plan: RayStartPlan,
    *,
    namespace: str | None,
    prog: str,
    say: Callable[[str], None] = _say_stderr,
    **local: Any,
) -> None:
    """Start a new local Ray cluster, or join ``plan.address``, as the plan says.

    Args:
        ray: the ``ray`` module.
        plan: from `plan_ray_start`.
        namespace: Ray namespace of the named actors.
        prog: the command's name, prefix of its one line (e.g. ``"dynsched run"``).
        say: prints the plan's one line.
        **local: ``ray.init`` arguments of a new local cluster (``num_cpus``, ...).

    Raises:
        ConnectionError: Ray could not join the cluster, or a loopback-only cluster did
            not come up on 127.0.0.1; one line, with what to do about a token.
    """
    if plan.note:
        say(f"{prog}: {plan.note}")
    if plan.token_auth:
        _set_auth_mode("token")  # also when joining: an explicit address would not
    if plan.address:
        kwargs: dict[str, Any] = {}
        if plan.node_ip_address is not None:
            kwargs["_node_ip_address"] = plan.node_ip_address
        try:
            ray.init(address=plan.address, namespace=namespace, log_to_driver=False, **kwargs)
        except ray.exceptions.AuthenticationError:
            raise ConnectionError(f"no Ray auth token on this machine: {TOKEN_HINT}") from None
        except ConnectionError as exc:
            hint = (
                f" (a cluster with token authentication refuses a missing or wrong token: "
                f"{TOKEN_HINT})"
                if plan.token_auth
                else ""
            )
            raise ConnectionError(f"{str(exc).splitlines()[0]}{hint}") from None
        return
    if plan.loopback:
        _pin_loopback()
    kwargs = dict(local)
    kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("dashboard_host", LOOPBACK)  # if a dashboard is asked for
    if plan.node_ip_address is not None:
        kwargs["_node_ip_address"] = plan.node_ip_address
    context = ray.init(
        address="local",  # a new local cluster, never another one found on the machine
        namespace=namespace,
        log_to_driver=False,
        **kwargs,
    )
    if plan.token_auth:
        _keep_token_private()
    if plan.loopback:
        got = context.address_info.get("node_ip_address")
        if got != LOOPBACK:  # fail closed: never a cluster without a token on the network
            ray.shutdown()
            raise ConnectionError(
                f"Ray did not bind to {LOOPBACK} (node address {got!r}) with token "
                f"authentication off; unset {AUTH_MODE_ENV} to use a token"
            )
    logger.debug("Ray started: %s", plan)
