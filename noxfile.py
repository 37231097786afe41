"""Test, lint and type-check sessions: `nox -s tests lint typecheck`."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "lint", "typecheck"]


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite against an installed copy of the package."""
    session.install(".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and formatting) and import-linter (the layers, see pyproject.toml)."""
    session.install("-e", ".", "ruff>=0.6", "import-linter>=2.1")
    session.run("lint-imports")
    session.run("ruff", "check", "src", "tests", "bench", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "bench", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package."""
    session.install(".[typecheck]")
    session.run("mypy")
