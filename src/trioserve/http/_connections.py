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

Each connection is served by ``Connection``, hypercorn's ``TCPServer`` with
these fixes:

**A client that stopped reading held its connection for ever.**  hypercorn
writes a response with ``send_all`` in a shielded scope and no time limit:
a client that stops reading (a stuck SSE consumer, a paused big export)
leaves the write waiting once the socket buffers are full, and with it the
SSE heartbeats that would have found the client gone, the turn it streams
(which runs on as if watched) and the connection's slot.  A write now gives
up when the client takes none of it for ``write_timeout``
(``--write-timeout``): the connection is aborted (a reset: what is queued
for the client is dropped) and the application is told the client left
(``http.disconnect``), exactly as when the client vanishes, so a turn
stream's turn is cancelled unless ``onDisconnect`` is ``continue``.  The
deadline is per write call, so a slow reader that keeps taking data is
never cut.

**A refusal sent to a client still sending was often lost.**  When the
server closes a connection (after an ``h11`` error such as a ``431``, after
a response that did not read the whole request body such as a ``413``,
after ``Connection: close``), hypercorn closed the socket at once; closing
with unread input makes the kernel send a reset, which drops what is still
queued for the client and makes its next write fail, so a client sending a
large head or body got ``connection reset`` instead of the answer.  Such a
close is now a linger, as for the over-capacity ``503``: the write side is
shut (the client reads the answer, then EOF), and what the client still
sends is read and dropped until it closes or ``REFUSAL_LINGER`` (1 s)
passes; then the connection is closed.

**A connection the client closed stayed open** (its descriptor and its
``--max-connections`` slot) until the keep-alive timer fired: after the
client's EOF, ``TCPServer.run`` waits for its task group, which still holds
the idle timer.  The read loop now stops that timer once reading is over.

``auto_max_connections`` is the default cap: what RLIMIT_NOFILE leaves
once adapters and the server's own descriptors are provided for, so that a
turn never fails to start its adapter because connections took the
descriptors (see docs/operations.md, "Connections").
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import socket
import struct
from collections.abc import Awaitable, Callable
from functools import partial
from math import inf
from typing import Any, Final

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, Event, RawData
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app

from trioserve.http._hypercorn_fixes import envelope, error_headers
from trioserve.sessions import Limits
from trioserve.units import format_duration

log = logging.getLogger("trioserve.connections")

#: Descriptors one adapter process holds in the server: 3 pipes and a pidfd.
FDS_PER_ADAPTER: Final = 4
#: Descriptors kept back for the server itself: stdio, logs, the store's
#: files, the listening socket, Trio's own, the reaper's pipe, the pipes of
#: adapters being spawned, refusals in flight.
FDS_RESERVED: Final = 64
MAX_REFUSING: Final = 16
MAX_RECV: Final = 65536
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


class Connection(TCPServer):
    """One HTTP connection: hypercorn's ``TCPServer`` with a write deadline and a
    lingering close (see the module doc)."""

    def __init__(
        self,
        app: Any,
        config: HypercornConfig,
        context: WorkerContext,
        state: ConnectionState,
        stream: trio.SocketStream,
        write_timeout: float,
    ) -> None:
        # TCPServer takes a SocketStream too (it tells by the missing TLS methods).
        super().__init__(app, config, context, state, stream)  # type: ignore[arg-type]
        self.socket_stream = stream
        self.write_timeout = write_timeout
        self.reading = trio.CancelScope()  # the read loop; lingering sets its deadline
        self.lingering = False

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, RawData):
            async with self.send_lock:
                try:
                    with trio.CancelScope(shield=True):  # never half a write
                        await self._send_all(event.data)
                    return
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # the client is gone
                except trio.TooSlowError:
                    log.info(
                        "closing a connection: its client took no response data for %s",
                        format_duration(self.write_timeout),
                    )
                    self._abort()
            await self.protocol.handle(Closed())
        elif isinstance(event, Closed):
            self._linger()
            await self.protocol.handle(Closed())
        else:
            await super().protocol_send(event)

    async def _send_all(self, data: bytes) -> None:
        """``send_all``, but ``TooSlowError`` once a write makes no progress for
        ``write_timeout``."""
        sock = self.socket_stream.socket
        if sock.did_shutdown_SHUT_WR:
            raise trio.ClosedResourceError("the connection is closing")
        with memoryview(data) as view:
            sent = 0
            while sent < len(view):
                # trio.fail_after, without its generator-based context manager: this
                # runs for every write of every response (about 5 µs saved each).
                deadline = trio.current_time() + self.write_timeout
                with trio.CancelScope(deadline=deadline) as scope:
                    try:
                        sent += await sock.send(view[sent:])
                    except OSError as exc:
                        raise trio.BrokenResourceError(f"connection broken: {exc}") from exc
                if scope.cancelled_caught:
                    raise trio.TooSlowError

    def _abort(self) -> None:
        """Close with a reset: nothing more is sent, queued data is dropped."""
        sock = self.socket_stream.socket
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()

    def _linger(self) -> None:
        """Shut the write side; the read loop drops input for up to ``REFUSAL_LINGER``."""
        if self.lingering:
            return
        self.lingering = True
        self.reading.deadline = min(self.reading.deadline, trio.current_time() + REFUSAL_LINGER)
        try:
            self.socket_stream.socket.shutdown(socket.SHUT_WR)
        except OSError:  # already gone
            self._abort()

    async def _read_data(self) -> None:
        with self.reading:
            while True:
                # No deadline scope at all without a read timeout (hypercorn's
                # default): an infinite one cost a context manager per read.
                timeout = self.config.read_timeout or inf
                try:
                    if timeout == inf:
                        data = await self.stream.receive_some(MAX_RECV)
                    else:
                        with trio.fail_after(timeout):
                            data = await self.stream.receive_some(MAX_RECV)
                except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
                    break
                if not self.lingering:
                    await self.protocol.handle(RawData(bytes(data)))
                if not data:
                    break
        await self.protocol.handle(Closed())
        await self.idle_task.stop()  # the client is gone: nothing to keep alive


class Listener:
    """Accepts connections on one socket and hands them to hypercorn."""

    def __init__(
        self,
        app: Any,
        config: HypercornConfig,
        context: WorkerContext,
        state: dict[str, Any],
        max_connections: int,
        write_timeout: float,
    ) -> None:
        self.app = app
        self.config = config
        self.context = context
        self.state = state
        self.max_connections = max_connections
        self.write_timeout = write_timeout
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
            await Connection(self.app, self.config, self.context, state, stream, self.write_timeout)
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
    write_timeout: float,
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
    server = Listener(wrapped, config, context, state, max_connections, write_timeout)
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
