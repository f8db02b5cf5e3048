"""The aiohttp application of ``aioelastic serve``: :func:`make_app` (the route table and the
middleware) and :func:`fast_path` (the hot routes without routing)."""

from __future__ import annotations

from aiohttp import web

from ..memory import MemoryEngine
from ._frames import SESSION_PATH
from ._limits import (
    DEFAULT_MAX_KEY_BYTES,
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_MAX_WATCH_STREAMS,
    MAX_JSON_BODY_BYTES,
    Limits,
)
from ._metrics import metrics_for
from ._persist import DataDir
from ._protocol import RequestHandlerFunction
from ._rest import RestRoutes
from ._rest_watch import WatchRoute
from ._session_server import DEFAULT_SESSION_GRACE, SessionHub
from ._state import Handler, ServerState

__all__ = ["REST", "SESSIONS", "STATE", "fast_path", "make_app"]

STATE: web.AppKey[ServerState] = web.AppKey("aioelastic_state", ServerState)
SESSIONS: web.AppKey[SessionHub] = web.AppKey("aioelastic_sessions", SessionHub)
REST: web.AppKey[RestRoutes] = web.AppKey("aioelastic_rest", RestRoutes)


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
    limits = Limits(max_key_bytes, max_value_bytes, max_watch_streams)
    state = ServerState(engine, token=token, limits=limits, data=data, metrics=metrics)
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
    app[STATE] = state
    app[SESSIONS] = sessions
    app[REST] = rest = RestRoutes(state)
    _add_routes(app, state, rest, WatchRoute(state), sessions)

    async def on_shutdown(app: web.Application) -> None:
        state.end_watch_streams()
        sessions.shutdown()

    app.on_shutdown.append(on_shutdown)
    return app


def _add_routes(
    app: web.Application,
    state: ServerState,
    rest: RestRoutes,
    watches: WatchRoute,
    sessions: SessionHub,
) -> None:
    def route(method: str, path: str, handler: Handler, op: str) -> None:
        # The handler is registered as is (no wrapper coroutine per request); the middleware
        # finds its metrics label in this table (bound methods hash by instance and function).
        state.ops[handler] = op
        app.router.add_route(method, path, handler, expect_handler=state.expect_continue)

    route("GET", "/healthz", rest.healthz, "healthz")
    route("GET", "/metrics", rest.metrics, "metrics")
    from ._ui import add_ui_routes  # the web page and its data routes (docs/ui.md)

    add_ui_routes(state, route)
    route("GET", "/openapi.json", rest.openapi, "openapi")
    route("GET", "/v1/revision", rest.revision, "revision")
    # "(?s:.*)": any key, newlines included (a bare ".*" stops at one: 404 "no route").
    route("GET", "/v1/kv/{key:(?s:.*)}", rest.get_key, "get")
    route("PUT", "/v1/kv/{key:(?s:.*)}", rest.put_key, "put")
    route("DELETE", "/v1/kv/{key:(?s:.*)}", rest.delete_key, "delete")
    route("POST", "/v1/add/{key:(?s:.*)}", rest.add, "add")
    route("POST", "/v1/txn", rest.txn, "txn")
    route("GET", "/v1/range/{prefix:(?s:.*)}", rest.range, "range")
    route("DELETE", "/v1/range/{prefix:(?s:.*)}", rest.delete_range, "delete_range")
    route("GET", "/v1/watch/{prefix:(?s:.*)}", watches.watch, "watch")
    route("POST", "/v1/compact", rest.compact, "compact")
    route("POST", "/v1/lease", rest.lease_grant, "lease_grant")
    route("GET", "/v1/leases", rest.leases, "leases")
    route("GET", "/v1/lease/{lease}", rest.lease_status, "lease_status")
    route("POST", "/v1/lease/{lease}/keepalive", rest.lease_keep_alive, "lease_keep_alive")
    route("DELETE", "/v1/lease/{lease}", rest.lease_revoke, "lease_revoke")
    route("GET", SESSION_PATH, sessions.handle, "session")


def fast_path(app: web.Application, routed: RequestHandlerFunction) -> RequestHandlerFunction:
    """The server's request handler: GET and PUT on ``/v1/kv/{key}`` (the hot routes) go
    straight to their handlers, everything else through the application (``routed``: its
    router and middleware).

    The fast path skips only the routing: the key is cut from the path as the router's
    ``{key:...}`` pattern would (``%2F`` and ``%25`` undone), and the request is
    answered by :meth:`ServerState.answer` as the middleware would (authentication, JSON errors,
    metrics). A request with ``Expect`` (``100-continue``) or anything unusual takes the routed
    way. Fast-path requests have no ``match_info`` (and so no ``request.app``); handlers use
    the state they are bound to.
    """
    state = app[STATE]
    answer = state.answer
    get = app[REST].get_raw_key
    put = app[REST].put_raw_key

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
