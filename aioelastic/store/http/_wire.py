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
from collections import deque
from typing import NamedTuple, cast

__all__ = [
    "ConnectFailed",
    "ConnectionLost",
    "LineStream",
    "Pool",
    "RequestTimeout",
    "Response",
    "open_stream",
]

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


class _Head(NamedTuple):
    status: int
    headers: dict[str, str]  # lower-case names
    keep_alive: bool
    length: int  # the body's length, -1: not given (chunked, or until the connection ends)
    chunked: bool


def _parse_head(head: bytes, no_body: bool) -> _Head:
    """Parse a response's status line and headers (``no_body``: the answer to a HEAD)."""
    lines = head.decode("latin-1").split("\r\n")
    first = lines[0]
    version = first[:8]
    code = first[9:12]
    if version[:7] != "HTTP/1." or first[8:9] != " " or not code.isdigit():
        raise _ProtocolError(f"bad status line {first[:100]!r}")
    status = int(code)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise _ProtocolError(f"bad header line {line[:100]!r}")
        headers[name.strip().lower()] = value.strip()
    keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    if no_body or status == 204 or status == 304 or status < 200:
        return _Head(status, headers, keep_alive, 0, False)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _Head(status, headers, keep_alive, -1, True)
    raw = headers.get("content-length")
    if raw is None:
        return _Head(status, headers, keep_alive, -1, False)
    if not raw.isdigit():
        raise _ProtocolError(f"bad Content-Length {raw[:40]!r}")
    return _Head(status, headers, keep_alive, int(raw), False)


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

    def _parse_head(self, head_bytes: bytes) -> None:
        head = _parse_head(head_bytes, self._no_body)
        self._status, self._headers = head.status, head.headers
        self._keep_alive = head.keep_alive
        self._length = head.length
        self._chunked = head.chunked
        self._until_close = not head.chunked and head.length < 0

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
        # At most ``limit`` requests (and so connections) at once; 0: no limit.
        self._slots = asyncio.Semaphore(limit if limit > 0 else 2**31)
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
            conn = self._idle_connection(loop.time()) or await self._connect(loop, deadline)
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

    def _idle_connection(self, now: float) -> _Connection | None:
        """The most recently used idle connection still fit for a request, if any."""
        idle = self._idle
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
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, deadline: float) -> _Connection:
        """A new connection (connecting within ``connect_timeout`` and the deadline)."""
        if self.closed:
            raise ConnectFailed("the client is closed")
        now = loop.time()
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


class LineStream(asyncio.Protocol):
    """One streamed answer (a watch): its status and headers, then its body line by line.

    The body is decoded from ``Transfer-Encoding: chunked`` (or taken as is until the connection
    ends) as it arrives, in ``data_received``; complete lines wait in a queue for
    :meth:`read_line`. A stream silent for ``silence`` seconds is dropped (:meth:`read_line`
    raises :class:`RequestTimeout`): one timer per stream, re-armed only when it fires, so a busy
    stream costs no timer work per line. An answer other than 200 is read whole (its body is
    then :attr:`error_body`).
    """

    def __init__(self, max_line: int) -> None:
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.error_body: bytes | None = None
        self._max_line = max_line
        self._raw = bytearray()  # received, not yet decoded
        self._head_done = False
        self._chunked = False
        self._chunk_left = 0  # bytes of the current chunk still to come, -1: its CRLF is next
        self._length = -1  # Content-Length of a non-200 answer
        self._line = bytearray()  # the current (incomplete) line
        self._lines: deque[bytes] = deque()
        self._ended: Exception | None = None  # set once no more lines will come
        self._eof = False  # the body ended cleanly
        self._waiter: asyncio.Future[None] | None = None
        self._silence = 0.0
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._ended is not None or self._eof:
            return
        if self._loop is not None:
            self._last = self._loop.time()
        raw = self._raw
        raw += data
        try:
            if not self._head_done:
                end = raw.find(b"\r\n\r\n")
                if end < 0:
                    if len(raw) > MAX_HEAD:
                        raise _ProtocolError("response head too large")
                    return
                head = _parse_head(bytes(raw[:end]), no_body=False)
                del raw[: end + 4]
                if 100 <= head.status < 200:
                    self.data_received(b"")
                    return
                self._head_done = True
                self.status, self.headers = head.status, head.headers
                self._chunked = head.chunked
                self._length = head.length
                self._wake()
            if self.status != 200:
                self._error_answer()
            elif self._chunked:
                self._dechunk()
            else:
                self._split(bytes(raw))
                raw.clear()
        except _ProtocolError as exc:
            self._end(ConnectionLost(f"malformed answer: {exc}"))

    def eof_received(self) -> bool | None:
        return None  # close: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._head_done and self.status != 200 and self.error_body is None:
            self.error_body = bytes(self._raw)
        if self._head_done and not self._chunked and self.status == 200:
            self._eof = True  # a body without framing ends with the connection
            self._wake()
        self._end(ConnectionLost(str(exc) if exc else "the server closed the connection"))

    # -- decoding

    def _error_answer(self) -> None:
        raw = self._raw
        if self._chunked:
            return  # read until the connection ends (an error answer is small)
        if self._length >= 0 and len(raw) >= self._length:
            self.error_body = bytes(raw[: self._length])
            self._eof = True
            self._wake()

    def _dechunk(self) -> None:
        raw = self._raw
        pos = 0
        size = len(raw)
        while pos < size:
            left = self._chunk_left
            if left > 0:  # inside a chunk that arrived in pieces
                take = min(left, size - pos)
                self._split(bytes(raw[pos : pos + take]))
                pos += take
                self._chunk_left = left - take
                if self._chunk_left == 0:
                    self._chunk_left = -1
                continue
            if left < 0:  # the CRLF after a chunk's data
                if size - pos < 2:
                    break
                if raw[pos : pos + 2] != b"\r\n":
                    raise _ProtocolError("chunk not followed by CRLF")
                pos += 2
                self._chunk_left = 0
                continue
            end = raw.find(b"\r\n", pos)
            if end < 0:
                if size - pos > 1024:
                    raise _ProtocolError("chunk size line too long")
                break
            text = bytes(raw[pos:end]).partition(b";")[0].strip()
            try:
                chunk = int(text, 16)
            except ValueError:
                raise _ProtocolError(f"bad chunk size {text[:20]!r}") from None
            if chunk == 0:  # the last chunk: the body is complete
                self._eof = True
                self._wake()
                pos = size
                break
            start = end + 2
            stop = start + chunk
            if stop + 2 <= size:  # the whole chunk is here (the usual case): one step
                if raw[stop : stop + 2] != b"\r\n":
                    raise _ProtocolError("chunk not followed by CRLF")
                self._split(bytes(raw[start:stop]))
                pos = stop + 2
                continue
            pos = start
            self._chunk_left = chunk
        if pos >= size:
            raw.clear()
        else:
            del raw[:pos]

    def _split(self, data: bytes) -> None:
        line = self._line
        if data and not line and data.find(b"\n") == len(data) - 1:  # one line (the usual case)
            self._lines.append(data[:-1])
            self._wake()
            return
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                line += data[start:]
                if len(line) > self._max_line:
                    raise _ProtocolError("line too long")
                break
            if line:
                line += data[start:end]
                self._lines.append(bytes(line))
                line.clear()
            else:
                self._lines.append(data[start:end])
            start = end + 1
        if self._lines:
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _end(self, exc: Exception) -> None:
        if self._ended is None:
            self._ended = exc
        self._wake()
        if self.transport is not None:
            self.transport.abort()

    # -- the silence timer

    def watch_silence(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        """Drop the stream once nothing arrived for ``seconds`` (from now on)."""
        self._loop = loop
        self._silence = seconds
        self._last = loop.time()
        if self._timer is None:
            self._timer = loop.call_at(self._last + seconds, self._check_silence)

    def _check_silence(self) -> None:
        assert self._loop is not None
        due = self._last + self._silence
        if self._loop.time() >= due:
            self._timer = None
            self._end(RequestTimeout(f"nothing received for {self._silence}s"))
        else:
            self._timer = self._loop.call_at(due, self._check_silence)

    # -- reading

    async def read_head(self) -> None:
        """Wait for the status and headers (and, for an answer other than 200, the body)."""
        while not self._head_done or (self.status != 200 and not self._eof):
            if self._ended is not None:
                if self._head_done and self.error_body is not None:
                    return
                raise self._ended
            await self._wait()

    async def read_line(self) -> bytes | None:
        """The next line of the body (without its newline), or None at its end."""
        while not self._lines:
            if self._eof:
                return None
            if self._ended is not None:
                raise self._ended
            await self._wait()
        return self._lines.popleft()

    async def _wait(self) -> None:
        assert self._waiter is None or self._waiter.done()
        loop = self._loop or asyncio.get_running_loop()
        self._waiter = loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        """Drop the connection (idempotent)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._end(ConnectionLost("closed"))


async def open_stream(
    host: str, port: int, ssl: _ssl.SSLContext | None, data: bytes, *, max_line: int
) -> LineStream:
    """Connect, send ``data`` (a whole request) and answer the :class:`LineStream` of its answer
    (not yet read: await :meth:`LineStream.read_head`). Raises :class:`ConnectFailed`."""
    loop = asyncio.get_running_loop()
    try:
        transport, stream = await loop.create_connection(
            lambda: LineStream(max_line),
            host,
            port,
            ssl=ssl,
            server_hostname=host if ssl is not None else None,
        )
    except (OSError, _ssl.SSLError) as exc:
        raise ConnectFailed(f"{type(exc).__name__}: {exc}") from None
    stream.transport = transport
    stream._loop = loop
    transport.write(data)
    return stream
