"""A session connection's watches: opened and closed by its requests, a progress frame for each
that stayed idle a whole interval. A base of :class:`~._session_conn.Connection` (its own room:
the connection's output and input are the rest of it)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

from ._frames import kv_to_wire
from ._session_ops import OpError, bad
from ._session_watch import ServedWatch

if TYPE_CHECKING:
    from ._session_conn import Connection
    from ._session_server import SessionHub

__all__ = ["ConnectionWatches"]


class ConnectionWatches:
    """The watches of one connection, by id (``Connection`` sets the fields in its
    ``__init__``)."""

    hub: SessionHub
    progress_interval: float
    _loop: asyncio.AbstractEventLoop
    _watches: dict[int, ServedWatch]
    _closing: bool
    _ticker: asyncio.TimerHandle | None

    def open_watch(self, wid: int, prefix: str, start: int | None, snapshot: bool) -> Any:
        hub = self.hub
        if hub.watches + hub.other_watches() >= hub.max_watches:
            raise OpError(
                "too_many_watches", f"this server serves at most {hub.max_watches} watches"
            )
        if wid in self._watches:
            raise bad(f"watch id {wid} is already in use")
        engine = hub.engine
        result = engine.range(prefix, None) if snapshot else None
        watcher = engine.add_watcher(prefix, start, self)  # CompactedError -> an error answer
        served = ServedWatch(cast("Connection", self), wid, prefix, watcher)
        self._watches[wid] = served
        hub.watches += 1
        served.woken()  # a start in the past has events to send (after this answer)
        created: list[Any] = [watcher.min_revision, engine.revision, None]
        if result is not None:
            created[2] = [result.count, [kv_to_wire(kv) for kv in result.kvs]]
        return created

    def close_watch(self, wid: int) -> None:
        served = self._watches.pop(wid, None)
        if served is not None:
            served.release()

    def forget_watch(self, served: ServedWatch) -> None:
        if self._watches.get(served.wid) is served:
            del self._watches[served.wid]

    def _tick(self) -> None:
        """Every progress interval: a progress frame for each watch idle since the last tick."""
        if self._closing:
            return
        for served in self._watches.values():
            if served.idle:
                served.progress_due = True
                served.woken()
            served.idle = True
        self._ticker = self._loop.call_later(self.progress_interval, self._tick)
