"""The HTTP listener: trioserve's own accept loop in front of hypercorn.

``hypercorn.trio.serve`` accepts with ``trio.serve_listeners``, which takes
every connection it can and, when accept fails for lack of descriptors
(EMFILE/ENFILE), logs an error with a traceback ten times a second until
one frees up.  ``serve_http`` is hypercorn's ``worker_serve`` (lifespan,
one ``TCPServer`` per connection, graceful close) for plain-HTTP binds,
with this loop instead:

- At most ``max_connections`` connections are open at once (0: no cap).
  One over the cap is answered at once, without reading its request, with
  ``503 too_many_connections`` (the JSON envelope, ``Retry-After: 1``,
  ``Connection: close``), then half-closed and drained for up to a second so
  the client reads the answer instead of a reset; a client gets a reason it
  can act on, and a load balancer a status it retries elsewhere.  At most
  16 such refusals are in flight; beyond that a connection is closed as
  soon as it is accepted.
- When accept fails for lack of descriptors or memory, the loop logs one
  line at most once a second (how many failures it held back, no
  traceback), retries every 0.1 s, and logs one line when it accepts again.
  Connections wait in the listen backlog meanwhile; nothing else needs to
  happen for the server to recover.

``auto_max_connections`` is the default cap: what RLIMIT_NOFILE leaves
once adapters and the server's own descriptors are provided for, so that a
turn never fails to start its adapter because connections took the
descriptors (see docs/operations.md, "Connections").
"""

from __future__ import annotations

import errno
import logging
import os
import resource
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Final

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app

from .config import Limits
from .hypercorn_fixes import envelope, error_headers

log = logging.getLogger("trioserve.connections")

#: Descriptors one adapter process holds in the server: 3 pipes and a pidfd.
FDS_PER_ADAPTER: Final = 4
#: Descriptors kept back for the server itself: stdio, logs, the store's
#: files, the listening socket, Trio's own, the reaper's pipe, the pipes of
#: adapters being spawned, refusals in flight.
FDS_RESERVED: Final = 64
MAX_REFUSING: Final = 16
REFUSAL_LINGER: Final = 1.0
ACCEPT_RETRY: Final = 0.1
LOG_INTERVAL: Final = 1.0
_CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def open_file_limit() -> int | None:
    """The soft RLIMIT_NOFILE, or None if there is none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def auto_max_connections(limits: Limits, nofile: int | None) -> int:
    """The default ``--max-connections`` for ``nofile`` descriptors (0: no cap).

    ``nofile - 4 * (max_concurrent_turns + warm) - 64``; with no turn cap,
    half of ``nofile - 4 * warm - 64``; ``warm`` is the most warm adapters
    the pool may hold (``warm_adapters_max``, else ``warm_adapters``).  At
    least 1.
    """
    if nofile is None:
        return 0
    warm = max(limits.warm_adapters, limits.warm_adapters_max or 0)
    free = nofile - FDS_RESERVED - FDS_PER_ADAPTER * warm
    if limits.max_concurrent_turns:
        free -= FDS_PER_ADAPTER * limits.max_concurrent_turns
    else:
        free //= 2
    return max(free, 1)


class _Throttled:
    """A log line at most once per ``interval``, counting those held back."""

    def __init__(self, interval: float = LOG_INTERVAL) -> None:
        self.interval = interval
        self.next_at = -float("inf")
        self.held = 0

    def __call__(self, level: int, message: str, *args: object) -> None:
        now = trio.current_time()
        if now < self.next_at:
            self.held += 1
            return
        if self.held:
            message += f" ({self.held} more since the last such line)"
        log.log(level, message, *args)
        self.next_at = now + self.interval
        self.held = 0


class Listener:
    """Accepts connections on one socket and hands them to hypercorn."""

    def __init__(
        self,
        app: Any,
        config: HypercornConfig,
        context: WorkerContext,
        state: dict[str, Any],
        max_connections: int,
    ) -> None:
        self.app = app
        self.config = config
        self.context = context
        self.state = state
        self.max_connections = max_connections
        self.open = 0
        self.refusing = 0
        self._exhausted = _Throttled()
        self._over_cap = _Throttled(10.0)
        self._refusal = _refusal_bytes(max_connections)

    async def accept_loop(self, listener: trio.SocketListener, connections: trio.Nursery) -> None:
        failing_since: float | None = None
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _CAPACITY_ERRNOS:
                        raise
                    if failing_since is None:
                        failing_since = trio.current_time()
                    self._exhausted(
                        logging.ERROR,
                        "cannot accept connections: %s (%s); %d open; retrying every %ss",
                        errno.errorcode.get(exc.errno or 0, "?"),
                        os.strerror(exc.errno or 0),
                        self.open,
                        ACCEPT_RETRY,
                    )
                    await trio.sleep(ACCEPT_RETRY)
                    continue
                if failing_since is not None:
                    waited = trio.current_time() - failing_since
                    log.warning("accepting connections again after %.1fs", waited)
                    failing_since = None
                if self.max_connections and self.open >= self.max_connections:
                    self._over_cap(
                        logging.WARNING,
                        "refusing connections: %d open (--max-connections %d)",
                        self.open,
                        self.max_connections,
                    )
                    if self.refusing < MAX_REFUSING:
                        self.refusing += 1
                        connections.start_soon(self._refuse, stream)
                    else:
                        await trio.aclose_forcefully(stream)
                    continue
                self.open += 1
                connections.start_soon(self._serve, stream)

    async def _serve(self, stream: trio.SocketStream) -> None:
        try:
            state = ConnectionState(self.state.copy())
            # TCPServer takes a SocketStream too (it tells by the missing TLS methods).
            await TCPServer(self.app, self.config, self.context, state, stream)  # type: ignore[arg-type]
        except Exception:
            log.exception("a connection failed")
        finally:
            self.open -= 1
            await trio.aclose_forcefully(stream)

    async def _refuse(self, stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(REFUSAL_LINGER):
                await stream.send_all(self._refusal)
                await stream.send_eof()
                while await stream.receive_some(65536):
                    pass  # let the client finish sending, so it reads the answer
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            self.refusing -= 1
            await trio.aclose_forcefully(stream)


def _refusal_bytes(max_connections: int) -> bytes:
    message = (
        f"the server has its maximum of {max_connections} connections open;"
        " retry in a moment or reuse a connection"
    )
    body = envelope(503, "too_many_connections", message)
    headers = [*error_headers(body), (b"retry-after", b"1")]
    head = b"HTTP/1.1 503 Service Unavailable\r\n"
    head += b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    return head + b"\r\n" + body


async def serve_http(
    app: Any,
    config: HypercornConfig,
    max_connections: int,
    *,
    shutdown_trigger: Callable[[], Awaitable[object]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``config``'s plain-HTTP binds until ``shutdown_trigger`` returns.

    Then stop accepting, close idle connections, and give the others
    ``config.graceful_timeout`` to finish.
    """
    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")
    state: dict[str, Any] = {}
    lifespan = Lifespan(wrapped, config, state)
    context = WorkerContext(None)
    server = Listener(wrapped, config, context, state, max_connections)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            sockets = config.create_sockets()
            listeners = []
            binds = []
            for sock in sockets.insecure_sockets:
                sock.listen(config.backlog)
                listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
                binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
            task_status.started(binds)
            try:
                async with trio.open_nursery() as accepting:
                    for listener in listeners:
                        accepting.start_soon(partial(server.accept_loop, listener, connections))
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()
            finally:
                await context.terminated.set()
                connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
