"""The HTTP listener: trioserve's own accept loop in front of hypercorn.

``hypercorn.trio.serve`` accepts with ``trio.serve_listeners``, which takes
every connection it can and, when accept fails for lack of descriptors
(EMFILE/ENFILE), logs an error with a traceback ten times a second until
one frees up.  ``serve_http`` is hypercorn's ``worker_serve`` (lifespan,
one ``TCPServer`` per connection, graceful close) for plain-HTTP binds,
with this loop instead:

- At most ``max_connections`` connections are open at once, and at most
  ``max_per_address`` from one client address (0: no cap;
  ``_connection_caps`` has the rules).  At ``max_connections``, the
  connection idle longest is closed to admit the new one (``_idle``).  One
  over a cap (``max_connections`` with none idle) is answered at once,
  without reading its request, with ``503 too_many_connections`` or
  ``429 address_connection_cap`` (the JSON envelope, ``Retry-After: 1``,
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

**A client that half-closed after its request got no response.**  At an
EOF, hypercorn told the application the client had left (``http.disconnect``)
whatever came before it, so ``shutdown(SHUT_WR)`` after a whole request
(RFC 9112 §9.6 lets the server finish) cancelled the request: a response
cut off or never sent, a turn never run.  An EOF after a whole request
whose response is owed now lets the response finish, and the client is
found gone, if it is, by writing (``_half_close`` has the rules: an SSE
stream gets one ``: keep-alive`` comment at once, and a reset within a
round trip means the client left); then the connection closes.  An EOF
anywhere else (mid-body, between requests) is the client leaving, as before.

**A connection the client closed stayed open** (its descriptor and its
``--max-connections`` slot) until the keep-alive timer fired: after the
client's EOF, ``TCPServer.run`` waits for its task group, which still holds
the idle timer.  The read loop now stops that timer once reading is over.

**An idle connection was closed over a waiting request**, and one over
the cap refused while idle ones held every slot: ``_idle`` has both.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from functools import partial
from math import inf
from typing import Any, Final

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app

from trioserve.fdio import read_some
from trioserve.http._connection_caps import ConnectionCaps, Throttled, address_key
from trioserve.http._half_close import (
    is_sse_head,
    peer_reset,
    probe_chunk,
    reset_wait,
    response_owed,
)
from trioserve.http._idle import Idle, KeepAlive, evict_longest_idle
from trioserve.locks import Mutex
from trioserve.units import format_duration

log = logging.getLogger("trioserve.connections")

MAX_REFUSING: Final = 16
MAX_RECV: Final = 65536
REFUSAL_LINGER: Final = 1.0
ACCEPT_RETRY: Final = 0.1
_CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def body_follows(data: bytes) -> bool:
    """Whether ``data`` is a response head whose body the protocol sends next, at once:
    a final status with a ``Content-Length`` (an application sends such a response
    whole; a streamed body, as SSE, is chunked, and its head goes out alone at once).

    The connection holds such a head and writes it with what comes next (the
    body, or the end of the message: nothing, for a ``HEAD`` or a ``304``): one
    socket write a JSON response instead of three (head, body, and an empty
    one for the end), each of which woke the client.
    """
    return data.startswith(b"HTTP/1.1 ") and data[9] != 0x31 and b"\r\ncontent-length:" in data


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
        timers: KeepAlive,
    ) -> None:
        # TCPServer takes a SocketStream too (it tells by the missing TLS methods).
        super().__init__(app, config, context, state, stream)  # type: ignore[arg-type]
        self.socket_stream = stream
        self.write_timeout = write_timeout
        self.reading = trio.CancelScope()  # the read loop; lingering sets its deadline
        self.lingering = False
        #: Waiting to finish a half-closed client's response; cancelled once it is done.
        self.owed = trio.CancelScope()
        self.streaming = trio.Event()  # the response being written is an SSE stream
        self.idle = Idle(stream.socket, timers)
        self.held = b""  # a response head written with its body (``body_follows``)
        #: One writer at a time (a response, WebSocket pings, a probe): hypercorn's
        #: ``send_lock``, but no trip to the scheduler when free (every write).
        self.writing = Mutex()

    async def protocol_send(self, event: Event) -> None:
        if self.held and not isinstance(event, RawData):
            await self.protocol_send(RawData(b""))  # the held head goes first
        if isinstance(event, RawData):
            data = event.data
            if self.held:  # one write: the held head and what follows it
                data, self.held = self.held + data, b""
            elif not data:
                return  # the end of a Content-Length body: nothing to write
            elif body_follows(data):
                self.held = data
                return
            async with self.writing:
                try:
                    await self._send_all(data)  # shielded: never half a write
                    if not self.streaming.is_set() and is_sse_head(data):
                        self.streaming.set()
                    return
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # the client is gone
                except trio.TooSlowError:
                    log.info(
                        "closing a connection: its client took no response data for %s",
                        format_duration(self.write_timeout),
                    )
                    self._abort()
            self.owed.cancel()
            await self.protocol.handle(Closed())
        elif isinstance(event, Closed):
            self._linger()
            self.owed.cancel()
            await self.protocol.handle(Closed())
        else:
            if isinstance(event, Updated):  # the timers are the server's (``KeepAlive``)
                self.idle.mark(event.idle)
                if not event.idle:  # a request begins
                    self.streaming = trio.Event()
                return
            await super().protocol_send(event)

    async def _send_all(self, data: bytes) -> None:
        """``send_all``, shielded from cancellation (never half a write), but
        ``TooSlowError`` once a write makes no progress for ``write_timeout``.

        What the socket's buffer takes at once (nearly every write) is written
        right away, with no cancel scope and no trip to the scheduler (trio's own
        ``send`` yields after each): 4 % of a create + turn's instructions. The
        rest waits for the socket, under the deadline.  The task still yields
        wherever it waits for what it sends next (a request, an event)."""
        sock = self.socket_stream.socket
        if sock.did_shutdown_SHUT_WR:
            raise trio.ClosedResourceError("the connection is closing")
        with memoryview(data) as view:
            try:
                sent = os.write(sock.fileno(), view)  # the socket is non-blocking
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise trio.BrokenResourceError(f"connection broken: {exc}") from exc
            while sent < len(view):
                # trio.fail_after, without its generator-based context manager, and the
                # shield in the same scope: this runs for every write of every response
                # (about 5 µs saved each, and 3 more).
                deadline = trio.current_time() + self.write_timeout
                with trio.CancelScope(deadline=deadline, shield=True) as scope:
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

    async def _idle_timeout(self) -> None:
        """hypercorn's keep-alive timer, started with the connection: nothing, the server's
        ``KeepAlive`` times every connection (a request waiting at the deadline is served,
        an evicted connection closes at once: ``Idle``)."""

    async def _read_data(self) -> None:
        half_closed = False
        with self.reading:
            while True:
                # No deadline scope without a read timeout (hypercorn's default).
                timeout = self.config.read_timeout or inf
                try:
                    # Cancelled only while waiting: bytes taken from the socket are returned.
                    with self.idle.read_scope() as waiting:
                        if timeout == inf:
                            data = await self._receive()
                        else:
                            with trio.fail_after(timeout):
                                data = await self._receive()
                except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
                    break
                if waiting.cancelled_caught:  # the keep-alive ran out, or evicted, or a drain
                    if self.lingering or not self.idle.input_waiting():
                        break
                    self.idle.rearm()  # a request came as it closed: serve it
                    continue
                if not data and not self.lingering:
                    half_closed = response_owed(self.protocol.protocol)
                if not self.lingering:
                    # At an EOF h11 only notes it; the application hears of it below.
                    await self.protocol.handle(RawData(bytes(data)))
                if not data:
                    break
        if half_closed:
            await self._finish_owed()
        await self.protocol.handle(Closed())  # the application: the client is gone
        await self.idle_task.stop()  # nothing to keep alive

    async def _receive(self, max_bytes: int = MAX_RECV) -> bytes:
        """The stream's ``receive_some(max_bytes)``, with one trip to the scheduler a
        request where trio takes two (``fdio.read_some``)."""
        return await read_some(self.socket_stream.socket, max_bytes)

    async def _finish_owed(self) -> None:
        """The client half-closed after a whole request: let its response finish, unless
        writing finds the client gone (see the module doc and ``_half_close``)."""
        sock = self.socket_stream.socket
        with self.owed:  # cancelled when the response is done or a write fails
            await self.streaming.wait()  # anything else finishes by itself
            async with self.writing:
                chunk = probe_chunk(self.protocol.protocol)
                if chunk is not None:
                    with contextlib.suppress(
                        trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError
                    ):
                        await self._send_all(chunk)
            await trio.sleep(reset_wait(sock))
            if peer_reset(sock):
                return  # it left: a disconnect, as at any other EOF
            await trio.sleep_forever()


class Listener:
    """Accepts connections on one socket and hands them to hypercorn."""

    def __init__(
        self,
        app: Any,
        config: HypercornConfig,
        context: WorkerContext,
        state: dict[str, Any],
        caps: ConnectionCaps,
        write_timeout: float,
    ) -> None:
        self.app = app
        self.config = config
        self.context = context
        self.state = state
        self.caps = caps
        self.write_timeout = write_timeout
        self.refusing = 0
        self.connections: set[Connection] = set()  # being served
        self.timers = KeepAlive(config.keep_alive_timeout)  # theirs, run by ``serve_http``
        self._exhausted = Throttled()
        self._evicting = Throttled(10.0)

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
                        self.caps.open,
                        ACCEPT_RETRY,
                    )
                    await trio.sleep(ACCEPT_RETRY)
                    continue
                if failing_since is not None:
                    waited = trio.current_time() - failing_since
                    log.warning("accepting connections again after %.1fs", waited)
                    failing_since = None
                key = _peer_key(stream)
                refusal = None if key is None else self.caps.admit(key, self._evict)
                if key is None:  # reset before it was accepted
                    await trio.aclose_forcefully(stream)
                elif refusal is None:
                    connections.start_soon(self._serve, stream, key)
                elif self.refusing < MAX_REFUSING:
                    self.refusing += 1
                    connections.start_soon(self._refuse, stream, refusal)
                else:
                    await trio.aclose_forcefully(stream)

    def _evict(self) -> bool:
        """Close the connection idle longest for a new one (it counts as open until it has
        closed, a moment later); whether one was."""
        if not evict_longest_idle(self.connections):
            return False
        self._evicting(
            logging.INFO,
            "closing the connection idle longest for a new one (--max-connections %d)",
            self.caps.max_connections,
        )
        return True

    async def _serve(self, stream: trio.SocketStream, key: str) -> None:
        connection: Connection | None = None
        try:
            state = ConnectionState(self.state.copy())
            connection = Connection(
                self.app, self.config, self.context, state, stream, self.write_timeout, self.timers
            )
            self.connections.add(connection)
            await connection
        except Exception:
            log.exception("a connection failed")
        finally:
            if connection is not None:
                self.connections.discard(connection)
                connection.idle.release()
            self.caps.release(key)
            await trio.aclose_forcefully(stream)

    async def _refuse(self, stream: trio.SocketStream, refusal: bytes) -> None:
        try:
            with trio.move_on_after(REFUSAL_LINGER):
                await stream.send_all(refusal)
                await stream.send_eof()
                while await stream.receive_some(65536):
                    pass  # let the client finish sending, so it reads the answer
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            self.refusing -= 1
            await trio.aclose_forcefully(stream)


def _peer_key(stream: trio.SocketStream) -> str | None:
    """What the client's address counts under (``address_key``); ``None`` if it is gone."""
    try:
        peer = stream.socket.getpeername()
    except OSError:
        return None
    return address_key(peer[0] if isinstance(peer, tuple) else str(peer))


async def serve_http(
    app: Any,
    config: HypercornConfig,
    max_connections: int,
    *,
    max_per_address: int = 0,
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
    caps = ConnectionCaps(max_connections, max_per_address)
    server = Listener(wrapped, config, context, state, caps, write_timeout)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as timing:  # the connections' keep-alive timers
            timing.start_soon(server.timers.run, context.terminated.wait)
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
                    grace = config.graceful_timeout
                    connections.cancel_scope.deadline = trio.current_time() + grace
            timing.cancel_scope.cancel()
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
