"""A small software transactional memory on ``store.txn`` (etcd's ``concurrency.NewSTM``).

``await store.stm(fn)`` runs ``fn(tx)``, which reads keys through ``tx.get`` and stages writes
with ``tx.put``/``tx.delete``; then one transaction commits the writes if no key ``fn`` read has
changed since (compares on each key's ``mod_revision``), else ``fn`` runs again on fresh values
(which the failed commit brought back: no extra round trip), at most ``max_attempts`` times.

Isolation: commits are serializable over the keys read (a committed ``fn`` is as if it ran alone
at its commit revision). Reads inside ``fn`` are repeatable and see ``fn``'s own writes; the keys
named in ``keys=`` (and, on a retry, every key the failed attempt read) are read together at
one revision, others when first asked for. Keys written but never read are not checked (etcd's
``RepeatableReads`` level). ``fn`` may run several times: it must have no effects beyond its
return value and what it stages.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from ..errors import TxnConflictError
from ._base import check_key, check_value
from ._txn import Compare, Delete, Get, GetResult, Put
from ._types import KeyValue

if TYPE_CHECKING:
    from ._base import Store

__all__ = ["DEFAULT_MAX_ATTEMPTS", "StmTxn", "run_stm"]

#: How many times ``store.stm`` runs its function before raising ``TxnConflictError``.
DEFAULT_MAX_ATTEMPTS = 32

T = TypeVar("T")


class StmTxn:
    """What an STM function reads and writes through (one attempt of it)."""

    def __init__(self, store: Store, known: dict[str, KeyValue | None]) -> None:
        self._store = store
        self._known = known  # read together at one revision (prefetched, or the last failure)
        #: Every key read, with the key-value as read (``None``: absent): the read set.
        self.reads: dict[str, KeyValue | None] = {}
        #: The staged writes, one per key (the last one staged wins): the write set.
        self.writes: dict[str, Put | Delete] = {}

    async def get(self, key: str) -> bytes | None:
        """The key's value (``None``: absent), or what this function staged for it."""
        check_key(key)
        staged = self.writes.get(key)
        if staged is not None:
            return staged.value if isinstance(staged, Put) else None
        kv = await self._read(key)
        return None if kv is None else kv.value

    async def rev(self, key: str) -> int:
        """The ``mod_revision`` of the key as read (0: absent); staged writes do not count."""
        check_key(key)
        kv = await self._read(key)
        return 0 if kv is None else kv.mod_revision

    def put(self, key: str, value: bytes, *, lease: int = 0) -> None:
        """Stage a write of ``value`` at ``key`` (applied only if the transaction commits)."""
        self.writes[check_key(key)] = Put(key, check_value(value), lease)

    def delete(self, key: str) -> None:
        """Stage the deletion of ``key``."""
        self.writes[check_key(key)] = Delete(key)

    async def _read(self, key: str) -> KeyValue | None:
        if key in self.reads:
            return self.reads[key]
        kv = self._known.pop(key) if key in self._known else await self._store.get(key)
        self.reads[key] = kv
        return kv


async def _read_together(store: Store, keys: list[str]) -> dict[str, KeyValue | None]:
    if not keys:
        return {}
    result = await store.txn(success=[Get(k) for k in keys])
    return {k: r.kv for k, r in zip(keys, result, strict=True) if isinstance(r, GetResult)}


async def run_stm(
    store: Store,
    fn: Callable[[StmTxn], Awaitable[T]],
    keys: Iterable[str],
    max_attempts: int,
) -> T:
    """``store.stm``'s loop (see the module docstring)."""
    known = await _read_together(store, list(dict.fromkeys(check_key(k, "keys[]") for k in keys)))
    read: list[str] = []
    for _ in range(max_attempts):
        tx = StmTxn(store, known)
        value = await fn(tx)
        if not tx.reads and not tx.writes:
            return value
        read = list(tx.reads)
        result = await store.txn(
            compare=[
                Compare.mod_revision(k) == (0 if kv is None else kv.mod_revision)
                for k, kv in tx.reads.items()
            ],
            success=list(tx.writes.values()),
            failure=[Get(k) for k in read],
        )
        if result.succeeded:
            return value
        known = {k: r.kv for k, r in zip(read, result, strict=True) if isinstance(r, GetResult)}
    raise TxnConflictError(max_attempts, tuple(read))
