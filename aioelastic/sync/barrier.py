"""Barriers on the store protocol: nobody passes before N parties have entered.

Each party writes its own key under ``name/parties/`` with its lease, so a party that dies is
removed when its lease ends instead of holding everyone forever. The first party to see N
entries at one revision writes ``name/ready``; everyone passes on seeing it. A
:class:`DoubleBarrier` also waits on the way out until every party has left (etcd's recipe).
A barrier name is for one use: pick a new one per round (e.g. ``f"epoch/{n}"``), or
:meth:`Barrier.reset` it once nobody waits.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

import anyio

from ..errors import LeaseExpiredError, StoreConnectionError, StoreError, SyncTimeoutError
from ..store import EventType, KeyValue, LeaseKeeper, Store
from ._common import (
    HeldLease,
    QueueEntry,
    ResumingWatch,
    check_config,
    check_name,
    check_timeout,
    default_identity,
    encode_json,
)
from ._config import LeaseConfig

__all__ = ["Barrier", "DoubleBarrier"]


class Barrier:
    """A one-shot barrier for ``parties`` participants: ``await barrier.wait()``.

    ``wait`` enters (one key under ``name/parties/`` bound to the lease) and returns once
    ``parties`` participants have been present at the same time; it raises
    :class:`~aioelastic.errors.SyncTimeoutError` after ``timeout`` seconds, saying how many had
    entered. A party whose lease ends before the barrier opens no longer counts. ``lease`` /
    ``config`` work as for :class:`~aioelastic.sync.Lock`.
    """

    def __init__(
        self,
        store: Store,
        name: str,
        parties: int,
        *,
        lease: LeaseKeeper | None = None,
        config: LeaseConfig | None = None,
        identity: str | None = None,
    ) -> None:
        if not isinstance(store, Store):
            raise TypeError(f"store must be a Store, got {type(store).__name__}")
        if isinstance(parties, bool) or not isinstance(parties, int):
            raise TypeError(f"parties must be an int, got {type(parties).__name__}")
        if parties < 1:
            raise ValueError(f"parties must be >= 1, got {parties}")
        self.store = store
        self.name = check_name(name)
        self.parties = parties
        self.prefix = self.name + "/"
        self.ready_key = self.prefix + "ready"
        self.parties_prefix = self.prefix + "parties/"
        self.identity = default_identity() if identity is None else str(identity)
        self._lease = HeldLease(store, lease, check_config(config))
        self._entry: QueueEntry | None = None
        self._ready: KeyValue | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} parties={self.parties}>"

    @property
    def passed(self) -> bool:
        """Whether this side has passed the barrier (it opened)."""
        return self._ready is not None

    async def count(self) -> int:
        """How many parties are in the barrier now."""
        return (await self.store.range(self.parties_prefix)).count

    async def _enter(self, timeout: float | None) -> None:
        if self._entry is not None:
            raise RuntimeError(f"already entered the barrier {self.name!r}")
        keeper = await self._lease.open()
        entry = QueueEntry(self.store, self.parties_prefix, keeper.id)
        self._entry = entry
        try:
            await entry.create(self.identity.encode())
            with anyio.move_on_after(timeout) as scope, keeper.guard():
                await self._wait_ready(entry)
            if scope.cancelled_caught:
                raise SyncTimeoutError(
                    f"timed out after {timeout}s at the barrier {self.name!r}: "
                    f"{await self._safe_count()} of {self.parties} parties entered"
                )
        except BaseException:
            await self._exit_entry()
            raise

    async def _safe_count(self) -> str:
        with anyio.move_on_after(5, shield=True):
            try:
                return str(await self.count())
            except StoreError:  # only for the timeout's message: the timeout is the error
                pass
        return "an unknown number"

    async def _wait_ready(self, entry: QueueEntry) -> None:
        present: set[str] = set()

        async def read() -> int:
            snapshot = await self.store.range(self.prefix)
            present.clear()
            for kv in snapshot:
                if kv.key == self.ready_key:
                    self._ready = kv
                elif kv.key.startswith(self.parties_prefix):
                    present.add(kv.key)
            if self._ready is None and entry.key not in present:
                raise LeaseExpiredError(
                    entry.lease_id, f"the barrier key {entry.key!r} was deleted"
                )
            return snapshot.revision

        async with ResumingWatch(
            self.store, self.prefix, f"the barrier {self.name!r}", read
        ) as watch:
            await watch.resync()
            while self._ready is None:
                if len(present) >= self.parties:
                    try:
                        await self._open(present)
                    except StoreConnectionError as exc:
                        # A create-if-absent is safe to repeat: read the state again, and if
                        # the ready key is still missing, write it again.
                        await watch.pause(exc)
                        await watch.resync()
                    continue
                event = await watch.next()
                if event is None:
                    continue  # the state was read again
                key = event.kv.key
                if key == self.ready_key:
                    if event.type is EventType.PUT:
                        self._ready = event.kv
                elif key.startswith(self.parties_prefix):
                    if event.type is EventType.PUT:
                        present.add(key)
                    else:
                        present.discard(key)
                        if key == entry.key:
                            raise LeaseExpiredError(
                                entry.lease_id, f"the barrier key {key!r} was deleted"
                            )

    async def _open(self, present: set[str]) -> None:
        value = encode_json({"parties": self.parties, "present": len(present)}, "ready")
        result = await self.store.compare_and_swap(self.ready_key, 0, value)
        self._ready = result.kv  # ours, or the one another party wrote first

    async def _exit_entry(self) -> None:
        entry, self._entry = self._entry, None
        if entry is not None and self._lease.private:
            entry.kv = None  # revoking the private lease deletes the key in the same write
        with anyio.CancelScope(shield=True):
            if entry is not None:
                await entry.remove()
            await self._lease.aclose()

    async def wait(self, *, timeout: float | None = None) -> None:
        """Enter and wait until ``parties`` have entered; then leave the party list."""
        await self._enter(check_timeout(timeout))
        await self._exit_entry()

    async def reset(self) -> None:
        """Delete the barrier's keys so the name can be used again (only once nobody waits)."""
        await self.store.delete_prefix(self.prefix)


class DoubleBarrier(Barrier):
    """A barrier on the way in and on the way out: ``async with DoubleBarrier(...):``.

    Entering waits until ``parties`` have entered; leaving waits until every party has left
    (a dead party leaves when its lease ends), then removes the barrier's ``ready`` key. Both
    waits take ``timeout`` seconds at most (:class:`~aioelastic.errors.SyncTimeoutError`).
    """

    def __init__(
        self,
        store: Store,
        name: str,
        parties: int,
        *,
        lease: LeaseKeeper | None = None,
        config: LeaseConfig | None = None,
        identity: str | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(store, name, parties, lease=lease, config=config, identity=identity)
        self.timeout = check_timeout(timeout)

    async def enter(self, *, timeout: float | None = None) -> None:
        """Enter and wait until ``parties`` have entered."""
        await self._enter(self.timeout if timeout is None else check_timeout(timeout))

    async def leave(self, *, timeout: float | None = None) -> None:
        """Leave and wait until every party has left."""
        timeout = self.timeout if timeout is None else check_timeout(timeout)
        if self._entry is None:
            raise RuntimeError(f"not in the barrier {self.name!r}")
        await self._exit_entry()
        with anyio.move_on_after(timeout) as scope:
            await self._wait_empty()
        if scope.cancelled_caught:
            raise SyncTimeoutError(
                f"timed out after {timeout}s leaving the barrier {self.name!r}: "
                f"{await self._safe_count()} parties still in it"
            )

    async def _wait_empty(self) -> None:
        present: set[str] = set()

        async def read() -> int:
            snapshot = await self.store.range(self.parties_prefix)
            present.clear()
            present.update(kv.key for kv in snapshot)
            return snapshot.revision

        what = f"leaving the barrier {self.name!r}"
        async with ResumingWatch(self.store, self.parties_prefix, what, read) as watch:
            await watch.resync()
            while present:
                event = await watch.next()
                if event is None:
                    continue  # the state was read again
                if event.type is EventType.PUT:
                    present.add(event.kv.key)
                else:
                    present.discard(event.kv.key)
            ready, self._ready = self._ready, None
            while ready is not None:
                try:  # a delete at a mod revision is safe to repeat
                    await self.store.compare_and_delete(self.ready_key, ready.mod_revision)
                    ready = None
                except StoreConnectionError as exc:
                    await watch.pause(exc)

    async def __aenter__(self) -> Self:
        await self.enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.leave()
        else:  # failing out: do not wait for the others, just stop counting as present
            with anyio.CancelScope(shield=True):
                await self._exit_entry()
