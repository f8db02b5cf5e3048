"""Tests for rendezvous/'s ``_membership`` and ``_state`` that mutation testing showed missing
(issue 22).

Each pins a behaviour a small, realistic bug would break and no other test checked: see
docs/testing.md, "Mutation testing". Memory stores in virtual time.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import anyio
import pytest
from helpers.events import ListSink

from aioelastic.errors import (
    LeaseExpiredError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousStateError,
    StoreConnectionError,
)
from aioelastic.rendezvous import (
    DynamicRendezvousHandler,
    RendezvousEvent,
    RendezvousEventKind,
    read_standby_round,
)
from aioelastic.rendezvous._state import (
    SCHEMA_VERSION,
    ClosedRecord,
    DriverRecord,
    DueRecord,
    MemberRecord,
    NodeRecord,
    RosterChunk,
    RoundRecord,
    RunKeys,
    read_rank,
    read_roster,
    roster_members,
)
from aioelastic.store import (
    KeyValue,
    MemoryEngine,
    MemoryStore,
    Put,
    RangeResult,
    Txn,
    TxnResult,
    Watch,
    WatchEvent,
)
from aioelastic.testing import FaultInjectingStore, run_virtual, virtual_test

KEYS = RunKeys("job")


def _json(**obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _state_error(key: str, detail: str) -> str:
    return rf"^rendezvous state at {re.escape(repr(key))}{detail}"


# -- _state: reading a node's place ---------------------------------------------------------------


async def _seed_round(store: MemoryStore, record: RoundRecord, *members: str) -> None:
    await store.put(KEYS.round, record.encode())
    for rank, node in enumerate(members):
        await store.put(KEYS.member(record.round, node), MemberRecord(rank).encode())


@virtual_test
async def test_read_standby_round_only_for_a_full_round_without_the_node() -> None:
    store = MemoryStore()
    assert await read_standby_round(store, "job", "c", 2) is None  # no round yet
    await _seed_round(store, RoundRecord(3, 2, "h", 1, chunks=1), "a", "b")
    assert await read_standby_round(store, "job", "c", 2) == (3, 2)  # full, c not in it
    assert await read_standby_round(store, "job", "c", 1) == (3, 2)  # more than max: full too
    assert await read_standby_round(store, "job", "c", 3) is None  # room left: no standby
    assert await read_standby_round(store, "job", "a", 2) is None  # a member
    assert await read_standby_round(store, "job", "b", 2) is None
    assert await read_standby_round(store, "other", "c", 2) is None  # another run: no round
    await store.put(KEYS.round, b"{")
    with pytest.raises(RendezvousStateError, match=re.escape(repr(KEYS.round))):
        await read_standby_round(store, "job", "c", 2)
    await store.aclose()


@virtual_test
async def test_read_rank_from_the_member_record() -> None:
    store = MemoryStore()
    record = RoundRecord(1, 2, "h", 1, chunks=1)
    await _seed_round(store, record, "a", "b")
    assert await read_rank(store, KEYS, record, "a") == 0
    assert await read_rank(store, KEYS, record, "b") == 1
    assert await read_rank(store, KEYS, record, "c") is None
    key = KEYS.member(1, "z")
    await store.put(key, MemberRecord(2).encode())  # rank 2 of a world of 2
    with pytest.raises(RendezvousStateError, match=_state_error(key, ": rank 2 out of range$")):
        await read_rank(store, KEYS, record, "z")
    await store.put(key, MemberRecord(1).encode())  # the last rank is in range
    assert await read_rank(store, KEYS, record, "z") == 1
    # a static round: ranks are rank0 .. rank<w-1>, nothing read
    static = RoundRecord(1, 3, "h", 1, chunks=0)
    await store.aclose()
    assert await read_rank(store, KEYS, static, "rank2") == 2
    assert await read_rank(store, KEYS, static, "rank3") is None
    assert await read_roster(store, KEYS, static) == ("rank0", "rank1", "rank2")


# -- _membership: wait_for_change -----------------------------------------------------------------


def _handlers(
    engine: MemoryEngine, n: int, min_nodes: int, max_nodes: int, **kw: Any
) -> list[DynamicRendezvousHandler]:
    kw.setdefault("lease_ttl", 6.0)
    kw.setdefault("last_call_timeout", 1.0)
    return [
        DynamicRendezvousHandler(
            kw.pop("store") if i == 0 and "store" in kw else MemoryStore(engine),
            "job",
            min_nodes,
            max_nodes,
            node_id=f"n{i}",
            **kw,
        )
        for i in range(n)
    ]


async def _round(hs: list[DynamicRendezvousHandler]) -> None:
    results = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    assert sorted(r.rank for r in results) == list(range(len(hs)))


async def _close(hs: list[DynamicRendezvousHandler]) -> None:
    for h in hs:
        await h.aclose()


@virtual_test
async def test_wait_for_change_refusals_name_the_run() -> None:
    engine = MemoryEngine()
    hs = _handlers(engine, 2, 2, 2)
    with pytest.raises(
        RendezvousError,
        match=r"^wait_for_change\(\) needs a completed round: call next_rendezvous$",
    ):
        await hs[0].wait_for_change()
    await _round(hs)
    await hs[1].aclose()
    await hs[0].aclose()
    with pytest.raises(
        RendezvousClosedError, match=r"^the rendezvous handler for 'job' is closed$"
    ):
        await hs[0].wait_for_change()


@virtual_test
async def test_a_handler_closed_while_waiting_for_a_change_says_so() -> None:
    engine = MemoryEngine()
    hs = _handlers(engine, 2, 2, 2)
    await _round(hs)
    waiting = asyncio.ensure_future(hs[0].wait_for_change())
    await asyncio.sleep(1)
    await hs[0].aclose()  # ends the member watch the wait reads
    with pytest.raises(
        RendezvousClosedError, match=r"^the rendezvous handler for 'job' is closed$"
    ):
        await waiting
    await hs[1].aclose()


@virtual_test
async def test_a_rejoin_ends_a_pending_wait_for_change_naming_the_run() -> None:
    # next_rendezvous drops the member watch first thing: a wait still pending on it ends
    engine = MemoryEngine()
    hs = _handlers(engine, 2, 2, 2)
    await _round(hs)
    waiting = asyncio.ensure_future(hs[0].wait_for_change())
    await asyncio.sleep(1)
    rejoin = asyncio.ensure_future(hs[0].next_rendezvous())
    with pytest.raises(RendezvousConnectionError, match=r"^the watch of 'job' ended$"):
        await waiting
    await hs[1].next_rendezvous()
    assert (await rejoin).round == 1
    await _close(hs)


@virtual_test
async def test_a_close_seen_is_sticky_and_in_full() -> None:
    engine = MemoryEngine()
    sink = ListSink()
    hs = _handlers(engine, 2, 2, 2, event_sink=sink)
    await _round(hs)
    waiting = asyncio.ensure_future(hs[0].wait_for_change())
    await asyncio.sleep(1)
    await hs[1].set_closed()
    marker = await hs[1].store.get(KEYS.closed_marker(0))
    assert marker is not None
    assert await waiting == RendezvousEvent(RendezvousEventKind.CLOSED, 0, marker.mod_revision)
    closed = [e for e in sink.events if e.kind == "rendezvous.closed" and e.node == "n0"]
    assert [dict(e.fields) for e in closed] == [
        {"round": 0, "revision": marker.mod_revision, "by_this_node": False}
    ]
    statuses = [dict(e.fields) for e in sink.events if e.kind == "rendezvous.status"]
    assert {"status": "CLOSED", "previous": "ACTIVE", "round": 0, "error": None} in statuses
    await hs[0].store.aclose()  # from now on it is known, not read
    assert await hs[0].is_closed()
    assert await hs[0].wait_for_change() == RendezvousEvent(RendezvousEventKind.CLOSED, 0, 0)
    await _close(hs)


@virtual_test
async def test_a_handler_in_error_reports_it_at_once() -> None:
    # a store error of another call (here num_nodes_waiting) puts the handler in ERROR: a
    # wait_for_change then reports that error, with the lease alive
    engine = MemoryEngine()
    store = FaultInjectingStore(MemoryStore(engine))
    hs = _handlers(engine, 2, 2, 2, store=store)
    await _round(hs)
    store.fail_next("get", StoreConnectionError("injected"))
    with pytest.raises(RendezvousConnectionError, match=r"^num_nodes_waiting failed for run 'job'"):
        await hs[0].num_nodes_waiting()
    error = hs[0].error
    assert error is not None
    assert hs[0].lease is not None
    assert not hs[0].lease.lost
    assert await hs[0].wait_for_change() == RendezvousEvent(
        RendezvousEventKind.ERROR, 0, 0, error=error
    )
    await _close(hs)


@virtual_test
async def test_a_lease_lost_while_waiting_is_an_error_event_in_full() -> None:
    engine = MemoryEngine()
    sink = ListSink()
    hs = _handlers(engine, 2, 2, 2, event_sink=sink)
    await _round(hs)
    waiting = asyncio.ensure_future(hs[0].wait_for_change())
    await asyncio.sleep(1)
    keeper = hs[0].lease
    assert keeper is not None
    await hs[1].store.lease_revoke(keeper.id)
    event = await waiting
    assert isinstance(event.error, LeaseExpiredError)
    assert event == RendezvousEvent(RendezvousEventKind.ERROR, 0, 0, error=event.error)
    assert hs[0].error is event.error
    statuses = [e for e in sink.events if e.kind == "rendezvous.status" and e.node == "n0"]
    assert [e.fields["status"] for e in statuses] == ["ERROR"]
    await _close(hs)


@virtual_test
async def test_wait_for_change_names_itself_in_a_store_error() -> None:
    engine = MemoryEngine()
    hs = _handlers(engine, 2, 2, 2)
    await _round(hs)
    await hs[0].store.aclose()
    with pytest.raises(RendezvousConnectionError, match=r"^wait_for_change failed for run 'job'"):
        await hs[0].wait_for_change()
    await _close(hs)


# -- _membership: what a member watch reports -----------------------------------------------------


async def _next_change(h: DynamicRendezvousHandler, write: Any) -> RendezvousEvent:
    """The change ``h`` reports after ``write()`` (an awaitable's factory) ran."""
    waiting = asyncio.ensure_future(h.wait_for_change())
    await asyncio.sleep(1)
    assert not waiting.done()
    await write()
    async with asyncio.timeout(30):
        return await waiting


@virtual_test
async def test_member_changes_and_their_events_in_full() -> None:
    engine = MemoryEngine()
    sink = ListSink()
    hs = _handlers(engine, 3, 1, 4, event_sink=sink)
    await _round(hs)
    admin = MemoryStore(engine)
    # a driver's word of a next round: a newcomer registered
    due = DueRecord("late", 1, restart=False)
    event = await _next_change(hs[0], lambda: admin.put(KEYS.due(0), due.encode()))
    revision = (await admin.range(KEYS.root)).revision
    assert event == RendezvousEvent(
        RendezvousEventKind.NODES_WAITING, 0, revision, node_id="late", num_nodes_waiting=1
    )
    assert sink.of("rendezvous.nodes_waiting") == [
        {"round": 0, "revision": revision, "waiting_node": "late", "num_nodes_waiting": 1}
    ]
    # a member gone
    event = await _next_change(hs[0], lambda: admin.delete(KEYS.member(0, "n2")))
    revision = (await admin.range(KEYS.root)).revision
    assert event == RendezvousEvent(
        RendezvousEventKind.PARTICIPANT_LOST, 0, revision, node_id="n2", num_nodes_waiting=1
    )
    assert sink.of("rendezvous.member_lost") == [
        {"round": 0, "revision": revision, "member": "n2", "num_nodes_waiting": 1}
    ]
    # a second one: two gone of three, two to be replaced
    event = await _next_change(hs[0], lambda: admin.delete(KEYS.member(0, "n1")))
    assert (event.node_id, event.num_nodes_waiting) == ("n1", 2)
    # the next round is out
    record = RoundRecord(1, 1, "h", 1, chunks=1)
    event = await _next_change(hs[0], lambda: admin.put(KEYS.next_marker(0), record.encode()))
    revision = (await admin.range(KEYS.root)).revision
    assert event == RendezvousEvent(RendezvousEventKind.ROUND_SUPERSEDED, 0, revision)
    assert sink.of("rendezvous.round_superseded") == [{"round": 0, "revision": revision}]
    assert all(e.run_id == "job" and e.node == "n0" for e in sink.events if e.node == "n0")
    await admin.aclose()
    await _close(hs)


@virtual_test
async def test_a_member_watch_ignores_what_is_not_a_change() -> None:
    engine = MemoryEngine()
    hs = _handlers(engine, 3, 1, 3)
    await _round(hs)
    admin = MemoryStore(engine)

    async def noise() -> None:
        await admin.put(KEYS.member(0, "x"), b"?")  # a put under m/0/: not a loss
        await admin.put(KEYS.members_of(0) + "~other", b"?")
        await admin.delete(KEYS.members_of(0) + "~other")  # a marker's deletion: not a loss
        await admin.delete(KEYS.due(0))  # nor the driver's word going
        # the driver's word of none waiting, the round full and every member alive: nothing
        await admin.put(KEYS.due(0), DueRecord("late", 0, restart=False).encode())
        await admin.delete(KEYS.member(0, "n0"))  # its own record
        await admin.delete(KEYS.member(0, "n1"))  # a loss
        await admin.put(KEYS.member(0, "n1"), MemberRecord(1).encode())
        await admin.delete(KEYS.member(0, "n1"))  # the same member again: told once
        await admin.delete(KEYS.member(0, "n2"))

    event = await _next_change(hs[0], noise)
    assert (event.kind, event.node_id) == (RendezvousEventKind.PARTICIPANT_LOST, "n1")
    event = await hs[0].wait_for_change()
    assert (event.kind, event.node_id, event.num_nodes_waiting) == (
        RendezvousEventKind.PARTICIPANT_LOST,
        "n2",
        2,
    )
    await admin.aclose()
    await _close(hs)


@virtual_test
async def test_a_restart_of_a_full_round_is_one_node_waiting() -> None:
    engine = MemoryEngine()
    hs = _handlers(engine, 2, 2, 2)
    await _round(hs)
    admin = MemoryStore(engine)
    nobody = DueRecord("n1", 0, restart=False)  # full, no restart: not a change
    restart = DueRecord("n1", 0, restart=True)  # a member registered again: restart

    async def due() -> None:
        await admin.put(KEYS.due(0), nobody.encode())
        await admin.put(KEYS.due(0), restart.encode())

    event = await _next_change(hs[0], due)
    assert (event.kind, event.node_id, event.num_nodes_waiting) == (
        RendezvousEventKind.NODES_WAITING,
        "n1",
        1,
    )
    await admin.aclose()
    await _close(hs)


@pytest.mark.parametrize("marker", ["~closed", "~next", "~due"])
def test_a_corrupt_marker_is_a_state_error_naming_its_key(marker: str) -> None:
    async def body() -> None:
        engine = MemoryEngine()
        hs = _handlers(engine, 2, 2, 2)
        await _round(hs)
        key = KEYS.members_of(0) + marker
        write = lambda: hs[1].store.put(key, b"{")  # noqa: E731
        with pytest.raises(RendezvousStateError, match=re.escape(repr(key))):
            await _next_change(hs[0], write)
        await _close(hs)

    run_virtual(body())


# -- _state: decoding names what is wrong, and where -----------------------------------------------


@pytest.mark.parametrize(
    ("decode", "value", "detail"),
    [
        (NodeRecord.decode, b"[]", " is not a JSON object$"),
        (NodeRecord.decode, _json(v=1, kind="node", id="a/b", a="h", p=1),
         r": field 'id' must be a node id, got 'a/b'$"),
        (NodeRecord.decode, _json(v=1, kind="node", id=7, a="h", p=1),
         r": field 'id' must be a node id, got 7$"),
        (MemberRecord.decode, b"[]", " is not a JSON object$"),
        (MemberRecord.decode, _json(v=1, kind="member", k=-1),
         r": field 'k' must be an int >= 0, got -1$"),
        (DueRecord.decode, b"[]", " is not a JSON object$"),
        (ClosedRecord.decode, _json(v=1, kind="closed", r=-2, o=0),
         r": field 'r' must be an int >= -1, got -2$"),
        (ClosedRecord.decode, _json(v=1, kind="closed", r="0", o=0),
         r": field 'r' must be an int >= -1, got '0'$"),
        (DriverRecord.decode, _json(v=1, kind="driver", r=0, id=""),
         r": field 'id' must be a node id, got ''$"),
    ],
)  # fmt: skip
def test_a_bad_record_is_named_by_key(decode: Any, value: bytes, detail: str) -> None:
    key = "aioelastic/rdzv/job/x/0/a"
    with pytest.raises(RendezvousStateError, match=_state_error(key, detail)):
        decode(key, value)


def test_records_decode_their_edges() -> None:
    key = "aioelastic/rdzv/job/n/0/a"
    assert MemberRecord.decode(key, _json(v=1, kind="member", k=0)) == MemberRecord(0)
    # a close record without 'o' (an older writer's) is a plain close
    assert ClosedRecord.decode(key, _json(v=1, kind="closed", r=3)) == ClosedRecord(3, False)
    assert ClosedRecord.decode(key, _json(v=1, kind="closed", r=-1, o=1)) == ClosedRecord(-1, True)
    record = NodeRecord.decode(key, NodeRecord("a", "h", 65535).encode())
    assert (record.node_id, record.addr, record.port) == ("a", "h", 65535)
    assert DueRecord.decode(key, DueRecord("a", 0, True).encode()) == DueRecord("a", 0, True)


def _roster(first: int, *members: str) -> KeyValue:
    return KeyValue(KEYS.chunk(2, first), RosterChunk(first, members).encode(), 1, 1, 1)


def _kv(key: str, value: bytes) -> KeyValue:
    return KeyValue(key, value, 1, 1, 1)


def test_roster_members_skip_other_keys_and_name_a_bad_chunk() -> None:
    record = RoundRecord(2, 3, "h", 1, chunks=2)
    prefix = KEYS.roster_of(2)
    other = _kv(KEYS.roster_of(1) + "0", b"?")  # another round's chunk: skipped, not the end
    chunks = [other, _roster(0, "a", "b"), _kv(prefix + "1", RosterChunk(2, ("c",)).encode())]
    assert roster_members(KEYS, record, chunks) == ("a", "b", "c")
    for index in ("x", "2", "-1"):  # not a number, or past the record's chunks
        key = prefix + index
        with pytest.raises(RendezvousStateError, match=_state_error(key, ": not a roster chunk$")):
            roster_members(KEYS, record, [_kv(key, b"{}")])
    key = prefix + "1"
    with pytest.raises(RendezvousStateError, match=_state_error(key, " is not JSON")):
        roster_members(KEYS, record, [_kv(key, b"{")])
    taken = _kv(key, RosterChunk(1, ("c", "d")).encode())  # ranks 1-2, 1 taken by chunk 0
    with pytest.raises(
        RendezvousStateError,
        match=_state_error(key, ": ranks 1-2 are out of range or taken twice$"),
    ):
        roster_members(KEYS, record, [_roster(0, "a", "b"), taken])


@virtual_test
async def test_a_corrupt_member_record_is_named_by_key() -> None:
    store = MemoryStore()
    record = RoundRecord(1, 2, "h", 1, chunks=1)
    key = KEYS.member(1, "a")
    await store.put(key, b"[]")
    with pytest.raises(RendezvousStateError, match=_state_error(key, " is not a JSON object$")):
        await read_rank(store, KEYS, record, "a")
    await store.put(key, _json(v=1, kind="member", k="0"))
    with pytest.raises(RendezvousStateError, match=_state_error(key, r": field 'k' must be")):
        await read_rank(store, KEYS, record, "a")
    await store.aclose()


# -- _membership: the member watch's start, and the counts ----------------------------------------


class _MemberWatch(Watch):
    """A memory watch of ``m/`` whose start fails or hangs on request, and whose closing takes
    a round trip (as an http watch's unwatch does) and may fail."""

    def __init__(self, store: _ScriptedStore, inner: Watch) -> None:
        super().__init__(inner.prefix, inner.requested_revision)
        self._store = store
        self._inner = inner

    @property
    def start_revision(self) -> int:
        return self._inner.start_revision

    async def _start(self) -> None:
        if self._store.start_error is not None:
            raise self._store.start_error
        if self._store.hang_start:
            await asyncio.Event().wait()
        await self._inner.start()

    async def _next(self) -> WatchEvent:
        return await self._inner.__anext__()

    async def _aclose(self) -> None:
        await anyio.sleep(0.01)
        if self._store.close_error is not None:
            raise self._store.close_error
        await self._inner.aclose()
        self._store.closed_watches += 1


class _ScriptedStore(MemoryStore):
    start_error: BaseException | None = None
    hang_start = False
    close_error: BaseException | None = None
    closed_watches = 0

    def _watch(self, prefix: str, start_revision: int | None) -> Watch:
        inner = super()._watch(prefix, start_revision)
        return _MemberWatch(self, inner) if prefix.startswith(KEYS.members) else inner


@virtual_test
async def test_a_member_watch_that_fails_to_start_is_closed_and_its_error_kept() -> None:
    engine = MemoryEngine()
    store = _ScriptedStore(engine)
    hs = _handlers(engine, 2, 2, 2, store=store)
    await _round(hs)
    store.start_error = StoreConnectionError("the start failed")
    store.close_error = StoreConnectionError("the close failed too")
    with pytest.raises(
        RendezvousConnectionError,
        match=r"^wait_for_change failed for run 'job': the start failed$",
    ):
        await hs[0].wait_for_change()
    store.start_error = store.close_error = None
    await _close(hs)


@virtual_test
async def test_a_member_watch_start_cut_short_by_the_caller_is_closed_on_the_store() -> None:
    # closing takes a round trip on a remote store: cut short by the caller's cancellation,
    # it would leave the watch open on the server
    engine = MemoryEngine()
    store = _ScriptedStore(engine)
    hs = _handlers(engine, 2, 2, 2, store=store)
    await _round(hs)
    store.hang_start = True
    with anyio.move_on_after(1) as scope:
        await hs[0].wait_for_change()
    assert scope.cancelled_caught
    assert store.closed_watches == 1
    store.hang_start = False
    await _close(hs)


class _GhostBeforeTheRound(MemoryStore):
    """A driver's store: just before the write of round 0, the record of a node that is no
    member of it goes (under ``m/0/``, a revision before the round's)."""

    ghost = KEYS.member(0, "ghost")

    async def _txn(self, txn: Txn) -> TxnResult:
        if any(isinstance(op, Put) and op.key == KEYS.round for op in txn.success):
            self.engine.delete(self.ghost)
        return await super()._txn(txn)


@virtual_test
async def test_a_member_watches_from_the_revision_after_its_round() -> None:
    engine = MemoryEngine()
    store = _GhostBeforeTheRound(engine)
    await store.put(store.ghost, b"?")
    hs = _handlers(engine, 2, 2, 2, store=store)
    await _round(hs)
    assert await store.get(store.ghost) is None
    event = await _next_change(hs[1], hs[0].set_closed)
    assert event.kind is RendezvousEventKind.CLOSED  # not the ghost's deletion before it
    await _close(hs)


class _RangeSizes(MemoryStore):
    """Records how many key-values each range returned."""

    def __init__(self, engine: MemoryEngine) -> None:
        super().__init__(engine)
        self.sizes: list[int] = []

    async def range(self, prefix: str, *, limit: int | None = None) -> RangeResult:
        result = await super().range(prefix, limit=limit)
        self.sizes.append(len(result.kvs))
        return result


@virtual_test
async def test_num_nodes_waiting_counts_without_reading_the_records() -> None:
    engine = MemoryEngine()
    store = _RangeSizes(engine)
    (h,) = _handlers(engine, 1, 3, 3, store=store)
    node = NodeRecord("x", "h", 1).encode()
    for name in ("a", "b"):  # before any round: the registrations for round 0
        await store.put(KEYS.node(0, name), node)
    await store.put(KEYS.node(1, "c"), node)
    assert await h.num_nodes_waiting() == 2
    assert store.sizes == [1]  # a count: one key-value, not every registration
    # after a round: two of its three members alive, and two nodes for the next
    await store.put(KEYS.round, RoundRecord(0, 3, "h", 1, chunks=1).encode())
    await store.put(KEYS.node(1, "d"), node)
    store.sizes.clear()
    assert await h.num_nodes_waiting() == 2
    assert store.sizes == [1, 1]
    await store.put(KEYS.round, b"{")
    with pytest.raises(RendezvousStateError, match=re.escape(repr(KEYS.round))):
        await h.num_nodes_waiting()
    await h.aclose()


# -- session 12: `_load`'s, `NodeRecord.decode`'s and `parse_node_key`'s survivors ---------------

_NODE_KEY = KEYS.nodes + "3/node-a"


def _node_value(**fields: Any) -> bytes:
    obj: dict[str, Any] = {"v": SCHEMA_VERSION, "kind": "node", "id": "node-a", "a": "h", "p": 1}
    obj.update(fields)
    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    ("fields", "got"),
    [({"kind": "member"}, "kind 'member' schema 1"), ({"v": 99}, "kind 'node' schema 99")],
)
def test_a_record_of_another_kind_or_schema_is_refused_naming_both(
    fields: dict[str, Any], got: str
) -> None:
    # a record of the right schema but another kind is foreign too (not only a wrong schema
    # *and* kind), and the error says what was found, field by field
    expected = f"expected kind 'node' schema {SCHEMA_VERSION}, got {got}"
    with pytest.raises(RendezvousStateError, match=re.escape(expected) + "$"):
        NodeRecord.decode(_NODE_KEY, _node_value(**fields))


def test_a_value_that_is_not_json_is_quoted_to_its_first_60_bytes() -> None:
    value = b"{" + b"x" * 99
    with pytest.raises(RendezvousStateError) as caught:
        NodeRecord.decode(_NODE_KEY, value)
    assert str(caught.value).endswith(f"is not JSON: {value[:60]!r}")


def test_a_node_record_takes_ports_0_to_65535_and_names_its_key_otherwise() -> None:
    assert NodeRecord.decode(_NODE_KEY, _node_value(p=0)).port == 0
    assert NodeRecord.decode(_NODE_KEY, _node_value(p=65535)).port == 65535
    for bad in (65536, -1):
        with pytest.raises(RendezvousStateError, match=re.escape(f"state at {_NODE_KEY!r}: ")):
            NodeRecord.decode(_NODE_KEY, _node_value(p=bad))


@pytest.mark.parametrize("tail", ["3/", "x/node-a", "3", "/node-a"])
def test_a_key_under_nodes_that_is_not_round_slash_node_is_not_a_node_key(tail: str) -> None:
    assert KEYS.parse_node_key(KEYS.nodes + tail) is None
    assert KEYS.parse_node_key(KEYS.nodes + "3/node-a") == (3, "node-a")
