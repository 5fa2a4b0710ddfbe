"""``dynsched optimus simulate`` and ``dynsched optimus compare``.

Helper ``add_subcommands(subparsers)`` adds both to the ``dynsched optimus`` parser.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ._data import PolluxDataError
from ._report import format_table, plot_results, write_result
from ._run import run_pollux, run_ps
from ._schedulers import SCHEDULERS
from ._sim import SimResult
from ._spec import SimConfig

__all__ = ["add_subcommands", "compare_main", "simulate_main"]

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
    p.add_argument("--load", default="1.0", help="Pollux job load: 1.0, 0.5, 1.5, 2.0, realistic")
    p.add_argument("--interval", type=float, default=60.0, help="scheduling interval (s)")
    p.add_argument("--restart-delay", type=float, default=30.0, help="restart pause (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--completion",
        choices=("target", "epochs"),
        default="target",
        help="GPU jobs end at the target metric (default) or after all epochs (Pollux rule)",
    )
    p.add_argument("--ps", action="store_true", help="paper-like PS workload instead of Pollux")
    p.add_argument("--num-jobs", type=int, default=30, help="PS workload size (with --ps)")
    p.add_argument(
        "--lr-decay-share",
        type=float,
        default=0.0,
        help="share of PS jobs with a step learning-rate decay (with --ps)",
    )
    p.add_argument(
        "--assignment",
        default="paa",
        choices=("paa", "mxnet", "round_robin"),
        help="parameter assignment of the PS jobs (with --ps)",
    )
    p.add_argument(
        "--placement",
        default=None,
        choices=("fewest", "spread"),
        help="ablation: placement of the optimus schedulers (default: fewest servers)",
    )
    p.add_argument("--out", type=Path, default=None, help="directory for JSON and plots")
    p.add_argument("--job", default=None, help="job whose allocation is plotted")
    p.add_argument("--quiet", action="store_true", help="no progress output")


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
    try:
        result = _run_one(args, args.workload, args.scheduler)
    except (PolluxDataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_table([result.summary()], _COLUMNS))
    if result.unfinished:
        print(f"unfinished jobs: {len(result.unfinished)}")
    if args.out:
        write_result(result, args.out / f"{args.scheduler}.json")
        for p in plot_results([result], args.out, job=args.job, title=args.workload):
            print(f"wrote {p}")
    return 0


def compare_main(args: argparse.Namespace) -> int:
    """Handler of ``compare``."""
    schedulers = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    bad = [s for s in schedulers if s not in SCHEDULERS]
    if bad:
        print(f"error: unknown scheduler(s) {bad}; allowed {sorted(SCHEDULERS)}", file=sys.stderr)
        return 2
    workloads = ["ps"] if args.ps else [w.strip() for w in args.workloads.split(",") if w.strip()]
    per: dict[str, dict[str, SimResult]] = {}
    rows = []
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
    except (PolluxDataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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
        args.out.mkdir(parents=True, exist_ok=True)
        summary = {
            "avgs": {s: {w: per[w][s].avg_jct for w in workloads} for s in schedulers},
            "mean": means,
            "rows": rows,
        }
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
        for w in workloads:
            label = Path(w).stem if w.endswith(".csv") else w
            for s in schedulers:
                write_result(per[w][s], args.out / label / f"{s}.json")
            plot_results(list(per[w].values()), args.out / label, job=args.job, title=label)
        print(f"wrote {args.out}")
    return 0


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``simulate`` and ``compare`` to the ``dynsched optimus`` sub-parsers."""
    sim = subparsers.add_parser("simulate", help="simulate one workload under one scheduler")
    sim.add_argument("--workload", default="workload-1", help="Pollux workload name or CSV path")
    sim.add_argument("--scheduler", default="optimus", choices=sorted(SCHEDULERS))
    _common(sim)
    sim.set_defaults(func=simulate_main)
    cmp_ = subparsers.add_parser("compare", help="compare schedulers on several workloads")
    cmp_.add_argument(
        "--workloads",
        default=",".join(f"workload-{i}" for i in range(1, 9)),
        help="comma-separated Pollux workload names",
    )
    cmp_.add_argument(
        "--schedulers",
        default="fifo,drf,tiresias,optimus,optimus-oracle,optimus+",
        help=f"comma-separated, from {sorted(SCHEDULERS)}",
    )
    _common(cmp_)
    cmp_.set_defaults(func=compare_main)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m dynsched_optimus.cluster.cli``)."""
    parser = argparse.ArgumentParser(prog="dynsched optimus")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_subcommands(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
