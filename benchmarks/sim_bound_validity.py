"""Check: no simulated run beats the lower bound (every built-in scenario, random scenarios).

Runs every configuration of every built-in scenario (each at full length, with the
built-in policies) and of ``--random`` random scenarios (`dynsched_sim.random_scenario`,
seeds ``0..N-1``, with ``default``, ``fixed_ratio``, ``static_fully_async`` and a policy
that never deactivates), and reports the number of runs, the violations
(``efficiency > 1``) and the distribution of ``efficiency = bound / achieved``, with the
constraint that set the bound. Exit status 1 on any violation or failed conservation check.

    hatch run python benchmarks/sim_bound_validity.py [--random 100] [--json] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import Counter

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _never_deactivate() -> str:
    from dynsched_core import DynamicSchedulePolicyBase, available_policies, register_policy

    name = "bench_never_deactivate"
    if name not in available_policies():

        @register_policy(name)
        class NeverDeactivate(DynamicSchedulePolicyBase):
            """Activates whenever it can and never deactivates."""

            def __init__(self, deactivate_ratio: float = 0.0, only_hybrid: bool = False):
                self.only_hybrid = only_hybrid

            def should_deactivate(self, global_steps, is_hybrid_active, ctx):  # type: ignore[no-untyped-def]
                return False

            def deactivate_wait_samples(self, ctx):  # type: ignore[no-untyped-def]
                return 0

            def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):  # type: ignore[no-untyped-def]
                return True

    return name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random", type=int, default=100, help="random scenarios (seeds 0..N-1)")
    ap.add_argument("--no-builtin", action="store_true", help="skip the built-in scenarios")
    ap.add_argument("--json", action="store_true", help="print a JSON line instead of a table")
    ap.add_argument("--out", help="also write the JSON summary to this file")
    args = ap.parse_args()
    from dynsched_sim import builtin_scenarios, load_scenario, random_scenario
    from dynsched_sim._sim import run_configuration

    never = _never_deactivate()
    hybrid_policies = ["default", "fixed_ratio", "static_fully_async", never]
    scenarios = [] if args.no_builtin else [load_scenario(n) for n in builtin_scenarios()]
    scenarios += [random_scenario(s) for s in range(args.random)]
    effs: list[float] = []
    binding: Counter[str] = Counter()
    violations = []
    per_source: dict[str, list[float]] = {"builtin": [], "random": []}
    t0 = time.perf_counter()
    for sc in scenarios:
        source = "random" if sc.name.startswith("random-") else "builtin"
        for conf in sc.configurations:
            for pol in hybrid_policies if conf.hybrid else ["static_fully_async"]:
                r = run_configuration(sc, conf, pol)
                effs.append(r.efficiency)
                per_source[source].append(r.efficiency)
                binding[r.summary["lower_bound_binding"]] += 1
                if r.efficiency > 1.0 or not all(r.conservation.values()):
                    violations.append(
                        {
                            "scenario": sc.name,
                            "configuration": conf.name,
                            "policy": pol,
                            "efficiency": r.efficiency,
                            "conservation": dict(r.conservation),
                        }
                    )
    elapsed = time.perf_counter() - t0

    def dist(xs: list[float]) -> dict[str, float]:
        if not xs:
            return {}
        qs = statistics.quantiles(xs, n=10) if len(xs) > 1 else [xs[0]] * 9
        return {
            "n": len(xs),
            "min": min(xs),
            "p10": qs[0],
            "median": statistics.median(xs),
            "p90": qs[-1],
            "max": max(xs),
        }

    summary = {
        "benchmark": "sim_bound_validity",
        "runs": len(effs),
        "scenarios": len(scenarios),
        "violations": violations,
        "efficiency": {k: dist(v) for k, v in per_source.items()},
        "binding": dict(binding),
        "real_s": elapsed,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{len(effs)} runs over {len(scenarios)} scenarios in {elapsed:.0f} s")
        for k, d in summary["efficiency"].items():
            if d:
                print(
                    f"  {k:<8} efficiency (bound / achieved): n={d['n']} min {d['min']:.3f} "
                    f"p10 {d['p10']:.3f} median {d['median']:.3f} p90 {d['p90']:.3f} max {d['max']:.3f}"
                )
        print(f"  bound set by: {dict(binding)}")
        print(f"  runs faster than the bound: {len(violations)}")
        for v in violations[:10]:
            print(f"    {v}")
    return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
