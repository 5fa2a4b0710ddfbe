"""Readers of the user files of ``dynsched optimus`` (CSV and JSON).

Every reader raises :class:`InputFileError` naming the file, the line (CSV, or JSON syntax
errors) or the JSON path, and the field.  Formats (see also the package README):

* losses, CSV with header ``step,loss[,epoch]`` or JSON ``[{"step": .., "loss": ..}, ..]``;
* PS speeds, CSV ``ps,workers,speed`` or a JSON list of such objects;
* all-reduce step times, CSV ``gpus,nodes,local_bsz,step_time`` (Pollux's
  ``num_replicas``/``num_nodes`` or ``placement`` columns are accepted too);
* allocation, JSON ``{"resources": [..]?, "capacity": [..] | {name: value},
  "jobs": [{"id", "remaining_steps", "speed": {"mode", "theta", "global_batch"?},
  "ps_demand", "worker_demand", "damped"?, "max_ps"?, "max_workers"?}]}``;
* placement, JSON ``{"resources"?, "nodes": [[..], ..] | {"count": N, "capacity": [..]},
  "jobs": [{"id", "ps", "workers", "ps_demand", "worker_demand"}],
  "previous"?: {job_id: {"nodes", "ps_per_node", "workers_per_node"}}}``;
* parameter blocks, CSV ``name,size`` or JSON ``[{"name", "size"}]`` / ``[size, ..]``.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dynsched_optimus._allocation import RESOURCES, AllocationJob
from dynsched_optimus._errors import OptimusError
from dynsched_optimus._models_zoo import ParameterBlock
from dynsched_optimus._placement import JobPlacement, PlacementRequest
from dynsched_optimus._speed import PSSpeedModel, placement_shape

__all__ = [
    "InputFileError",
    "read_allocation_file",
    "read_allreduce_file",
    "read_blocks_file",
    "read_loss_file",
    "read_placement_file",
    "read_speed_file",
]


class InputFileError(OptimusError):
    """A malformed user file.

    Attributes:
        path: the file.
        line: 1-based line number, if known.
        field: the offending field or JSON path, if known.
    """

    def __init__(
        self, path: str | Path, message: str, *, line: int | None = None, field: str | None = None
    ) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        where = self.path + (f":{line}" if line is not None else "")
        what = f" field {field!r}:" if field else ""
        super().__init__(f"{where}:{what} {message}")


def _read_text(path: str | Path) -> str:
    p = Path(path)
    if not p.is_file():
        raise InputFileError(p, "no such file")
    try:
        return p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(p, f"cannot read: {exc}") from exc


def _is_json(path: str | Path, text: str) -> bool:
    return str(path).lower().endswith(".json") or text.lstrip()[:1] in ("[", "{")


def _load_json(path: str | Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(path, f"invalid JSON: {exc.msg}", line=exc.lineno) from exc


def _records(
    path: str | Path, required: Sequence[str], optional: Sequence[str] = ()
) -> list[tuple[int | None, str, dict[str, Any]]]:
    """Rows as ``(line, location, record)`` from a CSV (header) or a JSON list of objects."""
    text = _read_text(path)
    out: list[tuple[int | None, str, dict[str, Any]]] = []
    if _is_json(path, text):
        data = _load_json(path, text)
        if not isinstance(data, list):
            raise InputFileError(path, "expected a JSON list of objects")
        for i, rec in enumerate(data):
            if not isinstance(rec, dict):
                raise InputFileError(path, "expected an object", field=f"[{i}]")
            out.append((None, f"[{i}]", rec))
    else:
        lines = text.splitlines()
        if not lines or not lines[0].strip():
            raise InputFileError(path, "empty file: expected a header line", line=1)
        reader = csv.DictReader(lines)
        header = [h.strip() for h in (reader.fieldnames or [])]
        reader.fieldnames = header
        for row_no, row in enumerate(reader, start=2):
            if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
                continue
            if None in row:
                raise InputFileError(path, "more values than header columns", line=row_no)
            out.append((row_no, f"line {row_no}", {k: v for k, v in row.items()}))
    if not out:
        raise InputFileError(path, "no data rows")
    first = out[0][2]
    missing = [c for c in required if c not in first]
    if missing:
        raise InputFileError(
            path,
            f"missing column(s) {missing}; expected {list(required)}"
            + (f" and optionally {list(optional)}" if optional else ""),
            line=1 if out[0][0] is not None else None,
        )
    return out


def _num(
    path: str | Path,
    line: int | None,
    loc: str,
    rec: Mapping[str, Any],
    key: str,
    *,
    integer: bool = False,
    positive: bool = False,
    nonneg: bool = False,
) -> float:
    field = key if line is not None else f"{loc}.{key}"
    if key not in rec or rec[key] is None or (isinstance(rec[key], str) and not rec[key].strip()):
        raise InputFileError(path, "missing value", line=line, field=field)
    raw = rec[key]
    try:
        val = float(raw)
    except (TypeError, ValueError):
        raise InputFileError(path, f"not a number: {raw!r}", line=line, field=field) from None
    if not math.isfinite(val):
        raise InputFileError(path, f"not finite: {raw!r}", line=line, field=field)
    if integer and val != int(val):
        raise InputFileError(path, f"not an integer: {raw!r}", line=line, field=field)
    if positive and val <= 0:
        raise InputFileError(path, f"must be > 0, got {raw!r}", line=line, field=field)
    if nonneg and val < 0:
        raise InputFileError(path, f"must be >= 0, got {raw!r}", line=line, field=field)
    return val


def read_loss_file(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(steps, losses, epochs or None)`` from a loss file."""
    rows = _records(path, ("step", "loss"), ("epoch",))
    has_epoch = "epoch" in rows[0][2]
    steps, losses, epochs = [], [], []
    for line, loc, rec in rows:
        steps.append(_num(path, line, loc, rec, "step", nonneg=True))
        losses.append(_num(path, line, loc, rec, "loss", positive=True))
        if has_epoch:
            epochs.append(_num(path, line, loc, rec, "epoch", integer=True))
    return (
        np.array(steps),
        np.array(losses),
        np.array(epochs, dtype=np.int64) if has_epoch else None,
    )


def read_speed_file(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ps, workers, speed)`` from a PS speed file."""
    rows = _records(path, ("ps", "workers", "speed"))
    p, w, f = [], [], []
    for line, loc, rec in rows:
        p.append(_num(path, line, loc, rec, "ps", integer=True, positive=True))
        w.append(_num(path, line, loc, rec, "workers", integer=True, positive=True))
        f.append(_num(path, line, loc, rec, "speed", positive=True))
    return np.array(p), np.array(w), np.array(f)


def read_allreduce_file(
    path: str | Path,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(gpus, nodes, local_bsz, step_time)`` from an all-reduce profile file.

    Accepts ``gpus,nodes`` or Pollux's ``num_replicas,num_nodes`` (``scalability.csv``) or
    ``placement`` (``placements.csv``, one digit of GPUs per node).
    """
    text = _read_text(path)
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    if "placement" in first:
        rows = _records(path, ("placement", "local_bsz", "step_time"))
    elif "num_replicas" in first:
        rows = _records(path, ("num_nodes", "num_replicas", "local_bsz", "step_time"))
    else:
        rows = _records(path, ("gpus", "nodes", "local_bsz", "step_time"))
    g, n, b, t = [], [], [], []
    for line, loc, rec in rows:
        if "placement" in rec:
            raw = str(rec["placement"]).strip()
            if not raw.isdigit():
                raise InputFileError(
                    path,
                    f"placement must be digits (GPUs per node), got {raw!r}",
                    line=line,
                    field="placement",
                )
            gg, nn = placement_shape(raw)
        elif "num_replicas" in rec:
            gg = int(_num(path, line, loc, rec, "num_replicas", integer=True, positive=True))
            nn = int(_num(path, line, loc, rec, "num_nodes", integer=True, positive=True))
        else:
            gg = int(_num(path, line, loc, rec, "gpus", integer=True, positive=True))
            nn = int(_num(path, line, loc, rec, "nodes", integer=True, positive=True))
        if nn > gg:
            raise InputFileError(path, f"{nn} nodes for {gg} GPUs", line=line, field="nodes")
        g.append(gg)
        n.append(nn)
        b.append(_num(path, line, loc, rec, "local_bsz", positive=True))
        t.append(_num(path, line, loc, rec, "step_time", positive=True))
    return np.array(g, float), np.array(n, float), np.array(b), np.array(t)


def _vector(
    path: str | Path, value: Any, field: str, resources: Sequence[str]
) -> tuple[float, ...]:
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(resources))
        if unknown:
            raise InputFileError(
                path, f"unknown resource(s) {unknown}; resources are {list(resources)}", field=field
            )
        vals = [value.get(r, 0.0) for r in resources]
    elif isinstance(value, list | tuple):
        if len(value) != len(resources):
            raise InputFileError(
                path,
                f"expected {len(resources)} values ({list(resources)}), got {len(value)}",
                field=field,
            )
        vals = list(value)
    else:
        raise InputFileError(path, "expected a list or an object of resources", field=field)
    out = []
    for r, v in zip(resources, vals, strict=True):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise InputFileError(path, f"{r} must be a number >= 0, got {v!r}", field=field)
        out.append(float(v))
    return tuple(out)


def _json_object(path: str | Path) -> dict[str, Any]:
    data = _load_json(path, _read_text(path))
    if not isinstance(data, dict):
        raise InputFileError(path, "expected a JSON object")
    return data


def _resources(path: str | Path, data: Mapping[str, Any]) -> tuple[str, ...]:
    res = data.get("resources", list(RESOURCES))
    if not isinstance(res, list) or not res or not all(isinstance(r, str) for r in res):
        raise InputFileError(path, "expected a non-empty list of names", field="resources")
    return tuple(res)


def _get(path: str | Path, rec: Mapping[str, Any], key: str, loc: str) -> Any:
    if key not in rec:
        raise InputFileError(path, "missing", field=f"{loc}.{key}")
    return rec[key]


def _int_field(path: str | Path, rec: Mapping[str, Any], key: str, loc: str, lo: int) -> int:
    v = _get(path, rec, key, loc)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise InputFileError(path, f"must be an integer >= {lo}, got {v!r}", field=f"{loc}.{key}")
    return v


def _jobs(path: str | Path, data: Mapping[str, Any]) -> list[dict[str, Any]]:
    jobs = data.get("jobs")
    if not isinstance(jobs, list):
        raise InputFileError(path, "expected a list of job objects", field="jobs")
    for i, j in enumerate(jobs):
        if not isinstance(j, dict):
            raise InputFileError(path, "expected an object", field=f"jobs[{i}]")
        if "id" not in j:
            raise InputFileError(path, "missing", field=f"jobs[{i}].id")
    return jobs


def read_allocation_file(
    path: str | Path,
) -> tuple[list[AllocationJob], tuple[float, ...], tuple[str, ...]]:
    """``(jobs, capacity, resources)`` from an allocation JSON file."""
    data = _json_object(path)
    res = _resources(path, data)
    if "capacity" not in data:
        raise InputFileError(path, "missing", field="capacity")
    cap = _vector(path, data["capacity"], "capacity", res)
    out = []
    for i, j in enumerate(_jobs(path, data)):
        loc = f"jobs[{i}]"
        sp = _get(path, j, "speed", loc)
        if not isinstance(sp, dict):
            raise InputFileError(path, "expected an object", field=f"{loc}.speed")
        try:
            model = PSSpeedModel(
                mode=sp.get("mode", "sync"),
                theta=tuple(sp.get("theta", ())),
                global_batch=sp.get("global_batch"),
            )
        except (OptimusError, TypeError, ValueError) as exc:
            raise InputFileError(path, str(exc), field=f"{loc}.speed") from None
        q = _get(path, j, "remaining_steps", loc)
        if isinstance(q, bool) or not isinstance(q, int | float) or not math.isfinite(q):
            raise InputFileError(
                path, f"must be a number, got {q!r}", field=f"{loc}.remaining_steps"
            )
        if q < 0:
            raise InputFileError(
                path,
                f"must be >= 0 (steps still to train), got {q!r}",
                field=f"{loc}.remaining_steps",
            )
        try:
            out.append(
                AllocationJob(
                    job_id=str(j["id"]),
                    remaining_steps=float(q),
                    speed=model,
                    ps_demand=_vector(
                        path, _get(path, j, "ps_demand", loc), f"{loc}.ps_demand", res
                    ),
                    worker_demand=_vector(
                        path, _get(path, j, "worker_demand", loc), f"{loc}.worker_demand", res
                    ),
                    damped=bool(j.get("damped", False)),
                    max_ps=j.get("max_ps"),
                    max_workers=j.get("max_workers"),
                )
            )
        except InputFileError:
            raise
        except (OptimusError, TypeError) as exc:
            raise InputFileError(path, str(exc), field=loc) from None
    return out, cap, res


def read_placement_file(
    path: str | Path,
) -> tuple[list[PlacementRequest], np.ndarray, dict[str, JobPlacement], tuple[str, ...]]:
    """``(jobs, node_capacity, previous, resources)`` from a placement JSON file."""
    data = _json_object(path)
    res = _resources(path, data)
    nodes = data.get("nodes")
    if isinstance(nodes, dict):
        count = nodes.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InputFileError(
                path, f"must be an integer >= 1, got {count!r}", field="nodes.count"
            )
        row = _vector(path, nodes.get("capacity"), "nodes.capacity", res)
        cap = np.tile(np.array(row), (count, 1))
    elif isinstance(nodes, list) and nodes:
        cap = np.array([_vector(path, n, f"nodes[{i}]", res) for i, n in enumerate(nodes)])
    else:
        raise InputFileError(
            path, 'expected a list of capacities or {"count", "capacity"}', field="nodes"
        )
    reqs = []
    for i, j in enumerate(_jobs(path, data)):
        loc = f"jobs[{i}]"
        reqs.append(
            PlacementRequest(
                job_id=str(j["id"]),
                ps=_int_field(path, j, "ps", loc, 0),
                workers=_int_field(path, j, "workers", loc, 0),
                ps_demand=_vector(path, _get(path, j, "ps_demand", loc), f"{loc}.ps_demand", res),
                worker_demand=_vector(
                    path, _get(path, j, "worker_demand", loc), f"{loc}.worker_demand", res
                ),
            )
        )
    previous: dict[str, JobPlacement] = {}
    prev = data.get("previous", {})
    if not isinstance(prev, dict):
        raise InputFileError(path, "expected an object keyed by job id", field="previous")
    for jid, pl in prev.items():
        loc = f"previous.{jid}"
        if not isinstance(pl, dict):
            raise InputFileError(path, "expected an object", field=loc)
        try:
            vals = [
                list(map(int, _get(path, pl, k, loc)))
                for k in ("nodes", "ps_per_node", "workers_per_node")
            ]
        except (TypeError, ValueError):
            raise InputFileError(path, "expected lists of integers", field=loc) from None
        if not len(vals[0]) == len(vals[1]) == len(vals[2]):
            raise InputFileError(path, "lists of different lengths", field=loc)
        previous[str(jid)] = JobPlacement(
            job_id=str(jid),
            nodes=tuple(vals[0]),
            ps_per_node=tuple(vals[1]),
            workers_per_node=tuple(vals[2]),
        )
    return reqs, cap, previous, res


def read_blocks_file(path: str | Path) -> list[ParameterBlock]:
    """Parameter blocks from CSV ``name,size`` or JSON (objects or bare sizes)."""
    text = _read_text(path)
    if _is_json(path, text):
        data = _load_json(path, text)
        if (
            isinstance(data, list)
            and data
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in data)
        ):
            out = []
            for i, x in enumerate(data):
                if not (math.isfinite(x) and x > 0):
                    raise InputFileError(path, f"size must be > 0, got {x!r}", field=f"[{i}]")
                out.append(ParameterBlock(f"block{i}", int(x)))
            return out
    rows = _records(path, ("name", "size"))
    return [
        ParameterBlock(
            str(rec["name"]), int(_num(path, line, loc, rec, "size", integer=True, positive=True))
        )
        for line, loc, rec in rows
    ]
