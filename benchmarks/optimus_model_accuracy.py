"""Accuracy figures of the dynsched-optimus models (prints the tables quoted in the README).

1. PS speed models: synthetic jobs whose true step time follows the paper's step-time
   model, 10 configurations chosen by ``plan_sampling`` (or the diagonal p = w, or 10 at
   random), speeds measured with 5 % multiplicative noise; the figure is the median
   relative speed error over the whole 16 x 16 (p, w) grid, summarised over 50 jobs.
2. All-reduce form against the vendored Pollux profiles (``placements.csv`` and
   ``scalability.csv`` of each model): in-sample error, held-out error (2-fold), and
   extrapolation (fit on the <= 4-node ``placements.csv``, predict the 6-16-node
   ``scalability.csv``).
3. Convergence model: remaining-steps error (relative to the convergence step) after
   seeing 10 %, 30 %, 60 % of the curve, 3 % noise, 40 curves.

Run: ``hatch run test:python benchmarks/optimus_model_accuracy.py [--out result.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
from dynsched_optimus import (
    AllReduceSpeedModel,
    ConvergenceFit,
    StepTimeModel,
    fit_convergence,
    fit_speed,
    plan_sampling,
)
from dynsched_optimus._io import read_allreduce_file

GRID = 16


def speed_accuracy(jobs: int = 50) -> dict[str, dict[str, float]]:
    p_all, w_all = (
        a.ravel()
        for a in np.meshgrid(np.arange(1, GRID + 1), np.arange(1, GRID + 1), indexing="ij")
    )
    out: dict[str, dict[str, float]] = {}
    for mode in ("sync", "async"):
        for how in ("planner", "diagonal", "random"):
            meds = []
            for seed in range(jobs):
                rng = np.random.default_rng(seed)
                job = StepTimeModel.random(rng, mode)
                if how == "planner":
                    cfgs = plan_sampling(
                        10, max_ps=GRID, max_workers=GRID, mode=mode, global_batch=job.batch
                    )
                elif how == "diagonal":
                    cfgs = [(i, i) for i in range(1, 11)]
                else:
                    idx = rng.choice(GRID * GRID, 10, replace=False)
                    cfgs = list(zip(p_all[idx].tolist(), w_all[idx].tolist(), strict=True))
                p = np.array([c[0] for c in cfgs])
                w = np.array([c[1] for c in cfgs])
                f = job.sample(p, w, noise=0.05, rng=rng)
                fit = fit_speed(mode, p, w, f, global_batch=job.batch if mode == "sync" else None)
                err = np.abs(fit.predict(p_all, w_all) / job.speed(p_all, w_all) - 1)
                meds.append(float(np.median(err)))
            out[f"{mode}/{how}"] = {
                "median": float(np.median(meds)),
                "p90": float(np.percentile(meds, 90)),
                "max": float(np.max(meds)),
            }
    return out


def _pollux() -> Path | None:
    env = os.environ.get("DYNSCHED_POLLUX_DATA")
    if env and (Path(env) / "traces").is_dir():
        return Path(env) / "traces"
    for parent in Path(__file__).resolve().parents:
        cand = parent / "shared" / "data" / "pollux" / "traces"
        if cand.is_dir():
            return cand
    return None


def allreduce_accuracy() -> dict[str, dict[str, float]]:
    traces = _pollux()
    if traces is None:
        return {}
    rng = np.random.default_rng(0)
    out = {}
    for d in sorted(p for p in traces.iterdir() if p.is_dir()):
        pl = read_allreduce_file(d / "placements.csv")
        sc = read_allreduce_file(d / "scalability.csv")
        g, n, b, t = (np.concatenate([pl[i], sc[i]]) for i in range(4))
        fit = AllReduceSpeedModel.fit(g, n, b, t)
        rel = np.abs(fit.step_time(g, n, b) / t - 1)
        idx = rng.permutation(g.size)
        folds = (idx[: g.size // 2], idx[g.size // 2 :])
        held = []
        for tr, te in (folds, folds[::-1]):
            m = AllReduceSpeedModel.fit(g[tr], n[tr], b[tr], t[tr])
            held.append(np.abs(m.step_time(g[te], n[te], b[te]) / t[te] - 1))
        ext = AllReduceSpeedModel.fit(*pl)
        ext_err = np.abs(ext.step_time(sc[0], sc[1], sc[2]) / sc[3] - 1)
        out[d.name] = {
            "points": int(g.size),
            "in_sample_median": float(np.median(rel)),
            "in_sample_mean": float(np.mean(rel)),
            "held_out_median": float(np.median(np.concatenate(held))),
            "extrapolation_median": float(np.median(ext_err)),
            "gamma": fit.gamma,
        }
    return out


def convergence_accuracy(curves: int = 40) -> dict[str, float]:
    delta, interval = 1e-3, 100.0
    out = {}
    for frac in (0.1, 0.3, 0.6):
        errs = []
        for seed in range(curves):
            rng = np.random.default_rng(seed)
            b0, b1, b2 = 10 ** rng.uniform(-4, -2.5), rng.uniform(0.5, 2), rng.uniform(0.05, 0.5)
            s0 = 1 / (b0 + b1) + b2
            k_conv = ConvergenceFit(b0=s0 * b0, b1=s0 * b1, b2=b2 / s0).convergence_step(
                delta, interval
            )
            ks = np.arange(1, int(k_conv * frac) + 1, max(1, int(k_conv / 400)))
            loss = (1 / (b0 * ks + b1) + b2) * (1 + 0.03 * rng.standard_normal(ks.size))
            fit = fit_convergence(ks, loss)
            s = fit.loss_scale
            k_true = ConvergenceFit(b0=s * b0, b1=s * b1, b2=b2 / s).convergence_step(
                delta, interval
            )
            est = fit.remaining_steps(ks[-1], delta, interval)
            errs.append(abs(est - (k_true - ks[-1])) / k_true)
        out[f"{int(frac * 100)}%"] = float(np.median(errs))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    sp = speed_accuracy()
    print("PS speed model, 10 sampled configurations, 5 % noise, 16x16 grid, 50 jobs:")
    print(f"{'form/sampling':<18} {'median err':>10} {'p90':>8} {'worst':>8}")
    for k, v in sp.items():
        print(f"{k:<18} {v['median']:>10.2%} {v['p90']:>8.2%} {v['max']:>8.2%}")
    ar = allreduce_accuracy()
    if ar:
        print("\nall-reduce form vs Pollux profiles (relative step-time error):")
        print(f"{'model':<12} {'points':>6} {'in-sample':>10} {'held-out':>9} {'4->16 nodes':>12}")
        for k, v in ar.items():
            print(
                f"{k:<12} {v['points']:>6} {v['in_sample_median']:>10.2%} "
                f"{v['held_out_median']:>9.2%} {v['extrapolation_median']:>12.2%}"
            )
    else:
        print("\n(Pollux data not found: set DYNSCHED_POLLUX_DATA)")
    conv = convergence_accuracy()
    print("\nconvergence model, remaining-steps error / convergence step (median of 40):")
    print("  ".join(f"seen {k}: {v:.1%}" for k, v in conv.items()))
    if args.out:
        Path(args.out).write_text(
            json.dumps({"speed": sp, "allreduce": ar, "convergence": conv}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
