"""Load on a real ``aioelastic serve`` process: 200 clients x 50 adds on one counter give the
exact sum; 100 watchers each see every event once, in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from helpers.http import ServerProcess

from aioelastic.store import EventType, Store, Watch, WatchEvent, open_store


@pytest_asyncio.fixture
async def server_url() -> AsyncIterator[str]:
    server = await asyncio.to_thread(ServerProcess().start)
    try:
        yield server.url
    finally:
        await asyncio.to_thread(server.terminate)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_200_clients_x_50_adds_give_the_exact_sum(server_url: str) -> None:
    clients = [await open_store(server_url) for _ in range(200)]
    try:

        async def adds(client: Store) -> list[int]:
            return [await client.add("load/counter") for _ in range(50)]

        results = await asyncio.wait_for(asyncio.gather(*(adds(c) for c in clients)), 240)
        kv = await clients[0].get("load/counter")
        assert kv is not None
        assert kv.value == b"10000"
        # each add returned a distinct intermediate total
        totals = sorted(t for r in results for t in r)
        assert totals == list(range(1, 10_001))
    finally:
        for client in clients:
            await client.aclose()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_100_watchers_each_see_every_event_once_in_order(server_url: str) -> None:
    async with open_store(server_url) as writer, open_store(server_url) as watchers_store:
        watches = [watchers_store.watch("fan/") for _ in range(100)]
        await asyncio.gather(*(w.start() for w in watches))
        expected: list[tuple[EventType, str, int]] = []
        for i in range(100):
            revision = await writer.put(f"fan/{i % 10}", str(i).encode())
            expected.append((EventType.PUT, f"fan/{i % 10}", revision))
        deleted = await writer.delete_prefix("fan/")
        assert deleted == 10
        revision = await writer.current_revision()
        expected += [(EventType.DELETE, f"fan/{k}", revision) for k in range(10)]

        async def collect(watch: Watch) -> list[WatchEvent]:
            return [await watch.__anext__() for _ in range(len(expected))]

        seen = await asyncio.wait_for(asyncio.gather(*(collect(w) for w in watches)), 120)
        for events in seen:
            assert [(e.type, e.kv.key, e.revision) for e in events] == expected
        for watch in watches:
            await watch.aclose()
