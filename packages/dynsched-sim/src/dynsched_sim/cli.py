"""``dynsched simulate`` and ``dynsched plan``: the plug-ins registered under the
``dynsched.cli`` entry points."""

from __future__ import annotations

import argparse
import contextlib
import sys
import textwrap
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dynsched_core.cli import ensure_output_folder
from dynsched_core.errors import UsageError

if TYPE_CHECKING:
    from dynsched_sim._scenario import Scenario

__all__ = ["main", "main_plan", "register", "register_plan"]


def register(subparsers: Any) -> None:
    """Add the ``simulate`` sub-command to the ``dynsched`` dispatcher."""
    _register(subparsers, "simulate")


def _register(subparsers: Any, name: str) -> None:
    """Add sub-command ``name`` (its help, arguments and handler from `_COMMANDS`)."""
    help_, description, add, handler = _COMMANDS[name]
    p = subparsers.add_parser(name, help=help_, description=description)
    add(p)
    p.set_defaults(func=handler)


def _standalone(name: str, argv: list[str] | None) -> int:
    """Run sub-command ``name`` without the dispatcher: a usage error is one line, exit 2."""
    from dynsched_core.cli import CommandParser, one_line

    _, _, add, handler = _COMMANDS[name]
    p = CommandParser(prog=f"dynsched {name}")
    add(p)
    try:
        return int(handler(p.parse_args(argv)))
    except UsageError as e:
        print(f"dynsched {name}: error: {one_line(e)}", file=sys.stderr)
        return 2


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scenario",
        default="seed-qwen35",
        help="built-in scenario name, a .yaml/.toml scenario file or a verl config "
        "(default: seed-qwen35)",
    )
    _add_base_argument(p)
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
        "--planner",
        action="store_true",
        help="re-plan the split at run time with the role planner on top of each "
        "configuration's policy (GPUs move both ways; policy names get '+planner')",
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="list built-in scenarios and registered policies, then exit",
    )


def _add_base_argument(p: argparse.ArgumentParser) -> None:
    from dynsched_sim._verl import DEFAULT_VERL_BASE

    p.add_argument(
        "--base",
        default=None,
        metavar="SCENARIO",
        help="for a verl config: the scenario whose model, hardware, decode and trainer "
        f"speeds and response lengths it runs on (default: {DEFAULT_VERL_BASE})",
    )


def _load(args: argparse.Namespace, path: str, command: str) -> Scenario:
    """The scenario (or verl config on ``--base``) at ``path``; a warning per misspelt
    verl key, one line each on stderr.

    Raises:
        ScenarioError: as `load_scenario`.
    """
    from dynsched_core._config import ConfigWarning

    from dynsched_sim._scenario import load_scenario

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        scenario = load_scenario(path, base=args.base)
    for w in caught:
        if issubclass(w.category, ConfigWarning):
            print(f"dynsched {command}: warning: {w.message}", file=sys.stderr)
        else:  # anything else as Python would have shown it
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return scenario


def _handler(args: argparse.Namespace) -> int:
    from dynsched_core import available_policies

    from dynsched_sim._report import seeds_of
    from dynsched_sim._scenario import ScenarioError, builtin_scenarios

    if args.list:
        print("scenarios:", ", ".join(builtin_scenarios()))
        print("policies:", ", ".join(available_policies()))
        return 0
    scenario, published = _checked_scenario(args)
    seeds = seeds_of(scenario, args.seed, args.seeds)
    try:
        runs = _run_all(args, scenario, seeds, published)
    except ScenarioError as e:  # e.g. SimulationStalledError: speeds that stall every run
        raise UsageError(str(e)) from None
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

    from dynsched_sim._scenario import ScenarioError, check_run_size

    try:
        check_run_size(args.steps, args.seed, args.seeds)
        scenario = _load(args, args.scenario, "simulate")
        args.scenario_steps = scenario.steps
        published = True
        if args.steps is not None:
            published = args.steps == scenario.steps
            scenario = scenario.with_steps(args.steps)
        known = available_policies()
        for name in args.policy:
            if name not in known:
                from dynsched_core import get_policy_class

                get_policy_class(name)  # raises with the list and a close match
        ensure_output_folder(args.out, "--out")
    except (ScenarioError, PolicyRegistryError) as e:
        raise UsageError(str(e)) from None
    return scenario, published


def _run_all(
    args: argparse.Namespace, scenario: Scenario, seeds: list[int], published: bool
) -> list[Any]:
    """Every run of the comparison; on Ctrl-C the finished ones are written (marked partial)
    before the interrupt goes on with a message saying where."""
    from dynsched_sim._planner import planner_enabled
    from dynsched_sim._report import ProgressBar, compare

    runs: list[Any] = []
    try:
        with planner_enabled() if args.planner else contextlib.nullcontext():
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

    head = f"scenario {scenario.name}: {scenario.description}".strip()
    print(head if args.full else textwrap.fill(head, COMPACT_WIDTH, subsequent_indent="  "))
    table = format_table if args.full else format_compact_table
    print(table(scenario, runs, published=published))
    if not published and scenario.published:
        print(
            f"(published wall-clock times are for {args.scenario_steps} steps; "
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
    return _standalone("simulate", argv)


# --------------------------------------------------------------------------- plan
def register_plan(subparsers: Any) -> None:
    """Add the ``plan`` sub-command to the ``dynsched`` dispatcher."""
    _register(subparsers, "plan")


def _add_plan_arguments(p: argparse.ArgumentParser) -> None:
    from dynsched_sim._plan import MAX_PLAN_GPUS, MAX_PLAN_SEEDS, MAX_SHORTLIST

    p.add_argument(
        "scenario",
        metavar="SCENARIO",
        help="built-in scenario name, a .yaml/.toml scenario file or a verl config (a "
        "YAML file in verl's layout, mapped onto --base)",
    )
    _add_base_argument(p)
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        metavar="N",
        help=f"GPU budget, at least one replica, at most {MAX_PLAN_GPUS:,} "
        "(default: the scenario's largest configuration)",
    )
    p.add_argument(
        "--staleness-bound",
        type=float,
        default=None,
        metavar="S",
        help="most predicted mean staleness, policy versions behind per sample, >= 0 "
        "(default: the scenario's staleness_threshold)",
    )
    p.add_argument(
        "--simulated-staleness-bound",
        type=_number_or_scenario,
        default=None,
        metavar="S",
        help="also bound the simulated mean staleness (over the seeds) of the pick, >= 0, or "
        "'scenario': the simulated staleness of the scenario's own configuration on the same "
        "seeds, which is then ranked too (the pick is never slower on those seeds, nor "
        "staler) (default: none)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=3,
        metavar="K",
        help=f"workload seeds per simulated candidate, 1..{MAX_PLAN_SEEDS} (default: 3)",
    )
    p.add_argument(
        "--shortlist",
        type=int,
        default=4,
        metavar="K",
        help=f"splits simulated, 1..{MAX_SHORTLIST} (default: 4)",
    )
    p.add_argument(
        "--exact",
        action="store_true",
        help="exact search over the candidate set (branch and bound on the lower bound)",
    )
    p.add_argument(
        "--out", default="dynsched-plan", help="output folder (default: ./dynsched-plan)"
    )
    p.add_argument("--json", action="store_true", help="print plan.json instead of the table")
    p.add_argument("--no-plot", action="store_true", help="skip plan.png")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _number_or_scenario(text: str) -> float | str:
    """``--simulated-staleness-bound``: a number (range checked with the other inputs) or
    ``scenario``."""
    from dynsched_sim._plan import SCENARIO_STALENESS

    if text == SCENARIO_STALENESS:
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a finite number >= 0 or {SCENARIO_STALENESS!r}, got {text!r}"
        ) from None


def _plan_handler(args: argparse.Namespace) -> int:
    import json

    from dynsched_sim._plan import PlanError, check_plan_inputs, format_plan, plan, write_plan
    from dynsched_sim._scenario import ScenarioError

    try:
        scenario = _load(args, args.scenario, "plan")
        # the planner's inputs, checked (named as flags) before anything runs, then planned
        inputs: dict[str, Any] = {
            "gpus": args.gpus,
            "staleness_bound": args.staleness_bound,
            "seeds": args.seeds,
            "shortlist": None if args.exact else args.shortlist,
            "simulated_staleness_bound": args.simulated_staleness_bound,
        }
        check_plan_inputs(scenario, **inputs, flags=True)
        ensure_output_folder(args.out, "--out")
        note = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
        result = plan(scenario, **inputs, progress=note)
    except (ScenarioError, PlanError) as e:
        raise UsageError(str(e)) from None
    paths = write_plan(result, args.out, plot=not args.no_plot)
    print(json.dumps(result.to_json(), indent=2) if args.json else format_plan(result))
    if not args.json:
        print(f"wrote {', '.join(sorted(paths.values()))}")
    return 0


def main_plan(argv: list[str] | None = None) -> int:
    """Run ``plan`` without the dispatcher."""
    from dynsched_core.cli import EXIT_INTERRUPTED

    try:
        return _standalone("plan", argv)
    except KeyboardInterrupt:
        print("dynsched plan: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


#: Sub-command -> (help, description, argument adder, handler).
_COMMANDS: dict[str, tuple[str, str, Callable[[Any], None], Callable[[Any], int]]] = {
    "simulate": (
        "simulate a fully-async RL cluster on virtual time (default: the published experiment)",
        "Run every configuration of a scenario with the real dynsched core on a virtual-time "
        "event loop; print a comparison table and write result.json, table.txt and plots.",
        _add_arguments,
        _handler,
    ),
    "plan": (
        "plan a GPU budget: split, concurrency, staleness threshold and policy",
        "Find the split (trainer GPUs, standalone rollout GPUs, hybrid replicas), rollout "
        "concurrency, staleness threshold and policy with the shortest predicted time whose "
        "closed-form mean staleness stays within the bound: an analytical model prunes, the "
        "simulator ranks a shortlist over seeds. Prints the best candidates, writes plan.json "
        "and plan.png. Takes a built-in scenario name, a scenario .yaml/.toml file or a verl "
        "config (its split, scheduler, engine and trainer settings on --base's cost models, "
        "model and workload).",
        _add_plan_arguments,
        _plan_handler,
    ),
}


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
