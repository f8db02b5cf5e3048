"""Leader election on the store protocol: campaign, resign, proclaim, observe, leader.

Modelled on etcd's ``clientv3/concurrency`` election: a candidate creates a key under ``name/``
with its lease and its value; the candidate whose key has the lowest create revision leads, and
that revision is its *term* (strictly increasing from leader to leader). Waiting candidates watch
only the key just before their own. Losing the lease cancels the leader's scope.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Self

import anyio
from anyio.abc import AsyncResource

from ..errors import NotLeaderError, SyncTimeoutError
from ..store import EventType, KeyValue, LeaseKeeper, Store
from ._common import (
    HeldLease,
    QueueEntry,
    ResumingWatch,
    check_config,
    check_name,
    check_timeout,
    head_of,
)
from ._config import LeaseConfig

__all__ = ["Election", "Leader", "LeaderObserver"]


@dataclass(frozen=True, slots=True)
class Leader:
    """Who leads: the leader's ``key``, its ``value`` (what it proclaimed), its ``term`` (the
    revision that created its key, strictly increasing across leaders) and the ``revision`` of
    its value's last write."""

    key: str
    value: bytes
    term: int
    revision: int

    def text(self) -> str:
        """The value decoded as UTF-8."""
        return self.value.decode()

    @classmethod
    def from_kv(cls, kv: KeyValue) -> Leader:
        return cls(kv.key, kv.value, kv.create_revision, kv.mod_revision)


def _as_bytes(value: object) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"value must be str or bytes, got {type(value).__name__}")


class Election:
    """The election ``name`` in ``store``.

    ``await election.campaign(value)`` waits until this side leads (FIFO among candidates);
    ``async with election.leadership(value):`` also runs the block in a scope that is cancelled
    when the lease is lost (``LeaseExpiredError``) and resigns on exit. :meth:`leader` reads the
    current leader, :meth:`observe` follows leader changes. ``lease`` / ``config`` work as for
    :class:`~aioelastic.sync.Lock`.
    """

    def __init__(
        self,
        store: Store,
        name: str,
        *,
        lease: LeaseKeeper | None = None,
        config: LeaseConfig | None = None,
    ) -> None:
        if not isinstance(store, Store):
            raise TypeError(f"store must be a Store, got {type(store).__name__}")
        self.store = store
        self.name = check_name(name)
        self.prefix = self.name + "/"
        self._lease = HeldLease(store, lease, check_config(config))
        self._entry: QueueEntry | None = None
        self._leading = False

    def __repr__(self) -> str:
        state = f"leading term={self.term}" if self._leading else "not leading"
        return f"<Election {self.name!r} {state}>"

    @property
    def is_leader(self) -> bool:
        """Whether this side leads (and has not lost its lease)."""
        keeper = self._lease.keeper
        return self._leading and keeper is not None and not keeper.lost

    @property
    def term(self) -> int:
        """This side's term while it leads (the create revision of its key)."""
        if not self._leading or self._entry is None:
            raise NotLeaderError(f"not the leader of {self.name!r}")
        return self._entry.revision

    @property
    def lease(self) -> LeaseKeeper:
        if self._lease.keeper is None:
            raise NotLeaderError(f"not campaigning in {self.name!r}")
        return self._lease.keeper

    async def campaign(self, value: str | bytes, *, timeout: float | None = None) -> Leader:
        """Stand with ``value`` and wait until elected; return this side as :class:`Leader`.

        Raises :class:`~aioelastic.errors.SyncTimeoutError` after ``timeout`` seconds. A
        cancelled or failed campaign withdraws the candidacy.
        """
        data = _as_bytes(value)
        timeout = check_timeout(timeout)
        if self._entry is not None:
            raise RuntimeError(f"already campaigning in {self.name!r}")
        keeper = await self._lease.open()
        entry = QueueEntry(self.store, self.prefix, keeper.id)
        self._entry = entry
        try:
            await entry.create(data)
            before, revision = await entry.first_position()
            if before is not None or revision is None:
                with anyio.move_on_after(timeout) as scope, keeper.guard():
                    await entry.wait_head(before, revision)
                if scope.cancelled_caught:
                    raise SyncTimeoutError(
                        f"timed out after {timeout}s campaigning in the election {self.name!r}"
                    )
        except BaseException:
            await self._withdraw()
            raise
        self._leading = True
        assert entry.kv is not None
        return Leader.from_kv(entry.kv)

    async def proclaim(self, value: str | bytes) -> Leader:
        """As leader, publish a new value without a new election (the term stays)."""
        data = _as_bytes(value)
        entry = self._entry
        if not self._leading or entry is None:
            raise NotLeaderError(f"not the leader of {self.name!r}")
        if not await entry.update(data):
            self._leading = False
            raise NotLeaderError(f"lost the leadership of {self.name!r} (its key is gone)")
        assert entry.kv is not None
        return Leader.from_kv(entry.kv)

    async def resign(self) -> None:
        """Give up leadership (or candidacy); the next candidate takes over. Idempotent."""
        await self._withdraw()

    async def _withdraw(self) -> None:
        entry, self._entry = self._entry, None
        self._leading = False
        if entry is not None and self._lease.private:
            entry.kv = None  # revoking the private lease deletes the key in the same write
        with anyio.CancelScope(shield=True):
            if entry is not None:
                await entry.remove()
            await self._lease.aclose()

    async def leader(self) -> Leader | None:
        """The current leader, or None if nobody leads."""
        head, _ = await head_of(self.store, self.prefix)
        return None if head is None else Leader.from_kv(head)

    def observe(self) -> LeaderObserver:
        """An async iterator of leader changes: the current leader first, then each new leader
        or value (``None`` while nobody leads). ``async with`` it, or call ``aclose()``."""
        return LeaderObserver(self.store, self.prefix)

    def guard(self) -> contextlib.AbstractContextManager[anyio.CancelScope]:
        """A scope cancelled when the leader's lease is lost (then ``LeaseExpiredError``)."""
        if not self._leading:
            raise NotLeaderError(f"not the leader of {self.name!r}")
        return self.lease.guard()

    @contextlib.asynccontextmanager
    async def leadership(
        self, value: str | bytes, *, timeout: float | None = None
    ) -> AsyncIterator[Leader]:
        """``async with election.leadership(value) as me:`` campaign, lead (guarded), resign."""
        me = await self.campaign(value, timeout=timeout)
        try:
            with self.guard():
                yield me
        finally:
            with anyio.CancelScope(shield=True):
                await self.resign()


class LeaderObserver(AsyncResource):
    """Follows an election's leader on one watch of its prefix (see :meth:`Election.observe`).

    Yields the leader at start (``None`` if there is none), then every change of leader or of
    its value. Intermediate states within one store revision may be skipped or reported; the
    last state of each change is always reported. Connection errors do not end it: it watches
    again from where it stopped, so no change is missed or reported twice; if the history it
    missed has been compacted meanwhile, it reads the candidates again and reports the leader if
    that changed.
    """

    def __init__(self, store: Store, prefix: str) -> None:
        self._store = store
        self._prefix = prefix
        self._candidates: dict[str, KeyValue] = {}
        self._watch = ResumingWatch(store, prefix, f"observing the election {prefix!r}", self._read)
        self._started = False
        self._last: Leader | None = None
        self._reported = False
        self._closed = False

    def __aiter__(self) -> Self:
        return self

    async def aclose(self) -> None:
        self._closed = True
        await self._watch.aclose()

    def _current(self) -> Leader | None:
        head = min(self._candidates.values(), key=lambda kv: kv.create_revision, default=None)
        return None if head is None else Leader.from_kv(head)

    async def _read(self) -> int:
        snapshot = await self._store.range(self._prefix)
        self._candidates = {kv.key: kv for kv in snapshot}
        return snapshot.revision

    async def __anext__(self) -> Leader | None:
        if self._closed:
            raise StopAsyncIteration
        while True:
            if not self._started:
                await self._watch.resync()
                self._started = True
            else:
                event = await self._watch.next()
                if event is not None and event.type is EventType.PUT:
                    self._candidates[event.kv.key] = event.kv
                elif event is not None:
                    self._candidates.pop(event.kv.key, None)
            current = self._current()
            if not self._reported or current != self._last:
                self._reported = True
                self._last = current
                return current
