"""The memory engine's leases: the table of live leases and their expiry timers.

Deadlines are event-loop times, all on one ``loop.call_at`` timer (:mod:`._deadlines`: a lease
is not a timer handle of its own), so virtual time expires them without waiting; a keep-alive
only moves the deadline, and the expiry, when it comes early, is set again for the new one.
Ending a lease (deleting its keys, calling the hooks) is the engine's: the table calls
``expire`` with the lease whose deadline has passed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import LeaseNotFoundError
from ._deadlines import Deadlines
from ._types import LeaseStatus

__all__ = ["LeaseTable"]


@dataclass(eq=False, slots=True)
class _Lease:
    """A live lease: its expiry is a token of the table's deadlines (two numbers in a heap and
    a dict entry), not a timer handle and a callback of its own (objects that every full
    garbage collection would traverse, one each per lease)."""

    id: int
    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)
    token: int = field(default=0, repr=False)  # of its expiry in the table's deadlines


class LeaseTable:
    """Live leases by id, the last id handed out, and their expiry timers."""

    __slots__ = ("_deadlines", "_expire", "_loop", "by_id", "last_id")

    def __init__(self, expire: Callable[[_Lease], None]) -> None:
        self._expire = expire  # ends a lease whose deadline passed; may raise (a vetoing hook)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.by_id: dict[int, _Lease] = {}
        self.last_id = 0
        self._deadlines: Deadlines[_Lease] = Deadlines(self._on_timer)

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
        lease = _Lease(lease_id, ttl, self.time() + ttl)
        self.by_id[lease_id] = lease
        self.schedule(lease)
        return lease

    def discard(self, lease: _Lease) -> None:
        """Forget ``lease`` and stop its timer."""
        self.by_id.pop(lease.id, None)
        self._deadlines.cancel(lease.token)

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

    def schedule(self, lease: _Lease, at: float | None = None) -> None:
        """Expire ``lease`` at its deadline (or at loop time ``at``) unless it moves."""
        assert self._loop is not None
        self._deadlines.cancel(lease.token)
        when = lease.deadline if at is None else at
        lease.token = self._deadlines.add(self._loop, when, lease)

    def _on_timer(self, lease: _Lease) -> None:
        if self.by_id.get(lease.id) is not lease:
            return
        if self.time() < lease.deadline:  # kept alive since: sleep until the new deadline
            self.schedule(lease)
            return
        try:
            self._expire(lease)
        except Exception:  # a hook vetoed it (the log cannot be written): the lease stays
            self.schedule(lease, self.time() + 1.0)

    def cancel_timers(self) -> None:
        self._deadlines.clear()
