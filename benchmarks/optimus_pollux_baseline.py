"""The simulator's Pollux baseline (``pollux``) against the published Pollux rows.

For every (load, workload, seed) it runs ``pollux`` (and, with ``--schedulers``, other
registered schedulers such as ``optimus+``) under the Pollux artifact's completion rule
(``epochs``: every job trains all its profiled epochs), and records the average JCT,
p99, makespan, restarts, the per-job JCTs, the wall time of the simulation and the
seconds of each Pollux decision.  The JSON is rewritten after every run, so an
interrupted sweep keeps what it finished.  The published rows are the Pollux authors'
simulator results vendored under ``shared/data/pollux/results-jobload`` (never used to
choose anything: the baseline's parameters are the paper's and the artifact's).

Run (one simulation at a time on a shared machine)::

    nice python benchmarks/optimus_pollux_baseline.py \
        --out benchmarks/results/optimus_pollux_baseline.json \
        [--loads 1.0,0.5,1.5,2.0] [--workloads 1-8] [--seeds 0] [--schedulers pollux]

``--summary FILE [FILE ...]`` merges result files and prints the Markdown summary:
per load, per workload the baseline's average JCT (seed mean, half the range over
seeds), the published row and the residual ``ours / published - 1``; the mean per load;
wall seconds per simulation and seconds per Pollux decision; per load and scheduler the
p99 JCT, makespan and worst slowdown against running alone (mean over the workloads each
ran, with the seed spread). ``--jobs`` adds the per-job table of two schedulers (``--pair
optimus+,pollux``); ``--plots DIR`` writes, per pair of ``--plot-pairs`` (default
``optimus+,pollux;optimus+rw,pollux``), a scatter of the per-job JCTs at 1.0x (one panel
per workload, log axes, the line y = x) as ``DIR/optimus_pollux_jobs_<a>.png``.

Running alone: a job's true time on its requested GPUs, packed on the fewest servers, at
its submitted batch, from its submission (the simulator's oracle; no queueing, no
restarts); slowdown = JCT / that time.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from dynsched_optimus import OptimusError
from dynsched_optimus.cluster import (
    ClusterSpec,
    Placement,
    SimConfig,
    Simulator,
    find_pollux_data,
    gpu_jobs,
    load_workload,
    make_scheduler,
)
from dynsched_optimus.scheduler import make_optimus

sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimus_pollux_eval import _workloads  # the workload list syntax "1-8,10"


def published(load: str) -> dict[str, float]:
    """Published Pollux average JCT per workload at ``load`` (empty when absent)."""
    path = find_pollux_data() / "results-jobload" / f"pollux-{load}.json"
    if not path.is_file():
        return {}
    return {k: float(v) for k, v in json.loads(path.read_text())["avgs"].items()}


def alone_seconds(load: str, workload: str, seed: int) -> dict[str, float]:
    """Each job's time running alone: its requested GPUs on the fewest servers, its
    submitted batch, no queueing or restarts (the simulator's oracle)."""
    config = SimConfig(seed=seed, completion="epochs")
    jobs = gpu_jobs(load_workload(workload, load=load), config)
    spec = ClusterSpec.pollux()
    per = int(spec.capacity()[0, 2])
    out = {}
    for job in jobs:
        w = max(min(job.requested_workers, job.max_workers), 1)
        full, rest = divmod(w, per)
        counts = dict(enumerate([per] * full + ([rest] if rest else [])))
        pl = Placement.of(spec.num_nodes, counts, {})
        out[job.name] = float(job.true_remaining_time(pl))
    return out


def _kwargs(args: argparse.Namespace, scheduler: str) -> dict[str, object]:
    if scheduler != "pollux":
        return {}
    kw: dict[str, object] = {"population": args.population, "generations": args.generations}
    if args.patience:
        kw["patience"] = args.patience
    return kw


def run(args: argparse.Namespace) -> None:
    """Run the missing (load, workload, scheduler, seed) combinations."""
    out_path = Path(args.out)
    runs: list[dict[str, object]] = []
    if out_path.exists():
        runs = json.loads(out_path.read_text())["runs"]
    done = {(r["load"], r["workload"], r["scheduler"], r["seed"], r["search"]) for r in runs}
    seeds = [int(s) for s in args.seeds.split(",")]
    for ld in args.loads.split(","):
        for wl in _workloads(args.workloads):
            for seed in seeds:
                for sched in args.schedulers.split(","):
                    search = f"{args.population}x{args.generations}" + (
                        f"/patience {args.patience}" if args.patience else ""
                    )
                    search = search if sched == "pollux" else "-"
                    if (ld, wl, sched, seed, search) in done:
                        continue
                    runs.append(_one(args, ld, wl, sched, seed, search))
                    out_path.write_text(json.dumps({"command": vars(args), "runs": runs}))


def _one(
    args: argparse.Namespace, ld: str, wl: str, sched: str, seed: int, search: str
) -> dict[str, object]:
    """One simulation's record."""
    t0 = time.perf_counter()
    config = SimConfig(seed=seed, completion="epochs")
    scheduler = make_scheduler(sched, **_kwargs(args, sched))
    jobs = gpu_jobs(load_workload(wl, load=ld), config)
    start = {j.name: (j.submit_time, float(j.batch_size)) for j in jobs}
    res = Simulator(ClusterSpec.pollux(), jobs, scheduler, config).run()
    wall = time.perf_counter() - t0
    decisions = list(getattr(scheduler, "decision_seconds", []))
    policy = getattr(scheduler, "policy", None)
    row: dict[str, object] = {
        "load": ld,
        "workload": wl,
        "scheduler": sched,
        "seed": seed,
        "search": search,
        "avg_jct_s": res.avg_jct,
        "p99_jct_s": res.p99_jct,
        "makespan_s": res.makespan,
        "restarts": int(sum(res.restarts.values())),
        "unfinished": len(res.unfinished),
        "wall_s": wall,
        "decisions": len(decisions),
        "decision_s_mean": float(np.mean(decisions)) if decisions else None,
        "decision_s_p99": float(np.percentile(decisions, 99)) if decisions else None,
        "jct": res.jct,
        "job_restarts": res.restarts,
        "job_detail": job_detail(res, start),
    }
    if policy is not None:  # an Optimus variant: how its restarts were priced
        row["restart_history"] = policy.restarts.history
    brief = {k: v for k, v in row.items() if k not in ("jct", "job_restarts", "job_detail")}
    print(json.dumps(brief), flush=True)
    return row


@functools.cache
def _default_history(scheduler: str) -> str:
    """The ``restart_history`` an Optimus variant uses by default (``"none"`` for a scheduler
    that is not one): rows made with another are labelled with it."""
    try:
        return make_optimus(scheduler).restarts.history
    except OptimusError:  # not an Optimus variant (pollux, ...), or one that needs more
        return "none"


def _time_mean(changes: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Time-weighted mean over ``[t0, t1]`` of the step function that takes value ``v`` from
    each ``(time, v)`` of ``changes`` (in time order) to the next (the first value also
    before it); the value at ``t0`` when ``t1 <= t0``."""
    if not changes:
        return 0.0
    starts = [-math.inf, *(t for t, _v in changes[1:])]
    ends = [*(t for t, _v in changes[1:]), math.inf]
    values = [float(v) for _t, v in changes]
    if t1 <= t0:
        return next(v for a, b, v in zip(starts, ends, values, strict=True) if a <= t0 < b)
    total = sum(
        v * max(0.0, min(b, t1) - max(a, t0)) for a, b, v in zip(starts, ends, values, strict=True)
    )
    return total / (t1 - t0)


def job_detail(res: Any, start: dict[str, tuple[float, float]]) -> dict[str, dict[str, float]]:
    """Why a job took as long as it did: ``queue_s`` (submission to its first GPU),
    ``gpus`` and ``batch`` (time-weighted means from its first GPU to completion) and
    ``restarts``, for every completed job of a simulation."""
    out: dict[str, dict[str, float]] = {}
    for name, jct in res.jct.items():
        submit, batch0 = start[name]
        allocs = [(t, float(w)) for t, w, _p in res.allocations.get(name, [])]
        first = next((t for t, w in allocs if w > 0), submit)
        end = submit + jct
        batches = res.batches.get(name) or [(submit, batch0)]
        out[name] = {
            "queue_s": round(first - submit, 1),
            "gpus": round(_time_mean(allocs, first, end), 2),
            "batch": round(_time_mean([(t, float(b)) for t, b in batches], first, end), 1),
            "restarts": int(res.restarts.get(name, 0)),
        }
    return out


def _group(files: list[str]) -> dict[tuple[str, str, str], list[dict]]:
    runs: dict[tuple[str, str, str], list[dict]] = {}
    for f in files:
        for r in json.loads(Path(f).read_text())["runs"]:
            name = r["scheduler"]
            if r.get("search", "-") not in ("-", "100x100"):  # not the published search size
                name = f"{name} [{r['search']}]"
            hist = r.get("restart_history")
            if hist is not None and hist != _default_history(name):
                name = f"{name} [history {hist}]"  # not the variant's default (see the README)
            runs.setdefault((r["load"], r["workload"], name), []).append(r)
    return runs


def summary(files: list[str]) -> str:
    """Markdown: per load, ours vs published per workload, residuals, run times."""
    runs = _group(files)
    lines = []
    scheds = sorted({k[2] for k in runs})
    for ld in sorted({k[0] for k in runs}, key=float):
        pub = published(ld)
        wls = sorted({k[1] for k in runs if k[0] == ld}, key=lambda w: int(w.split("-")[1]))
        lines += [f"\n### load {ld} (epochs rule; JCT s, seed mean ± half range)\n"]
        lines += ["| scheduler | " + " | ".join(w.split("-")[1] for w in wls) + " | mean |"]
        lines += ["|---" * (len(wls) + 2) + "|"]
        means: dict[str, dict[str, float]] = {}
        for sc in (sc for sc in scheds if any(k[0] == ld and k[2] == sc for k in runs)):
            cells = []
            for w in wls:
                rs = runs.get((ld, w, sc), [])
                if not rs:
                    cells.append("-")
                    continue
                j = [r["avg_jct_s"] for r in rs]
                means.setdefault(sc, {})[w] = statistics.mean(j)
                spread = f" ±{(max(j) - min(j)) / 2:.0f}" if len(j) > 1 else ""
                cells.append(f"{statistics.mean(j):.0f}{spread} ({len(j)})")
            m = means.get(sc, {})
            mean = f"{statistics.mean(m.values()):.0f}" if m else "-"
            lines += [
                f"| {sc} | " + " | ".join(cells) + f" | {mean}{'' if len(m) == len(wls) else '*'} |"
            ]
        if pub:
            cells = [f"{pub[w]:.0f}" if w in pub else "-" for w in wls]
            pm = statistics.mean(pub[w] for w in wls if w in pub)
            lines += ["| pollux (published) | " + " | ".join(cells) + f" | {pm:.0f} |"]
            for sc in (sc for sc in scheds if sc.startswith("pollux") and sc in means):
                ours = means[sc]
                res = [f"{ours[w] / pub[w] - 1:+.1%}" if w in ours else "-" for w in wls]
                both = [w for w in wls if w in ours and w in pub]
                mres = statistics.mean(ours[w] for w in both) / statistics.mean(
                    pub[w] for w in both
                )
                lines += [
                    f"| residual {sc} | "
                    + " | ".join(res)
                    + f" | {mres - 1:+.1%} (on {len(both)}) |"
                ]
        lines += [""]
        for sc in scheds:
            rs = [r for k, v in runs.items() if k[0] == ld and k[2] == sc for r in v]
            walls = [r["wall_s"] for r in rs]
            if not walls:
                continue
            dec = [r["decision_s_mean"] for r in rs if r.get("decision_s_mean") is not None]
            p99 = [r["decision_s_p99"] for r in rs if r.get("decision_s_p99") is not None]
            txt = f"- {sc}: {len(rs)} simulation(s), wall {statistics.mean(walls):.0f} s each"
            if dec:
                txt += (
                    f" (range {min(walls):.0f}-{max(walls):.0f}); seconds per decision: mean "
                    f"{statistics.mean(dec):.3f}, p99 up to {max(p99):.3f}"
                )
            lines += [txt]
    return "\n".join(lines)


def _worst_slowdown(r: dict, cache: dict[tuple[str, str, int], dict[str, float]]) -> float:
    key = (r["load"], r["workload"], r["seed"])
    if key not in cache:
        cache[key] = alone_seconds(*key)
    alone = cache[key]
    return max(r["jct"][n] / alone[n] for n in r["jct"])


def _seed_means(rs: list[dict], metric: str, wls: list[str]) -> list[float]:
    """Per seed that ran every workload of ``wls``: the mean of ``metric`` over them."""
    by_seed: dict[int, dict[str, float]] = {}
    for r in rs:
        by_seed.setdefault(r["seed"], {})[r["workload"]] = r[metric]
    return [statistics.mean(v[w] for w in wls) for v in by_seed.values() if set(wls) <= set(v)]


def extras_table(files: list[str], scheds: list[str]) -> str:
    """Per load: average JCT, p99 JCT, makespan and worst slowdown against running alone,
    mean over the workloads every listed scheduler ran, mean ± half range over seeds."""
    runs = _group(files)
    cache: dict[tuple[str, str, int], dict[str, float]] = {}
    for rs in runs.values():
        for r in rs:
            r.setdefault("worst_slowdown", _worst_slowdown(r, cache))
    lines = ["\n### p99 JCT, makespan, fairness (means over the common workloads)\n"]
    lines += [
        "| load | workloads | scheduler | seeds | avg JCT s | p99 JCT s | makespan s "
        "| worst slowdown |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ld in sorted({k[0] for k in runs}, key=float):
        have = [sc for sc in scheds if any(k[0] == ld and k[2] == sc for k in runs)]
        common = [
            w
            for w in sorted({k[1] for k in runs if k[0] == ld}, key=lambda w: int(w[9:]))
            if all((ld, w, sc) in runs for sc in have)
        ]
        if not common or len(have) < 2:
            continue
        for sc in have:
            rs = [r for w in common for r in runs[(ld, w, sc)]]
            cells = []
            for m in ("avg_jct_s", "p99_jct_s", "makespan_s", "worst_slowdown"):
                v = _seed_means(rs, m, common)
                spread = f" ±{(max(v) - min(v)) / 2:.{1 if m == 'worst_slowdown' else 0}f}"
                fmt = ".1f" if m == "worst_slowdown" else ".0f"
                cells.append(f"{statistics.mean(v):{fmt}}" + (spread if len(v) > 1 else ""))
            n = len(_seed_means(rs, "avg_jct_s", common))
            wl = ",".join(w[9:] for w in common)
            lines += [f"| {ld} | {wl} | {sc} | {n} | " + " | ".join(cells) + " |"]
    return "\n".join(lines)


def plot_pairs(files: list[str], pairs: list[tuple[str, str]], out_dir: str) -> list[str]:
    """Scatter of per-job JCTs (seed means) at 1.0x, one panel per workload, log axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = _group(files)
    written = []
    for a, b in pairs:
        wls = sorted(
            {k[1] for k in runs if k[0] == "1.0" and k[2] == a and ("1.0", k[1], b) in runs},
            key=lambda w: int(w[9:]),
        )
        if not wls:
            continue
        fig, axes = plt.subplots(2, 4, figsize=(16, 8), squeeze=False)
        for ax, w in zip(axes.flat, wls, strict=False):
            ja, jb = _mean_jct(runs[("1.0", w, a)]), _mean_jct(runs[("1.0", w, b)])
            names = sorted(set(ja) & set(jb))
            x, y = [jb[n] for n in names], [ja[n] for n in names]
            wins = sum(ya < xb for ya, xb in zip(y, x, strict=True))
            ax.scatter(x, y, s=8, alpha=0.6)
            lo, hi = min(x + y), max(x + y)
            ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
            ax.set(xscale="log", yscale="log", xlabel=f"{b} JCT s", ylabel=f"{a} JCT s")
            ax.set_title(f"{w}: {a} faster on {wins}/{len(names)}", fontsize=9)
        for ax in list(axes.flat)[len(wls) :]:
            ax.set_visible(False)
        fig.suptitle(f"per-job JCT at 1.0x (epochs rule; seed means): {a} vs {b}")
        fig.tight_layout()
        path = Path(out_dir) / f"optimus_pollux_jobs_{a.replace('+', 'plus')}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(str(path))
    return written


def jobs_table(files: list[str], pair: tuple[str, str]) -> tuple[str, dict[str, object]]:
    """Per-job JCT of two schedulers on the workloads both ran (seed means)."""
    runs = _group(files)
    a, b = pair
    out: dict[str, object] = {}
    lines = [f"\n### per-job JCT, {a} vs {b} (epochs rule; seed means)\n"]
    for ld, wl, sc in sorted(runs):
        if sc != a or (ld, wl, b) not in runs:
            continue
        ja = _mean_jct(runs[(ld, wl, a)])
        jb = _mean_jct(runs[(ld, wl, b)])
        names = sorted(set(ja) & set(jb), key=lambda n: ja[n] - jb[n])
        ratio = [ja[n] / jb[n] for n in names]
        wins = sum(r < 1 for r in ratio)
        out[f"{ld}/{wl}"] = {n: {a: ja[n], b: jb[n]} for n in names}
        lines += [
            f"- load {ld} {wl}: {a} faster on {wins}/{len(names)} jobs; JCT ratio {a}/{b} "
            f"median {np.median(ratio):.2f}, p10 {np.percentile(ratio, 10):.2f}, "
            f"p90 {np.percentile(ratio, 90):.2f}; largest losses of {a}: "
            + ", ".join(f"{n} {ja[n]:.0f} s vs {jb[n]:.0f} s" for n in names[::-1][:3])
        ]
    return "\n".join(lines), out


def _mean_detail(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Seed means of each job's ``job_detail`` over the runs that recorded it."""
    rows = [r for r in rows if "job_detail" in r]
    if not rows:
        return {}
    names = set.intersection(*(set(r["job_detail"]) for r in rows))
    keys = ("queue_s", "gpus", "batch", "restarts")
    return {
        n: {k: statistics.mean(r["job_detail"][n][k] for r in rows) for k in keys} for n in names
    }


def why_table(files: list[str], pair: tuple[str, str], load: str = "1.0") -> str:
    """Why ``a`` wins or loses jobs against ``b`` at ``load``: per workload, how many of the
    jobs it loses waited longer for their first GPU, ran on fewer GPUs, with a smaller
    batch or restarted more often, and the three largest losses and wins with those; last,
    the same counts summed over the workloads."""
    runs = _group(files)
    a, b = pair
    total = [0, 0, 0, 0, 0, 0]  # jobs, lost, waited longer, fewer GPUs, smaller batch, restarts
    lines = [
        f"\n### why {a} wins or loses jobs against {b} at {load}x (seed means; queue: "
        "submission to the first GPU; GPUs and batch: time-weighted means while it ran)\n"
    ]
    for ld, wl, sc in sorted(runs, key=lambda k: (k[0], int(k[1].split("-")[1]), k[2])):
        if ld != load or sc != a or (ld, wl, b) not in runs:
            continue
        da, db = _mean_detail(runs[(ld, wl, a)]), _mean_detail(runs[(ld, wl, b)])
        ja, jb = _mean_jct(runs[(ld, wl, a)]), _mean_jct(runs[(ld, wl, b)])
        names = sorted(set(da) & set(db) & set(ja) & set(jb), key=lambda n: ja[n] - jb[n])
        if not names:
            continue
        lost = [n for n in names if ja[n] > 1.01 * jb[n]]  # more than 1 % longer
        why = (
            sum(da[n]["queue_s"] > db[n]["queue_s"] + 1 for n in lost),
            sum(da[n]["gpus"] < db[n]["gpus"] - 0.05 for n in lost),
            sum(da[n]["batch"] < db[n]["batch"] - 0.5 for n in lost),
            sum(da[n]["restarts"] > db[n]["restarts"] for n in lost),
        )
        for i, x in enumerate((len(names), len(lost), *why)):
            total[i] += x
        lines.append(
            f"- {wl}: {a} loses {len(lost)} of {len(names)} jobs (JCT over 1 % longer); of those, "
            f"{why[0]} waited longer for a GPU, {why[1]} ran on fewer GPUs, {why[2]} with a "
            f"smaller batch, {why[3]} restarted more often"
        )
        lines.append("")
        lines.append(
            f"  | job | JCT s {a} / {b} | queue s | GPUs | batch | restarts |\n"
            "  |---|---|---|---|---|---|"
        )
        for n in dict.fromkeys([*names[::-1][:3], *names[:3]]):  # a job once
            x, y = da[n], db[n]
            lines.append(
                f"  | {n} | {ja[n]:.0f} / {jb[n]:.0f} | {x['queue_s']:.0f} / {y['queue_s']:.0f} "
                f"| {x['gpus']:.1f} / {y['gpus']:.1f} | {x['batch']:.0f} / {y['batch']:.0f} "
                f"| {x['restarts']:.1f} / {y['restarts']:.0f} |"
            )
        lines.append("")
    if total[0]:
        lines.append(
            f"- all workloads: {a} loses {total[1]} of {total[0]} jobs; of those, {total[2]} "
            f"waited longer for a GPU, {total[3]} ran on fewer GPUs, {total[4]} with a smaller "
            f"batch, {total[5]} restarted more often"
        )
    return "\n".join(lines)


def _mean_jct(rows: list[dict]) -> dict[str, float]:
    names = set.intersection(*(set(r["jct"]) for r in rows))
    return {n: statistics.mean(r["jct"][n] for r in rows) for n in names}


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--loads", default="1.0")
    p.add_argument("--workloads", default="1-8")
    p.add_argument("--seeds", default="0")
    p.add_argument("--schedulers", default="pollux")
    p.add_argument("--population", type=int, default=100)
    p.add_argument("--generations", type=int, default=100)
    p.add_argument("--patience", type=int, default=0, help="GA early stop (0: off)")
    p.add_argument("--out", default="optimus_pollux_baseline.json")
    p.add_argument("--summary", nargs="*", default=None)
    p.add_argument("--pair", default="optimus+,pollux", help="a,b[;c,d...]: per-job tables")
    p.add_argument("--jobs", default=None, help="with --summary: write the per-job JSON here")
    p.add_argument("--plots", default=None, help="with --summary: write the scatter plots here")
    p.add_argument(
        "--why",
        default="",
        help="with --summary: a,b[;c,d...]: why a wins or loses jobs against b at each load "
        "of --why-loads (runs that recorded job_detail)",
    )
    p.add_argument("--why-loads", default="1.0", help="with --why: the loads, comma-separated")
    p.add_argument("--plot-pairs", default="optimus+,pollux;optimus+rw,pollux")
    p.add_argument(
        "--extras", default="", help="with --summary: schedulers of the p99/makespan table"
    )
    args = p.parse_args()
    if args.summary is not None:
        files = args.summary or [args.out]
        print(summary(files))
        if args.jobs:
            for i, spec in enumerate(args.pair.split(";")):
                a, b = spec.split(",")
                text, data = jobs_table(files, (a, b))
                print(text)
                if i == 0:  # the JSON holds the first pair
                    Path(args.jobs).write_text(json.dumps(data, indent=1))
        if args.why:
            for load in args.why_loads.split(","):
                for spec in args.why.split(";"):
                    a, b = spec.split(",")
                    print(why_table(files, (a, b), load))
        if args.extras:
            print(extras_table(files, args.extras.split(",")))
        if args.plots:
            pairs = [tuple(x.split(",")) for x in args.plot_pairs.split(";")]
            for path in plot_pairs(files, [(x[0], x[1]) for x in pairs], args.plots):
                print(f"\n![{Path(path).stem}]({Path(path).name})")
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
