"""What the memory engine keeps alive per watcher and per lease, counted in objects the garbage
collector tracks: a process with 10,000 participants holds that many of each, and every full
collection traverses all of them. Also the bookkeeping those savings changed: which watchers a
compaction fails, and the watchers an owner holds."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

import pytest

from aioelastic.errors import CompactedError, LeaseExpiredError, StoreClosedError
from aioelastic.store import LeaseKeeper, MemoryEngine, MemoryStore
from aioelastic.store._keeper import _renewals
from aioelastic.testing import run_virtual

N = 1000


def _tracked_per_item(make: Callable[[int], object], n: int = N) -> float:
    """Objects the collector tracks that ``make(i)`` leaves alive, per call, on average."""
    kept: list[object] = []
    gc.collect()
    before = len(gc.get_objects())
    kept.extend(make(i) for i in range(n))
    gc.collect()
    grown = len(gc.get_objects()) - before
    del kept
    return grown / n


def test_an_idle_watcher_is_one_object() -> None:
    engine = MemoryEngine()
    owners = [object() for _ in range(N)]  # (untracked: plain objects without references)
    per_watcher = _tracked_per_item(lambda i: engine.add_watcher("a/", None, owners[i]))
    # the watcher itself: no list of unread events while it has none, no set per owner
    assert per_watcher <= 1.05, per_watcher


def test_a_woken_watcher_that_read_keeps_nothing_of_the_wake_up() -> None:
    engine = MemoryEngine()
    watchers = [engine.add_watcher("a/", None, owner=None) for _ in range(N)]

    def wake_and_read(i: int) -> None:
        engine.put("a/k", b"x")  # every watcher: its first unread event
        for watcher in watchers:
            assert len(engine.read_events(watcher)) == 1

    # (measured over a few writes: the log's own key-values and events are the writes')
    per_write = _tracked_per_item(wake_and_read, n=3)
    # each write: its key-value and its event in the log; nothing per woken watcher
    assert per_write <= 2.5, per_write


def test_a_woken_watcher_holds_nothing_tracked_until_it_reads() -> None:
    """One write under the prefix of N watchers: each records its one unread event as a tuple
    of one number (untracked by the collector), not a list (the old code: one list each, alive
    until each watcher reads; N readers woken at once hold them across loop turns)."""
    engine = MemoryEngine()
    watchers = [engine.add_watcher("a/", None, owner=None) for _ in range(N)]
    gc.collect()
    before = len(gc.get_objects())
    engine.put("a/k", b"x")
    gc.collect()
    per_watcher = (len(gc.get_objects()) - before) / N
    assert per_watcher <= 0.05, per_watcher  # (the write's key-value and event: 2 in all)
    engine.put("a/k", b"y")  # a second unread event: a list from now on, both in order
    for watcher in watchers[:3]:
        assert [e.kv.value for e in engine.read_events(watcher)] == [b"x", b"y"]
    engine.put("a/k", b"z")
    assert [e.kv.value for e in engine.read_events(watchers[0])] == [b"z"]


def test_a_lease_holding_a_key_is_its_record_its_key_set_and_its_timer() -> None:
    async def main() -> float:
        engine = MemoryEngine()

        def grant(i: int) -> int:
            lease = engine.lease_grant(30.0).id
            engine.put(f"n/{i}", b"x", lease)
            return lease

        per_lease = _tracked_per_item(grant)
        engine.close()
        return per_lease

    # the lease, its set of keys, and the key's value and event: its expiry is an entry of the
    # table's deadlines, no timer handle (the old code: 5, with one)
    per_lease = run_virtual(main)
    assert per_lease <= 4.1, per_lease


def test_a_kept_lease_is_its_keeper_its_context_and_its_record() -> None:
    """A started keeper between renewals, with a loss callback: itself, the context its renewals
    run in, the callback, the engine's lease record and its (empty) key set. Its renewal's
    deadline is an entry of the loop's shared renewals (the old code: 9, with a timer handle and
    a bound method for it, a list of callbacks, and the lease's own timer handle)."""

    async def main() -> float:
        store = MemoryStore()
        keepers: list[LeaseKeeper] = []
        lost: list[LeaseExpiredError] = []
        gc.collect()
        before = len(gc.get_objects())
        for _ in range(N):
            keeper = store.lease(30.0)
            await keeper.start()
            keeper.on_lost(lost.append)  # (the callback: a bound method, one object)
            keepers.append(keeper)
        gc.collect()
        per_keeper = (len(gc.get_objects()) - before) / N
        assert lost == []
        await asyncio.gather(*(k.aclose() for k in keepers))
        await store.aclose()
        return per_keeper

    per_keeper = run_virtual(main)
    assert per_keeper <= 5.1, per_keeper


def test_many_keepers_renew_on_one_timer_and_each_in_time() -> None:
    """Keepers of different intervals renew each at its own interval (virtual time: exactly),
    and the loop holds one timer for all of their deadlines."""

    async def main() -> tuple[list[int], int]:
        store = MemoryStore()
        loop = asyncio.get_running_loop()
        keepers = [store.lease(3.0 * i, keep_alive_interval=float(i)) for i in (1, 2, 5)]
        for keeper in keepers:
            await keeper.start()
        timers = len(loop._scheduled)  # type: ignore[attr-defined]
        await asyncio.sleep(10.5)
        renewals = [k.statistics().renewals for k in keepers]
        assert all(not k.lost for k in keepers)
        for keeper in keepers:
            await keeper.aclose()
        assert len(_renewals(loop)) == 0  # a closed keeper leaves no renewal due
        await store.aclose()
        return renewals, timers

    renewals, timers = run_virtual(main)
    assert renewals == [10, 5, 2]
    # the keepers' renewals and the engine's three lease expiries: one timer each (the old
    # code: six)
    assert timers == 2, timers


def test_a_parked_memory_watch_reader_is_one_coroutine() -> None:
    """A task parked in a memory watch's ``__anext__``: the task (its context, its weak
    reference in asyncio's registry, its wake-up callback), its one coroutine and the engine's
    future it awaits (and that future's iterator). The old code parked three coroutines (the
    base class's ``__anext__``, ``_next``, the engine's ``wait``) and an empty list."""

    async def main() -> float:
        store = MemoryStore()
        watches = []
        for _ in range(N):
            watch = store.watch("k/")
            await watch.start()
            watches.append(watch)
        readers: list[asyncio.Task[object]] = []

        def park(i: int) -> None:
            readers.append(asyncio.ensure_future(watches[i].__anext__()))

        async def parked() -> float:
            gc.collect()
            before = len(gc.get_objects())
            for i in range(N):
                park(i)
            await asyncio.sleep(0)  # every reader's first step: parked
            gc.collect()
            return (len(gc.get_objects()) - before) / N

        per_reader = await parked()
        await store.put("k/1", b"x")  # every reader gets the event, and keeps nothing parked
        events = await asyncio.gather(*readers)
        assert {e.kv.key for e in events} == {"k/1"}  # type: ignore[attr-defined]
        assert all(w._watcher.waiter is None for w in watches)  # type: ignore[attr-defined]
        await store.aclose()
        return per_reader

    per_reader = run_virtual(main)
    assert per_reader <= 8.1, per_reader


def test_compaction_fails_a_tracked_watcher_only_for_an_unread_event_it_drops() -> None:
    engine = MemoryEngine(history_limit=1_000_000)
    early = engine.add_watcher("a/", None, owner=None)
    reader = engine.add_watcher("a/", None, owner=None)
    engine.put("a/1", b"x")  # the first unread event of both
    assert [e.kv.key for e in engine.read_events(reader)] == ["a/1"]
    engine.put("b/1", b"y")
    engine.put("a/2", b"x")  # reader: a new first unread event, after the cut below
    engine.compact(engine.revision - 1)  # drops a/1 (before b/1), keeps b/1 and a/2
    with pytest.raises(CompactedError) as lost:
        engine.read_events(early)  # a/1 was unread
    assert lost.value.requested_revision == 1
    assert [e.kv.key for e in engine.read_events(reader)] == ["a/2"]  # nothing lost: not failed
    # a watcher that read everything before a compaction is not failed by it either
    engine.put("a/3", b"x")
    assert [e.kv.key for e in engine.read_events(reader)] == ["a/3"]
    engine.compact(engine.revision)
    engine.put("a/4", b"x")
    assert [e.kv.key for e in engine.read_events(reader)] == ["a/4"]


def test_an_owners_watchers_are_failed_as_they_come_and_go() -> None:
    engine = MemoryEngine()
    owner, other = object(), object()
    first = engine.add_watcher("a/", None, owner)
    second = engine.add_watcher("b/", None, owner)
    third = engine.add_watcher("c/", None, owner)
    bystander = engine.add_watcher("a/", None, other)
    engine.remove_watcher(second)
    engine.remove_watcher(third)  # back to one watcher of the owner
    fourth = engine.add_watcher("d/", None, owner)  # and two again
    engine.fail_watchers_of(owner, StoreClosedError("gone"))
    for watcher in (first, fourth):
        with pytest.raises(StoreClosedError):
            engine.read_events(watcher)
    for watcher in (second, third, bystander):
        assert engine.read_events(watcher) == []
    engine.remove_watcher(first)
    engine.remove_watcher(fourth)
    engine.fail_watchers_of(owner, StoreClosedError("gone again"))  # owns nothing: a no-op
    assert engine.read_events(bystander) == []


def test_a_memory_watch_returns_a_read_batch_one_event_at_a_time() -> None:
    async def main() -> None:
        async with MemoryStore() as store, store.watch("k/") as watch:
            for i in range(3):
                await store.put(f"k/{i}", b"x")
            got = [(await watch.__anext__()).kv.key for _ in range(3)]
            assert got == ["k/0", "k/1", "k/2"]
            waiting = asyncio.ensure_future(watch.__anext__())
            await asyncio.sleep(0)
            assert not waiting.done()
            await store.put("k/3", b"x")
            assert (await waiting).kv.key == "k/3"

    run_virtual(main)
