"""The requests a session's connection has sent and not had answered yet, and their deadlines:
one timer for all of them (at the earliest deadline), not one made and cancelled per request."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

__all__ = ["Pending", "Requests"]

#: an entry: (the answer's future, its deadline in loop time; inf: none)
Pending = tuple["asyncio.Future[Any]", float]


class Requests(dict[int, Pending]):
    """``rid -> (future, deadline)``. When a deadline passes, the future fails with
    :class:`TimeoutError` and ``on_expired()`` is called (the connection may end then)."""

    __slots__ = ("_at", "_loop", "_on_expired", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_expired: Callable[[], None]) -> None:
        super().__init__()
        self._loop = loop
        self._on_expired = on_expired
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf

    def track(self, rid: int, future: asyncio.Future[Any], timeout: float) -> None:
        """Track a request: its ``future`` fails ``timeout`` seconds from now (``>= 1e9``:
        never; the caller keeps its own deadline)."""
        deadline = self._loop.time() + timeout if timeout < 1e9 else math.inf
        self[rid] = (future, deadline)
        if deadline < self._at:
            self._arm(deadline)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = self._loop.call_at(at, self._expire)

    def _expire(self) -> None:
        # A sweep over the requests pending now, once per timeout at most (the timer is armed
        # at the earliest deadline and requests are mostly answered long before theirs).
        self._timer, self._at = None, math.inf
        now = self._loop.time()
        expired: list[int] = []
        next_at = math.inf
        for rid, (future, deadline) in self.items():
            if future.done() or deadline <= now:
                expired.append(rid)  # (done: its caller was cancelled, nobody waits for it)
            elif deadline < next_at:
                next_at = deadline
        for rid in expired:
            future = self.pop(rid)[0]
            if not future.done():
                future.set_exception(TimeoutError())
        if next_at < math.inf:
            self._arm(next_at)
        if expired:
            self._on_expired()

    def fail_all(self, error: BaseException) -> None:
        """The connection ended: every pending request fails with ``error``."""
        self.cancel()
        for future, _ in self.values():
            if not future.done():
                future.set_exception(error)
        self.clear()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._at = None, math.inf
