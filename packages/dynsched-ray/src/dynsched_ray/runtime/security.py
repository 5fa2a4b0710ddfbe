"""How ``dynsched run`` and ``dynsched train`` start or join Ray: token authentication on.

Ray runs code sent to any of its listeners (the GCS, every raylet, every worker and the
driver). With token authentication on (Ray's default for a new local cluster, and what
this module asks for explicitly) a client must present the cluster's token, kept in
``~/.ray/auth_token`` (or ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``), or it is
refused. dynsched never runs Ray with authentication off: any ``RAY_AUTH_MODE`` but
``token`` (or none) is refused in one line before Ray starts, because Ray reads every other
value as "off" and then listens, without a token, on every interface.

Both commands call `plan_ray_start` while they check their flags (bad values are a
`UsageError`, before Ray starts) and `init_ray` to start or join the cluster.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Mapping
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
        loopback: every listener of the new local cluster binds to ``127.0.0.1``
            (``--node-ip-address 127.0.0.1``).
    """

    address: str | None
    node_ip_address: str | None
    loopback: bool


def _check_auth_mode(environ: Mapping[str, str]) -> None:
    """Refuse any ``RAY_AUTH_MODE`` but ``token`` (unset is fine: token is Ray's default)."""
    raw = environ.get(AUTH_MODE_ENV)
    if raw is not None and raw != "token":
        raise UsageError(
            f"{AUTH_MODE_ENV} must be 'token' or unset: dynsched runs Ray only with token "
            f"authentication on (Ray reads any other value as off), got {raw!r}"
        )


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
        UsageError: a ``RAY_AUTH_MODE`` other than ``token``, or a ``--node-ip-address``
            that is not an address of this machine.
    """
    _check_auth_mode(os.environ if environ is None else environ)
    ip = _check_node_ip(node_ip_address) if node_ip_address is not None else None
    loopback = ip is not None and ipaddress.ip_address(ip).is_loopback
    return RayStartPlan(
        address=address or None,
        node_ip_address=ip,
        loopback=loopback and not address,
    )


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
    **local: Any,
) -> None:
    """Start a new local Ray cluster, or join ``plan.address``, as the plan says.

    Args:
        ray: the ``ray`` module.
        plan: from `plan_ray_start`.
        namespace: Ray namespace of the named actors.
        prog: the command's name (e.g. ``"dynsched run"``), in the log line.
        **local: ``ray.init`` arguments of a new local cluster (``num_cpus``, ...).

    Raises:
        ConnectionError: Ray could not join the cluster, or a loopback-only cluster did
            not come up on 127.0.0.1; one line, with what to do about a token.
    """
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
            hint = f" (a cluster with token authentication refuses a missing or wrong token: {TOKEN_HINT})"
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
    _keep_token_private()
    if plan.loopback:
        got = context.address_info.get("node_ip_address")
        if got != LOOPBACK:  # fail closed: never a cluster without a token on the network
            ray.shutdown()
            raise ConnectionError(
                f"Ray did not bind to {LOOPBACK} (node address {got!r}) as --node-ip-address asked"
            )
    logger.debug("%s: Ray started: %s", prog, plan)
