"""Locks and elections enter their queue in one transaction: the put of their key and the read
of the queue's head travel together, so an uncontended acquire or campaign costs one store
request after its lease (two before)."""

from __future__ import annotations

import pytest

from aioelastic.store import MemoryStore
from aioelastic.sync import Election, Lock
from aioelastic.testing.faults import FaultInjectingStore


def _queue_calls(store: FaultInjectingStore) -> dict[str, int]:
    return {op: n for op, n in store.calls.items() if op not in ("lease_grant", "lease_keep_alive")}


@pytest.mark.asyncio
async def test_an_uncontended_acquire_is_one_request() -> None:
    async with FaultInjectingStore(MemoryStore()) as store:
        lock = Lock(store, "job")
        token = await lock.acquire()
        assert _queue_calls(store) == {"txn": 1}
        assert (await lock.holder()).create_revision == token  # type: ignore[union-attr]
        await lock.release()
        # a waiter still reads the whole queue and waits its turn
        first, second = Lock(store, "q"), Lock(store, "q")
        await first.acquire()
        assert not await second.try_acquire()
        await first.release()
        assert await second.try_acquire()
        await second.release()


@pytest.mark.asyncio
async def test_an_uncontended_campaign_is_one_request() -> None:
    async with FaultInjectingStore(MemoryStore()) as store:
        election = Election(store, "leader")
        leader = await election.campaign("me")
        assert _queue_calls(store) == {"txn": 1}
        assert leader.value == b"me"
        await election.resign()
