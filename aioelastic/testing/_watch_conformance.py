"""The watch part of the store conformance suite: order, resumption, many watchers, compaction,
``range_and_watch`` and cancellation, mixed into
:class:`~aioelastic.testing.conformance.StoreConformance` so that every backend runs it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any, ClassVar

import anyio
import pytest

from ..errors import CompactedError
from ..store import EventType, KeyValue, Store
from ._conformance_kit import collect, conformance_test, next_event

__all__ = ["WatchConformance"]


class WatchConformance:
    """Watches on every backend; the compaction tests need the ``compaction`` feature."""

    #: How long (s) a watch sits idle in the idle-watch test (StoreConformance sets it).
    watch_idle: ClassVar[float]

    # -- watches

    @conformance_test()
    async def test_watch_delivers_changes_in_order(self, store: Store) -> None:
        async with store.watch("w/") as events:
            r1 = await store.put("w/a", b"1")
            await store.put("other", b"ignored")
            r2 = await store.put("w/b", b"2")
            r3 = await store.put("w/a", b"3")
            await store.delete("w/b")
            got = await collect(events, 4)
        assert [(e.type, e.kv.key) for e in got] == [
            (EventType.PUT, "w/a"),
            (EventType.PUT, "w/b"),
            (EventType.PUT, "w/a"),
            (EventType.DELETE, "w/b"),
        ]
        assert [e.revision for e in got[:3]] == [r1, r2, r3]
        assert got[2].kv == KeyValue("w/a", b"3", r1, r3, 2, 0)
        assert got[3].revision == r3 + 1
        assert all(a.revision < b.revision for a, b in itertools.pairwise(got))

    @conformance_test()
    async def test_a_watch_idle_past_its_progress_interval_sees_the_next_write(
        self, store: Store
    ) -> None:
        """A watch that sat idle long enough for progress reports (the revision moving on under
        other keys meanwhile) still delivers the next write to its prefix, once; every other test
        writes soon after it watches, so it depended on machine load whether any saw this."""
        async with store.watch("w/") as events:
            await store.put("elsewhere", b"1")
            await anyio.sleep(self.watch_idle)
            await store.put("elsewhere", b"2")
            await anyio.sleep(self.watch_idle)
            revision = await store.put("w/a", b"1")
            event = await next_event(events)
            assert (event.kv.key, event.kv.mod_revision) == ("w/a", revision)
            second = await store.put("w/b", b"2")
            assert (await next_event(events)).kv.mod_revision == second

    @conformance_test()
    async def test_watch_resumes_from_a_revision(self, store: Store) -> None:
        revisions = [await store.put(f"r/{i}", str(i).encode()) for i in range(5)]
        async with store.watch("r/", start_revision=revisions[2]) as events:
            assert events.start_revision == revisions[2]
            replay = await collect(events, 3)
            assert [e.kv.key for e in replay] == ["r/2", "r/3", "r/4"]
            live = await store.put("r/5", b"5")
            assert (await next_event(events)).revision == live

    @conformance_test()
    async def test_watch_from_the_future_waits_for_that_revision(self, store: Store) -> None:
        now = await store.current_revision()
        async with store.watch("f/", start_revision=now + 3) as events:
            await store.put("f/1", b"skipped")
            await store.put("f/2", b"skipped")
            r3 = await store.put("f/3", b"seen")
            event = await next_event(events)
        assert (event.kv.key, event.revision) == ("f/3", r3)

    @conformance_test()
    async def test_many_watchers_each_see_every_event(self, store: Store) -> None:
        watches = [store.watch("m/") for _ in range(20)]
        for w in watches:
            await w.start()
        try:
            for i in range(10):
                await store.put(f"m/{i % 3}", str(i).encode())
            for w in watches:
                got = await collect(w, 10)
                assert [e.kv.value for e in got] == [str(i).encode() for i in range(10)]
        finally:
            for w in watches:
                await w.aclose()

    @conformance_test(requires="compaction")
    async def test_watch_below_the_compacted_revision_raises(self, store: Store) -> None:
        revisions = [await store.put("c/k", str(i).encode()) for i in range(4)]
        await store.compact(revisions[2])
        with pytest.raises(CompactedError) as info:
            async with store.watch("c/", start_revision=revisions[0]) as events:
                await next_event(events)
        assert info.value.compact_revision >= revisions[2]
        async with store.watch("c/", start_revision=revisions[3]) as events:
            assert (await next_event(events)).revision == revisions[3]

    @conformance_test(requires="compaction")
    async def test_a_caught_up_watch_survives_compaction_of_other_keys(self, store: Store) -> None:
        # A watch with nothing unread under its prefix loses nothing when history it has no use
        # for is compacted (etcd keeps such "synced" watchers); it sees the next write.
        async with store.watch("cw/") as events:
            for i in range(5):
                last = await store.put(f"other/{i}", b"x")
            await store.compact(last)
            written = await store.put("cw/k", b"seen")
            event = await next_event(events)
        assert (event.kv.key, event.revision) == ("cw/k", written)

    @conformance_test()
    async def test_closing_a_watch_ends_iteration(self, store: Store) -> None:
        events = store.watch("x/")
        await events.start()
        await events.aclose()
        with pytest.raises(StopAsyncIteration):
            await events.__anext__()

    @conformance_test()
    async def test_range_and_watch_reads_then_follows(self, store: Store) -> None:
        await store.put("rw/a", b"1")
        await store.put("rw/b", b"2")
        await store.put("rw-not/x", b"x")
        result, watch = await store.range_and_watch("rw/")
        async with watch:
            assert [(kv.key, kv.value) for kv in result] == [("rw/a", b"1"), ("rw/b", b"2")]
            assert (result.count, result.more) == (2, False)
            assert watch.start_revision == result.revision + 1
            written = await store.put("rw/c", b"3")
            await store.delete("rw/a")
            events = await collect(watch, 2)
        assert [(e.type, e.kv.key) for e in events] == [
            (EventType.PUT, "rw/c"),
            (EventType.DELETE, "rw/a"),
        ]
        assert events[0].revision == written

    @conformance_test()
    async def test_range_and_watch_under_concurrent_writes_misses_and_repeats_nothing(
        self, store: Store
    ) -> None:
        async def writer() -> None:
            for i in range(40):
                await store.put(f"rwc/{i:02d}", b"v")

        task = asyncio.ensure_future(writer())
        await asyncio.sleep(0)
        result, watch = await store.range_and_watch("rwc/")
        async with watch:
            await task
            read = {kv.key for kv in result}
            later = [await next_event(watch) for _ in range(40 - len(read))]
        assert all(event.revision > result.revision for event in later)
        assert read.isdisjoint(event.kv.key for event in later)
        assert read | {event.kv.key for event in later} == {f"rwc/{i:02d}" for i in range(40)}

    @conformance_test()
    async def test_a_cancelled_read_loses_no_event(self, store: Store) -> None:
        # A read cancelled at any moment around an event's arrival either returned the event or
        # left it for the next read: callers race reads against other waits and cancel them.
        async with store.watch("cr/") as events:
            for i in range(24):
                reader = asyncio.ensure_future(events.__anext__())
                await asyncio.sleep(0)
                await store.put(f"cr/{i}", b"x")
                for _ in range(i % 6):
                    await asyncio.sleep(0)
                reader.cancel()
                got = []
                with contextlib.suppress(asyncio.CancelledError):
                    got.append(await reader)
                if not got:
                    got.append(await next_event(events))
                assert [event.kv.key for event in got] == [f"cr/{i}"]

    @conformance_test()
    async def test_cancelling_a_pending_watch_leaves_no_task(self, store: Store) -> None:
        await store.current_revision()  # the client's own connection tasks (if any) exist now
        baseline = set(asyncio.all_tasks())

        async def consume() -> None:
            async with store.watch("pending/") as events:
                await events.__anext__()

        with anyio.move_on_after(0.2):
            await consume()
        waiter = asyncio.ensure_future(store.wait_for(["pending/never"]))
        await asyncio.sleep(0.05)
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        await _settle(baseline)
        assert set(asyncio.all_tasks()) <= baseline
        await store.put("pending/after", b"still usable")
        assert (await store.get("pending/after")) is not None


async def _settle(baseline: set[asyncio.Task[Any]], rounds: int = 50) -> None:
    """Give cancelled tasks a few loop iterations to finish."""
    for _ in range(rounds):
        if set(asyncio.all_tasks()) <= baseline:
            return
        await asyncio.sleep(0.01)
