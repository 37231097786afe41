"""``read_pipe``: an adapter's pipe read with fewer trips to the scheduler, nothing lost."""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing

from trioserve.runtime._process import read_pipe


async def test_it_reads_what_is_there_waits_for_more_and_ends_at_eof() -> None:
    r, w = os.pipe()
    stream = trio.lowlevel.FdStream(r)
    try:
        os.write(w, b"one")
        assert await read_pipe(stream, 100) == b"one"

        async def write_later() -> None:
            await trio.testing.wait_all_tasks_blocked()
            os.write(w, b"two")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_later)
            assert await read_pipe(stream, 100) == b"two"
        os.close(w)
        assert await read_pipe(stream, 100) == b""
    finally:
        stream.close()
    with pytest.raises(trio.ClosedResourceError):
        await read_pipe(stream, 100)


async def test_bytes_found_at_once_come_after_a_yield_and_a_cancelled_read_takes_none() -> None:
    r, w = os.pipe()
    stream = trio.lowlevel.FdStream(r)
    try:
        os.write(w, b"flood")
        # An adapter writing faster than it is read does not hold the event loop.
        with trio.testing.assert_checkpoints():
            assert await read_pipe(stream, 100) == b"flood"
        os.write(w, b"kept")
        with trio.CancelScope() as scope:
            scope.cancel()
            await read_pipe(stream, 100)
        assert scope.cancelled_caught
        assert await read_pipe(stream, 100) == b"kept"
    finally:
        os.close(w)
        stream.close()


async def test_read_ready_answers_at_once_and_takes_nothing_when_there_is_nothing() -> None:
    from trioserve.fdio import read_ready

    r, w = os.pipe()
    stream = trio.lowlevel.FdStream(r)
    try:
        assert await read_ready(stream, 100) is None  # empty: no wait, nothing taken
        os.write(w, b"one")
        assert await read_ready(stream, 100) == b"one"
        assert await read_ready(stream, 100) is None
        os.close(w)
        assert await read_ready(stream, 100) == b""  # the end is an answer too
    finally:
        stream.close()
    with pytest.raises(trio.ClosedResourceError):
        await read_ready(stream, 100)
