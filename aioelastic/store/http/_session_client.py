"""The client end of a session: one WebSocket to ``aioelastic serve`` for every request, watch and
keep-alive of one :class:`~aioelastic.store.http.HttpStore` (see ``docs/http-api.md``).

:class:`SessionClient` connects on first use, pipelines requests (one message per batch), and
when the connection is lost reconnects at once in the background if it has watches or leases,
resuming the session (its leases stay) and every watch from the revision after the last one it
delivered. A request in flight when the connection is lost: a read is sent again, a write raises
:class:`~aioelastic.errors.WriteOutcomeUnknownError` (it is never sent twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl as _ssl
import time
from collections import deque
from collections.abc import Awaitable, Mapping
from typing import Any

import aiohttp
import anyio

from ...errors import (
    CompactedError,
    LeaseNotFoundError,
    StoreAuthError,
    StoreClosedError,
    StoreConnectionError,
    StoreTimeoutError,
    TxnTooLargeError,
    ValueTooLargeError,
    WriteOutcomeUnknownError,
    WriteTimeoutError,
)
from .._types import WatchEvent
from ._frames import (
    ERROR,
    EVENTS,
    PROGRESS,
    REQUEST,
    RESULT,
    WATCH_END,
    FrameError,
    decode_events,
    pack,
    unpack_all,
)
from ._session_dial import Backoff, Dialer, NotYet

__all__ = ["ConnectionLost", "Refused", "SessionClient", "error_from_frame"]

log = logging.getLogger("aioelastic.store.http")


class ConnectionLost(Exception):
    """The connection ended with the request pending (it had been sent)."""


def error_from_frame(code: Any, message: Any, extra: Any, what: str, *, write: bool) -> Exception:
    """The aioelastic error for an ``ERROR`` frame."""
    extra = extra if isinstance(extra, dict) else {}
    text = f"{what}: {message}"
    if code == "lease_not_found":
        return LeaseNotFoundError(int(extra.get("lease", 0)))
    if code == "compacted":
        return CompactedError(
            int(extra.get("requested_revision", 0)), int(extra.get("compact_revision", 0))
        )
    if code == "txn_too_large":
        return TxnTooLargeError(
            str(extra.get("limit", "ops")),
            int(extra.get("maximum", 0)),
            int(extra.get("size", 0)),
            "the transaction (as the server counts it)",
        )
    if code in ("value_too_large", "key_too_large"):
        return ValueTooLargeError(text)
    if code == "bad_request":
        return ValueError(text)
    if code == "unauthorized":
        return StoreAuthError(text)
    if code == "storage_error" and write:
        return WriteOutcomeUnknownError(text)
    return StoreConnectionError(f"{text} ({code})")


class _Connection:
    """One WebSocket: its writer (a batch per message), its pending requests and watches."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, max_message: int) -> None:
        self.ws = ws
        self.max_message = max_message
        self.pending: dict[int, tuple[asyncio.Future[Any], bool]] = {}  # id -> (future, write)
        self.watches: dict[int, Any] = {}  # id -> SessionWatch
        self.lost = False
        self.reason = ""
        self.last_received = asyncio.get_running_loop().time()
        #: the last watchdog check that found no watches (silence is measured from then on)
        self.unwatched_at = self.last_received
        self.watchdog: asyncio.TimerHandle | None = None
        self._outbox: list[bytes] = []
        self._size = 0
        self._wake = asyncio.Event()
        self._busy = False  # a message is being written (the writer's or a caller's)
        self.writer = asyncio.ensure_future(self._write())
        self.reader: asyncio.Task[None] | None = None

    def send(self, frame: list[Any]) -> None:
        data = pack(frame)
        self._outbox.append(data)
        self._size += len(data)
        self._wake.set()

    def idle(self) -> bool:
        """Nothing queued and nothing being written: a lone request may go out from its
        caller at once (a sequential client saves the hand-over to the writer task)."""
        return not self._outbox and not self._busy

    async def send_at_once(self, frame: list[Any]) -> None:
        # An uncompressed WebSocket frame is written to the transport synchronously, so this
        # cannot interleave with the writer's messages.
        self._busy = True
        try:
            await self.ws.send_bytes(pack(frame))
        finally:
            self._busy = False

    async def _write(self) -> None:
        ws = self.ws
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._busy = True
            try:
                await self._write_outbox(ws)
            finally:
                self._busy = False

    async def _write_outbox(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while self._outbox:
            batch, self._outbox, self._size = self._outbox, [], 0
            # a batch larger than the server's message bound goes as several messages
            start = 0
            while start < len(batch):
                end, size = start, 0
                while end < len(batch) and (
                    end == start or size + len(batch[end]) <= self.max_message
                ):
                    size += len(batch[end])
                    end += 1
                chunk = batch[start:end]
                await ws.send_bytes(chunk[0] if len(chunk) == 1 else b"".join(chunk))
                start = end

    def check_silence(self, silence: float) -> None:
        """The watchdog: a connection with watches hears from the server at least every
        progress interval, so ``silence`` (3 intervals) without a message while it has watches
        ends it. One timer per connection, not a receive timeout per message."""
        if self.lost:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if not self.watches:
            self.unwatched_at = now  # silence counts only while there are watches
        elif now - max(self.last_received, self.unwatched_at) >= silence:
            self.abort(f"nothing received for {silence:g}s (3 progress intervals)")
            return
        since = max(self.last_received, self.unwatched_at)
        self.watchdog = loop.call_later(
            max(since + silence - now, 0.01), self.check_silence, silence
        )

    def abort(self, reason: str) -> None:
        if not self.reason:
            self.reason = reason
        if self.reader is not None:
            self.reader.cancel()


class SessionClient:
    """A session to ``base_url`` (``http(s)://host:port[/prefix]``)."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        ssl: _ssl.SSLContext | None,
        connect_timeout: float,
        request_timeout: float,
        progress_interval: float,
        reconnect_timeout: float,
        read_retries: int,
        max_in_flight: int,
    ) -> None:
        self.url = base_url
        self.dialer = Dialer(base_url, headers=headers, ssl=ssl, connect_timeout=connect_timeout)
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.progress_interval = progress_interval
        self.reconnect_timeout = reconnect_timeout
        self.read_retries = read_retries
        self._limit = _Slots(max_in_flight) if max_in_flight else None
        self._conn: _Connection | None = None
        self._connecting: asyncio.Future[_Connection] | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._next_id = 1
        self._resume: str | None = None
        self.leases: set[int] = set()  # granted through this session (claimed on a new one)
        self.watches: set[Any] = set()  # every live SessionWatch
        self._closing: set[asyncio.Future[None]] = set()
        self._last_blob = b""
        self._last_events: list[WatchEvent] = []
        self.closed = False
        self.version = 0
        self.grace = 0.0
        self.resumes = 0
        self.connects = 0
        #: connection attempts that failed in a way that may pass, and were tried again
        self.connect_retries = 0

    # -- connecting

    async def connection(self) -> _Connection:
        """The live connection, connecting (once, shared by concurrent callers) if needed:
        retrying with backoff while connecting fails in a way that may pass (see
        :meth:`_connect`), within the request deadline or the caller's own (an enclosing anyio
        cancel scope's, ``anyio.fail_after(join_timeout)`` say) if that is later."""
        if self._conn is not None:
            return self._conn
        budget = self.request_timeout
        deadline = anyio.current_effective_deadline()
        if deadline != math.inf:
            budget = max(budget, deadline - anyio.current_time())
        return await self._connection_within(budget)

    async def _connection_within(self, budget: float) -> _Connection:
        conn = self._conn
        if conn is not None:
            return conn
        if self.closed:
            raise StoreClosedError(f"the store of {self.url} was closed")
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect(budget))
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None
                if not connecting.cancelled():
                    connecting.exception()  # retrieved: reported to every waiter

    async def _connect(self, budget: float) -> _Connection:
        """Dial until connected or ``budget`` seconds have passed: a refused or timed-out
        connection, or an answer that may change (503 over the server's connection limit), is
        tried again after a full-jitter backoff (:class:`Backoff`), so that thousands of clients
        starting at once, or before their server, connect instead of failing; a refused token or
        anything else that will not change is raised at once. A caller's own deadline (a join
        timeout, say) cancels its wait, not the attempts other callers share."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        backoff = Backoff(cap=min(2.0, max(0.05, budget / 4)))
        refused: NotYet | None = None  # the last attempt the server answered with a status
        while True:
            hello = {
                "resume": self._resume,
                "leases": sorted(self.leases),
                "progress_interval": self.progress_interval,
            }
            try:
                ws, welcome = await self.dialer.dial(hello, max(0.0, deadline - loop.time()))
            except NotYet as exc:
                self.connect_retries += 1
                left = deadline - loop.time()
                if self.closed:
                    raise StoreClosedError(f"the store of {self.url} was closed") from None
                # the server's refusal says more than the last attempt cut by the deadline
                refused = exc if exc.status else refused
                if left <= 0:
                    last = refused if refused is not None else exc
                    raise await self._gave_up(last, budget, backoff.attempts + 1) from None
                if backoff.attempts == 0:
                    _say_not_answering(self.url, exc, budget)
                await asyncio.sleep(min(backoff.next_delay(), left))
                continue
            if self.closed:
                await ws.close()
                raise StoreClosedError(f"the store of {self.url} was closed")
            return self._established(ws, welcome)

    async def _gave_up(self, last: NotYet, budget: float, attempts: int) -> NotYet:
        """The error for the caller: the last attempt's, with the server's reason for a refusal
        (asked for once, now) and how long it was tried."""
        reason = await self.dialer.refusal(last.status) if last.status else ""
        return NotYet(
            f"{last}{': ' + reason if reason else ''} (still, after {attempts} attempts "
            f"within {budget:g}s)",
            last.status,
        )

    def _established(
        self, ws: aiohttp.ClientWebSocketResponse, welcome: dict[str, Any]
    ) -> _Connection:
        self.version = int(welcome.get("version", 0))
        self.grace = float(welcome.get("grace", 0.0))
        if welcome.get("resumed"):
            self.resumes += 1
        self._resume = str(welcome.get("resume", "")) or None
        owned = welcome.get("leases")
        if isinstance(owned, list):  # what the session owns now (ended leases are forgotten)
            self.leases = {lease for lease in owned if isinstance(lease, int)}
        self.connects += 1
        conn = _Connection(ws, int(welcome.get("max_message", 4 << 20)))
        conn.reader = asyncio.ensure_future(self._read(conn))
        self._conn = conn
        for watch in list(self.watches):
            watch.resubscribe(self, conn)
        return conn

    async def _read(self, conn: _Connection) -> None:
        loop = asyncio.get_running_loop()
        silence = 3 * self.progress_interval
        conn.watchdog = loop.call_later(silence, conn.check_silence, silence)
        try:
            while True:
                # (no receive timeout: a timer per message costs more than the watchdog's one)
                message = await conn.ws.receive()
                if message.type is not aiohttp.WSMsgType.BINARY:
                    if message.type is aiohttp.WSMsgType.CLOSE and not conn.reason:
                        conn.reason = f"closed by the server ({message.data}: {message.extra})"
                    break
                conn.last_received = loop.time()
                try:
                    for frame in unpack_all(message.data, max_len=1 << 31):
                        self._on_frame(conn, frame)
                except (FrameError, ValueError, TypeError) as exc:
                    conn.reason = f"a malformed frame from the server: {exc}"
                    break
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            conn.reason = conn.reason or repr(exc)
        finally:
            if conn.watchdog is not None:
                conn.watchdog.cancel()
            self._lost(conn)

    def _on_frame(self, conn: _Connection, frame: list[Any]) -> None:
        kind, rid = frame[0], frame[1]
        if kind in (RESULT, ERROR):
            entry = conn.pending.pop(rid, None)
            if entry is None:
                if kind == ERROR and rid == 0:
                    conn.reason = f"the server said: {frame[3]} ({frame[2]})"
                return
            future = entry[0]
            if not future.done():
                if kind == RESULT:
                    future.set_result(frame[2])
                else:
                    future.set_exception(Refused(frame[2], frame[3], frame[4]))
            return
        watch = conn.watches.get(rid)
        if watch is None:
            return
        if kind == EVENTS:
            blob = frame[2]
            if blob != self._last_blob:  # watches at one position share the decoded events
                self._last_events = decode_events(blob)
                self._last_blob = blob
            watch.on_events(self._last_events)
        elif kind == PROGRESS:
            watch.on_progress(frame[2])
        elif kind == WATCH_END:
            del conn.watches[rid]
            watch.on_end(conn, frame[2], frame[3], frame[4])

    def _lost(self, conn: _Connection) -> None:
        if conn.lost:
            return
        conn.lost = True
        if self._conn is conn:
            self._conn = None
        conn.writer.cancel()
        closing = asyncio.ensure_future(_close_quietly(conn.ws))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        lost = ConnectionLost(conn.reason or "the connection ended")
        for future, _ in conn.pending.values():
            if not future.done():
                future.set_exception(lost)
        conn.pending.clear()
        conn.watches.clear()
        if not self.closed and (self.watches or self.leases):
            self._start_reconnecting()

    def _start_reconnecting(self) -> None:
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = asyncio.ensure_future(self._reconnect())

    async def _reconnect(self) -> None:
        """Reconnect at once (within the session's grace, so its leases stay), then with backoff
        until ``reconnect_timeout``; then fail the watches."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reconnect_timeout
        error: Exception | None = None
        while not self.closed and (left := deadline - loop.time()) > 0:
            try:
                await self._connection_within(left)
                return
            except StoreClosedError:
                return
            except (StoreConnectionError, StoreAuthError) as exc:
                error = exc
                if not isinstance(exc, NotYet):
                    break  # a refused token, a rejected hello: it will not change
        for watch in list(self.watches):
            watch.fail(
                StoreConnectionError(
                    f"watch {watch.prefix!r}: the session to {self.url} was lost and not resumed "
                    f"within {self.reconnect_timeout:g}s: {error}"
                )
            )

    # -- requests

    def register_watch(self, conn: _Connection, watch: Any, args: list[Any]) -> asyncio.Future[Any]:
        """Send a ``watch`` request; its frames go to ``watch`` from now on."""
        rid = self._take_id()
        loop = asyncio.get_running_loop()
        if not conn.watches:  # the watchdog's silence is counted from now on
            conn.unwatched_at = loop.time()
        conn.watches[rid] = watch
        future: asyncio.Future[Any] = loop.create_future()
        conn.pending[rid] = (future, False)
        conn.send([REQUEST, rid, "watch", args])
        watch.wire_id = rid
        return future

    def unwatch(self, watch: Any) -> None:
        conn = self._conn
        rid = watch.wire_id
        if conn is not None and conn.watches.get(rid) is watch:
            del conn.watches[rid]
            self._send_and_forget(conn, "unwatch", [rid])

    def _send_and_forget(self, conn: _Connection, op: str, args: list[Any]) -> None:
        rid = self._take_id()
        conn.send([REQUEST, rid, op, args])

    def _take_id(self) -> int:
        rid = self._next_id
        self._next_id = rid + 1 if rid < 2**62 else 1
        return rid

    def call(self, op: str, args: list[Any], *, write: bool, what: str) -> Awaitable[Any]:
        """Send one request and return its answer's value, or raise an aioelastic error."""
        if self._limit is None:
            return self._call(op, args, write, what)  # (no coroutine frame of its own)
        return self._call_limited(self._limit, op, args, write, what)

    async def _call_limited(
        self, limit: _Slots, op: str, args: list[Any], write: bool, what: str
    ) -> Any:
        if not limit.try_take():
            try:
                async with asyncio.timeout(self.request_timeout):
                    await limit.take()
            except TimeoutError:
                # nothing was sent: the outcome is known (not applied), even for a write
                raise StoreConnectionError(
                    f"{what}: no request slot within {self.request_timeout:g}s "
                    "(max_connections requests in flight)"
                ) from None
        try:
            return await self._call(op, args, write, what)
        finally:
            limit.give()

    async def _call(self, op: str, args: list[Any], write: bool, what: str) -> Any:
        attempts = 1 if write else 1 + self.read_retries
        loop = asyncio.get_running_loop()
        for attempt in range(attempts):
            try:
                conn = await self.connection()
            except StoreConnectionError:
                # Not connected: nothing was sent, so even a write had no effect.
                if attempt + 1 == attempts:
                    raise
                await asyncio.sleep(0.05 * 2**attempt)
                continue
            rid = self._take_id()
            future: asyncio.Future[Any] = loop.create_future()
            conn.pending[rid] = (future, write)
            frame = [REQUEST, rid, op, args]
            alone = len(conn.pending) == 1 and conn.idle()
            if not alone:
                conn.send(frame)
            deadline = _Deadline(loop, self.request_timeout, future)
            try:
                if alone:
                    await deadline.send(conn, frame)
                return await future
            except Refused as refused:
                raise refused.error(what, write=write) from None
            except TimeoutError:
                conn.pending.pop(rid, None)
                if self.closed:
                    raise StoreClosedError(f"the store was closed during {what}") from None
                if write:
                    # Sent, and no answer before the deadline: a timeout (StoreTimeoutError)
                    # whose outcome is unknown (WriteOutcomeUnknownError), as with etcd.
                    raise WriteTimeoutError(
                        f"{what} timed out: sent to {self.url}, no answer within the "
                        f"{self.request_timeout:g}s deadline; it may or may not have applied"
                    ) from None
                raise StoreTimeoutError(f"{what} timed out ({self.url})") from None
            except ConnectionLost as exc:
                if self.closed:
                    raise StoreClosedError(f"the store was closed during {what}") from None
                if write:
                    raise WriteOutcomeUnknownError(
                        f"{what}: the session to {self.url} was lost after the request was sent "
                        f"({exc}); it may or may not have applied"
                    ) from None
                if attempt + 1 == attempts:
                    raise StoreConnectionError(
                        f"{what}: the session to {self.url} was lost ({exc})"
                    ) from None
                await asyncio.sleep(0.05 * 2**attempt)
            finally:
                deadline.cancel()
        raise AssertionError("unreachable")  # pragma: no cover

    # -- closing

    async def aclose(self) -> None:
        self.closed = True
        for task in (self._reconnecting, self._connecting):
            if task is not None and not task.done():
                task.cancel()
        for watch in list(self.watches):
            watch.fail(StoreClosedError(f"the store of {self.url} was closed"))
        conn = self._conn
        if conn is not None:
            conn.reason = "the store was closed"
            if conn.reader is not None:
                conn.reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await conn.reader
            await _close_quietly(conn.ws)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        await self.dialer.aclose()


class _Slots:
    """At most ``size`` requests in flight, waiters served in order: ``asyncio.Semaphore``
    without its cost per call (its ``locked()`` scans the waiters on every acquire)."""

    __slots__ = ("_waiters", "free")

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_take(self) -> bool:
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        return False

    async def take(self) -> None:
        """Wait for a slot (given by :meth:`give` straight to the first waiter)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.give()  # handed a slot as we were cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(future)
            raise

    def give(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1


class _Deadline:
    """A request's deadline: one timer, cheaper than ``asyncio.timeout`` around every call.

    When it passes, the answer's future fails with :class:`TimeoutError`; a caller still
    writing its request (:meth:`send`: the transport is applying back-pressure) is cancelled
    out of the write, which then raises :class:`TimeoutError` as well.
    """

    __slots__ = ("expired", "future", "handle", "sender")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, seconds: float, future: asyncio.Future[Any]
    ) -> None:
        self.future = future
        self.expired = False
        self.sender: asyncio.Task[Any] | None = None
        # an infinite timeout is no deadline (and no timer: uvloop's cannot be that far off)
        self.handle = loop.call_later(seconds, self._expire) if seconds < 1e9 else None

    def _expire(self) -> None:
        self.expired = True
        if self.sender is not None:  # (the future is left alone: nobody would retrieve it)
            self.sender.cancel()
        elif not self.future.done():
            self.future.set_exception(TimeoutError())

    async def send(self, conn: _Connection, frame: list[Any]) -> None:
        """Write ``frame`` from the caller (a lone request), within the deadline."""
        self.sender = task = asyncio.current_task()
        try:
            await conn.send_at_once(frame)
        except asyncio.CancelledError:
            # Cancelled while the transport applied back-pressure (the frame is written, the
            # drain is awaited). aiohttp leaves its shared drain waiter cancelled, so any later
            # write on this WebSocket would raise CancelledError: the connection ends here.
            self.future.cancel()  # (not awaited any more: its ConnectionLost goes nowhere)
            conn.abort("a request was cancelled while the server was not reading")
            if task is None or task.cancelling() == 0:  # nobody cancelled us: a stale waiter
                raise ConnectionLost("the connection's writer was cancelled") from None
            if self.expired and task.uncancel() == 0:
                raise TimeoutError from None  # our cancellation, and nobody else's
            raise
        except Exception:  # a failed send: the reader sees the connection end and says so
            pass
        finally:
            self.sender = None

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()


#: When each store URL was last said not to answer (monotonic seconds): said once a while, not
#: once per client (ten thousand clients of one process would say it ten thousand times).
_said_not_answering: dict[str, float] = {}
_SAY_EVERY = 10.0


def _say_not_answering(url: str, exc: Exception, budget: float) -> None:
    """Tell the user at once that the store does not answer, while connecting goes on."""
    now = time.monotonic()
    if now - _said_not_answering.get(url, -math.inf) < _SAY_EVERY:
        return
    _said_not_answering[url] = now
    log.warning(
        "the store at %s does not answer (%s); retrying with backoff for up to %.0f s",
        url,
        exc,
        budget,
    )


class Refused(Exception):
    """An ``ERROR`` answer, mapped to an aioelastic error by :meth:`error`."""

    def __init__(self, code: Any, message: Any, extra: Any) -> None:
        super().__init__(code, message)
        self.code, self.message, self.extra = code, message, extra

    def error(self, what: str, *, write: bool) -> Exception:
        return error_from_frame(self.code, self.message, self.extra, what, write=write)


async def _close_quietly(ws: aiohttp.ClientWebSocketResponse) -> None:
    with contextlib.suppress(Exception):
        await ws.close()
