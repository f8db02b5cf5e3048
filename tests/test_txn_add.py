"""``add`` on transactions (the etcd backend's, and any backend's without an increment): adds
from one client are combined into few transactions, each caller gets its own total, a conflict
costs no extra read, a cancelled add that was not sent is not applied, errors reach every
caller of the batch, and the key's lease is kept."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from aioelastic import StoreConnectionError
from aioelastic.store import MemoryStore
from aioelastic.store._add import CounterAdder
from aioelastic.testing import virtual_test
from aioelastic.testing.faults import FaultInjectingStore


@pytest.mark.asyncio
async def test_concurrent_adds_from_one_client_share_transactions() -> None:
    async with MemoryStore() as store:
        adder = CounterAdder(store)
        totals = await asyncio.gather(*(adder.add("n", 1) for _ in range(50)))
        assert sorted(totals) == list(range(1, 51))
        assert (await store.get("n")).value == b"50"  # type: ignore[union-attr]
        # one guess (absent: it is) and done; the old loop took a read and a CAS per add
        assert (adder.transactions, adder.conflicts) == (1, 0)
        assert await adder.add("n", 5) == 55
        assert adder.transactions == 2  # the key-value it wrote was remembered: no conflict


@pytest.mark.asyncio
async def test_a_conflict_reads_the_key_back_in_the_same_transaction() -> None:
    async with MemoryStore() as store:
        await store.put("n", b"10")
        adder = CounterAdder(store)
        assert await adder.add("n", 1) == 11  # guessed absent: one conflict, then it commits
        await store.put("n", b"100")  # another writer
        assert await adder.add("n", 1) == 101
        assert (adder.transactions, adder.conflicts) == (4, 2)
        totals = await asyncio.gather(*(adder.add("n", d) for d in (1, 2, 3)))
        assert totals == [102, 104, 107]  # in call order


@virtual_test  # its waits for the hung transaction to be in flight take no real time
async def test_an_add_cancelled_before_it_was_sent_is_not_applied() -> None:
    async with FaultInjectingStore(MemoryStore()) as store:
        adder = CounterAdder(store)
        store.hang("txn")
        first = asyncio.ensure_future(adder.add("n", 1))
        await anyio.sleep(0.01)  # its transaction is in flight (hung)
        second = asyncio.ensure_future(adder.add("n", 10))
        third = asyncio.ensure_future(adder.add("n", 100))
        await anyio.sleep(0.01)
        second.cancel()
        store.release()
        assert await first == 1
        assert await third == 101
        with pytest.raises(asyncio.CancelledError):
            await second
        assert (await store.get("n")).value == b"101"  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_an_error_reaches_every_caller_of_its_batch_and_later_adds_go_on() -> None:
    async with FaultInjectingStore(MemoryStore()) as store:
        adder = CounterAdder(store)
        store.fail_next("txn", StoreConnectionError("injected"))
        results = await asyncio.gather(
            *(adder.add("n", 1) for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, StoreConnectionError) for r in results)
        assert await adder.add("n", 1) == 1
        await store.put("text", b"hello")
        with pytest.raises(ValueError, match="not a decimal integer"):
            await adder.add("text", 1)
        assert (await store.get("text")).value == b"hello"  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_an_add_keeps_the_keys_lease() -> None:
    async with MemoryStore() as store:
        lease = await store.lease_grant(60)
        await store.put("n", b"1", lease=lease.id)
        adder = CounterAdder(store)
        assert await adder.add("n", 1) == 2
        assert (await store.get("n")).lease == lease.id  # type: ignore[union-attr]
        # as the memory backend's own add does
        assert await store.add("n", 1) == 3
        assert (await store.get("n")).lease == lease.id  # type: ignore[union-attr]


def test_a_conformance_peer_of_another_store_is_reported() -> None:
    """The two-client tests say so when ``open_peer`` gives a client of another store, rather
    than failing on duplicate totals (or passing on two separate counters)."""
    import contextlib
    from collections.abc import AsyncIterator

    from aioelastic.store import Store
    from aioelastic.testing.conformance import StoreConformance

    class Isolated(StoreConformance):
        virtual_time = True

        @contextlib.asynccontextmanager
        async def open_store(self) -> AsyncIterator[Store]:
            async with MemoryStore() as store:
                yield store

        @contextlib.asynccontextmanager
        async def open_peer(self, client: Store) -> AsyncIterator[Store]:
            async with MemoryStore() as store:  # a private engine: not the same store
                yield store

    with pytest.raises(pytest.fail.Exception, match="override open_peer"):
        Isolated().test_two_clients_adding_to_one_key_at_once_are_exact()
