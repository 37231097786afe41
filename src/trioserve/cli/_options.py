"""What every ``trioserve`` command's parser shares: help that shows defaults, value types.

The help of every option ends with its default, read from the option's
``default=`` (itself read from the settings model, see :func:`defaults`)
and shown as one would write it on the command line (:class:`Value`), so a
default is said in one place.  A bad value is one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any, Final, Generic, NoReturn, TypeVar, get_args

from trioserve.http import parse_hosts, parse_origins
from trioserve.spec import split_command
from trioserve.units import format_duration, format_size, parse_bind, parse_duration, parse_size

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
M = TypeVar("M", bound="DataclassInstance")  # a settings dataclass
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, written as on the command line.

    The default shown is the option's own (``default=``, read from the
    settings model), displayed by its value type (``Value.show``), so it is
    said in one place.  A help text that says its default itself, as
    ``(default: ...)``, is left as it is (for defaults that are not a value,
    such as "from the spec").
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or action.default is argparse.SUPPRESS or "(default" in text:
            return text
        shown = _show_default(action).replace("%", "%%")
        return f"{text} (default: {shown})" if text else f"default: {shown}"


def _show_default(action: argparse.Action) -> str:
    value = action.default
    if action.nargs == 0:  # a switch
        return "on" if value else "off"
    if value is None or value == []:
        return "none"
    if isinstance(action.type, Value):
        return action.type.show(value)
    return str(value)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors, help that shows defaults, and negative values.

    An option value that starts with ``-`` and a digit (``--session-ttl -5s``)
    is read as the option's value, so its type can refuse it by name, instead
    of argparse taking it for an unknown option (what Python 3.13 does too).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?[0-9]")

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


@dataclass(frozen=True)
class Value(Generic[T]):
    """An option's value type: parses the command line, shows a default as one would write it."""

    parse: Callable[[str], T]
    name: str
    show: Callable[[T], str] = str

    def __call__(self, text: str) -> T:
        try:
            return self.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


def defaults(model: type[Any]) -> dict[str, Any]:
    """The plain defaults of a settings dataclass, by field name."""
    return {f.name: f.default for f in fields(model) if f.default is not MISSING}


def from_flags(model: type[M], args: argparse.Namespace) -> M:
    """``model`` built from the parsed flags named as its fields; the others keep their default."""
    return model(**{f.name: getattr(args, f.name) for f in fields(model) if hasattr(args, f.name)})


def choices(literal: Any) -> list[str]:
    """The values of a ``Literal`` type, for ``choices=``: the type says them once."""
    return list(get_args(literal))


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise ValueError(f"must be 0 or more, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise ValueError(f"port must be 0..65535, got {value}")
    return value


def _positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise ValueError(f"must be more than 0, got {text!r}")
    return value


def _count_or_auto(text: str) -> int | None:
    if text.strip().lower() == "auto":
        return None
    try:
        return _non_negative_int(text)
    except ValueError:
        raise ValueError(f"expected a whole number or auto, got {text!r}") from None


def _workers(text: str) -> int:
    """``--workers``: a count >= 1, or ``auto`` (the CPUs this process may use)."""
    if text.strip().lower() == "auto":
        return max(1, len(os.sched_getaffinity(0)))
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a number of processes or auto, got {text!r}") from None
    if value < 1:
        raise ValueError(f"must be 1 or more, got {value}")
    return value


def _command(text: str) -> list[str]:
    if not text.strip():
        raise ValueError("empty command: give the adapter's program and its arguments")
    return split_command(text)


COUNT = Value(_non_negative_int, "count")
PORT = Value(_port, "port")
DURATION = Value(parse_duration, "duration", format_duration)
SIZE = Value(parse_size, "size", format_size)
COMMAND = Value(_command, "command", shlex.join)
HOSTS = Value(parse_hosts, "hosts")
ORIGINS = Value(parse_origins, "origins")
POSITIVE_DURATION = Value(_positive_duration, "duration", format_duration)
AUTO_COUNT = Value(_count_or_auto, "count")
WORKERS = Value(_workers, "count")
BIND = Value(parse_bind, "address", lambda bind: f"{bind[0]}:{bind[1]}")


class Extend(argparse.Action):
    """A repeatable option whose values (tuples, from a comma list each) add up."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, (*getattr(namespace, self.dest, ()), *values))


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """One line on stderr, ``trioserve: <message>``, and exit with ``code``."""
    print(f"trioserve: {message}", file=sys.stderr)
    raise SystemExit(code)
