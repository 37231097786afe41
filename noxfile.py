"""Test, lint and type-check sessions: `nox -s tests lint typecheck`."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "lint", "typecheck"]


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite against an installed copy of the package, in parallel.

    Four pytest-xdist workers (``--dist worksteal``): most tests wait on
    sockets and child processes rather than compute, so two workers per core
    keep a 2-core machine busy.  ``nox -s tests -- -n 0`` runs them in one
    process (a later ``-n`` wins).
    """
    session.install(".[test]")
    session.run("pytest", "-n", "4", "--dist", "worksteal", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and formatting) and import-linter (the layers, see pyproject.toml)."""
    session.install("-e", ".", "ruff>=0.6", "import-linter>=2.1")
    session.run("lint-imports")
    session.run("ruff", "check", "src", "tests", "bench", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "bench", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package and its tests (which need the test extra's imports)."""
    session.install(".[test,typecheck]")
    session.run("mypy")
