"""Compare configurations and policies over workload seeds: run, aggregate, tabulate, plot.

Every configuration runs once per workload seed (``seed``, ``seed + 1``, ...); static
splits run ``static_fully_async``, the others once per policy. Results are reported as the
mean and the spread (sample standard deviation) over seeds. Speed-ups are paired: for each
seed, a static run's wall-clock over this run's on the same workload. A difference is
*within the spread* when the mean ratio is less than two standard deviations (of the
per-seed ratios) away from 1; the table marks it with ``~`` and such differences should be
read as none.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import attrs
from dynsched_core.storage import atomic_write_text

from dynsched_sim._scenario import Scenario
from dynsched_sim._sim import STATIC_POLICY, RunResult, policy_for, run_configuration

__all__ = [
    "Aggregate",
    "Comparison",
    "Spread",
    "aggregate",
    "compare",
    "format_compact_table",
    "format_table",
    "result_json",
    "seeds_of",
    "write_outputs",
]

logger = logging.getLogger(__name__)

LOWER_BOUND = (
    "role- and cap-aware lower bound: serial trainer with blocking weight syncs, in-order "
    "staleness admission, replica throughput saturating at its concurrency cap, hybrid "
    "replicas idle while their trainer trains, decode iterations against tokens (a "
    "replica cannot both run many sequences and advance many samples' longest responses "
    "fast), replica time (the KV reads of every response), sample slots, each sample's "
    "straggler (dynsched_sim._bound)"
)

WITHIN_SPREAD_SIGMAS = 2.0
"""A mean ratio within this many standard deviations of 1 is marked as no difference."""

Comparison = list[RunResult]


def seeds_of(scenario: Scenario, seed: int | None = None, seeds: int | None = None) -> list[int]:
    """The workload seeds of a comparison: ``seeds`` consecutive seeds from ``seed``
    (defaults: the scenario's ``seed`` and ``seeds``)."""
    first = scenario.seed if seed is None else seed
    count = scenario.seeds if seeds is None else seeds
    if count < 1:
        raise ValueError(f"seeds must be >= 1, got {count}")
    return list(range(first, first + count))


def compare(
    scenario: Scenario,
    policies: Sequence[str] = ("default",),
    *,
    seed: int | None = None,
    seeds: int | None = None,
    progress: Callable[[str], Callable[[int, int, float], None] | None] | None = None,
    into: list[RunResult] | None = None,
) -> Comparison:
    """Run every configuration of ``scenario`` on every seed: static ones once, dynamic ones
    per policy. Runs are ordered by configuration, policy, then seed.

    Args:
        scenario: The scenario.
        policies: Policies for the configurations with hybrid replicas.
        seed: First workload seed (default: the scenario's).
        seeds: Number of seeds (default: the scenario's ``seeds``).
        progress: Called with a run label; returns a per-step progress callback.
        into: Append each run here as soon as it finishes (what an interrupted
            comparison has done); the returned list is this one when given.
    """
    runs: Comparison = into if into is not None else []
    for conf in scenario.configurations:
        names = [policy_for(conf, p) for p in policies] if conf.hybrid else [policy_for(conf, "")]
        for pol in dict.fromkeys(names):
            for s in seeds_of(scenario, seed, seeds):
                label = f"{conf.name}/{pol}/seed {s}"
                cb = progress(label) if progress is not None else None
                runs.append(run_configuration(scenario, conf, pol, seed=s, progress=cb))
    return runs


@attrs.frozen
class Spread:
    """Mean and spread of one quantity over seeds.

    Attributes:
        mean: Mean over seeds.
        std: Sample standard deviation (0 with one seed).
        low: Smallest value.
        high: Largest value.
        n: Number of seeds.
    """

    mean: float
    std: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The spread of ``values`` (at least one)."""
        xs = [float(x) for x in values]
        std = statistics.stdev(xs) if len(xs) > 1 else 0.0
        return cls(statistics.fmean(xs), std, min(xs), max(xs), len(xs))

    def within_spread_of_one(self) -> bool:
        """The mean is within `WITHIN_SPREAD_SIGMAS` standard deviations of 1 (no
        difference); always False with a single seed (no spread to judge by)."""
        return self.n > 1 and abs(self.mean - 1.0) <= WITHIN_SPREAD_SIGMAS * self.std

    def to_json(self) -> dict[str, float]:
        """``{"mean", "std", "min", "max", "n"}``."""
        return {"mean": self.mean, "std": self.std, "min": self.low, "max": self.high, "n": self.n}


@attrs.frozen
class Aggregate:
    """One configuration and policy over all seeds.

    Attributes:
        configuration: Configuration name.
        policy: Policy name.
        seeds: The seeds.
        wall_clock_s: Wall-clock over seeds.
        speedup_vs: Per static configuration, the paired ratio ``static / this``.
        lower_bound_s: The lower bound over seeds.
        efficiency: ``bound / wall-clock`` over seeds.
        proxy: Mean over seeds of each ``dynamic_resource/*`` proxy.
        true_utilization: ``train``, ``rollout`` and ``cluster`` true utilization means
            (None for a GPU group the run does not have).
        summary: Mean over seeds of the numeric summary counters.
        step_times_s: Mean over seeds of each micro-step's duration.
        staleness: Per-sample staleness over seeds (`RunResult.staleness`): the mean over
            seeds of each statistic, except ``max`` (the largest) and ``count`` (the sum).
    """

    configuration: str
    policy: str
    seeds: tuple[int, ...]
    wall_clock_s: Spread
    speedup_vs: dict[str, Spread]
    lower_bound_s: Spread
    efficiency: Spread
    proxy: dict[str, float]
    true_utilization: dict[str, float | None]
    summary: dict[str, float]
    step_times_s: tuple[float, ...]
    staleness: dict[str, float] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (the ``aggregate`` entries of ``result.json``)."""
        return {
            "configuration": self.configuration,
            "policy": self.policy,
            "seeds": list(self.seeds),
            "wall_clock_s": self.wall_clock_s.to_json(),
            "speedup_vs": {k: v.to_json() for k, v in self.speedup_vs.items()},
            "speedup_within_spread": {
                k: v.within_spread_of_one() for k, v in self.speedup_vs.items()
            },
            "lower_bound_s": self.lower_bound_s.to_json(),
            "efficiency": self.efficiency.to_json(),
            "proxy_metrics": dict(self.proxy),
            "true_utilization": dict(self.true_utilization),
            "summary": dict(self.summary),
            "step_times_s": list(self.step_times_s),
            "staleness": dict(self.staleness),
        }


def _true(r: RunResult) -> tuple[float | None, float | None, float]:
    """True train, rollout and cluster utilization; None for a GPU group the run lacks
    (no standalone pool in colocated mode)."""
    tu = r.true_utilization
    train = tu["trainer"]["train"] if "trainer" in tu else None
    roll = tu["standalone"]["rollout"] if "standalone" in tu else None
    cl = tu.get("cluster", {})
    return train, roll, cl.get("train", 0.0) + cl.get("rollout", 0.0)


def step_times(r: RunResult) -> list[float]:
    """Duration of each micro-step of a run (seconds)."""
    ends = [s[1] for s in r.steps]
    return [b - a for a, b in zip([0.0, *ends[:-1]], ends, strict=True)]


def _staleness(rs: Sequence[RunResult]) -> dict[str, float]:
    """`Aggregate.staleness` of the runs of one configuration and policy."""
    keys = [k for k in rs[0].staleness if all(k in r.staleness for r in rs)]
    combine: dict[str, Callable[[list[float]], float]] = {"max": max, "count": sum}
    return {k: combine.get(k, statistics.fmean)([float(r.staleness[k]) for r in rs]) for k in keys}


def _mean_opt(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.fmean(vals) if vals else None


def aggregate(scenario: Scenario, runs: Comparison) -> list[Aggregate]:
    """Group ``runs`` by configuration and policy; mean and spread over seeds."""
    statics = {c.name for c in scenario.configurations if not c.hybrid}
    static_wall = {
        (r.configuration, r.seed): r.wall_clock_s for r in runs if r.configuration in statics
    }
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in runs:
        groups.setdefault((r.configuration, r.policy), []).append(r)
    out = []
    for (conf, pol), rs in groups.items():
        speed = {}
        for s in sorted(statics):
            pairs = [
                static_wall[(s, r.seed)] / r.wall_clock_s for r in rs if (s, r.seed) in static_wall
            ]
            if pairs:
                speed[s] = Spread.of(pairs)
        trues = [_true(r) for r in rs]
        numeric = {
            k: statistics.fmean(float(r.summary[k]) for r in rs)
            for k, v in rs[0].summary.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        times = [step_times(r) for r in rs]
        width = min(len(t) for t in times)
        out.append(
            Aggregate(
                configuration=conf,
                policy=pol,
                seeds=tuple(r.seed for r in rs),
                wall_clock_s=Spread.of([r.wall_clock_s for r in rs]),
                speedup_vs=speed,
                lower_bound_s=Spread.of([r.lower_bound_s for r in rs]),
                efficiency=Spread.of([r.efficiency for r in rs]),
                proxy={
                    k: statistics.fmean(float(r.proxy_metrics[k]) for r in rs)
                    for k in rs[0].proxy_metrics
                },
                true_utilization={
                    "train": _mean_opt([t[0] for t in trues]),
                    "rollout": _mean_opt([t[1] for t in trues]),
                    "cluster": _mean_opt([t[2] for t in trues]),
                },
                summary=numeric,
                step_times_s=tuple(statistics.fmean(t[i] for t in times) for i in range(width)),
                staleness=_staleness(rs),
            )
        )
    return out


def _cell(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _stale_cell(st: dict[str, float]) -> str:
    """``mean/p95/max`` staleness (``-`` for runs recorded without it)."""
    if "mean" not in st:
        return "-"
    return f"{st['mean']:.2f}/{st['p95']:.0f}/{st['max']:.0f}"


def _pm(s: Spread, scale: float = 1.0, digits: int = 3, gap: str = " ") -> str:
    """``mean ±std`` over the seeds (the mean alone for one seed); ``gap`` before ``±``."""
    if s.n == 1:
        return f"{s.mean / scale:.{digits}f}"
    return f"{s.mean / scale:.{digits}f}{gap}±{s.std / scale:.{digits}f}"


def _short(s: Spread, scale: float = 1.0) -> str:
    """`_pm` for the compact table: two digits, no gap."""
    return _pm(s, scale, 2, gap="")


def _ratio(s: Spread | None, *, short: bool = False) -> str:
    """A speed-up, ``~`` marking one within the spread of 1; ``-`` where there is none."""
    if s is None:
        return "-"
    return ("~" if s.within_spread_of_one() else "") + (_short(s) if short else _pm(s))


#: Width the compact view of `format_table` is meant to fit (a terminal, a README block).
COMPACT_WIDTH = 100


def _columns(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(row[j]) for row in rows)) for j, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    out.append("  ".join("-" * w for w in widths))
    out += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return out


def format_compact_table(scenario: Scenario, runs: Comparison, *, published: bool = True) -> str:
    """The compact view of the comparison (fits `COMPACT_WIDTH` columns for the built-in
    scenarios), with a legend; `format_table` is the full view.

    Columns: wall-clock in hours, speed-up over each static split, efficiency against the
    lower bound, true cluster utilization and switches, each a mean over seeds (``±``: the
    standard deviation).
    """
    aggs = aggregate(scenario, runs)
    statics = [c.name for c in scenario.configurations if not c.hybrid]
    head = ["configuration", "policy", "wall h", *[f"x{s}" for s in statics], "eff", "util"]
    head.append("switches")
    rows = []
    for a in aggs:
        cluster = a.true_utilization["cluster"]
        rows.append(
            [
                a.configuration,
                a.policy,
                _short(a.wall_clock_s, 3600.0),
                *[
                    _ratio(a.speedup_vs.get(n), short=True) if n != a.configuration else "-"
                    for n in statics
                ],
                _short(a.efficiency),
                _cell(cluster),
                f"{a.summary['switches']:.0f}",
            ]
        )
    out = _columns(head, rows)
    seeds = sorted({r.seed for r in runs})
    out.append("")
    out.append("wall h: simulated wall-clock (hours); x<split>: speed-up over that static split")
    out.append("  (its wall-clock / this one); eff: lower bound / wall-clock (1 = the bound);")
    out.append("  util: true cluster GPU utilization; switches: hybrid activations + deactivations")
    out += staleness_lines(aggs)
    if len(seeds) > 1:
        out.append(
            f"±: std over {len(seeds)} workload seeds ({seeds[0]}..{seeds[-1]}); "
            f"~: within {WITHIN_SPREAD_SIGMAS:g} std of 1 (no difference)"
        )
    out.append("full view (bound, proxy metrics, queue, aborts): --full, and table.txt")
    if published:
        out += published_lines(scenario, aggs)
    return "\n".join(out)


def format_table(scenario: Scenario, runs: Comparison, *, published: bool = True) -> str:
    """The comparison table (plain text): one row per configuration and policy, mean and
    spread over the seeds of ``runs`` (the full view; `format_compact_table` is the
    compact one). ``published=False`` leaves out the published wall-clock lines (for a
    run whose step count differs from the published one)."""
    aggs = aggregate(scenario, runs)
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
        "stale mean/p95/max",
    ]
    rows = []
    for a in aggs:
        p, t, s = a.proxy, a.true_utilization, a.summary
        rows.append(
            [
                a.configuration,
                a.policy,
                _pm(a.wall_clock_s, 3600.0),
                *[_ratio(a.speedup_vs.get(n)) if n != a.configuration else "-" for n in statics],
                _pm(a.lower_bound_s, 3600.0),
                _pm(a.efficiency),
                f"{p['dynamic_resource/train_resource_utilization']:.2f} / {_cell(t['train'])}",
                f"{p['dynamic_resource/rollout_resource_utilization']:.2f} / {_cell(t['rollout'])}",
                f"{p['dynamic_resource/resource_utilization']:.2f} / {_cell(t['cluster'])}",
                f"{s['mq_size_mean']:.1f}",
                f"{s['switches']:.0f}",
                f"{s['aborted_requests']:.0f}",
                f"{s['rerouted_requests']:.0f}",
                _stale_cell(a.staleness),
            ]
        )
    widths = [max(len(h), *(len(row[j]) for row in rows)) for j, h in enumerate(head)]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    seeds = sorted({r.seed for r in runs})
    if len(seeds) > 1:
        out.append(
            f"mean ±std over {len(seeds)} workload seeds ({seeds[0]}..{seeds[-1]}); "
            f"~ marks a ratio within {WITHIN_SPREAD_SIGMAS:g} std of 1 (no difference)"
        )
    if published:
        out += published_lines(scenario, aggs)
    return "\n".join(out)


def staleness_lines(aggs: Sequence[Aggregate]) -> list[str]:
    """One wrapped line: each row's staleness (``mean/p95/max`` policy versions behind per
    consumed sample, by the first token's version); nothing for runs without it."""
    cells = [
        f"{a.configuration}{'' if a.policy == STATIC_POLICY else '/' + a.policy} "
        f"{_stale_cell(a.staleness)}"
        for a in aggs
        if "mean" in a.staleness
    ]
    if not cells:
        return []
    text = "staleness (versions behind per sample, mean/p95/max): " + ", ".join(cells)
    return textwrap.wrap(text, COMPACT_WIDTH, subsequent_indent="  ")


def published_lines(scenario: Scenario, aggs: Sequence[Aggregate]) -> list[str]:
    """Simulated against published wall-clock: which configurations the fitted rates were
    fitted to and the residual of each prediction."""
    if not scenario.published:
        return []
    fitted = bool(scenario.fitted())
    lines = []
    for name, pub in scenario.published.items():
        sims = [a for a in aggs if a.configuration == name]
        if not sims:
            continue
        conf = scenario.configuration(name)
        for a in sims:
            kind = "fitted" if fitted and not conf.hybrid else "predicted"
            lines.append(
                f"published {name}: {pub / 3600:.3f} h; simulated "
                f"{_pm(a.wall_clock_s, 3600.0)} h ({a.policy}, {kind}), residual "
                f"{a.wall_clock_s.mean / pub - 1:+.1%}"
            )
    return lines


def result_json(
    scenario: Scenario, runs: Comparison, policies: Sequence[str], seeds: Sequence[int]
) -> dict[str, Any]:
    """The content of ``result.json``: every run, and the aggregate over seeds."""
    static_wall = {
        (r.configuration, r.seed): r.wall_clock_s
        for r in runs
        if not scenario.configuration(r.configuration).hybrid
    }
    entries = []
    for r in runs:
        d = r.to_json()
        d["speedup_vs"] = {
            name: w / r.wall_clock_s for (name, s), w in static_wall.items() if s == r.seed
        }
        t_train, t_roll, t_cl = _true(r)
        d["true_train_utilization"] = t_train
        d["true_rollout_utilization"] = t_roll
        d["true_cluster_utilization"] = t_cl
        entries.append(d)
    aggs = aggregate(scenario, runs)
    return {
        "scenario": scenario.name,
        "seeds": list(seeds),
        "steps": scenario.steps,
        "policies": list(policies),
        "published_wall_clock_s": dict(scenario.published),
        "fitted_parameters": scenario.fitted(),
        "lower_bound": LOWER_BOUND,
        "within_spread_sigmas": WITHIN_SPREAD_SIGMAS,
        "aggregate": [a.to_json() for a in aggs],
        "runs": entries,
    }


def write_outputs(
    scenario: Scenario,
    runs: Comparison,
    out_dir: str | os.PathLike[str],
    *,
    policies: Sequence[str],
    seeds: Sequence[int],
    plots: bool = True,
    partial: bool = False,
    published: bool = True,
) -> dict[str, str]:
    """Write ``result.json``, ``table.txt`` and the plots (runs of the first seed) into
    ``out_dir``; return the paths.

    ``partial=True`` (an interrupted comparison) marks both files as partial:
    ``"partial": true`` in ``result.json`` and a first line saying so in ``table.txt``.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths: dict[str, str] = {}
    p = os.path.join(out_dir, "result.json")
    data = result_json(scenario, runs, policies, seeds)
    data["partial"] = partial
    # written whole or not at all (an interrupt mid-write leaves the previous file)
    atomic_write_text(p, json.dumps(data, indent=1) + "\n")
    paths["result"] = p
    p = os.path.join(out_dir, "table.txt")
    head = (
        f"PARTIAL: interrupted after {len(runs)} run(s); the missing runs are absent\n"
        if partial
        else ""
    )
    atomic_write_text(p, head + format_table(scenario, runs, published=published) + "\n")
    paths["table"] = p
    if plots:
        first = min(r.seed for r in runs)
        paths.update(_plots([r for r in runs if r.seed == first], out_dir))
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
