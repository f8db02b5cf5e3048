"""The watches of a session connection, served without a task each.

A :class:`ServedWatch` asks the engine to call it (synchronously, inside the write) when its
watcher has something to read; it then queues itself on its connection once. The connection's
writer pumps every queued watch in one go (read the events, append one frame each) and writes
what they produced, so one put seen by 1,000 watches of a connection costs one task wake-up and
a few messages, not 1,000 wake-ups. Watches at the same position share one encoded blob
(:meth:`SessionHub.blob`), and the frame around it is put together from bytes, not re-encoded.
On a connection of protocol version 2 or later the watches that read the same blob in one pump
share one frame too, ``[EVENTS_MANY, [id, ...], blob]`` (:class:`EventGroups`): the client then
decodes and dispatches one frame, not one per watch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgpack

from ...errors import CompactedError, StoreClosedError
from .._memory_watch_hub import _Watcher
from .._types import WatchEvent
from ._frames import EVENTS, EVENTS_MANY, PROGRESS, WATCH_END

if TYPE_CHECKING:
    from ._session_server import Connection, SessionHub

__all__ = ["GROUP_WATCHES", "EventGroups", "ServedWatch", "events_head"]

#: msgpack's fixarray of 3 and the positive fixint of EVENTS: the head of every events frame
_EVENTS_HEAD = bytes((0x93, EVENTS))
_EVENTS_MANY_HEAD = bytes((0x93, EVENTS_MANY))
#: Watches in one ``EVENTS_MANY`` frame at most: a pump of more writes what it has grouped so
#: far (the client starts on them while the server reads the rest).
GROUP_WATCHES = 128


def events_head(wid: int) -> bytes:
    """The bytes of ``[EVENTS, wid, blob]`` up to the blob: the frame is this, then the blob's
    msgpack (bin), written as two parts so that a blob shared by many sessions is never copied."""
    head: bytes = msgpack.packb(wid)
    return _EVENTS_HEAD + head


class EventGroups:
    """One pump's events of a version-2 connection, grouped by blob: the watches that read the
    same events are one ``[EVENTS_MANY, [id, ...], blob]`` frame. A progress frame of a watch
    whose events wait here is held until they are out (a watch's frames stay in order)."""

    __slots__ = ("_after", "_conn", "_groups", "_same", "pending")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._groups: dict[bytes, list[int]] = {}
        self._after: list[list[Any]] = []
        #: the last watch's read: (first event, last event, count, prefix, its group's ids)
        self._same: tuple[WatchEvent, WatchEvent, int, str, list[int]] | None = None
        #: watches grouped and not sent yet
        self.pending = 0

    def add(self, wid: int, blob: bytes) -> list[int]:
        """Group ``wid`` with the watches whose events are ``blob``; that group's ids."""
        wids = self._groups.get(blob)
        if wids is None:
            wids = self._groups[blob] = [wid]
        else:
            wids.append(wid)
        self.pending += 1
        return wids

    def add_read(
        self, wid: int, prefix: str, events: list[WatchEvent], hub: SessionHub, revision: int
    ) -> None:
        """Group ``wid``, which read ``events`` from ``prefix``: with the previous watch if it
        read the same (the same first and last event objects, as many, from the same prefix:
        the blob cache's own key, :class:`BlobCache`, without making it), else by its blob."""
        same = self._same
        if (
            same is not None
            and same[0] is events[0]
            and same[1] is events[-1]
            and same[2] == len(events)
            and same[3] == prefix
        ):
            same[4].append(wid)
            self.pending += 1
            return
        wids = self.add(wid, hub.blob(prefix, events, revision))
        self._same = (events[0], events[-1], len(events), prefix, wids)

    def after(self, frame: list[Any]) -> None:
        """Send ``frame`` once the grouped events are out."""
        self._after.append(frame)

    def flush(self) -> None:
        """Queue every group's frame on the connection, then the frames held back."""
        conn = self._conn
        for blob, wids in self._groups.items():
            head: bytes = msgpack.packb(wids)
            conn.send_parts(_EVENTS_MANY_HEAD + head, blob)
        self._groups.clear()
        self._same = None
        self.pending = 0
        for frame in self._after:
            conn.send(frame)
        self._after.clear()


class ServedWatch:
    """One watch of a connection: queued on it when the engine has something for it."""

    __slots__ = (
        "_read",
        "conn",
        "head",
        "idle",
        "prefix",
        "progress_due",
        "queued",
        "watcher",
        "wid",
    )

    def __init__(self, conn: Connection, wid: int, prefix: str, watcher: _Watcher) -> None:
        self.conn = conn
        self._read = conn.hub.engine.events_reader()  # (the engine's read_events, one call less)
        self.wid = wid
        self.head = events_head(wid)  # (its EVENTS frames' head: packed once, not per frame)
        self.prefix = prefix
        self.watcher: _Watcher | None = watcher
        self.idle = True
        self.progress_due = False
        self.queued = False
        watcher.on_wake = self.woken

    def woken(self) -> None:
        """The engine's call: something to read (or a failure, or a progress tick)."""
        if not self.queued and self.watcher is not None:
            self.queued = True
            self.conn.watch_ready(self)

    def pump(self, groups: EventGroups | None = None) -> None:
        """Send what the watcher has: its events (grouped in ``groups`` if given), its end, or a
        progress frame."""
        self.queued = False
        watcher = self.watcher
        if watcher is None:
            return
        conn = self.conn
        hub = conn.hub
        engine = hub.engine
        try:
            events = self._read(watcher)
        except CompactedError as exc:
            extra = {
                "requested_revision": exc.requested_revision,
                "compact_revision": exc.compact_revision,
            }
            self._end([WATCH_END, self.wid, "compacted", str(exc), extra])
            return
        except StoreClosedError as exc:
            self._end([WATCH_END, self.wid, "closing", str(exc), {}])
            return
        if events:
            if groups is None:
                blob = hub.blob(self.prefix, events, engine.revision)
                conn.send_parts(self.head, blob)
            else:
                groups.add_read(self.wid, self.prefix, events, hub, engine.revision)
            self.idle = False
        if self.progress_due:
            self.progress_due = False
            progress = [PROGRESS, self.wid, engine.revision]
            if groups is not None and events:
                groups.after(progress)  # behind its events
            else:
                conn.send(progress)

    def _end(self, frame: list[Any]) -> None:
        self.conn.send(frame)
        self.release()

    def release(self) -> None:
        """Unregister from the engine and the connection (idempotent)."""
        watcher = self.watcher
        if watcher is not None:
            self.watcher = None
            watcher.on_wake = None
            conn = self.conn
            conn.hub.engine.remove_watcher(watcher)
            conn.hub.watches -= 1
            conn.forget_watch(self)
