"""``trioserve``: run, validate and compile agent specs; chat with a running server.

Every failure the user can fix (a bad spec, a bad flag, a port in use) is
one line on stderr and a non-zero exit (2 for usage and spec errors), never
a traceback.

The package: ``_options`` (what every parser shares: help that shows
defaults, value types), ``_parser`` and ``_run_flags`` (the command line;
``run``'s defaults are the settings model's), and one module per command,
loaded when it runs: ``run``, ``spec`` (validate, compile), ``keys``,
``chat`` (with ``terminal``) and ``sessions``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from trioserve.cli._options import EXIT_INTERRUPTED, fail
from trioserve.cli._parser import build_parser
from trioserve.errors import SpecError, StoreError
from trioserve.spec import RuntimeResolutionError

__all__ = ["build_parser", "main"]

Handler = Callable[[argparse.Namespace], int]


def _handler(command: str) -> Handler:
    """The function that runs ``command``, its module imported now."""
    if command == "run":
        from trioserve.cli.run import run_main

        return run_main
    if command == "validate":
        from trioserve.cli.spec import validate_main

        return validate_main
    if command == "compile":
        from trioserve.cli.spec import compile_main

        return compile_main
    if command == "chat":
        from trioserve.cli.chat import chat_main

        return chat_main
    if command == "sessions":
        from trioserve.cli.sessions import sessions_main

        return sessions_main
    from trioserve.cli.keys import keys_main

    return keys_main


def main(argv: Sequence[str] | None = None) -> int:
    """The ``trioserve`` console script; the exit status."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the workers of --workers
    try:
        return _handler(args.command)(args)
    except SpecError as exc:
        if args.command == "run":
            fail(str(exc))  # one line, for service logs
        count = len(exc.problems)
        lines = [f"{exc.source}: {count} problem{'s' if count != 1 else ''}:"]
        lines += [f"  - {problem}" for problem in exc.problems]
        fail("\n".join(lines))
    except (RuntimeResolutionError, StoreError, ValueError) as exc:
        fail(str(exc))
    except BrokenPipeError:
        # `trioserve compile spec.yaml | head`: the reader left; not an error.
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
