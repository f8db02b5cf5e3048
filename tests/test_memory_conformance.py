"""The store conformance suite on the memory backend, in virtual time (no real waiting)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aioelastic.store import MemoryStore, Store
from aioelastic.testing.conformance import StoreConformance


class TestMemoryStore(StoreConformance):
    virtual_time = True
    short_ttl = 5.0

    @contextlib.asynccontextmanager
    async def open_store(self) -> AsyncIterator[Store]:
        async with MemoryStore() as store:
            yield store

    @contextlib.asynccontextmanager
    async def open_peer(self, client: Store) -> AsyncIterator[Store]:
        assert isinstance(client, MemoryStore)
        async with MemoryStore(client.engine) as store:  # another client of the same engine
            yield store
