"""A stop request to the agent (SIGTERM, SIGINT, :meth:`ElasticAgent.request_stop`) and the waits
it cuts short: :class:`StopRequest`, :func:`settle` for the tasks it cancels."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["StopRequest", "Stopped", "settle"]

T = TypeVar("T")


class Stopped(Exception):
    """A stop was requested while waiting (internal to the agent)."""


async def settle(*tasks: asyncio.Future[Any]) -> None:
    """Wait for cancelled tasks to finish without taking their outcome (nor swallowing a
    cancellation of the caller, which ``suppress(CancelledError): await task`` would)."""
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" warning


class StopRequest:
    """Whether a stop was asked for, by which signal, and an event the run waits on.

    A request may come before the run started (:meth:`arm` then sets the event at once).
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._pending = False
        self._event: asyncio.Event | None = None

    def arm(self) -> None:
        """The run starts: from now on a request sets the event the run waits on."""
        self._event = asyncio.Event()
        if self._pending:
            self._event.set()

    def request(self, signum: int | None) -> bool:
        """Record a request (``signum``: the signal that asked); True when one was made before
        (then the caller kills the workers at once)."""
        if self.signum is None or signum is not None:
            self.signum = signum
        self._pending = True
        if self._event is None:
            return False
        again = self._event.is_set()
        self._event.set()
        return again

    @property
    def worker_signal(self) -> signal.Signals:
        """What stops the workers: the signal that stopped the agent (as torchrun), else
        SIGTERM."""
        return signal.SIGTERM if self.signum is None else signal.Signals(self.signum)

    def exit(self) -> tuple[int, str]:
        """The exit code (128 + the signal) and the message of an interrupted run."""
        sig = self.signum
        code = 128 + sig if sig is not None else 1
        name = signal.Signals(sig).name if sig is not None else "a stop request"
        return code, f"stopped by {name}"

    async def wait(self) -> None:
        assert self._event is not None, "arm() first"
        await self._event.wait()

    async def until(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` unless a stop is requested first (then cancel it, raise
        :class:`Stopped`)."""
        task = asyncio.ensure_future(awaitable)
        stopper = asyncio.ensure_future(self.wait())
        try:
            await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not task.done():
                task.cancel()
                await settle(task)
        if task.cancelled() or not task.done():
            raise Stopped
        return task.result()
