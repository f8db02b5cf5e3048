"""In-process timers: a server and clients sharing one event loop.

Deadlines are event-loop time (``loop.time() + after``), so a virtual-time loop reaps without
waiting in real time. A client's worker id defaults to the asyncio task that acquires, which is
what :class:`~aioelastic.timer.CancelTaskReaper` (the default reaper here) cancels.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from ._client import TimerClient, WorkerId
from ._server import Reaper, TimerServer
from ._wire import TimerRequest, wall_clock
from .reapers import CancelTaskReaper

if TYPE_CHECKING:
    from ..events import EventSink

__all__ = ["LocalTimerClient", "LocalTimerServer"]


class LocalTimerServer(TimerServer):
    """Timers of workers in this process. ``reaper`` defaults to :class:`CancelTaskReaper`.

    ``async with LocalTimerServer() as server: client = server.client()``.
    """

    def __init__(
        self,
        reaper: Reaper | None = None,
        *,
        history: int = 1000,
        event_sink: EventSink | None = None,
    ) -> None:
        super().__init__(
            reaper if reaper is not None else CancelTaskReaper(),
            history=history,
            event_sink=event_sink,
        )

    async def _run(self, ready: Callable[[], None]) -> None:
        # In-process timers need no background work besides async reapers, which run in the
        # server's task group while this waits to be cancelled.
        ready()
        await asyncio.Event().wait()

    def client(self, worker_id: WorkerId | None = None) -> LocalTimerClient:
        """A client for ``worker_id`` (default: whichever task calls acquire/release)."""
        return LocalTimerClient(self, worker_id)

    def submit(self, request: TimerRequest) -> None:
        """Apply a wire record in-process (wall-clock expiration converted to loop time)."""
        if not isinstance(request, TimerRequest):
            raise TypeError(f"request must be a TimerRequest, got {type(request).__name__}")
        if request.expiration_time is None:
            self._disarm(request.worker_id, request.scope_id)
        else:
            deadline = self._deadline_from_wall(request.expiration_time, wall_clock)
            self._arm(
                request.worker_id,
                request.scope_id,
                deadline,
                expiration_time=request.expiration_time,
                pid=request.pid,
                signal=request.signal,
            )


class LocalTimerClient(TimerClient):
    """Acquires and releases timers on a :class:`LocalTimerServer` in the same event loop.

    ``worker_id`` is any hashable; ``None`` means the asyncio task calling acquire/release.
    """

    in_process = True

    def __init__(self, server: LocalTimerServer, worker_id: WorkerId | None = None) -> None:
        if not isinstance(server, LocalTimerServer):
            raise TypeError(f"server must be a LocalTimerServer, got {type(server).__name__}")
        if worker_id is not None and not isinstance(worker_id, Hashable):
            raise TypeError(f"worker_id must be hashable, got {type(worker_id).__name__}")
        self.server = server
        self.worker_id = worker_id

    def _worker(self) -> WorkerId:
        if self.worker_id is not None:
            return self.worker_id
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("LocalTimerClient without a worker_id must be used from a task")
        return task

    async def _acquire(self, scope_id: str, after: float) -> None:
        loop = asyncio.get_running_loop()
        self.server._arm(self._worker(), scope_id, loop.time() + after)

    async def _release(self, scope_id: str) -> None:
        self.server._disarm(self._worker(), scope_id)
