"""The client end of a session: one connection to ``aioelastic serve`` for every request, watch
and keep-alive of one :class:`~aioelastic.store.http.HttpStore` (see ``docs/http-api.md``).

:class:`SessionClient` connects on first use (:mod:`._session_dial`), pipelines requests (those
of one loop turn are one message, :mod:`._client_conn`), and when the connection is lost
reconnects at once in the background if it has watches or leases, resuming the session (its
leases stay) and every watch from the revision after the last one it delivered. A request in
flight when the connection is lost: a read is sent again, a write raises
:class:`~aioelastic.errors.WriteOutcomeUnknownError` (it is never sent twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import ssl as _ssl
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import anyio

from ...errors import (
    StoreAuthError,
    StoreClosedError,
    StoreConnectionError,
)
from ._client_conn import Connection, ConnectionLost
from ._client_watchdog import Watchdog
from ._session_dial import Backoff, Dialer, NotYet
from ._session_errors import Refused, describe, error_from_frame, lost_error, timed_out

__all__ = ["ConnectionLost", "Refused", "SessionClient", "error_from_frame"]

log = logging.getLogger("aioelastic.store.http")


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
        self.request_timeout = request_timeout
        self.progress_interval = progress_interval
        self.reconnect_timeout = reconnect_timeout
        self.read_retries = read_retries
        self._limit = _Slots(max_in_flight) if max_in_flight else None
        self._conn: Connection | None = None
        self._connecting: asyncio.Future[Connection] | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._next_id = 1
        self._resume: str | None = None
        self.leases: set[int] = set()  # granted through this session (claimed on a new one)
        self.watches: set[Any] = set()  # every live SessionWatch
        self.closed = False
        self.version = 0
        self.grace = 0.0
        self.resumes = 0
        self.connects = 0
        #: connection attempts that failed in a way that may pass, and were tried again
        self.connect_retries = 0

    # -- connecting

    async def connection(self) -> Connection:
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

    async def _connection_within(self, budget: float) -> Connection:
        conn = self._conn
        if conn is not None:
            return conn
        if self.closed:
            raise StoreClosedError(f"the store of {self.url} was closed")
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect(budget))
        connecting = self._connecting
        try:
            conn = await asyncio.shield(connecting)
            # every caller that waited wakes in this loop turn: their first requests go in one
            # write (a first join's watch and lease grant, say), not the first alone
            conn.batch_this_turn()
            return conn
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if connecting.cancelled() and self.closed and not (task and task.cancelling()):
                # aclose() stopped the connecting its callers shared: theirs is not cancelled
                raise StoreClosedError(f"the store of {self.url} was closed") from None
            raise
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None
                if not connecting.cancelled():
                    connecting.exception()  # retrieved: reported to every waiter

    async def _connect(self, budget: float) -> Connection:
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
                conn, welcome = await self.dialer.dial(hello, max(0.0, deadline - loop.time()))
            except NotYet as exc:
                self.connect_retries += 1
                left = deadline - loop.time()
                if self.closed:
                    raise StoreClosedError(f"the store of {self.url} was closed") from None
                # the server's refusal says more than the last attempt cut by the deadline
                refused = exc if exc.status else refused
                if left <= 0:
                    last = refused if refused is not None else exc
                    raise self._gave_up(last, budget, backoff.attempts + 1) from None
                if backoff.attempts == 0:
                    _say_not_answering(self.url, exc, budget)
                await asyncio.sleep(min(backoff.next_delay(), left))
                continue
            if self.closed:
                conn.close()
                raise StoreClosedError(f"the store of {self.url} was closed")
            return self._established(conn, welcome)

    def _gave_up(self, last: NotYet, budget: float, attempts: int) -> NotYet:
        """The error for the caller: the last attempt's, with the server's reason for a refusal
        and how long it was tried."""
        reason = last.reason
        tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
        return NotYet(
            f"{last}{': ' + reason if reason else ''} (still, after {tries} within {budget:g}s)",
            last.status,
            reason,
        )

    def _established(self, conn: Connection, welcome: dict[str, Any]) -> Connection:
        self.version = int(welcome.get("version", 0))
        self.grace = float(welcome.get("grace", 0.0))
        if welcome.get("resumed"):
            self.resumes += 1
        self._resume = str(welcome.get("resume", "")) or None
        owned = welcome.get("leases")
        if isinstance(owned, list):  # what the session owns now (ended leases are forgotten)
            self.leases = {lease for lease in owned if isinstance(lease, int)}
        self.connects += 1
        silence = 3 * self.progress_interval
        conn.watchdog = Watchdog(conn, silence, functools.partial(self._probe, conn))
        self._conn = conn
        conn.attach(self._lost, int(welcome.get("max_message", 4 << 20)))
        for watch in list(self.watches):
            watch.resubscribe(self, conn)
        return conn

    def _lost(self, conn: Connection) -> None:
        """The connection ended (``conn.reason`` says why, when known)."""
        if self._conn is conn:
            self._conn = None
        conn.pending.fail_all(ConnectionLost(conn.reason or "the connection ended"))
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

    def register_watch(self, conn: Connection, watch: Any, args: list[Any]) -> asyncio.Future[Any]:
        """Send a ``watch`` request; its frames go to ``watch`` from now on."""
        rid = self._take_id()
        loop = asyncio.get_running_loop()
        if not conn.watches:  # the watchdog's silence is counted from now on
            conn.unwatched_at = loop.time()
        conn.watches[rid] = watch
        future = conn.request(rid, "watch", args, math.inf)  # (its caller's deadline)
        watch.wire_id = rid
        return future

    def unwatch(self, watch: Any) -> None:
        conn = self._conn
        rid = watch.wire_id
        if conn is not None and conn.watches.get(rid) is watch:
            del conn.watches[rid]
            self._send_and_forget(conn, "unwatch", [rid])

    def _probe(self, conn: Connection) -> None:
        """The watchdog's question to a silent server: ``revision``, answered at once (any
        message that arrives counts; the connection's watchdog keeps the deadline)."""
        self._send_and_forget(conn, "revision", [])

    def _send_and_forget(self, conn: Connection, op: str, args: list[Any]) -> None:
        future = conn.request(self._take_id(), op, args, math.inf)
        future.add_done_callback(_retrieve)  # (its answer, or the connection's end: unread)

    def _take_id(self) -> int:
        rid = self._next_id
        self._next_id = rid + 1 if rid < 2**62 else 1
        return rid

    async def call(
        self,
        op: str,
        args: list[Any],
        write: bool,
        what: str,
        key: str | None = None,
        convert: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Send one request and return its answer's value (``convert(value)`` if given), or
        raise an aioelastic error naming the call ``what`` (and ``key``: "get 'k'")."""
        limit = self._limit
        if limit is not None and not limit.try_take():
            await self._slot(limit, describe(what, key))
        try:
            attempts = 1 if write else 1 + self.read_retries
            attempt = 0
            while True:
                conn = self._conn
                if conn is None:
                    try:
                        conn = await self.connection()
                    except StoreConnectionError:
                        # Not connected: nothing was sent, so even a write had no effect.
                        attempt += 1
                        if attempt == attempts:
                            raise
                        await asyncio.sleep(retry_pause(attempt))
                        continue
                rid = self._take_id()
                try:
                    value = await conn.request(rid, op, args, self.request_timeout)
                except Refused as refused:
                    raise refused.error(describe(what, key), write=write) from None
                except TimeoutError:
                    raise timed_out(self, describe(what, key), write) from None
                except ConnectionLost as exc:
                    attempt += 1
                    last = attempt == attempts
                    error = lost_error(self, exc, describe(what, key), write, last=last)
                    if error is not None:
                        raise error from None
                    await asyncio.sleep(retry_pause(attempt))  # a read, sent again
                    continue
                return value if convert is None else convert(value)
        finally:
            if limit is not None:
                limit.give()

    async def _slot(self, limit: _Slots, what: str) -> None:
        try:
            async with asyncio.timeout(self.request_timeout):
                await limit.take()
        except TimeoutError:
            # nothing was sent: the outcome is known (not applied), even for a write
            raise StoreConnectionError(
                f"{what}: no request slot within {self.request_timeout:g}s "
                "(max_connections requests in flight)"
            ) from None

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
            conn.close()  # a FIN: the server ends the session (its leases go after the grace)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(conn.closed)
            conn.abort("the store was closed")


def retry_pause(attempt: int) -> float:
    """Seconds to wait before a call's ``attempt``-th retry (from 1): 50 ms, doubling."""
    pause: float = 0.05 * 2 ** (attempt - 1)
    return pause


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # (a probe lost with its connection: nobody waits for it)


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
        "the store at %s does not answer (%s); retrying with backoff for up to %g s",
        url,
        exc,
        budget,
    )
