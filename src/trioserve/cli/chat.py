"""``trioserve chat``: the client library on a terminal.

``chat URL`` creates a session (with ``--input KEY=VALUE`` for the spec's
``${inputs.KEY}``; or takes ``--session ID``), prints
``session <id>``, then runs each line of standard input as a turn and
prints the assistant's reply as it streams.  Ctrl-C during a turn cancels
that turn and the prompt comes back; Ctrl-C at the prompt, or a second one
while a cancel is under way, exits with status 130; end of input exits 0.
A tool call that waits for an approval is asked about on stderr
(``approve TOOL ARGS? [y/N]``) and the next line decides it (``y``/``yes``
approves; anything else, or the end of input, denies).

On a terminal a line typed while a reply streams is sent at once, with
``--multitask`` (default ``enqueue``: the server queues it and runs it
next; a line on stderr gives its place); the replies print one after
another, in the order the lines were typed, and Ctrl-C cancels the one
printing (a queued one by its id).  Piped input runs one line after
another, as before.
A refusal (409, 429, 400) is one line on stderr and the next line is read;
a lost session, a draining or unreachable server end the command (status 1).

A session the command created is ended (``DELETE /v1/sessions/{id}``)
however the command exits, unless ``--keep-session``: then a line on
stderr says how to resume it.  A session given with ``--session`` is never
ended.

Standard input and output are Trio streams (``terminal.Console``).
SIGINT, SIGTERM and SIGHUP are taken by a signal receiver for the whole
command; one task watches it, in the same nursery as the command itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

import trio

from trioserve.cli._options import EXIT_FAILURE, EXIT_INTERRUPTED
from trioserve.cli.terminal import Console, Printer
from trioserve.client import (
    APIError,
    BadRequestError,
    Client,
    ConnectError,
    DrainingError,
    Multitask,
    NotFoundError,
    Session,
    Transport,
    TrioserveClientError,
)
from trioserve.client.http import check_base_url
from trioserve.protocol import APPROVAL_REQUESTED, TURN_QUEUED

_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PROMPT: Final = "> "
#: How long ending the session may take on the way out.
END_SESSION_TIMEOUT: Final = 10.0


def chat_main(args: argparse.Namespace) -> int:
    """``trioserve chat URL [--session ID] [--transport T] [--input K=V]... [--keep-session]``."""
    check_base_url(args.url)  # a bad URL is a usage error (ValueError), before anything runs
    inputs = parse_inputs(args.input)
    if inputs and args.session:
        raise ValueError("--input is for a new session; --session reuses one")
    return trio.run(
        partial(
            chat,
            args.url,
            args.session,
            args.transport,
            inputs,
            args.keep_session,
            args.api_key,
            args.multitask,
        )
    )


def parse_inputs(items: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings as a dict; ``ValueError`` for one without ``=``."""
    inputs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--input expects KEY=VALUE, got {item!r}")
        inputs[key] = value
    return inputs


async def chat(
    url: str,
    session_id: str | None,
    transport: Transport,
    inputs: dict[str, str] | None = None,
    keep_session: bool = False,
    api_key: str | None = None,
    multitask: Multitask = "enqueue",
) -> int:
    """Run the chat loop; return the exit status."""
    async with Console.open() as console:
        command = Chat(url, session_id, transport, console, inputs, keep_session, api_key)
        command.multitask = multitask
        return await command.run()


@dataclass(eq=False)
class _Question:
    """A turn asks whether a tool call may run; on a terminal the next line typed answers."""

    answered: trio.Event = field(default_factory=trio.Event)
    line: str | None = None  # None: the input ended

    def answer(self, line: str | None) -> None:
        self.line = line
        self.answered.set()


@dataclass(eq=False)
class _Running:
    """The turn in progress and the state of a cancel."""

    printer: Printer
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    started: bool = False  # the server accepted it: cancel it with DELETE
    cancelling: bool = False
    cancel_done: trio.Event | None = None  # set when the DELETE has its answer
    queued_as: str | None = None  # its turn id, if the server queued it
    accepted: trio.Event = field(default_factory=trio.Event)  # the server answered it
    done: trio.Event = field(default_factory=trio.Event)  # its reply is printed


class Chat:
    """One chat command: the loop, and a task that watches the signals."""

    def __init__(
        self,
        url: str,
        session_id: str | None,
        transport: Transport,
        console: Console,
        inputs: dict[str, str] | None = None,
        keep_session: bool = False,
        api_key: str | None = None,
    ) -> None:
        self._url = url
        self._inputs = inputs
        self._session_id = session_id
        self._created: str | None = None  # the session this command created
        self._keep_session = keep_session
        self._transport: Transport = transport
        self._console = console
        self._client = Client(url, api_key=api_key)
        self._inflight: list[_Running] = []  # the turns sent, in order; the first prints
        self._code = 0
        self._failed: int | None = None  # a turn ended the chat (a terminal's)
        self._questions: list[_Question] = []  # approvals asked on a terminal, in order
        #: What a line typed while a reply streams does (``multitask``).
        self.multitask: Multitask = "enqueue"

    @property
    def _running(self) -> _Running | None:
        """The turn whose reply prints (and a Ctrl-C cancels)."""
        return self._inflight[0] if self._inflight else None

    async def run(self) -> int:
        with trio.open_signal_receiver(*_SIGNALS) as signals:
            async with self._client:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._watch, signals)
                    self._code = await self._loop()
                    nursery.cancel_scope.cancel()
                with contextlib.suppress(trio.BrokenResourceError):
                    if self._code == EXIT_INTERRUPTED and self._console.interactive:
                        await self._console.out("\n")
                    await self._leave()
        return self._code

    async def _leave(self) -> None:
        """End the session this command created, or say how to resume it."""
        session_id = self._created
        if session_id is None:
            return
        if self._keep_session:
            resume = f"trioserve chat {self._url} --session {session_id}"
            await self._console.err(f"session {session_id} kept; resume it with: {resume}\n")
            return
        problem = f"no answer within {END_SESSION_TIMEOUT:g}s"
        with trio.move_on_after(END_SESSION_TIMEOUT) as scope:
            scope.shield = True
            try:
                await self._client.end_session(session_id)
                return
            except NotFoundError:
                return  # already gone
            except TrioserveClientError as exc:
                problem = str(exc)
        await self._console.err(f"trioserve: session {session_id} was not ended: {problem}\n")

    async def _watch(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            running = self._running
            if signum == signal.SIGINT and running is not None and not running.cancelling:
                running.cancelling = True
                if running.started:
                    running.cancel_done = trio.Event()
                    self._nursery.start_soon(self._cancel, running)
                else:  # not accepted yet: abandoning the request is the cancel
                    running.scope.cancel()
                continue
            self._code = EXIT_INTERRUPTED if signum == signal.SIGINT else 128 + signum
            self._nursery.cancel_scope.cancel()
            return

    async def _cancel(self, running: _Running) -> None:
        assert self._session_id is not None and running.cancel_done is not None
        try:
            with contextlib.suppress(trio.BrokenResourceError):
                await running.printer.end_line()
                await self._console.err("cancelling the turn (Ctrl-C again to quit)\n")
            await self._client.cancel(self._session_id, running.queued_as)
        except NotFoundError:
            pass  # the turn had just ended
        except APIError as exc:
            if exc.reason != "turn_ended":  # a queued one that had just ended
                with contextlib.suppress(trio.BrokenResourceError):
                    await self._console.err(f"trioserve: cannot cancel the turn: {exc}\n")
        except TrioserveClientError as exc:
            with contextlib.suppress(trio.BrokenResourceError):
                await self._console.err(f"trioserve: cannot cancel the turn: {exc}\n")
        finally:
            running.cancel_done.set()

    async def _loop(self) -> int:
        try:
            return await self._chat()
        except trio.BrokenResourceError:  # stdout or stderr was closed: the reader left
            return 0

    async def _chat(self) -> int:
        session = await self._session()
        if session is None:
            return EXIT_FAILURE
        self._session_id = session.id
        await self._console.out(f"session {session.id}\n")
        if self._console.interactive:
            return await self._typed()
        while True:
            line = await self._console.readline()
            if line is None:
                return 0
            if line.strip():
                running = _Running(Printer(self._console))
                self._inflight.append(running)
                code = await self._turn(line, running)
                if code is not None:
                    return code

    async def _typed(self) -> int:
        """A terminal: each line is sent at once (``multitask`` while a reply streams)."""
        async with trio.open_nursery() as turns:
            self._turns = turns
            await self._console.out(PROMPT)
            while (line := await self._console.readline()) is not None:
                if self._questions:  # a turn asked about a tool call: this line answers
                    self._questions.pop(0).answer(line)
                    continue
                if not line.strip():
                    if not self._inflight:
                        await self._console.out(PROMPT)
                    continue
                mode = self.multitask if self._inflight else None
                previous = self._inflight[-1] if self._inflight else None
                running = _Running(Printer(self._console))
                self._inflight.append(running)
                turns.start_soon(self._typed_turn, line, running, mode, previous)
            while self._questions:  # the input ended: each one asked is denied
                self._questions.pop(0).answer(None)
        if self._failed is not None:
            return self._failed
        await self._console.out("\n")
        return 0

    async def _typed_turn(
        self, text: str, running: _Running, mode: Multitask | None, previous: _Running | None
    ) -> None:
        code = await self._turn(text, running, mode, previous)
        if code is not None:
            self._failed = code
            self._turns.cancel_scope.cancel()
        elif not self._inflight:
            await self._console.out(PROMPT)

    async def _session(self) -> Session | None:
        try:
            if self._session_id is None:
                created = await self._client.create_session(self._inputs)
                self._created = created.id
                return created
            session = await self._client.get_session(self._session_id)
        except TrioserveClientError as exc:
            hint = ""
            if isinstance(exc, BadRequestError) and "missing inputs" in exc.message:
                hint = "; give them with --input KEY=VALUE"
            await self._console.err(f"trioserve: {exc}{hint}\n")
            return None
        if session.terminal:
            await self._console.err(f"trioserve: session {session.id} is {session.status}\n")
            return None
        return session

    async def _turn(
        self,
        text: str,
        running: _Running,
        multitask: Multitask | None = None,
        previous: _Running | None = None,
    ) -> int | None:
        """Run one turn (last in ``_inflight``): it is sent once the server has answered
        ``previous`` (the turn sent before it: the server takes them in the order typed),
        and its reply prints once ``previous`` is done.  An exit status if the chat cannot
        go on."""
        try:
            if previous is not None:
                await previous.accepted.wait()
            return await self._run_turn(
                text, running, multitask, None if previous is None else previous.done
            )
        finally:
            self._inflight.remove(running)
            running.accepted.set()
            running.done.set()  # this turn, and every one sent before it

    async def _run_turn(
        self,
        text: str,
        running: _Running,
        multitask: Multitask | None,
        previous: trio.Event | None,
    ) -> int | None:
        assert self._session_id is not None
        printer = running.printer
        try:
            with running.scope:
                turn = self._client.turn(
                    self._session_id, text, transport=self._transport, multitask=multitask
                )
                async with turn as events:
                    running.started = True
                    running.accepted.set()
                    async for event in events:
                        if event.type == TURN_QUEUED:
                            await self._queued(running, event.data)
                            continue
                        if previous is not None:
                            await previous.wait()
                        await printer.show(event)
                        if event.type == APPROVAL_REQUESTED:  # the stream waits for us
                            await self._decide(printer, event.data)
            if running.scope.cancelled_caught:
                printer.cancelled = True
        except TrioserveClientError as exc:
            if running.started and previous is not None:
                await previous.wait()  # its error after the reply before it
            await self._end_lines(running)
            await self._console.err(f"trioserve: {exc}\n")
            if isinstance(exc, NotFoundError | DrainingError | ConnectError):
                return EXIT_FAILURE
        finally:
            if running.cancel_done is not None:
                await running.cancel_done.wait()
        if previous is not None:
            await previous.wait()
        await printer.finish()
        return None

    async def _decide(self, printer: Printer, data: dict[str, Any]) -> None:
        """Ask whether the waiting tool call may run (``y``/``n`` on the next line)."""
        assert self._session_id is not None
        await printer.end_line()
        arguments = json.dumps(data.get("arguments"), ensure_ascii=False)
        await self._console.err(f"approve {data.get('tool')} {arguments}? [y/N] ")
        if self._console.interactive:  # ``_typed`` reads the lines: it hands us the next
            question = _Question()
            self._questions.append(question)
            try:
                await question.answered.wait()
            finally:  # cancelled (Ctrl-C): the next line is a turn again
                if question in self._questions:
                    self._questions.remove(question)
            line = question.line
        else:
            line = await self._console.readline()
        approve = line is not None and line.strip().lower() in ("y", "yes")
        approval_id = str(data.get("approvalId"))
        try:
            if approve:
                await self._client.approve(self._session_id, approval_id)
            else:
                await self._client.deny(self._session_id, approval_id, message="denied in chat")
        except TrioserveClientError as exc:  # decided elsewhere meanwhile, say
            await self._console.err(f"trioserve: {exc}\n")

    async def _end_lines(self, running: _Running) -> None:
        """End the line of ``running``'s reply, and of the one printing if it is another."""
        head = self._running
        if head is not None and head is not running:
            await head.printer.end_line()
        await running.printer.end_line()

    async def _queued(self, running: _Running, data: dict[str, object]) -> None:
        """The server queued the turn: say where, without breaking the reply printing."""
        turn_id = data.get("turnId")
        running.queued_as = turn_id if isinstance(turn_id, str) else None
        await self._end_lines(running)
        await self._console.err(f"queued (position {data.get('position')})\n")
