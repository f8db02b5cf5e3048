"""The session over aiohttp's WebSocket (``Upgrade: websocket`` on ``/v1/session``): the older
transport of the same session logic (:class:`~._session_conn.Connection`), kept while clients
move to the raw upgrade (:mod:`._session_raw`). A connection-level error is the error frame, then
a close with the code below."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web

from ._frames import ERROR, pack

if TYPE_CHECKING:
    from ._session_server import SessionHub

__all__ = ["websocket"]

#: WebSocket close codes of the protocol's errors (the 4000s are the application's).
_CLOSE_CODES = {"bad_frame": 4401, "too_slow": 4408, "replaced": 4409, "unavailable": 1001}
_CLOSE_BAD_HELLO = 4400
#: What ``receive()`` returns once the WebSocket has ended.
_ENDED = (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED)


class _WsSender:
    """Messages queued by the connection, written by one task (``send_bytes`` is async)."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self._queue: list[bytes] = []
        self._bytes = 0
        self._wake = asyncio.Event()
        self._close_code: int | None = None
        self._abort = False

    def write(self, parts: list[bytes]) -> None:
        if self._close_code is not None:
            return
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self._queue.append(data)
        self._bytes += len(data)
        self._wake.set()

    def buffered(self) -> int:
        return self._bytes

    def close(self, code: str, error: bytes, *, abort: bool = False) -> None:
        if self._close_code is not None:
            return
        if abort:
            self._queue, self._bytes = [], 0
        else:
            self.write([error])
        self._close_code = _CLOSE_CODES.get(code, _CLOSE_BAD_HELLO)
        self._wake.set()

    async def run(self) -> None:
        ws = self.ws
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                data = self._queue.pop(0)
                self._bytes -= len(data)
                await ws.send_bytes(data)
            if self._close_code is not None:
                await ws.close(code=self._close_code)
                return


async def websocket(hub: SessionHub, request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=hub.max_message_bytes, compress=False, autoping=True)
    await ws.prepare(request)
    sender = _WsSender(ws)
    writer = asyncio.ensure_future(sender.run())
    try:
        try:
            message = await ws.receive(timeout=hub.hello_timeout)
        except TimeoutError:
            timeout = hub.hello_timeout
            code, text = "hello_timeout", f"no hello within {timeout:g}s"
            sender.close(code, pack([ERROR, 0, code, text, {}]))
            await writer
            return ws
        if message.type is not WSMsgType.BINARY:
            text = "the first message must be a binary hello frame"
            sender.close("bad_hello", pack([ERROR, 0, "bad_hello", text, {}]))
            await writer
            return ws
        connection = hub.greet(sender, message.data)
        if connection is None:
            await writer
            return ws
        try:
            while True:
                message = await ws.receive()
                if message.type is WSMsgType.BINARY:
                    connection.received((message.data,))
                elif message.type is WSMsgType.TEXT:
                    connection.bad_frame("session frames are binary messages (msgpack), not text")
                elif message.type in _ENDED:
                    break
        finally:
            hub.detach(connection)
    except ConnectionError:
        pass
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await writer
    return ws
