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
    #: An idle connection (or an incomplete request head) is closed after this long;
    #: above the idle timeout of the load balancers and proxies in front (60 s is common),
    #: so that they close first (as nginx's 75 s).
    keep_alive: float = 75.0
    write_timeout: float = 30.0  # a response the client takes nothing of this long is cut
    max_connections: int | None = None  # open at once; None = from RLIMIT_NOFILE; 0 = no cap
    #: Connections open at once from one client address (IPv6: its /64); 0 = no cap.
    max_connections_per_ip: int = 64
    #: SSE streams and WebSockets one tenant holds open; None = half the connection cap.
    max_streams_per_tenant: int | None = None
    keys: KeyRing | None = None  # API keys; None = no authentication
    allowed_hosts: tuple[str, ...] = ()  # Host names answered; () = the bind's defaults
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call
    metrics_bind: tuple[str, int] | None = None  # a second listener for /metrics only
    #: Server processes sharing the port (SO_REUSEPORT) and the store; see ``supervisor``.
    workers: int = 1
    #: The web console at ``/`` (``--no-console``: off, ``/`` is a 404).
    console: bool = True
    #: The protocol faces over the same sessions (docs/protocols.md): MCP at ``/mcp``,
    #: AG-UI at ``/ag-ui``, A2A at ``/a2a`` (and its card).
    mcp: bool = True
    ag_ui: bool = True
    a2a: bool = True
