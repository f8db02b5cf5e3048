"""A raw session client for tests: the upgrade to ``aioelastic-session/1`` by hand, then messages.

``async with session_wire(url, token=...) as wire:`` connects, sends the upgrade request, reads
the ``101`` head and gives a :class:`SessionWire`: ``await wire.hello()``, ``await
wire.send(frames)`` (one message), ``await wire.send_raw(data)`` (bytes as they are),
``await wire.recv()`` (the frames of the next message), ``await wire.closed()`` (the server
ended the connection). :func:`upgrade_answer` sends an upgrade and returns the HTTP answer
(a refusal: its status, headers and JSON body).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import struct
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from aioelastic.store.http._frames import REQUEST, RESULT, pack, unpack_all
from aioelastic.store.http._session_stream import (
    HELLO_HEADER,
    UPGRADE,
    MessageReader,
    hello_header,
    message_header,
)

__all__ = ["SessionWire", "UpgradeRefused", "hello_value", "session_wire", "upgrade_answer"]

TIMEOUT = 10.0


class UpgradeRefused(Exception):
    """The server answered the upgrade with something other than 101."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        super().__init__(f"{status}: {body[:200]!r}")
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def _request(
    host: str,
    port: int,
    token: str | None,
    upgrade: str,
    path: str,
    connection: str = "Upgrade",
    hello: str | None = None,
) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", f"Connection: {connection}"]
    if upgrade:
        lines.append(f"Upgrade: {upgrade}")
    if upgrade.lower() == "websocket":
        lines += ["Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    if hello is not None:
        lines.append(f"{HELLO_HEADER}: {hello}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def hello_value(**fields: Any) -> str:
    """An ``Aioelastic-Hello`` header value: the hello of ``fields`` (versions [1] unless
    given)."""
    fields.setdefault("versions", [1])
    return hello_header(pack([REQUEST, 0, "hello", fields]))


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return status, headers


class SessionWire:
    """One upgraded connection, spoken by hand."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        #: the 101's headers (lower-case names)
        self.headers = headers or {}
        self._messages = MessageReader(1 << 30)
        self._pending: list[bytes] = []

    async def send(self, frames: list[list[Any]]) -> None:
        """``frames`` as one message."""
        body = b"".join(pack(frame) for frame in frames)
        await self.send_raw(message_header(len(body)) + body)

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def recv_message(self, timeout: float = TIMEOUT) -> bytes:
        """The next message's body (EOFError: the connection ended first)."""
        async with asyncio.timeout(timeout):
            while not self._pending:
                data = await self.reader.read(1 << 16)
                if not data:
                    raise EOFError("the server closed the connection")
                self._pending += self._messages.feed(data)
        return self._pending.pop(0)

    async def recv(self, timeout: float = TIMEOUT) -> list[list[Any]]:
        """The frames of the next message."""
        return list(unpack_all(await self.recv_message(timeout), max_len=1 << 30))

    async def hello(self, **fields: Any) -> dict[str, Any]:
        """Say hello (versions [1] unless given); the welcome's fields."""
        fields.setdefault("versions", [1])
        await self.send([[REQUEST, 0, "hello", fields]])
        [welcome] = await self.recv()
        assert welcome[:2] == [RESULT, 0], welcome
        result: dict[str, Any] = welcome[2]
        return result

    async def closed(self, timeout: float = TIMEOUT) -> bool:
        """Wait until the server ends the connection (True), no message coming first."""
        async with asyncio.timeout(timeout):
            data = await self.reader.read(1 << 16)
        assert not data, f"a message before the end: {data[:100]!r}"
        assert not self._pending, "a message before the end"
        return True

    def reset(self) -> None:
        """End the connection with an RST (SO_LINGER 0), as a killed process's kernel may."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


async def _connect(
    url: str, tls: ssl.SSLContext | None
) -> tuple[str, int, asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    if parts.scheme == "https" and tls is None:
        raise ValueError("an https URL needs a TLS context")
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=tls, limit=1 << 20), TIMEOUT
    )
    return host, port, reader, writer


async def _write_cut(writer: asyncio.StreamWriter, request: bytes, pieces: int) -> None:
    """Write ``request`` in ``pieces`` parts, a moment apart (so that the server reads them
    apart: a head cut over reads is aiohttp's to parse, not the direct upgrade's)."""
    cut = len(request) // max(1, pieces)
    for start in range(0, (pieces - 1) * cut, cut):
        writer.write(request[start : start + cut])
        await writer.drain()
        await asyncio.sleep(0.05)
    writer.write(request[(pieces - 1) * cut :])


@contextlib.asynccontextmanager
async def session_wire(
    url: str,
    *,
    token: str | None = None,
    tls: ssl.SSLContext | None = None,
    path: str = "/v1/session",
    pieces: int = 1,
    hello: str | None = None,
) -> AsyncIterator[SessionWire]:
    """An upgraded session connection to the server at ``url`` (UpgradeRefused: not a 101).
    ``pieces``: the upgrade request is written in that many parts, a moment apart (so that the
    server reads them apart). ``hello``: an ``Aioelastic-Hello`` header value (see
    :func:`hello_value`)."""
    host, port, reader, writer = await _connect(url, tls)
    try:
        await _write_cut(writer, _request(host, port, token, UPGRADE, path, hello=hello), pieces)
        status, headers = await _head(reader)
        if status != 101:
            length = int(headers.get("content-length", "0"))
            body = await asyncio.wait_for(reader.readexactly(length), TIMEOUT)
            raise UpgradeRefused(status, headers, body)
        assert headers.get("upgrade", "").lower() == UPGRADE, headers
        yield SessionWire(reader, writer, headers)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), TIMEOUT)


async def upgrade_answer(
    url: str,
    upgrade: str,
    *,
    token: str | None = None,
    connection: str = "Upgrade",
    hello: str | None = None,
    pieces: int = 1,
) -> tuple[int, dict[str, str], bytes]:
    """Ask ``/v1/session`` for ``upgrade`` (with this ``Connection`` header, and ``hello`` in
    the ``Aioelastic-Hello`` header if given; written in ``pieces`` parts, as
    :func:`session_wire` does): the answer's status, headers and body."""
    host, port, reader, writer = await _connect(url, None)
    try:
        request = _request(host, port, token, upgrade, "/v1/session", connection, hello)
        await _write_cut(writer, request, pieces)
        status, headers = await _head(reader)
        body = b""
        if "content-length" in headers:
            length = int(headers["content-length"])
            body = await asyncio.wait_for(reader.readexactly(length), TIMEOUT)
        return status, headers, body
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await asyncio.wait_for(writer.wait_closed(), TIMEOUT)
