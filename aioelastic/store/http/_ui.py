"""The web page of ``aioelastic serve`` and the routes it reads (``docs/ui.md``).

``GET /`` links the page and the service routes; ``GET /ui`` is the page, with its script and
style beside it (package data in ``ui/``, served as they are: no build step, nothing from the
internet). These three carry no store data and need no token, so a browser can load them before
it has asked for one. The data routes go through the server's authentication like every other:

- ``GET /v1/status/{run_id}``: the run's status, the object ``aioelastic status --json`` prints;
- ``GET /v1/ui/snapshot?run=ID``: the page's overview (:mod:`aioelastic._overview`);
- ``GET /v1/ui/events?run=ID``: server-sent events, a ``snapshot`` after every change in the
  store (driven by a watch on the engine), a fresh one (or a ``ping`` when nothing on the page
  runs down) every :data:`TICK` seconds, and a ``closing`` event when the server stops.

The overview is built by :mod:`aioelastic._overview`, which reads rendezvous and sync records:
it is imported when first asked for, never when the server is, so store/ stays below them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ...errors import (
    CompactedError,
    RendezvousNotFoundError,
    RendezvousStateError,
    StoreClosedError,
)
from ..memory import MemoryStore
from ._encoding import json_response
from ._errors import ApiError
from ._state import Handler, ServerState

if TYPE_CHECKING:
    from ..memory import MemoryEngine

__all__ = ["MIN_GAP", "TICK", "add_ui_routes"]

#: Seconds between two snapshots of one events stream at least: a burst of writes is one push.
MIN_GAP = 0.2
#: Seconds after which a stream sends a snapshot even without a change, so that lease times are
#: fresh: a keep-alive renews a lease without writing a key, so no watch reports it.
TICK = 1.0

_ASSETS = {
    "/ui": ("index.html", "text/html"),
    "/ui/ui.js": ("ui.js", "text/javascript"),
    "/ui/ui.css": ("ui.css", "text/css"),
}
#: The page may talk to this server only: no inline code, nothing from elsewhere.
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_INDEX = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>aioelastic serve</title></head>
<body><h1>aioelastic serve</h1><ul>
<li><a href="/ui">/ui</a>: the live page of the jobs in this store</li>
<li><a href="/openapi.json">/openapi.json</a>: the HTTP API</li>
<li><a href="/metrics">/metrics</a>: Prometheus metrics</li>
<li><a href="/healthz">/healthz</a>: health</li>
</ul></body></html>
"""


def _sse(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event (its data is one line of JSON: JSON escapes every newline)."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class UiRoutes:
    """The page's routes over the server's state (engine, limits, watch-stream count)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self._files: dict[str, bytes] = {}

    def _run_param(self, request: web.Request) -> str | None:
        from ...rendezvous._state import check_run_id

        run = request.query.get("run")
        return None if run is None or run == "" else check_run_id(run)  # ValueError -> 400

    async def index(self, request: web.Request) -> web.Response:
        return web.Response(text=_INDEX, content_type="text/html", charset="utf-8")

    async def asset(self, request: web.Request) -> web.Response:
        name, content_type = _ASSETS[request.path]
        body = self._files.get(name)
        if body is None:
            body = importlib.resources.files(__package__).joinpath("ui", name).read_bytes()
            self._files[name] = body
        response = web.Response(body=body, content_type=content_type, charset="utf-8")
        response.headers.update(
            {
                "Content-Security-Policy": _CSP,
                "X-Content-Type-Options": "nosniff",
                "Cache-Control": "no-cache",
                "Referrer-Policy": "no-referrer",
            }
        )
        return response

    async def status(self, request: web.Request) -> web.Response:
        from ...rendezvous._state import check_run_id
        from ...rendezvous._status import read_run_status

        run_id = check_run_id(request.match_info["run_id"])  # ValueError -> 400
        timers_prefix = request.query.get("timers_prefix")
        store = MemoryStore(engine=self.state.engine)
        try:
            status = await read_run_status(store, run_id, timers_prefix=timers_prefix)
        except RendezvousNotFoundError as exc:
            raise ApiError(404, "run_not_found", str(exc), run_id=run_id) from None
        except RendezvousStateError as exc:
            raise ApiError(422, "rendezvous_state", str(exc), run_id=run_id) from None
        finally:
            await store.aclose()
        return json_response(status.to_json())

    async def snapshot(self, request: web.Request) -> web.Response:
        from ..._overview import read_overview

        run_id = self._run_param(request)
        store = MemoryStore(engine=self.state.engine)
        try:
            return json_response(await read_overview(store, run_id))
        finally:
            await store.aclose()

    async def events(self, request: web.Request) -> web.StreamResponse:
        run_id = self._run_param(request)
        state = self.state
        if state.closing:
            raise ApiError(503, "unavailable", "the server is shutting down")
        if state.watch_streams >= state.limits.max_watch_streams:
            raise ApiError(
                503,
                "too_many_watches",
                f"this server serves at most {state.limits.max_watch_streams} watch streams",
            )
        state.watch_streams += 1
        store = MemoryStore(engine=state.engine)
        try:
            response = web.StreamResponse(
                headers={
                    "Content-Type": "text/event-stream; charset=utf-8",
                    "Cache-Control": "no-store",
                    "X-Accel-Buffering": "no",
                }
            )
            await response.prepare(request)
            with contextlib.suppress(ConnectionError):  # the page went away
                await _EventStream(state, store, run_id, response).run()
                await response.write_eof()
            return response
        finally:
            state.watch_streams -= 1
            await store.aclose()


def _times_shown(overview: dict[str, Any]) -> bool:
    """Whether the page shows a time that runs down (a lease or a timer) for ``overview``."""
    run = overview["run"]
    if overview["queues"]:
        return True
    if run is None:
        return False
    return bool(run["timers"] or run["waiting"] or run["standby"]) or any(
        m["alive"] for m in run["members"]
    )


class _EventStream:
    """One page's stream: a snapshot now, then one after each change (at most one per
    :data:`MIN_GAP`, and one per :data:`TICK` without changes), until the server stops."""

    def __init__(
        self,
        state: ServerState,
        store: MemoryStore,
        run_id: str | None,
        response: web.StreamResponse,
    ) -> None:
        self.state = state
        self.engine: MemoryEngine = state.engine
        self.store = store
        self.run_id = run_id
        self.response = response
        self.loop = asyncio.get_running_loop()
        self.due = False

    async def run(self) -> None:
        from ..._overview import changes, read_overview

        engine = self.engine
        # owned by the server's state: its shutdown fails this watcher (StoreClosedError)
        watcher = engine.add_watcher("", None, self.state)
        tick: asyncio.TimerHandle | None = None

        def fire() -> None:
            self.due = True
            watcher.wake()

        previous: dict[str, Any] | None = None
        changed = True
        try:
            while True:
                if previous is not None and not changed and not _times_shown(previous):
                    # nothing on the page runs down: a ping says the stream is alive
                    await self.response.write(_sse("ping", {"revision": previous["revision"]}))
                else:
                    overview = await read_overview(self.store, self.run_id)
                    # no run asked for: the first one seen, kept (a new run sorted before it
                    # does not switch the page away)
                    self.run_id = overview["run_id"]
                    await self.response.write(
                        _sse("snapshot", {**overview, "events": changes(previous, overview)})
                    )
                    previous = overview
                sent = self.loop.time()
                self.due = False
                if tick is not None:
                    tick.cancel()
                tick = self.loop.call_at(sent + TICK, fire)
                try:
                    changed = await self._wait_for_change(watcher, sent)
                except StoreClosedError:
                    await self.response.write(_sse("closing", {"reason": "server stopping"}))
                    return
                except CompactedError:  # fell behind the history: re-read, watch from now
                    engine.remove_watcher(watcher)
                    watcher = engine.add_watcher("", None, self.state)
                    changed = True
        finally:
            if tick is not None:
                tick.cancel()
            engine.remove_watcher(watcher)

    async def _wait_for_change(self, watcher: Any, sent: float) -> bool:
        """Until a write (then True) or the tick (False), and ``sent + MIN_GAP``; every event up
        to then is read here (the next snapshot covers them all)."""
        engine = self.engine
        while not (changed := bool(engine.read_events(watcher))) and not self.due:
            await engine.wait(watcher)
        gap = sent + MIN_GAP - self.loop.time()
        if gap > 0:
            await asyncio.sleep(gap)  # coalesce a burst: one snapshot covers it
        return bool(engine.read_events(watcher)) or changed


def add_ui_routes(state: ServerState, route: Callable[[str, str, Handler, str], None]) -> None:
    """Register the page's routes with ``route(method, path, handler, op)`` (of ``make_app``)."""
    ui = UiRoutes(state)
    route("GET", "/", ui.index, "ui")
    for path in _ASSETS:
        route("GET", path, ui.asset, "ui")
    state.public_paths.update(["/", *_ASSETS])
    route("GET", "/v1/status/{run_id}", ui.status, "status")
    route("GET", "/v1/ui/snapshot", ui.snapshot, "ui_snapshot")
    route("GET", "/v1/ui/events", ui.events, "ui_events")
