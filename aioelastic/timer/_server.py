"""The timer server engine: armed timers as ``loop.call_at`` deadlines, each reaped once.

A *timer* is a (worker, scope) pair with a deadline. A worker acquires it before a scope of work
and releases it after; if the deadline passes first, the :class:`TimerServer` *reaps* the worker
with its reaper (cancel a task, signal a process, call a callback) — exactly once, at the
deadline: every armed timer is a ``loop.call_at`` handle, never found by a periodic scan.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from anyio.abc import AsyncResource

from .. import events as _events
from ..errors import TimerError
from ._client import WorkerId
from ._wire import (
    ExpiredTimer,
    ReapEvent,
)

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


class _Armed:
    """One armed timer: its loop deadline, its ``call_at`` handle and what the reaper needs."""

    __slots__ = (
        "deadline",
        "expiration_time",
        "handle",
        "pid",
        "scope_id",
        "signal",
        "token",
        "worker_id",
    )

    def __init__(
        self,
        worker_id: WorkerId,
        scope_id: str,
        deadline: float,
        expiration_time: float | None,
        pid: int | None,
        signal: int | None,
        token: object,
    ) -> None:
        self.worker_id = worker_id
        self.scope_id = scope_id
        self.deadline = deadline
        self.expiration_time = expiration_time
        self.pid = pid
        self.signal = signal
        self.token = token
        self.handle: asyncio.TimerHandle | None = None


class TimerServer(AsyncResource):
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
        self.reaper = reaper
        self.reaps: deque[ReapEvent] = deque(maxlen=history)
        self._timers: dict[tuple[WorkerId, str], _Armed] = {}
        self._by_worker: dict[WorkerId, set[str]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._children: set[asyncio.Task[None]] = set()
        # deadlines run in the server's context, not the acquiring worker's (and sharing one
        # context saves a copy per armed timer)
        self._context = contextvars.copy_context()
        self._reap_waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self._acquired = self._released = self._reaped = 0
        self._reaper_failures = self._rejected = self._dropped = 0
        #: where structured events go (see :mod:`aioelastic.events`)
        self.event_sink: EventSink = _events.resolve_sink(event_sink)

    # -- lifecycle

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`aclose`."""
        return self._task is not None and not self._task.done() and not self._closed

    async def start(self) -> None:
        """Start the background task; return once the server accepts requests."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        if self._task is not None:
            raise RuntimeError(f"{type(self).__name__} has already been started")
        loop = self._loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        task = self._task = loop.create_task(self._main(), name=f"aioelastic-{type(self).__name__}")
        try:
            await asyncio.wait([self._ready, task], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await self.aclose()
            raise
        if not self._ready.done():
            self._closed = True
            task.result()  # raises what made it fail
            raise TimerError(f"{type(self).__name__} stopped while starting")
        task.add_done_callback(self._main_done)

    def _main_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "%s stopped: %s; armed timers still fire, but no new requests arrive",
                type(self).__name__,
                task.exception(),
                exc_info=task.exception(),
            )

    async def aclose(self) -> None:
        """Stop the server: disarm every timer (none is reaped after this), stop the task."""
        if self._closed:
            return
        self._closed = True
        for armed in self._timers.values():
            if armed.handle is not None:
                armed.handle.cancel()
        self._timers.clear()
        self._by_worker.clear()
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        children = list(self._children)  # spawned after the task ended, if it failed
        for child in children:
            child.cancel()
        if children:
            await asyncio.wait(children)
        self._wake_reap_waiters()
        await self._aclose()

    async def _main(self) -> None:
        try:
            await self._run(self._set_ready)
        finally:
            children = list(self._children)
            for child in children:
                child.cancel()
            if children:
                await asyncio.wait(children)

    def _set_ready(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        """Run ``coro`` in a task owned by the server (cancelled when it stops)."""
        loop = self._loop
        assert loop is not None
        task = loop.create_task(coro, name=f"aioelastic-timer-{what}")
        self._children.add(task)
        task.add_done_callback(self._child_done)

    def _child_done(self, task: asyncio.Task[None]) -> None:
        self._children.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("timer server task %s failed", task.get_name(), exc_info=task.exception())

    @abc.abstractmethod
    async def _run(self, ready: Callable[[], None]) -> None:
        """The transport's background work; call ``ready()`` once requests are accepted.

        Runs in the server's task until cancelled by :meth:`aclose`; the tasks of async
        reapers (see :meth:`_spawn`) are cancelled when it ends.
        """

    async def _aclose(self) -> None:
        """Release the transport's resources after the task stopped."""

    # -- what users read

    @property
    def armed(self) -> int:
        """How many timers are armed now."""
        return len(self._timers)

    def deadline_of(self, worker_id: WorkerId, scope_id: str) -> float | None:
        """The loop deadline of an armed timer, or ``None`` if it is not armed."""
        armed = self._timers.get((worker_id, scope_id))
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

    def _require_running(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise TimerError(f"{type(self).__name__} is closed")
        if self._loop is None or self._task is None or self._task.done():
            raise TimerError(f"{type(self).__name__} is not running (use `async with server:`)")
        return self._loop

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
        key = (worker_id, scope_id)
        old = self._timers.get(key)
        if old is not None and old.handle is not None:
            old.handle.cancel()
        armed = _Armed(worker_id, scope_id, deadline, expiration_time, pid, signal, token)
        armed.handle = loop.call_at(deadline, self._fire, armed, context=self._context)
        self._timers[key] = armed
        if old is None:
            self._by_worker.setdefault(worker_id, set()).add(scope_id)
        self._acquired += 1

    def _disarm(self, worker_id: WorkerId, scope_id: str, token: object = None) -> bool:
        """Disarm (worker, scope); with ``token``, only if it is still the same arming."""
        key = (worker_id, scope_id)
        armed = self._timers.get(key)
        if armed is None or (token is not None and armed.token != token):
            return False
        self._remove(armed)
        self._released += 1
        return True

    def _remove(self, armed: _Armed) -> None:
        if armed.handle is not None:
            armed.handle.cancel()
            armed.handle = None
        del self._timers[(armed.worker_id, armed.scope_id)]
        scopes = self._by_worker.get(armed.worker_id)
        if scopes is not None:
            scopes.discard(armed.scope_id)
            if not scopes:
                del self._by_worker[armed.worker_id]

    def _drop_worker(self, worker_id: WorkerId, reason: str) -> int:
        """Disarm every timer of a worker that is gone; return how many."""
        scopes = self._by_worker.get(worker_id)
        if not scopes:
            return 0
        count = 0
        for scope_id in list(scopes):
            armed = self._timers.get((worker_id, scope_id))
            if armed is not None:
                self._remove(armed)
                count += 1
        self._dropped += count
        log.info("dropped %d timer(s) of worker %s: %s", count, worker_id, reason)
        return count

    def _reject(self, what: str, why: object) -> None:
        """Log and count a rejected request; the server keeps running."""
        self._rejected += 1
        log.warning("rejected timer request %s: %s", what, why)

    def _fire(self, armed: _Armed) -> None:
        armed.handle = None
        if self._timers.get((armed.worker_id, armed.scope_id)) is not armed:
            return  # re-armed or released in the same loop iteration
        self._expire(armed)

    def _expire(self, armed: _Armed) -> None:
        """The deadline of ``armed`` passed: reap it (a transport may claim it first)."""
        self._remove(armed)
        self._reap(armed)

    def _reap(self, armed: _Armed) -> None:
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
