"""A distributed lock on the store protocol: fair (FIFO by revision), lease-bound, fenced.

Modelled on etcd's ``clientv3/concurrency`` mutex: each contender creates its own key under
``name/`` with its lease; the key with the lowest create revision holds the lock; every waiter
watches only the key just before its own, so a release wakes exactly one waiter and nothing polls.
The holder's create revision is its fencing token: it increases strictly from holder to holder.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Self

import anyio

from ..errors import SyncTimeoutError
from ..store import KeyValue, LeaseKeeper, Store
from ._common import (
    HeldLease,
    QueueEntry,
    check_config,
    check_name,
    check_timeout,
    default_identity,
    head_of,
)
from ._config import LeaseConfig

__all__ = ["Lock", "store_lock"]


class Lock:
    """A lock named ``name`` in ``store``; use ``async with store_lock(store, name):``.

    ``async with`` acquires (waiting up to ``timeout`` seconds, default forever), runs the block
    in a scope that is cancelled if the lease is lost (then ``LeaseExpiredError`` is raised rather
    than letting two holders run), and releases on exit. :meth:`acquire`, :meth:`try_acquire`
    and :meth:`release` are the explicit form; combine them with :meth:`guard`.

    ``lease``: a :class:`~aioelastic.store.LeaseKeeper` to hold the lock with (shared with other
    primitives; the lock is lost when it is). Without one, the lock grants a private lease with
    ``config``'s timing for each acquisition. ``identity`` is written into the holder's key
    (default ``host:pid``) so others can see who holds it (:meth:`holder`).
    """

    def __init__(
        self,
        store: Store,
        name: str,
        *,
        lease: LeaseKeeper | None = None,
        config: LeaseConfig | None = None,
        timeout: float | None = None,
        identity: str | None = None,
    ) -> None:
        if not isinstance(store, Store):
            raise TypeError(f"store must be a Store, got {type(store).__name__}")
        self.store = store
        self.name = check_name(name)
        self.prefix = self.name + "/"
        self.timeout = check_timeout(timeout)
        if identity is not None and not isinstance(identity, str):
            raise TypeError(f"identity must be a str or None, got {type(identity).__name__}")
        self.identity = default_identity() if identity is None else identity
        self._identity = self.identity.encode()
        self._lease = HeldLease(store, lease, check_config(config))
        self._entry: QueueEntry | None = None
        self._held = False
        self._guards: list[
            tuple[contextlib.AbstractContextManager[anyio.CancelScope], anyio.CancelScope]
        ] = []

    def __repr__(self) -> str:
        state = f"held token={self.fencing_token}" if self._held else "not held"
        return f"<Lock {self.name!r} {state}>"

    # -- state

    @property
    def held(self) -> bool:
        """Whether this side holds the lock (and has not lost its lease)."""
        keeper = self._lease.keeper
        return self._held and keeper is not None and not keeper.lost

    @property
    def fencing_token(self) -> int:
        """The revision that created the holder's key: strictly increasing across holders.

        Pass it along with writes to a resource that remembers the largest token it has seen and
        refuses smaller ones, so a holder that stalled past its lease cannot clobber a successor.
        """
        if not self._held or self._entry is None:
            raise RuntimeError(f"the lock {self.name!r} is not held")
        return self._entry.revision

    @property
    def key(self) -> str:
        """The store key this side holds or waits with."""
        if self._entry is None:
            raise RuntimeError(f"the lock {self.name!r} is not held or waited for")
        return self._entry.key

    @property
    def lease(self) -> LeaseKeeper:
        """The lease the lock is held with."""
        if self._lease.keeper is None:
            raise RuntimeError(f"the lock {self.name!r} is not held")
        return self._lease.keeper

    async def holder(self) -> KeyValue | None:
        """The key-value of whoever holds the lock now (its value is their identity), or None."""
        head, _ = await head_of(self.store, self.prefix)
        return head

    # -- acquire / release

    async def acquire(self, *, timeout: float | None = None) -> int:
        """Wait for the lock (FIFO among waiters); return the fencing token.

        Raises :class:`~aioelastic.errors.SyncTimeoutError` after ``timeout`` seconds (default:
        the lock's ``timeout``), and ``LeaseExpiredError`` if the lease is lost while waiting. A
        cancelled or failed acquire leaves nothing behind in the queue.
        """
        timeout = self.timeout if timeout is None else check_timeout(timeout)
        entry = await self._enter()
        try:
            before, revision = await entry.first_position()
            if before is not None or revision is None:  # queued (the uncontended path skips it)
                with anyio.move_on_after(timeout) as scope, self.lease.guard():
                    await entry.wait_head(before, revision)
                if scope.cancelled_caught:
                    raise SyncTimeoutError(
                        f"timed out after {timeout}s waiting for the lock {self.name!r}"
                    )
        except BaseException:
            await self._leave()
            raise
        self._held = True
        return entry.revision

    async def try_acquire(self) -> bool:
        """Take the lock if nobody holds or waits for it; never waits for another holder."""
        entry = await self._enter()
        try:
            before, _ = await entry.position()
            if before is None:
                self._held = True
                return True
        except BaseException:
            await self._leave()
            raise
        await self._leave()
        return False

    async def release(self) -> None:
        """Release the lock (a no-op if it is not held); the next waiter takes it.

        The release runs to completion even if the calling task is being cancelled.
        """
        if self._entry is None:
            return
        await self._leave()

    async def _enter(self) -> QueueEntry:
        if self._entry is not None:
            raise RuntimeError(f"the lock {self.name!r} is already held or being acquired")
        keeper = await self._lease.open()
        entry = QueueEntry(self.store, self.prefix, keeper.id)
        self._entry = entry
        try:
            await entry.create(self._identity)
        except BaseException:
            self._entry = None
            with anyio.CancelScope(shield=True):
                await self._lease.aclose()
            raise
        return entry

    async def _leave(self, *, shield: bool = True) -> None:
        entry, self._entry = self._entry, None
        self._held = False
        if shield:
            with anyio.CancelScope(shield=True):
                await self._clean_up(entry)
        else:
            await self._clean_up(entry)

    async def _clean_up(self, entry: QueueEntry | None) -> None:
        if self._lease.private:
            await self._lease.aclose()  # revoking the lease deletes the key in the same write
        elif entry is not None:
            await entry.remove()

    # -- scopes

    def guard(self) -> contextlib.AbstractContextManager[anyio.CancelScope]:
        """A scope cancelled if the lock's lease is lost; it then raises ``LeaseExpiredError``."""
        return self.lease.guard()

    async def __aenter__(self) -> Self:
        await self.acquire()
        guard = self.guard()
        scope = guard.__enter__()
        self._guards.append((guard, scope))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._guards:  # pragma: no cover - only if __aenter__ was bypassed
            await self.release()
            return
        guard, scope = self._guards.pop()
        if scope.cancel_called:  # the lease was lost: leave the guard (it raises), then clean up
            try:
                guard.__exit__(exc_type, exc, tb)
            finally:
                await self.release()
            return
        # The usual path: release inside the guard's own scope, shielded from outer cancellation
        # (one cancel scope per acquire+release rather than two).
        scope.shield = True
        try:
            if self._entry is not None:
                await self._leave(shield=False)
        finally:
            guard.__exit__(exc_type, exc, tb)


def store_lock(
    store: Store,
    name: str,
    *,
    lease: LeaseKeeper | None = None,
    config: LeaseConfig | None = None,
    timeout: float | None = None,
    identity: str | None = None,
) -> Lock:
    """The lock ``name`` in ``store``: ``async with store_lock(store, "jobs/42/ckpt") as lock:``.

    See :class:`Lock` for the arguments; ``lock.fencing_token`` is the holder's token.
    """
    return Lock(store, name, lease=lease, config=config, timeout=timeout, identity=identity)
