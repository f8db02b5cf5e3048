"""The HTTP store client: ``open_store("http://host:29400")`` / ``https://``.

Requests go through a small HTTP/1.1 client of our own (:mod:`._wire`), not aiohttp's: one pool
of keep-alive connections carries every unary request (lease keep-alives included), and each
watch stream has a connection of its own, so that many watches never starve ordinary requests.
Reads are retried on connection errors; writes never are: a write whose request may have reached
the server raises :class:`~aioelastic.errors.WriteOutcomeUnknownError`, or its subclass
:class:`~aioelastic.errors.WriteTimeoutError` (also a ``StoreTimeoutError``) when no answer came
before the deadline. Watches reconnect after a
lost stream and resume from the last revision seen + 1, so no event is lost or repeated. Every
socket, TLS and protocol error is translated to aioelastic's errors here.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import ssl as _ssl
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, quote, urlencode

from yarl import URL

from ...errors import (
    CompactedError,
    LeaseNotFoundError,
    StoreAuthError,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
    ValueTooLargeError,
    WriteOutcomeUnknownError,
    WriteTimeoutError,
)
from .._base import Store, Watch
from .._types import (
    CasResult,
    EventType,
    KeyValue,
    LeaseGrant,
    LeaseStatus,
    RangeResult,
    WatchEvent,
)
from . import _wire

__all__ = ["HttpStore", "open_http_store"]

#: Environment variable read for the bearer token when no ``token``/``token_file`` is given.
TOKEN_ENV = "AIOELASTIC_TOKEN"
#: ... else a file holding the token (what an agent gives its workers).
TOKEN_FILE_ENV = "AIOELASTIC_TOKEN_FILE"
#: A watch line longer than this is refused (a revision's events, base64).
MAX_WATCH_LINE = 256 * 1024 * 1024
#: How many built request URLs a store keeps (the cache is emptied when full).
_URL_CACHE_SIZE = 4096


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


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.~-]+")
_PLAIN_KEY_WITH_SLASHES = re.compile(r"[A-Za-z0-9_.~/-]+")


def _quote_key(key: str) -> str:
    if _PLAIN_KEY.fullmatch(key):
        return key  # nothing to escape (the common case: a fast path)
    if _PLAIN_KEY_WITH_SLASHES.fullmatch(key):
        # Hierarchical keys ("job/rank/0"): only the slashes need escaping, as quote() would.
        return key.replace("/", "%2F")
    try:
        return quote(key, safe="")
    except UnicodeEncodeError:
        raise ValueError(f"key {key!r} cannot be encoded as UTF-8 for the HTTP store") from None


def _kv_from_json(obj: Mapping[str, Any], value: bytes | None = None) -> KeyValue:
    if value is None:
        value = base64.b64decode(obj.get("value_b64", ""))
    return KeyValue(
        obj["key"],
        value,
        int(obj["create_revision"]),
        int(obj["mod_revision"]),
        int(obj["version"]),
        int(obj["lease"]),
    )


def _event_from_json(obj: Mapping[str, Any]) -> WatchEvent:
    if obj["type"] == "PUT":
        return WatchEvent(EventType.PUT, _kv_from_json(obj))
    return WatchEvent(
        EventType.DELETE, KeyValue(obj["key"], b"", 0, int(obj["mod_revision"]), 0, 0)
    )


def _error_body(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except ValueError:
        return {"error": "unknown", "message": body[:200].decode("utf-8", "replace")}
    return parsed if isinstance(parsed, dict) else {"error": "unknown", "message": str(parsed)}


class _Answer(dict[str, Any]):
    """A JSON answer whose missing fields raise ``StoreConnectionError`` (a foreign server)."""

    def __missing__(self, key: str) -> Any:
        raise StoreConnectionError(f"malformed answer from the server: no field {key!r}")


def _parse_answer(body: bytes, what: str) -> _Answer:
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise StoreConnectionError(f"{what}: the answer is not a JSON object")
    return _Answer(parsed)


class HttpStore(Store):
    """A client of ``aioelastic serve``. Usually made by ``open_store("http://host:port")``.

    ``token``: the bearer token (default: the ``AIOELASTIC_TOKEN`` environment variable).
    ``ssl``: an :class:`ssl.SSLContext` for ``https://`` (or ``False`` to skip verification).
    ``timeout``: seconds for one request. ``connect_timeout``: seconds to connect.
    ``read_retries``: extra attempts for reads after a connection error.
    ``progress_interval``: how often (s) the server reports progress on an idle watch; a watch
    stream silent for ``3 * progress_interval`` counts as lost. ``reconnect_timeout``: how long
    (s) a watch tries to resume before raising :class:`~aioelastic.errors.StoreConnectionError`.
    ``max_connections``: requests in flight at once (each on its own pooled connection; watches
    not included); 0: no limit.
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
        base = URL(url)
        if base.scheme not in ("http", "https") or not base.host:
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
        self.url = str(base).rstrip("/")
        self._base_path = base.path.rstrip("/")
        self._origin = base.origin()
        if token is None:
            token = os.environ.get(TOKEN_ENV) or None
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._connect_timeout = connect_timeout
        self._read_retries = read_retries
        self.progress_interval = float(progress_interval)
        self.reconnect_timeout = float(reconnect_timeout)
        ssl_arg: _ssl.SSLContext | bool = True if ssl is None else ssl
        if token is not None and any(c in token for c in "\r\n\0"):
            raise ValueError("token must not contain CR, LF or NUL characters")
        # Unary requests go through our own small HTTP/1.1 client (see _wire.py: aiohttp's
        # client costs more CPU per request than the server does answering it).
        port = base.port or (443 if base.scheme == "https" else 80)
        host = base.raw_host or ""
        wire_host = f"[{host}]" if ":" in host else host
        if base.port != (443 if base.scheme == "https" else 80):
            wire_host += f":{port}"
        self._host, self._port = host, port
        self._ssl_context = _ssl_context(ssl_arg) if base.scheme == "https" else None
        self._pool = _wire.Pool(
            host,
            port,
            ssl=self._ssl_context,
            connect_timeout=connect_timeout,
            limit=max_connections,
            keepalive=30.0,
        )
        self._request_timeout = float(timeout)
        self._wire_prefix = base.raw_path.rstrip("/")
        self._head_tail = "".join(
            f"\r\n{name}: {value}"
            for name, value in (
                ("Host", wire_host),
                ("User-Agent", "aioelastic"),
                *self._headers.items(),
            )
        ).encode("utf-8")
        self._watches: set[_HttpWatch] = set()

    def __repr__(self) -> str:
        return f"<HttpStore {self.url}{' closed' if self._closed else ''}>"

    # -- requests

    async def _request(
        self,
        method: str,
        path: str,
        *,
        write: bool,
        params: Mapping[str, str] | None = None,
        data: bytes | None = None,
        json_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """Send one request; answer (status, headers (lower-case names), body) or raise an
        aioelastic error."""
        request = self._build(method, path, params, data, json_body, headers)
        attempts = 1 if write else 1 + self._read_retries
        for attempt in range(attempts):
            self._check_open()
            try:
                return await self._pool.request(request, self._request_timeout)
            except _wire.ConnectFailed as exc:
                # Not connected: nothing was sent, so even a write had no effect.
                error: StoreError = StoreConnectionError(f"cannot connect to {self.url}: {exc}")
            except _wire.RequestTimeout:
                what = f"{method} {path[:200]}"
                if self._closed:
                    raise StoreClosedError(f"{self!r} was closed during {what}") from None
                if write:
                    # Sent, and no answer before the deadline: a timeout (StoreTimeoutError)
                    # whose outcome is unknown (WriteOutcomeUnknownError), as with etcd.
                    raise WriteTimeoutError(
                        f"{what} timed out: sent to {self.url}, no answer within the "
                        f"{self._request_timeout:g}s deadline; it may or may not have applied"
                    ) from None
                raise StoreTimeoutError(f"{what} timed out ({self.url})") from None
            except _wire.ConnectionLost as exc:
                what = f"{method} {path[:200]}"
                if self._closed:
                    raise StoreClosedError(f"{self!r} was closed during {what}") from None
                if write:
                    raise WriteOutcomeUnknownError(
                        f"{what}: connection to {self.url} lost after the request was sent "
                        f"({exc}); it may or may not have applied"
                    ) from None
                error = StoreConnectionError(f"{what}: connection to {self.url} lost ({exc})")
            if self._closed:
                raise StoreClosedError(f"{self!r} was closed during {method} {path[:200]}")
            if attempt + 1 < attempts:
                await asyncio.sleep(0.05 * 2**attempt)
        raise error

    def _build(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None = None,
        data: bytes | None = None,
        json_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> bytes:
        """The bytes of one request (head and body, written at once)."""
        target = self._wire_prefix + path
        if params:
            target += "?" + urlencode(params)
        extra = ""
        if json_body is not None:
            data = json.dumps(json_body).encode()
            extra = "\r\nContent-Type: application/json"
        elif data is not None:
            extra = "\r\nContent-Type: application/octet-stream"
        if headers:
            extra += "".join(f"\r\n{name}: {value}" for name, value in headers.items())
        if data is not None or method in ("PUT", "POST"):
            extra += f"\r\nContent-Length: {len(data) if data is not None else 0}"
        return b"".join(
            (
                f"{method} {target} HTTP/1.1".encode(),
                self._head_tail,
                extra.encode("latin-1"),
                b"\r\n\r\n",
                data or b"",
            )
        )

    def _fail(self, status: int, body: bytes, what: str, *, write: bool = False) -> Exception:
        """The aioelastic error for an unexpected answer (raise it)."""
        info = _error_body(body)
        message = f"{what}: {info.get('message', '')} (HTTP {status})"
        code = info.get("error")
        if status == 401 or status == 403:
            return StoreAuthError(message)
        if code == "lease_not_found":
            return LeaseNotFoundError(int(info.get("lease", 0)))
        if code == "compacted":
            return CompactedError(
                int(info.get("requested_revision", 0)), int(info.get("compact_revision", 0))
            )
        if status == 413:
            return ValueTooLargeError(message)
        if status == 400:
            return ValueError(message)
        if status == 503:
            return StoreConnectionError(f"the server is unavailable: {message}")
        if write and status >= 500:
            return WriteOutcomeUnknownError(message)
        return StoreConnectionError(f"unexpected answer: {message}")

    async def _call_json(
        self, method: str, path: str, *, write: bool, ok: tuple[int, ...] = (200,), **kwargs: Any
    ) -> tuple[int, _Answer]:
        status, _, body = await self._request(method, path, write=write, **kwargs)
        if status not in ok:
            raise self._fail(status, body, f"{method} {path[:200]}", write=write)
        return status, _parse_answer(body, f"{method} {path[:200]}")

    # -- the core

    async def _get(self, key: str) -> KeyValue | None:
        path = "/v1/kv/" + _quote_key(key)
        status, headers, body = await self._request("GET", path, write=False)
        if status == 404 and _error_body(body).get("error") == "key_not_found":
            return None
        if status != 200:
            raise self._fail(status, body, f"get {key!r}")
        try:
            return KeyValue(
                key,
                body,
                int(headers["x-create-revision"]),
                int(headers["x-mod-revision"]),
                int(headers["x-version"]),
                int(headers["x-lease"]),
            )
        except (KeyError, ValueError):
            raise StoreConnectionError(f"get {key!r}: malformed answer from {self.url}") from None

    async def _range(self, prefix: str, limit: int | None) -> RangeResult:
        params = {"limit": str(limit)} if limit is not None else None
        _, out = await self._call_json(
            "GET", "/v1/range/" + _quote_key(prefix), write=False, params=params
        )
        return RangeResult(
            kvs=tuple(_kv_from_json(kv) for kv in out["kvs"]),
            revision=int(out["revision"]),
            count=int(out["count"]),
            more=bool(out["more"]),
        )

    async def _current_revision(self) -> int:
        _, out = await self._call_json("GET", "/v1/revision", write=False)
        return int(out["revision"])

    async def _put(self, key: str, value: bytes, lease: int) -> int:
        params = {"lease": str(lease)} if lease else None
        path = "/v1/kv/" + _quote_key(key)
        status, headers, body = await self._request(
            "PUT", path, write=True, params=params, data=value
        )
        if status != 200:
            raise self._fail(status, body, f"PUT {path[:200]}", write=True)
        # The revision of the write is the answer's ETag ("R"): no need to parse the body.
        etag = headers.get("etag", "")
        if len(etag) > 2 and etag[0] == etag[-1] == '"' and etag[1:-1].isdigit():
            return int(etag[1:-1])
        return int(_parse_answer(body, f"PUT {path[:200]}")["revision"])

    async def _delete(self, key: str, prefix: bool) -> int:
        route = "/v1/range/" if prefix else "/v1/kv/"
        _, out = await self._call_json("DELETE", route + _quote_key(key), write=True)
        return int(out["deleted"])

    async def _compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, lease: int
    ) -> CasResult:
        params = {"lease": str(lease)} if lease else None
        condition = (
            {"If-None-Match": "*"}
            if expected_mod_revision == 0
            else {"If-Match": f'"{expected_mod_revision}"'}
        )
        status, out = await self._call_json(
            "PUT",
            "/v1/kv/" + _quote_key(key),
            write=True,
            ok=(200, 412),
            params=params,
            data=value,
            headers=condition,
        )
        if status == 412:
            current = out.get("kv")
            return CasResult(
                False, int(out["revision"]), None if current is None else _kv_from_json(current)
            )
        return CasResult(True, int(out["revision"]), _kv_from_json(out["kv"], value))

    async def _compare_and_delete(self, key: str, expected_mod_revision: int) -> CasResult:
        status, out = await self._call_json(
            "DELETE",
            "/v1/kv/" + _quote_key(key),
            write=True,
            ok=(200, 412),
            headers={"If-Match": f'"{expected_mod_revision}"'},
        )
        if status == 412:
            current = out.get("kv")
            return CasResult(
                False, int(out["revision"]), None if current is None else _kv_from_json(current)
            )
        return CasResult(True, int(out["revision"]), None)

    async def _add(self, key: str, delta: int) -> int:
        _, out = await self._call_json(
            "POST", "/v1/add/" + _quote_key(key), write=True, params={"delta": str(delta)}
        )
        return int(out["value"])

    def _watch(self, prefix: str, start_revision: int | None) -> Watch:
        return _HttpWatch(self, prefix, start_revision)

    async def _range_and_watch(self, prefix: str) -> tuple[RangeResult, Watch]:
        # one request: the stream's ``created`` frame carries the range (``?snapshot=1``)
        watch = _HttpWatch(self, prefix, None, snapshot=True)
        await watch.start()
        assert watch.snapshot is not None
        return watch.snapshot, watch

    async def _compact(self, revision: int) -> None:
        status, _, body = await self._request(
            "POST", "/v1/compact", write=True, json_body={"revision": revision}
        )
        if status == 400:
            raise ValueError(f"compact: {_error_body(body).get('message')}")
        if status != 200:
            raise self._fail(status, body, "compact", write=True)

    async def _lease_grant(self, ttl: float) -> LeaseGrant:
        _, out = await self._call_json("POST", "/v1/lease", write=True, json_body={"ttl": ttl})
        return LeaseGrant(int(out["id"]), float(out["ttl"]))

    async def _lease_keep_alive(self, lease_id: int) -> float:
        # Idempotent (it restarts the TTL), so it may be retried like a read.
        _, out = await self._call_json("POST", f"/v1/lease/{lease_id}/keepalive", write=False)
        return float(out["ttl"])

    async def _lease_revoke(self, lease_id: int) -> None:
        await self._call_json("DELETE", f"/v1/lease/{lease_id}", write=True)

    async def _lease_time_to_live(self, lease_id: int) -> LeaseStatus:
        _, out = await self._call_json("GET", f"/v1/lease/{lease_id}", write=False)
        return LeaseStatus(
            int(out["id"]),
            float(out["granted_ttl"]),
            float(out["remaining"]),
            tuple(out["keys"]),
        )

    async def _aclose(self) -> None:
        for watch in list(self._watches):
            watch._abort()
        self._pool.close()


class _HttpWatch(Watch):
    """One NDJSON watch stream, resumed on a new connection when it is lost."""

    def __init__(
        self, store: HttpStore, prefix: str, start_revision: int | None, *, snapshot: bool = False
    ) -> None:
        super().__init__(prefix, start_revision)
        self._store = store
        self._want_snapshot = snapshot
        #: with ``snapshot=True``: the range of the prefix the stream opened with
        self.snapshot: RangeResult | None = None
        self._stream: _wire.LineStream | None = None
        self._pending: deque[WatchEvent] = deque()
        self._start_revision: int | None = None
        self._next_revision = 0  # where a resumed stream starts: last revision received + 1
        self._lost_since: float | None = None  # loop time the stream was last known dead
        self.reconnects = 0

    @property
    def start_revision(self) -> int:
        if self._start_revision is None:
            raise RuntimeError("the watch has not started")
        return self._start_revision

    async def _start(self) -> None:
        self._store._check_open()
        self._store._watches.add(self)
        try:
            await self._connect(self.requested_revision)
        except BaseException:
            self._store._watches.discard(self)
            raise

    async def _connect(self, start: int | None) -> None:
        """Open a stream from ``start`` and read its ``created`` frame (the watch is then live)."""
        store = self._store
        if store.closed:
            raise StoreClosedError(f"{store!r} was closed")
        params = {"progress_interval": repr(store.progress_interval)}
        if start is not None:
            params["start_revision"] = str(start)
        snapshot = self._want_snapshot and self.snapshot is None  # not when resuming
        if snapshot:
            params["snapshot"] = "1"
        request = store._build("GET", "/v1/watch/" + _quote_key(self.prefix), params)
        what = f"watch {self.prefix!r}"
        loop = asyncio.get_running_loop()
        silence = store.progress_interval * 3
        try:
            async with asyncio.timeout(store._connect_timeout + silence):
                try:
                    async with asyncio.timeout(store._connect_timeout):
                        stream = await _wire.open_stream(
                            store._host,
                            store._port,
                            store._ssl_context,
                            request,
                            max_line=MAX_WATCH_LINE,
                        )
                except TimeoutError:
                    raise _wire.ConnectFailed("connecting timed out") from None
                self._stream = stream
                await stream.read_head()
                if stream.status != 200:
                    self._drop()
                    raise store._fail(stream.status, stream.error_body or b"", what)
                # From now on a stream silent for 3 progress intervals counts as lost.
                stream.watch_silence(loop, silence)
                frame = await self._read_frame()
        except (
            _wire.ConnectFailed,
            _wire.ConnectionLost,
            _wire.RequestTimeout,
            TimeoutError,
        ) as exc:
            self._drop()
            if store.closed:
                raise StoreClosedError(f"{store!r} was closed") from None
            raise StoreConnectionError(f"{what}: cannot open the stream: {exc!r}") from exc
        if frame is None or frame.get("type") != "created":
            self._drop()
            raise StoreConnectionError(f"{what}: the server did not confirm the watch")
        if snapshot:
            try:
                self.snapshot = RangeResult(
                    kvs=tuple(_kv_from_json(kv) for kv in frame["kvs"]),
                    revision=int(frame["revision"]),
                    count=int(frame["count"]),
                )
            except (KeyError, TypeError, ValueError):
                self._drop()
                raise StoreConnectionError(
                    f"{what}: the server sent no range with the watch (an older server?)"
                ) from None
        if self._start_revision is None:
            self._start_revision = int(frame["start_revision"])
        self._next_revision = int(frame["start_revision"])

    async def _read_frame(self) -> dict[str, Any] | None:
        """The next NDJSON frame, or None at the end of the stream; raises a ``_wire`` error
        when the stream is lost, silent too long or malformed."""
        stream = self._stream
        if stream is None:
            return None
        line = await stream.read_line()
        if line is None:
            return None
        try:
            frame = json.loads(line)
        except ValueError:
            raise _wire.ConnectionLost("malformed watch frame") from None
        if not isinstance(frame, dict):
            raise _wire.ConnectionLost("malformed watch frame")
        return frame

    async def _next(self) -> WatchEvent:
        store = self._store
        while not self._pending:
            if self._closed:
                raise StopAsyncIteration
            if store.closed:
                raise StoreClosedError(f"{store!r} was closed")
            frame: dict[str, Any] | None = None
            try:
                frame = await self._read_frame()
            except (_wire.ConnectionLost, _wire.RequestTimeout):
                frame = None
            if self._closed:
                raise StopAsyncIteration
            if store.closed:
                raise StoreClosedError(f"{store!r} was closed")
            if frame is None or frame.get("type") == "closing":
                await self._resume()
                continue
            kind = frame.get("type")
            if kind in ("events", "progress"):
                self._lost_since = None  # the server is alive and serving this watch
            if kind == "events":
                revision = int(frame["revision"])
                if revision >= self._next_revision:  # never deliver a revision twice
                    self._pending.extend(_event_from_json(e) for e in frame["events"])
                    self._next_revision = revision + 1
            elif kind == "progress":
                self._next_revision = max(self._next_revision, int(frame["revision"]) + 1)
            elif kind == "error":
                self._drop()
                if frame.get("error") == "compacted":
                    raise CompactedError(
                        int(frame["requested_revision"]), int(frame["compact_revision"])
                    )
                raise StoreConnectionError(f"watch {self.prefix!r}: {frame.get('message')}")
        return self._pending.popleft()

    async def _resume(self) -> None:
        """Reconnect from the next unseen revision.

        Gives up with ``StoreConnectionError`` once the stream has delivered nothing (no event, no
        progress frame) for ``reconnect_timeout`` seconds, even if connections succeed.
        """
        store = self._store
        self._drop()
        loop = asyncio.get_running_loop()
        if self._lost_since is None:
            self._lost_since = loop.time()
        deadline = self._lost_since + store.reconnect_timeout
        if loop.time() >= deadline:
            raise StoreConnectionError(
                f"watch {self.prefix!r}: no progress from {store.url} for "
                f"{store.reconnect_timeout}s (resume from revision {self._next_revision})"
            )
        delay = 0.05
        while True:
            try:
                await self._connect(self._next_revision)
                self.reconnects += 1
                return
            except StoreConnectionError as exc:
                if store.closed:
                    raise StoreClosedError(f"{store!r} was closed") from None
                if loop.time() + delay > deadline:
                    raise StoreConnectionError(
                        f"watch {self.prefix!r} lost and not resumed within "
                        f"{store.reconnect_timeout}s (resume from revision "
                        f"{self._next_revision}): {exc}"
                    ) from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _drop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    def _abort(self) -> None:
        """The store is closing: end the stream so a pending ``_next`` wakes up."""
        self._drop()

    async def _aclose(self) -> None:
        self._store._watches.discard(self)
        self._drop()


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in ``path`` (surrounding whitespace removed); ``ValueError`` if unreadable."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"token file {str(path)!r} cannot be read: {exc}") from None
    if not token:
        raise ValueError(f"token file {str(path)!r} is empty")
    return token


async def open_http_store(parts: SplitResult, options: dict[str, Any]) -> HttpStore:
    """``http://host:port`` or ``https://host:port`` (optionally with a path prefix).

    Options: ``token``, ``token_file`` (a file holding the token), ``cafile`` (CA bundle for
    https), ``verify`` (``False`` skips certificate checks; for tests only), ``ssl`` (an
    :class:`ssl.SSLContext`), and :class:`HttpStore`'s keyword arguments.
    """
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
    options = dict(options)
    token_file = options.pop("token_file", None)
    if token_file is not None:
        if options.get("token") is not None:
            raise ValueError("give token or token_file, not both")
        options["token"] = read_token_file(token_file)
    elif options.get("token") is None and not os.environ.get(TOKEN_ENV):
        env_file = os.environ.get(TOKEN_FILE_ENV)  # how an agent hands its workers the token
        if env_file:
            options["token"] = read_token_file(env_file)
    cafile = options.pop("cafile", None)
    verify = options.pop("verify", True)
    if "ssl" not in options and (cafile is not None or verify is False):
        if parts.scheme != "https":
            raise ValueError("cafile and verify apply to https:// URLs only")
        if verify is False:
            options["ssl"] = False
        else:
            try:
                options["ssl"] = _ssl.create_default_context(cafile=cafile)
            except (OSError, _ssl.SSLError) as exc:
                raise ValueError(f"cafile {cafile!r} cannot be loaded: {exc}") from None
    known = {
        "token",
        "ssl",
        "timeout",
        "connect_timeout",
        "read_retries",
        "progress_interval",
        "reconnect_timeout",
        "max_connections",
    }
    unknown = set(options) - known
    if unknown:
        raise TypeError(
            f"unknown option(s) for the http store: {sorted(unknown)} "
            f"(known: {sorted(known | {'token_file', 'cafile', 'verify'})})"
        )
    return HttpStore(parts.geturl(), **options)
