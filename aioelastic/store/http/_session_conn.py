"""One connection of a session, whatever carries it: its requests, answers and watches.

A :class:`Connection` is fed the messages its transport read (:meth:`Connection.received`),
answers every frame of them from the operation table (:mod:`._session_ops`) and hands what it has
to say to its :class:`Sender` as **one** message per batch: the answers of everything one read
brought, or (from the hub's :class:`~._session_flush.FlushQueue`: one callback for every
connection that woke together) the events of every watch that woke and the answers that waited
for durability. The transport (the upgraded connection,
:mod:`._session_raw`) only moves bytes: every line of session logic is here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import CompactedError, LeaseNotFoundError, StoreClosedError
from ._frames import (
    ERROR,
    EVENTS_MANY_VERSION,
    NOT_ONE,
    REQUEST,
    RESULT,
    WATCH_END,
    FrameError,
    pack,
    unpack_all,
    unpack_one,
)
from ._persist import LogWriteError
from ._session_conn_watches import ConnectionWatches
from ._session_ops import OPS, OpError
from ._session_watch import GROUP_WATCHES, EventGroups, ServedWatch

if TYPE_CHECKING:
    from ._session_server import SessionHub, SessionState

__all__ = ["WATCH_CHUNK_BYTES", "Connection", "Sender", "error_frame"]

log = logging.getLogger("aioelastic.serve")

#: Pumping many watches at once, write whenever this much is queued: the client starts on the
#: first frames while the server encodes the rest.
WATCH_CHUNK_BYTES = 16 * 1024

#: The HTTP status an error code is metered as (the ``code`` label of the request metrics).
_STATUS = {
    "bad_request": 400,
    "unknown_op": 404,
    "lease_not_found": 404,
    "compacted": 410,
    "key_too_large": 413,
    "value_too_large": 413,
    "too_many_watches": 503,
    "unavailable": 503,
    "insufficient_storage": 507,
    "storage_unavailable": 503,
}


class Sender(Protocol):
    """What a connection writes through: its transport, seen as messages."""

    def write(self, parts: list[bytes]) -> None:
        """Write one message whose body is ``parts`` (encoded frames) back to back."""

    def buffered(self) -> int:
        """Bytes written but not yet taken by the peer (the transport's write buffer); asked
        only while the transport has paused writing (:meth:`Connection.pause_writing`)."""

    def close(self, code: str, error: bytes, *, abort: bool = False) -> None:
        """Write ``error`` (the encoded connection-level error frame, ``code`` its code) as the
        last message and end the connection; ``abort``: drop what is unsent instead."""


class Connection(ConnectionWatches):
    """One connection of a session: its batches of answers, its watches, its end."""

    def __init__(
        self, hub: SessionHub, sender: Sender, state: SessionState, interval: float
    ) -> None:
        self.hub = hub
        self.sender = sender
        self.state = state
        self.progress_interval = interval
        #: the session protocol version of this connection (the hello's; see greet)
        self.version = 1
        state.connection = self
        self._loop = asyncio.get_running_loop()
        self._outbox: list[bytes] = []
        self._watches: dict[int, ServedWatch] = {}
        self._ready: list[ServedWatch] = []  # watches with something to send (see _pump)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._dispatching = False
        self._paused = False  # the transport's buffer is full: watches wait (resume_writing)
        self._flush_queued = False  # on the hub's flush queue (see flush)
        self._ticker: asyncio.TimerHandle | None = self._loop.call_later(interval, self._tick)

    # -- output

    def send(self, frame: list[Any]) -> None:
        self.send_bytes(pack(frame))

    def send_bytes(self, data: bytes) -> None:
        """Queue one encoded frame; it goes out with the rest of its batch."""
        if self._closing:
            return
        self._outbox.append(data)
        if not self._dispatching:  # received() writes its own batch
            self._schedule_flush()

    def send_parts(self, head: bytes, shared: bytes) -> None:
        """Queue one frame given as two parts: its own ``head`` and a ``shared`` tail (an event
        blob written to many sessions: it reaches the transport as it is, never copied)."""
        if self._closing:
            return
        self._outbox += (head, shared)
        if not self._dispatching and not self._flush_queued:  # (queued: a pump's own events)
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_queued and not self._closing:
            self._flush_queued = True
            self.hub.flushes.add(self)  # one callback for every connection woken with this one

    def _flush(self) -> None:
        """Pump the watches that woke and write what is queued (the hub's flush queue calls
        it; so does ``benchmarks/fanout.py``, of this checkout and of older ones)."""
        # (still queued meanwhile: frames the pump queues ride along, no second call)
        ready = self._ready
        if ready and not self._paused and not self._closing:
            if len(ready) == 1:  # (_pump's lone watch, inline: each event's way out)
                ready.pop().pump()
            else:
                self._pump()
        self._write_outbox()
        self._flush_queued = False

    def _write_outbox(self) -> None:
        if not self._outbox or self._closing:
            return
        batch, self._outbox = self._outbox, []
        self.sender.write(batch)
        # The buffer can only be over the limit once it has passed the transport's high-water
        # mark (far below it), which pauses writing: until then there is nothing to ask.
        if self._paused and self.sender.buffered() > self.hub.max_outbox_bytes:
            self._finish("too_slow", "the client does not read its answers", abort=True)

    def _pump(self) -> None:
        """Every watch that has something: its frames, written in chunks as they come (from
        version 2 on, the watches that read the same events share a frame: EventGroups; a lone
        watch's events are an ``EVENTS`` frame, which every version reads, with no grouping)."""
        ready = self._ready
        if len(ready) == 1:  # a lone watch (a node's control watch, as a rule): a frame of its own
            ready.pop().pump()  # (the list kept: no new one per event)
            return
        self._ready = []
        if self.version >= EVENTS_MANY_VERSION:
            self._pump_grouped(ready)
            return
        queued = 0
        for served in ready:
            before = len(self._outbox)
            served.pump()
            queued += sum(len(part) for part in self._outbox[before:])
            if queued >= WATCH_CHUNK_BYTES:
                self._write_outbox()
                queued = 0
                if self._closing:
                    return

    def _pump_grouped(self, ready: list[ServedWatch]) -> None:
        groups = EventGroups(self)
        outbox = self._outbox
        for served in ready:
            served.pump(groups)
            if groups.pending >= GROUP_WATCHES or len(outbox) >= GROUP_WATCHES:
                groups.flush()
                self._write_outbox()
                if self._closing:
                    return
                outbox = self._outbox
        groups.flush()

    def watch_ready(self, served: ServedWatch) -> None:
        """``served`` has something to send: pump it with the others (one wake-up for all)."""
        self._ready.append(served)
        # (_schedule_flush, inline: this is each event's way to each connection it wakes)
        if not self._dispatching and not self._flush_queued and not self._closing:
            self._flush_queued = True
            self.hub.flushes.add(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._ready:
            self._schedule_flush()

    # -- input

    def received(self, bodies: Iterable[bytes]) -> None:
        """Handle every frame of these messages (one read's), then write the answers at once."""
        if self._closing:
            return
        error = None
        self._dispatching = True
        try:
            max_len = self.hub.max_message_bytes
            for body in bodies:
                for frame in unpack_all(body, max_len=max_len):
                    self._dispatch(frame)
            if self._ready and not self._paused:
                self._pump()  # a watch created (or woken) by this batch: its events follow
        except FrameError as exc:
            error = str(exc)
        finally:
            self._dispatching = False
        if error is not None:
            self.bad_frame(error)  # after the answers of the frames before it
        else:
            self._write_outbox()

    def received_one(self, body: bytes | memoryview) -> None:
        """One message that is the whole of a read (a caller with one request in flight, the
        usual case): a message of one frame is decoded with one call and answered with one
        write; one of several frames takes :meth:`received`, as does every error."""
        if self._closing:
            return
        try:
            frame = unpack_one(body, self.hub.max_message_bytes)
        except NOT_ONE:
            frame = None
        if type(frame) is not list or len(frame) != 4:
            self.received([bytes(body)])  # several frames, or not valid: the general path
            return
        self._dispatching = True
        try:
            self._dispatch(frame)
            if self._ready and not self._paused:
                self._pump()
        except FrameError as exc:
            self._dispatching = False
            self.bad_frame(str(exc))
            return
        self._dispatching = False
        self._write_outbox()

    def _dispatch(self, frame: list[Any]) -> None:
        if len(frame) != 4 or frame[0] != REQUEST or not isinstance(frame[1], int):
            raise FrameError("a request frame is [0, id, op, args]")
        _, rid, name, args = frame
        op = OPS.get(name) if isinstance(name, str) else None
        if op is None:
            self.send([ERROR, rid, "unknown_op", f"no operation {str(name)[:100]!r}", {}])
            return
        if not isinstance(args, list):
            self.send([ERROR, rid, "bad_request", "the arguments must be an array", {}])
            return
        hub = self.hub
        start = time.perf_counter()
        try:
            value = op.handler(self, rid, args)
        except Exception as exc:
            answer = error_frame(rid, exc)
            self.send(answer)
            hub.observe(name, _STATUS.get(answer[2], 500), time.perf_counter() - start)
            return
        durable = hub.durable
        if op.write and durable is not None:
            self._spawn(self._answer_when_durable(rid, value, durable))
        else:
            self.send([RESULT, rid, value])
        hub.observe(name, 200, time.perf_counter() - start)

    async def _answer_when_durable(
        self, rid: int, value: Any, durable: Callable[[], Awaitable[None]]
    ) -> None:
        try:
            await durable()
        except OSError as exc:
            log.error("storage failure answering a session write: %s", exc)
            self.send([ERROR, rid, "storage_error", f"the data directory failed: {exc}", {}])
            return
        self.send([RESULT, rid, value])

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def bad_frame(self, message: str) -> None:
        """A message that is not valid frames: say so, then close (the stream is not trusted)."""
        self._finish("bad_frame", message[:300])

    def _finish(self, code: str, message: str, *, abort: bool = False) -> None:
        """Write what is queued, then the error frame ``code`` as the last message, and close;
        later frames are ignored."""
        if self._closing:
            return
        if not abort:
            self._write_outbox()
            if self._closing:  # too slow meanwhile
                return
        self._closing = True
        self._outbox = []
        self.sender.close(code, pack([ERROR, 0, code, message, {}]), abort=abort)

    # -- the end

    def replaced(self) -> None:
        """The session was resumed on another connection: end this one."""
        self._finish("replaced", "the session was resumed on another connection")

    def shutdown(self) -> None:
        for served in self._watches.values():
            self.send([WATCH_END, served.wid, "closing", "the server is shutting down", {}])
        self._finish("unavailable", "the server is shutting down")

    def end(self) -> None:
        """The transport is gone: let go of the watches, timers and tasks."""
        self._closing = True
        self._outbox = []
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        # (a connection still on the hub's flush queue writes nothing: it is closing)
        for served in list(self._watches.values()):
            served.release()
        self._watches.clear()
        self._ready.clear()
        for task in list(self._tasks):
            task.cancel()


def error_frame(rid: int, exc: Exception) -> list[Any]:
    """The answer to request ``rid`` whose operation raised ``exc``."""
    if isinstance(exc, OpError):
        return [ERROR, rid, exc.code, exc.message, exc.extra]
    if isinstance(exc, CompactedError):
        return [
            ERROR,
            rid,
            "compacted",
            str(exc),
            {
                "requested_revision": exc.requested_revision,
                "compact_revision": exc.compact_revision,
            },
        ]
    if isinstance(exc, LeaseNotFoundError):
        return [ERROR, rid, "lease_not_found", str(exc), {"lease": exc.lease_id}]
    if isinstance(exc, StoreClosedError):
        return [ERROR, rid, "unavailable", str(exc), {}]
    if isinstance(exc, LogWriteError):  # the log cannot take the write: it was not made
        code = "insufficient_storage" if exc.full else "storage_unavailable"
        return [ERROR, rid, code, f"{exc.strerror}; the write was not applied", {}]
    if isinstance(exc, (ValueError, TypeError)):  # the engine's argument errors
        return [ERROR, rid, "bad_request", str(exc)[:500], {}]
    log.exception("session operation failed", exc_info=exc)
    return [ERROR, rid, "internal", f"the server failed: {type(exc).__name__}", {}]
