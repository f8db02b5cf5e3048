"""One connection of a session, as an :class:`asyncio.Protocol` (no reader task, no await per
message): the upgrade's answer, then messages cut from the stream and their frames handed to the
session synchronously (:meth:`Connection.attach`), requests made in one loop turn written as one
message, requests' deadlines kept by one timer, and the silence watchdog.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any, cast

from ._frames import FrameError, pack, unpack_all
from ._session_stream import MessageReader, message_header
from ._upgrade_answer import Answer, AnswerReader, HeadError

__all__ = ["Connection", "ConnectionLost"]

#: the largest message accepted from the server (its frames are bounded by their own limits)
MAX_MESSAGE = 1 << 31
#: pending[rid] = (future, write, deadline): the deadline in loop time (inf: none)
Pending = tuple["asyncio.Future[Any]", bool, float]


class ConnectionLost(Exception):
    """The connection ended with the request pending (it had been sent)."""


class Connection(asyncio.Protocol):
    """A session's connection, from the TCP connect to its end (see the module's docstring).

    Until :meth:`attach`, the dialer reads it with :meth:`answer` and :meth:`next_message`;
    afterwards every frame goes to ``on_frame(conn, frame)`` and the end to ``on_lost(conn)``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, Pending] = {}
        self.watches: dict[int, Any] = {}  # id -> SessionWatch
        self.max_message = 4 << 20  # the server's bound, from its welcome
        self.lost = False
        self.reason = ""
        #: messages received since the 101 (for tests and statistics)
        self.messages_received = 0
        self.last_received = loop.time()
        #: the last watchdog check that found no watches (silence is measured from then on)
        self.unwatched_at = self.last_received
        self.watchdog: asyncio.TimerHandle | None = None
        self.closed: asyncio.Future[None] = loop.create_future()
        self._answer: AnswerReader | None = AnswerReader()
        self._messages: MessageReader | None = None
        self._early: list[bytes] = []  # messages before attach()
        self._waiter: asyncio.Future[Any] | None = None  # the dialer's
        self._on_frame: Callable[[Connection, list[Any]], None] | None = None
        self._on_lost: Callable[[Connection], None] | None = None
        self._outbox: list[bytes] = []
        self._flush_due = False
        self.paused = False
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf

    # -- the dialer's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, but have its methods)
        self.transport = cast("asyncio.Transport", transport)

    async def answer(self) -> Answer:
        """The server's answer to the upgrade request (written by the dialer)."""
        answer: Answer = await self._wait()
        return answer

    async def next_message(self) -> bytes:
        """The next message (the hello's answer), before :meth:`attach`."""
        if self._early:
            return self._early.pop(0)
        message: bytes = await self._wait()
        return message

    async def _wait(self) -> Any:
        if self.lost:
            raise ConnectionResetError(self.reason or "the server closed the connection")
        self._waiter = waiter = self.loop.create_future()
        try:
            return await waiter
        finally:
            self._waiter = None

    def _resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if error is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(value)

    def attach(
        self,
        on_frame: Callable[[Connection, list[Any]], None],
        on_lost: Callable[[Connection], None],
        max_message: int,
    ) -> None:
        """From now on the session handles this connection's frames and its end."""
        self._on_frame, self._on_lost = on_frame, on_lost
        self.max_message = max_message
        early, self._early = self._early, []
        for message in early:
            if not self._message(message):
                break
        if self.lost:
            on_lost(self)

    # -- incoming

    def data_received(self, data: bytes) -> None:
        self.last_received = self.loop.time()
        messages = self._messages
        try:
            if messages is None:
                if self._answer is None:
                    return  # after a refusal, being closed
                data = self._read_answer(data)
                messages = self._messages
                if messages is None or not data:
                    return
            cut = messages.feed(data)
        except (HeadError, FrameError) as exc:
            self.abort(f"a malformed answer from the server: {exc}")
            return
        self.messages_received += len(cut)
        if self._on_frame is None:
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

    def _message(self, message: bytes) -> bool:
        """Hand ``message``'s frames to the session; False once the connection is ending."""
        on_frame = self._on_frame
        assert on_frame is not None
        try:
            for frame in unpack_all(message, max_len=MAX_MESSAGE):
                on_frame(self, frame)
        except (FrameError, ValueError, TypeError, LookupError) as exc:
            self.abort(f"a malformed frame from the server: {exc}")
        return not self.reason

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
        for handle in (self._sweep, self.watchdog):
            if handle is not None:
                handle.cancel()
        self._outbox.clear()
        if self._answer is not None and self._waiter is not None:
            try:  # a refusal whose body ends with the connection
                self._resolve(self._answer.eof())
            except HeadError as error:
                self._resolve(error=ConnectionResetError(f"{error}"))
        else:
            self._resolve(error=ConnectionResetError(self.reason or "the server closed it"))
        if self._on_lost is not None:
            self._on_lost(self)

    # -- outgoing

    def send(self, frame: list[Any]) -> None:
        """Send ``frame``: at once when it is the one request pending (a sequential caller's:
        no loop turn spent waiting for the flush), else queued, and every frame queued in one
        loop turn goes as one message, in one write."""
        data = pack(frame)
        if len(self.pending) <= 1 and not self._outbox and not self.paused:
            transport = self.transport
            if transport is not None and not self.lost:
                transport.write(message_header(len(data)) + data)
            return
        self._outbox.append(data)
        if not self._flush_due:
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

    # -- requests' deadlines and the watchdog

    def request(self, rid: int, future: asyncio.Future[Any], write: bool, timeout: float) -> None:
        """Track a request sent (or about to be): its answer's ``future`` fails with
        :class:`TimeoutError` ``timeout`` seconds from now. One timer for every request of the
        connection, at the earliest deadline (not a timer made and cancelled per request); the
        sweep when it fires is over the requests pending then, once per timeout at most."""
        deadline = self.loop.time() + timeout if timeout < 1e9 else math.inf
        self.pending[rid] = (future, write, deadline)
        if deadline < self._sweep_at:
            self._arm(deadline)

    def _arm(self, at: float) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep_at = at
        self._sweep = self.loop.call_at(at, self._expire)

    def _expire(self) -> None:
        self._sweep, self._sweep_at = None, math.inf
        now = self.loop.time()
        expired: list[int] = []
        next_at = math.inf
        for rid, (future, _, deadline) in self.pending.items():
            if future.done() or deadline <= now:
                expired.append(rid)  # (done: its caller was cancelled, nobody waits for it)
            elif deadline < next_at:
                next_at = deadline
        for rid in expired:
            future = self.pending.pop(rid)[0]
            if not future.done():
                future.set_exception(TimeoutError())
        if expired and self.paused:
            # the server has not read for a whole request timeout: it is stuck, or too slow
            self.abort("the server stopped reading (a request's deadline passed unsent)")
        elif next_at < math.inf:
            self._arm(next_at)

    def check_silence(self, silence: float) -> None:
        """The watchdog: a connection with watches hears from the server at least every
        progress interval, so ``silence`` (3 intervals) without a message while it has watches
        ends it. One timer per connection, not a receive timeout per message."""
        if self.lost:
            return
        now = self.loop.time()
        if not self.watches:
            self.unwatched_at = now  # silence counts only while there are watches
        elif now - max(self.last_received, self.unwatched_at) >= silence:
            self.abort(f"nothing received for {silence:g}s (3 progress intervals)")
            return
        since = max(self.last_received, self.unwatched_at)
        self.watchdog = self.loop.call_later(
            max(since + silence - now, 0.01), self.check_silence, silence
        )

    def abort(self, reason: str) -> None:
        """End the connection now (``reason``: what the pending requests' errors say)."""
        if not self.reason:
            self.reason = reason
        if self.transport is not None and not self.lost:
            self.transport.abort()

    def close(self) -> None:
        """End the connection after what was written (a FIN: the session ends or detaches)."""
        if self.transport is not None and not self.lost:
            self._flush()
            self.transport.close()
