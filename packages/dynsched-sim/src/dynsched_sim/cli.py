"""``dynsched simulate``: the plug-in registered under the ``dynsched.cli`` entry points."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynsched_core.errors import UsageError

if TYPE_CHECKING:
    from dynsched_sim._scenario import Scenario

__all__ = ["main", "register"]


def register(subparsers: Any) -> None:
    """Add the ``simulate`` sub-command to the ``dynsched`` dispatcher."""
    p = subparsers.add_parser(
        "simulate",
        help="simulate a fully-async RL cluster on virtual time (default: the published experiment)",
        description=(
            "Run every configuration of a scenario with the real dynsched core on a virtual-time "
            "event loop; print a comparison table and write result.json, table.txt and plots."
        ),
    )
    _add_arguments(p)
    p.set_defaults(func=_handler)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scenario",
        default="seed-qwen35",
        help="built-in scenario name or a .yaml/.toml file (default: seed-qwen35)",
    )
    p.add_argument(
        "--policy",
        nargs="+",
        default=["default"],
        metavar="NAME",
        help="registered policies to run on the dynamic configurations (default: default)",
    )
    p.add_argument(
        "--seed", type=int, default=None, help="first workload seed (default: the scenario's)"
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        metavar="K",
        help="run K workload seeds per configuration and report mean and spread "
        "(default: the scenario's, 5 for seed-qwen35)",
    )
    p.add_argument("--out", default="dynsched-out", help="output folder (default: ./dynsched-out)")
    p.add_argument(
        "--steps", type=int, default=None, help="override the number of training micro-steps"
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--full",
        action="store_true",
        help="print the full table (bound, proxy and true utilizations, queue, aborts) "
        "instead of the compact one; table.txt always has the full one",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument(
        "--list",
        action="store_true",
        help="list built-in scenarios and registered policies, then exit",
    )


def _check_out(out: str) -> None:
    """The output folder exists (created) and is writable, before anything runs."""
    path = Path(out)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UsageError(f"--out {out!r}: {str(existing)!r} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out!r}: cannot create it ({e.strerror or e})") from None
    if not os.access(path, os.W_OK):
        raise UsageError(f"--out {out!r} is not writable")


def _handler(args: argparse.Namespace) -> int:
    from dynsched_core import available_policies

    from dynsched_sim._report import seeds_of
    from dynsched_sim._scenario import builtin_scenarios

    if args.list:
        print("scenarios:", ", ".join(builtin_scenarios()))
        print("policies:", ", ".join(available_policies()))
        return 0
    scenario, published = _checked_scenario(args)
    seeds = seeds_of(scenario, args.seed, args.seeds)
    runs = _run_all(args, scenario, seeds, published)
    _print_table(args, scenario, runs, published)
    paths = _write(args, scenario, runs, seeds, published, partial=False)
    print(f"wrote {', '.join(sorted(set(paths.values())))}")
    return 0


def _checked_scenario(args: argparse.Namespace) -> tuple[Scenario, bool]:
    """The scenario to run (with ``--steps``) and whether its published times apply, after
    checking every flag, the policy names and the output folder.

    Raises:
        UsageError: naming the bad flag, scenario or policy.
    """
    from dynsched_core import available_policies
    from dynsched_core.errors import PolicyRegistryError

    from dynsched_sim._scenario import ScenarioError, check_run_size, load_scenario

    try:
        check_run_size(args.steps, args.seed, args.seeds)
        scenario = load_scenario(args.scenario)
        published = True
        if args.steps is not None:
            published = args.steps == scenario.steps
            scenario = scenario.with_steps(args.steps)
        known = available_policies()
        for name in args.policy:
            if name not in known:
                from dynsched_core import get_policy_class

                get_policy_class(name)  # raises with the list and a close match
        _check_out(args.out)
    except (ScenarioError, PolicyRegistryError) as e:
        raise UsageError(str(e)) from None
    return scenario, published


def _run_all(
    args: argparse.Namespace, scenario: Scenario, seeds: list[int], published: bool
) -> list[Any]:
    """Every run of the comparison; on Ctrl-C the finished ones are written (marked partial)
    before the interrupt goes on with a message saying where."""
    from dynsched_sim._report import ProgressBar, compare

    runs: list[Any] = []
    try:
        compare(
            scenario,
            args.policy,
            seed=seeds[0],
            seeds=len(seeds),
            progress=None if args.quiet else ProgressBar(),
            into=runs,
        )
    except KeyboardInterrupt:
        if not runs:
            raise KeyboardInterrupt("no run finished; nothing written") from None
        paths = _write(args, scenario, runs, seeds, published, partial=True)
        raise KeyboardInterrupt(
            f"{len(runs)} finished run(s) written to {', '.join(sorted(set(paths.values())))}"
            " (marked partial)"
        ) from None
    return runs


def _print_table(
    args: argparse.Namespace, scenario: Scenario, runs: list[Any], published: bool
) -> None:
    """The scenario's headline and the comparison table (compact unless ``--full``)."""
    from dynsched_sim._report import COMPACT_WIDTH, format_compact_table, format_table
    from dynsched_sim._scenario import load_scenario

    head = f"scenario {scenario.name}: {scenario.description}".strip()
    print(head if args.full else textwrap.fill(head, COMPACT_WIDTH, subsequent_indent="  "))
    table = format_table if args.full else format_compact_table
    print(table(scenario, runs, published=published))
    if not published:
        print(
            f"(published wall-clock times are for {load_scenario(args.scenario).steps} steps; "
            f"not compared with this {scenario.steps}-step run)"
        )


def _write(
    args: argparse.Namespace,
    scenario: Scenario,
    runs: list[Any],
    seeds: list[int],
    published: bool,
    *,
    partial: bool,
) -> dict[str, str]:
    """result.json, table.txt and (unless partial or ``--no-plots``) the plots."""
    from dynsched_sim._report import write_outputs

    return write_outputs(
        scenario,
        runs,
        args.out,
        policies=args.policy,
        seeds=seeds,
        plots=not (partial or args.no_plots),
        partial=partial,
        published=published,
    )


def main(argv: list[str] | None = None) -> int:
    """Run ``simulate`` without the dispatcher (``python -m dynsched_sim.cli``)."""
    from dynsched_core.cli import CommandParser, one_line

    p = CommandParser(prog="dynsched simulate")
    _add_arguments(p)
    try:
        return _handler(p.parse_args(argv))
    except UsageError as e:
        print(f"dynsched simulate: error: {one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
