"""Test helpers for the HTTP backend: a real ``aioelastic serve`` server for tests.

:class:`ServerThread` runs an :class:`~aioelastic.store.http.server.HttpStoreServer` on its own
event loop in a thread, so tests that each run their own loop (or use pytest-asyncio, or anyio's
pytest plugin) can share one server and open clients to ``server.url`` in their own loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from ..store.http.server import HttpStoreServer

__all__ = ["ServerThread"]

T = TypeVar("T")


class ServerThread:
    """An HTTP store server on 127.0.0.1 (``port=0``: a free port) in a background thread.

    ``with ServerThread(token=...) as server: ... server.url ...``; keyword arguments go to
    :class:`HttpStoreServer`.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("port", 0)
        self._kwargs = kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="aioelastic-http-server", daemon=True
        )
        self.server: HttpStoreServer | None = None

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the server's loop and return its result (30 s at most)."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout=30)

    def __enter__(self) -> ServerThread:
        self._thread.start()

        async def start() -> HttpStoreServer:
            server = HttpStoreServer(**self._kwargs)
            await server.start()
            return server

        self.server = self.call(start())
        return self

    @property
    def url(self) -> str:
        assert self.server is not None, "the server has not started"
        return self.server.url

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.call(self.server.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
