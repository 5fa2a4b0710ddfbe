"""Benchmark: every policy against ``default`` on every built-in scenario and on held-out draws.

Runs each built-in non-colocated scenario with workload seeds ``0..K-1`` (the dynamic
configuration with each policy, every static split once per seed: **all** splits of the
same GPUs, `dynsched_sim._scenario.static_splits`, not only the scenario's) and ``N`` draws of the
held-out family (`dynsched_sim.heldout_scenario`, draws ``HELD_OUT_FIRST_DRAW + i``, with
``M`` workload seeds each: the draw, then draw + 10000, draw + 20000, ...; every policy),
then writes into ``--out``:

- ``runs.jsonl``: every run as it finishes (seconds, lower bound, efficiency, switches,
  re-prefilled tokens); a rerun with the same ``--out`` skips the runs already there
  (``--summarise`` only summarises them);
- ``sweep.json``: the summary below;
- ``table.md``: per scenario, time relative to ``default`` (mean +- standard deviation
  over the seeds, seed-paired), relative to the best static split, efficiency against the
  tight bound; the geometric mean over the scenarios; the same for the held-out draws;
- ``sweep.png``: the relative times with their seed spread, and efficiencies.

    hatch run python benchmarks/sim_policy_sweep.py --seeds 5 --held-out 20 \\
        --held-out-seeds 3 --workers 2 --out benchmarks/results/policy_sweep

Targets (issue 17): geometric mean >= 5 % shorter than ``default``; on no scenario more
than 1 % slower than the best static split; the same on the held-out draws; efficiency
reported per scenario. ``--quick`` shortens every run (a smoke test, not a measurement).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

POLICIES = ("predictive", "default", "fixed_ratio")
BASELINE = "default"
HELD_OUT_SEED_STRIDE = 10_000  # workload seeds of a draw: draw, draw + 10000, draw + 20000, ...


def _nice() -> None:
    with contextlib.suppress(OSError):  # not permitted: run at the normal priority
        os.nice(10)


def _run(task: tuple[str, int, int, str, str, int | None]) -> dict[str, Any]:
    """One simulated run: ``(scenario or 'heldout', draw, seed, configuration, policy, steps)``."""
    from dynsched_sim import heldout_scenario, load_scenario, run_configuration

    name, draw, seed, conf, policy, steps = task
    sc = heldout_scenario(draw) if name == "heldout" else load_scenario(name)
    if steps is not None:
        sc = sc.with_steps(steps)
    t0 = time.perf_counter()
    r = run_configuration(sc, _configuration(sc, conf), policy, seed=seed)
    return {
        "scenario": sc.name,
        "family": "heldout" if name == "heldout" else "builtin",
        "seed": seed,
        "configuration": conf,
        "policy": r.policy,
        "wall_clock_s": r.wall_clock_s,
        "lower_bound_s": r.lower_bound_s,
        "efficiency": r.efficiency,
        "activations": r.summary["activations"],
        "reprefill_tokens": r.summary["reprefill_tokens"],
        "conserved": all(r.conservation.values()),
        "real_s": time.perf_counter() - t0,
    }


def _configurations(sc: Any) -> list[Any]:
    """The scenario's configurations with hybrid replicas, then every static split of its
    GPUs (the "best static split" is the best of all of them)."""
    from dynsched_sim._scenario import static_splits

    return [c for c in sc.configurations if c.hybrid] + list(static_splits(sc))


def _configuration(sc: Any, name: str) -> Any:
    """The configuration ``name`` of ``sc``: its own, or one of its static splits."""
    return next((c for c in _configurations(sc) if c.name == name), None) or sc.configuration(name)


def tasks(
    scenarios: Iterable[str],
    seeds: int,
    held_out: int,
    policies: Iterable[str],
    steps: int | None,
    held_out_seeds: int = 1,
) -> list[tuple[str, int, int, str, str, int | None]]:
    from dynsched_sim import HELD_OUT_FIRST_DRAW, heldout_scenario, load_scenario

    confs = {name: _configurations(load_scenario(name)) for name in scenarios}
    per_seed = [
        [
            (name, 0, seed, conf.name, p, steps)
            for name in scenarios
            for conf in confs[name]
            for p in (policies if conf.hybrid else ("static_fully_async",))
        ]
        for seed in range(seeds)
    ]
    held = []
    for j in range(held_out_seeds):
        for i in range(held_out):
            draw = HELD_OUT_FIRST_DRAW + i
            # workload seed j of a draw: the draw itself first, then draw + 10000 j
            seed = draw + HELD_OUT_SEED_STRIDE * j
            for conf in _configurations(heldout_scenario(draw)):
                for p in policies if conf.hybrid else ("static_fully_async",):
                    held.append(("heldout", draw, seed, conf.name, p, steps))
    # seed by seed (a partial sweep covers every scenario), the held-out draws after three
    first = [t for chunk in per_seed[:3] for t in chunk]
    rest = [t for chunk in per_seed[3:] for t in chunk]
    return first + held + rest


def _key(r: dict[str, Any]) -> tuple[str, int, str, str]:
    return (r["scenario"], r["seed"], r["configuration"], r["policy"])


def _task_key(t: tuple[str, int, int, str, str, int | None]) -> tuple[str, int, str, str]:
    name, draw, seed, conf, policy, _ = t
    return (f"heldout-{draw}" if name == "heldout" else name, seed, conf, policy)


def _complete(runs: list[dict[str, Any]], policies: Iterable[str]) -> list[dict[str, Any]]:
    """Only (scenario, seed) groups with every policy and every static split run."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        groups[(r["scenario"], r["seed"])].append(r)
    keep = []
    for rs in groups.values():
        have = {r["policy"] for r in rs}
        need = set(policies)
        if need <= have and any(r["policy"] == "static_fully_async" for r in rs):
            keep += rs
    return keep


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    return (statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _geomean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else math.nan


def summarise(runs: list[dict[str, Any]], policies: Iterable[str]) -> dict[str, Any]:
    """Per scenario: relative times (seed-paired), vs best static, efficiencies; geomeans."""
    by: dict[str, dict[int, dict[str, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    family: dict[str, str] = {}
    for r in runs:
        key = r["policy"] if r["policy"] != "static_fully_async" else r["configuration"]
        by[r["scenario"]][r["seed"]][key] = r
        family[r["scenario"]] = r["family"]
    rows = {}
    for scen, seeds in sorted(by.items()):
        row: dict[str, Any] = {"family": family[scen], "seeds": len(seeds)}
        statics = sorted({k for s in seeds.values() for k in s if k.startswith("static")})
        present = [p for p in policies if all(p in s for s in seeds.values())]
        for key in (*present, *statics):
            rel = [s[key]["wall_clock_s"] / s[BASELINE]["wall_clock_s"] for s in seeds.values()]
            row[f"rel/{key}"] = _mean_sd(rel)
        for p in present:
            vs = [
                s[p]["wall_clock_s"] / min(s[k]["wall_clock_s"] for k in statics)
                for s in seeds.values()
            ]
            row[f"vs_best_static/{p}"] = _mean_sd(vs)
            row[f"efficiency/{p}"] = _mean_sd([s[p]["efficiency"] for s in seeds.values()])
            row[f"hours/{p}"] = _mean_sd([s[p]["wall_clock_s"] / 3600 for s in seeds.values()])
        row["best_static"] = min(statics, key=lambda k: row[f"rel/{k}"][0])
        row["conserved"] = all(r["conserved"] for s in seeds.values() for r in s.values())
        rows[scen] = row
    summary: dict[str, Any] = {"scenarios": rows}
    for fam in ("builtin", "heldout"):
        fam_rows = [r for r in rows.values() if r["family"] == fam]
        if not fam_rows:
            continue
        summary[fam] = {}
        for p in policies:
            have = [r for r in fam_rows if f"rel/{p}" in r]
            if not have:
                continue
            summary[fam][p] = {
                "scenarios": len(have),
                "geomean_rel_default": _geomean(r[f"rel/{p}"][0] for r in have),
                "worst_vs_best_static": max(r[f"vs_best_static/{p}"][0] for r in have),
                "scenarios_over_1pct_vs_best_static": sum(
                    r[f"vs_best_static/{p}"][0] > 1.01 for r in have
                ),
                "min_efficiency": min(r[f"efficiency/{p}"][0] for r in have),
                "geomean_vs_best_static": _geomean(r[f"vs_best_static/{p}"][0] for r in have),
            }
    return summary


def table(summary: dict[str, Any], policies: list[str], command: str) -> str:
    lines = [
        "# Policy sweep (simulated; relative to `default`, seed-paired mean ± sd)",
        "",
        f"Command: `{command}`",
        "",
    ]
    for fam, title in (("builtin", "Built-in scenarios"), ("heldout", "Held-out draws")):
        rows = {k: v for k, v in summary["scenarios"].items() if v["family"] == fam}
        if not rows:
            continue
        lines += [f"## {title}", ""]
        head = ["scenario", "seeds"]
        head += [f"{p} / default" for p in policies if p != BASELINE]
        head += ["best static / default", "predictive / best static"]
        head += [f"eff {p}" for p in policies]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for scen, r in rows.items():
            cells = [scen, str(r["seeds"])]
            cells += [
                "{:.3f} ± {:.3f}".format(*r[f"rel/{p}"]) if f"rel/{p}" in r else "-"
                for p in policies
                if p != BASELINE
            ]
            cells.append("{:.3f} ({})".format(r[f"rel/{r['best_static']}"][0], r["best_static"]))
            cells.append("{:.3f} ± {:.3f}".format(*r["vs_best_static/predictive"]))
            cells += [
                "{:.3f}".format(r[f"efficiency/{p}"][0]) if f"efficiency/{p}" in r else "-"
                for p in policies
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        for p in summary[fam]:
            s = summary[fam][p]
            lines.append(
                f"- `{p}` ({s['scenarios']} scenarios): geomean {s['geomean_rel_default']:.4f} "
                "of default; worst "
                f"{s['worst_vs_best_static']:.4f} of the best static split "
                f"({s['scenarios_over_1pct_vs_best_static']} scenario(s) more than 1 % slower); "
                f"lowest efficiency {s['min_efficiency']:.3f}"
            )
        lines.append("")
    return "\n".join(lines)


def plot(summary: dict[str, Any], policies: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["scenarios"]
    names = list(rows)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(max(8, 0.45 * len(names) + 3), 8))
    keys = [p for p in policies if p != BASELINE] + ["best static"]
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        if key == "best static":
            vals = [rows[n][f"rel/{rows[n]['best_static']}"] for n in names]
        else:
            vals = [rows[n].get(f"rel/{key}", (0.0, 0.0)) for n in names]
        xs = [j + (i - (len(keys) - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, [v[0] for v in vals], width, yerr=[v[1] for v in vals], label=key, capsize=2)
    ax.axhline(1.0, color="k", lw=0.8)
    for fam, style in (("builtin", "--"), ("heldout", ":")):
        if fam in summary:
            g = summary[fam]["predictive"]["geomean_rel_default"]
            ax.axhline(g, color="C0", ls=style, lw=1, label=f"predictive geomean ({fam}) {g:.3f}")
    ax.set_ylabel("time / default")
    ax.set_ylim(0.6, None)
    ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
    ax.legend(fontsize=7)
    for i, p in enumerate(policies):
        xs = [j + (i - (len(policies) - 1) / 2) * (0.8 / len(policies)) for j in range(len(names))]
        effs = [rows[n].get(f"efficiency/{p}", (0.0, 0.0))[0] for n in names]
        ax2.bar(xs, effs, 0.8 / len(policies), label=p)
    ax2.axhline(0.9, color="k", ls=":", lw=0.8, label="moonshot 0.9")
    ax2.set_ylabel("efficiency (bound / time)")
    ax2.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
    ax2.set_ylim(0, 1.05)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", nargs="*", default=None, help="default: every non-colocated one")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--held-out", type=int, default=20)
    ap.add_argument(
        "--held-out-seeds", type=int, default=3, help="workload seeds per held-out draw"
    )
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--workers", type=int, default=2, help="process pool size (at most 2 here)")
    ap.add_argument("--quick", action="store_true", help="8 steps per run (smoke test)")
    ap.add_argument("--out", default="policy-sweep", help="output folder (or a .json file)")
    ap.add_argument("--summarise", action="store_true", help="only summarise runs.jsonl")
    args = ap.parse_args(argv)
    from dynsched_sim import builtin_scenarios, load_scenario

    scenarios = args.scenario
    if scenarios is None:
        scenarios = [
            n
            for n in builtin_scenarios()
            if any(c.rollout_gpus for c in load_scenario(n).configurations)
        ]
    policies = list(dict.fromkeys([BASELINE, *args.policies]))
    policies = [p for p in args.policies if p in policies] + (
        [BASELINE] if BASELINE not in args.policies else []
    )
    for field in ("seeds", "held_out", "held_out_seeds", "workers"):
        if getattr(args, field) < (1 if field in ("workers", "held_out_seeds") else 0):
            ap.error(f"--{field.replace('_', '-')} must be >= 1 (got {getattr(args, field)})")
    todo = tasks(
        scenarios,
        args.seeds,
        args.held_out,
        policies,
        8 if args.quick else None,
        held_out_seeds=args.held_out_seeds,
    )
    command = "hatch run python benchmarks/sim_policy_sweep.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    out = Path(args.out)
    single_file = out.suffix == ".json"  # benchmarks/run_all.py --out FILE.json
    folder = out.parent if single_file else out
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / (out.stem + ".runs.jsonl" if single_file else "runs.jsonl")
    runs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    done = {_key(r) for r in runs}
    todo = [t for t in todo if _task_key(t) not in done]
    t0 = time.perf_counter()
    print(f"{len(todo)} runs to do on {args.workers} worker(s), {len(runs)} done", file=sys.stderr)
    if not args.summarise and todo:
        with log.open("a") as fh:
            if args.workers > 1:
                with ProcessPoolExecutor(max_workers=args.workers, initializer=_nice) as pool:
                    futures = [pool.submit(_run, t) for t in todo]
                    for i, fut in enumerate(as_completed(futures), 1):
                        r = fut.result()
                        runs.append(r)
                        fh.write(json.dumps(r) + "\n")
                        fh.flush()
                        if i % 10 == 0:
                            print(f"  {i}/{len(todo)}", file=sys.stderr, flush=True)
            else:
                _nice()
                for t in todo:
                    r = _run(t)
                    runs.append(r)
                    fh.write(json.dumps(r) + "\n")
                    fh.flush()
    runs = _complete(runs, policies)
    summary = summarise(runs, policies)
    if single_file:
        out.write_text(json.dumps({"summary": summary}, indent=1))
        print(table(summary, policies, command))
        return 0
    (out / "sweep.json").write_text(json.dumps({"command": command, "summary": summary}, indent=1))
    (out / "table.md").write_text(table(summary, policies, command) + "\n")
    plot(summary, policies, out / "sweep.png")
    print(table(summary, policies, command))
    print(f"{len(runs)} runs in {time.perf_counter() - t0:.0f} s -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
