"""The session's transport: an HTTP Upgrade to ``aioelastic-session/1`` on ``/v1/session``, then
length-prefixed messages (:mod:`._session_stream`) on the same connection.

:func:`upgrade` moves the connection from aiohttp's handler to a :class:`RawSession` with the
public ``transport.set_protocol()``, answers ``101 Switching Protocols`` through a plain
``web.StreamResponse`` and stays in the handler until the connection ends (while a handler runs,
aiohttp's keep-alive timer and parser leave the connection alone). ``connection_lost`` is
forwarded to aiohttp's handler (``request.protocol``), so aiohttp and the connection budget forget
the connection. Reading is synchronous: ``data_received`` cuts the messages, the connection
handles every frame of every one and writes the answers in one write; no task per connection.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ._frames import ERROR, pack
from ._session_conn import Connection
from ._session_stream import UPGRADE, MessageLengthError, MessageReader, message_header

if TYPE_CHECKING:
    from ._session_server import SessionHub

__all__ = ["RawSession", "upgrade"]


async def upgrade(hub: SessionHub, request: web.Request) -> web.StreamResponse:
    """Take the connection of ``request`` over for a session; return when it has ended."""
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the client went away before the upgrade")
    session = RawSession(hub, request.protocol, transport)
    transport.set_protocol(session)  # from here on, reads go to the session
    response = web.StreamResponse(status=101, headers={"Upgrade": UPGRADE, "Connection": "Upgrade"})
    response.force_close()
    hub.raw_sessions.add(session)
    try:
        await response.prepare(request)
        session.start()
        await session.closed
    finally:
        hub.raw_sessions.discard(session)
    return response


class RawSession(asyncio.Protocol):
    """A connection after the 101: its hello, then its messages; the :class:`Sender` of its
    :class:`Connection`."""

    def __init__(self, hub: SessionHub, handler: Any, transport: Any) -> None:
        self.hub = hub
        self._handler: asyncio.BaseProtocol = handler  # aiohttp's, told of connection_lost
        self.transport: Any = transport  # uvloop's transports are not asyncio.Transport
        self.reader = MessageReader(hub.max_message_bytes)
        self.connection: Connection | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._early: list[bytes] | None = []  # bytes before the 101 went out (a rude client)
        self._hello_timer: asyncio.TimerHandle | None = None
        self._ended = False  # closed (by either side): nothing more is read or written

    def start(self) -> None:
        """The 101 is written: wait for the hello (and read what came early)."""
        loop = asyncio.get_running_loop()
        self._hello_timer = loop.call_later(self.hub.hello_timeout, self._hello_timed_out)
        early, self._early = self._early, None
        if early:
            self.data_received(b"".join(early))

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._early is not None:
            self._early.append(data)
            return
        if self._ended:
            return
        error = None
        try:
            bodies = self.reader.feed(data)
        except MessageLengthError as exc:  # the messages before it are answered first
            bodies, error = exc.messages, str(exc)
        if bodies:
            self._handle(bodies)
        if error is not None and not self._ended:
            self._refuse_or_drop("bad_frame", error)

    def _handle(self, bodies: list[bytes]) -> None:
        connection = self.connection
        if connection is None:
            if not bodies:
                return
            if self._hello_timer is not None:
                self._hello_timer.cancel()
                self._hello_timer = None
            connection = self.connection = self.hub.greet(self, bodies[0])
            if connection is None:
                return
            del bodies[0]
        if bodies:
            connection.received(bodies)

    def pause_writing(self) -> None:
        if self.connection is not None:
            self.connection.pause_writing()

    def resume_writing(self) -> None:
        if self.connection is not None:
            self.connection.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended = True
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        connection = self.connection
        if connection is not None:
            self.hub.detach(connection)
        if not self.closed.done():
            self.closed.set_result(None)
        self._handler.connection_lost(exc)  # aiohttp (and the connection budget) forget it

    # -- Sender

    def write(self, parts: list[bytes]) -> None:
        if self._ended:
            return
        size = 0
        for part in parts:
            size += len(part)
        self.transport.writelines([message_header(size), *parts])

    def buffered(self) -> int:
        if self._ended:
            return 0
        size: int = self.transport.get_write_buffer_size()
        return size

    def close(self, code: str, error: bytes, *, abort: bool = False) -> None:
        if self._ended:
            return
        self._ended = True
        if abort:
            self.transport.abort()
            return
        self.transport.writelines([message_header(len(error)), error])
        self.transport.close()  # after the buffered bytes: FIN

    # -- before the hello is through

    def _hello_timed_out(self) -> None:
        self._hello_timer = None
        if self.connection is None:
            timeout = self.hub.hello_timeout
            self.refuse("hello_timeout", f"no hello within {timeout:g}s")

    def refuse(self, code: str, message: str, **extra: Any) -> None:
        """The hello is refused: the error frame, then the end of the connection."""
        self.close(code, pack([ERROR, 0, code, message[:300], extra]))

    def _refuse_or_drop(self, code: str, message: str) -> None:
        if self.connection is None:
            self.refuse(code, message)
        else:
            self.connection.bad_frame(message)
