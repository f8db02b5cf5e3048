"""A server's session connection over a recording sender, no socket: the hub over a memory
engine, a greeted connection and what it was given to write (``tests/test_http_session_conn.py``
and ``tests/test_http_session_watches.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

from aioelastic.store.http._frames import REQUEST, pack, unpack_all
from aioelastic.store.http._session_conn import Connection
from aioelastic.store.http._session_server import SessionHub
from aioelastic.store.memory import MemoryEngine

__all__ = ["Recorder", "connect", "make_hub", "message_body", "next_iteration"]


class Recorder:
    """A :class:`~aioelastic.store.http._session_conn.Sender` that keeps what it is given."""

    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []
        self.closed: tuple[str, bytes, bool] | None = None
        self.buffer = 0
        self.asked = 0  # calls of buffered()

    def write(self, parts: list[bytes]) -> None:
        self.writes.append(parts)

    def buffered(self) -> int:
        self.asked += 1
        return self.buffer

    def close(self, code: str, error: bytes, *, abort: bool = False) -> None:
        self.closed = (code, error, abort)

    def frames(self, write: int) -> list[list[Any]]:
        return list(unpack_all(b"".join(self.writes[write]), max_len=1 << 20))


def make_hub(engine: MemoryEngine, max_watches: int = 100) -> SessionHub:
    return SessionHub(engine, max_key_bytes=100, max_value_bytes=100_000, max_watches=max_watches)


def connect(hub: SessionHub, hello: dict[str, Any] | None = None) -> tuple[Connection, Recorder]:
    recorder = Recorder()
    connection = hub.greet(
        recorder, pack([REQUEST, 0, "hello", {"versions": [1], **(hello or {})}])
    )
    assert connection is not None
    recorder.writes.clear()  # the welcome
    return connection, recorder


def message_body(*frames: list[Any]) -> bytes:
    return b"".join(pack(frame) for frame in frames)


async def next_iteration() -> None:
    """Let the connection's flush callback (scheduled with call_soon) run."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)
