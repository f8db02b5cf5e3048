"""The coordination-primitives conformance suite on the memory backend, in virtual time: several
clients of one shared engine act as separate processes."""

from __future__ import annotations

from aioelastic.store import open_store
from aioelastic.store._url import StoreOpener
from aioelastic.testing.sync_conformance import SyncConformance


class TestSyncOnMemory(SyncConformance):
    virtual_time = True
    timing_slack = 0.05

    def open_store(self) -> StoreOpener:
        return open_store("memory://sync-conformance")
