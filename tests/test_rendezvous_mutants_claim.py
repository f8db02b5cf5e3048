"""Tests for the dynamic join's claim, tasks and control view that mutation testing showed
missing (issue 22), and for the last of ``static``'s and ``_status``'s survivors.

Each pins a behaviour a small, realistic bug would break and no other test checked: see
docs/testing.md, "Mutation testing". Memory stores and virtual time only; ``JoinTasks`` is
driven with a watch fed by hand (:class:`_FedWatch`), so that each of its edges is reached on
purpose, not by the timing of a join.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import inspect
from typing import Any

import anyio
import pytest

from aioelastic.errors import (
    CompactedError,
    LeaseExpiredError,
    LeaseNotFoundError,
    RendezvousNotFoundError,
    RendezvousStateError,
    RendezvousTimeoutError,
    StoreClosedError,
    StoreConnectionError,
)
from aioelastic.rendezvous import (
    DynamicRendezvousHandler,
    RendezvousEventKind,
    RendezvousResult,
    RendezvousStatus,
    RendezvousStoreInfo,
    StaticRendezvousHandler,
)
from aioelastic.rendezvous._claim import Claimed, claim_driver, claim_ops, claimed, own_claim
from aioelastic.rendezvous._control import ControlView, write_closed
from aioelastic.rendezvous._driver import SNAPSHOT_LIMIT
from aioelastic.rendezvous._state import (
    ClosedRecord,
    DriverRecord,
    DueRecord,
    NodeRecord,
    RoundRecord,
    RunKeys,
)
from aioelastic.rendezvous._status import read_run_status, watch_run_status
from aioelastic.rendezvous._tasks import JoinTasks, resolve
from aioelastic.store import (
    Compare,
    EventType,
    KeyValue,
    MemoryEngine,
    MemoryStore,
    Put,
    Range,
    RangeResult,
    Watch,
    WatchEvent,
)
from aioelastic.testing import FaultInjectingStore, run_virtual, virtual_test


class _FedWatch(Watch):
    """A watch whose events (or errors) the test hands it one by one."""

    def __init__(self) -> None:
        super().__init__("k/", None)
        self._queue: asyncio.Queue[WatchEvent | BaseException] = asyncio.Queue()
        self.revision = 0

    @property
    def start_revision(self) -> int:
        return 1

    async def _start(self) -> None:
        pass

    async def _next(self) -> WatchEvent:
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    async def _aclose(self) -> None:
        pass

    def feed(self, key: str = "k/a") -> WatchEvent:
        self.revision += 1
        event = WatchEvent(EventType.PUT, KeyValue(key, b"v", self.revision, self.revision, 1))
        self._queue.put_nowait(event)
        return event

    def fail(self, error: BaseException) -> None:
        self._queue.put_nowait(error)


def _now() -> float:
    return asyncio.get_running_loop().time()


async def _turns(n: int = 5) -> None:
    """Let the loop run ``n`` iterations (the reader task takes one to read a fed event)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def _within(awaitable: Any, seconds: float = 1.0) -> Any:
    """``awaitable``, failing (TimeoutError) if it takes more than ``seconds`` of virtual time:
    a wait that is never woken hangs until then."""
    return await asyncio.wait_for(awaitable, seconds)


# -- _tasks: JoinTasks and resolve -------------------------------------------------------------


@virtual_test
async def test_resolve_sets_a_pending_future_and_leaves_a_done_one() -> None:
    loop = asyncio.get_running_loop()
    pending, done = loop.create_future(), loop.create_future()
    done.set_result(None)
    resolve(pending)
    resolve(done)  # no InvalidStateError
    assert pending.done()
    assert pending.result() is None


@virtual_test
async def test_join_tasks_hand_over_each_event_once() -> None:
    """``event()`` is None while nothing is read (or the read is pending), the event once it
    is, and None again after: the next read starts only when asked, one at a time."""
    watch = _FedWatch()
    tasks = JoinTasks(watch, asyncio.get_running_loop())  # it starts reading at once
    await _turns()
    assert not tasks.event_ready()
    assert tasks.event() is None  # a read pending, nothing read
    fed = watch.feed()
    await _within(tasks.wait())  # woken by the read
    assert tasks.event_ready()
    assert tasks.event() == fed
    assert not tasks.event_ready()
    assert tasks.event() is None  # no read pending now: nothing to take
    second = watch.feed("k/b")
    await _turns()
    assert not tasks.event_ready()  # not read until asked
    tasks.read()
    tasks.read()  # (a second call while one is pending starts no other read)
    await _turns()
    assert tasks.event() == second
    third = watch.feed("k/c")
    await _within(tasks.wait())  # wait() starts the next read itself
    assert tasks.event() == third
    assert await tasks.aclose(let_driver_finish=None) is None


@virtual_test
async def test_join_tasks_wait_returns_at_once_for_what_is_done() -> None:
    """``wait()`` returns without parking when an event is read already, when the driver has
    ended, or when one of the futures it is given is done; parked, ``wake()`` ends it."""
    loop = asyncio.get_running_loop()
    watch = _FedWatch()
    tasks = JoinTasks(watch, asyncio.get_running_loop())
    watch.feed()
    await _turns()
    await _within(tasks.wait(), 0.01)  # an event read: no wait
    tasks.event()

    async def ends() -> None:
        pass

    tasks.drive(ends(), "ends")
    await _turns()
    assert tasks.driver is not None
    assert tasks.driver.done()
    await _within(tasks.wait(), 0.01)  # the driver ended
    tasks.driver_failed()  # (it did not fail: nothing raised, and it is forgotten)
    assert tasks.driver is None

    other = loop.create_future()
    other.set_result(None)
    await _within(tasks.wait(loop.create_future(), other), 0.01)  # one of the others is done

    parked = asyncio.ensure_future(tasks.wait(loop.create_future()))
    await _turns()
    assert not parked.done()
    tasks.wake()
    await _turns()
    assert parked.done()
    tasks.wake()  # nobody parked: nothing to wake, no error
    watch.feed()
    await _within(tasks.wait())
    assert tasks.event() is not None
    assert await tasks.aclose(let_driver_finish=None) is None


@virtual_test
async def test_join_tasks_driver_is_named_and_its_failure_raised_once() -> None:
    tasks = JoinTasks(_FedWatch(), asyncio.get_running_loop())

    async def fails() -> None:
        await asyncio.sleep(1)
        raise RuntimeError("driver broke")

    tasks.drive(fails(), "aioelastic-rdzv-driver-7")
    driver = tasks.driver
    assert driver is not None
    assert driver.get_name() == "aioelastic-rdzv-driver-7"
    tasks.driver_failed()  # still running: nothing to raise
    assert tasks.driver is driver
    await _within(tasks.wait(), 2)  # the driver's end wakes the join
    assert _now() == 1
    with pytest.raises(RuntimeError, match="driver broke"):
        tasks.driver_failed()
    assert tasks.driver is None
    tasks.driver_failed()  # raised once
    assert await tasks.aclose(let_driver_finish=None) is None


@virtual_test
async def test_join_tasks_read_from_the_watch_they_are_retargeted_to() -> None:
    """A control watch that fell behind a compaction is replaced (the view read afresh): the
    reads go on from the new watch, the next one started at once."""
    old, new = _FedWatch(), _FedWatch()
    tasks = JoinTasks(old, asyncio.get_running_loop())
    old.fail(CompactedError(1, 5))
    await _turns()
    with pytest.raises(CompactedError):
        tasks.event()
    tasks.retarget(new)
    fed = new.feed()
    await _turns()
    assert tasks.event_ready()  # read without being asked
    assert tasks.event() == fed
    again = new.feed("k/b")
    await _within(tasks.wait())
    assert tasks.event() == again
    assert await tasks.aclose(let_driver_finish=None) is None


@virtual_test
async def test_join_tasks_close_returns_the_event_read_but_not_applied() -> None:
    watch = _FedWatch()
    tasks = JoinTasks(watch, asyncio.get_running_loop())
    fed = watch.feed()
    await _turns()
    assert tasks.event_ready()
    assert await tasks.aclose(let_driver_finish=None) == fed
    assert tasks.driver is None
    assert tasks.event() is None


@virtual_test
async def test_join_tasks_close_returns_a_failed_reads_error_not_raises_it() -> None:
    watch = _FedWatch()
    tasks = JoinTasks(watch, asyncio.get_running_loop())
    error = StoreClosedError("store went away")
    watch.fail(error)
    await _turns()
    assert await tasks.aclose(let_driver_finish=None) is error


@virtual_test
async def test_join_tasks_close_cancels_a_pending_read_and_a_driver_at_once() -> None:
    """Without ``let_driver_finish``, a running driver is cancelled (not waited for), as is
    the pending read; both are ended by the time ``aclose`` returns."""
    tasks = JoinTasks(_FedWatch(), asyncio.get_running_loop())
    await _turns()
    reading = tasks._next
    assert reading is not None

    async def counts() -> None:
        await asyncio.sleep(100)

    tasks.drive(counts(), "counts")
    driver = tasks.driver
    await _turns()
    assert await _within(tasks.aclose(let_driver_finish=None), 0.01) is None
    assert _now() == 0
    assert driver is not None
    assert driver.cancelled()
    assert reading.cancelled()
    assert tasks.driver is None


@virtual_test
async def test_join_tasks_close_lets_a_finishing_driver_finish_within_its_bound() -> None:
    """``let_driver_finish``: a driver writing its round gets that long to end (it is not
    cancelled if it does); one that takes longer is cancelled at the bound."""
    tasks = JoinTasks(_FedWatch(), asyncio.get_running_loop())
    wrote: list[float] = []

    async def writes() -> None:
        await asyncio.sleep(1)
        wrote.append(_now())

    tasks.drive(writes(), "writes")
    driver = tasks.driver
    await tasks.aclose(let_driver_finish=5.0)
    assert wrote == [1.0]
    assert _now() == 1.0  # not the whole bound
    assert driver is not None
    assert not driver.cancelled()

    slow = JoinTasks(_FedWatch(), asyncio.get_running_loop())

    async def hangs() -> None:
        await asyncio.sleep(100)

    slow.drive(hangs(), "hangs")
    hung = slow.driver
    await slow.aclose(let_driver_finish=2.0)
    assert _now() == 3.0  # the bound, then cancelled
    assert hung is not None
    assert hung.cancelled()


@virtual_test
async def test_join_tasks_close_is_shielded_from_its_callers_cancel_scope() -> None:
    """A join whose caller's cancel scope (``anyio.fail_after`` around it, a task group
    cancelled) ends while it lets its driver finish, or while the tasks it cancelled end, still
    lets the driver finish (within its bound) and waits for their ends: no task is left running
    behind the join. (anyio re-delivers a scope's cancellation at each await; its shield does
    not hold against a bare ``Task.cancel()``, which asyncio delivers once.)"""
    tasks = JoinTasks(_FedWatch(), asyncio.get_running_loop())
    steps: list[str] = []

    async def writes() -> None:
        await asyncio.sleep(1)
        steps.append("wrote")

    tasks.drive(writes(), "writes")
    with anyio.move_on_after(0.5):
        await tasks.aclose(let_driver_finish=5.0)
    assert steps == ["wrote"]  # the driver finished its write
    assert _now() == 1.0

    second = JoinTasks(_FedWatch(), asyncio.get_running_loop())

    async def cleans_up() -> None:
        try:
            await asyncio.sleep(100)
        finally:
            await asyncio.sleep(1)  # e.g. its watch's close, a round trip
            steps.append("cleaned")

    second.drive(cleans_up(), "cleans up")
    await _turns()
    with anyio.move_on_after(0.5):
        await second.aclose(let_driver_finish=None)
    assert steps == ["wrote", "cleaned"]  # the close waited for the driver's end
    assert _now() == 2.0
    assert second.driver is None


@virtual_test
async def test_join_tasks_close_closes_a_driver_that_never_started() -> None:
    """A driver cancelled before its first step never ran its coroutine: ``aclose`` closes it
    (no "never awaited" warning, nothing left half made)."""
    tasks = JoinTasks(_FedWatch(), asyncio.get_running_loop())

    async def never() -> None:
        await asyncio.sleep(1)

    coro = never()
    tasks.drive(coro, "never")
    await tasks.aclose(let_driver_finish=None)
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED


async def _taken_watch(store: MemoryStore, prefix: str = "k/") -> Watch:
    """A started memory watch of ``prefix``: one whose events a join takes (no reader task)."""
    watch = store.watch(prefix)
    await watch.start()
    return watch


@virtual_test
async def test_join_tasks_on_a_watch_that_wakes_them_start_no_reader_task() -> None:
    """A watch that wakes its reader itself is read without a task, also after a retarget: a
    join parked on it is woken by the write, and no task is made, stepped and woken per event
    (the cost the waker is for)."""
    store = MemoryStore(MemoryEngine())
    old, new = await _taken_watch(store), await _taken_watch(store)
    before = len(asyncio.all_tasks())
    tasks = JoinTasks(old, asyncio.get_running_loop())
    assert len(asyncio.all_tasks()) == before
    tasks.retarget(new)
    assert len(asyncio.all_tasks()) == before
    waiting = asyncio.ensure_future(tasks.wait())
    await _turns()
    assert not waiting.done()
    await store.put("k/a", b"v")
    await _within(waiting)  # woken by the new watch, not the old one
    assert len(asyncio.all_tasks()) == before
    event = tasks.event()
    assert event is not None
    assert event.kv.key == "k/a"
    assert await tasks.aclose(let_driver_finish=None) is None
    await old.aclose()
    await new.aclose()
    await store.aclose()


@virtual_test
async def test_join_tasks_close_hands_back_the_next_event_a_taken_watch_holds() -> None:
    """At a join's end the next event ready in a watch whose events are taken is returned (for
    the kept view to apply), not dropped; the rest stay in the watch for the next join, and the
    closed tasks take no more of them."""
    store = MemoryStore(MemoryEngine())
    watch = await _taken_watch(store)
    tasks = JoinTasks(watch, asyncio.get_running_loop())
    await store.put("k/a", b"1")
    await store.put("k/b", b"2")
    unread = await tasks.aclose(let_driver_finish=None)
    assert isinstance(unread, WatchEvent)
    assert unread.kv.key == "k/a"
    assert not tasks.event_ready()
    assert tasks.event() is None  # closed: it no longer takes the watch's events
    following = JoinTasks(watch, asyncio.get_running_loop())
    event = following.event()
    assert event is not None
    assert event.kv.key == "k/b"
    assert await following.aclose(let_driver_finish=None) is None
    await watch.aclose()
    await store.aclose()


@virtual_test
async def test_join_tasks_close_hands_back_a_taken_watchs_end_not_raises_it() -> None:
    """The watch's end ready at a join's end (the store closed under it) is returned, so the
    kept view is marked unusable, not raised from the close nor dropped."""
    store = MemoryStore(MemoryEngine())
    watch = await _taken_watch(store)
    tasks = JoinTasks(watch, asyncio.get_running_loop())
    await store.aclose()
    unread = await tasks.aclose(let_driver_finish=None)
    assert isinstance(unread, StoreClosedError)
    await watch.aclose()


# -- _claim: what claims c/driver, and what goes with it -----------------------------------------

KEYS = RunKeys("job")


class _Claiming:
    """A handler of run ``job`` on ``engine`` with a granted lease, and a view of ``c/`` read
    afresh by :meth:`view` (as a join reads it)."""

    def __init__(self, engine: MemoryEngine, node_id: str = "me") -> None:
        self.store = MemoryStore(engine)
        self.h = DynamicRendezvousHandler(
            self.store, "job", 1, 4, node_id=node_id, lease_ttl=6.0, join_timeout=100.0
        )
        self.keeper = self.store.lease(6.0)

    async def view(self) -> ControlView:
        return await ControlView.open(self.store, KEYS)

    async def aclose(self) -> None:
        await self.keeper.aclose()
        await self.h.aclose()


async def _claiming(engine: MemoryEngine, node_id: str = "me") -> _Claiming:
    c = _Claiming(engine, node_id)
    await c.keeper.start()
    return c


def _round(round_: int, world_size: int, chunks: int = 1) -> bytes:
    return RoundRecord(round_, world_size, "10.0.0.1", 29500, chunks).encode()


@virtual_test
async def test_a_claim_when_nobody_drives_is_bound_to_the_lease_and_reads_the_nodes() -> None:
    engine = MemoryEngine()
    c = await _claiming(engine)
    view = await c.view()
    claim = claim_ops(c.h, view, 0, c.keeper)
    assert claim is not None
    assert claim.compare == (Compare.mod_revision(KEYS.driver) == 0)  # absent, as the view saw
    assert claim.puts == (Put(KEYS.driver, DriverRecord(0, "me").encode(), c.keeper.id),)
    assert claim.reads == (Range(KEYS.nodes, limit=SNAPSHOT_LIMIT),)  # no round: no roster
    await view.aclose()
    await c.aclose()


@virtual_test
async def test_a_claim_is_not_made_over_a_claim_for_its_round_only_over_an_older_one() -> None:
    engine = MemoryEngine()
    c = await _claiming(engine)
    store = c.store
    await store.put(KEYS.driver, DriverRecord(3, "other").encode())
    await store.put(KEYS.round, _round(2, 2))
    view = await c.view()
    assert claim_ops(c.h, view, 3, c.keeper) is None  # somebody drives round 3
    assert claim_ops(c.h, view, 2, c.keeper) is None  # (and a newer round than 2)
    older = await store.put(KEYS.driver, DriverRecord(2, "other").encode())
    view = await c.view()
    claim = claim_ops(c.h, view, 3, c.keeper)
    assert claim is not None  # a claim of round 2 is left over: replaced, as of its revision
    assert claim.compare == (Compare.mod_revision(KEYS.driver) == older)
    await view.aclose()
    await c.aclose()


@virtual_test
async def test_a_member_of_the_last_round_tells_its_members_with_the_claim() -> None:
    """A member of the last round (of two) that claims the next one writes the word that it
    restarts it (``m/<round>/~due``: itself, one registration, a restart) with the claim; a
    round of one has nobody to tell, and a node that was not a member tells nobody."""
    engine = MemoryEngine()
    c = await _claiming(engine)
    await c.store.put(KEYS.round, _round(4, 2))
    view = await c.view()
    c.h._round = 4  # (this node was returned round 4)
    claim = claim_ops(c.h, view, 5, c.keeper)
    assert claim is not None
    assert claim.puts[1:] == (Put(KEYS.due(4), DueRecord("me", 1, True).encode()),)
    c.h._round = 3  # a member of an older round only
    claim = claim_ops(c.h, view, 5, c.keeper)
    assert claim is not None
    assert len(claim.puts) == 1
    await c.store.put(KEYS.round, _round(4, 1))
    view = await c.view()
    c.h._round = 4
    claim = claim_ops(c.h, view, 5, c.keeper)
    assert claim is not None
    assert len(claim.puts) == 1
    await view.aclose()
    await c.aclose()


@virtual_test
async def test_the_claim_reads_the_last_roster_only_if_it_is_needed_and_fits() -> None:
    engine = MemoryEngine()
    c = await _claiming(engine)
    nodes = Range(KEYS.nodes, limit=SNAPSHOT_LIMIT)
    roster = Range(KEYS.roster_of(4))
    cases = [
        (_round(4, 2), (nodes, roster)),  # a roster this node has not got
        (_round(4, 2, chunks=0), (nodes,)),  # a static round: its members are rank0..
        (_round(4, SNAPSHOT_LIMIT - 1), (nodes, roster)),
        (_round(4, SNAPSHOT_LIMIT), ()),  # too many to read with the claim: the driver reads
    ]
    for record, reads in cases:
        await c.store.put(KEYS.round, record)
        view = await c.view()
        claim = claim_ops(c.h, view, 5, c.keeper)
        assert claim is not None
        assert claim.reads == reads, record
        await view.aclose()
    await c.store.put(KEYS.round, _round(4, 2))
    view = await c.view()
    result = _result(c, round_=4, participants=("me", "other"))
    c.h._result = result
    claim = claim_ops(c.h, view, 5, c.keeper)
    assert claim is not None
    assert claim.reads == (nodes,)
    c.h._result = dataclasses.replace(result, round=3)
    claim = claim_ops(c.h, view, 5, c.keeper)
    assert claim is not None
    assert claim.reads == (nodes, roster)
    c.h._result = dataclasses.replace(result, participants=())
    claim = claim_ops(c.h, view, 5, c.keeper)
    assert claim is not None
    assert claim.reads == (nodes, roster)
    c.h._result = None
    await view.aclose()
    await c.aclose()


def _result(c: _Claiming, *, round_: int, participants: tuple[str, ...]) -> RendezvousResult:
    return RendezvousResult(
        "job",
        round_,
        0,
        len(participants),
        participants,
        "me",
        c.store,
        RendezvousStoreInfo("10.0.0.1", 29500),
    )


@virtual_test
async def test_a_landed_claim_returns_its_revision_the_nodes_as_of_it_and_the_roster() -> None:
    """The claiming transaction's results after the registration's own: the claim's
    mod_revision, the registrations as of the transaction (its revision, their count, cut or
    not), the last round's roster chunks, and whether it told the last round's members."""
    engine = MemoryEngine()
    c = await _claiming(engine)
    store = c.store
    await store.put(KEYS.round, _round(4, 2))
    await store.put(KEYS.chunk(4, 0), b"chunk")
    await store.put(KEYS.node(5, "a"), b"a")
    await store.put(KEYS.node(5, "b"), b"b")
    view = await c.view()
    c.h._round = 4
    claim = claim_ops(c.h, view, 5, c.keeper)
    assert claim is not None
    assert len(claim.reads) == 2
    registration = Put(KEYS.node(5, "me"), b"me", c.keeper.id)
    limited = (Range(KEYS.nodes, limit=2), claim.reads[1])  # the registrations cut at 2
    result = await store.txn(compare=[claim.compare], success=[registration, *claim.puts, *limited])
    assert result.succeeded
    got = claimed(dataclasses.replace(claim, reads=limited), result, 1)
    driver = await store.get(KEYS.driver)
    assert driver is not None
    assert got.revision == driver.mod_revision
    nodes = await store.range(KEYS.nodes, limit=2)
    assert got.snapshot == RangeResult(nodes.kvs, result.revision, 3, True)
    chunk = await store.get(KEYS.chunk(4, 0))
    assert got.roster == (chunk,)
    assert got.told
    # no roster read, no word to the members: neither in the result
    c.h._round = 3
    await store.put(KEYS.driver, DriverRecord(4, "other").encode())
    await store.put(KEYS.round, _round(4, 2, chunks=0))
    view2 = await c.view()
    claim = claim_ops(c.h, view2, 5, c.keeper)
    assert claim is not None
    assert len(claim.puts) == 1
    assert len(claim.reads) == 1
    result = await store.txn(
        compare=[claim.compare], success=[registration, *claim.puts, *claim.reads]
    )
    got = claimed(claim, result, 1)
    assert (got.roster, got.told) == (None, False)
    assert got.snapshot is not None
    assert got.snapshot.revision == result.revision
    assert got.snapshot.count == 3
    assert not got.snapshot.more
    # a round too large to read with the claim: nothing read, nothing in the result
    await store.put(KEYS.round, _round(5, SNAPSHOT_LIMIT, chunks=2))
    view3 = await c.view()
    claim = claim_ops(c.h, view3, 6, c.keeper)
    assert claim is not None
    assert claim.reads == ()
    result = await store.txn(compare=[claim.compare], success=[registration, *claim.puts])
    got = claimed(claim, result, 1)
    assert (got.snapshot, got.roster) == (None, None)
    for v in (view, view2, view3):
        await v.aclose()
    await c.aclose()


@virtual_test
async def test_an_interrupted_joins_own_claim_is_its_own_only_with_its_lease() -> None:
    """The view's claim is this node's (it drives again) only for the round it joins, in its
    own name, bound to its own lease: not a claim of another round, another node's, or one a
    former handler with this node id left on another lease."""
    engine = MemoryEngine()
    c = await _claiming(engine)
    store = c.store
    assert own_claim(c.h, await c.view(), 5, c.keeper) is None  # nobody's
    mine = await store.put(KEYS.driver, DriverRecord(5, "me").encode(), lease=c.keeper.id)
    view = await c.view()
    assert own_claim(c.h, view, 5, c.keeper) == Claimed(mine)
    assert own_claim(c.h, view, 6, c.keeper) is None  # a claim of another round
    await store.put(KEYS.driver, DriverRecord(5, "other").encode(), lease=c.keeper.id)
    assert own_claim(c.h, await c.view(), 5, c.keeper) is None  # another node's
    other_lease = (await store.lease_grant(6.0)).id
    await store.put(KEYS.driver, DriverRecord(5, "me").encode(), lease=other_lease)
    assert own_claim(c.h, await c.view(), 5, c.keeper) is None  # a former handler's lease
    await c.aclose()


@virtual_test
async def test_a_claim_by_itself_is_a_cas_bound_to_the_lease() -> None:
    """A node registered already claims the driver with a compare-and-swap of ``c/driver`` as
    its view saw it: bound to its lease, in its name, for its round; a view that is behind
    (somebody claimed since) loses, and a claim the view shows for the round is left alone
    (this node's own: it drives again)."""
    engine = MemoryEngine()
    c = await _claiming(engine)
    store = c.store
    view = await c.view()
    got = await claim_driver(c.h, view, 0, c.keeper)
    kv = await store.get(KEYS.driver)
    assert kv is not None
    assert got == Claimed(kv.mod_revision)
    assert kv.lease == c.keeper.id
    assert DriverRecord.decode(kv.key, kv.value) == DriverRecord(0, "me")
    # a stale view (no claim in it): the claim another node made since is not overwritten
    rival = await _claiming(engine, "rival")
    assert await claim_driver(rival.h, view, 0, rival.keeper) is None
    kv_after = await store.get(KEYS.driver)
    assert kv_after == kv
    fresh = await c.view()
    assert await claim_driver(c.h, fresh, 0, c.keeper) == Claimed(kv.mod_revision)  # its own
    assert await claim_driver(rival.h, fresh, 0, rival.keeper) is None  # not the rival's
    await c.keeper.aclose()  # the lease revoked: the claim goes with it
    assert await store.get(KEYS.driver) is None
    for v in (view, fresh):
        await v.aclose()
    await rival.aclose()
    await c.aclose()


# -- static: the last survivors ----------------------------------------------------------------


def _static(engine: MemoryEngine, rank: int, world: int = 2) -> StaticRendezvousHandler:
    return StaticRendezvousHandler(
        MemoryStore(engine), "job", rank, world, local_addr=f"host{rank}", lease_ttl=6.0
    )


@virtual_test
async def test_static_lease_lost_while_nobody_waits_is_an_error_with_its_cause() -> None:
    """A rank's lease lost between calls (revoked, expired) puts the handler in ERROR at once,
    and its next ``wait_for_change`` is an ERROR event that says why. (Before: the status stayed
    ACTIVE and the event's error was None; only a loss seen inside ``wait_for_change`` was
    recorded.)"""
    engine = MemoryEngine()
    hs = [_static(engine, rank) for rank in range(2)]
    await asyncio.gather(*(h.next_rendezvous() for h in hs))
    keeper = hs[0]._keeper
    assert keeper is not None
    store = MemoryStore(engine)
    await store.lease_revoke(keeper.id)
    await asyncio.sleep(10)  # past a keep-alive: the keeper finds its lease gone
    assert keeper.lost
    assert hs[0].status is RendezvousStatus.ERROR
    assert hs[0].error is keeper.error
    event = await hs[0].wait_for_change()
    assert event.kind is RendezvousEventKind.ERROR
    assert isinstance(event.error, LeaseExpiredError)
    assert event.error is keeper.error
    await hs[0].aclose()
    assert hs[0].get_status() is RendezvousStatus.CLOSED
    await hs[1].aclose()
    await store.aclose()


@virtual_test
async def test_static_timeout_names_the_missing_ranks_even_if_the_caller_gives_up_then() -> None:
    """The read of the missing ranks for the join timeout's message is shielded: a caller's
    cancel scope that ends during it (here 1 s after the join timeout, the read taking 2 s)
    does not cut it, and the error still names the ranks that did not come."""
    slow = FaultInjectingStore(MemoryStore(MemoryEngine()))
    h = StaticRendezvousHandler(slow, "job", 0, 2, local_addr="h", join_timeout=10)
    slow.hang("range")  # the registration and the watch do not range; only that read does

    async def answer_at_12() -> None:
        await asyncio.sleep(12)
        slow.release()

    answering = asyncio.ensure_future(answer_at_12())
    with pytest.raises(RendezvousTimeoutError) as caught, anyio.fail_after(11):
        await h.next_rendezvous()
    assert str(caught.value) == (
        "static rendezvous 'job': ranks ['rank1'] did not arrive within join_timeout=10.0s"
    )
    assert _now() == 12
    await answering
    await h.aclose()


def test_static_close_goes_on_when_closing_its_watch_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A watch whose close fails (an http watch's unwatch on a lost connection) does not stop
    ``aclose``: the lease is still revoked, so the rank's record goes."""

    async def fails() -> None:
        raise StoreConnectionError("connection lost")

    async def body() -> None:
        engine = MemoryEngine()
        hs = [_static(engine, rank) for rank in range(2)]
        await asyncio.gather(*(h.next_rendezvous() for h in hs))
        waiting = asyncio.ensure_future(hs[0].wait_for_change())
        await _turns()
        watch = hs[0]._watch
        assert watch is not None
        monkeypatch.setattr(watch, "aclose", fails)
        waiting.cancel()
        await asyncio.wait([waiting])
        await hs[0].aclose()  # no error
        store = MemoryStore(engine)
        assert await store.get(KEYS.node(0, "rank0")) is None  # its lease was revoked
        await hs[1].aclose()
        await store.aclose()

    run_virtual(body)


# -- _status: the last survivors -----------------------------------------------------------------


class _ArmsBeforeTimerReads(MemoryStore):
    """A memory store on which something is written under ``prefix`` just before each of the
    next ``times`` reads of it: a write landing between a status's read of the run and its read
    of the timers."""

    def __init__(self, engine: MemoryEngine, prefix: str) -> None:
        super().__init__(engine)
        self.prefix = prefix
        self.times = 0

    async def _range(self, prefix: str, limit: int | None) -> Any:
        if prefix == self.prefix and self.times:
            self.times -= 1
            await self.put(prefix + "junk", b"not a timer")
        return await super()._range(prefix, limit)


async def _no_snapshot_within(snapshots: Any, seconds: float = 10) -> None:
    pending = asyncio.ensure_future(anext(snapshots))
    await asyncio.sleep(seconds)
    assert not pending.done(), pending.result()
    pending.cancel()
    await asyncio.wait([pending])


@virtual_test
async def test_status_watch_skips_a_timer_write_its_last_read_saw() -> None:
    """A timers' write between the read of the run and the read of its timers is in the
    snapshot already (the timers' read is later): it yields no second snapshot, nor after a
    compaction (read afresh, the same way)."""
    engine = MemoryEngine()
    store = _ArmsBeforeTimerReads(engine, "tp/")
    keys = RunKeys("job")
    await store.put(keys.node(0, "a"), NodeRecord("a", "ha", 1).encode())
    store.times = 1
    snapshots = watch_run_status(store, "job", timers_prefix="tp/")
    first = await anext(snapshots)
    assert first.revision < engine.revision  # the write landed after the run's read
    await _no_snapshot_within(snapshots)

    snapshots = watch_run_status(store, "job", timers_prefix="tp/")
    await anext(snapshots)
    await store.put(keys.node(0, "b"), NodeRecord("b", "h", 1).encode())
    revision = await store.put(keys.node(0, "c"), NodeRecord("c", "h", 1).encode())
    await store.compact(revision)
    store.times = 1  # and again in the fresh read after the compaction
    fresh = await asyncio.wait_for(anext(snapshots), 5)
    assert [n.node_id for n in fresh.waiting] == ["a", "b", "c"]
    await _no_snapshot_within(snapshots)
    await store.aclose()


@virtual_test
async def test_status_watch_waits_through_timer_writes_and_a_compaction_while_the_run_is_gone() -> (
    None
):
    """While the run has no records its timers' writes yield nothing (each one seen), nor does
    a compaction then; the run's return does."""
    engine = MemoryEngine()
    store = MemoryStore(engine)
    keys = RunKeys("job")
    await store.put(keys.node(0, "a"), NodeRecord("a", "ha", 1).encode())
    snapshots = watch_run_status(store, "job", timers_prefix="tp/")
    await anext(snapshots)
    await store.delete_prefix(keys.root)
    for n in range(3):
        await store.put(f"tp/junk{n}", b"not a timer")
    await _no_snapshot_within(snapshots)

    snapshots = watch_run_status(store, "job", timers_prefix="tp/")
    with pytest.raises(RendezvousNotFoundError):
        await anext(snapshots)
    await store.put(keys.node(0, "a"), NodeRecord("a", "ha", 1).encode())
    snapshots = watch_run_status(store, "job", timers_prefix="tp/")
    await anext(snapshots)
    await store.delete_prefix(keys.root)
    revision = await store.put("tp/junk", b"not a timer")
    await store.compact(revision)
    pending = asyncio.ensure_future(anext(snapshots))
    await asyncio.sleep(10)
    assert not pending.done()  # read afresh at the compaction: no run, nothing to yield
    back = await store.put(keys.node(0, "b"), NodeRecord("b", "h", 1).encode())
    again = await asyncio.wait_for(pending, 5)
    assert again.revision == back
    await snapshots.aclose()
    await store.aclose()


@virtual_test
async def test_status_watch_closed_mid_stream_closes_its_watches() -> None:
    engine = MemoryEngine()
    store = MemoryStore(engine)
    keys = RunKeys("job")
    await store.put(keys.node(0, "a"), NodeRecord("a", "ha", 1).encode())
    snapshots = watch_run_status(store, "job", timers_prefix="tp/")
    await anext(snapshots)
    await store.put(keys.node(0, "b"), NodeRecord("b", "h", 1).encode())
    await anext(snapshots)  # from the watches of the run and of its timers
    assert engine.watcher_count == 2
    await snapshots.aclose()
    gc.collect()
    await _turns(10)
    assert engine.watcher_count == 0
    await store.aclose()


@virtual_test
async def test_status_of_a_round_whose_members_records_are_all_gone() -> None:
    engine = MemoryEngine()
    hs = [
        DynamicRendezvousHandler(MemoryStore(engine), "job", 2, 2, lease_ttl=6.0) for _ in range(2)
    ]
    await asyncio.gather(*(h.next_rendezvous() for h in hs))
    store = MemoryStore(engine)
    await store.delete_prefix(KEYS.nodes_of(0))  # (as when both leases ended)
    status = await read_run_status(store, "job")
    assert status.round == 0
    assert sorted(m.node_id for m in status.members) == sorted(h.node_id for h in hs)
    assert not any(m.alive for m in status.members)
    assert all(m.lease_remaining is None and m.addr is None for m in status.members)
    for h in hs:
        await h.aclose()
    await store.aclose()


@virtual_test
async def test_status_of_a_node_whose_lease_ends_between_the_range_and_its_ttl() -> None:
    engine = MemoryEngine()
    store = MemoryStore(engine)
    lease = await store.lease_grant(6.0)
    await store.put(KEYS.node(0, "a"), NodeRecord("a", "ha", 1).encode(), lease=lease.id)
    faulty = FaultInjectingStore(store)
    faulty.fail_next("lease_time_to_live", LeaseNotFoundError(lease.id))
    status = await read_run_status(faulty, "job")
    (waiting,) = status.waiting
    assert (waiting.node_id, waiting.lease_remaining, waiting.lease_ttl) == ("a", None, None)
    await store.aclose()


# -- _control: the view of c/ ---------------------------------------------------------------------


@virtual_test
async def test_control_view_forgets_a_deleted_record() -> None:
    """A control record's deletion (seen on the view's watch) clears it from the view: its
    key-value and its decoded record, for the round, the driver and the close alike."""
    engine = MemoryEngine()
    store = MemoryStore(engine)
    await store.put(KEYS.round, _round(0, 2))
    await store.put(KEYS.driver, DriverRecord(1, "me").encode())
    await store.put(KEYS.closed, ClosedRecord(0).encode())
    view = await ControlView.open(store, KEYS)
    assert None not in (view.round, view.driver, view.closed)
    watch = view.watch
    for key in (KEYS.round, KEYS.driver, KEYS.closed):
        await store.delete(key)
        event = await _within(anext(watch))
        assert (event.type, event.kv.key, event.revision) == (
            EventType.DELETE,
            key,
            engine.revision,
        )
        view.apply_event(event)
    assert (view.round_kv, view.round) == (None, None)
    assert (view.driver_kv, view.driver) == (None, None)
    assert (view.closed_kv, view.closed) == (None, None)
    await view.aclose()
    await store.aclose()


@virtual_test
async def test_control_view_of_a_run_not_closed_has_no_close() -> None:
    store = MemoryStore()
    view = await ControlView.open(store, KEYS)
    assert (view.closed_kv, view.closed, view.round_kv, view.driver_kv) == (None, None, None, None)
    await view.aclose()
    await store.aclose()


@pytest.mark.parametrize("which", ["driver", "closed"])
def test_control_view_names_the_key_of_a_corrupt_record(which: str) -> None:
    async def body() -> None:
        engine = MemoryEngine()
        store = MemoryStore(engine)
        key = getattr(KEYS, which)
        await store.put(key, b"\x00 not a record")
        with pytest.raises(RendezvousStateError, match=key):
            await ControlView.open(store, KEYS)
        assert engine.watcher_count == 0  # its watch closed
        await store.aclose()

    run_virtual(body)


class _SlowClosingWatch(_FedWatch):
    """A watch whose close takes a second (a round trip), or fails (``error``)."""

    def __init__(self, error: BaseException | None = None) -> None:
        super().__init__()
        self.error = error
        self.closed_at: float | None = None

    async def _aclose(self) -> None:
        await asyncio.sleep(1)
        if self.error is not None:
            raise self.error
        self.closed_at = _now()


@virtual_test
async def test_control_view_close_is_shielded_and_quiet() -> None:
    """Closing the view's watch is not cut by the caller's cancel scope (the join ending as
    it is cancelled: the watch is still released), and a store error closing it is not the
    caller's."""
    watch = _SlowClosingWatch()
    view = ControlView(KEYS, watch)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await view.aclose()
    assert watch.closed_at == 1.0
    failing = ControlView(KEYS, _SlowClosingWatch(StoreConnectionError("connection lost")))
    await failing.aclose()  # no error


@virtual_test
async def test_closing_a_run_whose_round_record_is_corrupt_names_its_key() -> None:
    store = MemoryStore()
    await store.put(KEYS.round, b"\x00 not a record")
    with pytest.raises(RendezvousStateError, match=KEYS.round):
        await write_closed(store, KEYS)
    assert await store.get(KEYS.closed) is None  # nothing written
    await store.aclose()


class _RoundBeforeTxn(MemoryStore):
    """A memory store on which a next round's record lands just before the first transaction
    (a driver completing round 1 between the close's read of ``c/round`` and its write)."""

    armed = True

    async def _txn(self, txn: Any) -> Any:
        if self.armed:
            self.armed = False
            await self.put(KEYS.round, _round(1, 2))
        return await super()._txn(txn)


@virtual_test
async def test_closing_a_run_as_its_round_changes_closes_after_the_new_round() -> None:
    """The close is written as of the round record it read: if a new round completed
    meanwhile, it reads again, so its record and marker are the new round's (whose members
    watch ``m/1/``), not the old one's."""
    store = _RoundBeforeTxn()
    await store.put(KEYS.round, _round(0, 2))
    assert await write_closed(store, KEYS) == ClosedRecord(1)
    kv = await store.get(KEYS.closed)
    assert kv is not None
    assert ClosedRecord.decode(kv.key, kv.value) == ClosedRecord(1)
    assert await store.get(KEYS.closed_marker(1)) is not None
    assert await store.get(KEYS.closed_marker(0)) is None
    await store.aclose()
