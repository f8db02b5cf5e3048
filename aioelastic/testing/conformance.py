"""The store conformance suite: one set of tests that every :class:`~aioelastic.store.Store`
backend must pass, importable by third-party backends.

Subclass :class:`StoreConformance` in a pytest module, name it ``Test...``, and implement
:meth:`~StoreConformance.open_store`::

    class TestMyStore(StoreConformance):
        features = frozenset({"compaction"})   # optional features the backend has
        short_ttl = 1.0                        # a lease TTL (s) the backend honours

        @contextlib.asynccontextmanager
        async def open_store(self):
            async with MyStore(...) as store:
                yield store

Each test runs in its own event loop (a virtual-time loop when ``virtual_time = True``, for
in-process backends), inside a fresh namespace of the store, so a shared server is fine. Tests of
a feature the backend does not declare are skipped with a reason, never silently passed. The
suite needs pytest (``aioelastic[test]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar, TypeVar

import anyio
import pytest

from ..errors import (
    CompactedError,
    LeaseExpiredError,
    LeaseNotFoundError,
    StoreClosedError,
    StoreTimeoutError,
)
from ..store import EventType, KeyValue, MemoryStore, Store, open_store
from ..store._base import ALL_FEATURES
from ..store._prefixed import PrefixedStore
from ._conformance_kit import _Body, collect, conformance_test, next_event
from ._keys import UNUSUAL_KEYS
from ._stm_conformance import StmConformance
from ._txn_conformance import TxnConformance
from ._virtual_time import virtual_time_loop

__all__ = ["ALL_FEATURES", "StoreConformance"]

T = TypeVar("T")


class StoreConformance(TxnConformance, StmConformance):
    """The suite. Subclasses implement :meth:`open_store` and may set the class attributes."""

    #: Optional features of the backend (see ``aioelastic.store._base.ALL_FEATURES``).
    features: ClassVar[frozenset[str]] = ALL_FEATURES
    #: A lease TTL in seconds that the backend honours; lease tests wait a few of these.
    short_ttl: ClassVar[float] = 1.0
    #: Run each test on a virtual-time loop (only for backends with no real I/O).
    virtual_time: ClassVar[bool] = False
    #: How long (s) a watch sits idle in the idle-watch test: past a few of the backend's
    #: progress intervals, if it has them (the http suite's is 0.5 s).
    watch_idle: ClassVar[float] = 2.0
    #: The connected client a test's store belongs to (set while the test runs).
    client: Store
    #: Bound on each test, in (loop) seconds.
    test_timeout: ClassVar[float] = 60.0

    def open_store(self) -> contextlib.AbstractAsyncContextManager[Store]:
        """An async context manager yielding a connected store client (closed on exit)."""
        raise NotImplementedError("subclasses of StoreConformance implement open_store()")

    @contextlib.asynccontextmanager
    async def open_peer(self, client: Store) -> AsyncIterator[Store]:
        """A second client of the same store as ``client`` (for tests of two clients at once).

        The default is another client of the same engine for a :class:`MemoryStore`, else
        another :meth:`open_store`; a backend whose clients do not share a store that way
        overrides it (the tests check that the two see each other's writes)."""
        if isinstance(client, MemoryStore):
            async with MemoryStore(client.engine) as peer:
                yield peer
            return
        async with self.open_store() as peer:
            yield peer

    # -- running

    def run(self, body: _Body, *, namespaced: bool = True) -> None:
        factory = virtual_time_loop if self.virtual_time else None
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(self._run(body, namespaced))

    async def _run(self, body: _Body, namespaced: bool) -> None:
        with anyio.fail_after(self.test_timeout):
            async with self.open_store() as client:
                self.client = client
                store = (
                    client.namespace(f"conformance/{uuid.uuid4().hex}/") if namespaced else client
                )
                await body(self, store)

    # -- revisions and key-values

    @conformance_test()
    async def test_revision_increases_by_one_per_write(self, store: Store) -> None:
        start = await store.current_revision()
        r1 = await store.put("a", b"1")
        r2 = await store.put("b", b"2")
        r3 = await store.put("a", b"3")
        assert r1 > start
        assert (r2, r3) == (r1 + 1, r1 + 2)
        assert await store.current_revision() >= r3

    @conformance_test()
    async def test_noop_writes_do_not_bump_the_revision(self, store: Store) -> None:
        rev = await store.put("k", b"v")
        assert await store.delete("absent") == 0
        assert await store.delete_prefix("nothing-here/") == 0
        failed = await store.compare_and_swap("k", rev + 100, b"x")
        assert not failed.succeeded
        after = await store.put("k2", b"v")
        assert after == rev + 1

    @conformance_test()
    async def test_key_value_fields(self, store: Store) -> None:
        r1 = await store.put("k", b"one")
        r2 = await store.put("k", b"two")
        kv = await store.get("k")
        assert kv == KeyValue("k", b"two", r1, r2, 2, 0)
        await store.delete("k")
        assert await store.get("k") is None
        r4 = await store.put("k", b"three")
        assert await store.get("k") == KeyValue("k", b"three", r4, r4, 1, 0)

    @conformance_test()
    async def test_values_are_bytes_exactly(self, store: Store) -> None:
        every_byte = bytes(range(256)) * 4
        await store.put("bin", every_byte)
        await store.put("empty", b"")
        await store.put("big", b"x" * 65536)
        await store.put("unicode/ключ/🔑", "значение".encode())
        assert (await store.get("bin")).value == every_byte  # type: ignore[union-attr]
        assert (await store.get("empty")).value == b""  # type: ignore[union-attr]
        assert len((await store.get("big")).value) == 65536  # type: ignore[union-attr]
        assert (await store.get("unicode/ключ/🔑")).text() == "значение"  # type: ignore[union-attr]

    @conformance_test()
    async def test_unusual_keys_round_trip_through_every_operation(self, store: Store) -> None:
        """Newlines, NUL, URL syntax, dot segments, astral characters: every key the protocol
        allows works on every operation (an HTTP router once answered 404 on a newline)."""
        grant = await store.lease_grant(60)
        for key in UNUSUAL_KEYS:
            written = await store.put(key, b"1", lease=grant.id)
            assert await store.get(key) == KeyValue(key, b"1", written, written, 1, grant.id), key
            assert [kv.key for kv in await store.range(key)] == [key], key
            async with store.watch(key, start_revision=written) as events:
                assert (await next_event(events)).kv.key == key
            swapped = await store.compare_and_swap(key, written, b"2")
            assert swapped.succeeded, key
            assert not (await store.compare_and_delete(key, written)).succeeded, key
            assert (await store.compare_and_delete(key, swapped.revision)).succeeded, key
            assert await store.add(key, 5) == 5, key
            assert await store.add(key, -2) == 3, key
            assert await store.delete(key) == 1, key
            assert await store.get(key) is None, key
            await store.put(key, b"3", lease=grant.id)
            assert key in (await store.lease_time_to_live(grant.id)).keys, key
            assert await store.delete_prefix(key) == 1, key
        await store.lease_revoke(grant.id)
        assert len(await store.range("")) == 0

    @conformance_test()
    async def test_get_absent_is_none(self, store: Store) -> None:
        assert await store.get("nope") is None

    # -- compare-and-swap

    @conformance_test()
    async def test_cas_only_if_absent(self, store: Store) -> None:
        created = await store.compare_and_swap("k", 0, b"first")
        assert created.succeeded
        assert created.kv is not None
        assert (created.kv.value, created.kv.version) == (b"first", 1)
        assert created.kv.mod_revision == created.revision
        again = await store.compare_and_swap("k", 0, b"second")
        assert not again.succeeded
        assert again.kv == created.kv
        assert (await store.get("k")).value == b"first"  # type: ignore[union-attr]

    @conformance_test()
    async def test_cas_matching_and_stale_revision(self, store: Store) -> None:
        r1 = await store.put("k", b"v1")
        ok = await store.compare_and_swap("k", r1, b"v2")
        assert ok.succeeded
        assert ok.kv is not None
        assert (ok.kv.value, ok.kv.version, ok.kv.create_revision) == (b"v2", 2, r1)
        stale = await store.compare_and_swap("k", r1, b"v3")
        assert not stale.succeeded
        assert stale.kv == ok.kv
        assert stale.revision == ok.revision
        absent = await store.compare_and_swap("missing", r1, b"x")
        assert not absent.succeeded
        assert absent.kv is None
        assert await store.get("missing") is None

    @conformance_test()
    async def test_compare_and_delete(self, store: Store) -> None:
        r1 = await store.put("k", b"v")
        await store.put("k", b"w")
        stale = await store.compare_and_delete("k", r1)
        assert not stale.succeeded
        assert stale.kv is not None
        assert stale.kv.value == b"w"
        current = stale.kv.mod_revision
        done = await store.compare_and_delete("k", current)
        assert done.succeeded
        assert done.kv is None
        assert await store.get("k") is None
        gone = await store.compare_and_delete("k", current)
        assert not gone.succeeded
        assert gone.kv is None

    # -- ranges and deletes

    @conformance_test()
    async def test_range_prefix_order_and_limit(self, store: Store) -> None:
        keys = ["p/b", "p/a", "p/c/1", "p/ä", "p/c", "p0", "o", "p/A"]
        for key in keys:
            await store.put(key, key.encode())
        result = await store.range("p/")
        expected = sorted(k for k in keys if k.startswith("p/"))
        assert [kv.key for kv in result] == expected
        assert [kv.value for kv in result] == [k.encode() for k in expected]
        assert result.count == len(expected)
        assert not result.more
        assert result.revision == await store.current_revision()
        limited = await store.range("p/", limit=2)
        assert [kv.key for kv in limited] == expected[:2]
        assert limited.more
        assert limited.count == len(expected)
        assert len(await store.range("zz/")) == 0
        everything = await store.range("")
        assert [kv.key for kv in everything] == sorted(keys)

    @conformance_test()
    async def test_delete_counts_and_one_revision(self, store: Store) -> None:
        for i in range(5):
            await store.put(f"d/{i}", b"x")
        await store.put("keep", b"x")
        assert await store.delete("d/0") == 1
        assert await store.delete("d/0") == 0
        before = await store.current_revision()
        async with store.watch("d/") as events:
            assert await store.delete_prefix("d/") == 4
            deleted = await collect(events, 4)
        assert {e.type for e in deleted} == {EventType.DELETE}
        assert sorted(e.kv.key for e in deleted) == [f"d/{i}" for i in range(1, 5)]
        assert {e.revision for e in deleted} == {before + 1}
        assert len(await store.range("d/")) == 0
        assert await store.get("keep") is not None

    # -- add

    @conformance_test()
    async def test_add_is_exact_under_concurrency(self, store: Store) -> None:
        async def worker() -> None:
            for _ in range(5):
                await store.add("counter", 1)

        async with anyio.create_task_group() as tg:
            for _ in range(100):
                tg.start_soon(worker)
        assert (await store.get("counter")).value == b"500"  # type: ignore[union-attr]
        assert await store.add("counter", -501) == -1
        assert await store.add("fresh") == 1

    @conformance_test()
    async def test_add_is_exact_across_clients(self, store: Store) -> None:
        """Two clients adding to one key at once: each add applies once, and returns a total no
        other add returned (a client-side lock cannot hide a lost update here)."""
        returned: list[int] = []
        async with self.open_peer(self.client) as peer:
            other = peer.namespace(store.prefix) if isinstance(store, PrefixedStore) else peer

            async def worker(client: Store) -> None:
                for _ in range(10):
                    returned.append(await client.add("counter", 1))

            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(worker, store if i % 2 else other)
        assert sorted(returned) == list(range(1, 201))
        assert (await store.get("counter")).value == b"200"  # type: ignore[union-attr]

    @conformance_test()
    async def test_add_on_a_non_integer_value_is_a_value_error(self, store: Store) -> None:
        await store.put("text", b"hello")
        with pytest.raises(ValueError, match="text"):
            await store.add("text", 1)
        assert (await store.get("text")).value == b"hello"  # type: ignore[union-attr]

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

    # -- leases

    @conformance_test()
    async def test_lease_expiry_deletes_keys_and_watchers_see_it(self, store: Store) -> None:
        grant = await store.lease_grant(self.short_ttl)
        assert grant.ttl >= self.short_ttl
        r1 = await store.put("l/a", b"1", lease=grant.id)
        await store.put("l/b", b"2", lease=grant.id)
        assert (await store.get("l/a")) == KeyValue("l/a", b"1", r1, r1, 1, grant.id)
        status = await store.lease_time_to_live(grant.id)
        assert sorted(status.keys) == ["l/a", "l/b"]
        assert 0 < status.remaining <= grant.ttl
        async with store.watch("l/") as events:
            gone = await collect(events, 2, timeout=grant.ttl * 3 + 5)
        assert {(e.type, e.kv.key) for e in gone} == {
            (EventType.DELETE, "l/a"),
            (EventType.DELETE, "l/b"),
        }
        assert gone[0].revision == gone[1].revision
        assert await store.get("l/a") is None
        with pytest.raises(LeaseNotFoundError):
            await store.lease_time_to_live(grant.id)

    @conformance_test()
    async def test_keep_alive_extends_and_revoke_deletes(self, store: Store) -> None:
        grant = await store.lease_grant(self.short_ttl)
        await store.put("k", b"v", lease=grant.id)
        loop = asyncio.get_running_loop()
        until = loop.time() + grant.ttl * 2.5
        while loop.time() < until:
            await anyio.sleep(grant.ttl / 4)
            assert await store.lease_keep_alive(grant.id) >= self.short_ttl
        assert await store.get("k") is not None
        await store.lease_revoke(grant.id)
        assert await store.get("k") is None
        with pytest.raises(LeaseNotFoundError):
            await store.lease_keep_alive(grant.id)
        with pytest.raises(LeaseNotFoundError):
            await store.lease_revoke(grant.id)

    @conformance_test()
    async def test_put_with_an_unknown_lease_fails(self, store: Store) -> None:
        grant = await store.lease_grant(self.short_ttl)
        await store.lease_revoke(grant.id)
        with pytest.raises(LeaseNotFoundError):
            await store.put("k", b"v", lease=grant.id)
        assert await store.get("k") is None

    @conformance_test()
    async def test_rewriting_a_key_without_its_lease_detaches_it(self, store: Store) -> None:
        grant = await store.lease_grant(self.short_ttl)
        await store.put("k", b"leased", lease=grant.id)
        await store.put("k", b"free")
        await store.lease_revoke(grant.id)
        kv = await store.get("k")
        assert kv is not None
        assert (kv.value, kv.lease) == (b"free", 0)

    @conformance_test(requires="fractional_ttl")
    async def test_fractional_ttl_is_honoured(self, store: Store) -> None:
        grant = await store.lease_grant(0.25)
        assert grant.ttl == 0.25
        await store.put("k", b"v", lease=grant.id)
        async with store.watch("k") as events:
            event = await next_event(events, timeout=5)
        assert event.type is EventType.DELETE

    @conformance_test()
    async def test_lease_keeper_keeps_and_reports_loss(self, store: Store) -> None:
        async with store.lease(self.short_ttl) as keeper:
            await store.put("held", b"v", lease=keeper.id)
            await anyio.sleep(keeper.ttl * 2)
            assert await store.get("held") is not None
            assert not keeper.lost
            await store.lease_revoke(keeper.id)  # someone else revokes it
            with anyio.fail_after(keeper.ttl * 2 + 5):
                error = await keeper.wait_lost()
            assert isinstance(error, LeaseExpiredError)
            with pytest.raises(LeaseExpiredError), keeper.guard():
                await anyio.sleep(keeper.ttl * 10)
        assert await store.get("held") is None

    @conformance_test()
    async def test_lease_keeper_revokes_on_exit(self, store: Store) -> None:
        async with store.lease(self.short_ttl) as keeper:
            await store.put("held", b"v", lease=keeper.id)
        assert await store.get("held") is None

    # -- conveniences

    @conformance_test()
    async def test_wait_for_keys(self, store: Store) -> None:
        await store.put("ready/a", b"a")

        async def later() -> None:
            await anyio.sleep(0.05)
            await store.put("ready/b", b"b")

        async with anyio.create_task_group() as tg:
            tg.start_soon(later)
            found = await store.wait_for(["ready/a", "ready/b"], timeout=10)
        assert {k: kv.value for k, kv in found.items()} == {"ready/a": b"a", "ready/b": b"b"}
        with pytest.raises(StoreTimeoutError, match="ready/never"):
            await store.wait_for(["ready/a", "ready/never"], timeout=0.1)

    @conformance_test()
    async def test_namespaces_isolate_keys(self, store: Store) -> None:
        one, two = store.namespace("one/"), store.namespace("two/")
        await one.put("k", b"1")
        await two.put("k", b"2")
        assert (await one.get("k")).value == b"1"  # type: ignore[union-attr]
        assert [kv.key for kv in await store.range("")] == ["one/k", "two/k"]
        async with two.watch("") as events:
            await one.put("x", b"not seen")
            await two.put("x", b"seen")
            event = await next_event(events)
        assert (event.kv.key, event.kv.value) == ("x", b"seen")

    # -- errors

    @conformance_test(namespaced=False)
    async def test_a_closed_store_raises_closed(self, store: Store) -> None:
        events = store.watch("closing/")
        await events.start()

        async def pending() -> BaseException | None:
            try:
                await events.__anext__()
            except (StoreClosedError, StopAsyncIteration) as exc:
                return exc
            return None

        task = asyncio.ensure_future(pending())
        await asyncio.sleep(0.05)
        await store.aclose()
        with anyio.fail_after(10):
            outcome = await task
        assert isinstance(outcome, (StoreClosedError, StopAsyncIteration))
        for call in (
            store.get("k"),
            store.put("k", b"v"),
            store.range(""),
            store.delete("k"),
            store.compare_and_swap("k", 0, b"v"),
            store.add("k"),
            store.lease_grant(5),
            store.current_revision(),
        ):
            with pytest.raises(StoreClosedError):
                await call
        with pytest.raises(StoreClosedError):
            store.watch("k")
        await store.aclose()  # idempotent

    @conformance_test()
    async def test_bad_arguments_name_the_argument(self, store: Store) -> None:
        bad: list[tuple[Callable[[], Awaitable[object]], type[Exception], str]] = [
            (lambda: store.put("", b"v"), ValueError, "key"),
            (lambda: store.put(b"k", b"v"), TypeError, "key"),  # type: ignore[arg-type]
            (lambda: store.put("k", "text"), TypeError, "value"),  # type: ignore[arg-type]
            (lambda: store.put("k", 5), TypeError, "value"),  # type: ignore[arg-type]
            (lambda: store.get(""), ValueError, "key"),
            (lambda: store.range("p", limit=0), ValueError, "limit"),
            (lambda: store.compare_and_swap("k", -1, b"v"), ValueError, "expected_mod_revision"),
            (lambda: store.lease_grant(0), ValueError, "ttl"),
            (lambda: store.lease_grant(-1), ValueError, "ttl"),
            (lambda: store.lease_grant(math.nan), ValueError, "ttl"),
            (lambda: store.lease_grant("5"), TypeError, "ttl"),  # type: ignore[arg-type]
            (lambda: store.add("k", 1.5), TypeError, "delta"),  # type: ignore[arg-type]
            (lambda: store.wait_for(["k"], timeout=-1), ValueError, "timeout"),
            (lambda: open_store("not a url"), ValueError, "url"),
            (lambda: open_store("nosuchscheme://x"), ValueError, "scheme"),
        ]
        for call, error, word in bad:
            with pytest.raises(error, match=word):
                await call()
        with pytest.raises(ValueError, match="start_revision"):
            store.watch("p", start_revision=0)
        assert len(await store.range("")) == 0  # nothing was written


async def _settle(baseline: set[asyncio.Task[Any]], rounds: int = 50) -> None:
    """Give cancelled tasks a few loop iterations to finish."""
    for _ in range(rounds):
        if set(asyncio.all_tasks()) <= baseline:
            return
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def memory_store() -> AsyncIterator[Store]:  # pragma: no cover - convenience for users
    async with open_store("memory://") as store:
        yield store
