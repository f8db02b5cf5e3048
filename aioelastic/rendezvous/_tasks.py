"""The tasks of a dynamic join: the reader of the control watch and the round's driver.

A join waits on several things at once (the next control event, its driver, the handler's close,
the join deadline). :class:`JoinTasks` owns the two tasks among them and ends them the way a join
needs: a driver writing a round that completed is let finish, an event read but not applied is
handed back so the kept view misses nothing, and no task is left behind or unretrieved.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from ..store import Watch, WatchEvent

#: the context of the wake-ups below: they only resolve a future, so need no copy of the caller's
WAKE_CONTEXT = contextvars.Context()


def resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _wake(waiter: asyncio.Future[None], _: object) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def first_done(futures: Iterable[asyncio.Future[Any]]) -> None:
    """Wait until one of ``futures`` is done: ``asyncio.wait(FIRST_COMPLETED)`` without its
    sets, coroutines and context copies, since every joining node waits on this at once."""
    futures = tuple(futures)
    if any(f.done() for f in futures):
        return
    waiter = asyncio.get_running_loop().create_future()
    # one object the collector tracks while the node waits (a closure: a function and a cell)
    wake = functools.partial(_wake, waiter)
    for future in futures:
        future.add_done_callback(wake, context=WAKE_CONTEXT)
    try:
        await waiter
    finally:
        for future in futures:
            future.remove_done_callback(wake)


class JoinTasks:
    """The control watch's reader (one pending ``__anext__`` at a time) and the driver task.

    ``event()`` takes the event read, if one is; ``read()`` starts reading the next; ``drive()``
    starts a driver; ``driver_failed()`` raises a driver's failure; ``futures()`` are what the
    join waits on; ``aclose()`` ends both tasks and returns an event read but not applied.
    """

    def __init__(self, watch: Watch) -> None:
        self._loop = asyncio.get_running_loop()
        self._watch = watch
        self._next: asyncio.Task[WatchEvent] | None = None
        self.driver: asyncio.Task[None] | None = None
        self.read()

    def read(self) -> None:
        """Read the watch's next event from now on (also while the joiner writes)."""
        if self._next is None:
            self._next = self._loop.create_task(self._watch.__anext__())

    def event_ready(self) -> bool:
        return self._next is not None and self._next.done()

    def event(self) -> WatchEvent | None:
        """The event read, if one is (its error, if reading failed); then no read is pending."""
        task = self._next
        if task is None or not task.done():
            return None
        self._next = None
        return task.result()

    def retarget(self, watch: Watch) -> None:
        """Read from another watch (the view was read afresh after a compaction)."""
        self._watch = watch
        self._next = None
        self.read()

    def drive(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self.driver = self._loop.create_task(coro, name=name)

    def driver_failed(self) -> None:
        """Raise the failure of a driver that ended (a failed driver fails the join)."""
        driver = self.driver
        if driver is not None and driver.done():
            self.driver = None
            driver.result()

    def futures(self) -> list[asyncio.Future[Any]]:
        self.read()
        assert self._next is not None
        return [self._next] if self.driver is None else [self._next, self.driver]

    async def aclose(self, *, let_driver_finish: float | None) -> WatchEvent | BaseException | None:
        """End both tasks; ``let_driver_finish``: seconds a still-running driver may take first.

        Returns the event read but not applied (or the error reading ended with), if any.
        """
        driver, pending = self.driver, self._next
        if let_driver_finish is not None and driver is not None and not driver.done():
            with anyio.move_on_after(let_driver_finish, shield=True):
                await asyncio.wait([driver])
        tasks = [t for t in (pending, driver) if t is not None]
        for task in tasks:
            if not task.done():
                task.cancel()
        if tasks:
            with anyio.CancelScope(shield=True):
                await asyncio.wait(tasks)
            for task in tasks:  # retrieve, so asyncio does not log them
                if not task.cancelled():
                    task.exception()
        self.driver = self._next = None
        if pending is None or pending.cancelled():
            return None
        error = pending.exception()
        return pending.result() if error is None else error
