"""An async resource whose background work runs in an asyncio task it owns (the timer servers').

Owning the task (rather than running in the caller's) lets a server be started and closed in
different tasks, as pytest-asyncio fixtures do; the tasks it spawns are cancelled when it stops.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Self

from anyio.abc import AsyncResource

from ..errors import TimerError

__all__ = ["BackgroundService"]

log = logging.getLogger("aioelastic.timer")


class BackgroundService(AsyncResource):
    """``async with service:`` (or :meth:`start` / :meth:`aclose`) runs :meth:`_run` in a task.

    A subclass implements :meth:`_run` (its transport), may override :meth:`_aclose` (release
    the transport), and :meth:`_closing` / :meth:`_stopped` (what closing does before the
    task is cancelled and after it and its spawned tasks stopped).
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._children: set[asyncio.Task[None]] = set()
        self._closed = False

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
        """Stop the task and every task it spawned, then release the transport."""
        if self._closed:
            return
        self._closed = True
        self._closing()
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        await _cancel(self._children)  # spawned after the task ended, if it failed
        self._stopped()
        await self._aclose()

    async def _main(self) -> None:
        try:
            await self._run(self._set_ready)
        finally:
            await _cancel(self._children)

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

    def _require_running(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise TimerError(f"{type(self).__name__} is closed")
        if self._loop is None or self._task is None or self._task.done():
            raise TimerError(f"{type(self).__name__} is not running (use `async with server:`)")
        return self._loop

    @abc.abstractmethod
    async def _run(self, ready: Callable[[], None]) -> None:
        """The transport's background work; call ``ready()`` once requests are accepted.

        Runs in the server's task until cancelled by :meth:`aclose`; the tasks of async
        reapers (see :meth:`_spawn`) are cancelled when it ends.
        """

    def _closing(self) -> None:
        """Closing has begun (the task still runs)."""

    def _stopped(self) -> None:
        """The task and every task it spawned have stopped."""

    async def _aclose(self) -> None:
        """Release the transport's resources after the task stopped."""


async def _cancel(tasks: set[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` (a snapshot of them) and wait until they end."""
    children = list(tasks)
    for child in children:
        child.cancel()
    if children:
        await asyncio.wait(children)
