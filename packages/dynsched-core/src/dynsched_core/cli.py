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

The sub-commands of the first-party packages are known even when their package is not
installed (`KNOWN_SUBCOMMANDS`): ``dynsched simulate`` without dynsched-sim says to
``pip install dynsched-sim`` (exit status 2), and ``dynsched --help`` lists them as not
installed.

One way to end, for every sub-command (so none ends in a traceback for a user error):

- a user error (`dynsched_core.errors.UsageError`, `ConfigError`, `PluginError`, or an
  `OSError` naming a file) raised by a handler is printed as one line,
  ``dynsched <sub-command>: error: <message>``, and the exit status is 2 (`EXIT_USAGE`);
  argument errors found by argparse are printed the same way (one line, status 2);
- Ctrl-C (``KeyboardInterrupt``) prints one line, ``dynsched <sub-command>: interrupted``
  followed by the interrupt's message if it has one, and the exit status is 130
  (`EXIT_INTERRUPTED`). A long sub-command catches the interrupt, writes what it
  finished (marked as partial) and re-raises ``KeyboardInterrupt("partial results in
  ...")`` so that the one line says where they are.

Example plug-in declaration (pyproject.toml)::

    [project.entry-points."dynsched.cli"]
    simulate = "dynsched_sim.cli:register"
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from dynsched_core._errors import ConfigError, UsageError
from dynsched_core.plugins import PluginError, PluginGroup

__all__ = [
    "CLI_ENTRY_POINT_GROUP",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "KNOWN_SUBCOMMANDS",
    "CommandParser",
    "UsageError",
    "build_parser",
    "ensure_output_folder",
    "main",
    "one_line",
]

#: Exit status of a user error (bad argument, bad input file, unwritable output).
EXIT_USAGE = 2
#: Exit status of a command stopped by Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130

CLI_ENTRY_POINT_GROUP = "dynsched.cli"

#: The sub-commands of dynsched's own packages, by the distribution that provides each, so
#: that a sub-command whose package is not installed is answered with what to install. A
#: test checks it against the packages' entry points.
KNOWN_SUBCOMMANDS: Mapping[str, str] = {
    "optimus": "dynsched-optimus",
    "plan": "dynsched-sim",
    "run": "dynsched-ray",
    "simulate": "dynsched-sim",
    "train": "dynsched-ray",
}


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage block) and exit status 2.

    The ``dynsched`` parser and every sub-command parser added through it are of this
    class, so ``dynsched run --steps x`` answers
    ``dynsched run: error: argument --steps: invalid int value: 'x' (see dynsched run --help)``.
    """

    def error(self, message: str) -> NoReturn:
        """Print one line naming the argument and exit with `EXIT_USAGE`."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def ensure_output_folder(
    folder: str | os.PathLike[str], flag: str, *, given: str | os.PathLike[str] | None = None
) -> Path:
    """Create a command's output folder (and its parents) before anything runs, and check
    that it can be written; the folder.

    Args:
        folder: The folder.
        flag: The option that named it (``--out``), for the message.
        given: What the user wrote for ``flag`` when it is not the folder itself (a file in
            it); default ``folder``.

    Raises:
        UsageError: one line naming ``flag`` and what was given: a parent is a file, the
            folder cannot be created, or it is not writable.
    """
    path = Path(folder)
    shown = os.fspath(given if given is not None else folder)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UsageError(f"{flag} {shown!r}: {str(existing)!r} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"{flag} {shown!r}: cannot create the folder {str(path)!r} ({exc.strerror or exc})"
        ) from None
    if not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {shown!r}: the folder {str(path)!r} is not writable")
    return path


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (continuation lines joined with ``; ``)."""
    text = str(exc).strip() or type(exc).__name__
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())


def build_parser(only: str | None = None) -> tuple[argparse.ArgumentParser, list[str]]:
    """Build the top-level parser with every loadable plug-in.

    Args:
        only: Load just this sub-command's plug-in (the others are listed without being
            imported), so ``dynsched run ...`` does not import the optimus package and
            ``dynsched optimus ...`` does not import Ray. None: load every plug-in.

    Returns:
        The parser and a list of human-readable problems with broken plug-ins.
    """
    from dynsched_core import __version__

    parser = CommandParser(
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
        if only is not None and name != only:
            problem = _cheap_check(group, name)
            if problem:
                problems.append(problem)
            sub.add_parser(name, help="(see dynsched --help)", add_help=False)
            continue
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
    missing = {n: d for n, d in sorted(KNOWN_SUBCOMMANDS.items()) if n not in group.names()}
    for name, dist in missing.items():
        # Whatever follows (``--help`` included) is ignored: `main` says what to install.
        stub = sub.add_parser(name, help=f"(not installed: pip install {dist})", add_help=False)
        stub.set_defaults(func=_not_installed(name, dist), _not_installed=True)
    if problems:
        parser.epilog = "problems with installed plug-ins:\n  " + "\n  ".join(problems)
    return parser, problems


def _cheap_check(group: PluginGroup, name: str) -> str | None:
    """A problem with a plug-in that is not loaded, found without importing it: a name
    two distributions provide, or a top-level module that is not installed."""
    providers = group.discover().get(name, [])
    if len(providers) > 1:
        dists = ", ".join(p.distribution for p in providers)
        return f"sub-command {name!r} is provided by several distributions ({dists})"
    for p in providers:
        top = p.value.split(":", 1)[0].split(".", 1)[0].strip()
        try:
            found = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return (
                f"sub-command {name!r} of {p.distribution} failed to load: "
                f"module {top!r} is not installed"
            )
    return None


def _not_installed(name: str, dist: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        print(
            f"dynsched: the sub-command {name!r} is provided by {dist}, which is not "
            f"installed: pip install {dist}\n"
            f"  (in a checkout of the dynsched repository: hatch run test:dynsched {name})",
            file=sys.stderr,
        )
        return 2

    return handler


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dynsched`` command.

    Returns:
        The exit status: the handler's, `EXIT_USAGE` for a user error, `EXIT_INTERRUPTED`
        after Ctrl-C.
    """
    prog = "dynsched"
    try:
        return _main(argv)
    except KeyboardInterrupt as exc:
        detail = one_line(exc) if str(exc) else ""
        print(f"{prog}: interrupted{': ' + detail if detail else ''}", file=sys.stderr)
        return EXIT_INTERRUPTED


def _prog_of(args: argparse.Namespace) -> str:
    words = ["dynsched"]
    for attr in ("command", "optimus_command"):
        value = getattr(args, attr, None)
        if isinstance(value, str) and value:
            words.append(value)
    return " ".join(words)


def _requested(argv: Sequence[str]) -> str | None:
    """The sub-command named on the command line (None: none, or ``--help`` first)."""
    for arg in argv:
        if arg in ("-h", "--help", "--version"):
            return None
        if not arg.startswith("-"):
            return arg
    return None


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold a Ctrl-C that comes while the block runs and raise it when the block ends.

    For the import of the plug-ins: import code that catches every exception (a bare
    ``except:`` in a library) would swallow the `KeyboardInterrupt` and leave the
    sub-command half registered ("unrecognized arguments", exit status 2). A second
    Ctrl-C is raised at once. Only the default handler on the main thread is replaced.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    pending: list[int] = []

    def on_sigint(signum: int, frame: object) -> None:
        if pending:
            raise KeyboardInterrupt
        pending.append(signum)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        raise KeyboardInterrupt


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    with _interrupts_deferred():
        parser, problems = build_parser(only=_requested(args_list))
    args, unknown = parser.parse_known_args(args_list)
    if unknown and not getattr(args, "_not_installed", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
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
    prog = _prog_of(args)
    try:
        result = func(args)
    except KeyboardInterrupt as exc:
        detail = one_line(exc) if str(exc) else ""
        print(f"{prog}: interrupted{': ' + detail if detail else ''}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (UsageError, ConfigError, PluginError) as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        if exc.filename is None:
            raise
        reason = exc.strerror or one_line(exc)
        print(f"{prog}: error: {exc.filename}: {reason}", file=sys.stderr)
        return EXIT_USAGE
    return int(result) if result is not None else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
