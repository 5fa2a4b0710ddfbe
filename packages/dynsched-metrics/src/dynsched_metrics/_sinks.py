"""Exporters (flat dict, JSON lines) and their discovery through entry points.

Sinks are plug-ins of the entry-point group ``dynsched.metrics_sinks``, read through
dynsched's one plug-in loader (`dynsched_core.plugins`), so they follow its rules: a name
two distributions provide is refused with both named, an unknown name is answered with
the known names and the closest match.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from typing import IO, Any

from dynsched_core.plugins import PluginError, PluginGroup

from dynsched_metrics._aggregator import CycleMetrics, MetricsSink

__all__ = [
    "SINK_ENTRY_POINT_GROUP",
    "DictSink",
    "JsonLinesSink",
    "SinkLookupError",
    "available_sinks",
    "build_sink",
    "read_json_lines",
    "to_flat_dict",
]

logger = logging.getLogger(__name__)

#: Entry-point group where exporters register (``name = "module:factory"``); the
#: factory is called with the keyword arguments given to `build_sink`.
SINK_ENTRY_POINT_GROUP = "dynsched.metrics_sinks"


def to_flat_dict(record: CycleMetrics, prefix: str = "") -> dict[str, float]:
    """The record's metrics as ``{prefix + key: value}`` (wandb / TensorBoard ready).

    Use with ``wandb.log(to_flat_dict(r), step=r.step)`` or
    ``for k, v in to_flat_dict(r).items(): writer.add_scalar(k, v, r.step)``.
    """
    return {f"{prefix}{k}": v for k, v in record.metrics.items()}


class DictSink:
    """Keeps one flat dict per cycle and optionally forwards it to a logger callback.

    Args:
        callback: ``callback(metrics, step)`` per cycle, e.g.
            ``lambda m, s: wandb.log(m, step=s)``.
        prefix: Prepended to every key.

    Attributes:
        rows: ``{"step": s, <keys>...}`` per cycle, in order.
    """

    def __init__(
        self, callback: Callable[[dict[str, float], int], Any] | None = None, prefix: str = ""
    ) -> None:
        self.callback = callback
        self.prefix = prefix
        self.rows: list[dict[str, float]] = []

    def write(self, record: CycleMetrics) -> None:
        """Store (and forward) the record's flat dict."""
        flat = to_flat_dict(record, self.prefix)
        self.rows.append({"step": record.step, **flat})
        if self.callback is not None:
            self.callback(flat, record.step)

    def close(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return f"DictSink(rows={len(self.rows)})"


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonLinesSink:
    """Writes one JSON object per cycle: ``{"step", "cycle", <keys>...}``.

    Args:
        path: Output file (parent folders are created).
        append: Append instead of truncating an existing file.
        extra: Constant fields added to every line (e.g. ``{"run": "dynamic-16-16"}``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        append: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.extra = dict(extra or {})
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self._fh: IO[str] | None = open(self.path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115

    def write(self, record: CycleMetrics) -> None:
        """Append the record as one whole line (one write), flush and fsync it.

        A crash or a full disk can at worst leave a truncated last line, which
        `read_json_lines` skips.
        """
        if self._fh is None:
            raise ValueError(f"JsonLinesSink({self.path!r}) is closed")
        row = {**self.extra, **{k: _json_safe(v) for k, v in record.as_dict().items()}}
        self._fh.write(json.dumps(row, sort_keys=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def flush(self) -> None:
        """Flush buffered lines."""
        if self._fh is not None:
            self._fh.flush()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> JsonLinesSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JsonLinesSink({self.path!r})"


def read_json_lines(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read back a file written by `JsonLinesSink` (a truncated last line, which a crash
    or a full disk can leave, is skipped; a bad line elsewhere raises ``ValueError``)."""
    with open(path, encoding="utf-8") as fh:
        lines = [line for line in fh if line.strip()]
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except ValueError:
            if i < len(lines) - 1:
                raise
            logger.info("%s: skipping a truncated last line", os.fspath(path))
    return out


class SinkLookupError(PluginError, KeyError):
    """A metrics sink name is unknown, provided by two distributions, or fails to load."""

    def __str__(self) -> str:  # not KeyError's quoted repr
        return str(self.args[0]) if self.args else ""


def _sinks() -> PluginGroup:
    return PluginGroup(SINK_ENTRY_POINT_GROUP, kind="metrics sink", error=SinkLookupError)


def available_sinks() -> list[str]:
    """Names registered in the ``dynsched.metrics_sinks`` entry-point group, sorted."""
    return _sinks().names()


def build_sink(name: str, **kwargs: Any) -> MetricsSink:
    """Build the exporter registered as ``name`` with ``kwargs``.

    Built-ins: ``dict`` (`DictSink`), ``jsonl`` (`JsonLinesSink`, needs ``path``),
    ``prometheus`` (`PrometheusSink`, needs the ``prometheus`` extra).

    Raises:
        SinkLookupError: unknown name (the message lists the available ones and a close
            match), a name two distributions provide, or a sink that fails to import (a
            ``KeyError`` too).
    """
    factory = _sinks().load(name)
    sink = factory(**kwargs)
    if not isinstance(sink, MetricsSink):
        raise TypeError(f"metrics sink {name!r} built {sink!r}, which has no write()/close()")
    return sink
