"""A small HTTP/1.1 client for the HTTP store's unary requests (everything but watch streams).

Why not aiohttp's client: a store request is tiny (a key, a small value, a few headers) and
aiohttp's ``ClientSession.request`` spends ~150 us of CPU per request building request and
response objects, more than the server spends answering it (see ``benchmarks/http_ops.py`` and
``docs/http-api.md``). This module does only what the store needs, over asyncio's transports
(plain TCP or TLS through an :class:`ssl.SSLContext`, on whatever loop runs, uvloop included):

- a keep-alive pool of connections (LIFO, at most ``limit`` at once; an idle connection is dropped
  after ``keepalive`` seconds, or as soon as the server closes it);
- a request is written in one ``write`` (head and body together: no second packet for the server
  to wait for), its answer framed by ``Content-Length``, ``Transfer-Encoding: chunked`` or the
  end of the connection;
- one timer per request (``loop.call_at``), not a timeout context.

It raises only its own three exceptions, which the store maps to aioelastic's errors:
:class:`ConnectFailed` (nothing was sent), :class:`ConnectionLost` (sent; the answer did not
arrive whole) and :class:`RequestTimeout` (sent; no whole answer in time).
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
from typing import cast

__all__ = ["ConnectFailed", "ConnectionLost", "Pool", "RequestTimeout", "Response"]

#: The largest response head (status line and headers) accepted.
MAX_HEAD = 64 * 1024

#: (status, headers with lower-case names, body)
Response = tuple[int, dict[str, str], bytes]


class ConnectFailed(Exception):
    """No connection could be made: the request was not sent."""


class ConnectionLost(Exception):
    """The request was (maybe) sent but no whole answer came back on the connection."""


class RequestTimeout(Exception):
    """The request was sent but no whole answer came back before the deadline."""


class _ProtocolError(Exception):
    """The peer's answer is not HTTP/1.1 as we read it."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.dead = False  # closed, or in a state where it cannot carry another request
        self.idle_since = 0.0
        self._buffer = bytearray()
        self._waiter: asyncio.Future[Response] | None = None
        self._no_body = False
        # The answer being read: its head once parsed, then how its body ends.
        self._status = 0
        self._headers: dict[str, str] = {}
        self._keep_alive = True
        self._body_start = -1
        self._length = -1  # Content-Length, or -1
        self._chunked = False
        self._until_close = False

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, only alike)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self._fail(_ProtocolError("data arrived with no request outstanding"))
            return
        self._buffer += data
        try:
            self._parse()
        except _ProtocolError as exc:
            self._fail(exc)

    def eof_received(self) -> bool | None:
        self.dead = True
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.dead = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._until_close and self._body_start >= 0:
            self._complete(bytes(self._buffer[self._body_start :]))
            return
        waiter.set_exception(
            ConnectionLost(str(exc) if exc else "the server closed the connection")
        )

    # -- one request

    def send(self, data: bytes, waiter: asyncio.Future[Response], no_body: bool) -> None:
        assert self.transport is not None
        self._waiter = waiter
        self._no_body = no_body
        self._status = 0
        self._body_start = -1
        self._buffer.clear()
        self.transport.write(data)

    def abort(self) -> None:
        """Drop the connection now (timeout, cancellation, shutdown)."""
        self.dead = True
        if self.transport is not None:
            self.transport.abort()

    def timed_out(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(RequestTimeout())
        self.abort()

    def _fail(self, exc: Exception) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionLost(f"malformed answer: {exc}"))
        self.abort()

    def _complete(self, body: bytes) -> None:
        waiter = self._waiter
        self._waiter = None
        if not self._keep_alive or self._until_close:
            self.dead = True
        if waiter is not None and not waiter.done():
            waiter.set_result((self._status, self._headers, body))

    def _parse(self) -> None:
        buffer = self._buffer
        while self._body_start < 0:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD:
                    raise _ProtocolError("response head too large")
                return
            self._parse_head(bytes(buffer[:end]))
            if 100 <= self._status < 200:  # an interim answer (100 Continue): skip it
                del buffer[: end + 4]
                continue
            self._body_start = end + 4
        start = self._body_start
        if self._length >= 0:
            if len(buffer) - start < self._length:
                return
            if len(buffer) - start > self._length:
                raise _ProtocolError("more data than Content-Length")
            self._complete(bytes(buffer[start:]))
        elif self._chunked:
            body = self._dechunk(start)
            if body is not None:
                self._complete(body)

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise _ProtocolError(f"bad status line {lines[0][:100]!r}")
        self._status = int(code)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise _ProtocolError(f"bad header line {line[:100]!r}")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        self._headers = headers
        connection = headers.get("connection", "").lower()
        self._keep_alive = version == b"HTTP/1.1" and connection != "close"
        self._length = -1
        self._chunked = self._until_close = False
        status = self._status
        if self._no_body or status == 204 or status == 304 or status < 200:
            self._length = 0
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._chunked = True
        elif "content-length" in headers:
            raw = headers["content-length"]
            if not raw.isdigit():
                raise _ProtocolError(f"bad Content-Length {raw[:40]!r}")
            self._length = int(raw)
        else:
            self._until_close = True

    def _dechunk(self, start: int) -> bytes | None:
        """The whole body once the last chunk (and trailers) arrived, else None."""
        buffer = self._buffer
        parts: list[bytes] = []
        pos = start
        while True:
            end = buffer.find(b"\r\n", pos)
            if end < 0:
                return None
            size_text = bytes(buffer[pos:end]).partition(b";")[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise _ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                trailers_end = buffer.find(b"\r\n\r\n", end)
                if buffer[end : end + 4] == b"\r\n\r\n" or trailers_end >= 0:
                    return b"".join(parts)
                return None
            data_start = end + 2
            if len(buffer) < data_start + size + 2:
                return None
            parts.append(bytes(buffer[data_start : data_start + size]))
            pos = data_start + size + 2


class Pool:
    """Keep-alive connections to one HTTP origin, one request per connection at a time."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl: _ssl.SSLContext | None,
        connect_timeout: float,
        limit: int,
        keepalive: float = 30.0,
    ) -> None:
        self._host = host
        self._port = port
        self._ssl = ssl
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._slots = asyncio.Semaphore(limit)
        self.closed = False

    async def request(self, data: bytes, timeout: float, *, no_body: bool = False) -> Response:
        """Send ``data`` (a whole request) and answer (status, headers, body).

        ``timeout`` bounds everything (waiting for a free slot, connecting, the answer).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        slots = self._slots
        if slots.locked():
            try:
                async with asyncio.timeout_at(deadline):
                    await slots.acquire()
            except TimeoutError:
                raise ConnectFailed("no free connection before the deadline") from None
        else:
            await slots.acquire()
        try:
            conn = await self._connection(loop, deadline)
            waiter: asyncio.Future[Response] = loop.create_future()
            timer = loop.call_at(deadline, conn.timed_out)
            try:
                conn.send(data, waiter, no_body)
                response = await waiter
            except BaseException:
                conn.abort()  # cancelled or failed mid-request: the connection's state is unknown
                self._open.discard(conn)
                raise
            finally:
                timer.cancel()
            if conn.dead or self.closed:
                conn.abort()
                self._open.discard(conn)
            else:
                conn.idle_since = loop.time()
                self._idle.append(conn)
            return response
        finally:
            slots.release()

    async def _connection(self, loop: asyncio.AbstractEventLoop, deadline: float) -> _Connection:
        idle = self._idle
        now = loop.time()
        while idle:
            conn = idle.pop()
            transport = conn.transport
            if (
                conn.dead
                or transport is None
                or transport.is_closing()
                or now - conn.idle_since > self._keepalive
            ):
                conn.abort()
                self._open.discard(conn)
                continue
            return conn
        if self.closed:
            raise ConnectFailed("the client is closed")
        try:
            async with asyncio.timeout_at(min(deadline, now + self._connect_timeout)):
                transport, conn = await loop.create_connection(
                    _Connection,
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except TimeoutError:
            raise ConnectFailed(f"connecting timed out after {self._connect_timeout}s") from None
        except (OSError, _ssl.SSLError) as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from None
        # uvloop may call connection_made after create_connection returns: take the transport.
        conn.transport = transport
        if self.closed:
            conn.abort()
            raise ConnectFailed("the client is closed")
        self._open.add(conn)
        return conn

    def close(self) -> None:
        """Drop every connection: requests in flight fail with :class:`ConnectionLost`."""
        self.closed = True
        self._idle.clear()
        for conn in self._open:
            conn.abort()
        self._open.clear()
