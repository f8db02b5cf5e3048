"""The store conformance suite on the HTTP backend: a real aiohttp server on 127.0.0.1 (on its
own thread and loop) and the real client, one client per test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import ClassVar

import pytest
from helpers.http import ServerThread

from aioelastic.store import Store, open_store
from aioelastic.testing.conformance import StoreConformance


class TestHttpStore(StoreConformance):
    short_ttl = 0.5
    url: ClassVar[str] = ""

    @pytest.fixture(autouse=True)
    def _server(self, http_server: ServerThread) -> None:
        type(self).url = http_server.url

    @contextlib.asynccontextmanager
    async def open_store(self) -> AsyncIterator[Store]:
        async with open_store(self.url, progress_interval=0.5) as store:
            yield store
