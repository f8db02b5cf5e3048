"""The pytest plugin's fixtures, used the three ways users use them: from pytest-asyncio tests,
from anyio's pytest plugin, and from tests that run their own event loop."""

from __future__ import annotations

import asyncio

import pytest

from aioelastic.etcd_server import EtcdServer
from aioelastic.store import MemoryStore, open_store
from aioelastic.testing.http import ServerThread


@pytest.mark.asyncio
async def test_memory_store_under_pytest_asyncio(aioelastic_memory_store: MemoryStore) -> None:
    async with aioelastic_memory_store.lease(5) as lease:
        await aioelastic_memory_store.put("k", b"v", lease=lease.id)
        assert (await aioelastic_memory_store.get("k")) is not None


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_memory_store_under_anyio(
    aioelastic_memory_store: MemoryStore, anyio_backend: str
) -> None:
    await aioelastic_memory_store.put("k", b"v")
    async with aioelastic_memory_store.watch("k", start_revision=1) as events:
        assert (await events.__anext__()).kv.value == b"v"


def test_memory_store_from_an_own_loop(aioelastic_memory_store: MemoryStore) -> None:
    async def main() -> int:
        return await aioelastic_memory_store.put("k", b"v")

    assert asyncio.run(main()) == 1


@pytest.mark.asyncio
async def test_http_server_fixture(aioelastic_http_server: ServerThread) -> None:
    async with open_store(aioelastic_http_server.url) as store:
        revision = await store.put("plugin/k", b"v")
        assert (await store.get("plugin/k")).mod_revision == revision  # type: ignore[union-attr]


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_etcd_fixture(aioelastic_etcd: EtcdServer) -> None:
    async with open_store(aioelastic_etcd.url) as store:
        await store.put("plugin/k", b"v")
        assert (await store.get("plugin/k")).value == b"v"  # type: ignore[union-attr]


@pytest.mark.etcd
def test_etcd_cluster_fixture(aioelastic_etcd_cluster: EtcdServer) -> None:
    async def main() -> None:
        assert len(aioelastic_etcd_cluster.endpoints) == 3
        async with open_store(aioelastic_etcd_cluster.url) as store:
            await store.put("plugin/k", b"v")
            assert (await store.get("plugin/k")).value == b"v"  # type: ignore[union-attr]

    asyncio.run(main())
