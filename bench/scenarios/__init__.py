"""The scenarios: one module per measurement; ``@scenario`` makes a function one, and
``registry`` finds them all (a new module needs no other change).

A scenario's ``run(ctx, sizes)`` starts its servers with ``ctx.server`` (or
``bench.server.Server``), drives them with ``bench.client``, checks what comes back
(a wrong answer raises ``BenchError``) and returns a ``Result``: its figures, each
with its target if it has one.  ``full`` and ``quick`` are its sizes (any frozen
dataclass) for a full and a ``--quick`` run; ``options`` adds its own flags to the
command line (read back from ``ctx.options``).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Generic, TypeVar

from bench.results import Result
from bench.server import Context

S = TypeVar("S")


@dataclass(frozen=True)
class Scenario(Generic[S]):
    """One scenario: what ``--only`` calls it, one line for ``--list``, how it runs."""

    key: str  # a letter (a-n, the scenarios of the first rounds) or, for new ones, its name
    name: str  # what it measures, as a word: also accepted by --only
    summary: str  # one line: what it measures [its target]
    run: Callable[[Context, S], Result]
    full: S
    quick: S
    options: Callable[[argparse.ArgumentParser], None] | None = None

    def sizes(self, quick: bool) -> S:
        return self.quick if quick else self.full


def scenario(
    key: str,
    name: str,
    *,
    full: S,
    quick: S,
    options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> Callable[[Callable[[Context, S], Result]], Scenario[S]]:
    """Make ``run(ctx, sizes)`` a scenario (see ``Scenario``); the first paragraph of its
    docstring is its summary: what it measures, [its target]."""

    def register(run: Callable[[Context, S], Result]) -> Scenario[S]:
        if not run.__doc__:
            raise TypeError(f"scenario {key}: {run.__qualname__} has no docstring")
        summary = " ".join(run.__doc__.split("\n\n", 1)[0].split())
        return Scenario(key, name, summary, run, full, quick, options)

    return register


def in_module(module: ModuleType) -> list[Scenario[Any]]:
    """The scenarios a module defines (not those it imports)."""
    return [
        value
        for value in vars(module).values()
        if isinstance(value, Scenario) and value.run.__module__ == module.__name__
    ]


def registry() -> dict[str, Scenario[Any]]:
    """Every module's scenarios by key: the lettered ones first, then by name."""
    found: dict[str, Scenario[Any]] = {}
    names: set[str] = set()
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for each in in_module(module):
            if each.key in found or each.name in names:
                raise RuntimeError(f"{module.__name__}: {each.key}/{each.name} is taken")
            found[each.key] = each
            names.add(each.name)
    return dict(sorted(found.items(), key=lambda kv: (len(kv[0]) > 1, kv[0])))
