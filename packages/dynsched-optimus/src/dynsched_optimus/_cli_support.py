"""What every ``dynsched optimus`` command shares: one-line errors and flags that show
their default (used by :mod:`dynsched_optimus.cli` and :mod:`dynsched_optimus.cluster.cli`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from dynsched_optimus._errors import OptimusError

__all__ = ["Handler", "add_option", "one_line_errors"]

Handler = Callable[[argparse.Namespace], int]


def one_line_errors(fn: Handler) -> Handler:
    """Bad input found by a handler: one line naming the command, exit status 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except OptimusError as exc:
            name = getattr(args, "optimus_command", None) or getattr(args, "cmd", "")
            print(f"dynsched optimus {name}: error: {exc}", file=sys.stderr)
            return 2

    run.__doc__ = fn.__doc__
    return run


def add_option(
    parser: argparse.ArgumentParser, flag: str, default: Any, text: str, **kwargs: Any
) -> None:
    """Add ``flag`` with a help ``text`` that ends with its default: ``(default: 60)``."""
    shown = f"{default:g}" if isinstance(default, float) else default
    parser.add_argument(flag, default=default, help=f"{text} (default: {shown})", **kwargs)
