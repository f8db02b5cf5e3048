"""The armed timers of a :class:`~aioelastic.timer.TimerServer`: by (worker, scope), by worker."""

from __future__ import annotations

import asyncio

from ._client import WorkerId

__all__ = ["Armed", "TimerTable"]


class Armed:
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


class TimerTable:
    """Each (worker, scope)'s current arming, and each worker's scopes (to drop a worker)."""

    def __init__(self) -> None:
        self._timers: dict[tuple[WorkerId, str], Armed] = {}
        self._by_worker: dict[WorkerId, set[str]] = {}

    def __len__(self) -> int:
        return len(self._timers)

    def get(self, worker_id: WorkerId, scope_id: str) -> Armed | None:
        return self._timers.get((worker_id, scope_id))

    def is_current(self, armed: Armed) -> bool:
        """``armed`` was neither re-armed nor removed since."""
        return self._timers.get((armed.worker_id, armed.scope_id)) is armed

    def put(self, armed: Armed) -> None:
        """Make ``armed`` its (worker, scope)'s arming, cancelling the one it replaces."""
        key = (armed.worker_id, armed.scope_id)
        old = self._timers.get(key)
        if old is not None and old.handle is not None:
            old.handle.cancel()
        self._timers[key] = armed
        if old is None:
            self._by_worker.setdefault(armed.worker_id, set()).add(armed.scope_id)

    def remove(self, armed: Armed) -> None:
        """Cancel and forget ``armed`` (it must be current)."""
        if armed.handle is not None:
            armed.handle.cancel()
            armed.handle = None
        del self._timers[(armed.worker_id, armed.scope_id)]
        scopes = self._by_worker.get(armed.worker_id)
        if scopes is not None:
            scopes.discard(armed.scope_id)
            if not scopes:
                del self._by_worker[armed.worker_id]

    def of_worker(self, worker_id: WorkerId) -> list[Armed]:
        """Every timer ``worker_id`` holds armed now."""
        scopes = self._by_worker.get(worker_id, ())
        return [armed for scope in scopes if (armed := self.get(worker_id, scope)) is not None]

    def clear(self) -> None:
        """Cancel and forget every timer."""
        for armed in self._timers.values():
            if armed.handle is not None:
                armed.handle.cancel()
        self._timers.clear()
        self._by_worker.clear()
