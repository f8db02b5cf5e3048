"""The coordination-primitives suite against a real store named by ``AIOELASTIC_SYNC_STORE_URL``
(``http://127.0.0.1:PORT`` for ``aioelastic serve``, ``etcd://127.0.0.1:2379``), in real time.

Skipped when the variable is unset; the memory run is ``test_sync_memory.py``.
"""

from __future__ import annotations

import os

import pytest

from aioelastic.store import open_store
from aioelastic.store._url import StoreOpener
from aioelastic.testing.sync_conformance import SyncConformance

URL = os.environ.get("AIOELASTIC_SYNC_STORE_URL", "")


@pytest.mark.slow
@pytest.mark.skipif(not URL, reason="set AIOELASTIC_SYNC_STORE_URL to a shared store")
class TestSyncOnSharedStore(SyncConformance):
    timing_slack = 1.5  # real servers on a loaded 2-core machine

    def open_store(self) -> StoreOpener:
        return open_store(URL)
