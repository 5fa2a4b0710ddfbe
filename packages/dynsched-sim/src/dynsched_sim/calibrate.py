"""Fit the two rates the static runs identify, then predict the dynamic run.

Run ``python -m dynsched_sim.calibrate [--scenario seed-qwen35] [--seeds K] [--out FILE]``.

Only two quantities are fitted, each to the published wall-clock of the static
configuration it dominates (every evaluation is the mean over the scenario's workload
seeds of a full simulation with the real core; static configurations run
``static_fully_async``):

1. the **decode speed**: ``engine.decode_base_s`` and ``engine.decode_per_seq_s`` scaled
   by one factor (their ratio stays as written in the scenario), so the rollout-bound
   configuration (``static-16-16``) takes its published time;
2. the **trainer speed**: ``trainer.gpu_s_per_token``, so the training-bound
   configuration (``static-8-24``) takes its published time.

The two fits are alternated until both hold to 0.1 %. Everything else (hardware, model,
memory fractions, switch costs, workload, schedule) stays as written and labelled in the
scenario file. The dynamic configuration is never fitted: its simulated time is a
**prediction**, reported with its residual against the published time whatever it is.
A fit that ends at the edge of its search range is flagged.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from dynsched_sim._scenario import Scenario, load_scenario, scenario_to_dict
from dynsched_sim._sim import policy_for, run_configuration

__all__ = [
    "ASSUMPTIONS",
    "CalibrationReport",
    "Fit",
    "Sensitivity",
    "calibrate",
    "main",
    "mean_wall",
    "needed_value",
    "refit_spread",
    "scenario_to_dict",
    "sensitivity",
    "spread_of_refits",
]

DECODE_RANGE = (1 / 50, 50.0)
"""Search range of the decode-speed factor (relative to the scenario's values)."""
TRAINER_RANGE = (1e-6, 1.0)
"""Search range of ``trainer.gpu_s_per_token`` (GPU-seconds per token)."""
TOLERANCE = 1e-3
START_POINTS: tuple[tuple[float, float], ...] = (
    (1.0, 1.0),
    (0.8, 1.25),
    (1.25, 0.8),
    (0.9, 0.9),
    (1.1, 1.1),
)
"""Starting points of the refits (`refit_spread`): ``(decode factor, trainer factor)``
multiplying the scenario's decode speed and ``trainer.gpu_s_per_token`` before fitting
(judgement: 10-25 % either way, both directions of both rates)."""


@attrs.frozen
class Fit:
    """One fitted rate.

    Attributes:
        parameter: What was fitted.
        value: The fitted value.
        search_range: Where it was searched.
        at_edge: The fit stopped at an end of the range (the target may be out of reach).
        target_s: The published wall-clock it was fitted to.
        achieved_s: Mean simulated wall-clock with the fitted value.
    """

    parameter: str
    value: float
    search_range: tuple[float, float]
    at_edge: bool
    target_s: float
    achieved_s: float


@attrs.frozen
class CalibrationReport:
    """The two fits and the prediction they give.

    Attributes:
        decode_base_s: Fitted ``engine.decode_base_s``.
        decode_per_seq_s: Fitted ``engine.decode_per_seq_s``.
        gpu_s_per_token: Fitted ``trainer.gpu_s_per_token``.
        fits: The two `Fit` records.
        seeds: Workload seeds every evaluation averaged over.
        wall_clock_s: Per configuration, the mean simulated wall-clock.
        wall_clock_std_s: Per configuration, the standard deviation over seeds.
        predicted: Name of the predicted (not fitted) configuration.
        residual: ``predicted / published - 1`` of that configuration.
        ratios: Per static configuration, ``mean static / mean predicted``.
        evaluations: Simulations run.
    """

    decode_base_s: float
    decode_per_seq_s: float
    gpu_s_per_token: float
    fits: tuple[Fit, ...]
    seeds: tuple[int, ...]
    wall_clock_s: dict[str, float]
    wall_clock_std_s: dict[str, float]
    predicted: str
    residual: float
    ratios: dict[str, float]
    evaluations: int


def mean_wall(
    sc: Scenario, name: str, seeds: Sequence[int], policy: str = "default"
) -> tuple[float, float]:
    """Mean and standard deviation over ``seeds`` of the wall-clock of configuration ``name``."""
    conf = sc.configuration(name)
    walls = [
        run_configuration(sc, conf, policy_for(conf, policy), seed=s).wall_clock_s for s in seeds
    ]
    return statistics.fmean(walls), statistics.stdev(walls) if len(walls) > 1 else 0.0


def _solve(
    f: Callable[[float], float],
    x0: float,
    target: float,
    lo: float,
    hi: float,
    *,
    increasing: bool,
    iters: int = 12,
) -> tuple[float, float, bool]:
    """Solve ``f(x) = target`` for a monotone ``f`` on ``[lo, hi]`` (secant in log space,
    safeguarded by bisection). Returns ``(x, f(x), at_edge)``."""
    x, y = x0, f(x0)
    lo_b, hi_b = lo, hi  # bracket, tightened as we go
    prev: tuple[float, float] | None = None
    for _ in range(iters):
        if abs(y / target - 1) < TOLERANCE:
            return x, y, False
        too_high = (y > target) == increasing
        if too_high:
            hi_b = min(hi_b, x)
        else:
            lo_b = max(lo_b, x)
        if prev is not None and prev[1] != y and prev[0] != x:
            slope = (math.log(y) - math.log(prev[1])) / (math.log(x) - math.log(prev[0]))
        else:
            slope = 1.0 if increasing else -1.0
        if slope == 0 or (slope > 0) != increasing:
            slope = 1.0 if increasing else -1.0
        nxt = x * math.exp((math.log(target) - math.log(y)) / slope)
        if not lo_b < nxt < hi_b:
            nxt = math.sqrt(lo_b * hi_b)
        prev = (x, y)
        if nxt == x:
            break
        x, y = nxt, f(nxt)
    at_edge = min(abs(math.log(x / lo)), abs(math.log(x / hi))) < 1e-3 or not (
        abs(y / target - 1) < TOLERANCE
    )
    return x, y, at_edge


class _Fitting:
    """The alternating fit in progress: the scenario so far and the simulations run.

    Every evaluation is the mean wall-clock over ``seeds`` of one configuration; the
    decode factor always scales the *original* scenario's decode times.
    """

    def __init__(
        self, scenario: Scenario, seeds: tuple[int, ...], rollout_bound: str, train_bound: str
    ) -> None:
        self.sc = scenario
        self.seeds = seeds
        self.evals = 0
        self.rollout_bound, self.train_bound = rollout_bound, train_bound
        self._base0, self._per0 = scenario.engine.decode_base_s, scenario.engine.decode_per_seq_s

    def wall(self, sc: Scenario, name: str, policy: str = "default") -> tuple[float, float]:
        """`mean_wall` of ``name`` in ``sc``, counted."""
        self.evals += len(self.seeds)
        return mean_wall(sc, name, self.seeds, policy)

    def _decode(self, s: Scenario, k: float) -> Scenario:
        return s.with_values(
            engine={"decode_base_s": self._base0 * k, "decode_per_seq_s": self._per0 * k}
        )

    @staticmethod
    def _trainer(s: Scenario, c: float) -> Scenario:
        return s.with_values(trainer={"gpu_s_per_token": c})

    def fit_decode(self, factor: float) -> Fit:
        """Fit the decode factor (from ``factor``) to the rollout-bound run; adopt it."""
        start, target = self.sc, self.sc.published[self.rollout_bound]
        k, y, edge = _solve(
            lambda x: self.wall(self._decode(start, x), self.rollout_bound)[0],
            factor,
            target,
            *DECODE_RANGE,
            increasing=True,
        )
        self.sc = self._decode(self.sc, k)
        name = "engine decode speed (decode_base_s, decode_per_seq_s)"
        return Fit(name, k, DECODE_RANGE, edge, target, y)

    def fit_trainer(self) -> Fit:
        """Fit ``trainer.gpu_s_per_token`` to the training-bound run; adopt it."""
        start, target = self.sc, self.sc.published[self.train_bound]
        c, y, edge = _solve(
            lambda x: self.wall(self._trainer(start, x), self.train_bound)[0],
            start.trainer.gpu_s_per_token,
            target,
            *TRAINER_RANGE,
            increasing=True,
        )
        self.sc = self._trainer(self.sc, c)
        return Fit("trainer.gpu_s_per_token", c, TRAINER_RANGE, edge, target, y)

    def report(self, fits: tuple[Fit, Fit], predicted: str, policy: str) -> CalibrationReport:
        """Run the three configurations of the fitted scenario; the prediction's residual."""
        walls: dict[str, float] = {}
        stds: dict[str, float] = {}
        for name in (self.rollout_bound, self.train_bound, predicted):
            walls[name], stds[name] = self.wall(self.sc, name, policy)
        statics = (self.rollout_bound, self.train_bound)
        return CalibrationReport(
            self.sc.engine.decode_base_s,
            self.sc.engine.decode_per_seq_s,
            self.sc.trainer.gpu_s_per_token,
            fits,
            self.seeds,
            walls,
            stds,
            predicted,
            walls[predicted] / self.sc.published[predicted] - 1,
            {s: walls[s] / walls[predicted] for s in statics},
            self.evals,
        )


def calibrate(
    scenario: Scenario,
    *,
    seeds: Sequence[int] | None = None,
    static_rollout_bound: str = "static-16-16",
    static_train_bound: str = "static-8-24",
    predicted: str = "dynamic-16-16",
    policy: str = "default",
    rounds: int = 4,
    log: Callable[[str], None] = lambda s: None,
    start: tuple[float, float] = (1.0, 1.0),
) -> tuple[Scenario, CalibrationReport]:
    """Fit the decode and trainer speeds to the two static runs; predict ``predicted``.

    Args:
        scenario: Scenario with ``published`` times for the three configurations.
        seeds: Workload seeds to average over (default: the scenario's ``seeds`` seeds).
        static_rollout_bound: Static configuration that fixes the decode speed.
        static_train_bound: Static configuration that fixes the trainer speed.
        predicted: The configuration that is predicted, not fitted.
        policy: Policy of the predicted configuration.
        rounds: Most alternations of the two fits.
        log: Progress messages.
        start: ``(decode factor, trainer factor)`` applied to the scenario's decode
            speed and trainer speed before fitting (the fit's starting point).

    Returns:
        The calibrated scenario and the report.

    Raises:
        ValueError: a published time is missing.
    """
    pub = scenario.published
    for name in (static_rollout_bound, static_train_bound, predicted):
        if name not in pub:
            raise ValueError(f"scenario {scenario.name!r} has no published time for {name!r}")
    if seeds is None:
        seeds = range(scenario.seed, scenario.seed + scenario.seeds)
    if start != (1.0, 1.0):
        kd, kt = start
        eng, tr = scenario.engine, scenario.trainer
        scenario = scenario.with_values(
            engine={
                "decode_base_s": eng.decode_base_s * kd,
                "decode_per_seq_s": eng.decode_per_seq_s * kd,
            },
            trainer={"gpu_s_per_token": tr.gpu_s_per_token * kt},
        )
    fitting = _Fitting(scenario, tuple(seeds), static_rollout_bound, static_train_bound)
    fit_d = fit_t = None
    for rnd in range(rounds):
        fit_d = fitting.fit_decode(1.0 if fit_d is None else fit_d.value)
        log(
            f"round {rnd + 1}: decode factor x{fit_d.value:.5g} -> {static_rollout_bound} "
            f"{fit_d.achieved_s / 3600:.4f} h"
        )
        fit_t = fitting.fit_trainer()
        log(
            f"round {rnd + 1}: gpu_s_per_token {fit_t.value:.6g} -> {static_train_bound} "
            f"{fit_t.achieved_s / 3600:.4f} h"
        )
        # the trainer fit moves the rollout-bound run a little: stop once both hold
        again = fitting.wall(fitting.sc, static_rollout_bound)[0]
        if abs(again / pub[static_rollout_bound] - 1) < TOLERANCE:
            fit_d = attrs.evolve(fit_d, achieved_s=again)
            break
    assert fit_d is not None and fit_t is not None
    return fitting.sc, fitting.report((fit_d, fit_t), predicted, policy)


def refit_spread(
    scenario: Scenario,
    *,
    starts: Sequence[tuple[float, float]] = START_POINTS[:3],
    seeds: Sequence[int] | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> list[CalibrationReport]:
    """`calibrate` from each of ``starts`` (see `START_POINTS`): every fit ends within
    0.1 % of the published static times, yet the fitted rates differ inside that
    tolerance and so does the prediction; `spread_of_refits` summarises it."""
    reports = []
    for start in starts:
        log(f"refit from decode x{start[0]:g}, trainer x{start[1]:g}")
        reports.append(calibrate(scenario, seeds=seeds, log=log, start=start)[1])
    return reports


def spread_of_refits(reports: Sequence[CalibrationReport]) -> dict[str, Any]:
    """The predicted configuration's spread over workload seeds (per refit: the standard
    deviation over the seeds; its largest) and over refits (the per-refit means: their
    range and standard deviation), in hours, and the relative spread of the fitted rates."""
    if not reports:
        raise ValueError("spread_of_refits: no calibration reports")
    pred = reports[0].predicted
    means = [r.wall_clock_s[pred] / 3600 for r in reports]
    stds = [r.wall_clock_std_s[pred] / 3600 for r in reports]

    def rel(xs: list[float]) -> float:
        return (max(xs) - min(xs)) / statistics.fmean(xs)

    return {
        "predicted": pred,
        "refits": len(reports),
        "means_h": means,
        "seed_std_h": stds,
        "largest_seed_std_h": max(stds),
        "refit_range_h": max(means) - min(means),
        "refit_std_h": statistics.stdev(means) if len(means) > 1 else 0.0,
        "fitted_rate_rel_range": {
            "decode_base_s": rel([r.decode_base_s for r in reports]),
            "gpu_s_per_token": rel([r.gpu_s_per_token for r in reports]),
        },
        "ratios": {k: [r.ratios[k] for r in reports] for k in reports[0].ratios},
    }


ASSUMPTIONS: tuple[tuple[str, dict[str, dict[str, Any]], bool], ...] = (
    ("as in the scenario", {}, False),
    (
        "switch overheads x4 (wake 40 s, sleep 20 s)",
        {"engine": {"wake_overhead_s": 40.0, "sleep_overhead_s": 20.0}},
        False,
    ),
    (
        "hybrid weight sync at 1 GiB/s per GPU",
        {"hardware": {"local_sync_bandwidth_gib_s": 1.0}},
        False,
    ),
    ("stationary workload (no length growth)", {"workload": {"length_trajectory": ()}}, True),
    (
        "n = 16 and max_running_requests 256 (upstream's later script)",
        {"workload": {"n": 16}, "engine": {"max_num_seqs": 256}},
        True,
    ),
    (
        "staleness rule in_flight (queued samples not counted)",
        {"schedule": {"staleness_rule": "in_flight"}},
        True,
    ),
    ("per-sequence decode cost x5 (decode shape)", {"engine": {"decode_per_seq_s": None}}, True),
)
"""Alternative assumptions `sensitivity` tries: ``(label, changes, refit)``; ``refit``
when the change also moves the static runs, so the two rates are fitted again first.
(``None`` for ``decode_per_seq_s`` means five times the scenario's value.)"""


@attrs.frozen
class Sensitivity:
    """The prediction under one alternative assumption.

    Attributes:
        assumption: What was changed.
        refitted: Whether the two rates were fitted again.
        predicted_s: Mean predicted wall-clock of the dynamic configuration.
        predicted_std_s: Its standard deviation over seeds.
        residual: ``predicted / published - 1``.
        ratios: ``static / dynamic`` per static configuration (means).
    """

    assumption: str
    refitted: bool
    predicted_s: float
    predicted_std_s: float
    residual: float
    ratios: dict[str, float]


def sensitivity(
    scenario: Scenario,
    *,
    seeds: Sequence[int],
    predicted: str = "dynamic-16-16",
    assumptions: Sequence[tuple[str, dict[str, dict[str, Any]], bool]] = ASSUMPTIONS,
    log: Callable[[str], None] = lambda s: None,
) -> list[Sensitivity]:
    """Predict ``predicted`` under each alternative assumption (refitting the two rates on
    the static runs when the change moves them). ``scenario`` must be calibrated."""
    out = []
    for label, changes, refit in assumptions:
        changes = {k: dict(v) for k, v in changes.items()}
        if changes.get("engine", {}).get("decode_per_seq_s", 0) is None:
            changes["engine"]["decode_per_seq_s"] = 5 * scenario.engine.decode_per_seq_s
        sc = scenario.with_values(**changes) if changes else scenario
        if refit:
            sc, rep = calibrate(sc, seeds=seeds, predicted=predicted, log=log)
            walls = rep.wall_clock_s
            std = rep.wall_clock_std_s[predicted]
        else:
            walls = {}
            for c in sc.configurations:
                walls[c.name], s = mean_wall(sc, c.name, seeds)
                if c.name == predicted:
                    std = s
        log(f"{label}: {walls[predicted] / 3600:.3f} h")
        out.append(
            Sensitivity(
                label,
                refit,
                walls[predicted],
                std,
                walls[predicted] / scenario.published[predicted] - 1,
                {k: w / walls[predicted] for k, w in walls.items() if k != predicted},
            )
        )
    return out


def needed_value(
    scenario: Scenario,
    section: str,
    field: str,
    *,
    seeds: Sequence[int],
    predicted: str = "dynamic-16-16",
    search_range: tuple[float, float] = (0.1, 3600.0),
) -> tuple[float, float]:
    """The value of ``section.field`` (one that moves only the dynamic run, e.g. a switch
    overhead) that makes the prediction equal the published time: ``(value, wall)``."""

    def f(x: float) -> float:
        return mean_wall(scenario.with_values(**{section: {field: x}}), predicted, seeds)[0]

    x0 = max(search_range[0], float(getattr(getattr(scenario, section), field)) or 1.0)
    x, y, _ = _solve(f, x0, scenario.published[predicted], *search_range, increasing=True)
    return x, y


def format_report(rep: CalibrationReport, published: dict[str, float]) -> str:
    """The report as printed by the command."""
    lines = []
    for fit in rep.fits:
        edge = "  AT THE EDGE OF ITS SEARCH RANGE" if fit.at_edge else ""
        lines.append(
            f"fitted {fit.parameter}: {fit.value:.6g} (searched {fit.search_range[0]:g}.."
            f"{fit.search_range[1]:g}) -> {fit.achieved_s / 3600:.4f} h, target "
            f"{fit.target_s / 3600:.4f} h{edge}"
        )
    lines.append(f"engine.decode_base_s: {rep.decode_base_s:.6g}")
    lines.append(f"engine.decode_per_seq_s: {rep.decode_per_seq_s:.6g}")
    lines.append(f"trainer.gpu_s_per_token: {rep.gpu_s_per_token:.6g}")
    lines.append(f"seeds: {list(rep.seeds)}")
    for name, wall in rep.wall_clock_s.items():
        kind = "PREDICTED" if name == rep.predicted else "fitted"
        lines.append(
            f"{name}: {wall / 3600:.3f} h +- {rep.wall_clock_std_s[name] / 3600:.3f} "
            f"(published {published[name] / 3600:.3f} h; {kind})"
        )
    lines.append(f"residual of the prediction: {rep.residual:+.1%} against the published time")
    for name, ratio in rep.ratios.items():
        pub = published[name] / published[rep.predicted]
        lines.append(f"{name} / {rep.predicted}: {ratio:.3f} (published {pub:.3f})")
    lines.append(f"simulations run: {rep.evaluations}")
    return "\n".join(lines)


def format_spread(spread: dict[str, Any]) -> str:
    """`spread_of_refits` as printed by ``--refits``."""
    means = ", ".join(f"{m:.3f}" for m in spread["means_h"])
    rates = spread["fitted_rate_rel_range"]
    return (
        f"{spread['predicted']} over {spread['refits']} refits: means {means} h; range "
        f"{spread['refit_range_h']:.3f} h (sd {spread['refit_std_h']:.3f} h) against a seed sd "
        f"of at most {spread['largest_seed_std_h']:.3f} h; fitted rates differ by "
        f"{rates['decode_base_s']:.2%} (decode) and {rates['gpu_s_per_token']:.2%} (trainer)"
    )


def _main_refits(
    scenario: Scenario, refits: int, seeds: Sequence[int] | None, json_path: str | None
) -> int:
    """``--refits N``: refit from the first N starting points; print the spread."""
    reps = refit_spread(
        scenario, starts=START_POINTS[:refits], seeds=seeds, log=lambda s: print(s, file=sys.stderr)
    )
    for start, r in zip(START_POINTS, reps, strict=False):
        print(f"start {start}:\n{format_report(r, dict(scenario.published))}")
    spread = spread_of_refits(reps)
    print(format_spread(spread))
    if json_path:
        import json

        with open(json_path, "w") as f:
            json.dump(spread, f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(
        prog="python -m dynsched_sim.calibrate", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--scenario", default="seed-qwen35", help="built-in name or scenario file")
    ap.add_argument("--seeds", type=int, default=None, help="seeds to average (default: scenario)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", help="write the calibrated scenario (YAML) here")
    ap.add_argument(
        "--start",
        nargs=2,
        type=float,
        default=(1.0, 1.0),
        metavar=("DECODE", "TRAINER"),
        help="start the fit from the scenario's decode and trainer speeds times these factors",
    )
    ap.add_argument("--json", help="write the report (fits, walls, per-seed prediction) as JSON")
    ap.add_argument(
        "--refits",
        type=int,
        default=0,
        help="instead of one fit: refit from the first N of START_POINTS (3..5) and print "
        "the prediction's spread over seeds and over refits",
    )
    ap.add_argument(
        "--sensitivity",
        action="store_true",
        help="instead of fitting: predict the dynamic run of the (calibrated) scenario under "
        "alternative assumptions, and the switch overhead that would reproduce the "
        "published time",
    )
    args = ap.parse_args(argv)
    scenario = load_scenario(args.scenario)
    seeds = None if args.seeds is None else range(scenario.seed, scenario.seed + args.seeds)
    if args.refits:
        if not 1 <= args.refits <= len(START_POINTS):
            ap.error(f"--refits must be 1..{len(START_POINTS)}, got {args.refits}")
        return _main_refits(scenario, args.refits, seeds, args.json)
    if args.sensitivity:
        chosen = list(seeds or range(scenario.seed, scenario.seed + scenario.seeds))
        log = lambda s: print(s, file=sys.stderr)  # noqa: E731
        for row in sensitivity(scenario, seeds=chosen, log=log):
            ratios = ", ".join(f"x{v:.3f} vs {k}" for k, v in row.ratios.items())
            print(
                f"{row.assumption}{' (refitted)' if row.refitted else ''}: "
                f"{row.predicted_s / 3600:.3f} h ±{row.predicted_std_s / 3600:.3f}, residual "
                f"{row.residual:+.1%}; {ratios}"
            )
        x, y = needed_value(scenario, "engine", "wake_overhead_s", seeds=chosen)
        print(
            f"engine.wake_overhead_s that reproduces the published {scenario.published['dynamic-16-16'] / 3600:.2f} h: "
            f"{x:.0f} s (prediction {y / 3600:.3f} h)"
        )
        return 0
    start = (float(args.start[0]), float(args.start[1]))
    if not all(0 < k < math.inf for k in start):
        ap.error(f"--start: factors must be positive and finite, got {list(start)}")
    sc, rep = calibrate(
        scenario,
        seeds=seeds,
        rounds=args.rounds,
        log=lambda s: print(s, file=sys.stderr),
        start=start,
    )
    print(format_report(rep, dict(scenario.published)))
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"start": list(start), **attrs.asdict(rep)}, f, indent=1)
    if args.out:
        import yaml

        with open(args.out, "w") as f:
            yaml.safe_dump(scenario_to_dict(sc), f, sort_keys=False)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
