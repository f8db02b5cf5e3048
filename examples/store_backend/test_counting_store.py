"""The backend of counting_store.py passes the store conformance suite, and opens by its URL.

Run it with ``python -m pytest examples/store_backend`` (needs ``aioelastic[test]``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from counting_store import CountingStore, register

from aioelastic.store import MemoryStore, Store, open_store
from aioelastic.testing.conformance import StoreConformance


# --8<-- [start:conformance]
class TestCountingStore(StoreConformance):
    """Every test of the protocol, on the new backend."""

    features = frozenset({"compaction", "fractional_ttl"})  # what it declares; the rest skip
    virtual_time = True  # in-process only: lease tests take no real time
    short_ttl = 5.0  # a lease TTL (s) the backend honours

    @contextlib.asynccontextmanager
    async def open_store(self) -> AsyncIterator[Store]:
        async with CountingStore(MemoryStore()) as store:
            yield store

    @contextlib.asynccontextmanager
    async def open_peer(self, client: Store) -> AsyncIterator[Store]:
        """A second client of the same store (the tests of two clients at once)."""
        assert isinstance(client, CountingStore)
        assert isinstance(client.inner, MemoryStore)
        async with CountingStore(MemoryStore(client.inner.engine)) as peer:
            yield peer


# --8<-- [end:conformance]


# --8<-- [start:url]
@pytest.mark.asyncio
async def test_open_store_finds_the_backend_by_its_scheme() -> None:
    register()
    async with open_store("counting://docs-example") as store:
        assert isinstance(store, CountingStore)
        await store.put("k", b"v")
        assert (await store.get("k")) is not None
        assert store.calls["put"] == store.calls["get"] == 1


# --8<-- [end:url]
