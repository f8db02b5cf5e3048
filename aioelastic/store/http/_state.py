"""The state behind the REST routes, and the answering of every request: authentication, errors
mapped to JSON answers, metrics, ``Expect: 100-continue`` and connections over the budget."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from ...errors import CompactedError, LeaseNotFoundError, StoreClosedError
from ..memory import MemoryEngine
from ._errors import STATUS_CODES, ApiError, RequestReadTimeout, bad, error_response
from ._limits import MAX_JSON_BODY_BYTES, Limits
from ._metrics import NoMetrics, ServerMetrics
from ._parsing import refuse_codings
from ._persist import DataDir, LogWriteError
from ._protocol import RequestHandlerFunction

__all__ = ["Handler", "ServerState"]

log = logging.getLogger("aioelastic.serve")

#: A route's handler.
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_T = TypeVar("_T")


def _call(request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
    return handler(request)


class ServerState:
    """The engine, limits, auth, metrics and open watch streams of one server, and the answering
    of its requests (:meth:`answer`), which the middleware and the fast path share."""

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
        #: REST watch streams and the page's event streams open (their watchers' owner is self)
        self.watch_streams = 0
        #: watches served over sessions (they share ``max_watch_streams``), set by make_app
        self.session_watches: Callable[[], int] = lambda: 0
        #: Set by the server: the connection limit (None: none).
        self.max_connections: int | None = None
        #: The metrics label (``op``) of each route handler, filled by ``make_app``.
        self.ops: dict[Any, str] = {}

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
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
        except asyncio.CancelledError:
            # aiohttp cancels the handler when the client goes away (a watch it closed): not a
            # server error; counted as 499, nginx's "client closed request"
            status = 499
            raise
        except Exception as exc:
            failed = self._error_answer(request, exc)
            if failed is None:
                raise  # answered 500 by the connection handler (_protocol.py)
            status = failed.status
            return failed
        finally:
            self.metrics.observe(metered, status, time.perf_counter() - start)

    def _error_answer(self, request: web.Request, exc: Exception) -> web.Response | None:
        """The JSON answer to a request that raised ``exc`` (None: not an error it expects)."""
        if isinstance(exc, ApiError):
            return exc.response()
        if isinstance(exc, web.HTTPException):  # aiohttp's own: no route, method, body too large
            return self._aiohttp_error(request, exc)
        if isinstance(exc, CompactedError):
            return error_response(
                410,
                "compacted",
                str(exc),
                requested_revision=exc.requested_revision,
                compact_revision=exc.compact_revision,
            )
        if isinstance(exc, LeaseNotFoundError):
            return error_response(404, "lease_not_found", str(exc), lease=exc.lease_id)
        if isinstance(exc, StoreClosedError):
            return error_response(503, "unavailable", str(exc))
        if isinstance(exc, ValueError):  # the engine's argument errors (e.g. add on a non-integer)
            return error_response(400, "bad_request", str(exc))
        if isinstance(exc, RequestReadTimeout):  # the body was too slow (the read deadline)
            response = error_response(408, "request_timeout", f"{exc}; closing the connection")
            response.force_close()
            return response
        if isinstance(exc, LogWriteError):  # the log cannot take the write: it was not made
            status = 507 if exc.full else 503
            code = "insufficient_storage" if exc.full else "storage_unavailable"
            return error_response(status, code, f"{exc.strerror}; the write was not applied")
        if isinstance(exc, ConnectionError):  # the client went away mid-answer: not our failure
            log.debug("client closed answering %s %s: %s", request.method, request.path, exc)
            response = error_response(499, "client_closed", "the client closed the connection")
            response.force_close()  # counted as 499, as a cancelled handler is
            return response
        if isinstance(exc, OSError):  # the data dir failed (fsync): durability unknown
            log.error("storage failure answering %s %s: %s", request.method, request.path, exc)
            return error_response(500, "storage_error", f"the data directory failed: {exc}")
        return None

    def _aiohttp_error(self, request: web.Request, exc: web.HTTPException) -> web.Response:
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
            status, STATUS_CODES.get(status, "error"), message, {"Allow": allow} if allow else None
        )

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

    def check_key(self, key: str, *, allow_empty: bool = False) -> str:
        """``key``, if it is within the key limit (and not empty, unless ``allow_empty``)."""
        if not key and not allow_empty:
            raise bad("the key (the URL path after the route) must not be empty")
        if len(key.encode("utf-8", "surrogatepass")) > self.limits.max_key_bytes:
            raise ApiError(
                413,
                "key_too_large",
                f"keys are at most {self.limits.max_key_bytes} bytes (UTF-8)",
            )
        return key

    async def durable(self) -> None:
        """Wait until the writes made so far are durable (at once without a data dir)."""
        data = self.data
        if data is not None:
            await data.wait_durable()

    def end_watch_streams(self) -> None:
        """Make every open watch stream send a ``closing`` frame and end (shutdown)."""
        self.closing = True
        self.engine.fail_watchers_of(self, StoreClosedError("the server is shutting down"))
