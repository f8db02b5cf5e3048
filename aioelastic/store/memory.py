"""The in-process memory backend: the embedded default and the reference model of the protocol.

:class:`MemoryEngine` holds the whole state and applies every operation synchronously (so each is
atomic on the event loop); :class:`MemoryStore` is the async :class:`~aioelastic.store.Store` over
it. The HTTP server serves the same engine, so both backends share one implementation of the
semantics. The engine is a facade over its parts, each a module of its own: the key space
(``_memory_keys``), the leases and their timers (``_memory_leases``), the event log and the
watchers it fans out to (``_memory_watch_hub``).

Time comes from the running event loop (``loop.time()``): lease expiries are ``loop.call_at``
deadlines, so under :func:`aioelastic.testing.virtual_time_loop` leases expire without waiting in
real time. Watches wake on the write that concerns them; nothing polls.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult

from ..errors import CompactedError, LeaseNotFoundError, StoreClosedError
from ._base import Store, Watch, check_int
from ._memory_keys import KeySpace
from ._memory_leases import LeaseTable, _Lease
from ._memory_replay import EngineReplay
from ._memory_txn import evaluate_txn
from ._memory_types import EVENTS_LOGGED, WRITES, Commit, EngineState, EngineWork, LeaseChange
from ._memory_watch_hub import WatchHub
from ._memory_watch_hub import _Watcher as _Watcher  # the served watches annotate with it
from ._records import new_txn_result
from ._txn import Compare, Txn, TxnResult
from ._types import (
    CasResult,
    EventType,
    KeyValue,
    LeaseGrant,
    LeaseStatus,
    RangeResult,
    WatchEvent,
)

__all__ = ["Commit", "EngineState", "EngineWork", "LeaseChange", "MemoryEngine", "MemoryStore"]

for _public in (Commit, EngineState, EngineWork, LeaseChange):
    _public.__module__ = __name__

#: Default number of events of history kept for watches before the oldest are compacted.
DEFAULT_HISTORY_LIMIT = 10_000


class MemoryEngine(EngineReplay):
    """The store's state and semantics, synchronous and atomic.

    ``history_limit`` bounds the events kept for watches; older ones are compacted (a watch that
    starts, or falls, below the compacted revision gets :class:`CompactedError`).
    Hooks for persistence and metrics, called synchronously: ``on_commit`` after every write that
    changed something, ``on_lease`` when a lease is granted or ends (after the commit deleting its
    keys), ``on_compact`` with the new compact revision before an explicit :meth:`compact`.
    A hook that raises vetoes the change (a log that cannot be written): the engine is put back as
    it was, nothing is seen by watchers, and the error propagates. A lease that cannot end on its
    expiry stays and is tried again a second later. Snapshots and replay (for persistence) come
    from :class:`~aioelastic.store._memory_replay.EngineReplay`.
    """

    def __init__(self, *, history_limit: int = DEFAULT_HISTORY_LIMIT) -> None:
        check_int(history_limit, "history_limit", minimum=1)
        self.history_limit = history_limit
        # Compact in batches (down to the limit once the log is 1/8 over it) so that trimming
        # the front of the log costs O(1) amortised per write.
        self._compact_at = history_limit + max(1, history_limit // 8)
        self._work = [0, 0, 0, 0, 0]  # the counters of EngineWork, in its field order
        self._leases = LeaseTable(self._end_lease)
        self._keyspace = KeySpace(self._leases.by_id, self._work)
        self._data = self._keyspace.data
        self._hub = WatchHub(self._work)
        self._revision = 0
        self._closed = False
        self.on_commit: list[Callable[[Commit], None]] = []
        self.on_lease: list[Callable[[LeaseChange], None]] = []
        self.on_compact: list[Callable[[int], None]] = []

    # -- introspection

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def compact_revision(self) -> int:
        return self._hub.compact_revision

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._data)

    @property
    def lease_count(self) -> int:
        return len(self._leases)

    @property
    def watcher_count(self) -> int:
        return len(self._hub.watchers)

    def work(self) -> EngineWork:
        """A snapshot of the work counters (see :class:`EngineWork`)."""
        return EngineWork(*self._work)

    # -- reads

    def get(self, key: str) -> KeyValue | None:
        self._check_open()
        return self._data.get(key)

    def range(self, prefix: str, limit: int | None = None) -> RangeResult:
        self._check_open()
        keys, count = self._keyspace.range_keys(prefix, limit)
        data = self._data
        kvs = tuple(data[k] for k in keys)
        return RangeResult(kvs=kvs, revision=self._revision, count=count, more=len(kvs) < count)

    # -- writes

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        self._check_open()
        if lease and lease not in self._leases.by_id:
            raise LeaseNotFoundError(lease)
        self._revision += 1
        kv = self._keyspace.write(key, value, lease, self._revision)
        self._commit((WatchEvent(EventType.PUT, kv),))
        return self._revision

    def delete(self, key: str, prefix: bool = False) -> int:
        self._check_open()
        if prefix:
            keys = self._keyspace.range_keys(key, None)[0]
        else:
            keys = [key] if key in self._data else []
        if keys:
            self._revision += 1
            remove, revision = self._keyspace.remove, self._revision
            self._commit(tuple(remove(k, revision) for k in keys))
        return len(keys)

    def compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, lease: int = 0
    ) -> CasResult:
        self._check_open()
        current = self._data.get(key)
        if (0 if current is None else current.mod_revision) != expected_mod_revision:
            return CasResult(False, self._revision, current)
        if lease and lease not in self._leases.by_id:
            raise LeaseNotFoundError(lease)
        self._revision += 1
        kv = self._keyspace.write(key, value, lease, self._revision)
        self._commit((WatchEvent(EventType.PUT, kv),))
        return CasResult(True, self._revision, kv)

    def compare_and_delete(self, key: str, expected_mod_revision: int) -> CasResult:
        self._check_open()
        current = self._data.get(key)
        if current is None or current.mod_revision != expected_mod_revision:
            return CasResult(False, self._revision, current)
        self._revision += 1
        self._commit((self._keyspace.remove(key, self._revision),))
        return CasResult(True, self._revision, None)

    def compares_hold(self, compares: tuple[Compare, ...]) -> bool:
        """Whether every one of ``compares`` holds now: the branch :meth:`txn` would run, if
        nothing writes in between (the session server decodes only that one)."""
        data = self._data
        for c in compares:  # noqa: SIM110  (a loop, not all() of a generator: one compare, as a rule)
            if not c.holds(data.get(c.key)):
                return False
        return True

    def txn(self, txn: Txn) -> TxnResult:
        """Apply a checked transaction atomically: one revision, one commit of its events."""
        self._check_open()
        revision = self._revision + 1  # the revision its writes get, if it writes anything
        succeeded, events, results, ranged = evaluate_txn(self._keyspace, txn, revision)
        if events:
            self._revision = revision
            self._commit(tuple(events))
        revision = self._revision
        if ranged:
            results = [
                RangeResult(r.kvs, revision, r.count, r.more) if isinstance(r, RangeResult) else r
                for r in results
            ]
        return new_txn_result(succeeded, revision, tuple(results))

    def add(self, key: str, delta: int) -> int:
        self._check_open()
        current = self._data.get(key)
        if current is None:
            total = delta
        else:
            try:
                total = int(current.value.decode("ascii")) + delta
            except (UnicodeDecodeError, ValueError):
                raise ValueError(
                    f"add: the value at {key!r} is not a decimal integer: {current.value[:40]!r}"
                ) from None
        self.put(key, str(total).encode(), current.lease if current is not None else 0)
        return total

    def _commit(self, events: tuple[WatchEvent, ...], ended_lease: int = 0) -> None:
        """Log the current write's events (the hooks may veto it), then tell the watchers."""
        log = self._hub.log
        log.extend(events)
        if self.on_commit:
            commit = Commit(self._revision, events, ended_lease)
            try:
                for callback in self.on_commit:
                    callback(commit)
            except BaseException:
                del log[len(log) - len(events) :]
                self._keyspace.undo_writes()
                self._revision -= 1
                raise
        self._keyspace.undo.clear()
        work = self._work
        work[WRITES] += 1
        work[EVENTS_LOGGED] += len(events)
        if len(log) > self._compact_at:
            self._auto_compact()
        self._hub.publish(events)

    # -- history

    def compact(self, revision: int) -> None:
        """Discard history before ``revision``; watches can start at ``revision`` or later."""
        self._check_open()
        if revision > self._revision:
            raise ValueError(
                f"revision {revision} is in the future (current revision {self._revision})"
            )
        if revision <= self._hub.compact_revision:
            raise CompactedError(revision, self._hub.compact_revision)
        for callback in self.on_compact:
            callback(revision)
        self._hub.drop_before(revision)

    # -- watches

    def add_watcher(self, prefix: str, start_revision: int | None, owner: object) -> _Watcher:
        """Register a watcher; events from ``start_revision`` (default: the next one) on."""
        self._check_open()
        start = self._revision + 1 if start_revision is None else start_revision
        return self._hub.add(prefix, start, owner)

    def remove_watcher(self, watcher: _Watcher) -> None:
        self._hub.remove(watcher)

    def wait(self, watcher: _Watcher) -> asyncio.Future[None]:
        """A future done at a write under ``watcher``'s prefix, or when it fails, is removed or
        its :meth:`_Watcher.wake` is called; done already if it has events left to read."""
        return self._hub.wait(watcher)

    def read_events(self, watcher: _Watcher) -> list[WatchEvent]:
        """Every event for ``watcher`` not yet read (advances its cursor)."""
        return self._hub.read(watcher)

    def events_reader(self) -> Callable[[_Watcher], list[WatchEvent]]:
        """:meth:`read_events` itself, for a reader that calls it for every event of many
        watchers (the session server): the same reads, without this facade's call each."""
        return self._hub.read

    def fail_watchers_of(self, owner: object, error: BaseException) -> None:
        """Fail every watcher registered by ``owner`` (its own only: O(its watchers))."""
        self._hub.fail_owned(owner, error)

    # -- leases

    def lease_grant(self, ttl: float, lease_id: int | None = None) -> LeaseGrant:
        self._check_open()
        leases = self._leases
        last_id = leases.last_id
        lease = leases.add(lease_id, ttl)
        if self.on_lease:
            change = LeaseChange(lease.id, ttl)
            try:
                for callback in self.on_lease:
                    callback(change)
            except BaseException:
                leases.discard(lease)
                leases.last_id = last_id
                raise
        return LeaseGrant(lease.id, ttl)

    def lease_keep_alive(self, lease_id: int) -> float:
        self._check_open()
        return self._leases.keep_alive(lease_id)

    def lease_revoke(self, lease_id: int) -> None:
        self._check_open()
        lease = self._leases.get(lease_id)
        try:
            self._end_lease(lease)
        except BaseException:  # vetoed: the lease stays, with its deadline
            self._leases.schedule(lease)
            raise

    def lease_time_to_live(self, lease_id: int) -> LeaseStatus:
        self._check_open()
        return self._leases.status(lease_id)

    def has_lease(self, lease_id: int) -> bool:
        """Whether lease ``lease_id`` is live (O(1); no snapshot)."""
        return lease_id in self._leases.by_id

    def leases(self) -> list[LeaseStatus]:
        """A snapshot of every live lease."""
        self._check_open()
        return [self._leases.status(lease_id) for lease_id in list(self._leases.by_id)]

    def _end_lease(self, lease: _Lease) -> None:
        leases = self._leases
        leases.discard(lease)
        if lease.keys:
            self._revision += 1
            remove, revision = self._keyspace.remove, self._revision
            try:
                self._commit(tuple(remove(k, revision) for k in sorted(lease.keys)), lease.id)
            except BaseException:  # vetoed: the keys are back; so is the lease
                leases.by_id[lease.id] = lease
                raise
            lease.keys.clear()
        if self.on_lease:
            change = LeaseChange(lease.id, None)
            try:
                for callback in self.on_lease:
                    callback(change)
            except BaseException:  # vetoed after its keys' deletion was recorded: it stays
                leases.by_id[lease.id] = lease
                raise

    # -- lifecycle

    def close(self) -> None:
        """Stop every lease timer and end every watch with :class:`StoreClosedError`."""
        if self._closed:
            return
        self._closed = True
        self._leases.cancel_timers()
        for watcher in self._hub.watchers:
            watcher.fail(StoreClosedError("the store was closed"))


class _MemoryWatch(Watch):
    def __init__(self, store: MemoryStore, prefix: str, start_revision: int | None) -> None:
        super().__init__(prefix, start_revision)
        self._store = store
        self._watcher: _Watcher | None = None
        # the events read and not yet returned, from _at on; an idle watch holds no list
        self._pending: list[WatchEvent] | tuple[()] = ()
        self._at = 0

    @property
    def start_revision(self) -> int:
        if self._watcher is None:
            raise RuntimeError("the watch has not started")
        return self._watcher.min_revision

    async def _start(self) -> None:
        self._store._check_open()
        engine = self._store.engine
        self._watcher = engine.add_watcher(self.prefix, self.requested_revision, self._store)

    async def __anext__(self) -> WatchEvent:
        # Watch.__anext__ and _next in one coroutine: a reader parked here holds one frame, not
        # two (each of 10,000 participants in one process parks one on its control watch)
        if self._closed:
            raise StopAsyncIteration
        if not self._started:
            await self.start()
        watcher = self._watcher
        assert watcher is not None
        pending = self._pending
        if not pending:
            engine = self._store.engine
            while True:
                if self._closed:
                    raise StopAsyncIteration
                pending = engine.read_events(watcher)
                if pending:
                    break
                pending = ()  # (no empty list kept while parked)
                waiter = engine.wait(watcher)
                try:
                    await waiter
                finally:
                    if watcher.waiter is waiter:  # cancelled: not woken, so not dropped
                        watcher.waiter = None
            self._pending, self._at = pending, 0
        at = self._at
        event = pending[at]
        if at + 1 == len(pending):
            self._pending = ()
        else:
            self._at = at + 1
        return event

    _next = __anext__

    # A reader that waits on several things at once (the rendezvous join) takes the events
    # without a task parked in __anext__: the engine calls ``wake`` where it would wake that
    # task (an event under the prefix after none was unread, the watcher's failure or removal).

    def _set_waker(self, wake: Callable[[], None] | None) -> bool:
        """Have ``wake`` called whenever an event or the watch's end becomes ready to take with
        :meth:`_take_event` (``None`` unhooks it); False before the watch has started."""
        watcher = self._watcher
        if watcher is None or not self._started:
            return wake is None
        watcher.on_wake = wake
        return True

    def _event_ready(self) -> bool:
        """Whether :meth:`_take_event` returns an event or raises (events read are kept here,
        in the order ``__anext__`` returns them)."""
        if self._pending or self._closed:
            return True
        watcher = self._watcher
        assert watcher is not None
        if watcher.error is not None:
            return True
        if watcher.hits is not None and not watcher.hits:
            return False  # tracked, nothing unread: no read needed to know
        pending = self._store.engine.read_events(watcher)
        if not pending:
            return False
        self._pending, self._at = pending, 0
        return True

    def _take_event(self) -> WatchEvent | None:
        """The next event without waiting (None: none is ready yet), or the watch's end as
        ``__anext__`` raises it (``StopAsyncIteration`` once closed, the watcher's error)."""
        if not self._event_ready():
            return None
        pending = self._pending
        if pending:
            at = self._at
            if at + 1 == len(pending):
                self._pending = ()
            else:
                self._at = at + 1
            return pending[at]
        if self._closed:
            raise StopAsyncIteration
        watcher = self._watcher
        assert watcher is not None
        assert watcher.error is not None
        raise watcher.error

    async def _aclose(self) -> None:
        if self._watcher is not None:
            self._store.engine.remove_watcher(self._watcher)


_shared_engines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, MemoryEngine]] = (
    weakref.WeakKeyDictionary()
)


def shared_engine(name: str) -> MemoryEngine:
    """The engine named ``name`` in the running event loop (``memory://name`` URLs share it)."""
    loop = asyncio.get_running_loop()
    engines = _shared_engines.setdefault(loop, {})
    engine = engines.get(name)
    if engine is None or engine.closed:
        engine = engines[name] = MemoryEngine()
    return engine


class MemoryStore(Store):
    """An in-process store. ``MemoryStore()`` owns a private engine; pass ``engine=`` to share one.

    Operations complete without suspending, so each is atomic; watches and lease expiry are driven
    by the event loop. Closing the store ends its own watches; a private engine is closed too.
    """

    def __init__(
        self, engine: MemoryEngine | None = None, *, history_limit: int = DEFAULT_HISTORY_LIMIT
    ) -> None:
        super().__init__()
        self._owns_engine = engine is None
        self.engine = engine if engine is not None else MemoryEngine(history_limit=history_limit)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"revision={self.engine.revision}"
        return f"<MemoryStore {state} keys={len(self.engine)}>"

    async def _get(self, key: str) -> KeyValue | None:
        return self.engine.get(key)

    async def _range(self, prefix: str, limit: int | None) -> RangeResult:
        return self.engine.range(prefix, limit)

    async def _current_revision(self) -> int:
        return self.engine.revision

    async def _put(self, key: str, value: bytes, lease: int) -> int:
        return self.engine.put(key, value, lease)

    async def _delete(self, key: str, prefix: bool) -> int:
        return self.engine.delete(key, prefix)

    async def _compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, lease: int
    ) -> CasResult:
        return self.engine.compare_and_swap(key, expected_mod_revision, value, lease)

    async def _compare_and_delete(self, key: str, expected_mod_revision: int) -> CasResult:
        return self.engine.compare_and_delete(key, expected_mod_revision)

    async def _add(self, key: str, delta: int) -> int:
        return self.engine.add(key, delta)

    async def _txn(self, txn: Txn) -> TxnResult:
        return self.engine.txn(txn)

    def _watch(self, prefix: str, start_revision: int | None) -> Watch:
        return _MemoryWatch(self, prefix, start_revision)

    async def _compact(self, revision: int) -> None:
        self.engine.compact(revision)

    async def _lease_grant(self, ttl: float) -> LeaseGrant:
        return self.engine.lease_grant(ttl)

    async def _lease_keep_alive(self, lease_id: int) -> float:
        return self.engine.lease_keep_alive(lease_id)

    async def _lease_revoke(self, lease_id: int) -> None:
        self.engine.lease_revoke(lease_id)

    async def _lease_time_to_live(self, lease_id: int) -> LeaseStatus:
        return self.engine.lease_time_to_live(lease_id)

    async def _aclose(self) -> None:
        if self._owns_engine:
            self.engine.close()
        else:
            self.engine.fail_watchers_of(self, StoreClosedError("the store was closed"))


async def open_memory_store(parts: SplitResult, options: dict[str, Any]) -> MemoryStore:
    """``memory://`` (private store) or ``memory://NAME`` (shared in this event loop)."""
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.port is not None:
        raise ValueError(
            f"memory store URL must be memory:// or memory://NAME, got {parts.geturl()!r}"
        )
    name = parts.netloc
    if name:
        if options:
            raise ValueError(
                f"options {sorted(options)} cannot be given for the shared store {name!r}"
            )
        return MemoryStore(shared_engine(name))
    unknown = set(options) - {"history_limit"}
    if unknown:
        raise TypeError(f"unknown option(s) for the memory store: {sorted(unknown)}")
    return MemoryStore(**options)
