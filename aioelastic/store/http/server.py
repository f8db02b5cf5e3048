"""The HTTP store server: an aiohttp application serving one shared :class:`MemoryEngine`.

:func:`make_app` builds the application; :class:`HttpStoreServer` runs it on a socket as an async
resource (``async with HttpStoreServer(port=0) as server: server.url``), embeddable in any asyncio
program and in tests. ``aioelastic serve`` is a thin command around it. The routes are described
in ``docs/http-api.md`` and by the OpenAPI document at ``/openapi.json``.

The semantics are the engine's (the memory backend's reference implementation); this module only
maps HTTP onto it: raw value bytes in bodies, ``ETag`` = ``mod_revision``, ``If-Match`` /
``If-None-Match: *`` = compare-and-swap, NDJSON watch streams with progress frames.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self, TypeVar

from aiohttp import web

from ...errors import CompactedError, LeaseNotFoundError, StoreClosedError, TxnTooLargeError
from .._txn import DeletePrefix, Put, Range, Txn
from ..memory import DEFAULT_HISTORY_LIMIT, MemoryEngine
from ._blob_cache import BlobCache
from ._connections import FD_RESERVE, OVERFLOW, LogLimiter, listen_backlog
from ._encoding import (
    NDJSON,
    events_lines,
    frame,
    json_response,
    kv_json,
    precondition_failed,
    written,
)
from ._errors import STATUS_CODES, ApiError, RequestReadTimeout, bad, error_response
from ._frames import SESSION_PATH
from ._limits import (
    DEFAULT_MAX_KEY_BYTES,
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_MAX_WATCH_STREAMS,
    MAX_JSON_BODY_BYTES,
    MAX_TXN_BODY,
    Limits,
)
from ._metrics import NoMetrics, ServerMetrics, metrics_for
from ._parsing import (
    DECIMAL,
    etag_revision,
    int_param,
    json_int,
    json_number,
    parse_int,
    refuse_codings,
)
from ._persist import DataDir, FsyncPolicy, LogWriteError
from ._protocol import RequestHandlerFunction, connection_factory
from ._session_server import DEFAULT_SESSION_GRACE, SessionHub
from ._txn_wire import result_to_json, txn_from_json

__all__ = [
    "DEFAULT_MAX_KEY_BYTES",
    "DEFAULT_MAX_VALUE_BYTES",
    "DEFAULT_PORT",
    "DEFAULT_READ_TIMEOUT",
    "HttpStoreServer",
    "make_app",
]

log = logging.getLogger("aioelastic.serve")

DEFAULT_PORT = 29400
#: Seconds a request's head may take to arrive, and its body after its head (``read_timeout``).
DEFAULT_READ_TIMEOUT = 30.0
#: Seconds an idle keep-alive connection is kept between requests (aiohttp's ``web.run_app``
#: default; the bare ``RequestHandler`` would keep one for an hour). Clients of this package drop
#: idle connections after 30 s themselves, so they never reuse one the server is closing.
KEEPALIVE_TIMEOUT = 75.0
#: Bounds of the watch progress interval a client may ask for (seconds).
MIN_PROGRESS_INTERVAL = 0.05
MAX_PROGRESS_INTERVAL = 300.0
DEFAULT_PROGRESS_INTERVAL = 5.0


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_T = TypeVar("_T")


def _call(request: web.Request, handler: _Handler) -> Awaitable[web.StreamResponse]:
    return handler(request)


def _fast_path(state: _App, routed: RequestHandlerFunction) -> RequestHandlerFunction:
    """The server's request handler: GET and PUT on ``/v1/kv/{key}`` (the hot routes) go
    straight to their handlers, everything else through the application (``routed``: its
    router and middleware).

    The fast path skips only the routing: the key is cut from the path as the router's
    ``{key:...}`` pattern would (``%2F`` and ``%25`` undone), and the request is
    answered by :meth:`_App.answer` as the middleware would (authentication, JSON errors,
    metrics). A request with ``Expect`` (``100-continue``) or anything unusual takes the routed
    way. Fast-path requests have no ``match_info`` (and so no ``request.app``); handlers use
    the state they are bound to.
    """
    answer = state.answer
    get = state.get_raw_key
    put = state.put_raw_key

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if getattr(request.protocol, "over_limit", False):
            assert isinstance(request, web.Request)
            return await state.answer_over_limit(request, routed)
        method = request.method
        if method == "GET" or method == "PUT":
            path = request.rel_url.path_safe
            if path.startswith("/v1/kv/") and "Expect" not in request.headers:
                key = path[7:]
                if "%" in key:
                    key = key.replace("%2F", "/").replace("%25", "%")
                assert isinstance(request, web.Request)
                if method == "GET":
                    return await answer(request, "get", get, key)
                return await answer(request, "put", put, key)
        return await routed(request)

    return handle


# -- the application -----------------------------------------------------------------------------


class _App:
    """The state behind the routes: the engine, limits, auth, metrics and open watch streams."""

    def __init__(
        self,
        engine: MemoryEngine,
        *,
        token: str | None,
        limits: Limits,
        data: DataDir | None,
        metrics: ServerMetrics | NoMetrics,
    ) -> None:
        self.engine = engine
        self.token = token.encode() if token is not None else None
        self.limits = limits
        self.data = data
        self.metrics = metrics
        #: Paths served without a token: no store data behind them (the page's files, /healthz).
        self.public_paths: set[str] = {"/healthz"}
        self.closing = False
        self.watch_streams = 0
        #: watches served over sessions (they share ``max_watch_streams``), set by make_app
        self.session_watches: Callable[[], int] = lambda: 0
        #: Set by the runner: the connection limit (None: none).
        self.max_connections: int | None = None
        #: The metrics label (``op``) of each route handler, filled by :func:`make_app`.
        self.ops: dict[Any, str] = {}
        # Encoded event frames of the current revision, shared by watchers at the same position.
        self._frames = BlobCache(events_lines)

    # -- plumbing

    @web.middleware
    async def middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """Every routed request: authentication, error answers and metrics (:meth:`answer`)."""
        return await self.answer(request, self.ops.get(handler, "other"), _call, handler)

    async def answer(
        self,
        request: web.Request,
        op: str,
        call: Callable[[web.Request, _T], Awaitable[web.StreamResponse]],
        arg: _T,
    ) -> web.StreamResponse:
        """``await call(request, arg)`` with authentication, errors mapped to JSON answers and
        the request metered as ``op`` (``other`` when it fails authentication)."""
        start = time.perf_counter()
        metered = "other"
        status = 500
        try:
            if self.token is not None and request.path not in self.public_paths:
                self._authenticate(request)
            if "Content-Encoding" in request.headers or "Transfer-Encoding" in request.headers:
                refuse_codings(request)
            metered = op
            response = await call(request, arg)
            status = response.status
            return response
        except ApiError as exc:
            status = exc.status
            return exc.response()
        except web.HTTPException as exc:  # aiohttp's own: no route, method, body too large
            status = exc.status
            if status == 413:
                return error_response(
                    413,
                    "value_too_large",
                    f"request body too large (at most {self.limits.max_value_bytes} bytes of "
                    f"value, {MAX_JSON_BODY_BYTES} of JSON)",
                )
            message = exc.reason
            if status == 404:
                message = f"no route for {request.method} {request.path[:200]!r}; see /openapi.json"
            elif status == 405:
                message = f"method {request.method} is not allowed on {request.path[:200]!r}"
            allow = exc.headers.get("Allow")
            return error_response(
                status,
                STATUS_CODES.get(status, "error"),
                message,
                {"Allow": allow} if allow else None,
            )
        except CompactedError as exc:
            status = 410
            return error_response(
                410,
                "compacted",
                str(exc),
                requested_revision=exc.requested_revision,
                compact_revision=exc.compact_revision,
            )
        except LeaseNotFoundError as exc:
            status = 404
            return error_response(404, "lease_not_found", str(exc), lease=exc.lease_id)
        except StoreClosedError as exc:
            status = 503
            return error_response(503, "unavailable", str(exc))
        except ValueError as exc:  # the engine's argument errors (e.g. add on a non-integer)
            status = 400
            return error_response(400, "bad_request", str(exc))
        except RequestReadTimeout as exc:  # the body was too slow (the read deadline)
            status = 408
            response = error_response(408, "request_timeout", f"{exc}; closing the connection")
            response.force_close()
            return response
        except LogWriteError as exc:  # the log cannot take the write: it was not made
            status = 507 if exc.full else 503
            code = "insufficient_storage" if exc.full else "storage_unavailable"
            return error_response(status, code, f"{exc.strerror}; the write was not applied")
        except OSError as exc:  # the data dir failed (fsync): the write's durability is unknown
            status = 500
            log.error("storage failure answering %s %s: %s", request.method, request.path, exc)
            return error_response(500, "storage_error", f"the data directory failed: {exc}")
        except asyncio.CancelledError:
            # aiohttp cancels the handler when the client goes away (a watch it closed): not a
            # server error; counted as 499, nginx's "client closed request"
            status = 499
            raise
        finally:
            self.metrics.observe(metered, status, time.perf_counter() - start)

    async def expect_continue(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue`` (before the handler and the middleware): the token, the
        codings and the announced length are checked first, so that a client waiting for
        ``100 Continue`` is refused at once rather than after sending a body for nothing."""
        start = time.perf_counter()
        try:
            expect = request.headers.get("Expect", "")
            if expect.strip().lower() != "100-continue":
                message = f"unknown Expect: {expect[:40]!r} (only 100-continue)"
                raise ApiError(417, "expectation_failed", message)
            if self.token is not None and request.path not in self.public_paths:
                self._authenticate(request)
            refuse_codings(request)
            length = request.content_length
            limit = self.limits.max_value_bytes if request.method == "PUT" else MAX_JSON_BODY_BYTES
            if length is not None and length > limit:
                raise ApiError(
                    413,
                    "value_too_large" if request.method == "PUT" else "body_too_large",
                    f"the body ({length} bytes) is over this route's limit ({limit} bytes)",
                )
        except ApiError as exc:
            self.metrics.observe("other", exc.status, time.perf_counter() - start)
            response = exc.response()
            response.force_close()
            return response
        if request.version >= (1, 1):
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the answer proper has not started
        return None

    async def answer_over_limit(
        self, request: web.Request, routed: RequestHandlerFunction
    ) -> web.StreamResponse:
        """A request on a connection accepted over ``max_connections`` (then closed): ``/healthz``
        is answered as usual, so a health check works under a flood; anything else gets 503."""
        if request.method == "GET" and request.path == "/healthz":
            response = await routed(request)
        else:
            self.metrics.observe("other", 503, 0.0)
            response = error_response(
                503,
                "too_many_connections",
                f"this server holds at most {self.max_connections} connections "
                "(--max-connections) and all are in use; try again shortly",
                {"Retry-After": "1"},
            )
        response.force_close()
        return response

    def _authenticate(self, request: web.Request) -> None:
        assert self.token is not None
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise ApiError(401, "unauthorized", "this server needs 'Authorization: Bearer <token>'")
        if not hmac.compare_digest(given.strip().encode(), self.token):
            raise ApiError(401, "unauthorized", "the bearer token is not valid")

    def _key(self, request: web.Request, *, allow_empty: bool = False) -> str:
        return self._check_key(request.match_info["key"], allow_empty=allow_empty)

    def _prefix(self, request: web.Request) -> str:
        return self._check_key(request.match_info["prefix"], allow_empty=True)

    def _check_key(self, key: str, *, allow_empty: bool = False) -> str:
        if not key and not allow_empty:
            raise bad("the key (the URL path after the route) must not be empty")
        if len(key.encode("utf-8", "surrogatepass")) > self.limits.max_key_bytes:
            raise ApiError(
                413,
                "key_too_large",
                f"keys are at most {self.limits.max_key_bytes} bytes (UTF-8)",
            )
        return key

    async def _body_json(self, request: web.Request) -> dict[str, Any]:
        too_large = ApiError(
            413, "body_too_large", f"JSON body too large: at most {MAX_JSON_BODY_BYTES} bytes"
        )
        length = request.content_length
        if length is not None and length > MAX_JSON_BODY_BYTES:
            raise too_large
        raw = await request.read()
        if len(raw) > MAX_JSON_BODY_BYTES:
            raise too_large
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            raise bad("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
        return body

    async def _durable(self) -> None:
        data = self.data
        if data is not None:
            await data.wait_durable()

    def _lease_id(self, request: web.Request) -> int:
        return parse_int(request.match_info["lease"], "the lease id in the path", 1)

    # -- service routes

    async def healthz(self, request: web.Request) -> web.Response:
        if self.closing:
            return json_response({"status": "stopping"}, status=503)
        return json_response({"status": "ok"})

    async def metrics_route(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.render()
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    async def openapi(self, request: web.Request) -> web.Response:
        from ._openapi import openapi_document

        return json_response(
            openapi_document(self.limits.max_key_bytes, self.limits.max_value_bytes)
        )

    async def revision(self, request: web.Request) -> web.Response:
        engine = self.engine
        return json_response(
            {"revision": engine.revision, "compact_revision": engine.compact_revision}
        )

    # -- key-values

    async def get_key(self, request: web.Request) -> web.Response:
        return await self.get_raw_key(request, request.match_info["key"])

    async def get_raw_key(self, request: web.Request, key: str) -> web.Response:
        """GET /v1/kv/{key}, ``key`` taken from the path (the fast path calls it directly)."""
        key = self._check_key(key)
        kv = self.engine.get(key)
        revision = str(self.engine.revision)
        if kv is None:
            return error_response(
                404, "key_not_found", f"no key {key[:200]!r}", {"X-Revision": revision}
            )
        if request.query.get("format") == "json":
            return json_response({"revision": self.engine.revision, "kv": kv_json(kv)})
        return web.Response(
            body=kv.value,
            content_type="application/octet-stream",
            headers={
                "ETag": f'"{kv.mod_revision}"',
                "X-Revision": revision,
                "X-Create-Revision": str(kv.create_revision),
                "X-Mod-Revision": str(kv.mod_revision),
                "X-Version": str(kv.version),
                "X-Lease": str(kv.lease),
            },
        )

    async def put_key(self, request: web.Request) -> web.Response:
        return await self.put_raw_key(request, request.match_info["key"])

    async def put_raw_key(self, request: web.Request, key: str) -> web.Response:
        """PUT /v1/kv/{key}, ``key`` taken from the path (the fast path calls it directly)."""
        key = self._check_key(key)
        lease = int_param(request, "lease", minimum=0, default=0)
        if_match = request.headers.get("If-Match")
        if_none_match = request.headers.get("If-None-Match")
        expected: int | None = None
        if if_match is not None and if_none_match is not None:
            raise bad("give If-Match or If-None-Match, not both")
        if if_none_match is not None:
            if if_none_match.strip() != "*":
                raise bad("If-None-Match must be '*' (write only if the key is absent)")
            expected = 0
        elif if_match is not None:
            expected = etag_revision(if_match, "If-Match")
        length = request.content_length
        if length is not None and length > self.limits.max_value_bytes:
            raise ApiError(
                413, "value_too_large", f"values are at most {self.limits.max_value_bytes} bytes"
            )
        if length is not None:
            # Take what has arrived in one call (a small write's whole body comes with its
            # headers, though aiohttp may not have seen its end yet), then wait for the rest:
            # cheaper than ``read()``'s loop of ``readany()``s.
            content = request.content
            value = content.read_nowait()
            if len(value) < length:
                try:
                    value += await content.readexactly(length - len(value))
                except asyncio.IncompleteReadError:
                    raise bad("the request body ended before its Content-Length") from None
        else:
            value = await request.read()
        if len(value) > self.limits.max_value_bytes:
            raise ApiError(
                413, "value_too_large", f"values are at most {self.limits.max_value_bytes} bytes"
            )
        if expected is None:
            revision = self.engine.put(key, value, lease)
            kv = self.engine.get(key)
            assert kv is not None
            await self._durable()
            return written(revision, kv)
        result = self.engine.compare_and_swap(key, expected, value, lease)
        if not result.succeeded:
            return precondition_failed(key, result.revision, result.kv)
        assert result.kv is not None
        await self._durable()
        return written(result.revision, result.kv)

    async def delete_key(self, request: web.Request) -> web.Response:
        key = self._key(request)
        if_match = request.headers.get("If-Match")
        if_none_match = request.headers.get("If-None-Match")
        if if_none_match is not None:
            if if_match is not None:
                raise bad("give If-Match or If-None-Match, not both")
            if if_none_match.strip() != "*":
                raise bad("If-None-Match must be '*' (delete only if the key is absent)")
            # RFC 9110: the condition holds only while no key exists, so nothing is deleted.
            kv = self.engine.get(key)
            if kv is not None:
                return precondition_failed(key, self.engine.revision, kv)
            return json_response({"deleted": 0, "revision": self.engine.revision})
        if if_match is None:
            deleted = self.engine.delete(key, False)
            if deleted:
                await self._durable()
            return json_response({"deleted": deleted, "revision": self.engine.revision})
        expected = etag_revision(if_match, "If-Match")
        if expected < 1:
            raise bad("If-Match on DELETE must name a revision >= 1")
        result = self.engine.compare_and_delete(key, expected)
        if not result.succeeded:
            return precondition_failed(key, result.revision, result.kv)
        await self._durable()
        return json_response({"deleted": 1, "revision": result.revision})

    async def add(self, request: web.Request) -> web.Response:
        key = self._key(request)
        raw = request.query.get("delta", "1").strip()
        if not DECIMAL.fullmatch(raw):
            raise bad(
                f"query parameter 'delta' must be a decimal integer (at most 19 digits), "
                f"got {raw[:40]!r}"
            )
        total = self.engine.add(key, int(raw))
        revision = self.engine.revision
        await self._durable()
        return json_response({"value": total, "revision": revision})

    async def txn(self, request: web.Request) -> web.Response:
        """POST /v1/txn: one transaction (the JSON forms are in ``_txn_wire``)."""
        # a txn's base64 values may exceed the body limit of other routes: read to its own
        raw = bytearray()
        while chunk := await request.content.read(MAX_TXN_BODY + 1 - len(raw)):
            raw += chunk
            if len(raw) > MAX_TXN_BODY:
                raise ApiError(413, "txn_too_large", f"txn bodies are at most {MAX_TXN_BODY} bytes")
        try:
            body = json.loads(raw) if raw else {}
        except (ValueError, RecursionError):
            raise bad("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
        try:
            txn = txn_from_json(body)
        except TxnTooLargeError as exc:
            raise ApiError(
                413, "txn_too_large", str(exc), limit=exc.limit, maximum=exc.maximum, size=exc.size
            ) from None
        except (KeyError, TypeError, ValueError) as exc:
            raise bad(f"txn: {exc}"[:300]) from None
        self._check_txn_sizes(txn)
        before = self.engine.revision
        result = self.engine.txn(txn)  # LeaseNotFoundError -> 404
        if result.revision != before:
            await self._durable()
        return json_response(result_to_json(result))

    def _check_txn_sizes(self, txn: Txn) -> None:
        for item in (*txn.compare, *txn.success, *txn.failure):
            if isinstance(item, (Range, DeletePrefix)):
                self._check_key(item.prefix, allow_empty=True)
            else:
                self._check_key(item.key)
            if isinstance(item, Put) and len(item.value) > self.limits.max_value_bytes:
                raise ApiError(
                    413,
                    "value_too_large",
                    f"values are at most {self.limits.max_value_bytes} bytes",
                )

    async def range(self, request: web.Request) -> web.Response:
        prefix = self._prefix(request)
        limit: int | None = None
        if "limit" in request.query:
            limit = int_param(request, "limit", minimum=1)
        result = self.engine.range(prefix, limit)
        return json_response(
            {
                "revision": result.revision,
                "count": result.count,
                "more": result.more,
                "kvs": [kv_json(kv) for kv in result.kvs],
            }
        )

    async def delete_range(self, request: web.Request) -> web.Response:
        prefix = self._prefix(request)
        deleted = self.engine.delete(prefix, True)
        if deleted:
            await self._durable()
        return json_response({"deleted": deleted, "revision": self.engine.revision})

    async def compact(self, request: web.Request) -> web.Response:
        body = await self._body_json(request)
        revision = json_int(body, "revision", 1)
        self.engine.compact(revision)
        await self._durable()
        return json_response({"compact_revision": self.engine.compact_revision})

    # -- leases

    async def lease_grant(self, request: web.Request) -> web.Response:
        body = await self._body_json(request)
        ttl = json_number(body, "ttl")
        grant = self.engine.lease_grant(ttl)
        await self._durable()
        return json_response({"id": grant.id, "ttl": grant.ttl})

    async def lease_keep_alive(self, request: web.Request) -> web.Response:
        ttl = self.engine.lease_keep_alive(self._lease_id(request))
        return json_response({"ttl": ttl})

    async def lease_revoke(self, request: web.Request) -> web.Response:
        self.engine.lease_revoke(self._lease_id(request))
        await self._durable()
        return json_response({"revoked": True, "revision": self.engine.revision})

    async def lease_status(self, request: web.Request) -> web.Response:
        status = self.engine.lease_time_to_live(self._lease_id(request))
        return json_response(
            {
                "id": status.id,
                "granted_ttl": status.granted_ttl,
                "remaining": status.remaining,
                "keys": list(status.keys),
            }
        )

    async def leases(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "leases": [
                    {"id": s.id, "granted_ttl": s.granted_ttl, "remaining": s.remaining}
                    for s in self.engine.leases()
                ]
            }
        )

    # -- watches

    async def watch(self, request: web.Request) -> web.StreamResponse:
        prefix = self._prefix(request)
        start: int | None = None
        if "start_revision" in request.query:
            start = int_param(request, "start_revision", minimum=1)
        interval = DEFAULT_PROGRESS_INTERVAL
        if "progress_interval" in request.query:
            raw = request.query["progress_interval"]
            try:
                interval = float(raw)
            except ValueError:
                raise bad(
                    f"progress_interval must be a number of seconds, got {raw[:40]!r}"
                ) from None
            if not MIN_PROGRESS_INTERVAL <= interval <= MAX_PROGRESS_INTERVAL:
                raise bad(
                    f"progress_interval must be in [{MIN_PROGRESS_INTERVAL}, "
                    f"{MAX_PROGRESS_INTERVAL}] seconds, got {raw[:40]!r}"
                )
        if self.closing:
            raise ApiError(503, "unavailable", "the server is shutting down")
        if self.watch_streams + self.session_watches() >= self.limits.max_watch_streams:
            raise ApiError(
                503,
                "too_many_watches",
                f"this server serves at most {self.limits.max_watch_streams} watch streams",
            )
        snapshot = request.query.get("snapshot", "0")
        if snapshot not in ("0", "1"):
            raise bad(f"snapshot must be 0 or 1, got {snapshot[:40]!r}")
        if snapshot == "1" and start is not None:
            raise bad("snapshot=1 reads the prefix now: it takes no start_revision")
        engine = self.engine
        # the range, then the watcher from the next revision: no await in between
        result = engine.range(prefix, None) if snapshot == "1" else None
        watcher = engine.add_watcher(prefix, start, self)  # CompactedError -> 410
        created: dict[str, Any] = {
            "type": "created",
            "start_revision": watcher.min_revision,
            "revision": engine.revision,
            "progress_interval": interval,
        }
        if result is not None:
            created["count"] = result.count
            created["kvs"] = [kv_json(kv) for kv in result.kvs]
        self.watch_streams += 1
        loop = asyncio.get_running_loop()
        try:
            response = web.StreamResponse(
                headers={"Content-Type": NDJSON, "Cache-Control": "no-store"}
            )
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(frame(created))
            # One timer per stream, re-armed only when it fires: a stream that is written to
            # often costs no timer work per event. It wakes the loop below when nothing has been
            # sent for ``interval`` seconds, and a progress frame goes out.
            progress = _ProgressTimer(loop, interval, watcher.wake)
            try:
                while True:
                    try:
                        events = engine.read_events(watcher)
                    except CompactedError as exc:
                        await response.write(
                            frame(
                                {
                                    "type": "error",
                                    "error": "compacted",
                                    "message": str(exc),
                                    "requested_revision": exc.requested_revision,
                                    "compact_revision": exc.compact_revision,
                                }
                            )
                        )
                        break
                    except StoreClosedError:
                        await response.write(frame({"type": "closing"}))
                        break
                    revision = engine.revision  # read with the events: no await in between
                    if events:
                        await response.write(self._frames.get(prefix, events, revision))
                        progress.sent()
                        continue
                    if progress.due:
                        await response.write(frame({"type": "progress", "revision": revision}))
                        progress.sent()
                        continue
                    await engine.wait(watcher)
            finally:
                progress.cancel()
            await response.write_eof()
            return response
        except ConnectionError:  # the client went away: nothing more to say on this stream
            return response
        finally:
            self.watch_streams -= 1
            engine.remove_watcher(watcher)

    def end_watch_streams(self) -> None:
        """Make every open watch stream send a ``closing`` frame and end (shutdown)."""
        self.closing = True
        self.engine.fail_watchers_of(self, StoreClosedError("the server is shutting down"))


class _ProgressTimer:
    """Calls ``wake`` and sets :attr:`due` once ``interval`` seconds pass without :meth:`sent`."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, interval: float, wake: Callable[[], None]
    ) -> None:
        self._loop = loop
        self._interval = interval
        self._wake = wake
        self._last = loop.time()
        self.due = False
        self._handle = loop.call_at(self._last + interval, self._fire)

    def sent(self) -> None:
        self._last = self._loop.time()
        self.due = False

    def _fire(self) -> None:
        now = self._loop.time()
        deadline = self._last + self._interval
        if now >= deadline:
            self.due = True
            self._wake()
            deadline = now + self._interval
        self._handle = self._loop.call_at(deadline, self._fire)

    def cancel(self) -> None:
        self._handle.cancel()


def _open_file_limit() -> int:
    """The soft limit of open files (a large number where there is none)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return 1 << 20
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def make_app(
    engine: MemoryEngine,
    *,
    token: str | None = None,
    max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    data: DataDir | None = None,
    max_watch_streams: int = DEFAULT_MAX_WATCH_STREAMS,
    session_grace: float = DEFAULT_SESSION_GRACE,
) -> web.Application:
    """The aiohttp application serving ``engine`` (see ``docs/http-api.md`` for the routes).

    ``token``: require ``Authorization: Bearer <token>`` on every route but ``/healthz``.
    ``data``: an opened :class:`DataDir` whose durability every write waits for.
    ``max_watch_streams``: open watch streams beyond this get 503 ``too_many_watches`` (and
    as many watches again over sessions). ``session_grace``: seconds a session's leases outlive
    its connection, waiting for the client to resume it (``/v1/session``).
    """
    if max_key_bytes < 1 or max_value_bytes < 0 or max_watch_streams < 1:
        raise ValueError(
            "max_key_bytes and max_watch_streams must be >= 1 and max_value_bytes >= 0"
        )
    metrics = metrics_for(engine)
    state = _App(
        engine,
        token=token,
        limits=Limits(max_key_bytes, max_value_bytes, max_watch_streams),
        data=data,
        metrics=metrics,
    )
    metrics.watchers.set_function(lambda: state.watch_streams)
    sessions = SessionHub(
        engine,
        grace=session_grace,
        max_key_bytes=max_key_bytes,
        max_value_bytes=max_value_bytes,
        max_watches=max_watch_streams,
        durable=data.wait_durable if data is not None else None,
        observe=metrics.observe,
        other_watches=lambda: state.watch_streams,
    )
    state.session_watches = lambda: sessions.watches
    metrics.watchers.set_function(lambda: state.watch_streams + sessions.watches)
    metrics.sessions.set_function(lambda: sessions.session_count)
    # A body of client_max_size bytes is refused: +1 lets the largest allowed one through.
    app = web.Application(
        middlewares=[state.middleware],
        client_max_size=max(max_value_bytes, MAX_JSON_BODY_BYTES) + 1,
    )
    app[_STATE] = state
    app[_SESSIONS] = sessions

    def route(method: str, path: str, handler: _Handler, op: str) -> None:
        # The handler is registered as is (no wrapper coroutine per request); the middleware
        # finds its metrics label in this table (bound methods hash by instance and function).
        state.ops[handler] = op
        app.router.add_route(method, path, handler, expect_handler=state.expect_continue)

    route("GET", "/healthz", state.healthz, "healthz")
    route("GET", "/metrics", state.metrics_route, "metrics")
    from ._ui import add_ui_routes  # the web page and its data routes (docs/ui.md)

    add_ui_routes(state, route)
    route("GET", "/openapi.json", state.openapi, "openapi")
    route("GET", "/v1/revision", state.revision, "revision")
    # "(?s:.*)": any key, newlines included (a bare ".*" stops at one: 404 "no route").
    route("GET", "/v1/kv/{key:(?s:.*)}", state.get_key, "get")
    route("PUT", "/v1/kv/{key:(?s:.*)}", state.put_key, "put")
    route("DELETE", "/v1/kv/{key:(?s:.*)}", state.delete_key, "delete")
    route("POST", "/v1/add/{key:(?s:.*)}", state.add, "add")
    route("POST", "/v1/txn", state.txn, "txn")
    route("GET", "/v1/range/{prefix:(?s:.*)}", state.range, "range")
    route("DELETE", "/v1/range/{prefix:(?s:.*)}", state.delete_range, "delete_range")
    route("GET", "/v1/watch/{prefix:(?s:.*)}", state.watch, "watch")
    route("POST", "/v1/compact", state.compact, "compact")
    route("POST", "/v1/lease", state.lease_grant, "lease_grant")
    route("GET", "/v1/leases", state.leases, "leases")
    route("GET", "/v1/lease/{lease}", state.lease_status, "lease_status")
    route("POST", "/v1/lease/{lease}/keepalive", state.lease_keep_alive, "lease_keep_alive")
    route("DELETE", "/v1/lease/{lease}", state.lease_revoke, "lease_revoke")
    route("GET", SESSION_PATH, sessions.handle, "session")

    async def on_shutdown(app: web.Application) -> None:
        state.end_watch_streams()
        sessions.shutdown()

    app.on_shutdown.append(on_shutdown)
    return app


_STATE: web.AppKey[_App] = web.AppKey("aioelastic_state", _App)
_SESSIONS: web.AppKey[SessionHub] = web.AppKey("aioelastic_sessions", SessionHub)


# -- the embeddable server -----------------------------------------------------------------------


class HttpStoreServer:
    """``aioelastic serve`` as an async resource, for embedding in a program or a test.

    ``async with HttpStoreServer(port=0) as server: store = await open_store(server.url)``.
    Without ``data_dir`` the store lives in memory only; with it every acknowledged write survives
    a crash (see :mod:`aioelastic.store.http._persist` for the ``fsync`` policies); a damaged
    data dir is refused unless ``accept_data_loss`` (then it goes on from its last consistent
    state, the damaged files kept aside). ``engine``
    serves an existing :class:`MemoryEngine` (not closed on stop). :meth:`stop` is graceful: it
    stops accepting connections, ends watch streams, lets in-flight requests finish (up to
    ``shutdown_timeout`` seconds) and flushes the log. ``read_timeout``: seconds a request's
    head may take to arrive (a new connection's first one: from the connection; a TLS handshake
    too), and its body after its head, before the connection is closed (408); None: no
    deadline. It does not bound idle keep-alive connections or responses (watches).
    ``max_connections``: connections served at once (None: what the open-file limit allows); see
    ``docs/http-api.md``, "Connection limits". ``backlog``: the listen backlog (None: 65,535
    capped by ``net.core.somaxconn``).
    ``session_grace``: seconds a session's leases outlive its connection (see ``make_app``).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        engine: MemoryEngine | None = None,
        data_dir: str | None = None,
        fsync: FsyncPolicy = "always",
        snapshot_every: int = 10_000,
        accept_data_loss: bool = False,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        max_watch_streams: int = DEFAULT_MAX_WATCH_STREAMS,
        shutdown_timeout: float = 10.0,
        backlog: int | None = None,
        read_timeout: float | None = DEFAULT_READ_TIMEOUT,
        session_grace: float = DEFAULT_SESSION_GRACE,
        max_connections: int | None = None,
    ) -> None:
        if engine is not None and data_dir is not None:
            raise ValueError("give engine or data_dir, not both (a data dir loads its own engine)")
        if token is not None and not token:
            raise ValueError("token must not be empty")
        if read_timeout is not None and (
            isinstance(read_timeout, bool)
            or not isinstance(read_timeout, (int, float))
            or not math.isfinite(read_timeout)
            or read_timeout <= 0
        ):
            raise ValueError(
                "read_timeout must be a finite number of seconds > 0, or None for no deadline; "
                f"got {read_timeout!r}"
            )
        self.host = host
        self._port = port
        self._owns_engine = engine is None
        self.engine = engine if engine is not None else MemoryEngine(history_limit=history_limit)
        self.data = (
            DataDir(
                data_dir,
                fsync=fsync,
                snapshot_every=snapshot_every,
                accept_data_loss=accept_data_loss,
            )
            if data_dir is not None
            else None
        )
        self._token = token
        self._ssl = ssl_context
        self._max_key_bytes = max_key_bytes
        self._max_value_bytes = max_value_bytes
        self._max_watch_streams = max_watch_streams
        self._shutdown_timeout = shutdown_timeout
        self._backlog = backlog
        if max_connections is not None and (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
        self._max_connections = max_connections
        self._listener: asyncio.Server | None = None
        #: One log line a second at most from the server's loggers (attach more: ``asyncio``).
        self.log_limiter = LogLimiter()
        self._read_timeout = None if read_timeout is None else float(read_timeout)
        self._session_grace = session_grace
        self._runner: web.AppRunner | None = None
        self._app: web.Application | None = None
        self._stopped = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        """The bound port (the real one when started with ``port=0``)."""
        return self._port

    @property
    def url(self) -> str:
        """``http://host:port`` (``https://`` with TLS), ready for ``open_store``."""
        scheme = "https" if self._ssl is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self._port}"

    async def start(self) -> None:
        """Load the data directory (if any) and start listening."""
        if self._runner is not None:
            raise RuntimeError("the server has already started")
        if self.data is not None:
            self.data.open(self.engine)
        self._warn_of_limits()
        try:
            self._app = make_app(
                self.engine,
                token=self._token,
                max_key_bytes=self._max_key_bytes,
                max_value_bytes=self._max_value_bytes,
                data=self.data,
                max_watch_streams=self._max_watch_streams,
                session_grace=self._session_grace,
            )
            self._runner = await self._serve(self._app)
        except BaseException:
            await self._release()
            raise

    async def _serve(self, app: web.Application) -> web.AppRunner:
        """Set ``app`` up and listen: ``aiohttp``'s runner with our connection handlers."""
        # A client that hangs up cancels its handler: a watch stream's resources go at once
        # rather than at its next progress frame. Writes are applied synchronously on the
        # engine, so a cancelled write handler leaves nothing half done.
        runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=self._shutdown_timeout
        )
        await runner.setup()
        self._runner = runner
        state = app[_STATE]
        state.max_connections = self.max_connections
        connection = connection_factory(
            runner,
            route=functools.partial(_fast_path, state),
            observe=state.metrics.observe,
            refused=state.metrics.refused,
            read_timeout=self._read_timeout,
            max_connections=self.max_connections,
            access_log=None,
            max_line_size=3 * self._max_key_bytes + 1024,
            max_field_size=8190,
            max_headers=64,
            # Bodies are taken as sent; a content coding is refused (415, refuse_codings).
            auto_decompress=False,
            keepalive_timeout=KEEPALIVE_TIMEOUT,
        )
        server = runner.server
        assert server is not None
        state.metrics.connections.set_function(lambda: len(server.connections))
        self.log_limiter.on_event = state.metrics.log_event
        self.log_limiter.attach("aiohttp.server", log.name)
        # Our own listener, not a web.TCPSite: a site has no TLS handshake deadline (asyncio
        # keeps a socket that never handshakes for 60 s); here it is the read timeout.
        self._listener = await asyncio.get_running_loop().create_server(
            connection,
            self.host,
            self._port,
            ssl=self._ssl,
            backlog=self.backlog,
            ssl_handshake_timeout=self._read_timeout if self._ssl is not None else None,
        )
        self._port = self._listener.sockets[0].getsockname()[1]
        return runner

    async def stop(self) -> None:
        """Stop gracefully (idempotent): end watch streams, finish requests, flush the log."""
        if self._stopped:
            return
        self._stopped = True
        await self._release()

    aclose = stop

    async def _release(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()  # no new connections; the runner's shutdown finishes the others
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        if self.data is not None:
            await self.data.aclose()
        if self._owns_engine:
            self.engine.close()
        self.log_limiter.detach("aiohttp.server", log.name)

    @property
    def max_connections(self) -> int:
        """The connection limit: the one given, or what the open-file limit allows, less
        descriptors kept for the rest (:data:`FD_RESERVE`) and the overflow answered 503."""
        room = max(1, _open_file_limit() - FD_RESERVE - OVERFLOW)
        if self._max_connections is None:
            return room
        return min(self._max_connections, room)

    @property
    def backlog(self) -> int:
        """The listen backlog: the one given, or thousands as ``net.core.somaxconn`` allows."""
        return self._backlog if self._backlog is not None else listen_backlog()[0]

    def _warn_of_limits(self) -> None:
        somaxconn = listen_backlog()[1]
        if self._backlog is None and somaxconn is not None and somaxconn < 4096:
            log.warning(
                "net.core.somaxconn is %d: a burst of more clients connecting at once can be "
                "refused (raise it: sysctl -w net.core.somaxconn=65535)",
                somaxconn,
            )
        if self._max_connections is not None and self.max_connections < self._max_connections:
            log.warning(
                "max_connections %d is more than the open-file limit allows: %d",
                self._max_connections,
                self.max_connections,
            )

    def statistics(self) -> dict[str, int]:
        """Keys, leases, open watch streams, sessions and the revision, for logs and tests."""
        app = self._app
        return {
            "keys": len(self.engine),
            "leases": self.engine.lease_count,
            "watch_streams": app[_STATE].watch_streams if app is not None else 0,
            "sessions": app[_SESSIONS].session_count if app is not None else 0,
            "session_watches": app[_SESSIONS].watches if app is not None else 0,
            "revision": self.engine.revision,
        }
