"""One connection of a session, as an :class:`asyncio.Protocol` (no reader task, no await per
message): the upgrade's answer, then messages cut from the stream and their frames handed to the
requests and watches synchronously (answers to the requests' futures in
:mod:`._client_requests`, which keeps their deadlines), requests made in one loop turn written as
one message. Its silence watchdog is :mod:`._client_watchdog`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from msgpack import ExtraData

from .._types import WatchEvent
from ._client_dialer_wait import DialerWait
from ._client_requests import Requests
from ._frames import (
    ERROR,
    EVENTS,
    EVENTS_MANY,
    NOT_ONE,
    PROGRESS,
    REQUEST,
    RESULT,
    WATCH_END,
    FrameError,
    decode_events,
    pack_bound,
    unpack_all,
    unpack_one,
    unpack_rest,
)
from ._session_errors import Refused
from ._session_stream import MessageLengthError, MessageReader, message_header
from ._upgrade_answer import AnswerReader, HeadError

if TYPE_CHECKING:
    from ._client_watchdog import Watchdog

__all__ = ["Connection", "ConnectionLost", "DecodedOnce", "to_watches"]

#: the largest message accepted from the server (its frames are bounded by their own limits)
MAX_MESSAGE = 1 << 31


class ConnectionLost(Exception):
    """The connection ended with the request pending (it had been sent)."""


class Connection(DialerWait, asyncio.Protocol):
    """A session's connection, from the TCP connect to its end (see the module's docstring).

    Until :meth:`attach`, the dialer reads it with :meth:`answer` and :meth:`next_message`;
    afterwards every frame goes to ``on_frame(conn, frame)`` and the end to ``on_lost(conn)``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.pending = Requests(loop, self._expired)
        self.watches: dict[int, Any] = {}  # id -> SessionWatch
        self.max_message = 4 << 20  # the server's bound, from its welcome
        self.lost = False
        self.ending = False  # aborted or closed by us: what still arrives is not handled
        self.reason = ""
        #: messages received since the 101 (for tests and statistics)
        self.messages_received = 0
        self.last_received = loop.time()
        #: the last watchdog check that found no watches (silence is measured from then on)
        self.unwatched_at = self.last_received
        self.watchdog: Watchdog | None = None  # (the session's, once attached)
        self.closed: asyncio.Future[None] = loop.create_future()
        self._answer: AnswerReader | None = AnswerReader()
        self._messages: MessageReader | None = None
        self._early: list[bytes] = []  # messages before attach()
        self._waiter: asyncio.Future[Any] | None = None  # the dialer's
        self._attached = False
        self._on_lost: Callable[[Connection], None] | None = None
        self._outbox: list[bytes] = []
        self._flush_due = False
        self.paused = False
        self.decoded = DecodedOnce()

    # -- the dialer's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, but have its methods)
        self.transport = cast("asyncio.Transport", transport)

    def attach(self, on_lost: Callable[[Connection], None], max_message: int) -> None:
        """From now on the frames go to the requests and watches, and the end to ``on_lost``."""
        self._attached, self._on_lost = True, on_lost
        self.max_message = max_message
        early, self._early = self._early, []
        for message in early:
            if not self._message(message):
                break
        if self.lost or self.ending:
            self._tell_lost()

    # -- incoming

    def data_received(self, data: bytes) -> None:
        if self.ending:
            return
        self.last_received = self.loop.time()
        messages = self._messages
        if messages is not None and self._attached:
            body = messages.whole(data)
            if body is not None:  # one read, one message: handled without cutting a list
                self.messages_received += 1
                self._message(body)
                return
        try:
            if messages is None:
                if self._answer is None:
                    return  # after a refusal, being closed
                data = self._read_answer(data)
                messages = self._messages
                if messages is None or not data:
                    return
            cut = messages.feed(data)
        except MessageLengthError as exc:
            self._received(exc.messages)  # the whole messages before it are answers all the same
            self.abort(f"a malformed answer from the server: {exc}")
            return
        except (HeadError, FrameError) as exc:
            self.abort(f"a malformed answer from the server: {exc}")
            return
        self._received(cut)

    def _received(self, cut: list[bytes]) -> None:
        self.messages_received += len(cut)
        if not self._attached:
            self._early += cut
            waiter = self._waiter
            if self._early and waiter is not None and not waiter.done():
                waiter.set_result(self._early.pop(0))
            return
        for message in cut:
            if not self._message(message):
                return

    def _read_answer(self, data: bytes) -> bytes:
        assert self._answer is not None
        answer = self._answer.feed(data)
        if answer is None:
            return b""
        rest = self._answer.rest
        self._answer = None
        if answer.upgraded:
            self._messages = MessageReader(MAX_MESSAGE)
        else:
            rest = b""
        self._resolve(answer)
        return rest

    def _message(self, message: bytes | memoryview) -> bool:
        """Hand ``message``'s frames to the session; False once the connection is ending."""
        answered = 0
        try:
            # the first frame with one call, inline (most messages are one answer, or an answer
            # and a watch's events); the others, and every error, as unpack_all has them
            try:
                frame, rest = unpack_one(message, MAX_MESSAGE), b""
            except ExtraData as extra:
                frame, rest = extra.unpacked, extra.extra
            except NOT_ONE:
                frame, rest = None, b""
            if type(frame) is not list or not frame:  # not valid: unpack_all raises, saying why
                frame = next(unpack_all(message, max_len=MAX_MESSAGE))
            if frame[0] == RESULT:  # (the common frame, inline)
                entry = self.pending.pop(frame[1], None)
                if entry is not None and not entry[0].done():
                    entry[0].set_result(frame[2])
                    answered += 1
            else:
                self._dispatch(frame)
            if rest:
                for frame in unpack_rest(rest, MAX_MESSAGE):
                    if frame[0] == RESULT:
                        entry = self.pending.pop(frame[1], None)
                        if entry is not None and not entry[0].done():
                            entry[0].set_result(frame[2])
                            answered += 1
                        continue
                    self._dispatch(frame)
        except (FrameError, ValueError, TypeError, LookupError) as exc:
            self.abort(f"a malformed frame from the server: {exc}")
        if answered > 1 and not self._flush_due:
            self._flush_soon()  # after the wake-ups of the callers answered: see request()
        return not self.ending

    def _dispatch(self, frame: list[Any]) -> None:
        if frame[0] != ERROR:  # (a RESULT is handled in _message)
            to_watches(self, frame)
            return
        entry = self.pending.pop(frame[1], None)
        if entry is None:
            if frame[1] == 0:  # the connection's end, and why
                self.reason = f"the server said: {frame[3]} ({frame[2]})"
        elif not entry[0].done():
            entry[0].set_exception(Refused(frame[2], frame[3], frame[4]))

    def eof_received(self) -> bool | None:
        return None  # the server is done: close our end too

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost:
            return
        self.lost = True
        if not self.reason and exc is not None:
            self.reason = f"{type(exc).__name__}: {exc}"
        if not self.closed.done():
            self.closed.set_result(None)
        self.pending.cancel()
        if self.watchdog is not None:
            self.watchdog.cancel()
        self._outbox.clear()
        if self._answer is not None and self._waiter is not None:
            try:  # a refusal whose body ends with the connection
                self._resolve(self._answer.eof())
            except HeadError as error:
                self._resolve(error=ConnectionResetError(f"{error}"))
        else:
            self._resolve(error=ConnectionResetError(self.reason or "the server closed it"))
        self._tell_lost()

    def _tell_lost(self) -> None:
        on_lost, self._on_lost = self._on_lost, None  # (once)
        if on_lost is not None:
            on_lost(self)

    # -- outgoing

    def request(self, rid: int, op: str, args: list[Any], timeout: float) -> asyncio.Future[Any]:
        """Send ``[REQUEST, rid, op, args]``; its answer's future (failing in ``timeout`` s,
        :meth:`Requests.track`). Written at once if it is the one request pending (a sequential
        caller's), else queued: what one loop turn queues goes as one message, in one write;
        so does what the callers answered by one message send as they wake."""
        future = self.loop.create_future()
        pending = self.pending
        pending.track(rid, future, timeout)
        data = pack_bound([REQUEST, rid, op, args])
        if len(pending) <= 1 and not (self._flush_due or self._outbox or self.paused):
            transport = self.transport
            if transport is not None and not self.lost:
                transport.write(len(data).to_bytes(4, "big") + data)
        else:
            self._queue(data)
        return future

    def batch_this_turn(self) -> None:
        """What is requested until the end of this loop turn goes as one message, the first
        request too (it is written at once otherwise)."""
        if not self._flush_due:
            self._flush_soon()

    def _queue(self, data: bytes) -> None:
        self._outbox.append(data)
        if not self._flush_due:
            self._flush_soon()

    def _flush_soon(self) -> None:
        self._flush_due = True
        self.loop.call_soon(self._flush)

    def send_now(self, data: bytes) -> None:
        """Write one message at once (the dialer's upgrade request and hello)."""
        assert self.transport is not None
        self.transport.write(data)

    def _flush(self) -> None:
        self._flush_due = False
        outbox = self._outbox
        transport = self.transport
        if not outbox or self.paused or self.lost or transport is None:
            return  # (resume_writing flushes what waits)
        limit = self.max_message
        if len(outbox) == 1 and len(outbox[0]) <= limit:
            data = outbox[0]
            outbox.clear()
            transport.write(message_header(len(data)) + data)
            return
        start = 0
        while start < len(outbox) and not self.paused:
            # a batch larger than the server's message bound goes as several messages
            end, size = start, 0
            while end < len(outbox) and (end == start or size + len(outbox[end]) <= limit):
                size += len(outbox[end])
                end += 1
            transport.write(b"".join([message_header(size), *outbox[start:end]]))
            start = end
        del outbox[:start]

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._flush()

    # -- requests' deadlines

    def _expired(self) -> None:
        if self.paused:
            # the server has not read for a whole request timeout: it is stuck, or too slow
            self.abort("the server stopped reading (a request's deadline passed unsent)")

    def abort(self, reason: str) -> None:
        """End the connection now (``reason``: what the pending requests' errors say)."""
        if not self.reason:
            self.reason = reason
        self.ending = True
        if self.transport is not None and not self.lost:
            self.transport.abort()
        # the session stops using it now, not when the transport says so (a loop turn later:
        # a caller woken by the last answer would send its next request into a dead connection)
        self._tell_lost()

    def close(self) -> None:
        """End the connection after what was written (a FIN: the session ends or detaches)."""
        self.ending = True
        if self.transport is not None and not self.lost:
            self._flush()
            self.transport.close()


class DecodedOnce:
    """A blob's events, decoded once for the frames in a row that carry it (watches at one
    position share them: events are immutable)."""

    __slots__ = ("blob", "events")

    def __init__(self) -> None:
        self.blob = b""
        self.events: list[WatchEvent] = []

    def __call__(self, blob: bytes) -> list[WatchEvent]:
        if blob != self.blob:
            self.events = decode_events(blob)
            self.blob = blob
        return self.events


def to_watches(conn: Connection, frame: list[Any]) -> None:
    """A watch's frame (events, progress, its end) to its watch; events many watches share to
    each of them (decoded once). A frame for a watch no longer open is dropped."""
    kind, wid = frame[0], frame[1]
    if kind == EVENTS_MANY:  # the same events for each of these watches
        events = conn.decoded(frame[2])
        now = conn.last_received
        watches = conn.watches
        for one in wid:
            watch = watches.get(one)
            if watch is not None:
                watch.on_events(events, now)
        return
    watch = conn.watches.get(wid)
    if watch is None:
        return
    if kind == EVENTS:
        watch.on_events(conn.decoded(frame[2]), conn.last_received)
    elif kind == PROGRESS:
        watch.on_progress(frame[2])
    elif kind == WATCH_END:
        del conn.watches[wid]
        watch.on_end(frame[2], frame[3], frame[4])
