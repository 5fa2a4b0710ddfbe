"""Locate the vendored Pollux traces (``../shared/data/pollux`` from the repository root)."""

from __future__ import annotations

import os
from pathlib import Path


def pollux_traces() -> Path | None:
    env = os.environ.get("DYNSCHED_POLLUX_DATA")
    if env and (Path(env) / "traces").is_dir():
        return Path(env) / "traces"
    for parent in Path(__file__).resolve().parents:
        for cand in (parent / "shared" / "data" / "pollux", parent / "data" / "pollux"):
            if (cand / "traces").is_dir():
                return cand / "traces"
    return None
