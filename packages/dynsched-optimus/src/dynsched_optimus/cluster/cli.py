"""``dynsched optimus simulate`` and ``dynsched optimus compare``.

Helper ``add_subcommands(subparsers)`` adds both to the ``dynsched optimus`` parser.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import sys
from pathlib import Path

import numpy as np

from .._cli_support import add_option, one_line_errors
from .._errors import OptimusError as UsageError
from ._data import WORKLOAD_LOADS, PolluxDataError, available_workloads, load_workload
from ._report import format_table, plot_results, write_result
from ._run import paper_ps_workload, run_pollux, run_ps
from ._schedulers import SCHEDULERS
from ._sim import SimResult
from ._spec import SimConfig

__all__ = ["add_subcommands", "compare_main", "simulate_main"]

#: Most jobs of the synthetic PS workload (``--num-jobs``).
MAX_PS_JOBS = 10_000
#: Largest ``--seed`` (numpy seeds are 32-bit words).
MAX_SEED = 2**32 - 1

_COLUMNS = (
    "scheduler",
    "jobs",
    "avg_jct_s",
    "p99_jct_s",
    "makespan_s",
    "gpu_util",
    "task_util",
    "overhead_share",
    "restarts",
    "wall_s",
)


def _common(p: argparse.ArgumentParser) -> None:
    add_option(
        p,
        "--load",
        "1.0",
        "relative job load of the Pollux workloads",
        choices=sorted(WORKLOAD_LOADS),
    )
    add_option(p, "--interval", 60.0, "scheduling interval in s", type=float)
    add_option(
        p, "--restart-delay", 30.0, "pause of a job whose allocation changes, in s", type=float
    )
    add_option(p, "--seed", 0, "random seed", type=int)
    p.add_argument(
        "--completion",
        choices=("target", "epochs"),
        default="target",
        help="GPU jobs end at the target metric (default) or after all epochs (Pollux rule)",
    )
    p.add_argument("--ps", action="store_true", help="paper-like PS workload instead of Pollux")
    add_option(p, "--num-jobs", 30, "PS workload size, with --ps", type=int)
    add_option(
        p,
        "--lr-decay-share",
        0.0,
        "share of PS jobs with a step learning-rate decay, 0..1, with --ps",
        type=float,
    )
    add_option(
        p,
        "--assignment",
        "paa",
        "parameter assignment of the PS jobs, with --ps",
        choices=("paa", "mxnet", "round_robin"),
    )
    p.add_argument(
        "--placement",
        default=None,
        choices=("fewest", "spread"),
        help="ablation: placement of the optimus schedulers (default: fewest servers)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="folder for JSON results and plots (default: none)"
    )
    p.add_argument("--job", default=None, help="job whose allocation is plotted")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def _check_common(args: argparse.Namespace) -> None:
    """Flags checked before anything runs (one error naming the flag)."""
    if not (math.isfinite(args.interval) and args.interval > 0):
        raise UsageError(f"--interval must be a number of seconds > 0, got {args.interval}")
    if not (math.isfinite(args.restart_delay) and args.restart_delay >= 0):
        raise UsageError(
            f"--restart-delay must be a number of seconds >= 0, got {args.restart_delay}"
        )
    if not 1 <= args.num_jobs <= MAX_PS_JOBS:
        raise UsageError(
            f"--num-jobs must be >= 1 and <= {MAX_PS_JOBS:,} (the paper used 9 to 60), "
            f"got {args.num_jobs if abs(args.num_jobs) < 10**30 else 'a huge number'}"
        )
    if not 0 <= args.seed <= MAX_SEED:
        raise UsageError(f"--seed must be >= 0 and <= {MAX_SEED:,}, got {args.seed}")
    if not 0.0 <= args.lr_decay_share <= 1.0:
        raise UsageError(f"--lr-decay-share must be between 0 and 1, got {args.lr_decay_share}")
    if args.out is not None:
        from dynsched_core.cli import ensure_output_folder

        ensure_output_folder(args.out, "--out")


def _check_workloads(args: argparse.Namespace, workloads: list[str]) -> None:
    """Every workload readable before the first one runs."""
    if args.ps:
        return
    if not workloads:
        raise UsageError("--workloads is empty; give comma-separated names, e.g. workload-1")
    for w in workloads:
        try:
            load_workload(w, load=args.load)
        except PolluxDataError as exc:
            raise UsageError(str(exc)) from None


def _check_job(args: argparse.Namespace, workloads: list[str]) -> None:
    """``--job`` names a job of one of the workloads (the plot would otherwise be empty)."""
    if args.job is None:
        return
    if args.ps:
        jobs = paper_ps_workload(args.num_jobs, seed=args.seed, lr_decay_share=args.lr_decay_share)
        names = [j.name for j in jobs]
        where = f"the PS workload (--num-jobs {args.num_jobs}, --seed {args.seed})"
    else:
        names = [j.name for w in workloads for j in load_workload(w, load=args.load)]
        where = f"workload {', '.join(workloads)}"
    if args.job in names:
        return
    close = difflib.get_close_matches(args.job, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} jobs)" if len(names) > 12 else "")
    raise UsageError(f"--job {args.job!r}: no such job in {where}; {hint}jobs: {shown}")


def _workload_help() -> str:
    try:
        names = available_workloads("1.0")
    except PolluxDataError:
        return "Pollux workload names (data directory not found)"
    return f"{', '.join(names)} (or a CSV path)"


def _config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        interval_s=args.interval,
        restart_delay_s=args.restart_delay,
        seed=args.seed,
        completion=args.completion,
    )


def _run_one(args: argparse.Namespace, workload: str, scheduler: str) -> SimResult:
    cfg = _config(args)
    if args.ps:
        return run_ps(
            scheduler,
            num_jobs=args.num_jobs,
            config=cfg,
            imbalance=args.assignment,
            lr_decay_share=args.lr_decay_share,
            progress=not args.quiet,
            scheduler_kwargs=_sched_kwargs(args, scheduler),
        )
    return run_pollux(
        workload,
        scheduler,
        load=args.load,
        config=cfg,
        progress=not args.quiet,
        scheduler_kwargs=_sched_kwargs(args, scheduler),
    )


def _sched_kwargs(args: argparse.Namespace, scheduler: str) -> dict[str, object]:
    if args.placement is None:
        return {}
    if scheduler.startswith("optimus"):
        return {"allocation_only": args.placement == "spread"}
    if scheduler == "drf":
        return {"placement": args.placement}
    return {}


def simulate_main(args: argparse.Namespace) -> int:
    """Handler of ``simulate``."""
    _check_common(args)
    _check_workloads(args, [args.workload])
    _check_job(args, [args.workload])
    label = "ps" if args.ps else args.workload
    if not args.quiet:
        print(
            f"simulating {label} (load {args.load}) under {args.scheduler}...",
            file=sys.stderr,
            flush=True,
        )
    try:
        result = _run_one(args, args.workload, args.scheduler)
    except KeyboardInterrupt:
        raise KeyboardInterrupt("the simulation did not finish; nothing written") from None
    except (PolluxDataError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    load = "" if args.ps else f", load {args.load}"
    print(f"workload {label}{load}, scheduler {args.scheduler}")
    print(format_table([result.summary()], _COLUMNS))
    if result.unfinished:
        print(f"unfinished jobs: {len(result.unfinished)}")
    if args.out:
        write_result(result, args.out / f"{args.scheduler}.json")
        for p in plot_results([result], args.out, job=args.job, title=label):
            print(f"wrote {p}")
    return 0


def compare_main(args: argparse.Namespace) -> int:
    """Handler of ``compare``."""
    schedulers = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    bad = [s for s in schedulers if s not in SCHEDULERS]
    if bad or not schedulers:
        raise UsageError(
            f"--schedulers: unknown scheduler(s) {bad or 'none given'}; "
            f"allowed {sorted(SCHEDULERS)}"
        )
    _check_common(args)
    workloads = ["ps"] if args.ps else [w.strip() for w in args.workloads.split(",") if w.strip()]
    _check_workloads(args, workloads)
    _check_job(args, workloads)
    per: dict[str, dict[str, SimResult]] = {}
    rows: list[dict[str, object]] = []
    try:
        for w in workloads:
            per[w] = {}
            for s in schedulers:
                r = _run_one(args, w, s)
                per[w][s] = r
                row = {"workload": Path(w).stem if w.endswith(".csv") else w, **r.summary()}
                rows.append(row)
                if not args.quiet:
                    print(
                        f"{w:>12} {s:>15}: avg JCT {r.avg_jct:9.1f} s  makespan "
                        f"{r.makespan:9.1f} s  ({r.wall_s:.1f} s wall)",
                        file=sys.stderr,
                        flush=True,
                    )
    except KeyboardInterrupt:
        done = [w for w in workloads if w in per and len(per[w]) == len(schedulers)]
        print(
            f"PARTIAL: interrupted after {len(rows)} of {len(workloads) * len(schedulers)} run(s)"
        )
        if rows:
            print(format_table(rows, ("workload", *_COLUMNS)))
        where = ""
        if args.out and rows:
            _write_compare(args, {w: per[w] for w in per if per[w]}, schedulers, done, rows, True)
            where = f"; written to {args.out} (summary.json marked partial)"
        raise KeyboardInterrupt(f"{len(rows)} finished run(s) printed above{where}") from None
    except (PolluxDataError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    print(format_table(rows, ("workload", *_COLUMNS)))
    means = {s: float(np.mean([per[w][s].avg_jct for w in workloads])) for s in schedulers}
    print()
    print(
        format_table(
            [{"scheduler": s, "mean_avg_jct_s": round(v, 1)} for s, v in means.items()],
            ("scheduler", "mean_avg_jct_s"),
        )
    )
    if args.out:
        _write_compare(args, per, schedulers, workloads, rows, False)
        print(f"wrote {args.out}")
    return 0


def _write_compare(
    args: argparse.Namespace,
    per: dict[str, dict[str, SimResult]],
    schedulers: list[str],
    complete: list[str],
    rows: list[dict[str, object]],
    partial: bool,
) -> None:
    """``summary.json`` and per-workload results; means only over complete workloads."""
    args.out.mkdir(parents=True, exist_ok=True)
    means = (
        {s: float(np.mean([per[w][s].avg_jct for w in complete])) for s in schedulers}
        if complete
        else {}
    )
    summary = {
        "partial": partial,
        "avgs": {s: {w: per[w][s].avg_jct for w in per if s in per[w]} for s in schedulers},
        "mean": means,
        "rows": rows,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    for w, results in per.items():
        label = Path(w).stem if w.endswith(".csv") else w
        for s, r in results.items():
            write_result(r, args.out / label / f"{s}.json")
        if not partial:
            plot_results(list(results.values()), args.out / label, job=args.job, title=label)


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``simulate`` and ``compare`` to the ``dynsched optimus`` sub-parsers."""
    sim = subparsers.add_parser("simulate", help="simulate one workload under one scheduler")
    add_option(sim, "--workload", "workload-1", f"Pollux workload: {_workload_help()}")
    add_option(
        sim,
        "--scheduler",
        "optimus",
        f"one of {', '.join(sorted(SCHEDULERS))}",
        choices=sorted(SCHEDULERS),
    )
    _common(sim)
    sim.set_defaults(func=one_line_errors(simulate_main))
    cmp_ = subparsers.add_parser("compare", help="compare schedulers on several workloads")
    cmp_.add_argument(
        "--workloads",
        default=",".join(f"workload-{i}" for i in range(1, 9)),
        help=f"comma-separated Pollux workloads, from {_workload_help()} "
        "(default: workload-1 to workload-8)",
    )
    add_option(
        cmp_,
        "--schedulers",
        "fifo,drf,tiresias,optimus,optimus-oracle,optimus+",
        f"comma-separated, from {', '.join(sorted(SCHEDULERS))}",
    )
    _common(cmp_)
    cmp_.set_defaults(func=one_line_errors(compare_main))


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m dynsched_optimus.cluster.cli``)."""
    parser = argparse.ArgumentParser(prog="dynsched optimus")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_subcommands(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
