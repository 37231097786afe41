"""trioserve's benchmarks: scenarios against a real ``trioserve run``, and the tools they share.

Run from the repository root: ``python -m bench --list`` names every scenario,
``python -m bench --only a,b`` runs some (``python -m bench --help``).  The
layout (CONTRIBUTING.md says how to add a scenario):

- ``cli``: the command line; lists, runs and reports the scenarios.
- ``scenarios/``: one module per measurement, each registering its scenario(s).
- ``server``: the server launcher (``Server``, one ``trioserve run`` subprocess)
  and the run's ``Context`` a scenario gets.
- ``client``: the clients (``RawConn`` over trio sockets, ``BlockingConn``,
  the httpx helpers) and the SSE check.
- ``adapter``: the tiny C adapter (``tinyadapter.c``), built on first use.
- ``results``, ``procinfo``, ``pg``, ``profiling``: figures and statistics,
  what ``/proc`` says, PostgreSQL schemas and backends, server profiles.
- ``floor_servers``: the programs the floor scenario runs (bare servers, a
  profiled trioserve); a script, not imported.
- ``event_steps``: what b's decoding, numbering and framing cost alone,
  in-process; a script, not imported.
- ``turn_timeline``: where a turn's first event spends its time inside a server,
  probe by probe (``python -m bench.turn_timeline``); not imported.
"""

from __future__ import annotations


class BenchError(RuntimeError):
    """A scenario could not run or its results failed verification."""
