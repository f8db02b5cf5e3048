"""The memory engine's leases: the table of live leases and their expiry timers.

Deadlines are ``loop.call_at`` timers on the running event loop (so virtual time expires them
without waiting); a keep-alive only moves the deadline, and the timer, when it fires early,
sleeps again until the new one. Ending a lease (deleting its keys, calling the hooks) is the
engine's: the table calls ``expire`` with the lease whose deadline has passed.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import LeaseNotFoundError
from ._types import LeaseStatus

__all__ = ["LeaseTable"]

_TIMER_CONTEXT = contextvars.Context()


@dataclass(eq=False, slots=True)
class _Lease:
    """A live lease. It is its own timer callback (``loop.call_at(deadline, lease)``): a timer
    holds the lease only, not a bound method and an arguments tuple besides (two objects fewer
    per lease for every full garbage collection to traverse)."""

    table: LeaseTable = field(repr=False)
    id: int
    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)
    handle: asyncio.TimerHandle | None = field(default=None, repr=False)

    def __call__(self) -> None:
        self.table._on_timer(self)


class LeaseTable:
    """Live leases by id, the last id handed out, and their expiry timers."""

    __slots__ = ("_expire", "_loop", "by_id", "last_id")

    def __init__(self, expire: Callable[[_Lease], None]) -> None:
        self._expire = expire  # ends a lease whose deadline passed; may raise (a vetoing hook)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.by_id: dict[int, _Lease] = {}
        self.last_id = 0

    def __len__(self) -> int:
        return len(self.by_id)

    def time(self) -> float:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop.time()

    def add(self, lease_id: int | None, ttl: float) -> _Lease:
        """A new lease (the next id if ``lease_id`` is ``None``), its timer started."""
        if lease_id is None:
            lease_id = self.last_id + 1
        elif lease_id in self.by_id:
            raise ValueError(f"lease {lease_id:#x} already exists")
        self.last_id = max(self.last_id, lease_id)
        lease = _Lease(self, lease_id, ttl, self.time() + ttl)
        self.by_id[lease_id] = lease
        self.schedule(lease)
        return lease

    def discard(self, lease: _Lease) -> None:
        """Forget ``lease`` and stop its timer."""
        self.by_id.pop(lease.id, None)
        if lease.handle is not None:
            lease.handle.cancel()

    def get(self, lease_id: int) -> _Lease:
        lease = self.by_id.get(lease_id)
        if lease is None:
            raise LeaseNotFoundError(lease_id)
        return lease

    def keep_alive(self, lease_id: int) -> float:
        lease = self.get(lease_id)
        lease.deadline = self.time() + lease.ttl
        return lease.ttl

    def status(self, lease_id: int) -> LeaseStatus:
        lease = self.get(lease_id)
        remaining = max(0.0, lease.deadline - self.time())
        return LeaseStatus(lease.id, lease.ttl, remaining, tuple(sorted(lease.keys)))

    def schedule(self, lease: _Lease) -> None:
        assert self._loop is not None
        # in a context of its own: the expiry needs none of the granting caller's (and a copy
        # of it per lease would be one more object per lease for the garbage collector)
        lease.handle = self._loop.call_at(lease.deadline, lease, context=_TIMER_CONTEXT)

    def _on_timer(self, lease: _Lease) -> None:
        if self.by_id.get(lease.id) is not lease:
            return
        if self.time() < lease.deadline:  # kept alive since: sleep until the new deadline
            self.schedule(lease)
            return
        try:
            self._expire(lease)
        except Exception:  # a hook vetoed it (the log cannot be written): the lease stays
            assert self._loop is not None
            lease.handle = self._loop.call_later(1.0, lease, context=_TIMER_CONTEXT)

    def cancel_timers(self) -> None:
        for lease in self.by_id.values():
            if lease.handle is not None:
                lease.handle.cancel()
