"""``python -m fuzz``: a bounded fuzzing run against a real ``trioserve run`` (``nox -s fuzz``).

Two phases share one server (the echo runtime, a SQLite store in a
temporary directory, its log kept): schemathesis over the server's OpenAPI
document (``fuzz.schema``), then a mutator of valid raw requests over plain
sockets (``fuzz.mutator``): request heads, framing (``Content-Length``,
chunked), bodies and WebSocket frames.  Every batch ends with checks
(``fuzz.server``): ``/healthz`` answers ``200``, the log has no new
traceback.  The run ends with a drain (``SIGTERM``, exit status 0) after
checking that the server holds no more file descriptors and no more child
processes than before the run.  A finding is any ``5xx`` but ``501`` (an
unknown method, on purpose), a WebSocket closed with ``1011``, a traceback,
a failed health check or a leak; ``docs/security.md`` has the figures of
the last run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Findings:
    """What a run found, and how much it sent."""

    requests: dict[str, int] = field(default_factory=dict)
    found: list[dict[str, Any]] = field(default_factory=list)

    def count(self, phase: str, n: int = 1) -> None:
        self.requests[phase] = self.requests.get(phase, 0) + n

    def add(self, kind: str, **details: Any) -> None:
        self.found.append({"kind": kind, **details})
