"""Memory-backend specifics beyond the conformance suite: bounded history, lagging watches,
lease expiry precision, and many leases, all in virtual time."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from aioelastic.errors import CompactedError, StoreClosedError
from aioelastic.store import EventType, MemoryEngine, MemoryStore
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
    assert watcher.hits == []
    assert engine.read_events(watcher) == []
    # a watcher that starts in the past scans the log once, then is tracked
    past = engine.add_watcher("b/", 1, owner=None)
    assert past.hits is None
    assert len(engine.read_events(past)) == 1000
    assert past.hits == []
    engine.put("b/late", b"z")
    assert [e.kv.key for e in engine.read_events(past)] == ["b/late"]
    # one that starts at a future revision is tracked but sees nothing before it
    future = engine.add_watcher("a/", engine.revision + 2, owner=None)
    engine.put("a/3", b"early")
    engine.put("a/4", b"from here")
    assert [e.kv.key for e in engine.read_events(future)] == ["a/4"]
