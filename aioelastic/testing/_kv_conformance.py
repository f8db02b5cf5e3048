"""The key-value part of the store conformance suite: revisions, key-values, compare-and-swap,
ranges, deletes and ``add``, mixed into :class:`~aioelastic.testing.conformance.StoreConformance`
so that every backend runs it."""

from __future__ import annotations

import contextlib

import anyio
import pytest

from ..store import EventType, KeyValue, PrefixedStore, Store
from ._conformance_kit import collect, conformance_test, next_event
from ._keys import UNUSUAL_KEYS

__all__ = ["KvConformance"]


class KvConformance:
    """Reads and writes on every backend: revisions, key-value fields, compare-and-swap, ranges,
    deletes and ``add`` (also across two clients)."""

    client: Store

    def open_peer(self, client: Store) -> contextlib.AbstractAsyncContextManager[Store]:
        raise NotImplementedError  # pragma: no cover - StoreConformance provides it

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
