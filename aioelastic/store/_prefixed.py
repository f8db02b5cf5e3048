"""PrefixedStore: a view of a store in which every key lives under one prefix (a namespace)."""

from __future__ import annotations

from ._base import Store, Watch, check_prefix
from ._txn import (
    Compare,
    Delete,
    DeletePrefix,
    Get,
    GetResult,
    OpResult,
    Put,
    PutResult,
    Range,
    Txn,
    TxnOp,
    TxnResult,
)
from ._types import CasResult, KeyValue, LeaseGrant, LeaseStatus, RangeResult, WatchEvent

__all__ = ["PrefixedStore"]


class PrefixedStore(Store):
    """Keys ``k`` of the view are ``prefix + k`` in the parent store; results are relative.

    Leases, revisions and compaction are the parent's (they are global). Closing the view does not
    close the parent.
    """

    def __init__(self, parent: Store, prefix: str) -> None:
        super().__init__()
        self.parent = parent
        self.prefix = check_prefix(prefix)
        self.features = parent.features

    def __repr__(self) -> str:
        return f"<PrefixedStore {self.prefix!r} of {self.parent!r}>"

    def namespace(self, prefix: str) -> Store:
        return PrefixedStore(self.parent, self.prefix + check_prefix(prefix))

    def _strip(self, kv: KeyValue | None) -> KeyValue | None:
        if kv is None:
            return None
        return KeyValue(
            kv.key[len(self.prefix) :],
            kv.value,
            kv.create_revision,
            kv.mod_revision,
            kv.version,
            kv.lease,
        )

    def _strip_cas(self, result: CasResult) -> CasResult:
        return CasResult(result.succeeded, result.revision, self._strip(result.kv))

    async def _get(self, key: str) -> KeyValue | None:
        return self._strip(await self.parent.get(self.prefix + key))

    async def _range(self, prefix: str, limit: int | None) -> RangeResult:
        if not self.prefix and not prefix:
            return await self.parent.range("", limit=limit)
        result = await self.parent.range(self.prefix + prefix, limit=limit)
        kvs = tuple(kv for kv in map(self._strip, result.kvs) if kv is not None)
        return RangeResult(kvs, result.revision, result.count, result.more)

    async def _current_revision(self) -> int:
        return await self.parent.current_revision()

    async def _put(self, key: str, value: bytes, lease: int) -> int:
        return await self.parent.put(self.prefix + key, value, lease=lease)

    async def _delete(self, key: str, prefix: bool) -> int:
        if prefix:
            return await self.parent.delete_prefix(self.prefix + key)
        return await self.parent.delete(self.prefix + key)

    async def _compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, lease: int
    ) -> CasResult:
        result = await self.parent.compare_and_swap(
            self.prefix + key, expected_mod_revision, value, lease=lease
        )
        return self._strip_cas(result)

    async def _compare_and_delete(self, key: str, expected_mod_revision: int) -> CasResult:
        result = await self.parent.compare_and_delete(self.prefix + key, expected_mod_revision)
        return self._strip_cas(result)

    async def _add(self, key: str, delta: int) -> int:
        return await self.parent.add(self.prefix + key, delta)

    async def _txn(self, txn: Txn) -> TxnResult:
        p = self.prefix
        result = await self.parent.txn(
            compare=[Compare(p + c.key, c.target, c.op, c.operand) for c in txn.compare],
            success=[self._op(op) for op in txn.success],
            failure=[self._op(op) for op in txn.failure],
        )
        results = tuple(self._strip_result(r) for r in result.results)
        return TxnResult(result.succeeded, result.revision, results)

    def _op(self, op: TxnOp) -> TxnOp:
        p = self.prefix
        if isinstance(op, Put):
            return Put(p + op.key, op.value, op.lease)
        if isinstance(op, Get):
            return Get(p + op.key)
        if isinstance(op, Delete):
            return Delete(p + op.key)
        if isinstance(op, Range):
            return Range(p + op.prefix, op.limit)
        return DeletePrefix(p + op.prefix)

    def _strip_result(self, result: OpResult) -> OpResult:
        if isinstance(result, PutResult):
            kv = self._strip(result.kv)
            assert kv is not None
            return PutResult(kv, self._strip(result.prev_kv))
        if isinstance(result, GetResult):
            return GetResult(self._strip(result.kv))
        if isinstance(result, RangeResult):
            kvs = tuple(kv for kv in map(self._strip, result.kvs) if kv is not None)
            return RangeResult(kvs, result.revision, result.count, result.more)
        return result

    def _watch(self, prefix: str, start_revision: int | None) -> Watch:
        inner = self.parent.watch(self.prefix + prefix, start_revision=start_revision)
        return _PrefixedWatch(inner, prefix, len(self.prefix))

    async def _range_and_watch(self, prefix: str) -> tuple[RangeResult, Watch]:
        result, inner = await self.parent.range_and_watch(self.prefix + prefix)
        kvs = tuple(kv for kv in map(self._strip, result.kvs) if kv is not None)
        return (
            RangeResult(kvs, result.revision, result.count, result.more),
            _PrefixedWatch(inner, prefix, len(self.prefix), started=True),
        )

    async def _compact(self, revision: int) -> None:
        await self.parent.compact(revision)

    async def _lease_grant(self, ttl: float) -> LeaseGrant:
        return await self.parent.lease_grant(ttl)

    async def _lease_keep_alive(self, lease_id: int) -> float:
        return await self.parent.lease_keep_alive(lease_id)

    async def _lease_revoke(self, lease_id: int) -> None:
        await self.parent.lease_revoke(lease_id)

    async def _lease_time_to_live(self, lease_id: int) -> LeaseStatus:
        status = await self.parent.lease_time_to_live(lease_id)
        n = len(self.prefix)
        keys = tuple(k[n:] for k in status.keys if k.startswith(self.prefix))
        return LeaseStatus(status.id, status.granted_ttl, status.remaining, keys)

    async def _aclose(self) -> None:
        pass


class _PrefixedWatch(Watch):
    def __init__(self, inner: Watch, prefix: str, strip: int, *, started: bool = False) -> None:
        super().__init__(prefix, inner.requested_revision)
        self._inner = inner
        self._strip = strip
        self._started = started  # wraps a watch already started (range_and_watch)

    @property
    def start_revision(self) -> int:
        return self._inner.start_revision

    async def _start(self) -> None:
        await self._inner.start()

    async def _next(self) -> WatchEvent:
        event = await self._inner.__anext__()
        kv = event.kv
        stripped = KeyValue(
            kv.key[self._strip :],
            kv.value,
            kv.create_revision,
            kv.mod_revision,
            kv.version,
            kv.lease,
        )
        return WatchEvent(event.type, stripped)

    async def _aclose(self) -> None:
        await self._inner.aclose()
