"""A fault-injecting store wrapper, for testing code that must survive an unreliable store (lease
keepers, rendezvous, timers, your orchestrator).

It wraps any :class:`~aioelastic.store.Store` and forwards every call, unless told otherwise::

    faulty = FaultInjectingStore(MemoryStore(), seed=7)
    faulty.partition()          # every call now raises StoreConnectionError
    faulty.heal()
    faulty.fail_next("put", WriteOutcomeUnknownError("lost"))   # one call fails
    faulty.latency = 0.05       # every call waits 50 ms first (on the loop's clock)
    faulty.jitter = 0.02        # ... plus a seeded random 0-20 ms
    faulty.failure_rate = 0.1   # 10% of calls fail (seeded), before reaching the store
    faulty.hang("lease_keep_alive")   # those calls block until release() (or cancellation)
    faulty.drop_watches()       # every open watch raises StoreConnectionError now
    await faulty.expire_lease(lease_id)   # the server ends the lease now, as at its TTL

Several clients of one store, each a "process" with a name, share a :class:`FaultPlan`::

    plan = FaultPlan(seed=1)
    a = plan.client(MemoryStore(engine), "a")
    b = plan.client(MemoryStore(engine), "b")
    plan.partition("a")         # a is cut off from the store (and so from b); b carries on
    plan.heal()

Random faults draw from one ``random.Random(seed)``, so the same seed and the same sequence of
calls inject the same faults; every injected fault is appended to :attr:`FaultInjectingStore.log`.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict, deque
from collections.abc import Iterable
from typing import Any, NamedTuple

import anyio

from ..errors import LeaseNotFoundError, StoreConnectionError
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
from ..store._txn import Txn, TxnResult

__all__ = ["OPERATIONS", "FaultInjectingStore", "FaultPlan", "InjectedFault"]

#: The operation names that faults can target (``"watch"`` is the start of a watch).
OPERATIONS: frozenset[str] = frozenset(
    {
        "get",
        "range",
        "current_revision",
        "put",
        "delete",
        "compare_and_swap",
        "compare_and_delete",
        "txn",
        "add",
        "watch",
        "compact",
        "lease_grant",
        "lease_keep_alive",
        "lease_revoke",
        "lease_time_to_live",
    }
)


def _check_operation(operation: str | None) -> None:
    if operation is not None and operation not in OPERATIONS:
        raise ValueError(f"operation must be one of {sorted(OPERATIONS)}, got {operation!r}")


class InjectedFault(NamedTuple):
    """One entry of :attr:`FaultInjectingStore.log`.

    ``kind`` is one of ``partition``, ``fail_next``, ``random_failure``, ``hang``,
    ``watch_dropped``, ``lease_expired``.
    """

    #: How many calls the client had seen when the fault was injected.
    call: int
    operation: str
    kind: str


class FaultInjectingStore(Store):
    """Forwards to ``inner``; injects partitions, failing or hanging calls, latency, dropped
    watch streams and lease expiry on request, and seeded random failures and jitter.

    ``name`` identifies the client in a :class:`FaultPlan`; ``seed`` seeds :attr:`random` (a
    client of a plan shares the plan's generator). Closing it closes ``inner``.
    """

    def __init__(
        self,
        inner: Store,
        *,
        name: str = "client",
        seed: int | None = None,
        plan: FaultPlan | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.name = name
        self.features = inner.features
        #: Seconds every call waits before it is forwarded (on the loop's clock).
        self.latency = 0.0
        #: Up to this many more seconds, drawn from :attr:`random` per call.
        self.jitter = 0.0
        #: The probability that a call fails with ``StoreConnectionError`` before reaching the
        #: store (never applied, so safe for writes), drawn from :attr:`random` per call.
        self.failure_rate = 0.0
        self.random = plan.random if plan is not None else random.Random(seed)
        self._plan = plan
        self._partitioned = False
        self._next_failures: defaultdict[str, deque[BaseException]] = defaultdict(deque)
        self._hanging: set[str | None] = set()
        self._hang_gate: asyncio.Event | None = None
        self._watches: set[_FaultyWatch] = set()
        self._leases: set[int] = set()
        #: Calls per operation (forwarded or not).
        self.calls: defaultdict[str, int] = defaultdict(int)
        #: Every fault injected, in order.
        self.log: list[InjectedFault] = []

    # -- controls

    @property
    def partitioned(self) -> bool:
        """Whether this client is cut off (by :meth:`partition` or its plan)."""
        return self._partitioned or (self._plan is not None and self.name in self._plan.cut_off)

    def partition(self) -> None:
        """From now on every call raises :class:`StoreConnectionError`, and so does every watch
        on its next event. :meth:`drop_watches` also ends the watches at once."""
        self._partitioned = True

    def heal(self) -> None:
        """End :meth:`partition` (a plan's partition is healed by the plan)."""
        self._partitioned = False

    def fail_next(self, operation: str, error: BaseException) -> None:
        """Make the next call of ``operation`` (e.g. ``"put"``, ``"lease_keep_alive"``) raise
        ``error`` without reaching the store. Several queue up, in order."""
        _check_operation(operation)
        self._next_failures[operation].append(error)

    def hang(self, operation: str | None = None) -> None:
        """Make calls of ``operation`` (every call when ``None``) block until :meth:`release` —
        a server that accepted the connection and never answers. A hung call can be cancelled
        (``anyio.fail_after``, ``task.cancel()``); it never reaches the store."""
        _check_operation(operation)
        self._hanging.add(operation)

    def release(self) -> None:
        """Stop hanging: the calls blocked by :meth:`hang` go on (to the store) now."""
        self._hanging.clear()
        if self._hang_gate is not None:
            self._hang_gate.set()
            self._hang_gate = None

    def drop_watches(self) -> int:
        """Break every open watch's stream: a pending or the next ``__anext__`` raises
        :class:`StoreConnectionError`. New watches work (unless partitioned). Returns how many
        watches were dropped."""
        dropped = [w for w in self._watches if not w._dropped]
        for watch in dropped:
            watch._drop()
        return len(dropped)

    async def expire_lease(self, lease_id: int) -> None:
        """End the lease on the store now, as its TTL running out would: its keys are deleted
        at one revision, watchers see the ``DELETE`` events, and keep-alives then raise
        :class:`~aioelastic.errors.LeaseNotFoundError`. Bypasses this client's faults."""
        self._leases.discard(lease_id)
        self.log.append(InjectedFault(sum(self.calls.values()), "lease_revoke", "lease_expired"))
        await self.inner.lease_revoke(lease_id)

    async def expire_leases(self) -> list[int]:
        """:meth:`expire_lease` for every lease granted through this client and not yet
        revoked (those already gone are skipped). Returns the ids expired."""
        expired = []
        for lease_id in sorted(self._leases):
            try:
                await self.expire_lease(lease_id)
            except LeaseNotFoundError:
                continue
            expired.append(lease_id)
        return expired

    @property
    def granted_leases(self) -> frozenset[int]:
        """Leases granted through this client and not revoked through it."""
        return frozenset(self._leases)

    # -- the gate every call passes

    def _record(self, operation: str, kind: str) -> None:
        self.log.append(InjectedFault(sum(self.calls.values()), operation, kind))

    def _hangs(self, operation: str) -> bool:
        return None in self._hanging or operation in self._hanging

    async def _enter(self, operation: str) -> None:
        self.calls[operation] += 1
        delay = self.latency
        if self.jitter:
            delay += self.random.uniform(0.0, self.jitter)
        if delay:
            await anyio.sleep(delay)
        while self._hangs(operation):
            self._record(operation, "hang")
            if self._hang_gate is None:
                self._hang_gate = asyncio.Event()
            await self._hang_gate.wait()
        if self.partitioned:
            self._record(operation, "partition")
            raise StoreConnectionError(f"injected partition ({self.name}: {operation})")
        pending = self._next_failures.get(operation)
        if pending:
            self._record(operation, "fail_next")
            raise pending.popleft()
        if self.failure_rate and self.random.random() < self.failure_rate:
            self._record(operation, "random_failure")
            raise StoreConnectionError(f"injected failure ({self.name}: {operation})")

    # -- the store core

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

    async def _txn(self, txn: Txn) -> TxnResult:
        await self._enter("txn")
        return await self.inner.txn(compare=txn.compare, success=txn.success, failure=txn.failure)

    def _watch(self, prefix: str, start_revision: int | None) -> Watch:
        return _FaultyWatch(self, self.inner.watch(prefix, start_revision=start_revision))

    async def _compact(self, revision: int) -> None:
        await self._enter("compact")
        await self.inner.compact(revision)

    async def _lease_grant(self, ttl: float) -> LeaseGrant:
        await self._enter("lease_grant")
        grant = await self.inner.lease_grant(ttl)
        self._leases.add(grant.id)
        return grant

    async def _lease_keep_alive(self, lease_id: int) -> float:
        await self._enter("lease_keep_alive")
        return await self.inner.lease_keep_alive(lease_id)

    async def _lease_revoke(self, lease_id: int) -> None:
        await self._enter("lease_revoke")
        await self.inner.lease_revoke(lease_id)
        self._leases.discard(lease_id)

    async def _lease_time_to_live(self, lease_id: int) -> LeaseStatus:
        await self._enter("lease_time_to_live")
        return await self.inner.lease_time_to_live(lease_id)

    async def _aclose(self) -> None:
        self.release()
        await self.inner.aclose()


class _FaultyWatch(Watch):
    def __init__(self, store: FaultInjectingStore, inner: Watch) -> None:
        super().__init__(inner.prefix, inner.requested_revision)
        self._store = store
        self._inner = inner
        self._dropped = False
        self._drop_event = asyncio.Event()
        self._pending: asyncio.Future[WatchEvent] | None = None

    @property
    def start_revision(self) -> int:
        return self._inner.start_revision

    def _drop(self) -> None:
        self._dropped = True
        self._drop_event.set()

    def _fail(self) -> StoreConnectionError:
        self._store._record("watch", "watch_dropped")
        return StoreConnectionError(f"injected dropped watch stream ({self._store.name})")

    async def _start(self) -> None:
        await self._store._enter("watch")
        self._store._watches.add(self)
        await self._inner.start()

    async def _next(self) -> WatchEvent:
        if self._dropped:
            raise self._fail()
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._inner.__anext__())
        dropped = asyncio.ensure_future(self._drop_event.wait())
        waits: list[asyncio.Future[Any]] = [self._pending, dropped]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            dropped.cancel()
        if not self._pending.done():  # dropped while waiting
            self._pending.cancel()
            self._pending = None
            raise self._fail()
        event_future, self._pending = self._pending, None
        event = event_future.result()
        if self._store.partitioned:
            self._store._record("watch", "partition")
            raise StoreConnectionError(f"injected partition ({self._store.name}: watch stream)")
        return event

    async def _aclose(self) -> None:
        self._store._watches.discard(self)
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        await self._inner.aclose()


class FaultPlan:
    """Faults across several named clients of one store, deterministic under ``seed``.

    Each :meth:`client` is a :class:`FaultInjectingStore` (one "process"); they share one
    ``random.Random(seed)``. :meth:`partition` cuts named clients off from the store — and so
    from every other client, since clients talk only through the store — while the rest carry on.
    """

    def __init__(self, seed: int = 0) -> None:
        self.random = random.Random(seed)
        self.clients: dict[str, FaultInjectingStore] = {}
        self.cut_off: set[str] = set()

    def client(self, inner: Store, name: str) -> FaultInjectingStore:
        """Wrap ``inner`` as the client ``name`` (names are unique in a plan)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        if name in self.clients:
            raise ValueError(f"the plan already has a client named {name!r}")
        client = FaultInjectingStore(inner, name=name, plan=self)
        self.clients[name] = client
        return client

    def _known(self, names: Iterable[str]) -> list[str]:
        names = list(names)
        unknown = [n for n in names if n not in self.clients]
        if unknown:
            raise ValueError(f"no client named {unknown} in the plan (have {sorted(self.clients)})")
        return names

    def partition(self, *names: str, drop_watches: bool = True) -> None:
        """Cut the named clients off: their calls raise ``StoreConnectionError``, and (with
        ``drop_watches``) their open watches break now. The other clients are unaffected."""
        for name in self._known(names):
            self.cut_off.add(name)
            if drop_watches:
                self.clients[name].drop_watches()

    def heal(self, *names: str) -> None:
        """Reconnect the named clients (every client when no name is given)."""
        if not names:
            self.cut_off.clear()
        for name in self._known(names):
            self.cut_off.discard(name)

    async def expire_leases(self, *names: str) -> list[int]:
        """Expire every lease the named clients hold (see
        :meth:`FaultInjectingStore.expire_leases`): what the store does to a partitioned
        client once its TTL runs out."""
        expired: list[int] = []
        for name in self._known(names):
            expired += await self.clients[name].expire_leases()
        return expired
