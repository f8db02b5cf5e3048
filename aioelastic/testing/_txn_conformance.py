"""The transaction part of the store conformance suite (``store.txn``, ``store.stm`` and what is
built on them), mixed into :class:`~aioelastic.testing.conformance.StoreConformance` so that
every backend runs it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import pytest

from ..errors import LeaseNotFoundError, TxnTooLargeError
from ..store import (
    MAX_TXN_OPS,
    Compare,
    Delete,
    DeletePrefix,
    DeleteResult,
    EventType,
    Get,
    GetResult,
    KeyValue,
    PrefixedStore,
    Put,
    PutResult,
    Range,
    RangeResult,
    Store,
)
from ._conformance_kit import collect, conformance_test
from ._keys import UNUSUAL_KEYS

__all__ = ["TxnConformance"]


class TxnConformance:
    """Transactions on every backend: each compare kind, both branches, every operation, the
    limits, events at one revision, and transactions under concurrent writers."""

    client: Store

    def open_peer(self, client: Store) -> contextlib.AbstractAsyncContextManager[Store]:
        raise NotImplementedError  # pragma: no cover - StoreConformance provides it

    @contextlib.asynccontextmanager
    async def peer(self, store: Store) -> AsyncIterator[Store]:
        """A second client seeing what ``store`` sees (same namespace)."""
        async with self.open_peer(self.client) as other:
            peer = other.namespace(store.prefix) if isinstance(store, PrefixedStore) else other
            probe = await store.put("peer-probe", b"?")
            if (await peer.get("peer-probe")) is None:
                pytest.fail(
                    "open_peer() returned a client of another store (it does not see this "
                    "client's writes): override open_peer() to open a second client of the same "
                    "store"
                )
            await store.compare_and_delete("peer-probe", probe)
            yield peer

    @conformance_test()
    async def test_txn_each_compare_kind_picks_the_branch(self, store: Store) -> None:
        lease = await store.lease_grant(60)
        r1 = await store.put("k", b"m", lease=lease.id)
        r2 = await store.put("k", b"m")
        r3 = await store.put("leased", b"x", lease=lease.id)
        cases = [
            (Compare.value("k") == b"m", Compare.value("k") == b"n"),
            (Compare.value("k") != b"n", Compare.value("k") != b"m"),
            (Compare.value("k") < b"n", Compare.value("k") < b"m"),
            (Compare.value("k") > b"l", Compare.value("k") > b"m"),
            (Compare.version("k") == 2, Compare.version("k") == 1),
            (Compare.version("k") != 1, Compare.version("k") != 2),
            (Compare.version("k") > 1, Compare.version("k") > 2),
            (Compare.version("k") < 3, Compare.version("k") < 2),
            (Compare.create_revision("k") == r1, Compare.create_revision("k") == r2),
            (Compare.create_revision("k") < r2, Compare.create_revision("k") > r1),
            (Compare.mod_revision("k") == r2, Compare.mod_revision("k") == r1),
            (Compare.mod_revision("k") > r1, Compare.mod_revision("k") < r2),
            (Compare.lease("leased") == lease.id, Compare.lease("leased") == 0),
            (Compare.lease("k") == 0, Compare.lease("k") != 0),
            (Compare.version("absent") == 0, Compare.version("absent") > 0),
            (Compare.mod_revision("absent") == 0, Compare.create_revision("absent") != 0),
            (Compare.lease("absent") == 0, Compare.value("absent") != b"x"),
        ]
        for holds, fails in cases:
            assert (await store.txn(compare=[holds])).succeeded, holds
            assert not (await store.txn(compare=[fails])).succeeded, fails
            assert not (await store.txn(compare=[holds, fails])).succeeded, (holds, fails)
        assert (await store.txn()).succeeded  # no compare: true
        assert await store.current_revision() == r3  # reads only: the revision stayed
        await store.lease_revoke(lease.id)

    @conformance_test()
    async def test_txn_success_branch_applies_every_operation_at_one_revision(
        self, store: Store
    ) -> None:
        lease = await store.lease_grant(60)
        r1 = await store.put("old", b"1")
        await store.put("gone", b"x")
        await store.put("dir/a", b"a")
        await store.put("dir/b", b"b")
        result = await store.txn(
            compare=[Compare.value("old") == b"1"],
            success=[
                Put("old", b"2"),
                Put("new", b"n", lease=lease.id),
                Get("old"),
                Get("missing"),
                Delete("gone"),
                Delete("never"),
                DeletePrefix("dir/"),
                Range(""),
                Range("", limit=1),
            ],
            failure=[Get("old")],
        )
        rev = r1 + 4
        assert result.succeeded
        assert bool(result)
        assert result.revision == rev == await store.current_revision()
        old = KeyValue("old", b"2", r1, rev, 2, 0)
        new = KeyValue("new", b"n", rev, rev, 1, lease.id)
        assert result.results == (
            PutResult(old, KeyValue("old", b"1", r1, r1, 1, 0)),
            PutResult(new, None),
            GetResult(old),
            GetResult(None),
            DeleteResult(1),
            DeleteResult(0),
            DeleteResult(2),
            RangeResult((new, old), rev, 2, False),
            RangeResult((new,), rev, 2, True),
        )
        assert [kv.key for kv in await store.range("")] == ["new", "old"]
        assert (await store.lease_time_to_live(lease.id)).keys == ("new",)
        await store.lease_revoke(lease.id)
        assert await store.get("new") is None

    @conformance_test()
    async def test_txn_failure_branch_runs_the_failure_operations(self, store: Store) -> None:
        r1 = await store.put("state", b"idle")
        result = await store.txn(
            compare=[Compare.value("state") == b"ready", Compare.version("lock") == 0],
            success=[Put("state", b"running"), Put("lock", b"me")],
            failure=[Get("state"), Put("attempts", b"1"), Range("st")],
        )
        assert not result.succeeded
        assert not result
        assert result.revision == r1 + 1
        state = KeyValue("state", b"idle", r1, r1, 1, 0)
        attempts = KeyValue("attempts", b"1", r1 + 1, r1 + 1, 1, 0)
        assert result.results == (
            GetResult(state),
            PutResult(attempts, None),
            RangeResult((state,), r1 + 1, 1, False),
        )
        assert await store.get("lock") is None
        # a failure branch with no writes leaves the revision alone
        again = await store.txn(compare=[Compare.version("lock") > 0], failure=[Get("lock")])
        assert (again.succeeded, again.revision, again.results) == (
            False,
            r1 + 1,
            (GetResult(None),),
        )

    @conformance_test()
    async def test_txn_compares_see_the_store_before_it(self, store: Store) -> None:
        await store.put("k", b"1")
        result = await store.txn(
            compare=[Compare.value("k") == b"1"],
            success=[Delete("k"), Get("k"), Put("j", b"2"), Range("")],
        )
        assert result.succeeded
        assert result[1] == GetResult(None)  # operations see the ones before them
        assert isinstance(result[3], RangeResult)
        assert [kv.key for kv in result[3]] == ["j"]

    @conformance_test()
    async def test_txn_watchers_see_its_events_at_one_revision_in_order(self, store: Store) -> None:
        await store.put("w/c", b"c")
        await store.put("w/d/1", b"1")
        async with store.watch("w/") as events:
            result = await store.txn(
                success=[Put("w/b", b"b"), Delete("w/c"), Put("w/a", b"a"), DeletePrefix("w/d/")]
            )
            seen = await collect(events, 4)
            await store.put("w/after", b"x")
            after = await collect(events, 1)
        assert [(e.type, e.kv.key) for e in seen] == [
            (EventType.PUT, "w/b"),
            (EventType.DELETE, "w/c"),
            (EventType.PUT, "w/a"),
            (EventType.DELETE, "w/d/1"),
        ]
        assert {e.revision for e in seen} == {result.revision}
        assert after[0].revision == result.revision + 1

    @conformance_test()
    async def test_txn_with_an_unknown_lease_applies_nothing(self, store: Store) -> None:
        lease = await store.lease_grant(60)
        await store.lease_revoke(lease.id)
        before = await store.put("k", b"1")
        with pytest.raises(LeaseNotFoundError):
            await store.txn(success=[Put("a", b"1"), Put("k", b"2", lease=lease.id)])
        assert await store.current_revision() == before
        assert await store.get("a") is None
        # a missing lease in the branch that does not run is no error (etcd checks the taken one)
        result = await store.txn(
            compare=[Compare.version("k") == 1],
            success=[Put("a", b"1")],
            failure=[Put("k", b"2", lease=lease.id)],
        )
        assert result.succeeded

    @conformance_test()
    async def test_txn_limits_are_enforced_the_same_everywhere(self, store: Store) -> None:
        at_limit = await store.txn(success=[Put(f"k{i:03}", b"v") for i in range(MAX_TXN_OPS)])
        assert at_limit.succeeded
        assert len(at_limit) == MAX_TXN_OPS
        assert len({r.kv.mod_revision for r in at_limit if isinstance(r, PutResult)}) == 1
        with pytest.raises(TxnTooLargeError, match="max_txn_ops"):
            await store.txn(failure=[Get(f"k{i}") for i in range(MAX_TXN_OPS + 1)])
        big = b"x" * (200 * 1024)
        fits = await store.txn(success=[Put(f"big{i}", big) for i in range(4)])
        assert fits.succeeded
        with pytest.raises(TxnTooLargeError, match="max_txn_bytes"):
            await store.txn(success=[Put(f"huge{i}", big) for i in range(6)])
        with pytest.raises(ValueError, match="put twice"):
            await store.txn(success=[Put("dup", b"1"), Put("dup", b"2")])
        assert await store.current_revision() == fits.revision
        assert await store.get("huge0") is None

    @conformance_test()
    async def test_txn_transfers_under_concurrent_writers_keep_the_total(
        self, store: Store
    ) -> None:
        """Writers move units between accounts with compare-then-put transactions while readers
        read them all in one transaction: every read sees the same total, nothing is lost."""
        accounts = [f"acct/{i}" for i in range(4)]
        await store.txn(success=[Put(a, b"25") for a in accounts])
        moves = 0
        totals: list[int] = []

        async def snapshot() -> list[KeyValue]:
            result = await store.txn(success=[Get(a) for a in accounts])
            kvs = [r.kv for r in result if isinstance(r, GetResult)]
            assert all(kv is not None for kv in kvs)
            return [kv for kv in kvs if kv is not None]

        async def writer(seed: int) -> None:
            nonlocal moves
            for step in range(15):
                src, dst = (seed + step) % 4, (seed + 2 * step + 1) % 4
                if src == dst:
                    continue
                while True:
                    kvs = await snapshot()
                    a, b = kvs[src], kvs[dst]
                    result = await store.txn(
                        compare=[
                            Compare.mod_revision(a.key) == a.mod_revision,
                            Compare.mod_revision(b.key) == b.mod_revision,
                        ],
                        success=[
                            Put(a.key, str(int(a.value) - 1).encode()),
                            Put(b.key, str(int(b.value) + 1).encode()),
                        ],
                    )
                    if result.succeeded:
                        moves += 1
                        break

        async def reader() -> None:
            for _ in range(20):
                totals.append(sum(int(kv.value) for kv in await snapshot()))

        async with anyio.create_task_group() as tg:
            for seed in range(4):
                tg.start_soon(writer, seed)
            tg.start_soon(reader)
        final = await snapshot()
        assert set(totals) == {100}
        assert sum(int(kv.value) for kv in final) == 100
        assert sum(kv.version for kv in final) == 4 + 2 * moves  # every move wrote both keys

    @conformance_test()
    async def test_two_clients_adding_to_one_key_at_once_are_exact(self, store: Store) -> None:
        """Every add applies exactly once and returns a total no other add returned."""
        returned: list[int] = []
        async with self.peer(store) as other:

            async def worker(client: Store) -> None:
                for _ in range(10):
                    returned.append(await client.add("n", 1))

            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(worker, store if i % 2 else other)
        assert sorted(returned) == list(range(1, 201))
        assert (await store.get("n")).value == b"200"  # type: ignore[union-attr]

    @conformance_test()
    async def test_add_keeps_the_keys_lease(self, store: Store) -> None:
        lease = await store.lease_grant(60)
        await store.put("n", b"1", lease=lease.id)
        assert await store.add("n", 2) == 3
        assert (await store.get("n")).lease == lease.id  # type: ignore[union-attr]
        await store.lease_revoke(lease.id)
        assert await store.get("n") is None

    @conformance_test()
    async def test_txn_with_unusual_keys(self, store: Store) -> None:
        """Every key the protocol allows works in compares and every operation of a txn."""
        for key in UNUSUAL_KEYS:
            put = await store.txn(
                compare=[Compare.version(key) == 0],
                success=[Put(key, b"1"), Get(key), Range(key)],
            )
            assert put.succeeded, key
            kv = KeyValue(key, b"1", put.revision, put.revision, 1, 0)
            assert put.results[1:] == (GetResult(kv), RangeResult((kv,), put.revision, 1)), key
            gone = await store.txn(
                compare=[Compare.value(key) == b"1", Compare.mod_revision(key) == put.revision],
                success=[Delete(key), Get(key)],
            )
            assert gone.results == (DeleteResult(1), GetResult(None)), key
            await store.put(key, b"2")
            assert (await store.txn(success=[DeletePrefix(key)])).results == (DeleteResult(1),)
        assert len(await store.range("")) == 0
