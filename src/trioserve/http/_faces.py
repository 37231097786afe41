"""The seam the protocol faces (MCP, and the next ones) share over the session manager.

A face translates its protocol's calls into these and the log's events
into its protocol's messages; it keeps no state of its own.  A turn
started here is an ordinary turn: the same caps, single flight, tenants,
log and ``seq``, so it can be followed, resumed and cancelled over the
v0.8 API (and any other face) like one started there.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic_core import PydanticSerializationError, from_json, to_json

from trioserve.errors import SessionBusy, SessionNotFound
from trioserve.protocol import OnDisconnect, TurnProtocol
from trioserve.sessions import SessionManager, Turn, turn_protocol
from trioserve.stores.base import LoggedEvent


async def start_turn(
    manager: SessionManager,
    text: str,
    *,
    protocol: TurnProtocol,
    session_id: str | None,
    tenant: str | None,
    on_disconnect: OnDisconnect | None = None,
    webhook: str | None = None,
) -> Turn:
    """Start a turn of ``text`` on ``session_id``, or on a new session of ``tenant`` if ``None``;
    the turn is ``protocol``'s (the turn metrics' label, its log line); its end is POSTed
    to ``webhook`` if given (checked first: ``InvalidRequest`` naming ``webhook``).

    Raises the manager's refusals (``NotFound``, ``SessionBusy``, the caps,
    ``Draining``) before anything runs.  A busy session is refused
    (``multitask: reject``): the faces do not queue or interrupt turns yet.
    """
    if session_id is None:
        session_id = (await manager.create_session(tenant=tenant)).id
    with turn_protocol(protocol):
        turn = await manager.start_turn(
            session_id,
            text,
            on_disconnect=on_disconnect,
            tenant=tenant,
            multitask="reject",
            webhook=webhook,
        )
    if not isinstance(turn, Turn):  # reject never queues
        raise SessionBusy(f"session {session_id} already has a turn in flight")
    return turn


def face_key(kind: str, *parts: str) -> str:
    """An idempotency key for a face's own name of a thread or a run (printable ASCII,
    whatever the names are): ``kind`` says whose (``ag-ui.run``, ``a2a.context``)."""
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:48]
    return f"{kind}:{digest}"


async def named_session(manager: SessionManager, kind: str, name: str, tenant: str | None) -> str:
    """The session a face's name for a conversation stands for (AG-UI's ``threadId``,
    A2A's ``contextId``): the session of that id if ``tenant`` has one, else the
    session the name got on its first use (created then, with no inputs, and bound
    to the name in the store like an idempotency key, for ``--idempotency-window``)."""
    try:
        return (await manager.get_session(name, tenant)).id
    except SessionNotFound:
        pass
    return (await manager.keyed.bound_session(face_key(kind, name), tenant=tenant)).id


def event_object(event: LoggedEvent) -> dict[str, Any]:
    """A logged event's JSON object (``seq`` included).

    The faces' one parse of an event, on their hot path: pydantic-core's
    parser (about three times as fast as ``json``), and ``json`` for what it
    refuses (a lone surrogate escape, as the adapter's line was taken).
    """
    try:
        value = from_json(event.raw)
    except ValueError:
        value = json.loads(event.raw)
    return value if isinstance(value, dict) else {}


def json_string(text: str) -> bytes:
    """``text`` as a JSON string, as the protocols' models write one (UTF-8, not escaped
    to ASCII); a lone surrogate, which UTF-8 cannot hold, as a ``\\u`` escape."""
    try:
        return to_json(text)
    except PydanticSerializationError:
        return json.dumps(text).encode()


def event_json(event: LoggedEvent) -> bytes:
    """A logged event's JSON as UTF-8 bytes, to embed in a face's frame (``raw`` as it is,
    unless it holds an encoded lone surrogate: then re-serialized with escapes)."""
    raw = event.raw
    if raw.isascii():
        return raw
    try:
        raw.decode()
    except UnicodeDecodeError:
        return json.dumps(json.loads(raw), separators=(",", ":")).encode()
    return raw


def event_text(event: LoggedEvent) -> str:
    """A logged event's JSON as text (re-serialized only if it is not UTF-8)."""
    try:
        return event.raw.decode()
    except UnicodeDecodeError:  # an encoded lone surrogate: escape it
        return json.dumps(json.loads(event.raw), separators=(",", ":"))


def message_text(data: Any) -> tuple[str, bool] | None:
    """The text of an assistant ``message`` event's ``data`` and whether it is a
    streamed piece (``delta: true``); ``None`` if it carries no text."""
    if not isinstance(data, dict) or data.get("role", "assistant") != "assistant":
        return None
    text = data.get("text")
    if not isinstance(text, str):
        return None
    return text, data.get("delta") is True


@dataclass
class Reply:
    """The agent's reply text, gathered from a turn's ``message`` events.

    The streamed pieces (``delta: true``) joined, if the turn streamed any;
    else the whole messages joined (an adapter that streams also sends each
    round's whole text, ``final: true``, which is then not counted twice).
    """

    pieces: list[str] = field(default_factory=list)
    wholes: list[str] = field(default_factory=list)
    last_seq: int = 0

    def add(self, event: LoggedEvent, value: dict[str, Any] | None = None) -> None:
        """Count ``event`` (``value``: its JSON object, if parsed already)."""
        self.last_seq = event.seq
        if event.type != "message":
            return
        if value is None:
            value = event_object(event)
        found = message_text(value.get("data"))
        if found is not None:
            (self.pieces if found[1] else self.wholes).append(found[0])

    @property
    def text(self) -> str:
        return "".join(self.pieces) if self.pieces else "".join(self.wholes)
