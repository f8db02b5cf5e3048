"""A deliberately simple session server for the client's tests: a real asyncio server on
127.0.0.1 that speaks the session's wire (the HTTP Upgrade, then length-prefixed messages of
msgpack frames) and lets a test decide what each request gets, or what the upgrade gets.

``fake_session_server(answer)`` welcomes every hello, then calls ``await answer(peer, frame)``
for each request frame; an answer of ``"hang up"`` drops the connection (no error frame, no FIN
first: an abort). ``refuse=(status, body)`` answers the upgrade with that instead of a 101.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aioelastic.store.http._frames import RESULT, pack, unpack_all
from aioelastic.store.http._session_stream import UPGRADE, message_header

__all__ = ["Peer", "Seen", "fake_session_server", "loopback_server", "raw_answer"]

WELCOME = {"version": 1, "resume": "r", "grace": 0.25, "max_message": 1 << 20}


class Seen:
    """What the fake server saw, over all connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.ops: list[str] = []
        self.frames: list[list[Any]] = []  # the request frames: [REQUEST, rid, op, args]
        self.messages: list[int] = []  # frames per message
        self.heads: list[str] = []  # the upgrade requests' heads
        self.headers: list[dict[str, str]] = []  # ... their headers (lower-case names)
        self.arrived = asyncio.Event()  # set on each request frame


class Peer:
    """One client connection, as the answer function sees it."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    def send(self, *frames: list[Any]) -> None:
        """One message of ``frames``."""
        body = b"".join(pack(frame) for frame in frames)
        self.send_raw(message_header(len(body)) + body)

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def hang_up(self) -> None:
        self.writer.transport.abort()


def raw_answer(status: int, body: bytes, headers: str = "") -> bytes:
    """An HTTP answer with ``body`` (JSON, or not: an old server's, a proxy's)."""
    return (
        f"HTTP/1.1 {status} Whatever\r\nContent-Length: {len(body)}\r\n{headers}"
        "Connection: close\r\n\r\n"
    ).encode() + body


Handle = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def loopback_server(handle: Handle) -> AsyncIterator[int]:
    """A TCP server on 127.0.0.1 running ``handle`` for each connection; yields its port. At the
    end every connection's task is cancelled and awaited and its socket aborted (closed even if
    its task never ran)."""
    tasks: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []

    def track(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        task = asyncio.ensure_future(handle(reader, writer))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(track, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for writer in writers:
            writer.transport.abort()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def fake_session_server(
    answer: Callable[[Peer, list[Any]], Awaitable[str | None]] | None = None,
    *,
    refuse: Callable[[int], bytes | None] | None = None,
    welcome: Callable[[int], list[Any] | bytes | str | None] | None = None,
) -> AsyncIterator[tuple[str, Seen]]:
    """Yields (url, what it saw). ``refuse(n)``: the bytes answering the n-th upgrade (from 1),
    or ``None`` to upgrade it. ``welcome(n)``: the answer to the n-th hello, a frame or a
    message's raw bytes, ``"hang up"`` (a reset), ``"close"`` (a FIN), or ``None``: ``[RESULT,
    0, WELCOME]``."""
    seen = Seen()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.connections += 1
        peer = Peer(writer)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            seen.heads.append(head)
            lines = head.split("\r\n")[1:]
            seen.headers.append(
                {n.strip().lower(): v.strip() for n, _, v in (x.partition(":") for x in lines) if n}
            )
            refusal = refuse(seen.connections) if refuse is not None else None
            if refusal is not None:
                writer.write(refusal)
                await writer.drain()
                return
            writer.write(
                f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: {UPGRADE}\r\n"
                "Connection: Upgrade\r\n\r\n".encode()
            )
            await _read_message(reader)  # the hello
            told = None if welcome is None else welcome(seen.connections)
            if told is None:
                told = [RESULT, 0, WELCOME]
            if told == "hang up":
                peer.hang_up()
                return
            if told == "close":  # a FIN, not a reset
                return
            if isinstance(told, bytes):
                peer.send_raw(message_header(len(told)) + told)
            else:
                assert isinstance(told, list)
                peer.send(told)
            while True:
                frames = list(unpack_all(await _read_message(reader), max_len=1 << 24))
                seen.messages.append(len(frames))
                for frame in frames:
                    seen.ops.append(frame[2])
                    seen.frames.append(frame)
                    seen.arrived.set()
                    if answer is not None and await answer(peer, frame) == "hang up":
                        peer.hang_up()
                        return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async with loopback_server(handle) as port:
        yield f"http://127.0.0.1:{port}", seen


async def _read_message(reader: asyncio.StreamReader) -> bytes:
    length = int.from_bytes(await reader.readexactly(4), "big")
    return await reader.readexactly(length)
