"""Memory-backend specifics beyond the conformance suite: bounded history, lagging watches,
lease expiry precision, and many leases, all in virtual time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import anyio
import pytest

from aioelastic.errors import CompactedError, StoreClosedError
from aioelastic.store import Compare, EventType, MemoryEngine, MemoryStore, Put, Txn
from aioelastic.testing import run_virtual


def test_history_is_bounded_and_compaction_is_real() -> None:
    async def main() -> None:
        async with MemoryStore(history_limit=10) as store:
            for i in range(25):
                await store.put(f"k/{i % 3}", str(i).encode())
            assert store.engine.compact_revision > 1
            with pytest.raises(CompactedError) as info:
                await store.watch("k/", start_revision=1).start()
            assert info.value.compact_revision == store.engine.compact_revision
            async with store.watch("k/", start_revision=store.engine.compact_revision) as w:
                first = await w.__anext__()
            assert first.revision == store.engine.compact_revision

    run_virtual(main)


def test_a_lagging_watch_gets_compacted_error_not_silent_loss() -> None:
    async def main() -> None:
        async with MemoryStore(history_limit=5) as store, store.watch("k") as slow:
            for i in range(20):
                await store.put("k", str(i).encode())
            with pytest.raises(CompactedError) as info:
                await slow.__anext__()
            assert info.value.requested_revision == 1

    run_virtual(main)


def test_auto_compaction_never_splits_a_revision() -> None:
    async def main() -> None:
        async with MemoryStore(history_limit=4) as store:
            for i in range(6):
                await store.put(f"p/{i}", b"x")
            await store.delete_prefix("p/")  # 6 events at one revision
            revision = await store.current_revision()
            async with store.watch("p/", start_revision=revision) as w:
                got = [await w.__anext__() for _ in range(6)]
            assert {e.revision for e in got} == {revision}
            assert {e.type for e in got} == {EventType.DELETE}

    run_virtual(main)


def test_explicit_compaction_bounds() -> None:
    async def main() -> None:
        async with MemoryStore() as store:
            rev = await store.put("k", b"v")
            with pytest.raises(ValueError, match="future"):
                await store.compact(rev + 1)
            await store.compact(rev)
            with pytest.raises(CompactedError):
                await store.compact(rev)

    run_virtual(main)


def test_lease_expiry_fires_on_its_deadline() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with MemoryStore() as store:
            grant = await store.lease_grant(2.5)
            await store.put("k", b"v", lease=grant.id)
            start = loop.time()
            async with store.watch("k") as w:
                await anyio.sleep(1.0)
                await store.lease_keep_alive(grant.id)  # deadline moves to start + 3.5
                event = await w.__anext__()
            assert event.type is EventType.DELETE
            assert loop.time() - start == pytest.approx(3.5)

    run_virtual(main)


def test_ten_thousand_leases_expire_each_at_its_deadline() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with MemoryStore() as store:
            start = loop.time()
            deadlines: dict[str, float] = {}
            for i in range(10_000):
                ttl = 1 + (i % 100) / 10
                grant = await store.lease_grant(ttl)
                await store.put(f"l/{i}", b"x", lease=grant.id)
                deadlines[f"l/{i}"] = start + ttl
            lateness: list[float] = []
            async with store.watch("l/") as w:
                async for event in w:
                    lateness.append(loop.time() - deadlines[event.kv.key])
                    if len(lateness) == 10_000:
                        break
            assert max(lateness) < 1e-6
            assert store.engine.lease_count == 0
            assert len(store.engine) == 0

    run_virtual(main)


def test_shared_engine_close_of_one_client_ends_only_its_watches() -> None:
    async def main() -> None:
        engine = MemoryEngine()
        one, two = MemoryStore(engine), MemoryStore(engine)
        w1, w2 = one.watch(""), two.watch("")
        await w1.start()
        await w2.start()
        await one.aclose()
        with pytest.raises(StoreClosedError):
            await w1.__anext__()
        await two.put("k", b"v")
        assert (await w2.__anext__()).kv.key == "k"
        await two.aclose()
        assert engine.watcher_count == 2  # watches are removed by their aclose, not by close
        await w1.aclose()
        await w2.aclose()
        assert engine.watcher_count == 0

    run_virtual(main)


def test_watchers_are_released_on_close() -> None:
    async def main() -> None:
        async with MemoryStore() as store:
            for _ in range(3):
                async with store.watch("x"):
                    pass
            assert store.engine.watcher_count == 0

    run_virtual(main)


def test_a_woken_watcher_reads_its_events_without_scanning_the_others() -> None:
    # Watchers that are caught up are tracked: a write under their prefix records its log index
    # with them, so a read costs the watcher its own events, not every write since (a round of
    # N members would otherwise cost O(N^2): each member's control watch scanning the others'
    # registrations).
    engine = MemoryEngine()
    watcher = engine.add_watcher("a/", None, owner=None)
    engine.put("a/1", b"x")  # wakes it
    for i in range(1000):  # not its prefix: not recorded with it
        engine.put(f"b/{i}", b"y")
    engine.put("a/2", b"x")
    assert watcher.hits is not None
    assert len(watcher.hits) == 2
    assert [e.kv.key for e in engine.read_events(watcher)] == ["a/1", "a/2"]
    assert watcher.hits is not None
    assert not watcher.hits
    assert engine.read_events(watcher) == []
    # a watcher that starts in the past scans the log once, then is tracked
    past = engine.add_watcher("b/", 1, owner=None)
    assert past.hits is None
    assert len(engine.read_events(past)) == 1000
    assert past.hits is not None
    assert not past.hits
    engine.put("b/late", b"z")
    assert [e.kv.key for e in engine.read_events(past)] == ["b/late"]
    # one that starts at a future revision is tracked but sees nothing before it
    future = engine.add_watcher("a/", engine.revision + 2, owner=None)
    engine.put("a/3", b"early")
    engine.put("a/4", b"from here")
    assert [e.kv.key for e in engine.read_events(future)] == ["a/4"]


class _FullLog:
    """Persistence hooks that fail while ``full`` (a log that cannot be written)."""

    def __init__(self, engine: MemoryEngine) -> None:
        self.full = False
        self.records: list[object] = []
        engine.on_commit.append(self.record)
        engine.on_lease.append(self.record)
        engine.on_compact.append(self.record)

    def record(self, change: object) -> None:
        if self.full:
            raise OSError(28, "No space left on device")
        self.records.append(change)


def _image(engine: MemoryEngine) -> tuple[object, ...]:
    state = engine.export_state()
    leases = sorted((s.id, s.keys) for s in engine.leases())
    return (state.revision, state.compact_revision, state.kvs, state.history, leases, state.leases)


def test_a_vetoed_write_leaves_no_trace() -> None:
    async def main() -> None:
        engine = MemoryEngine()
        log = _FullLog(engine)
        lease = engine.lease_grant(60).id
        other = engine.lease_grant(60).id
        engine.put("a", b"1", lease)
        engine.put("b", b"2")
        engine.put("p/1", b"x", other)
        engine.put("p/2", b"y")
        watcher = engine.add_watcher("", None, owner=None)
        before, records = _image(engine), len(log.records)
        log.full = True
        vetoed: list[Callable[[], object]] = [
            lambda: engine.put("a", b"new", other),  # moves a key to another lease
            lambda: engine.put("c", b"new"),  # a new key
            lambda: engine.delete("b"),
            lambda: engine.delete("p/", prefix=True),
            lambda: engine.compare_and_swap("b", 2, b"cas"),
            lambda: engine.compare_and_delete("a", 1),
            lambda: engine.add("n", 1),
            lambda: engine.lease_grant(5),
            lambda: engine.lease_revoke(lease),
            lambda: engine.compact(3),
        ]
        for write in vetoed:
            with pytest.raises(OSError, match="No space"):
                write()
            assert _image(engine) == before
        assert engine.read_events(watcher) == []
        assert len(log.records) == records
        log.full = False  # the log takes writes again: revisions and lease ids go on from there
        assert engine.put("c", b"3") == before[0] + 1  # type: ignore[operator]
        assert engine.lease_grant(5).id == other + 1
        assert [e.kv.key for e in engine.read_events(watcher)] == ["c"]
        engine.lease_revoke(lease)
        assert engine.get("a") is None

    run_virtual(main)


def test_a_lease_whose_expiry_cannot_be_recorded_lives_until_it_can() -> None:
    async def main() -> None:
        engine = MemoryEngine()
        log = _FullLog(engine)
        lease = engine.lease_grant(2).id
        engine.put("k", b"v", lease)
        log.full = True
        await anyio.sleep(10)
        assert engine.get("k") is not None  # its deletion was not recorded, so not made
        assert engine.lease_time_to_live(lease).keys == ("k",)
        log.full = False
        await anyio.sleep(1.5)  # tried again a second later
        assert engine.get("k") is None
        assert engine.lease_count == 0

    run_virtual(main)


def test_compares_hold_says_which_branch_a_transaction_runs() -> None:
    """``compares_hold`` (the session server decodes only the branch it names) answers what
    ``txn`` then finds, for every target, an absent key and no compares at all."""
    engine = MemoryEngine()
    engine.put("k", b"v")
    cases = [
        (Compare.version("k") == 1,),
        (Compare.version("k") > 1,),
        (Compare.value("k") == b"v", Compare.mod_revision("k") == 1),
        (Compare.value("k") == b"v", Compare.mod_revision("k") != 1),
        (Compare.create_revision("gone") == 0,),
        (Compare.value("gone") == b"",),
        (),
    ]
    said = [engine.compares_hold(compares) for compares in cases]
    assert said == [True, False, True, False, True, False, True]
    for compares, holds in zip(cases, said, strict=True):
        result = engine.txn(Txn(compares, (Put("s", b"1"),), (Put("f", b"1"),)))
        assert result.succeeded is holds


def test_the_events_reader_is_read_events_itself() -> None:
    """``events_reader()`` (the session server's per-event read, without the facade's call):
    the same events, the same cursor, the same CompactedError as :meth:`read_events`."""
    engine = MemoryEngine(history_limit=4)
    read = engine.events_reader()
    watcher = engine.add_watcher("a/", None, owner=None)
    engine.put("a/1", b"x")
    engine.put("b/1", b"y")  # not its prefix
    engine.put("a/2", b"x")
    assert [e.kv.key for e in read(watcher)] == ["a/1", "a/2"]
    assert engine.read_events(watcher) == []  # one cursor: the reader advanced it
    engine.put("a/3", b"x")
    assert [e.kv.key for e in engine.read_events(watcher)] == ["a/3"]
    assert read(watcher) == []
    lagging = engine.add_watcher("a/", 1, owner=None)
    for i in range(10):
        engine.put(f"a/{i}", b"z")
    with pytest.raises(CompactedError):
        read(lagging)
