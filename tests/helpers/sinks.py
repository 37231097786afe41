"""Event sinks for tests that run an adapter without a server."""

from __future__ import annotations

from collections.abc import Sequence

import trio

from trioserve.runtime._handle import ProcessHandle
from trioserve.runtime._process import ChannelSink
from trioserve.runtime._wire import Event


class InterruptOn(ChannelSink):
    """A sink that asks the policy to stop the adapter once it has printed an event of a type:
    the adapter has then run every step before that line (its signal handlers are set)."""

    def __init__(
        self, channel: trio.MemorySendChannel[Event], policy: ProcessHandle, event_type: str
    ) -> None:
        super().__init__(channel)
        self._policy, self._event_type = policy, event_type

    async def send_many(self, events: Sequence[Event]) -> bool:
        listening = await super().send_many(events)
        if any(event.type == self._event_type for event in events):
            self._policy.interrupt()
        return listening
