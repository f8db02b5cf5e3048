"""A store backend: the core a backend implements, and the opener that gives it a URL scheme.

``CountingStore`` forwards every core call to another store and counts the calls (a metrics
layer), so the example runs anywhere; a backend of a real server maps the same methods onto its
requests. See docs/howto/store-backend.md.
"""

from __future__ import annotations

from collections import Counter
from typing import Any
from urllib.parse import SplitResult

from aioelastic.store import (
    CasResult,
    KeyValue,
    LeaseGrant,
    LeaseStatus,
    RangeResult,
    Store,
    Txn,
    TxnResult,
    Watch,
    WatchEvent,
    open_store,
    register_backend,
)


# --8<-- [start:watch]
class CountingWatch(Watch):
    """The watch handle: establish the stream in ``_start``, one event per ``_next``."""

    def __init__(self, inner: Watch, prefix: str, start_revision: int | None) -> None:
        super().__init__(prefix, start_revision)
        self._inner = inner

    @property
    def start_revision(self) -> int:
        return self._inner.start_revision  # known once started

    async def _start(self) -> None:
        await self._inner.start()  # return only once a later write is sure to be seen

    async def _next(self) -> WatchEvent:
        return await self._inner.__anext__()

    async def _aclose(self) -> None:
        await self._inner.aclose()


# --8<-- [end:watch]


# --8<-- [start:store]
class CountingStore(Store):
    """Every core method, forwarded to ``inner`` and counted in :attr:`calls`.

    The public methods of :class:`Store` have already checked the arguments and that the store
    is open when a core method runs; ``add``, ``wait_for``, ``lease``, ``namespace`` and
    ``range_and_watch`` are built on the core and come for free.
    """

    def __init__(self, inner: Store) -> None:
        super().__init__()
        self.inner = inner
        self.features = inner.features  # the optional features (ALL_FEATURES) it keeps
        self.calls: Counter[str] = Counter()

    # reads
    async def _get(self, key: str) -> KeyValue | None:
        self.calls["get"] += 1
        return await self.inner.get(key)

    async def _range(self, prefix: str, limit: int | None) -> RangeResult:
        self.calls["range"] += 1
        return await self.inner.range(prefix, limit=limit)

    async def _current_revision(self) -> int:
        self.calls["current_revision"] += 1
        return await self.inner.current_revision()

    # writes: each returns the new revision (a no-op write returns the current one)
    async def _put(self, key: str, value: bytes, lease: int) -> int:
        self.calls["put"] += 1
        return await self.inner.put(key, value, lease=lease)

    async def _delete(self, key: str, prefix: bool) -> int:
        self.calls["delete"] += 1
        if prefix:
            return await self.inner.delete_prefix(key)
        return await self.inner.delete(key)

    async def _compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, lease: int
    ) -> CasResult:
        self.calls["compare_and_swap"] += 1
        return await self.inner.compare_and_swap(key, expected_mod_revision, value, lease=lease)

    async def _compare_and_delete(self, key: str, expected_mod_revision: int) -> CasResult:
        self.calls["compare_and_delete"] += 1
        return await self.inner.compare_and_delete(key, expected_mod_revision)

    # the transaction: compare, then one list of operations or the other, at one revision
    async def _txn(self, txn: Txn) -> TxnResult:
        self.calls["txn"] += 1
        return await self.inner.txn(compare=txn.compare, success=txn.success, failure=txn.failure)

    # watches and history
    def _watch(self, prefix: str, start_revision: int | None) -> Watch:
        self.calls["watch"] += 1
        inner = self.inner.watch(prefix, start_revision=start_revision)
        return CountingWatch(inner, prefix, start_revision)

    async def _compact(self, revision: int) -> None:
        self.calls["compact"] += 1
        await self.inner.compact(revision)

    # leases
    async def _lease_grant(self, ttl: float) -> LeaseGrant:
        self.calls["lease_grant"] += 1
        return await self.inner.lease_grant(ttl)

    async def _lease_keep_alive(self, lease_id: int) -> float:
        self.calls["lease_keep_alive"] += 1
        return await self.inner.lease_keep_alive(lease_id)

    async def _lease_revoke(self, lease_id: int) -> None:
        self.calls["lease_revoke"] += 1
        await self.inner.lease_revoke(lease_id)

    async def _lease_time_to_live(self, lease_id: int) -> LeaseStatus:
        self.calls["lease_time_to_live"] += 1
        return await self.inner.lease_time_to_live(lease_id)

    # closing: pending watches end with StoreClosedError (the inner store's close ends them)
    async def _aclose(self) -> None:
        await self.inner.aclose()


# --8<-- [end:store]


# --8<-- [start:opener]
async def open_counting_store(parts: SplitResult, options: dict[str, Any]) -> CountingStore:
    """``counting://`` (a private memory store) or ``counting://NAME`` (the shared one NAME)."""
    inner = await open_store(f"memory://{parts.netloc}", **options)
    return CountingStore(inner)


def register() -> None:
    """``open_store("counting://...")``; the string form imports this module on first use."""
    register_backend("counting", "counting_store:open_counting_store")


# --8<-- [end:opener]
