"""The tasks of a dynamic join: the reader of the control watch and the round's driver.

A join waits on several things at once (the next control event, its driver, the handler's close,
the join deadline). :class:`JoinTasks` owns the two tasks among them and ends them the way a join
needs: a driver writing a round that completed is let finish, an event read but not applied is
handed back so the kept view misses nothing, and no task is left behind or unretrieved.

What the join waits on wakes it directly (:meth:`JoinTasks.wake`): a task ending resolves the
join's waiter in its own last step, not through a done-callback (which asyncio runs one loop
iteration later, and which then wakes the join one iteration later still). A watch that can wake
its reader itself (the http store's: ``Watch._set_waker``) needs no reader task at all: its
events are taken from its buffer as the join looks (no task created, stepped and woken per
event), and an event the join did not take stays there for the next join.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from ..store import Watch, WatchEvent

#: the context of the wake-ups below: they only resolve a future, so need no copy of the caller's
WAKE_CONTEXT = contextvars.Context()


def resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class JoinTasks:
    """The control watch's reader (one pending ``__anext__`` at a time) and the driver task.

    ``event()`` takes the event read, if one is; ``read()`` starts reading the next; ``drive()``
    starts a driver; ``driver_failed()`` raises a driver's failure; ``wait()`` waits for either
    task's end or the join's close or deadline (which call ``wake()``); ``aclose()`` ends both
    tasks and returns an event read but not applied.
    """

    def __init__(self, watch: Watch, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop  # (the running one: the joiner has it)
        self._watch = watch
        #: events are taken from the watch as the join looks (it wakes the join): no reader task
        self.taking = watch._set_waker(self.wake)
        self._next: asyncio.Task[WatchEvent] | None = None
        self.driver: asyncio.Task[None] | None = None
        self._driving: Coroutine[Any, Any, None] | None = None  # the driver task's coroutine
        self._waiter: asyncio.Future[None] | None = None  # the join parked in wait()
        self.read()

    def wake(self) -> None:
        """Wake the join parked in :meth:`wait`, if one is (it then looks at what is done)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _read(self, watch: Watch) -> WatchEvent:
        try:
            return await watch.__anext__()
        finally:
            self.wake()  # (also for an error or a cancellation: the join sees it at once)

    async def _drive(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        finally:
            self.wake()

    def read(self) -> None:
        """Read the watch's next event from now on (also while the joiner writes)."""
        if self._next is None and not self.taking:
            self._next = self.loop.create_task(self._read(self._watch))

    def event_ready(self) -> bool:
        if self.taking:
            return self._watch._event_ready()
        return self._next is not None and self._next.done()

    def event(self) -> WatchEvent | None:
        """The event read, if one is (its error, if reading failed); then no read is pending."""
        if self.taking:
            return self._watch._take_event()
        task = self._next
        if task is None or not task.done():
            return None
        self._next = None
        return task.result()

    def retarget(self, watch: Watch) -> None:
        """Read from another watch (the view was read afresh after a compaction)."""
        if self.taking:
            self._watch._set_waker(None)
        self._watch = watch
        self.taking = watch._set_waker(self.wake)
        self._next = None
        self.read()

    def drive(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._driving = coro
        self.driver = self.loop.create_task(self._drive(coro), name=name)

    def driver_failed(self) -> None:
        """Raise the failure of a driver that ended (a failed driver fails the join)."""
        driver = self.driver
        if driver is not None and driver.done():
            self.driver = None
            driver.result()

    async def wait(self, *others: asyncio.Future[None]) -> None:
        """Wait until the next event is read, the driver ended, or one of ``others`` (futures
        whose resolver calls :meth:`wake` too) is done."""
        self.read()
        driver = self.driver
        if self.event_ready() or (driver is not None and driver.done()):
            return
        if any(f.done() for f in others):
            return
        self._waiter = waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    async def aclose(self, *, let_driver_finish: float | None) -> WatchEvent | BaseException | None:
        """End both tasks; ``let_driver_finish``: seconds a still-running driver may take first.

        Returns the event read but not applied (or the error reading ended with), if any (from a
        watch whose events are taken: the next one if one is ready, the rest stay in it).
        """
        unread: WatchEvent | BaseException | None = None
        if self.taking:
            self.taking = False
            self._watch._set_waker(None)
            if self._watch._event_ready():
                try:
                    unread = self._watch._take_event()
                except BaseException as exc:  # (its end: the view is not kept)
                    unread = exc
        driver, pending = self.driver, self._next
        if let_driver_finish is not None and driver is not None and not driver.done():
            with anyio.move_on_after(let_driver_finish, shield=True):
                await asyncio.wait([driver])
        tasks = [t for t in (pending, driver) if t is not None]
        running = [t for t in tasks if not t.done()]  # (a wait for done ones costs a loop turn)
        for task in running:
            task.cancel()
        if running:
            with anyio.CancelScope(shield=True):
                await asyncio.wait(running)
            for task in tasks:  # retrieve, so asyncio does not log them
                if not task.cancelled():
                    task.exception()
        if self._driving is not None:  # (a driver cancelled before its first step never ran it)
            self._driving.close()
        self.driver = self._next = self._driving = None
        if pending is None or pending.cancelled():
            return unread
        error = pending.exception()
        return pending.result() if error is None else error
