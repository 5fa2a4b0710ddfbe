"""Hatch environment collector of the dynsched workspace (``[tool.hatch.env.collectors.custom]``).

The hatch environments install with uv, because uv honours the dependency overrides that the
vLLM CPU build needs (``.ci/uv-overrides.txt``). uv does not read pip's configuration. On a
machine whose pip is configured with a local wheel folder (``pip config get global.find-links``,
e.g. one that holds the CPU build of torch), this collector hands that folder to uv as
``UV_FIND_LINKS``, so ``hatch run test`` finds the same wheels pip would and never downloads a
multi-GB CUDA torch. Nothing machine-specific is committed: the folder is read when hatch runs.
An explicit ``UV_FIND_LINKS`` in the environment wins.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from hatch.env.collectors.plugin.interface import EnvironmentCollectorInterface


def _pip_find_links() -> str:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _inherits_env_vars(name: str, env: dict[str, Any]) -> bool:
    """Whether hatch will give ``env`` its template's ``env-vars`` (it defines none itself)."""
    if "env-vars" in env or env.get("detached", False):
        return False
    return env.get("template", "default") != name


class PipFindLinksForUv(EnvironmentCollectorInterface):
    """Set ``UV_FIND_LINKS`` from pip's ``global.find-links`` for every uv environment.

    Collectors see the configuration before hatch applies ``template``: an environment that
    defines no ``env-vars`` of its own is left alone, so that it still inherits its
    template's (which get the folder here), instead of an ``env-vars`` table holding only
    ``UV_FIND_LINKS`` that would hide them.
    """

    def finalize_config(self, config: dict[str, dict[str, Any]]) -> None:
        if os.environ.get("UV_FIND_LINKS"):
            return
        links = None
        for name, env in config.items():
            if _inherits_env_vars(name, env):
                continue
            env_vars = env.setdefault("env-vars", {})
            if "UV_FIND_LINKS" in env_vars:
                continue
            if links is None:
                links = _pip_find_links()
            if links:
                env_vars["UV_FIND_LINKS"] = links
