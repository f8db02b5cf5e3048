"""aiohttp's connection handling, customised: requests it cannot parse are answered with JSON
errors, a request's head and body must arrive within the read deadline, and connections over the
budget are answered ``/healthz`` only (:class:`~._connections.ConnectionBudget`).

**The one module that relies on aiohttp internals** (``tests/test_http_aiohttp_internals.py``
fails on a use anywhere else; ``pyproject.toml`` pins ``aiohttp<3.15`` for them). aiohttp has
no public hook for any of these:

- :class:`JsonErrorRequestHandler` subclasses ``web.RequestHandler`` (exported, but its
  subclassing contract is not documented) and overrides ``handle_error`` (the answer to an
  unparsable request), ``connection_made``, ``data_received`` and ``connection_lost``;
- the read deadline reads the handler's private state: ``_request_count``, ``_messages``,
  ``_waiter``, ``_current_request``, ``_force_close``, ``_close``, ``_upgraded``, ``_loop``;
- ``LineTooLong`` comes from ``aiohttp.http_exceptions`` (not in its ``__all__``);
- :func:`handler_factory` sets ``web.Server.request_handler`` (an undocumented attribute the
  handler reads when it is made) to the fast path, and makes the handlers itself rather than
  through ``web.Server.__call__``, so that they get the deadline and the budget; a handler is
  made once a new connection has spoken (:mod:`._intake`), and handed the connection then.

The server is otherwise built with public API: ``web.AppRunner``, ``runner.server``,
``server.connections``, and asyncio's protocol interface (``connection_made``,
``data_received``) to hand a connection to a handler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import EMPTY_PAYLOAD, StreamReader, web
from aiohttp.http_exceptions import LineTooLong  # internal: not exported by aiohttp

from ._connections import ConnectionBudget
from ._encoding import encode_json
from ._errors import STATUS_CODES, RequestReadTimeout, error_response

__all__ = [
    "HandlerFactory",
    "JsonErrorRequestHandler",
    "RequestHandlerFunction",
    "handler_factory",
    "write_read_timeout",
]

#: What ``web.Server`` calls with each request (the application's routed handler, or the fast path).
RequestHandlerFunction = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class JsonErrorRequestHandler(web.RequestHandler):
    """aiohttp's connection handler, answering requests it cannot parse with JSON errors and
    enforcing the server's read deadline.

    The deadline (``read_timeout``, from the server): a request's head must be whole within
    that many seconds of its first byte, and its body within that many seconds of its head;
    otherwise the connection is closed, after a 408 JSON error where one can still be written.
    It is kept by watching what the parser makes of each chunk received (:meth:`data_received`)
    and one timer per connection, armed only while a request is incomplete between two chunks:
    a request that arrives in one chunk, like almost every request, costs no timer. A new
    connection's first request is timed from the connection (a socket that never sends a byte
    is closed too). An idle connection between requests is left to aiohttp's
    ``keepalive_timeout``, and a response being written (a watch stream) is not a read: neither
    has a read deadline. The connection budget (``max_connections``): see
    :class:`~aioelastic.store.http._connections.ConnectionBudget`.
    """

    __slots__ = (
        "_budget",
        "_entry",
        "_observe",
        "_read_body",
        "_read_since",
        "_read_timeout",
        "_read_timer",
        "over_limit",
    )

    def __init__(
        self,
        manager: web.Server,
        *,
        read_timeout: float | None,
        budget: ConnectionBudget | None,
        entry: Any,
        since: float,
        over_limit: bool,
        observe: Callable[[str, int, float], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self._read_timeout = read_timeout
        self._budget = budget
        #: what the budget counts this connection as (the :class:`~._intake.NewConnection` that
        #: accepted it and handed it over: the budget saw it open and speak)
        self._entry = entry
        self._observe = observe
        #: Accepted over max_connections: answered /healthz only (ConnectionBudget).
        self.over_limit = over_limit
        #: When the incomplete request began (its first byte, or its head for a body; the
        #: connection's time for its first request), or None.
        self._read_since: float | None = since
        #: The body being received, when the incomplete part is a body.
        self._read_body: StreamReader | None = None
        self._read_timer: asyncio.TimerHandle | None = None

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send an error")
        if status >= 500:
            self.log_exception("Error handling request", exc_info=exc)
        text = message or (str(exc) if exc is not None else "") or "malformed request"
        code = STATUS_CODES.get(status, "error")
        if isinstance(exc, LineTooLong) or "Too many headers" in text:
            status, code = 431, "headers_too_large"
            text = f"request line or headers too large: {text[:200]}"
        elif status == 400:
            text = f"malformed HTTP request: {text[:200]}"
        resp = error_response(status, code, text)
        resp.force_close()
        return resp

    # -- the connection budget and the read deadline

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Handed a connection that has spoken (:class:`~._intake.NewConnection`), with its
        first bytes to follow: the first request's head must be whole within the read deadline
        of the connection's start."""
        super().connection_made(transport)
        if self._read_timeout is not None and self._read_since is not None:
            self._start_read_clock(self._read_since)
        else:
            self._read_since = None

    def data_received(self, data: bytes) -> None:
        requests = self._request_count
        super().data_received(data)
        if self._read_timeout is None or self._force_close or self._close or self._upgraded:
            return
        if self._request_count != requests:
            # One or more heads completed (the new messages are still queued).
            payload = self._messages[-1][1]
            if not payload.is_eof():
                self._read_body = payload
                self._start_read_clock()
            else:
                self._read_body = None
                self._read_since = None
                # A head without a body ends with a newline: bytes after it begin the next
                # request. (After a body no such test exists, and none is made: a next request
                # begun in the chunk that ended a body is left to the keep-alive timeout.)
                if payload is EMPTY_PAYLOAD and data and not data.endswith(b"\n"):
                    self._start_read_clock()
        elif self._read_body is not None:
            if self._read_body.is_eof():
                self._read_body = None
                self._read_since = None
        elif self._read_since is None and data.strip(b"\r\n"):
            # The first bytes of a head (blank lines between requests are ignored, as aiohttp's
            # parser ignores them).
            self._start_read_clock()

    def _start_read_clock(self, since: float | None = None) -> None:
        assert self._read_timeout is not None
        loop = self._loop
        self._read_since = now = loop.time() if since is None else since
        if self._read_timer is None:
            # An earlier timer still armed fires early and re-arms itself for this read.
            self._read_timer = loop.call_at(now + self._read_timeout, self._read_deadline)

    def _read_deadline(self) -> None:
        self._read_timer = None
        since, timeout = self._read_since, self._read_timeout
        if since is None or timeout is None or self._force_close or self.transport is None:
            return
        loop = self._loop
        now = loop.time()
        if now < since + timeout:
            self._read_timer = loop.call_at(since + timeout, self._read_deadline)
            return
        body = self._read_body
        if body is not None:
            self._read_since = self._read_body = None
            # The handler reading it answers 408 (and closes); a handler that is not reading it
            # (a watch given a body) is closed once it had the chance to.
            body.set_exception(
                RequestReadTimeout(
                    f"the request body did not arrive within {timeout:g}s of its headers "
                    "(the server's read timeout)"
                )
            )
            request = self._current_request
            if request is not None:
                loop.call_soon(self._close_if_still_answering, request)
            return
        waiter = self._waiter
        if self._messages or waiter is None or waiter.done():
            # Still answering an earlier request: the next one is judged when that is done.
            self._read_timer = loop.call_at(now + timeout, self._read_deadline)
            return
        self._read_since = None
        self._write_read_timeout(timeout, now - since)
        self.force_close()

    def _close_if_still_answering(self, request: web.BaseRequest) -> None:
        if self._current_request is request:
            self.force_close()

    def _write_read_timeout(self, timeout: float, waited: float) -> None:
        """Answer 408 on a connection waiting for the rest of a request's head."""
        if self.transport is not None:
            write_read_timeout(self.transport, timeout)
            self._observe("other", 408, waited)

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        if self._budget is not None:
            self._budget.closed(self._entry)
            self._budget = None
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None


def write_read_timeout(transport: Any, timeout: float) -> None:
    """The 408 JSON answer to a request's head that did not arrive within ``timeout``."""
    body = encode_json(
        {
            "error": "request_timeout",
            "message": f"the request's head did not arrive within {timeout:g}s "
            "(the server's read timeout); closing the connection",
        }
    ).encode()
    transport.write(
        b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    )


#: ``make(entry, since, over_limit, budget)``: aiohttp's handler for a connection that has spoken
#: (``entry``: what the budget counts it as; ``since``: the connection's start, loop time).
HandlerFactory = Callable[[Any, float, bool, "ConnectionBudget | None"], JsonErrorRequestHandler]


def handler_factory(
    runner: web.AppRunner,
    *,
    route: Callable[[RequestHandlerFunction], RequestHandlerFunction],
    observe: Callable[[str, int, float], None],
    read_timeout: float | None,
    **handler_kwargs: Any,
) -> HandlerFactory:
    """What a new connection (:class:`~._intake.NewConnection`) hands itself to once it has
    spoken, when it is not a session: a :class:`JsonErrorRequestHandler` of ``runner.server``
    (which tracks and shuts them down), each request through ``route(the application's
    handler)``.

    ``observe(op, status, seconds)`` meters a 408 on a head too slow. ``handler_kwargs`` go to
    aiohttp's ``RequestHandler`` (``keepalive_timeout``, ``max_line_size``, ``access_log``, ...).
    """
    server = runner.server
    assert server is not None, "set the runner up first"
    server.request_handler = route(server.request_handler)
    loop = asyncio.get_running_loop()

    def handler(
        entry: Any, since: float, over_limit: bool, budget: ConnectionBudget | None
    ) -> JsonErrorRequestHandler:
        return JsonErrorRequestHandler(
            server,
            loop=loop,
            read_timeout=read_timeout,
            budget=budget,
            entry=entry,
            since=since,
            over_limit=over_limit,
            observe=observe,
            **handler_kwargs,
        )

    return handler
