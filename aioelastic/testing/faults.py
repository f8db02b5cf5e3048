"""A fault-injecting store wrapper: partitions, failing calls and added latency, for testing
code that must survive an unreliable store (lease keepers, rendezvous, timers).

It wraps any :class:`~aioelastic.store.Store` and forwards every call, unless told otherwise::

    faulty = FaultInjectingStore(MemoryStore())
    faulty.partition()          # every call now raises StoreConnectionError
    faulty.heal()
    faulty.fail_next("put", WriteOutcomeUnknownError("lost"))   # one call fails
    faulty.latency = 0.05       # every call waits 50 ms first (on the loop's clock)
"""

from __future__ import annotations

from collections import defaultdict, deque

import anyio

from ..errors import StoreConnectionError
from ..store import (
    CasResult,
    KeyValue,
    LeaseGrant,
    LeaseStatus,
    RangeResult,
    Store,
    Watch,
    WatchEvent,
)

__all__ = ["FaultInjectingStore"]


class FaultInjectingStore(Store):
    """Forwards to ``inner``; injects partitions, one-off failures and latency on request."""

    def __init__(self, inner: Store) -> None:
        super().__init__()
        self.inner = inner
        self.features = inner.features
        self.latency = 0.0
        self._partitioned = False
        self._next_failures: defaultdict[str, deque[BaseException]] = defaultdict(deque)
        self.calls: defaultdict[str, int] = defaultdict(int)

    def partition(self) -> None:
        """From now on every call raises :class:`StoreConnectionError` (watches too)."""
        self._partitioned = True

    def heal(self) -> None:
        self._partitioned = False

    def fail_next(self, operation: str, error: BaseException) -> None:
        """Make the next call of ``operation`` (e.g. ``"put"``, ``"lease_keep_alive"``) raise."""
        self._next_failures[operation].append(error)

    async def _enter(self, operation: str) -> None:
        self.calls[operation] += 1
        if self.latency:
            await anyio.sleep(self.latency)
        if self._partitioned:
            raise StoreConnectionError(f"injected partition ({operation})")
        pending = self._next_failures.get(operation)
        if pending:
            raise pending.popleft()

    async def _get(self, key: str) -> KeyValue | None:
        await self._enter("get")
        return await self.inner.get(key)

    async def _range(self, prefix: str, limit: int | None) -> RangeResult:
        await self._enter("range")
        return await self.inner.range(prefix, limit=limit)

    async def _current_revision(self) -> int:
        await self._enter("current_revision")
        return await self.inner.current_revision()

    async def _put(self, key: str, value: bytes, lease: int) -> int:
        await self._enter("put")
        return await self.inner.put(key, value, lease=lease)

    async def _delete(self, key: str, prefix: bool) -> int:
        await self._enter("delete")
        if prefix:
            return await self.inner.delete_prefix(key)
        return await self.inner.delete(key)

    async def _compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, lease: int
    ) -> CasResult:
        await self._enter("compare_and_swap")
        return await self.inner.compare_and_swap(key, expected_mod_revision, value, lease=lease)

    async def _compare_and_delete(self, key: str, expected_mod_revision: int) -> CasResult:
        await self._enter("compare_and_delete")
        return await self.inner.compare_and_delete(key, expected_mod_revision)

    async def _add(self, key: str, delta: int) -> int:
        await self._enter("add")
        return await self.inner.add(key, delta)

    def _watch(self, prefix: str, start_revision: int | None) -> Watch:
        return _FaultyWatch(self, self.inner.watch(prefix, start_revision=start_revision))

    async def _compact(self, revision: int) -> None:
        await self._enter("compact")
        await self.inner.compact(revision)

    async def _lease_grant(self, ttl: float) -> LeaseGrant:
        await self._enter("lease_grant")
        return await self.inner.lease_grant(ttl)

    async def _lease_keep_alive(self, lease_id: int) -> float:
        await self._enter("lease_keep_alive")
        return await self.inner.lease_keep_alive(lease_id)

    async def _lease_revoke(self, lease_id: int) -> None:
        await self._enter("lease_revoke")
        await self.inner.lease_revoke(lease_id)

    async def _lease_time_to_live(self, lease_id: int) -> LeaseStatus:
        await self._enter("lease_time_to_live")
        return await self.inner.lease_time_to_live(lease_id)

    async def _aclose(self) -> None:
        await self.inner.aclose()


class _FaultyWatch(Watch):
    def __init__(self, store: FaultInjectingStore, inner: Watch) -> None:
        super().__init__(inner.prefix, inner.requested_revision)
        self._store = store
        self._inner = inner

    @property
    def start_revision(self) -> int:
        return self._inner.start_revision

    async def _start(self) -> None:
        await self._store._enter("watch")
        await self._inner.start()

    async def _next(self) -> WatchEvent:
        event = await self._inner.__anext__()
        if self._store._partitioned:
            raise StoreConnectionError("injected partition (watch stream)")
        return event

    async def _aclose(self) -> None:
        await self._inner.aclose()
