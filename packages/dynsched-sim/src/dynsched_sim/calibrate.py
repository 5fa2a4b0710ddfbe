"""Calibrate a scenario's hidden quantities against published wall-clock times.

Run ``python -m dynsched_sim.calibrate [--scenario seed-qwen35] [--out FILE]``.

Three knobs, each mostly controlling one configuration, are fitted in turn (a few
rounds of one-dimensional fits, every evaluation a full simulation with the real core
and the ``default`` policy):

1. ``engine.decode_base_s`` and ``engine.decode_per_seq_s`` scaled together (engine
   speed) so the rollout-bound configuration (``static-16-16``) matches its published
   wall-clock;
2. ``trainer.gpu_s_per_token`` so the training-bound configuration (``static-8-24``)
   matches;
3. ``engine.hybrid_memory_fraction`` (KV capacity of hybrid replicas, hence their
   throughput) so the dynamic configuration matches.

Everything else (model size, bandwidths, switch overheads, length distribution, the
published settings) stays as written in the scenario file.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any

import attrs

from dynsched_sim._scenario import Scenario, load_scenario
from dynsched_sim._sim import run_configuration

__all__ = ["CalibrationReport", "calibrate", "main", "scenario_to_dict"]


@attrs.frozen
class CalibrationReport:
    """Fitted values and the wall-clocks they give."""

    decode_base_s: float
    decode_per_seq_s: float
    gpu_s_per_token: float
    hybrid_memory_fraction: float
    wall_clock_s: dict[str, float]
    ratios: dict[str, float]
    evaluations: int


def _wall(sc: Scenario, name: str, policy: str) -> float:
    return run_configuration(sc, name, policy).wall_clock_s


def _fit_scale(f: Callable[[float], float], x: float, target: float, iters: int = 4) -> float:
    """Fit ``x`` with ``f(x) ~ target`` assuming ``f`` roughly proportional to ``x``."""
    for _ in range(iters):
        y = f(x)
        if abs(y / target - 1) < 5e-4:
            break
        x *= target / y
    return x


def calibrate(
    scenario: Scenario,
    *,
    static_rollout_bound: str = "static-16-16",
    static_train_bound: str = "static-8-24",
    dynamic: str = "dynamic-16-16",
    policy: str = "default",
    rounds: int = 2,
    log: Callable[[str], None] = lambda s: None,
) -> tuple[Scenario, CalibrationReport]:
    """Fit the three knobs of the module docstring to ``scenario.published``."""
    pub = scenario.published
    for name in (static_rollout_bound, static_train_bound, dynamic):
        if name not in pub:
            raise ValueError(f"scenario {scenario.name!r} has no published time for {name!r}")
    evals = 0
    sc = scenario

    def with_engine(s: Scenario, **kw: Any) -> Scenario:
        return attrs.evolve(s, engine=attrs.evolve(s.engine, **kw))

    for rnd in range(rounds):
        base0, per0 = sc.engine.decode_base_s, sc.engine.decode_per_seq_s

        def f_scale(k: float, _s: Scenario = sc, b: float = base0, p: float = per0) -> float:
            nonlocal evals
            evals += 1
            return _wall(
                with_engine(_s, decode_base_s=b * k, decode_per_seq_s=p * k),
                static_rollout_bound,
                policy,
            )

        k = _fit_scale(f_scale, 1.0, pub[static_rollout_bound])
        sc = with_engine(sc, decode_base_s=base0 * k, decode_per_seq_s=per0 * k)
        log(f"round {rnd + 1}: decode scale x{k:.4f}")

        def f_train(c: float, _s: Scenario = sc) -> float:
            nonlocal evals
            evals += 1
            return _wall(
                attrs.evolve(_s, trainer=attrs.evolve(_s.trainer, gpu_s_per_token=c)),
                static_train_bound,
                policy,
            )

        c = _fit_scale(f_train, sc.trainer.gpu_s_per_token, pub[static_train_bound])
        sc = attrs.evolve(sc, trainer=attrs.evolve(sc.trainer, gpu_s_per_token=c))
        log(f"round {rnd + 1}: gpu_s_per_token {c:.6g}")

        # bisection on the hybrid memory fraction: more memory -> faster dynamic run
        lo, hi = _fraction_range(sc)
        target = pub[dynamic]
        best = (math.inf, sc.engine.hybrid_memory_fraction)
        for _ in range(7):
            mid = 0.5 * (lo + hi)
            evals += 1
            w = _wall(with_engine(sc, hybrid_memory_fraction=round(mid, 4)), dynamic, policy)
            if abs(w - target) < best[0]:
                best = (abs(w - target), round(mid, 4))
            if w > target:
                lo = mid
            else:
                hi = mid
        sc = with_engine(sc, hybrid_memory_fraction=best[1])
        log(f"round {rnd + 1}: hybrid_memory_fraction {best[1]}")

    walls = {n: _wall(sc, n, policy) for n in (static_rollout_bound, static_train_bound, dynamic)}
    evals += 3
    ratios = {
        f"{static_rollout_bound}/{dynamic}": walls[static_rollout_bound] / walls[dynamic],
        f"{static_train_bound}/{dynamic}": walls[static_train_bound] / walls[dynamic],
    }
    rep = CalibrationReport(
        sc.engine.decode_base_s,
        sc.engine.decode_per_seq_s,
        sc.trainer.gpu_s_per_token,
        sc.engine.hybrid_memory_fraction,
        walls,
        ratios,
        evals,
    )
    return sc, rep


def _fraction_range(sc: Scenario) -> tuple[float, float]:
    """Hybrid memory fractions from 'just holds the weights' to the standalone fraction."""
    eng, hw, llm = sc.engine, sc.hardware, sc.model
    total = eng.gpus_per_replica * hw.gpu_memory_gib * 2**30
    lo = (llm.weight_bytes + llm.kv_bytes_per_token * eng.kv_tokens_per_seq * 8) / total
    return min(lo, eng.standalone_memory_fraction), eng.standalone_memory_fraction


def scenario_to_dict(sc: Scenario) -> dict[str, Any]:
    """A scenario as plain data (loadable by `dynsched_sim.scenario_from_dict`)."""
    d = attrs.asdict(sc, recurse=True)
    d["trainer"]["phase_shares"] = {k: v for k, v in sc.trainer.phase_shares}
    for key in ("prompt_len", "response_len"):
        d["workload"][key]["values"] = list(d["workload"][key]["values"])
    d["configurations"] = [attrs.asdict(c) for c in sc.configurations]
    d["schedule"] = dict(sc.schedule)
    d["published"] = dict(sc.published)
    return d


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(
        prog="python -m dynsched_sim.calibrate", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--scenario", default="seed-qwen35", help="built-in name or scenario file")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", help="write the calibrated scenario (YAML) here")
    args = ap.parse_args(argv)
    sc, rep = calibrate(
        load_scenario(args.scenario), rounds=args.rounds, log=lambda s: print(s, file=sys.stderr)
    )
    print(f"engine.decode_base_s: {rep.decode_base_s:.6g}")
    print(f"engine.decode_per_seq_s: {rep.decode_per_seq_s:.6g}")
    print(f"trainer.gpu_s_per_token: {rep.gpu_s_per_token:.6g}")
    print(f"engine.hybrid_memory_fraction: {rep.hybrid_memory_fraction}")
    for k, v in rep.wall_clock_s.items():
        print(f"{k}: {v:.0f} s ({v / 3600:.3f} h)")
    for k, v in rep.ratios.items():
        print(f"{k}: {v:.4f}")
    print(f"simulations run: {rep.evaluations}")
    if args.out:
        import yaml

        with open(args.out, "w") as f:
            yaml.safe_dump(scenario_to_dict(sc), f, sort_keys=False)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
