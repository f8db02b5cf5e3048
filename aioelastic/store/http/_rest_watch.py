"""The REST watch stream (``GET /v1/watch/{prefix}``): NDJSON frames, one line per revision's
events, a progress frame when nothing was sent for the stream's interval."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from ...errors import CompactedError, StoreClosedError
from ..memory import _Watcher
from ._blob_cache import BlobCache
from ._encoding import NDJSON, events_lines, frame, kv_json
from ._errors import ApiError, bad
from ._parsing import int_param
from ._state import ServerState

__all__ = [
    "DEFAULT_PROGRESS_INTERVAL",
    "MAX_PROGRESS_INTERVAL",
    "MIN_PROGRESS_INTERVAL",
    "ProgressTimer",
    "WatchRoute",
]

#: Bounds of the watch progress interval a client may ask for (seconds).
MIN_PROGRESS_INTERVAL = 0.05
MAX_PROGRESS_INTERVAL = 300.0
DEFAULT_PROGRESS_INTERVAL = 5.0


class WatchRoute:
    """The watch streams of one server; their watchers are owned by the server's state, so
    that :meth:`ServerState.end_watch_streams` ends them all."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        # Encoded event frames of the current revision, shared by watchers at the same position.
        self._frames = BlobCache(events_lines)

    async def watch(self, request: web.Request) -> web.StreamResponse:
        state = self.state
        prefix, start, interval, snapshot = self._params(request)
        engine = state.engine
        # the range, then the watcher from the next revision: no await in between
        result = engine.range(prefix, None) if snapshot else None
        watcher = engine.add_watcher(prefix, start, state)  # CompactedError -> 410
        created: dict[str, Any] = {
            "type": "created",
            "start_revision": watcher.min_revision,
            "revision": engine.revision,
            "progress_interval": interval,
        }
        if result is not None:
            created["count"] = result.count
            created["kvs"] = [kv_json(kv) for kv in result.kvs]
        state.watch_streams += 1
        try:
            response = web.StreamResponse(
                headers={"Content-Type": NDJSON, "Cache-Control": "no-store"}
            )
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(frame(created))
            await self._stream(response, prefix, watcher, interval)
            await response.write_eof()
            return response
        except ConnectionError:  # the client went away: nothing more to say on this stream
            return response
        finally:
            state.watch_streams -= 1
            engine.remove_watcher(watcher)

    def _params(self, request: web.Request) -> tuple[str, int | None, float, bool]:
        """The prefix, start revision, progress interval and snapshot flag of a watch, once
        the server has room for it."""
        state = self.state
        prefix = state.check_key(request.match_info["prefix"], allow_empty=True)
        start: int | None = None
        if "start_revision" in request.query:
            start = int_param(request, "start_revision", minimum=1)
        interval = _progress_interval(request)
        if state.closing:
            raise ApiError(503, "unavailable", "the server is shutting down")
        limit = state.limits.max_watch_streams
        if state.watch_streams + state.session_watches() >= limit:
            raise ApiError(
                503, "too_many_watches", f"this server serves at most {limit} watch streams"
            )
        snapshot = request.query.get("snapshot", "0")
        if snapshot not in ("0", "1"):
            raise bad(f"snapshot must be 0 or 1, got {snapshot[:40]!r}")
        if snapshot == "1" and start is not None:
            raise bad("snapshot=1 reads the prefix now: it takes no start_revision")
        return prefix, start, interval, snapshot == "1"

    async def _stream(
        self, response: web.StreamResponse, prefix: str, watcher: _Watcher, interval: float
    ) -> None:
        """Write the watcher's events until the watch is compacted away or the server closes."""
        engine = self.state.engine
        # One timer per stream, re-armed only when it fires: a stream that is written to often
        # costs no timer work per event. It wakes the loop below when nothing has been sent for
        # ``interval`` seconds, and a progress frame goes out.
        progress = ProgressTimer(asyncio.get_running_loop(), interval, watcher.wake)
        try:
            while True:
                try:
                    events = engine.read_events(watcher)
                except CompactedError as exc:
                    await response.write(_compacted_frame(exc))
                    return
                except StoreClosedError:
                    await response.write(frame({"type": "closing"}))
                    return
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


def _progress_interval(request: web.Request) -> float:
    if "progress_interval" not in request.query:
        return DEFAULT_PROGRESS_INTERVAL
    raw = request.query["progress_interval"]
    try:
        interval = float(raw)
    except ValueError:
        raise bad(f"progress_interval must be a number of seconds, got {raw[:40]!r}") from None
    if not MIN_PROGRESS_INTERVAL <= interval <= MAX_PROGRESS_INTERVAL:
        raise bad(
            f"progress_interval must be in [{MIN_PROGRESS_INTERVAL}, "
            f"{MAX_PROGRESS_INTERVAL}] seconds, got {raw[:40]!r}"
        )
    return interval


def _compacted_frame(exc: CompactedError) -> bytes:
    return frame(
        {
            "type": "error",
            "error": "compacted",
            "message": str(exc),
            "requested_revision": exc.requested_revision,
            "compact_revision": exc.compact_revision,
        }
    )


class ProgressTimer:
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
