"""The HTTP store client: ``open_store("http://host:29400")`` / ``https://``.

Every request, watch and lease keep-alive of one store goes over one session: a connection to
``aioelastic serve`` at ``/v1/session`` upgraded to the session transport, msgpack frames in
length-prefixed messages (:mod:`._session_client`; the protocol is in ``docs/http-api.md``).
Requests are pipelined; watches are pushed by the server. Reads are retried on connection
errors; writes never are: a write whose request may have reached the server raises
:class:`~aioelastic.errors.WriteOutcomeUnknownError`, or its subclass
:class:`~aioelastic.errors.WriteTimeoutError` (also a ``StoreTimeoutError``) when no answer came
before the deadline. A lost session is resumed at once (its leases stay, see "session-bound
leases" in ``docs/store.md``) and every watch resumes from the last revision seen + 1, so no event
is lost or repeated. Every socket, TLS and protocol error is translated to aioelastic's errors.
"""

from __future__ import annotations

import asyncio
import os
import ssl as _ssl
from collections import deque
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

from ...errors import StoreClosedError, StoreConnectionError
from .._base import Store, Watch
from .._txn import Get, Range, Txn, TxnOp, TxnResult
from .._types import (
    CasResult,
    KeyValue,
    LeaseGrant,
    LeaseStatus,
    RangeResult,
    WatchEvent,
)
from ._frames import (
    kv_from_wire,
    lease_status_from_wire,
    range_from_wire,
)
from ._session_client import ConnectionLost, Refused, SessionClient, error_from_frame
from ._txn_wire import result_from_frame, txn_to_frame

__all__ = ["HttpStore", "open_http_store"]

#: Environment variable read for the bearer token when no ``token``/``token_file`` is given.
TOKEN_ENV = "AIOELASTIC_TOKEN"
#: ... else a file holding the token (what an agent gives its workers).
TOKEN_FILE_ENV = "AIOELASTIC_TOKEN_FILE"


def _ssl_context(ssl: _ssl.SSLContext | bool) -> _ssl.SSLContext:
    """The context for ``ssl=``: a given one, the default (verifying) one, or, for ``False``,
    one that checks nothing (tests only)."""
    if isinstance(ssl, _ssl.SSLContext):
        return ssl
    context = _ssl.create_default_context()
    if ssl is False:
        context.check_hostname = False
        context.verify_mode = _ssl.CERT_NONE
    return context


def _cas_result(value: list[Any]) -> CasResult:
    succeeded, revision, kv = value
    return CasResult(bool(succeeded), int(revision), None if kv is None else kv_from_wire(kv))


def _kv_or_none(value: list[Any] | None) -> KeyValue | None:
    return None if value is None else kv_from_wire(value)


def _txn_result(answer: Any) -> TxnResult:
    try:
        return result_from_frame(answer)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise StoreConnectionError(f"txn: malformed answer ({exc!r})") from None


def _writes(ops: tuple[TxnOp, ...]) -> bool:
    """Whether ``ops`` holds anything but reads (a loop: ``any()`` of a generator costs more)."""
    for op in ops:  # noqa: SIM110
        if not isinstance(op, (Get, Range)):
            return True
    return False


class HttpStore(Store):
    """A client of ``aioelastic serve``. Usually made by ``open_store("http://host:port")``.

    ``token``: the bearer token (default: the ``AIOELASTIC_TOKEN`` environment variable).
    ``ssl``: an :class:`ssl.SSLContext` for ``https://`` (or ``False`` to skip verification).
    ``timeout``: seconds for one request. ``connect_timeout``: seconds to connect.
    ``read_retries``: extra attempts for reads after a connection error.
    ``progress_interval``: how often (s) the server reports progress on an idle watch; a session
    with watches that is silent for ``3 * progress_interval`` is asked (a request answered at
    once), and counts as lost if nothing arrives within one more interval.
    ``reconnect_timeout``: how long (s) a lost session with watches or leases tries to reconnect
    before its watches raise :class:`~aioelastic.errors.StoreConnectionError`.
    ``max_connections``: requests in flight at once (0: no limit); the name is kept from the
    connection pool the session replaced.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ssl: _ssl.SSLContext | bool | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        read_retries: int = 2,
        progress_interval: float = 2.0,
        reconnect_timeout: float = 10.0,
        max_connections: int = 100,
    ) -> None:
        super().__init__()
        base = urlsplit(url)
        if base.scheme not in ("http", "https") or not base.hostname:
            raise ValueError(f"url must be http://host:port or https://host:port, got {url!r}")
        for name, number in (
            ("timeout", timeout),
            ("connect_timeout", connect_timeout),
            ("progress_interval", progress_interval),
            ("reconnect_timeout", reconnect_timeout),
        ):
            if not isinstance(number, (int, float)) or isinstance(number, bool) or number <= 0:
                raise ValueError(f"{name} must be a number of seconds > 0, got {number!r}")
        if not 0.05 <= progress_interval <= 300:
            raise ValueError(f"progress_interval must be in [0.05, 300] s, got {progress_interval}")
        if isinstance(read_retries, bool) or not isinstance(read_retries, int) or read_retries < 0:
            raise ValueError(f"read_retries must be an int >= 0, got {read_retries!r}")
        if (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 0
        ):
            raise ValueError(
                f"max_connections must be an int >= 0 (0: no limit), got {max_connections!r}"
            )
        self.url = url.rstrip("/")
        if token is None:
            token = os.environ.get(TOKEN_ENV) or None
        if token is not None and any(c in token for c in "\r\n\0"):
            raise ValueError("token must not contain CR, LF or NUL characters")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        ssl_arg: _ssl.SSLContext | bool = True if ssl is None else ssl
        self.progress_interval = float(progress_interval)
        self.reconnect_timeout = float(reconnect_timeout)
        self.session = SessionClient(
            self.url,
            headers=headers,
            ssl=_ssl_context(ssl_arg) if base.scheme == "https" else None,
            connect_timeout=float(connect_timeout),
            request_timeout=float(timeout),
            progress_interval=self.progress_interval,
            reconnect_timeout=self.reconnect_timeout,
            read_retries=read_retries,
            max_in_flight=max_connections,
        )

    def __repr__(self) -> str:
        return f"<HttpStore {self.url}{' closed' if self._closed else ''}>"

    # -- the core
    #
    # The hot calls are plain functions that return the session's coroutine: it is the one
    # Python frame between ``Store.get`` (which validated the arguments and the closed state)
    # and the transport's write, and it converts the answer (``convert``). ``what`` and ``key``
    # name the call in an error's message, formatted only when there is one.

    def _get(self, key: str) -> Coroutine[Any, Any, KeyValue | None]:
        return self.session.call("get", [key], False, "get", key, _kv_or_none)

    def _range(self, prefix: str, limit: int | None) -> Coroutine[Any, Any, RangeResult]:
        return self.session.call("range", [prefix, limit], False, "range", prefix, range_from_wire)

    def _current_revision(self) -> Coroutine[Any, Any, int]:
        return self.session.call("revision", [], False, "revision", None, int)

    def _put(self, key: str, value: bytes, lease: int) -> Coroutine[Any, Any, int]:
        return self.session.call("put", [key, value, lease], True, "put", key, int)

    def _delete(self, key: str, prefix: bool) -> Coroutine[Any, Any, int]:
        return self.session.call("delete", [key, prefix], True, "delete", key, int)

    def _compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, lease: int
    ) -> Coroutine[Any, Any, CasResult]:
        args = [key, expected_mod_revision, value, lease]
        return self.session.call("cas", args, True, "compare_and_swap", key, _cas_result)

    def _compare_and_delete(
        self, key: str, expected_mod_revision: int
    ) -> Coroutine[Any, Any, CasResult]:
        args = [key, expected_mod_revision]
        return self.session.call("cad", args, True, "compare_and_delete", key, _cas_result)

    def _add(self, key: str, delta: int) -> Coroutine[Any, Any, int]:
        return self.session.call("add", [key, delta], True, "add", key, int)

    def _txn(self, txn: Txn) -> Coroutine[Any, Any, TxnResult]:
        # only reads in both branches: a read (retried on a lost session); else a write
        write = _writes(txn.success) or _writes(txn.failure)
        return self.session.call("txn", txn_to_frame(txn), write, "txn", None, _txn_result)

    def _watch(self, prefix: str, start_revision: int | None) -> Watch:
        return SessionWatch(self, prefix, start_revision)

    async def _range_and_watch(self, prefix: str) -> tuple[RangeResult, Watch]:
        # one request: the watch's answer carries the range
        watch = SessionWatch(self, prefix, None, snapshot=True)
        await watch.start()
        assert watch.snapshot is not None
        return watch.snapshot, watch

    async def _compact(self, revision: int) -> None:
        await self.session.call("compact", [revision], True, "compact")

    async def _lease_grant(self, ttl: float) -> LeaseGrant:
        lease_id, granted = await self.session.call("lease_grant", [ttl], True, "lease_grant")
        self.session.leases.add(int(lease_id))
        return LeaseGrant(int(lease_id), float(granted))

    def _lease_keep_alive(self, lease_id: int) -> Coroutine[Any, Any, float]:
        # Idempotent (it restarts the TTL), so it may be retried like a read.
        args = [lease_id]
        return self.session.call("lease_keep_alive", args, False, "lease_keep_alive", None, float)

    async def _lease_revoke(self, lease_id: int) -> None:
        await self.session.call("lease_revoke", [lease_id], True, "lease_revoke")
        self.session.leases.discard(lease_id)

    def _lease_time_to_live(self, lease_id: int) -> Coroutine[Any, Any, LeaseStatus]:
        args = [lease_id]
        convert = lease_status_from_wire
        return self.session.call("lease_ttl", args, False, "lease_time_to_live", None, convert)

    async def _aclose(self) -> None:
        await self.session.aclose()


class SessionWatch(Watch):
    """One watch carried by the store's session; resumed by the session when it reconnects."""

    def __init__(
        self, store: HttpStore, prefix: str, start_revision: int | None, *, snapshot: bool = False
    ) -> None:
        super().__init__(prefix, start_revision)
        self._client = store.session
        self._want_snapshot = snapshot
        #: with ``snapshot=True``: the range of the prefix the watch opened with
        self.snapshot: RangeResult | None = None
        self._pending: deque[WatchEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None  # the reader parked in _next
        self._waker: Callable[[], None] | None = None  # a reader that takes events (_take)
        self._error: BaseException | None = None
        self._start_revision: int | None = None
        self._next_revision = 0  # where a resumed watch starts: last revision received + 1
        self.wire_id = 0
        self.reconnects = 0
        #: loop time of the last sign of life (the answer, an event or a progress frame)
        self._alive_at = 0.0

    @property
    def start_revision(self) -> int:
        if self._start_revision is None:
            raise RuntimeError("the watch has not started")
        return self._start_revision

    async def _start(self) -> None:
        client = self._client
        what = f"watch {self.prefix!r}"
        client.watches.add(self)
        try:
            conn = await client.connection()
            future = client.register_watch(
                conn, self, [self.prefix, self.requested_revision, self._want_snapshot]
            )
            try:
                async with asyncio.timeout(client.request_timeout):
                    created = await future
            except Refused as refused:
                raise refused.error(what, write=False) from None
            except ConnectionLost as exc:
                if client.closed:
                    raise StoreClosedError(f"the store was closed during {what}") from None
                raise StoreConnectionError(f"{what}: the session was lost ({exc})") from None
            except TimeoutError:
                raise StoreConnectionError(f"{what}: no answer from {client.url}") from None
            start, revision, snapshot = created
            if self._want_snapshot:
                count, kvs = snapshot
                self.snapshot = RangeResult(
                    kvs=tuple(kv_from_wire(kv) for kv in kvs), revision=int(revision), count=count
                )
        except BaseException:
            client.watches.discard(self)
            client.unwatch(self)
            raise
        self._start_revision = int(start)
        # (events from a start in the past may have come with the answer, in its message)
        self._next_revision = max(self._next_revision, self._start_revision)
        self._alive_at = asyncio.get_running_loop().time()

    def resubscribe(self, client: SessionClient, conn: Any) -> None:
        """A new connection: ask for the events from the next unseen revision on."""
        if self._start_revision is None or self._closed or self._error is not None:
            return
        silent = asyncio.get_running_loop().time() - self._alive_at
        if silent > client.reconnect_timeout:
            # connections succeed, yet the watch delivers nothing: a hung server
            self.fail(
                StoreConnectionError(
                    f"watch {self.prefix!r}: no progress from {client.url} for {silent:.1f}s "
                    f"(more than reconnect_timeout; resume from revision {self._next_revision})"
                )
            )
            return
        future = client.register_watch(conn, self, [self.prefix, self._next_revision, False])
        future.add_done_callback(self._resubscribed)

    def _resubscribed(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if isinstance(exc, Refused):
            self.fail(exc.error(f"watch {self.prefix!r}", write=False))
        elif exc is None:
            self.reconnects += 1  # alive only once it delivers (a hung server answers too)

    def on_events(self, decoded: list[WatchEvent], now: float) -> None:
        """Events from the server (``decoded`` is shared by the watches at one position), in a
        message that arrived at loop time ``now``."""
        self._alive_at = now
        if not decoded:
            return
        if decoded[0].kv.mod_revision < self._next_revision:  # never deliver a revision twice
            decoded = [e for e in decoded if e.kv.mod_revision >= self._next_revision]
            if not decoded:
                return
        self._pending.extend(decoded)
        self._next_revision = decoded[-1].kv.mod_revision + 1
        waiter = self._waiter  # (_wake, inline: once per watch per event)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        waker = self._waker
        if waker is not None:
            waker()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        waker = self._waker
        if waker is not None:
            waker()

    def _set_waker(self, wake: Callable[[], None] | None) -> bool:
        if wake is not None and not self._started:
            return False  # (its start is __anext__'s)
        self._waker = wake
        return True

    def _take_event(self) -> WatchEvent | None:
        pending = self._pending
        if pending:
            return pending.popleft()
        if self._closed:
            raise StopAsyncIteration
        if self._error is not None:
            raise self._error
        return None

    def _event_ready(self) -> bool:
        return bool(self._pending) or self._closed or self._error is not None

    def on_progress(self, revision: int) -> None:
        self._alive_at = asyncio.get_running_loop().time()
        self._next_revision = max(self._next_revision, int(revision) + 1)

    def on_end(self, code: str, message: str, extra: Any) -> None:
        if code == "closing":
            return  # the server is stopping: the session reconnects and resumes this watch
        self.fail(error_from_frame(code, message, extra, f"watch {self.prefix!r}", write=False))

    def fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._client.watches.discard(self)
        self._client.unwatch(self)
        self._wake()

    def __anext__(self) -> Coroutine[Any, Any, WatchEvent]:
        # Once started, straight to _next: one coroutine per event, not two (Watch.__anext__'s
        # checks are _next's own then: a closed watch ends, a failed one raises).
        if self._started and not self._closed:
            return self._next()
        return super().__anext__()

    async def _next(self) -> WatchEvent:
        pending = self._pending
        while not pending:
            if self._closed:
                raise StopAsyncIteration
            if self._error is not None:
                raise self._error
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return pending.popleft()

    async def _aclose(self) -> None:
        self._client.watches.discard(self)
        self._client.unwatch(self)
        self._wake()


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in ``path`` (surrounding whitespace removed); ``ValueError`` if unreadable."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"token file {str(path)!r} cannot be read: {exc}") from None
    if not token:
        raise ValueError(f"token file {str(path)!r} is empty")
    return token


_KNOWN_OPTIONS = frozenset(
    {
        "token",
        "ssl",
        "timeout",
        "connect_timeout",
        "read_retries",
        "progress_interval",
        "reconnect_timeout",
        "max_connections",
    }
)


async def open_http_store(parts: SplitResult, options: dict[str, Any]) -> HttpStore:
    """``http://host:port`` or ``https://host:port`` (optionally with a path prefix).

    Options: ``token``, ``token_file`` (a file holding the token), ``cafile`` (CA bundle for
    https), ``verify`` (``False`` skips certificate checks; for tests only), ``ssl`` (an
    :class:`ssl.SSLContext`), and :class:`HttpStore`'s keyword arguments.
    """
    _check_url(parts)
    options = dict(options)
    _resolve_token(options)
    _resolve_ssl(parts, options)
    unknown = set(options) - _KNOWN_OPTIONS
    if unknown:
        raise TypeError(
            f"unknown option(s) for the http store: {sorted(unknown)} "
            f"(known: {sorted(_KNOWN_OPTIONS | {'token_file', 'cafile', 'verify'})})"
        )
    return HttpStore(parts.geturl(), **options)


def _check_url(parts: SplitResult) -> None:
    """A host, a good port, and nothing the store would ignore (query, credentials)."""
    if parts.query or parts.fragment:
        raise ValueError(
            f"http store URL takes no query or fragment (pass options as keyword arguments), "
            f"got {parts.geturl()!r}"
        )
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "http store URL must not carry credentials; pass token= or token_file= instead"
        )
    if not parts.hostname:
        raise ValueError(f"http store URL must name a host, got {parts.geturl()!r}")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise ValueError(f"url {parts.geturl()!r} has a bad port: {exc}") from None


def _resolve_token(options: dict[str, Any]) -> None:
    """Turn ``token_file`` (or the agent's token-file variable) into ``token``, in place."""
    token_file = options.pop("token_file", None)
    if token_file is not None:
        if options.get("token") is not None:
            raise ValueError("give token or token_file, not both")
        options["token"] = read_token_file(token_file)
    elif options.get("token") is None and not os.environ.get(TOKEN_ENV):
        env_file = os.environ.get(TOKEN_FILE_ENV)  # how an agent hands its workers the token
        if env_file:
            options["token"] = read_token_file(env_file)


def _resolve_ssl(parts: SplitResult, options: dict[str, Any]) -> None:
    """Turn ``cafile`` / ``verify`` into ``ssl``, in place (an explicit ``ssl`` wins)."""
    cafile = options.pop("cafile", None)
    verify = options.pop("verify", True)
    if "ssl" in options or (cafile is None and verify is not False):
        return
    if parts.scheme != "https":
        raise ValueError("cafile and verify apply to https:// URLs only")
    if verify is False:
        options["ssl"] = False
        return
    try:
        options["ssl"] = _ssl.create_default_context(cafile=cafile)
    except (OSError, _ssl.SSLError) as exc:
        raise ValueError(f"cafile {cafile!r} cannot be loaded: {exc}") from None
