"""The ``dynsched`` command: a small dispatcher whose sub-commands are plug-ins.

Each package adds sub-commands through the entry-point group ``dynsched.cli``. The
entry point's name is the sub-command; its value is a callable
``register(subparsers) -> None`` that adds one parser with
``subparsers.add_parser(name, help=...)`` and sets ``func`` on it with
``parser.set_defaults(func=handler)``, where ``handler(args) -> int | None``.
Sub-commands are read through the one plug-in loader (`dynsched_core.plugins`), so the
rules are those of every dynsched plug-in: a name two distributions provide is refused
(both named), and a plug-in that fails to load is reported in ``--help`` and on stderr,
never fatal; running an unavailable sub-command exits with status 2.

Example plug-in declaration (pyproject.toml)::

    [project.entry-points."dynsched.cli"]
    simulate = "dynsched_sim.cli:register"
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from dynsched_core.plugins import PluginError, PluginGroup

__all__ = ["CLI_ENTRY_POINT_GROUP", "build_parser", "main"]

CLI_ENTRY_POINT_GROUP = "dynsched.cli"

logger = logging.getLogger(__name__)


def build_parser() -> tuple[argparse.ArgumentParser, list[str]]:
    """Build the top-level parser with every loadable plug-in.

    Returns:
        The parser and a list of human-readable problems with broken plug-ins.
    """
    from dynsched_core import __version__

    parser = argparse.ArgumentParser(
        prog="dynsched",
        description=(
            "dynsched: keep deep-learning GPUs busy by moving them between jobs and roles. "
            "Sub-commands come from the installed dynsched packages."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dynsched-core {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    sub = parser.add_subparsers(title="sub-commands", dest="command", metavar="COMMAND")
    problems: list[str] = []
    group = PluginGroup(CLI_ENTRY_POINT_GROUP, kind="sub-command")
    for name in group.names():
        try:
            register = group.load(name)
            register(sub)
        except Exception as exc:  # a broken plug-in must not break the command
            problems.append(
                str(exc)
                if isinstance(exc, PluginError)
                else f"sub-command {name!r} failed to register: {exc!r}"
            )
            sub.add_parser(name, help="(unavailable: see the problems below)")
    if problems:
        parser.epilog = "problems with installed plug-ins:\n  " + "\n  ".join(problems)
    return parser, problems


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dynsched`` command."""
    parser, problems = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(int(args.verbose), 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for p in problems:
        print(f"dynsched: warning: {p}", file=sys.stderr)
    func = getattr(args, "func", None)
    if func is None:
        if args.command:
            print(
                f"dynsched: sub-command {args.command!r} is unavailable (see warnings above)",
                file=sys.stderr,
            )
            return 2
        parser.print_help()
        return 0
    result = func(args)
    return int(result) if result is not None else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
