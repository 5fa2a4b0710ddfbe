"""Compare configurations and policies: run them, tabulate, plot, write ``result.json``."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from dynsched_sim._scenario import Scenario
from dynsched_sim._sim import RunResult, policy_for, run_configuration

__all__ = ["Comparison", "compare", "format_table", "write_outputs"]

logger = logging.getLogger(__name__)

LOWER_BOUND_FORMULA = (
    "LB = max((steps*o*g_T + min_S sum_i (R_i/p + c*K_i)) / G, steps*o + c*min_S sum_i K_i / g_T)"
)

Comparison = list[RunResult]


def compare(
    scenario: Scenario,
    policies: Sequence[str] = ("default",),
    *,
    seed: int | None = None,
    progress: Callable[[str], Callable[[int, int, float], None] | None] | None = None,
) -> Comparison:
    """Run every configuration of ``scenario``: static ones once, dynamic ones per policy."""
    runs: Comparison = []
    for conf in scenario.configurations:
        names = [policy_for(conf, p) for p in policies] if conf.hybrid else [policy_for(conf, "")]
        for pol in dict.fromkeys(names):
            label = f"{conf.name}/{pol}"
            cb = progress(label) if progress is not None else None
            runs.append(run_configuration(scenario, conf, pol, seed=seed, progress=cb))
    return runs


def _speedups(runs: Comparison, scenario: Scenario) -> dict[int, dict[str, float]]:
    statics = {
        r.configuration: r.wall_clock_s
        for r in runs
        if not scenario.configuration(r.configuration).hybrid
    }
    return {
        i: {name: w / r.wall_clock_s for name, w in statics.items()} for i, r in enumerate(runs)
    }


def _true(r: RunResult) -> tuple[float | None, float | None, float]:
    """True train, rollout and cluster utilization; None for a GPU group the run lacks
    (no standalone pool in colocated mode)."""
    tu = r.true_utilization
    train = tu["trainer"]["train"] if "trainer" in tu else None
    roll = tu["standalone"]["rollout"] if "standalone" in tu else None
    cl = tu.get("cluster", {})
    return train, roll, cl.get("train", 0.0) + cl.get("rollout", 0.0)


def _cell(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def format_table(scenario: Scenario, runs: Comparison) -> str:
    """The comparison table (plain text)."""
    sp = _speedups(runs, scenario)
    statics = [c.name for c in scenario.configurations if not c.hybrid]
    head = [
        "configuration",
        "policy",
        "wall h",
        *[f"x vs {s}" for s in statics],
        "bound h",
        "effic.",
        "train util proxy/true",
        "rollout util proxy/true",
        "cluster util proxy/true",
        "mq mean",
        "switches",
        "aborted",
        "re-routed",
    ]
    rows = []
    for i, r in enumerate(runs):
        p = r.proxy_metrics
        t_train, t_roll, t_cl = _true(r)
        s = r.summary
        rows.append(
            [
                r.configuration,
                r.policy,
                f"{r.wall_clock_s / 3600:.3f}",
                *[f"{sp[i].get(n, float('nan')):.3f}" for n in statics],
                f"{r.lower_bound_s / 3600:.3f}",
                f"{r.efficiency:.3f}",
                f"{p['dynamic_resource/train_resource_utilization']:.2f} / {_cell(t_train)}",
                f"{p['dynamic_resource/rollout_resource_utilization']:.2f} / {_cell(t_roll)}",
                f"{p['dynamic_resource/resource_utilization']:.2f} / {t_cl:.2f}",
                f"{s['mq_size_mean']:.1f}",
                str(s["switches"]),
                str(s["aborted_requests"]),
                str(s["rerouted_requests"]),
            ]
        )
    widths = [max(len(h), *(len(row[j]) for row in rows)) for j, h in enumerate(head)]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    if scenario.published:
        pub = ", ".join(f"{k} {v / 3600:.3f} h" for k, v in scenario.published.items())
        out.append(f"published wall-clock: {pub}")
    return "\n".join(out)


def result_json(
    scenario: Scenario, runs: Comparison, policies: Sequence[str], seed: int
) -> dict[str, Any]:
    """The content of ``result.json``."""
    sp = _speedups(runs, scenario)
    entries = []
    for i, r in enumerate(runs):
        d = r.to_json()
        d["speedup_vs"] = sp[i]
        t_train, t_roll, t_cl = _true(r)
        d["true_train_utilization"] = t_train
        d["true_rollout_utilization"] = t_roll
        d["true_cluster_utilization"] = t_cl
        entries.append(d)
    return {
        "scenario": scenario.name,
        "seed": seed,
        "steps": scenario.steps,
        "policies": list(policies),
        "published_wall_clock_s": dict(scenario.published),
        "lower_bound_formula": LOWER_BOUND_FORMULA,
        "runs": entries,
    }


def write_outputs(
    scenario: Scenario,
    runs: Comparison,
    out_dir: str | os.PathLike[str],
    *,
    policies: Sequence[str],
    seed: int,
    plots: bool = True,
) -> dict[str, str]:
    """Write ``result.json``, ``table.txt`` and the plots into ``out_dir``; return the paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths: dict[str, str] = {}
    p = os.path.join(out_dir, "result.json")
    with open(p, "w") as f:
        json.dump(result_json(scenario, runs, policies, seed), f, indent=1)
        f.write("\n")
    paths["result"] = p
    p = os.path.join(out_dir, "table.txt")
    with open(p, "w") as f:
        f.write(format_table(scenario, runs) + "\n")
    paths["table"] = p
    if plots:
        paths.update(_plots(runs, out_dir))
    return paths


def _plots(runs: Comparison, out_dir: str | os.PathLike[str]) -> dict[str, str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from dynsched_metrics import plot_queue_size, plot_resource_layout, plot_utilizations
    except ImportError as e:  # pragma: no cover - plot extra missing
        logger.warning("plots skipped: %s", e)
        return {}
    base = os.fspath(out_dir)
    label = {id(r): f"{r.configuration}/{r.policy}" for r in runs}
    paths = {}
    queue_rows = {
        label[id(r)]: [{"step": s[0], "dynamic_resource/mq_size": s[2]} for s in r.steps]
        for r in runs
    }
    cap = max((r.queue_capacity for r in runs), default=None) or None
    paths["queue_size"] = plot_queue_size(
        queue_rows, os.path.join(base, "queue_size.png"), queue_capacity=cap
    )
    util_rows = {label[id(r)]: [dict(c) for c in r.cycles] for r in runs}
    paths["utilization"] = plot_utilizations(util_rows, os.path.join(base, "utilization.png"))
    for r in runs:
        name = f"layout_{r.configuration}_{r.policy}.png"
        paths[f"layout:{label[id(r)]}"] = plot_resource_layout(
            [*r.mode_events, *r.state_events],
            os.path.join(base, name),
            end_time=r.wall_clock_s,
            show_steps=False,
            title=f"Resource-time layout (ground truth): {label[id(r)]}",
        )
    return paths


class ProgressBar:
    """A one-line progress bar per run on a text stream (stderr by default)."""

    def __init__(self, stream: TextIO | None = None, width: int = 30) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.width = width

    def __call__(self, label: str) -> Callable[[int, int, float], None]:
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        last = [-1]

        def update(step: int, total: int, t: float) -> None:
            fill = int(self.width * step / max(1, total))
            if step < total and (fill == last[0] or not tty):
                return  # redraw only when the bar moves; only the final line when not a terminal
            last[0] = fill
            end = "\n" if step >= total else ""
            self.stream.write(
                f"\r{label:<32} [{'#' * fill}{'.' * (self.width - fill)}] {step}/{total} steps, "
                f"simulated {t / 3600:6.2f} h{end}"
            )
            self.stream.flush()

        return update
