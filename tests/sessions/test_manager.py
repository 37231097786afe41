"""The session manager on its own (no HTTP): ids, interpolation, sweep, caps."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import trio
import trio.testing

from tests.helpers import FAKE_ADAPTER, ScriptedLauncher, compiled_spec, typed_spec
from trioserve.errors import Draining, InvalidRequest, NotFound, SessionCapReached, SpecError
from trioserve.protocol import SessionStatus, TurnStatus
from trioserve.sessions._ids import new_session_id
from trioserve.sessions._inputs import interpolate, missing_inputs
from trioserve.sessions._limits import Limits
from trioserve.sessions._manager import SessionManager
from trioserve.sessions._specs import SessionSpecs
from trioserve.sessions._sweep import sweep_interval
from trioserve.sessions._turns import Turn, released
from trioserve.stores import MemoryStore, Session, utcnow


def test_session_ids_look_like_the_reference() -> None:
    ids = {new_session_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"s_[0-9a-z]{8,9}[0-9a-f]{8}", i) for i in ids)


def test_interpolate_replaces_every_reference() -> None:
    task = "Hi ${inputs.name}! ${inputs.name} lives in ${inputs.city-name}. ${other}"
    done = interpolate(task, {"name": "Ada", "city-name": "Paris", "unused": "x"})
    assert done == "Hi Ada! Ada lives in Paris. ${other}"


def test_interpolate_leaves_placeholders_without_a_value_as_written() -> None:
    task = "${inputs.b} ${inputs.a} ${inputs.b} ${inputs.c} ${inputs.first name} ${inputs.}"
    done = interpolate(task, {"c": "3", "first name": "Ada", "v": "${inputs.b}"})
    assert done == "${inputs.b} ${inputs.a} ${inputs.b} 3 Ada ${inputs.}"
    # A value is not scanned for placeholders again.
    assert interpolate("${inputs.v}", {"v": "${inputs.v}"}) == "${inputs.v}"


def test_missing_inputs_lists_every_missing_key_once_sorted() -> None:
    task = "${inputs.b} ${inputs.a} ${inputs.b} ${inputs.c} ${inputs.x{y}"
    assert missing_inputs(task, {"c": "3"}) == ["a", "b"]
    assert missing_inputs(task, {"a": "", "b": "", "c": ""}) == []
    assert missing_inputs("no placeholders", {}) == []


@pytest.mark.parametrize(
    ("ttl", "interval"), [(2.0, 1.0), (20.0, 5.0), (168 * 3600.0, 3600.0), (8000.0, 2000.0)]
)
def test_sweep_interval_is_a_quarter_of_the_ttl_clamped(ttl: float, interval: float) -> None:
    assert sweep_interval(ttl) == interval


async def _store_with_active_sessions(count: int) -> MemoryStore:
    """A store holding ``s_old0`` .. active sessions, as an earlier process left it."""
    store = MemoryStore()
    now = utcnow()
    for i in range(count):
        await store.create(
            Session(f"s_old{i}", "a", "exec", SessionStatus.ACTIVE, now, now, compiled_spec())
        )
    return store


async def test_sessions_already_active_in_the_store_count_against_the_cap() -> None:
    store = await _store_with_active_sessions(3)
    limits = Limits(max_sessions=2, session_ttl=0, warm_adapters=0)
    async with SessionManager.open(
        store, typed_spec(), FAKE_ADAPTER, limits, launcher=ScriptedLauncher()
    ) as manager:
        assert manager.active_sessions == 3
        with pytest.raises(SessionCapReached):
            await manager.create_session()
        # Whichever ends first, the cap holds until fewer than 2 are active.
        for old in ("s_old2", "s_old0"):
            await manager.end_session(old)
            assert manager.active_sessions == (2 if old == "s_old2" else 1)
            if old == "s_old2":
                with pytest.raises(SessionCapReached):
                    await manager.create_session()
        created = await manager.create_session()
        assert created.status is SessionStatus.ACTIVE
        with pytest.raises(SessionCapReached):
            await manager.create_session()


@pytest.mark.parametrize("first", ["s_old0", "s_old1", "s_old2"])
async def test_over_cap_at_start_then_any_session_ends(first: str) -> None:
    store = await _store_with_active_sessions(3)
    limits = Limits(max_sessions=2, session_ttl=0, warm_adapters=0)
    async with SessionManager.open(
        store, typed_spec(), FAKE_ADAPTER, limits, launcher=ScriptedLauncher()
    ) as manager:
        await manager.end_session(first)
        assert manager.active_sessions == 2
        with pytest.raises(SessionCapReached):
            await manager.create_session()


async def test_end_is_idempotent_and_keeps_expired_sessions_expired() -> None:
    store = MemoryStore()
    limits = Limits(session_ttl=60, warm_adapters=0)
    async with SessionManager.open(
        store, typed_spec(), FAKE_ADAPTER, limits, launcher=ScriptedLauncher()
    ) as manager:
        session = await manager.create_session()
        await store.update(session.id, last_active_at=utcnow() - timedelta(seconds=120))
        assert (await manager.sweep()).expired == [session.id]
        await manager.end_session(session.id)  # no error, no change
        assert (await store.get(session.id)).status is SessionStatus.EXPIRED
        with pytest.raises(NotFound):
            await manager.start_turn(session.id, "x")
        with pytest.raises(NotFound):
            await manager.end_session("s_unknown")


async def test_draining_refuses_new_work() -> None:
    store = MemoryStore()
    async with SessionManager.open(
        store, typed_spec(), FAKE_ADAPTER, Limits(warm_adapters=0), launcher=ScriptedLauncher()
    ) as manager:
        session = await manager.create_session()
        manager.start_draining()
        with pytest.raises(Draining):
            await manager.create_session()
        with pytest.raises(Draining):
            await manager.start_turn(session.id, "x")
        with trio.fail_after(1):
            await manager.wait_idle()


async def test_require_inputs_refuses_before_taking_a_session_slot() -> None:
    store = MemoryStore()
    spec = typed_spec(task="Hi ${inputs.name} in ${inputs.city}")
    limits = Limits(max_sessions=1, session_ttl=0, warm_adapters=0, require_inputs=True)
    async with SessionManager.open(
        store, spec, FAKE_ADAPTER, limits, launcher=ScriptedLauncher()
    ) as manager:
        with pytest.raises(InvalidRequest, match=r"referenced by the spec's task: city$"):
            await manager.create_session({"name": "Ada"})
        assert manager.active_sessions == 0 and await store.list() == []
        session = await manager.create_session({"name": "Ada", "city": "Paris"})
        assert session.spec["task"] == "Hi Ada in Paris"


def test_session_specs_keep_what_create_built_and_validate_the_rest_once() -> None:
    served = typed_spec()
    now = utcnow()
    stored = Session("s_a", "a", "exec", SessionStatus.ACTIVE, now, now, compiled_spec("Stored."))
    specs = SessionSpecs(size=2)
    specs.add("s_b", served)
    assert specs.of(replace(stored, id="s_b")) is served  # not read from the stored JSON
    first = specs.of(stored)  # validated from its JSON, then kept
    assert first.task == "Stored." and first.to_json_dict() == stored.spec
    assert specs.of(stored) is first
    specs.add("s_c", served)  # over the size: the oldest (s_b) is dropped
    assert specs.of(replace(stored, id="s_b")).task == "Stored."
    with pytest.raises(SpecError, match="runtime: field required"):
        specs.of(replace(stored, id="s_bad", spec={"v": 1, "task": "t"}))


class HeldCreates(MemoryStore):
    """A memory store whose ``create`` waits for ``release`` (one interleaving, forced)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = trio.Event()
        self.release = trio.Event()

    async def _create(self, *args: Any, **kwargs: Any) -> None:
        self.entered.set()
        await self.release.wait()
        await super()._create(*args, **kwargs)


async def test_twin_creates_at_the_cap_wait_for_each_other_and_make_one_session() -> None:
    """The first twin holds the last session slot while its create is stored; the second
    must not be refused for it (and bind that refusal, refusing the first too)."""
    store = HeldCreates()
    limits = Limits(max_sessions=1, session_ttl=0, warm_adapters=0)
    answers: list[tuple[Session, bool]] = []
    async with SessionManager.open(
        store, typed_spec(), FAKE_ADAPTER, limits, launcher=ScriptedLauncher()
    ) as manager:

        async def twin() -> None:
            answers.append(await manager.keyed.create_session("twin", {"a": "1"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(twin)
            await store.entered.wait()
            nursery.start_soon(twin)
            await trio.testing.wait_all_tasks_blocked()
            store.release.set()
    (first, replayed_first), (second, replayed_second) = answers
    assert first == second and (replayed_first, replayed_second) == (False, True)


class _CountingWaitingReads(MemoryStore):
    """A memory store that counts the reads of a session's waiting turn."""

    waiting_reads = 0

    async def list_turns(self, session_id: str, **kwargs: Any) -> Any:
        if kwargs.get("status") == TurnStatus.WAITING:
            self.waiting_reads += 1
        return await super().list_turns(session_id, **kwargs)


async def test_a_turn_start_reads_no_waiting_turn_from_a_store_only_it_writes() -> None:
    """Nothing but this process parks turns in its own store: a turn start asks the store
    for the session's waiting turn only when this process parked one (a thread's round
    trip a turn on SQLite; PostgreSQL is shared by design and still asks)."""
    store = _CountingWaitingReads()
    async with SessionManager.open(
        store, typed_spec(), FAKE_ADAPTER, Limits(warm_adapters=0), launcher=ScriptedLauncher()
    ) as manager:
        session = await manager.create_session()
        for _ in range(3):
            turn = await manager.start_turn(session.id, "x")
            assert isinstance(turn, Turn)
            with trio.fail_after(5):
                await released(turn)
        assert store.waiting_reads == 0
        manager._parked.add(session.id)  # as ``park`` leaves it
        turn = await manager.start_turn(session.id, "x")
        assert isinstance(turn, Turn)
        with trio.fail_after(5):
            await released(turn)
        assert store.waiting_reads == 1
