"""Record the simulator's results for a seed and compare two recordings field by field.

A refactoring that must not change what the simulator computes is checked by recording
before and after and comparing::

    hatch run python tools/sim_fingerprint.py record before.json        # on the old commit
    hatch run python tools/sim_fingerprint.py record after.json         # on the new commit
    hatch run python tools/sim_fingerprint.py compare before.json after.json

``record`` runs every built-in scenario (or ``--scenario NAME ...``) with ``--seed`` and
the ``--policy`` names on its dynamic configurations, as ``dynsched simulate`` does, and
writes every run's ``result.json`` entry. ``compare`` also reads the output folders of
``dynsched simulate --out DIR/<scenario>`` runs (give ``DIR``). It prints each differing
field with both values and exits 1 when anything differs; ``--ignore KEY`` skips a
field (e.g. ``events``, the count of event-loop callbacks).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Runs = dict[str, dict[str, Any]]  # "scenario/configuration/policy" -> result.json entry


def _key(run: dict[str, Any], scenario: str) -> str:
    return f"{scenario}/{run['configuration']}/{run['policy']}"


def record(scenarios: list[str], policies: list[str], seed: int, steps: int | None) -> Runs:
    from dynsched_sim import builtin_scenarios, compare, load_scenario

    out: Runs = {}
    for name in scenarios or list(builtin_scenarios()):
        scenario = load_scenario(name)
        if steps is not None:
            scenario = scenario.with_steps(steps)
        for run in compare(scenario, policies, seed=seed):
            out[_key(run.to_json(), name)] = run.to_json()
        print(f"recorded {name}", file=sys.stderr)
    return out


def load(path: Path) -> Runs:
    if path.is_dir():  # dynsched simulate --out DIR/<scenario>
        out: Runs = {}
        for result in sorted(path.glob("*/result.json")):
            data = json.loads(result.read_text(encoding="utf-8"))
            for run in data["runs"]:
                out[_key(run, data["scenario"])] = run
        return out
    data = json.loads(path.read_text(encoding="utf-8"))
    return dict(data["runs"])


def _diff(a: Any, b: Any, where: str, ignore: set[str]) -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in ignore:
                continue
            if k not in a or k not in b:
                yield f"{where}.{k}: only in {'second' if k not in a else 'first'}"
            else:
                yield from _diff(a[k], b[k], f"{where}.{k}", ignore)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            yield from _diff(x, y, f"{where}[{i}]", ignore)
    elif a != b or type(a) is not type(b):
        yield f"{where}: {a!r} != {b!r}"


def digest(run: dict[str, Any], ignore: set[str]) -> str:
    kept = {k: v for k, v in run.items() if k not in ignore}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the scenarios and write their results")
    rec.add_argument("out", type=Path)
    rec.add_argument("--scenario", nargs="*", default=[], help="default: every built-in one")
    rec.add_argument(
        "--policy", nargs="+", default=["default", "fixed_ratio", "static_fully_async"]
    )
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--steps", type=int, default=None, help="shorten every scenario")
    cmp = sub.add_parser("compare", help="compare two recordings (files or simulate folders)")
    cmp.add_argument("first", type=Path)
    cmp.add_argument("second", type=Path)
    cmp.add_argument("--ignore", nargs="*", default=[], help="fields to skip, e.g. events")
    args = parser.parse_args(argv)
    if args.command == "record":
        runs = record(args.scenario, args.policy, args.seed, args.steps)
        args.out.write_text(json.dumps({"seed": args.seed, "runs": runs}), encoding="utf-8")
        print(f"wrote {len(runs)} run(s) to {args.out}")
        return 0
    first, second = load(args.first), load(args.second)
    ignore = set(args.ignore)
    differences = 0
    for key in sorted(set(first) | set(second)):
        if key not in first or key not in second:
            print(f"{key}: only in {'second' if key not in first else 'first'}")
            differences += 1
            continue
        diffs = list(_diff(first[key], second[key], key, ignore))
        status = "identical" if not diffs else f"{len(diffs)} difference(s)"
        print(f"{key}: {status} ({digest(first[key], ignore)} / {digest(second[key], ignore)})")
        for line in diffs[:20]:
            print(f"  {line}")
        differences += len(diffs)
    print(f"{len(set(first) & set(second))} run(s) compared, {differences} difference(s)")
    return 1 if differences else 0


if __name__ == "__main__":
    raise SystemExit(main())
