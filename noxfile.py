"""Test, lint and type-check sessions: `nox -s tests tests-lowest lint typecheck`.

The test matrix (CONTRIBUTING.md, "Test matrix"):

- ``tests-3.11``, ``tests-3.12``, ``tests-3.13``: the suite on every Python
  the package supports (pyproject.toml's classifiers), against the newest
  releases its bounds allow.  ``nox -s tests`` runs them all; a missing
  interpreter skips its cell, saying so, except under ``CI=true``, where it
  is an error.
- ``tests-lowest``: the suite on the oldest supported Python against the
  lowest release of every direct dependency that pyproject.toml allows,
  resolved from the file (``uv pip compile --resolution lowest-direct``).
- ``stores(backend='memory'|'sqlite'|'postgres')``: only the store-dependent
  tests, on one backend (the quick loop; not in the default run).
- ``fuzz``: a bounded fuzzing run against a real server (``python -m fuzz``; not in
  the default run; docs/security.md has its last figures).
- ``lint``, ``typecheck``: ruff, import-linter and mypy, for the oldest
  supported Python (mypy's ``python_version`` and ruff's ``target-version``).

Arguments after ``--`` go to pytest: ``nox -s tests-3.12 -- tests/stores -x``.
"""

from __future__ import annotations

import os

import nox

nox.needs_version = ">=2025.10.14"  # download_python

PYPROJECT = nox.project.load_toml("pyproject.toml")
PYTHONS: list[str] = nox.project.python_versions(PYPROJECT)  # the classifiers, oldest first
OLDEST = PYTHONS[0]
BACKENDS = ("memory", "sqlite", "postgres")

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "tests-lowest", "lint", "typecheck"]
# A Python that is not installed skips its cells, saying so; CI must run every cell.
nox.options.error_on_missing_interpreters = os.environ.get("CI") == "true"
nox.options.download_python = "never"


def pytest(session: nox.Session, *args: str) -> None:
    """The suite in parallel, against the copy of the package installed in the session.

    Four pytest-xdist workers (``--dist worksteal``): most tests wait on
    sockets and child processes rather than compute, so two workers per core
    keep a 2-core machine busy.  ``-- -n 0`` runs them in one process (a
    later ``-n`` wins).
    """
    session.run("pytest", "-n", "4", "--dist", "worksteal", *args, *session.posargs)


def install(session: nox.Session, *args: str) -> None:
    """Install the package with ``args`` (its extras, constraints), then this checkout of it
    again: in a reused virtualenv (``nox -R``) pip keeps the copy of the same version it has."""
    session.install(*args)
    session.install("--no-deps", "--force-reinstall", ".")


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The test suite on one supported Python, against the newest allowed dependencies."""
    install(session, ".[test]")
    pytest(session)


@nox.session(name="tests-lowest", python=OLDEST)
def tests_lowest(session: nox.Session) -> None:
    """The test suite on the oldest Python against the lowest allowed direct dependencies.

    The pins are resolved from pyproject.toml at each run (the package's
    dependencies and its ``test`` extra at their lower bounds, what they pull
    in at its newest), then installed as constraints.
    """
    session.install("uv")
    pins = os.path.join(session.create_tmp(), "lowest.txt")
    session.run(
        *("uv", "pip", "compile", "pyproject.toml", "--extra", "test", "--quiet"),
        *("--resolution", "lowest-direct", "--python-version", OLDEST, "-o", pins),
    )
    install(session, "-c", pins, ".[test]")
    pytest(session)


@nox.session(default=False)
@nox.parametrize("backend", BACKENDS)
def stores(session: nox.Session, backend: str) -> None:
    """The store contract and the store-dependent server tests on one backend only."""
    install(session, ".[test]")
    pytest(session, "-m", "backends", "--store", backend)


@nox.session(default=False)
def fuzz(session: nox.Session) -> None:
    """A bounded fuzzing run against a real server (``python -m fuzz``; not in the default run).

    schemathesis over the OpenAPI document, then mutated raw requests and WebSocket
    frames; no 5xx, no traceback, ``/healthz`` after every batch, no leaked descriptor or
    process.  ``nox -s fuzz -- --duration 600 --seed 7`` (default: 180 s, a random seed).
    """
    install(session, ".[test]")
    session.run("python", "-m", "fuzz", *session.posargs)


@nox.session(python=OLDEST)
def lint(session: nox.Session) -> None:
    """ruff (lint and formatting) and import-linter (the layers, see pyproject.toml)."""
    session.install("-e", ".", "ruff>=0.6", "import-linter>=2.1")
    session.run("lint-imports")
    session.run("ruff", "check", "src", "tests", "bench", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "bench", "noxfile.py")


@nox.session(python=OLDEST)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package and its tests, for the oldest supported Python."""
    session.install(".[test,typecheck]")
    session.run("mypy", "--python-version", OLDEST)
