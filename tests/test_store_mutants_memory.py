"""Gaps that mutation testing of the memory backend found (``scripts/mutants store memory.py
_memory_sorted.py``): each test here fails on a realistic bug of the shape of a mutant the rest
of the suite let through. Memory engine and store, virtual time where anything waits."""

from __future__ import annotations

import asyncio
import bisect
import re

import anyio
import pytest

from aioelastic.errors import CompactedError, LeaseNotFoundError, StoreClosedError
from aioelastic.store import CasResult, MemoryEngine, MemoryStore, _memory_sorted, open_store
from aioelastic.store._memory_sorted import SortedKeys
from aioelastic.store._records import new_kv, new_record, slot_setters
from aioelastic.store._txn import PutResult
from aioelastic.store.memory import EngineWork, LeaseChange, _MemoryWatch
from aioelastic.testing import virtual_test

# -- explicit compaction


@virtual_test
async def test_a_compaction_at_or_below_the_compact_revision_names_both_revisions() -> None:
    engine = MemoryEngine()
    for i in range(5):
        engine.put(f"k/{i}", b"x")
    engine.compact(4)
    for stale in (4, 2):
        with pytest.raises(CompactedError) as caught:
            engine.compact(stale)
        assert (caught.value.requested_revision, caught.value.compact_revision) == (stale, 4)
    engine.close()


# -- the store's face: repr and its URL


@virtual_test
async def test_a_memory_store_repr_says_its_revision_and_keys_or_that_it_is_closed() -> None:
    store = MemoryStore()
    await store.put("a", b"1")
    await store.put("b", b"2")
    await store.put("a", b"3")
    assert repr(store) == "<MemoryStore revision=3 keys=2>"
    await store.aclose()
    assert repr(store) == "<MemoryStore closed keys=2>"


@virtual_test
async def test_closing_a_store_closes_its_private_engine_and_never_a_shared_one() -> None:
    shared = MemoryEngine()
    private = MemoryStore()
    client = MemoryStore(shared)
    await private.aclose()
    await client.aclose()
    assert private.engine.closed
    assert not shared.closed
    shared.put("k", b"v")  # still serving its other clients
    shared.close()


@virtual_test
async def test_memory_urls_with_a_bare_slash_open_a_private_store() -> None:
    async with open_store("memory:///") as first, open_store("memory:///") as second:
        await first.put("k", b"v")
        assert await second.get("k") is None  # each its own engine


@virtual_test
async def test_memory_urls_share_one_engine_per_name_and_only_per_name() -> None:
    async with (
        open_store("memory://alpha") as alpha,
        open_store("memory://alpha") as again,
        open_store("memory://beta") as beta,
    ):
        await alpha.put("k", b"v")
        found = await again.get("k")
        assert found is not None
        assert found.value == b"v"
        assert await beta.get("k") is None


@virtual_test
async def test_options_for_a_shared_memory_store_are_refused_by_name() -> None:
    message = "options ['history_limit'] cannot be given for the shared store 'jobs'"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        await open_store("memory://jobs", history_limit=10)


@virtual_test
async def test_an_unknown_memory_store_option_is_refused_by_name() -> None:
    message = "unknown option(s) for the memory store: ['bogus', 'zeta']"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        await open_store("memory://", zeta=1, bogus=2)


# -- leases


@virtual_test
async def test_has_lease_is_true_exactly_while_the_lease_lives() -> None:
    engine = MemoryEngine()
    lease = engine.lease_grant(10.0).id
    other = engine.lease_grant(10.0).id
    assert engine.has_lease(lease)
    assert engine.has_lease(other)
    assert not engine.has_lease(lease + other + 1)
    engine.lease_revoke(lease)
    assert not engine.has_lease(lease)
    assert engine.has_lease(other)
    engine.close()


@virtual_test
async def test_a_swap_onto_a_missing_lease_is_refused_naming_it_and_writes_nothing() -> None:
    async with MemoryStore() as store:
        lease = await store.lease_grant(10.0)
        await store.lease_revoke(lease.id)
        with pytest.raises(LeaseNotFoundError) as caught:
            await store.compare_and_swap("k", 0, b"v", lease=lease.id)
        assert caught.value.lease_id == lease.id
        assert await store.get("k") is None
        assert store.engine.revision == 0


@virtual_test
async def test_a_lease_granted_with_an_id_has_that_id_and_the_next_ones_follow_it() -> None:
    engine = MemoryEngine()
    assert engine.lease_grant(10.0, lease_id=0x70).id == 0x70
    assert engine.lease_time_to_live(0x70).granted_ttl == 10.0
    assert engine.lease_grant(5.0).id == 0x71
    with pytest.raises(ValueError, match=r"^lease 0x70 already exists$"):
        engine.lease_grant(1.0, lease_id=0x70)
    engine.close()


@virtual_test
async def test_a_lease_whose_end_cannot_be_recorded_after_its_keys_went_stays_live() -> None:
    """The keys' deletion is committed, then the lease's end is vetoed (its hook raises): the
    lease stays, usable, with no keys, and ends once the hook lets it."""
    engine = MemoryEngine()
    lease = engine.lease_grant(60.0).id
    engine.put("k", b"v", lease)
    refuse = [True]

    def on_lease(change: LeaseChange) -> None:
        if change.ttl is None and refuse[0]:
            raise OSError(28, "No space left on device")

    engine.on_lease.append(on_lease)
    with pytest.raises(OSError, match="No space"):
        engine.lease_revoke(lease)
    assert engine.get("k") is None
    status = engine.lease_time_to_live(lease)
    assert (status.id, status.keys) == (lease, ())
    assert [s.id for s in engine.leases()] == [lease]
    engine.put("k2", b"v", lease)  # still a lease keys can be put with
    refuse[0] = False
    engine.lease_revoke(lease)
    assert not engine.has_lease(lease)
    assert engine.get("k2") is None
    engine.close()


# -- watches


@virtual_test
async def test_reading_a_watch_never_started_starts_it_at_the_next_revision() -> None:
    async with MemoryStore() as store:
        await store.put("k", b"before")
        watch = store.watch("k")  # not started, not entered: the first read starts it
        reader = asyncio.create_task(anext(watch))
        await asyncio.sleep(0)
        await store.put("k", b"after")
        event = await reader
        assert (event.kv.value, event.revision) == (b"after", 2)
        assert watch.start_revision == 2
        await watch.aclose()


@virtual_test
async def test_a_read_cancelled_while_parked_leaves_nothing_parked_and_the_next_read_works() -> (
    None
):
    async with MemoryStore() as store, store.watch("k") as watch:
        assert isinstance(watch, _MemoryWatch)
        with anyio.move_on_after(5):
            await anext(watch)
        watcher = watch._watcher
        assert watcher is not None
        assert watcher.waiter is None  # no future kept for a reader that is gone
        await store.put("k", b"v")
        event = await anext(watch)
        assert event.kv.value == b"v"
        assert watcher.waiter is None


# -- the engine's own defaults and results (the http server calls it directly)


@virtual_test
async def test_the_engine_deletes_one_key_unless_asked_for_a_prefix() -> None:
    engine = MemoryEngine()
    for key in ("a", "ab", "a/b"):
        engine.put(key, b"x")
    assert engine.delete("a") == 1
    assert [kv.key for kv in engine.range("").kvs] == ["a/b", "ab"]
    assert engine.delete("a", prefix=True) == 2
    assert len(engine) == 0
    engine.close()


@virtual_test
async def test_an_engine_swap_without_a_lease_attaches_none() -> None:
    engine = MemoryEngine()
    engine.lease_grant(10.0, lease_id=1)  # a lease 1 exists: a swap must still not take it
    result = engine.compare_and_swap("k", 0, b"v")
    assert result.succeeded
    assert result.kv is not None
    assert result.kv.lease == 0
    assert engine.lease_time_to_live(1).keys == ()
    engine.close()


@virtual_test
async def test_an_engine_compare_and_delete_returns_the_deletes_revision() -> None:
    engine = MemoryEngine()
    engine.put("k", b"v")
    engine.put("other", b"v")
    result = engine.compare_and_delete("k", 1)
    assert result == CasResult(True, 3, None)
    assert engine.revision == 3
    engine.close()


@virtual_test
async def test_adding_to_a_value_that_is_no_integer_names_its_first_40_bytes() -> None:
    engine = MemoryEngine()
    value = b"0123456789" * 4 + b"not an integer"
    engine.put("k", value)
    message = f"add: the value at 'k' is not a decimal integer: {value[:40]!r}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        engine.add("k", 1)
    assert engine.get("k") is not None
    assert engine.revision == 1
    engine.close()


@virtual_test
async def test_an_engine_counts_its_writes_and_their_events_from_zero() -> None:
    engine = MemoryEngine()
    assert engine.work() == EngineWork()
    engine.put("k", b"v")
    assert engine.work() == EngineWork(writes=1, events_logged=1)
    engine.put("p/1", b"v")
    engine.put("p/2", b"v")
    engine.delete("p/", prefix=True)  # one write, two events
    work = engine.work()
    assert (work.writes, work.events_logged) == (4, 5)
    engine.close()


@virtual_test
async def test_a_history_limit_below_one_is_refused_by_name_and_one_is_enough() -> None:
    with pytest.raises(ValueError, match=r"^history_limit must be >= 1, got 0$"):
        MemoryEngine(history_limit=0)
    engine = MemoryEngine(history_limit=1)
    engine.put("k", b"1")
    engine.put("k", b"2")
    engine.put("k", b"3")  # the log is over 1 + 1: compacted down to the newest revision
    assert engine.compact_revision == 3
    engine.close()


@virtual_test
async def test_auto_compaction_waits_for_an_eighth_of_the_limit_over_it() -> None:
    """history_limit 16: compacted once the log holds 16 + 16 // 8 + 1 = 19 events, not 18."""
    engine = MemoryEngine(history_limit=16)
    for i in range(18):
        engine.put(f"k/{i}", b"x")
    assert engine.compact_revision == 0
    engine.put("k/18", b"x")
    assert engine.compact_revision == 4  # the newest 16 of 19 revisions kept
    engine.close()


@virtual_test
async def test_closing_the_engine_ends_its_watches_with_store_closed() -> None:
    engine = MemoryEngine()
    async with MemoryStore(engine) as store, store.watch("k") as watch:
        engine.close()
        with pytest.raises(StoreClosedError, match=r"^the store was closed$"):
            await anext(watch)


# -- the ordered keys behind ranges (_memory_sorted), blocks small enough to cut


def _block_shapes() -> list[SortedKeys]:
    """The same 18 keys in blocks of many shapes: from a snapshot (halves), added in order and
    in reverse (splits), and with keys removed again (short and merged-away blocks)."""
    keys = [f"{c}{i}" for c in "abc" for i in range(6)]
    shapes = [SortedKeys(keys)]
    for order in (keys, keys[::-1], keys[::2] + keys[1::2]):
        grown = SortedKeys()
        for key in order:
            grown.add(key)
        shapes.append(grown)
    thinned = SortedKeys()
    for key in [*keys, "a00", "b00", "b10", "b20", "b30"]:
        thinned.add(key)
    for key in ("a00", "b00", "b10", "b20", "b30"):
        thinned.remove(key)
    shapes.append(thinned)
    return shapes


def test_every_range_of_every_block_shape_is_the_sorted_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each start and end among the keys and between them, with every limit: the keys found
    (at most the limit, in order) and the count, as one sorted list's slice gives them."""
    monkeypatch.setattr(_memory_sorted, "BLOCK", 4)
    model = sorted(f"{c}{i}" for c in "abc" for i in range(6))
    bounds = sorted({*model, "", "a", "a3x", "b", "c5x", "d"})
    for keys in _block_shapes():
        assert list(keys) == model
        assert len(keys._blocks) > 3
        for start in bounds:
            for end in [None, *(b for b in bounds if b > start)]:
                lo = bisect.bisect_left(model, start)
                hi = len(model) if end is None else bisect.bisect_left(model, end)
                for limit in [None, *range(1, len(model) + 2)]:
                    want = model[lo:hi] if limit is None else model[lo:hi][:limit]
                    assert keys.range(start, end, limit) == (want, hi - lo), (start, end, limit)


@virtual_test
async def test_a_limited_range_across_blocks_of_the_engine_returns_the_first_keys() -> None:
    """The engine's own block size: 3,000 keys span blocks, and a limit larger than a block's
    share of the range still gives the first keys in order, and the full count."""
    engine = MemoryEngine()
    keys = [f"k/{i:05d}" for i in range(3000)]
    for key in keys:
        engine.put(key, b"x")
    for prefix, limit in (("k/0", 700), ("k/1", 600), ("k/1", 1000), ("k/2", 999), ("k/", 2500)):
        result = engine.range(prefix, limit)
        inside = [k for k in keys if k.startswith(prefix)]
        assert [kv.key for kv in result.kvs] == inside[:limit]
        assert (result.count, result.more) == (len(inside), len(inside) > limit)
    result = engine.range("k/", 1700)
    assert [kv.key for kv in result.kvs] == keys[:1700]
    assert result.count == 3000
    assert result.more
    engine.close()


# -- the records made from their slots (session 14's run of the engine's modules)


def test_slot_setters_set_the_fields_in_order_and_refuse_names_that_are_not_the_fields() -> None:
    kv, prev = new_kv("k", b"2", 1, 2, 2, 0), new_kv("k", b"1", 1, 1, 1, 0)
    set_kv, set_prev = slot_setters(PutResult, ("kv", "prev_kv"))
    result: PutResult = new_record(PutResult)
    set_kv(result, kv)
    set_prev(result, prev)
    assert result == PutResult(kv, prev)
    # a field added to (or reordered in) the class must be added here too: said at import
    wrong = re.escape("PutResult's fields are ('kv', 'prev_kv'), not ('prev_kv', 'kv')")
    with pytest.raises(AssertionError, match=f"^{wrong}$"):
        slot_setters(PutResult, ("prev_kv", "kv"))


# -- the watch hub: counting, tracking and forgetting watchers


@virtual_test
async def test_a_read_of_one_event_counts_one_event_delivered() -> None:
    engine = MemoryEngine()
    watcher = engine.add_watcher("a/", None, owner=None)  # tracked from the start
    for i in range(3):
        engine.put(f"a/{i}", b"x")
        before = engine.work().events_delivered
        assert [e.kv.key for e in engine.read_events(watcher)] == [f"a/{i}"]
        assert engine.work().events_delivered == before + 1
    engine.close()


@virtual_test
async def test_unread_events_are_appended_to_one_list_not_copied_per_event() -> None:
    """A tracked watcher's unread events: O(1) per event, not a new list of all of them."""
    engine = MemoryEngine()
    watcher = engine.add_watcher("a/", None, owner=None)
    engine.put("a/0", b"x")
    engine.put("a/1", b"x")
    unread = watcher.hits
    assert isinstance(unread, list)
    engine.put("a/2", b"x")
    assert watcher.hits is unread
    assert len(engine.read_events(watcher)) == 3
    engine.close()


@virtual_test
async def test_a_removed_watcher_keeps_its_unread_events_and_reads_none_when_it_had_none() -> None:
    engine = MemoryEngine()
    engine.put("other", b"x")  # a log that does not start empty
    busy = engine.add_watcher("a/", None, owner=None)
    idle = engine.add_watcher("b/", None, owner=None)
    engine.put("a/0", b"x")
    engine.put("a/1", b"x")
    engine.remove_watcher(busy)
    engine.remove_watcher(idle)
    assert [e.kv.key for e in engine.read_events(busy)] == ["a/0", "a/1"]
    assert engine.read_events(idle) == []
    engine.close()


@virtual_test
async def test_removing_one_watcher_of_a_prefix_leaves_the_others_tracked_and_it_unvisited() -> (
    None
):
    engine = MemoryEngine()
    gone = engine.add_watcher("a/", None, owner=None)
    stays = engine.add_watcher("a/", None, owner=None)
    engine.remove_watcher(gone)
    before = engine.work().watcher_visits
    engine.put("a/0", b"x")
    assert engine.work().watcher_visits == before + 1  # the one left, not the removed one
    assert [e.kv.key for e in engine.read_events(stays)] == ["a/0"]
    engine.remove_watcher(stays)
    before = engine.work().watcher_visits
    engine.put("a/1", b"x")
    assert engine.work().watcher_visits == before  # no watcher left under a/ to look at
    engine.close()


@virtual_test
async def test_a_watch_with_nothing_ready_under_its_prefix_takes_no_event() -> None:
    """The join's reader takes events without waiting: a watch that catches up from the past and
    finds nothing under its prefix has none to give (and no end to raise)."""
    async with MemoryStore() as store:
        await store.put("other/0", b"x")
        await store.put("other/1", b"x")
        async with store.watch("mine/", start_revision=1) as watch:
            await watch.start()
            assert watch._set_waker(lambda: None)
            assert watch._take_event() is None
            await store.put("mine/0", b"x")
            event = watch._take_event()
            assert event is not None
            assert event.kv.key == "mine/0"
            assert watch._take_event() is None


# -- the engine's state, leases and the close of a store that shares one


@virtual_test
async def test_a_new_engine_says_it_is_not_closed_with_a_bool() -> None:
    engine = MemoryEngine()
    assert engine.closed is False
    engine.close()
    assert engine.closed is True


@virtual_test
async def test_a_revoked_or_expired_lease_leaves_no_timer_behind() -> None:
    engine = MemoryEngine()
    deadlines = engine._leases._deadlines
    revoked = engine.lease_grant(5.0)
    expiring = engine.lease_grant(1.0)
    assert len(deadlines) == 2
    engine.lease_revoke(revoked.id)
    assert len(deadlines) == 1
    await anyio.sleep(1.5)
    assert not engine.has_lease(expiring.id)
    assert len(deadlines) == 0
    engine.close()


@virtual_test
async def test_closing_a_store_of_a_shared_engine_ends_its_open_watches_as_closed() -> None:
    engine = MemoryEngine()
    store = MemoryStore(engine)
    other = MemoryStore(engine)
    async with store.watch("k") as watch, other.watch("k") as theirs:
        await watch.start()
        await theirs.start()
        await store.aclose()
        with pytest.raises(StoreClosedError, match=r"^the store was closed$"):
            await anext(watch)
        await other.put("k", b"v")  # the other store's watch goes on
        assert (await anext(theirs)).kv.key == "k"
    await other.aclose()
    engine.close()
