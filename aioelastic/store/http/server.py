"""The HTTP store server: ``aioelastic serve`` as an embeddable async resource.

:class:`HttpStoreServer` runs the application :func:`make_app` builds on a socket
(``async with HttpStoreServer(port=0) as server: server.url``), embeddable in any asyncio
program and in tests; ``aioelastic serve`` is a thin command around it. This module is the
lifecycle only (start, listen, stop); the rest has one module each:

- ``_app.py``: ``make_app``, the route table and the fast path;
- ``_state.py``: authentication, errors as JSON and metrics for every request;
- ``_rest.py`` and ``_rest_watch.py``: the unary routes and the NDJSON watch stream;
- ``_session_server.py``: ``/v1/session``, the multiplexed session transport (its sessions and
  the hello); ``_session_raw.py`` the upgraded connection, ``_session_conn.py`` a connection's
  requests, answers and watches;
- ``_intake.py``: a connection from its accept to its first bytes (the connection budget, the
  deadline of a silent one, a session's upgrade taken directly, the rest handed to aiohttp);
- ``_protocol.py``: aiohttp's connection handler customised (JSON errors for unparsable
  requests, the read deadline): the one module that relies on aiohttp internals;
- ``_metrics.py``, ``_errors.py``, ``_encoding.py``, ``_parsing.py``, ``_limits.py``.

The routes are described in ``docs/http-api.md`` and by the OpenAPI document at
``/openapi.json``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import ssl
from typing import Self

from aiohttp import web
from anyio.abc import AsyncResource

from ..memory import DEFAULT_HISTORY_LIMIT, MemoryEngine
from ._app import SESSIONS, STATE, fast_path, make_app
from ._connections import LogLimiter, connection_room, listen_backlog
from ._intake import Intake, intake_for
from ._limits import DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_VALUE_BYTES, DEFAULT_MAX_WATCH_STREAMS
from ._persist import DataDir, FsyncPolicy
from ._protocol import handler_factory
from ._session_raw import DirectUpgrade
from ._session_server import DEFAULT_SESSION_GRACE

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


def _checked_read_timeout(read_timeout: float | None) -> float | None:
    if read_timeout is None:
        return None
    if (
        isinstance(read_timeout, bool)
        or not isinstance(read_timeout, (int, float))
        or not math.isfinite(read_timeout)
        or read_timeout <= 0
    ):
        raise ValueError(
            "read_timeout must be a finite number of seconds > 0, or None for no deadline; "
            f"got {read_timeout!r}"
        )
    return float(read_timeout)


def _checked_max_connections(max_connections: int | None) -> int | None:
    if max_connections is not None and (
        isinstance(max_connections, bool)
        or not isinstance(max_connections, int)
        or max_connections < 1
    ):
        raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
    return max_connections


class HttpStoreServer(AsyncResource):
    """``aioelastic serve`` as an async resource, for embedding in a program or a test.

    ``async with HttpStoreServer(port=0) as server: store = await open_store(server.url)``.
    Without ``data_dir`` the store lives in memory only; with it every acknowledged write survives
    a crash (see :mod:`aioelastic.store.http._persist` for the ``fsync`` policies); a damaged
    data dir is refused unless ``accept_data_loss`` (then it goes on from its last consistent
    state, the damaged files kept aside). ``engine``
    serves an existing :class:`MemoryEngine` (not closed on stop). :meth:`aclose` (or its older
    name :meth:`stop`) is graceful: it
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
        self._read_timeout = _checked_read_timeout(read_timeout)
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
        self._max_connections = _checked_max_connections(max_connections)
        self._listener: asyncio.Server | None = None
        self._intake: Intake | None = None
        #: One log line a second at most from the server's loggers (attach more: ``asyncio``).
        self.log_limiter = LogLimiter()
        self._session_grace = session_grace
        self._runner: web.AppRunner | None = None
        self._app: web.Application | None = None
        self._stopped = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

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
        state = app[STATE]
        state.max_connections = self.max_connections
        handler = handler_factory(
            runner,
            route=functools.partial(fast_path, app),
            observe=state.metrics.observe,
            read_timeout=self._read_timeout,
            access_log=None,
            max_line_size=3 * self._max_key_bytes + 1024,
            max_field_size=8190,
            max_headers=64,
            # Bodies are taken as sent; a content coding is refused (415, refuse_codings).
            auto_decompress=False,
            keepalive_timeout=KEEPALIVE_TIMEOUT,
        )
        self._intake = intake = intake_for(
            handler,
            observe=state.metrics.observe,
            refused=state.metrics.refused,
            read_timeout=self._read_timeout,
            max_connections=self.max_connections,
            upgrade=DirectUpgrade(app[SESSIONS], state.token),
        )
        server = runner.server
        assert server is not None
        state.metrics.connections.set_function(lambda: len(server.connections) + len(intake.live))
        self.log_limiter.on_event = state.metrics.log_event
        self.log_limiter.attach("aiohttp.server", log.name)
        # Our own listener, not a web.TCPSite: a site has no TLS handshake deadline (asyncio
        # keeps a socket that never handshakes for 60 s); here it is the read timeout.
        self._listener = await asyncio.get_running_loop().create_server(
            intake,
            self.host,
            self._port,
            ssl=self._ssl,
            backlog=self.backlog,
            ssl_handshake_timeout=self._read_timeout if self._ssl is not None else None,
        )
        self._port = self._listener.sockets[0].getsockname()[1]
        return runner

    async def aclose(self) -> None:
        """Stop gracefully (idempotent): end watch streams, finish requests, flush the log
        (what ``async with`` does on exit)."""
        if self._stopped:
            return
        self._stopped = True
        await self._release()

    async def stop(self) -> None:
        """:meth:`aclose` under its older name."""
        await self.aclose()

    async def _release(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()  # no new connections; the runner's shutdown finishes the others
        if self._intake is not None:
            self._intake.close_silent()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()  # (its on_shutdown ends the sessions)
        if self._app is not None:
            await self._app[SESSIONS].wait_closed(self._shutdown_timeout)
        if self.data is not None:
            await self.data.aclose()
        if self._owns_engine:
            self.engine.close()
        self.log_limiter.detach("aiohttp.server", log.name)

    @property
    def max_connections(self) -> int:
        """The connection limit: the one given, or what the open-file limit allows, less
        descriptors kept for the rest and for the overflow answered 503 (``connection_room``)."""
        room = connection_room()
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
            "watch_streams": app[STATE].watch_streams if app is not None else 0,
            "sessions": app[SESSIONS].session_count if app is not None else 0,
            "session_watches": app[SESSIONS].watches if app is not None else 0,
            "revision": self.engine.revision,
        }
