"""The session's transport: an HTTP Upgrade to ``aioelastic-session/1`` on ``/v1/session``, then
length-prefixed messages (:mod:`._session_stream`) on the same connection.

The upgrade is taken one of two ways. Almost always a new connection's first read is the whole
upgrade request, plain (:func:`session_head`): :class:`DirectUpgrade` answers it ``101`` itself
and the connection becomes a :class:`RawSession` before aiohttp ever sees it (no request parsed,
routed or answered by aiohttp's machinery: that was most of a session's set-up cost on the
server). Anything else (a head cut over several reads, a missing or wrong token, any header this
fast path does not expect, a server over its connection limit or stopping) goes to aiohttp, whose
route (:func:`upgrade`) answers it as it always has: a 101 there too, or the 401, 426 or 503
with its JSON error. Either way a hello carried in the upgrade's ``Aioelastic-Hello`` header is
answered at once: the 101 says ``Aioelastic-Hello: taken`` and the welcome follows it, in one
write on the direct path (a header that is not base64url: aiohttp's route answers 400).

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
import hmac
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ._errors import error_response
from ._frames import ERROR, SESSION_PATH, pack
from ._session_conn import Connection
from ._session_stream import (
    HEADER_BYTES,
    HELLO_HEADER,
    HELLO_TAKEN,
    UPGRADE,
    MessageLengthError,
    MessageReader,
    hello_from_header,
    message_header,
)

if TYPE_CHECKING:
    from ._session_server import SessionHub

__all__ = ["DirectUpgrade", "RawSession", "session_head", "upgrade"]

#: What a new connection's first read starts with when it may be a session's upgrade.
SESSION_REQUEST_LINE = f"GET {SESSION_PATH} HTTP/1.1\r\n".encode()
#: The longest head the direct upgrade reads (longer ones are aiohttp's to judge).
MAX_DIRECT_HEAD = 8 * 1024
_MAX_DIRECT_HEADERS = 32
#: A header line: a token, a colon, a value of visible characters, spaces and tabs (no
#: obs-fold, no control characters).
_HEADER_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([\x20-\x7e\t\x80-\xff]*?)[ \t]*")
#: Headers that take a request off the direct path: a body or a coding (the middleware refuses
#: or reads them), an expectation.
_NOT_DIRECT = frozenset({"content-length", "transfer-encoding", "content-encoding", "expect"})
#: A message of two parts up to this size is written as one buffer (a copy of its shared part).
_JOIN_BYTES = 4096
#: The answer that switches the connection to the session stream.
SWITCHING = (
    f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: {UPGRADE}\r\nConnection: Upgrade\r\n\r\n"
).encode()
#: The same, for an upgrade whose hello it carried: the hello's answer follows.
SWITCHING_HELLO = SWITCHING[:-2] + f"{HELLO_HEADER}: {HELLO_TAKEN}\r\n\r\n".encode()
_HELLO_KEY = HELLO_HEADER.lower()


def session_head(data: bytes) -> tuple[dict[str, str], bytes] | None:
    """``(headers, the bytes after the head)`` when ``data`` starts with a whole, plain
    ``GET /v1/session HTTP/1.1`` head (header names lower-cased, each once); None for
    anything else, which aiohttp's parser is left to judge."""
    if not data.startswith(SESSION_REQUEST_LINE):
        return None
    start = len(SESSION_REQUEST_LINE)
    if data.startswith(b"\r\n", start):
        return {}, data[start + 2 :]
    end = data.find(b"\r\n\r\n", start)
    if end < 0 or end > MAX_DIRECT_HEAD:
        return None
    lines = data[start:end].split(b"\r\n")
    if len(lines) > _MAX_DIRECT_HEADERS:
        return None
    headers: dict[str, str] = {}
    for line in lines:
        match = _HEADER_LINE.fullmatch(line)
        if match is None:
            return None
        name = match[1].decode("ascii").lower()
        if name in headers:
            return None
        headers[name] = match[2].decode("latin-1")
    return headers, data[end + 4 :]


class DirectUpgrade:
    """Takes a new connection whose first read is a session's upgrade straight to the session
    stream, when the answer would be a 101 anyway: the path, the ``Connection`` and
    ``Upgrade`` headers, the token, and no body, coding or expectation; the hub is not
    stopping. Anything else is left to aiohttp (:func:`upgrade` and the refusals)."""

    __slots__ = ("_token", "hub")

    def __init__(self, hub: SessionHub, token: bytes | None) -> None:
        self.hub = hub
        self._token = token

    def take(
        self, transport: Any, data: bytes, on_lost: Callable[[Exception | None], None]
    ) -> RawSession | None:
        """The session ``transport`` now carries (the 101 written, the bytes after the head
        read), or None: not a request this takes; nothing was done."""
        hub = self.hub
        parsed = session_head(data)
        if parsed is None or hub.closing:
            return None
        headers, tail = parsed
        if not _NOT_DIRECT.isdisjoint(headers) or not self._authorized(headers):
            return None
        if headers.get("upgrade", "").strip().lower() != UPGRADE:
            return None
        tokens = headers.get("connection", "").lower().split(",")
        if "upgrade" not in (token.strip() for token in tokens):
            return None
        hello = None
        if _HELLO_KEY in headers:
            hello = hello_from_header(headers[_HELLO_KEY])
            if hello is None:
                return None  # (aiohttp's route says what is wrong with it)
        session = RawSession(hub, on_lost, transport)
        if hello is None:
            transport.write(SWITCHING)
        else:
            session.prefix = SWITCHING_HELLO  # written with the welcome, in one write
        transport.set_protocol(session)
        hub.raw_sessions.add(session)
        session.start(hello)
        if tail:
            session.data_received(tail)
        return session

    def _authorized(self, headers: dict[str, str]) -> bool:
        token = self._token
        if token is None:
            return True
        scheme, _, given = headers.get("authorization", "").partition(" ")
        return (
            scheme.lower() == "bearer"
            and bool(given)
            and hmac.compare_digest(given.strip().encode("latin-1"), token)
        )


async def upgrade(hub: SessionHub, request: web.Request) -> web.StreamResponse:
    """Take the connection of ``request`` over for a session; return when it has ended."""
    hello = None
    if HELLO_HEADER in request.headers:
        hello = hello_from_header(request.headers[HELLO_HEADER])
        if hello is None:
            return error_response(
                400, "bad_hello", f"the {HELLO_HEADER} header is not a hello in base64url"
            )
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the client went away before the upgrade")
    session = RawSession(hub, request.protocol.connection_lost, transport)
    transport.set_protocol(session)  # from here on, reads go to the session
    headers = {"Upgrade": UPGRADE, "Connection": "Upgrade"}
    if hello is not None:
        headers[HELLO_HEADER] = HELLO_TAKEN
    response = web.StreamResponse(status=101, headers=headers)
    response.force_close()
    hub.raw_sessions.add(session)
    try:
        await response.prepare(request)
        session.start(hello)
        await session.closed
    finally:
        hub.raw_sessions.discard(session)
    return response


class RawSession(asyncio.Protocol):
    """A connection after the 101: its hello, then its messages; the :class:`Sender` of its
    :class:`Connection`."""

    def __init__(
        self, hub: SessionHub, on_lost: Callable[[Exception | None], None], transport: Any
    ) -> None:
        self.hub = hub
        #: told of connection_lost: aiohttp's handler, or the new connection that took the upgrade
        #: (either way the connection budget forgets the connection)
        self._on_lost = on_lost
        self.transport: Any = transport  # uvloop's transports are not asyncio.Transport
        self.reader = MessageReader(hub.max_message_bytes)
        self.connection: Connection | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._early: list[bytes] | None = []  # bytes before the 101 went out (a rude client)
        self._hello_timer: asyncio.TimerHandle | None = None
        self._ended = False  # closed (by either side): nothing more is read or written
        self._paused = False  # the transport paused writing (told again to the connection)
        #: bytes that go before the first message written (the 101 that took the hello)
        self.prefix: bytes | None = None

    def start(self, hello: bytes | None = None) -> None:
        """The 101 is written (or is the :attr:`prefix`): answer ``hello``, the hello message
        the upgrade carried, or wait for the hello; then read what came early."""
        early, self._early = self._early, None
        if hello is not None:
            self._handle([hello])
            if self.prefix is not None and not self._ended:  # (the greeting wrote nothing)
                self.transport.write(self.prefix)
                self.prefix = None
        else:
            loop = asyncio.get_running_loop()
            self._hello_timer = loop.call_later(self.hub.hello_timeout, self._hello_timed_out)
        if early:
            self.data_received(b"".join(early))

    # -- asyncio.Protocol (no connection_made: a session is set on a live transport, which it is
    # given when made, and asyncio tells only the protocol a connection was made with)

    def data_received(self, data: bytes) -> None:
        if self._early is not None:
            self._early.append(data)
            return
        if self._ended:
            return
        connection = self.connection
        if connection is not None:
            body = self.reader.whole(data)  # one whole message, nothing buffered: no copy
            if body is not None:
                connection.received_one(body)
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
            if self._paused:  # (paused before the hello: the welcome waits in the buffer)
                connection.pause_writing()
            del bodies[0]
        if bodies:
            connection.received(bodies)

    def pause_writing(self) -> None:
        self._paused = True
        if self.connection is not None:
            self.connection.pause_writing()

    def resume_writing(self) -> None:
        self._paused = False
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
        self.hub.raw_sessions.discard(self)
        self._on_lost(exc)

    # -- Sender

    def write(self, parts: list[bytes]) -> None:
        if self._ended:
            return
        if self.prefix is not None:
            self._write_first(parts)
            return
        count = len(parts)
        if count == 1:  # one answer: one buffer (its header joined to it), one write
            part = parts[0]
            self.transport.write(len(part).to_bytes(HEADER_BYTES, "big") + part)
            return
        if count == 2:  # one events frame: its head and its blob, shared by many sessions
            head, blob = parts
            size = len(head) + len(blob)
            if size <= _JOIN_BYTES:  # (copying a small blob costs less than a list of three)
                self.transport.write(b"".join((size.to_bytes(HEADER_BYTES, "big"), head, blob)))
                return
        else:
            size = 0
            for part in parts:
                size += len(part)
        self.transport.writelines([message_header(size), *parts])

    def _write_first(self, parts: list[bytes]) -> None:
        """The :attr:`prefix`, then the message of ``parts``, in one write."""
        prefix, self.prefix = self.prefix, None
        size = sum(len(part) for part in parts)
        self.transport.write(b"".join((prefix or b"", message_header(size), *parts)))

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
        prefix, self.prefix = self.prefix or b"", None
        self.transport.writelines([prefix, message_header(len(error)), error])
        self.transport.close()  # after the buffered bytes: FIN

    def abort(self) -> None:
        """Drop the connection at once (the server's shutdown ran out of time)."""
        self._ended = True
        self.transport.abort()

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
