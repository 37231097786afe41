"""Everything `trioserve run` needs, as parsed from its flags (the parsers are in `units`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trioserve.http import KeyRing
from trioserve.sessions import Limits


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything ``trioserve run`` needs, as parsed from its flags."""

    host: str = "127.0.0.1"
    port: int = 8080
    store: str = ""  # "" = the default SQLite file
    shutdown_grace: float = 25.0
    limits: Limits = field(default_factory=Limits)
    max_body_bytes: int = 1024 * 1024
    heartbeat: float = 15.0  # SSE keep-alive comment interval; 0 = off
    keep_alive: float = 5.0  # an idle connection (or an incomplete request head) is closed
    write_timeout: float = 30.0  # a response the client takes nothing of this long is cut
    max_connections: int | None = None  # open at once; None = from RLIMIT_NOFILE; 0 = no cap
    keys: KeyRing | None = None  # API keys; None = no authentication
    allowed_hosts: tuple[str, ...] = ()  # Host names answered; () = the bind's defaults
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call
    metrics_bind: tuple[str, int] | None = None  # a second listener for /metrics only
    #: Server processes sharing the port (SO_REUSEPORT) and the store; see ``supervisor``.
    workers: int = 1
