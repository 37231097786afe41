"""quart-trio's request handling, with one task fewer and no cancellation a request.

quart-trio's ``TrioASGIHTTPConnection`` handles a request in a nursery with
two tasks: one reads the request's messages (its body, then the
``http.disconnect`` that cancels the nursery), one runs the handler and
sends the response, then cancels the nursery; the nursery's own task only
waits for them.  ``HTTPConnection`` runs the handler in the nursery's own
task (one task and one pass of the scheduler fewer a request), and ends a
request that was answered without cancelling anything.

hypercorn hands the application ``http.disconnect`` while the response's
last ``send`` finishes (``H11Protocol._maybe_recycle``), so the reader always
had it by the time the handler cancelled the nursery: the cancellation
only interrupted the nursery's own wait for the reader, at the cost of a
``Cancelled`` raised and caught (about 2 % of a create's instructions).
Now, once the response is sent and the scope says the disconnect is on its
way (``_hypercorn_fixes.DISCONNECT_SENT``), the reader just returns.  The
cancellations stay where they mean something: a client that leaves before
its response is sent still cancels the handler (the reader gets the
disconnect first), and a response that ends otherwise (a timeout, a failed
write) still cancels the reader.
"""

from __future__ import annotations

from typing import cast

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable
from quart.wrappers import Request
from quart_trio.asgi import TrioASGIHTTPConnection

from trioserve.http._hypercorn_fixes import DISCONNECT_SENT


class _StandIn:
    """The nursery quart-trio's reader and handler are given: their cancellation of it
    is only noted, and the connection decides (see the module doc)."""

    def __init__(self) -> None:
        self.cancel_scope = self
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class HTTPConnection(TrioASGIHTTPConnection):
    """quart-trio's HTTP request handling, the handler run in the nursery's own task."""

    _answered = False  # the response is sent and the disconnect on its way to the reader

    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        request = self._create_request_from_scope(send)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.handle_messages, nursery, request, receive)
            await self.handle_request(nursery, request, send)

    async def handle_messages(  # type: ignore[override]
        self, nursery: trio.Nursery, request: Request, receive: ASGIReceiveCallable
    ) -> None:
        """quart-trio's reader (its body handling differs between releases), which
        cancels the nursery once the disconnect comes: unless the response was sent."""
        reader = _StandIn()
        await super().handle_messages(cast(trio.Nursery, reader), request, receive)
        if reader.cancelled and not self._answered:  # the client left first: the handler stops
            nursery.cancel_scope.cancel()

    async def handle_request(  # type: ignore[override]
        self, nursery: trio.Nursery, request: Request, send: ASGISendCallable
    ) -> None:
        """quart-trio's handler, which cancels the nursery once the response is sent:
        unless the disconnect that ends the reader is on its way."""
        handler = _StandIn()
        await super().handle_request(cast(trio.Nursery, handler), request, send)
        if self.scope.get(DISCONNECT_SENT):
            self._answered = True
        elif handler.cancelled:
            nursery.cancel_scope.cancel()
