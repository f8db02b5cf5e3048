"""The timer server engine: armed timers as ``loop.call_at`` deadlines, each reaped once.

A *timer* is a (worker, scope) pair with a deadline. A worker acquires it before a scope of work
and releases it after; if the deadline passes first, the :class:`TimerServer` *reaps* the worker
with its reaper (cancel a task, signal a process, call a callback) — exactly once, at the
deadline: every armed timer is a ``loop.call_at`` handle, never found by a periodic scan.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import events as _events
from ..errors import TimerError
from ._client import WorkerId
from ._service import BackgroundService
from ._table import Armed, TimerTable
from ._wire import ExpiredTimer, ReapEvent

if TYPE_CHECKING:
    from ..events import EventSink

__all__ = ["Reaper", "TimerServer", "TimerServerStatistics"]


log = logging.getLogger("aioelastic.timer")


@dataclass(frozen=True, slots=True)
class TimerServerStatistics:
    """A snapshot of a :class:`TimerServer`'s counters."""

    armed: int
    acquired: int
    released: int
    reaped: int
    reaper_failures: int
    rejected: int
    dropped: int


#: A reaper: called with each expired timer, exactly once; may return an awaitable.
Reaper = Callable[[ExpiredTimer], object]


# -- the server ----------------------------------------------------------------------------------


class TimerServer(BackgroundService):
    """Keeps the armed timers as ``loop.call_at`` deadlines and reaps each expired one once.

    An async resource: ``async with server:`` (or :meth:`start` / :meth:`aclose`). Its background
    work (accepting connections, watching the store, running async reapers) runs in an asyncio
    task the server owns, so it can be started and closed in different tasks. ``reaper`` is
    called with an :class:`ExpiredTimer` for every timer whose deadline passed before it was
    released; if it raises, the failure is logged and counted and the timer still counts as
    reaped. Every reap is logged (worker, scope, lateness) and recorded in :attr:`reaps` (the last
    ``history`` of them); :meth:`wait_reaped` waits for the next ones. The server never reaps its
    own process: that is up to the reaper, and :class:`~aioelastic.timer.SignalReaper` refuses.

    ``event_sink``: where a ``timer.reaped`` event goes for every reap (see
    :mod:`aioelastic.events`; default: ``AIOELASTIC_EVENTS``, else none); the attribute
    :attr:`event_sink` may be replaced.
    """

    def __init__(
        self, reaper: Reaper, *, history: int = 1000, event_sink: EventSink | None = None
    ) -> None:
        if not callable(reaper):
            raise TypeError(f"reaper must be callable, got {type(reaper).__name__}")
        if isinstance(history, bool) or not isinstance(history, int) or history < 0:
            raise ValueError(f"history must be an int >= 0, got {history!r}")
        super().__init__()
        self.reaper = reaper
        self.reaps: deque[ReapEvent] = deque(maxlen=history)
        self._timers = TimerTable()
        # deadlines run in the server's context, not the acquiring worker's (and sharing one
        # context saves a copy per armed timer)
        self._context = contextvars.copy_context()
        self._reap_waiters: list[asyncio.Future[None]] = []
        self._acquired = self._released = self._reaped = 0
        self._reaper_failures = self._rejected = self._dropped = 0
        #: where structured events go (see :mod:`aioelastic.events`)
        self.event_sink: EventSink = _events.resolve_sink(event_sink)

    # -- closing (the lifecycle is :class:`~._service.BackgroundService`'s)

    def _closing(self) -> None:
        self._timers.clear()  # none is reaped after this

    def _stopped(self) -> None:
        self._wake_reap_waiters()

    # -- what users read

    @property
    def armed(self) -> int:
        """How many timers are armed now."""
        return len(self._timers)

    def deadline_of(self, worker_id: WorkerId, scope_id: str) -> float | None:
        """The loop deadline of an armed timer, or ``None`` if it is not armed."""
        armed = self._timers.get(worker_id, scope_id)
        return None if armed is None else armed.deadline

    def statistics(self) -> TimerServerStatistics:
        return TimerServerStatistics(
            len(self._timers),
            self._acquired,
            self._released,
            self._reaped,
            self._reaper_failures,
            self._rejected,
            self._dropped,
        )

    async def wait_reaped(self, count: int = 1) -> list[ReapEvent]:
        """Wait until at least ``count`` reaps have happened in total; return the recorded ones."""
        while self._reaped < count:
            if self._closed:
                raise TimerError(
                    f"{type(self).__name__} closed after {self._reaped} of {count} reaps"
                )
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            self._reap_waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._reap_waiters:
                    self._reap_waiters.remove(waiter)
        return list(self.reaps)

    # -- the table (used by transports)

    def _arm(
        self,
        worker_id: WorkerId,
        scope_id: str,
        deadline: float,
        *,
        expiration_time: float | None = None,
        pid: int | None = None,
        signal: int | None = None,
        token: object = None,
    ) -> None:
        """Arm (or re-arm) the timer of (worker, scope) to fire at loop time ``deadline``."""
        loop = self._require_running()
        armed = Armed(worker_id, scope_id, deadline, expiration_time, pid, signal, token)
        armed.handle = loop.call_at(deadline, self._fire, armed, context=self._context)
        self._timers.put(armed)
        self._acquired += 1

    def _disarm(self, worker_id: WorkerId, scope_id: str, token: object = None) -> bool:
        """Disarm (worker, scope); with ``token``, only if it is still the same arming."""
        armed = self._timers.get(worker_id, scope_id)
        if armed is None or (token is not None and armed.token != token):
            return False
        self._timers.remove(armed)
        self._released += 1
        return True

    def _drop_worker(self, worker_id: WorkerId, reason: str) -> int:
        """Disarm every timer of a worker that is gone; return how many."""
        timers = self._timers.of_worker(worker_id)
        if not timers:
            return 0
        for armed in timers:
            self._timers.remove(armed)
        count = len(timers)
        self._dropped += count
        log.info("dropped %d timer(s) of worker %s: %s", count, worker_id, reason)
        return count

    def _reject(self, what: str, why: object) -> None:
        """Log and count a rejected request; the server keeps running."""
        self._rejected += 1
        log.warning("rejected timer request %s: %s", what, why)

    def _fire(self, armed: Armed) -> None:
        armed.handle = None
        if not self._timers.is_current(armed):
            return  # re-armed or released in the same loop iteration
        self._expire(armed)

    def _expire(self, armed: Armed) -> None:
        """The deadline of ``armed`` passed: reap it (a transport may claim it first)."""
        self._timers.remove(armed)
        self._reap(armed)

    def _reap(self, armed: Armed) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        timer = ExpiredTimer(
            armed.worker_id,
            armed.scope_id,
            armed.deadline,
            armed.expiration_time,
            armed.pid,
            armed.signal,
        )
        lateness = now - armed.deadline
        self._reaped += 1
        log.warning(
            "reaping worker %s: timer of scope %r expired %.1f ms ago",
            armed.worker_id,
            armed.scope_id,
            lateness * 1000,
        )
        error: str | None = None
        try:
            result = self.reaper(timer)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self._reaper_failures += 1
            log.exception(
                "reaper %r failed for worker %s scope %r",
                self.reaper,
                armed.worker_id,
                armed.scope_id,
            )
        else:
            if inspect.isawaitable(result):
                self._spawn(self._await_reaper(timer, result), "reaper")
        self.reaps.append(ReapEvent(timer, now, lateness, error))
        worker = armed.worker_id
        _events.emit(
            self.event_sink,
            "timer.reaped",
            server=type(self).__name__,
            worker=worker if isinstance(worker, (str, int)) else repr(worker),
            scope=armed.scope_id,
            pid=armed.pid,
            expiration_time=armed.expiration_time,
            lateness=round(lateness, 6),
            error=error,
        )
        self._wake_reap_waiters()

    def _wake_reap_waiters(self) -> None:
        waiters, self._reap_waiters = self._reap_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _await_reaper(self, timer: ExpiredTimer, result: Awaitable[object]) -> None:
        try:
            await result
        except Exception:
            self._reaper_failures += 1
            log.exception(
                "reaper %r failed for worker %s scope %r",
                self.reaper,
                timer.worker_id,
                timer.scope_id,
            )

    def _deadline_from_wall(self, expiration_time: float, wall: Callable[[], float]) -> float:
        """Convert a wall-clock expiration into a deadline on this server's loop."""
        loop = self._require_running()
        return loop.time() + (expiration_time - wall())
