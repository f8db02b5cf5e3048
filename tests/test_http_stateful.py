"""The shared hypothesis state machine (aioelastic.testing.stateful) on the HTTP backend: a real
server on 127.0.0.1 (its own thread and loop), a fresh namespace per example."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from helpers.http import ServerThread
from hypothesis import settings

from aioelastic.store import PrefixedStore, Store, open_store
from aioelastic.testing.stateful import StoreMachine

_server: list[ServerThread] = []


@pytest.fixture(scope="module", autouse=True)
def http_server() -> Iterator[None]:
    with ServerThread() as server:
        _server.append(server)
        yield
        _server.clear()


class _OwnedNamespace(PrefixedStore):
    """A namespace that closes its client when closed (each example opens its own client)."""

    async def _aclose(self) -> None:
        await self.parent.aclose()


class HttpMachine(StoreMachine):
    async def open_store(self) -> Store:
        client = await open_store(_server[0].url, progress_interval=1.0)
        return _OwnedNamespace(client, f"stateful/{uuid.uuid4().hex}/")


HttpMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestHttpStateful = HttpMachine.TestCase
