"""``dynsched optimus``: fit models, allocate, place and assign parameters on user files.

Sub-commands (file formats in :mod:`dynsched_optimus._io` and the package README)::

    dynsched optimus fit convergence LOSSES.csv [--delta D --interval I --confidence C]
    dynsched optimus fit async|sync SPEEDS.csv [--global-batch M]
    dynsched optimus fit allreduce PROFILE.csv
    dynsched optimus allocate JOBS.json [--damping 0.95]
    dynsched optimus place PLACEMENT.json [--shrink] [--fill] [--strategy fewest|spread|align]
    dynsched optimus paa (--model resnet50 | --blocks BLOCKS.csv) --ps N [--method all]

Every command accepts ``--json`` for machine-readable output.  Malformed input gives exit
status 2 and one line naming the file, line or JSON path, and field.  The cluster
simulator adds ``simulate`` and ``compare`` (from :mod:`dynsched_optimus.cluster.cli`) when
it is importable; if it is not, the commands above still work.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from dynsched_optimus._allocation import allocate
from dynsched_optimus._cli_support import Handler, add_option, one_line_errors
from dynsched_optimus._convergence import (
    ConvergenceConfig,
    ConvergenceFit,
    RemainingStepsInterval,
    fit_convergence,
    remaining_steps_interval,
)
from dynsched_optimus._errors import OptimusError
from dynsched_optimus._io import (
    read_allocation_file,
    read_allreduce_file,
    read_blocks_file,
    read_loss_file,
    read_placement_file,
    read_speed_file,
)
from dynsched_optimus._models_zoo import MODEL_ZOO, model_blocks
from dynsched_optimus._paa import PARAMETER_ASSIGNMENTS
from dynsched_optimus._placement import STRATEGIES, place
from dynsched_optimus._speed import AllReduceSpeedModel, fit_speed

__all__ = ["build_parser", "main", "register"]

logger = logging.getLogger(__name__)


def _emit(args: argparse.Namespace, payload: dict[str, Any], lines: list[str]) -> None:
    if args.json:
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        print("\n".join(lines))


#: Fields of a :class:`ConvergenceFit` printed by ``fit convergence --json``.
_CONVERGENCE_FIELDS = (
    "b0",
    "b1",
    "b2",
    "loss_scale",
    "origin_step",
    "fit_error",
    "n_points",
    "n_observed",
    "n_outliers",
    "lr_decay_step",
)

Report = tuple[dict[str, Any], list[str]]


def _fit_convergence(args: argparse.Namespace) -> Report:
    steps, losses, epochs = read_loss_file(args.file)
    cfg = ConvergenceConfig(
        delta=args.delta,
        interval=args.interval,
        recency_half_life=args.recency_half_life,
        detect_lr_decay=not args.no_decay,
        average_per_epoch=args.average_per_epoch and epochs is not None,
    )
    fit = fit_convergence(steps, losses, epochs=epochs, config=cfg)
    cur = float(steps.max())
    iv = remaining_steps_interval(
        steps,
        losses,
        cur,
        epochs=epochs,
        config=cfg,
        confidence=args.confidence,
        n_boot=args.bootstrap,
    )
    payload = {
        "model": "convergence",
        **{name: getattr(fit, name) for name in _CONVERGENCE_FIELDS},
        "current_step": cur,
        "remaining_steps": iv.estimate,
        "remaining_low": iv.low,
        "remaining_high": iv.high,
        "confidence": iv.confidence,
    }
    return payload, _convergence_lines(fit, cur, iv)


def _convergence_lines(fit: ConvergenceFit, cur: float, iv: RemainingStepsInterval) -> list[str]:
    lines = [
        f"l(k) = 1/({fit.b0:.6g}*(k - {fit.origin_step:g}) + {fit.b1:.6g}) + {fit.b2:.6g}"
        f"   (normalised by {fit.loss_scale:.6g})",
        f"fit error (RMSE, normalised loss): {fit.fit_error:.4g} on {fit.n_points} points "
        f"({fit.n_observed} observed, {fit.n_outliers} outliers dropped, steps "
        f"{fit.first_step:g}..{fit.last_step:g})",
    ]
    if fit.lr_decay_step is not None:
        lines.append(f"learning-rate decay detected at step {fit.lr_decay_step:g}: fit restarted")
    lines.append(
        f"remaining steps from {cur:g}: {iv.estimate:.0f} "
        f"({iv.confidence:.0%} interval {iv.low:.0f}..{iv.high:.0f})"
    )
    return lines


def _fit_speed(args: argparse.Namespace) -> Report:
    kind = args.model
    p, w, f = read_speed_file(args.file)
    if kind == "sync" and args.global_batch is None:
        raise OptimusError("--global-batch is required for the sync model")
    model = fit_speed(kind, p, w, f, global_batch=args.global_batch)
    payload = {
        "model": kind,
        "theta": list(model.theta),
        "global_batch": model.global_batch,
        "fit_error": model.fit_error,
        "n_points": model.n_points,
        "configs": [list(c) for c in model.configs],
    }
    lines = [
        f"{kind} speed model theta = {', '.join(f'{t:.6g}' for t in model.theta)}",
        f"fit error (RMS relative speed error): {model.fit_error:.2%} on {model.n_points} "
        f"points, {len(model.configs)} configurations",
    ]
    return payload, lines


def _fit_allreduce(args: argparse.Namespace) -> Report:
    g, n, b, t = read_allreduce_file(args.file)
    ar = AllReduceSpeedModel.fit(g, n, b, t)
    rel = np.abs(ar.step_time(g, n, b) / t - 1.0)
    payload = {
        "model": "allreduce",
        "coefficients": list(ar.coefficients),
        "gamma": ar.gamma,
        "median_rel_error": float(np.median(rel)),
        "mean_rel_error": float(np.mean(rel)),
        "n_points": ar.n_points,
    }
    lines = [
        f"all-reduce model coefficients = {', '.join(f'{c:.4g}' for c in ar.coefficients)}, "
        f"gamma = {ar.gamma:.3g}",
        f"step-time relative error: median {np.median(rel):.2%}, mean {np.mean(rel):.2%} "
        f"on {ar.n_points} points",
    ]
    return payload, lines


#: ``fit MODEL``: the reader and fitter of each model.
_FITTERS: dict[str, Callable[[argparse.Namespace], Report]] = {
    "convergence": _fit_convergence,
    "async": _fit_speed,
    "sync": _fit_speed,
    "allreduce": _fit_allreduce,
}


def _fit(args: argparse.Namespace) -> int:
    payload, lines = _FITTERS[args.model](args)
    _emit(args, payload, lines)
    return 0


def _allocate(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.damping) and 0.0 < args.damping <= 1.0):
        raise OptimusError(f"--damping must be in (0, 1], got {args.damping}")
    jobs, cap, res = read_allocation_file(args.file)
    result = allocate(jobs, cap, damping=args.damping, method=args.method)
    payload = {
        "resources": list(res),
        "capacity": list(cap),
        "used": list(result.used),
        "tasks": {k: {"ps": p, "workers": w} for k, (p, w) in result.tasks.items()},
    }
    lines = [f"{'job':<20} {'ps':>5} {'workers':>8}"]
    lines += [f"{k:<20} {p:>5} {w:>8}" for k, (p, w) in result.tasks.items()]
    lines.append(
        "used: "
        + ", ".join(f"{r}={u:g}/{c:g}" for r, u, c in zip(res, result.used, cap, strict=True))
    )
    _emit(args, payload, lines)
    return 0


def _place(args: argparse.Namespace) -> int:
    jobs, cap, previous, _res = read_placement_file(args.file)
    result = place(
        jobs, cap, previous=previous, shrink=args.shrink, fill=args.fill, strategy=args.strategy
    )
    payload = {
        "placements": {
            k: {
                "nodes": list(v.nodes),
                "ps_per_node": list(v.ps_per_node),
                "workers_per_node": list(v.workers_per_node),
            }
            for k, v in result.placements.items()
        },
        "unplaced": list(result.unplaced),
        "kept": list(result.kept),
        "shrunk": {k: list(v) for k, v in result.shrunk.items()},
    }
    lines = [f"{'job':<20} {'servers':>7}  nodes (ps/workers)"]
    for k, v in result.placements.items():
        spread = " ".join(
            f"{n}({a}/{b})"
            for n, a, b in zip(v.nodes, v.ps_per_node, v.workers_per_node, strict=True)
        )
        lines.append(f"{k:<20} {v.num_servers:>7}  {spread}")
    if result.unplaced:
        lines.append("unplaced: " + ", ".join(result.unplaced))
    for k, (p, w) in result.shrunk.items():
        lines.append(f"shrunk: {k} placed with {p} PS + {w} workers")
    _emit(args, payload, lines)
    return 0


def _paa(args: argparse.Namespace) -> int:
    if (args.model is None) == (args.blocks is None):
        raise OptimusError("give exactly one of --model and --blocks")
    blocks = model_blocks(args.model) if args.model else read_blocks_file(args.blocks)
    methods = sorted(PARAMETER_ASSIGNMENTS) if args.method == "all" else [args.method]
    rows = [PARAMETER_ASSIGNMENTS[m](blocks, args.ps).summary() for m in methods]
    payload = {
        "blocks": len(blocks),
        "parameters": sum(b.size for b in blocks),
        "num_ps": args.ps,
        "results": rows,
    }
    lines = [
        f"{len(blocks)} blocks, {sum(b.size for b in blocks):,} parameters, {args.ps} PS",
        f"{'method':<12} {'max load diff':>14} {'max load':>12} {'requests':>9} "
        f"{'max/PS':>7} {'split':>6}",
    ]
    for r in rows:
        lines.append(
            f"{r['method']:<12} {r['max_load_difference']:>14,.0f} {r['max_load']:>12,.0f} "
            f"{r['total_requests']:>9} {r['max_requests']:>7} {r['blocks_split']:>6}"
        )
    _emit(args, payload, lines)
    return 0


def _handled_by(parser: argparse.ArgumentParser, handler: Handler) -> None:
    """The ``--json`` switch every command has, and the command's handler."""
    parser.add_argument("--json", action="store_true", help="JSON output")
    parser.set_defaults(func=one_line_errors(handler))


def _add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fit = sub.add_parser("fit", help="fit a convergence or speed model to a file")
    fit.add_argument("model", choices=tuple(_FITTERS))
    fit.add_argument("file", help="CSV or JSON file (see the package README)")
    fit.add_argument("--global-batch", type=float, default=None, help="M of the sync form")
    fit.add_argument("--delta", type=float, default=1e-3, help="convergence threshold")
    fit.add_argument("--interval", type=float, default=100.0, help="steps of the delta test")
    fit.add_argument("--confidence", type=float, default=0.8, help="prediction interval level")
    fit.add_argument("--bootstrap", type=int, default=64, help="bootstrap fits")
    fit.add_argument("--recency-half-life", type=float, default=None, help="weight recent points")
    fit.add_argument("--no-decay", action="store_true", help="no learning-rate decay detection")
    fit.add_argument("--average-per-epoch", action="store_true", help="average per epoch")
    _handled_by(fit, _fit)

    alloc = sub.add_parser("allocate", help="greedy allocation of PS and workers (JSON file)")
    alloc.add_argument(
        "file", help="JSON file: jobs (id, remaining_steps, speed, demands) and capacity"
    )
    add_option(
        alloc,
        "--damping",
        0.95,
        "factor on the gains of jobs marked damped (models fitted on few points), 0 < d <= 1",
        type=float,
    )
    alloc.add_argument(
        "--method",
        choices=("fast", "reference"),
        default="fast",
        help="fast (vectorised, default) or reference (the plain loop; same result)",
    )
    _handled_by(alloc, _allocate)

    pl = sub.add_parser("place", help="fewest-servers even placement (JSON file)")
    pl.add_argument(
        "file", help="JSON file: jobs (id, ps, workers, demands), node capacities, previous"
    )
    pl.add_argument("--shrink", action="store_true", help="retry unplaceable jobs with fewer tasks")
    pl.add_argument(
        "--fill",
        action="store_true",
        help="fill the servers in order when no even spread fits (fragmented capacity)",
    )
    pl.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="fewest",
        help="fewest servers (Optimus, default), spread (load balancing) or align (Tetris)",
    )
    _handled_by(pl, _place)

    paa = sub.add_parser("paa", help="assign parameter blocks to parameter servers")
    paa.add_argument(
        "--model",
        choices=sorted(MODEL_ZOO),
        default=None,
        help=f"a built-in model: {', '.join(sorted(MODEL_ZOO))}",
    )
    paa.add_argument("--blocks", default=None, help="CSV name,size or JSON file of blocks")
    paa.add_argument("--ps", type=int, required=True, help="number of parameter servers")
    paa.add_argument("--method", choices=("all", *sorted(PARAMETER_ASSIGNMENTS)), default="all")
    _handled_by(paa, _paa)


#: the commands that run real jobs on Ray (``dynsched_ray.optimus.cli``)
_RAY_COMMANDS = ("serve", "submit", "status", "cancel")


def _add_ray_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``serve``/``submit``/``status``/``cancel`` from dynsched-ray, or one-line stubs."""
    try:
        from dynsched_ray.optimus.cli import add_subcommands
    except ImportError as exc:
        reason = f"needs the dynsched-ray package (pip install dynsched-ray): {exc}"

        def _missing(args: argparse.Namespace) -> int:
            print(f"dynsched optimus {args.optimus_command}: error: {reason}", file=sys.stderr)
            return 2

        for name in _RAY_COMMANDS:
            stub = sub.add_parser(name, help=f"(needs dynsched-ray) {name} real jobs on Ray")
            stub.add_argument("rest", nargs=argparse.REMAINDER)
            stub.set_defaults(func=_missing)
        return
    add_subcommands(sub)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Entry point of the ``dynsched.cli`` group: adds ``dynsched optimus``."""
    parser = subparsers.add_parser(
        "optimus", help="Optimus models, allocation, placement, PAA (and the cluster simulator)"
    )
    sub = parser.add_subparsers(dest="optimus_command", metavar="COMMAND")
    _add_commands(sub)
    try:
        from dynsched_optimus.cluster.cli import add_subcommands
    except Exception as exc:  # the simulator is optional; our commands must keep working
        logger.debug("cluster simulator commands unavailable: %r", exc)
    else:
        try:
            add_subcommands(sub)
        except Exception as exc:
            logger.warning("cluster simulator commands failed to register: %r", exc)
    _add_ray_commands(sub)

    def _no_command(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=_no_command)


def build_parser() -> argparse.ArgumentParser:
    """A stand-alone ``dynsched``-like parser with only the ``optimus`` command."""
    parser = argparse.ArgumentParser(prog="dynsched")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``dynsched optimus ...`` without the core dispatcher (tests, ``python -m``)."""
    args = build_parser().parse_args(["optimus", *(argv or [])])
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
