"""The in-process memory backend: the embedded default and the reference model of the protocol.

:class:`MemoryEngine` holds the whole state and applies every operation synchronously (so each is
atomic on the event loop); :class:`MemoryStore` is the async :class:`~aioelastic.store.Store` over
it. The HTTP server serves the same engine, so both backends share one implementation of the
semantics.

Time comes from the running event loop (``loop.time()``): lease expiries are ``loop.call_at``
deadlines, so under :func:`aioelastic.testing.virtual_time_loop` leases expire without waiting in
real time. Watches wake on the write that concerns them; nothing polls.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult

from ..errors import CompactedError, LeaseNotFoundError, StoreClosedError
from ._base import Store, Watch, check_int, prefix_end
from ._txn import (
    Delete,
    DeletePrefix,
    DeleteResult,
    Get,
    GetResult,
    OpResult,
    Put,
    PutResult,
    Range,
    Txn,
    TxnResult,
)
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

_TIMER_CONTEXT = contextvars.Context()

#: Default number of events of history kept for watches before the oldest are compacted.
DEFAULT_HISTORY_LIMIT = 10_000


@dataclass(eq=False, slots=True)
class _Lease:
    id: int
    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)
    handle: asyncio.TimerHandle | None = None


class _Watcher:
    """One registered watch on the engine: a cursor into the event log and a wake-up future."""

    __slots__ = ("cursor", "error", "hits", "min_revision", "on_wake", "owner", "prefix", "waiter")

    def __init__(self, prefix: str, cursor: int, min_revision: int, owner: object) -> None:
        self.prefix = prefix
        self.cursor = cursor  # absolute index into the event log of the next event to read
        self.min_revision = min_revision
        self.owner = owner
        self.waiter: asyncio.Future[None] | None = None
        #: called (synchronously, inside the write; it must be cheap and never raise) where the
        #: waiter would be woken: a reader that serves many watchers (the session server) gets
        #: told which ones have something, without a task parked on each
        self.on_wake: Callable[[], None] | None = None
        self.error: BaseException | None = None
        # While tracked (see MemoryEngine._tracked): the absolute log indexes of its unread
        # events, exactly; None while it must scan the log from its cursor instead.
        self.hits: list[int] | None = None

    def matches(self, key: str) -> bool:
        return key.startswith(self.prefix)

    def wake(self) -> None:
        on_wake = self.on_wake
        if on_wake is not None:
            on_wake()
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.wake()


@dataclass(frozen=True, slots=True)
class EngineWork:
    """How much work an engine has done since it was created: counters for white-box tests of
    scaling (see ``tests/test_scale_work.py``) and for benchmarks.

    ``writes``: commits (revisions written); ``events_logged``: events they produced;
    ``events_delivered``: events handed to watchers by reads; ``watcher_visits``: watchers a
    write, a compaction or a close looked at; ``keys_scanned``: keys read by ranges and prefix
    deletes, and log entries a watcher catching up from the past read.
    """

    writes: int = 0
    events_logged: int = 0
    events_delivered: int = 0
    watcher_visits: int = 0
    keys_scanned: int = 0


@dataclass(frozen=True, slots=True)
class Commit:
    """What one write changed: the new revision and its events (for persistence and metrics).

    ``ended_lease``: the lease whose end deleted these keys (its :class:`LeaseChange` follows),
    so that a log can record both at once.
    """

    revision: int
    events: tuple[WatchEvent, ...]
    ended_lease: int = 0


@dataclass(frozen=True, slots=True)
class LeaseChange:
    """A lease was granted (``ttl`` set) or ended by revoke or expiry (``ttl`` is ``None``).

    An ending lease's key deletions are reported by the :class:`Commit` that precedes this.
    """

    id: int
    ttl: float | None


@dataclass(frozen=True, slots=True)
class EngineState:
    """A complete image of an engine, for snapshots: restore it with :meth:`MemoryEngine.restore`.

    ``history`` is the event log kept for watches (from ``compact_revision`` on); ``leases`` maps
    lease id to granted TTL (their deadlines restart on restore, as etcd does on leader change).
    """

    revision: int
    compact_revision: int
    kvs: tuple[KeyValue, ...]
    history: tuple[WatchEvent, ...]
    leases: dict[int, float]
    last_lease_id: int


class MemoryEngine:
    """The store's state and semantics, synchronous and atomic.

    ``history_limit`` bounds the events kept for watches; older ones are compacted (a watch that
    starts, or falls, below the compacted revision gets :class:`CompactedError`).
    Hooks for persistence and metrics, called synchronously: ``on_commit`` after every write that
    changed something, ``on_lease`` when a lease is granted or ends (after the commit deleting its
    keys), ``on_compact`` with the new compact revision before an explicit :meth:`compact`.
    A hook that raises vetoes the change (a log that cannot be written): the engine is put back as
    it was, nothing is seen by watchers, and the error propagates. A lease that cannot end on its
    expiry stays and is tried again a second later.
    """

    def __init__(self, *, history_limit: int = DEFAULT_HISTORY_LIMIT) -> None:
        check_int(history_limit, "history_limit", minimum=1)
        self.history_limit = history_limit
        # Compact in batches (down to the limit once the log is 1/8 over it) so that trimming
        # the front of the log costs O(1) amortised per write.
        self._compact_at = history_limit + max(1, history_limit // 8)
        self._data: dict[str, KeyValue] = {}
        self._keys: list[str] = []  # sorted
        self._revision = 0
        self._compact_revision = 0
        self._log: list[WatchEvent] = []
        self._log_base = 0  # absolute index of _log[0]
        self._watchers: set[_Watcher] = set()
        self._owned: dict[int, set[_Watcher]] = {}  # by id(owner): fail_watchers_of is O(own)
        # Watchers whose unread events are known exactly ("tracked"), by prefix: a write looks
        # only at the prefixes it concerns (at a cost that grows with the number of distinct
        # tracked prefixes or with the key's length, whichever is smaller), appends its index to
        # those watchers' hits and wakes those that had none. So reading costs a watcher the
        # events under its prefix, not every event written since it last read. A watcher that
        # starts in the past scans the log once, then is tracked.
        self._tracked: dict[str, set[_Watcher]] = {}
        # Registered watchers that are not tracked (they scan the log from their cursor), and,
        # in log order, (index, watcher, hits) each time a tracked watcher got its first unread
        # event: a compaction looks at those two only (O(1) amortised per event), not at
        # every watcher. An entry is stale once the watcher has read (its hits list replaced).
        self._scanning: set[_Watcher] = set()
        self._first_unread: deque[tuple[int, _Watcher, list[int]]] = deque()
        self._work = [0, 0, 0, 0, 0]  # the counters of EngineWork, in its field order
        self._leases: dict[int, _Lease] = {}
        self._last_lease_id = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._undo: list[tuple[str, KeyValue | None]] = []  # the current write's old values
        self.on_commit: list[Callable[[Commit], None]] = []
        self.on_lease: list[Callable[[LeaseChange], None]] = []
        self.on_compact: list[Callable[[int], None]] = []

    # -- introspection

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def compact_revision(self) -> int:
        return self._compact_revision

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
        return len(self._watchers)

    def work(self) -> EngineWork:
        """A snapshot of the work counters (see :class:`EngineWork`)."""
        return EngineWork(*self._work)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the memory store engine is closed")

    def _time(self) -> float:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop.time()

    # -- reads

    def get(self, key: str) -> KeyValue | None:
        self._check_open()
        return self._data.get(key)

    def range(self, prefix: str, limit: int | None = None) -> RangeResult:
        self._check_open()
        lo = bisect.bisect_left(self._keys, prefix)
        end = prefix_end(prefix)
        hi = len(self._keys) if end is None else bisect.bisect_left(self._keys, end, lo)
        count = hi - lo
        take = count if limit is None else min(count, limit)
        self._work[4] += take
        kvs = tuple(self._data[k] for k in self._keys[lo : lo + take])
        return RangeResult(kvs=kvs, revision=self._revision, count=count, more=take < count)

    # -- writes

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        self._check_open()
        if lease and lease not in self._leases:
            raise LeaseNotFoundError(lease)
        self._revision += 1
        kv = self._write(key, value, lease)
        self._commit((WatchEvent(EventType.PUT, kv),))
        return self._revision

    def delete(self, key: str, prefix: bool = False) -> int:
        self._check_open()
        if prefix:
            keys = [kv.key for kv in self.range(key).kvs]
        else:
            keys = [key] if key in self._data else []
        if keys:
            self._revision += 1
            self._commit(tuple(self._remove(k) for k in keys))
        return len(keys)

    def compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, lease: int = 0
    ) -> CasResult:
        self._check_open()
        current = self._data.get(key)
        if (0 if current is None else current.mod_revision) != expected_mod_revision:
            return CasResult(False, self._revision, current)
        if lease and lease not in self._leases:
            raise LeaseNotFoundError(lease)
        self._revision += 1
        kv = self._write(key, value, lease)
        self._commit((WatchEvent(EventType.PUT, kv),))
        return CasResult(True, self._revision, kv)

    def compare_and_delete(self, key: str, expected_mod_revision: int) -> CasResult:
        self._check_open()
        current = self._data.get(key)
        if current is None or current.mod_revision != expected_mod_revision:
            return CasResult(False, self._revision, current)
        self._revision += 1
        self._commit((self._remove(key),))
        return CasResult(True, self._revision, None)

    def txn(self, txn: Txn) -> TxnResult:
        """Apply a checked transaction atomically: one revision, one commit of its events."""
        self._check_open()
        data = self._data
        succeeded = all(c.holds(data.get(c.key)) for c in txn.compare)
        ops = txn.success if succeeded else txn.failure
        for op in ops:  # refuse before applying anything, as etcd does
            if isinstance(op, Put) and op.lease and op.lease not in self._leases:
                raise LeaseNotFoundError(op.lease)
        self._revision += 1  # the revision its writes get; taken back if it writes nothing
        events: list[WatchEvent] = []
        results: list[OpResult] = []
        for op in ops:
            if isinstance(op, Put):
                prev = data.get(op.key)
                kv = self._write(op.key, op.value, op.lease)
                events.append(WatchEvent(EventType.PUT, kv))
                results.append(PutResult(kv, prev))
            elif isinstance(op, Get):
                results.append(GetResult(data.get(op.key)))
            elif isinstance(op, Range):
                results.append(self.range(op.prefix, op.limit))
            elif isinstance(op, Delete):
                gone = [self._remove(op.key)] if op.key in data else []
                events += gone
                results.append(DeleteResult(len(gone)))
            else:
                assert isinstance(op, DeletePrefix)
                gone = [self._remove(kv.key) for kv in self.range(op.prefix).kvs]
                events += gone
                results.append(DeleteResult(len(gone)))
        if events:
            self._commit(tuple(events))
        else:
            self._revision -= 1
        revision = self._revision
        results = [
            RangeResult(r.kvs, revision, r.count, r.more) if isinstance(r, RangeResult) else r
            for r in results
        ]
        return TxnResult(succeeded, revision, tuple(results))

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

    def _write(self, key: str, value: bytes, lease: int) -> KeyValue:
        old = self._data.get(key)
        self._undo.append((key, old))
        if old is None:
            bisect.insort(self._keys, key)
            kv = KeyValue(key, value, self._revision, self._revision, 1, lease)
        else:
            if old.lease and old.lease != lease and (held := self._leases.get(old.lease)):
                held.keys.discard(key)
            kv = KeyValue(key, value, old.create_revision, self._revision, old.version + 1, lease)
        if lease:
            self._leases[lease].keys.add(key)
        self._data[key] = kv
        return kv

    def _remove(self, key: str) -> WatchEvent:
        old = self._data.pop(key)
        self._undo.append((key, old))
        del self._keys[bisect.bisect_left(self._keys, key)]
        if old.lease and (held := self._leases.get(old.lease)):
            held.keys.discard(key)
        return WatchEvent(EventType.DELETE, KeyValue(key, b"", 0, self._revision, 0, 0))

    def _commit(self, events: tuple[WatchEvent, ...], ended_lease: int = 0) -> None:
        self._log.extend(events)
        if self.on_commit:
            commit = Commit(self._revision, events, ended_lease)
            try:
                for callback in self.on_commit:
                    callback(commit)
            except BaseException:
                del self._log[len(self._log) - len(events) :]
                self._undo_writes()
                raise
        self._undo.clear()
        work = self._work
        work[0] += 1
        work[1] += len(events)
        if len(self._log) > self._compact_at:
            self._auto_compact()
        tracked = self._tracked
        first_unread = self._first_unread
        first = self._log_base + len(self._log) - len(events)  # absolute index of events[0]
        for index, event in enumerate(events, first):
            if not tracked:
                break
            key = event.kv.key
            if len(tracked) > len(key):  # look the key's own prefixes up instead
                prefixes = [p for p in (key[:i] for i in range(len(key) + 1)) if p in tracked]
            else:
                prefixes = [p for p in tracked if key.startswith(p)]
            for prefix in prefixes:
                watchers = tracked[prefix]
                work[3] += len(watchers)
                for watcher in watchers:
                    hits = watcher.hits
                    assert hits is not None
                    hits.append(index)
                    if len(hits) == 1:
                        first_unread.append((index, watcher, hits))
                        watcher.wake()

    def _undo_writes(self) -> None:
        """Put back what the current write changed (a hook vetoed it), revision included."""
        undo, self._undo = self._undo, []
        for key, old in reversed(undo):
            current = self._data.get(key)
            if current is not None and current.lease and (held := self._leases.get(current.lease)):
                held.keys.discard(key)
            if old is None:
                if current is not None:
                    del self._data[key]
                    del self._keys[bisect.bisect_left(self._keys, key)]
                continue
            if current is None:
                bisect.insort(self._keys, key)
            self._data[key] = old
            if old.lease and (held := self._leases.get(old.lease)):
                held.keys.add(key)
        self._revision -= 1

    # -- history

    def compact(self, revision: int) -> None:
        """Discard history before ``revision``; watches can start at ``revision`` or later."""
        self._check_open()
        if revision > self._revision:
            raise ValueError(
                f"revision {revision} is in the future (current revision {self._revision})"
            )
        if revision <= self._compact_revision:
            raise CompactedError(revision, self._compact_revision)
        for callback in self.on_compact:
            callback(revision)
        self._drop_history_before(revision)

    def _auto_compact(self) -> None:
        excess = len(self._log) - self.history_limit
        # Drop whole revisions only, and never the newest one (a watch must be able to start
        # at the current revision even if its events alone exceed the limit).
        cut_revision = min(self._log[excess - 1].kv.mod_revision + 1, self._revision)
        if cut_revision > self._compact_revision:
            self._drop_history_before(cut_revision)

    def _drop_history_before(self, revision: int) -> None:
        drop = bisect.bisect_left(self._log, revision, key=_event_revision)
        cut = self._log_base + drop  # absolute index of the first event kept
        # A watcher loses something only if an unread event goes: a scanning one whose cursor
        # is before the cut, a tracked one whose first unread event is (a tracked watcher
        # with nothing unread loses nothing; its cursor is set when it stops being tracked).
        lost = [w for w in self._scanning if w.cursor < cut]
        first_unread = self._first_unread
        while first_unread and first_unread[0][0] < cut:
            _, watcher, hits = first_unread.popleft()
            if watcher.hits is hits and watcher in self._watchers:  # not read since
                lost.append(watcher)
        self._work[3] += len(self._scanning) + len(lost)
        for watcher in lost:
            if watcher.error is None:
                first = watcher.cursor if watcher.hits is None else watcher.hits[0]
                unread = self._log[first - self._log_base].kv.mod_revision
                watcher.fail(CompactedError(max(unread, watcher.min_revision), revision))
        if drop:
            del self._log[:drop]
            self._log_base += drop
        self._compact_revision = revision

    # -- watches

    def add_watcher(self, prefix: str, start_revision: int | None, owner: object) -> _Watcher:
        """Register a watcher; events from ``start_revision`` (default: the next one) on."""
        self._check_open()
        if start_revision is None:
            start_revision = self._revision + 1
        if start_revision < self._compact_revision:
            raise CompactedError(start_revision, self._compact_revision)
        offset = bisect.bisect_left(self._log, start_revision, key=_event_revision)
        watcher = _Watcher(prefix, self._log_base + offset, start_revision, owner)
        self._watchers.add(watcher)
        self._owned.setdefault(id(owner), set()).add(watcher)
        if watcher.cursor == self._log_base + len(self._log):
            self._track(watcher)
        else:
            self._scanning.add(watcher)
        return watcher

    def remove_watcher(self, watcher: _Watcher) -> None:
        if watcher in self._watchers:
            self._watchers.remove(watcher)
            owned = self._owned[id(watcher.owner)]
            owned.discard(watcher)
            if not owned:
                del self._owned[id(watcher.owner)]
        self._scanning.discard(watcher)
        self._untrack(watcher)
        watcher.wake()

    async def wait(self, watcher: _Watcher) -> None:
        """Wait until a write under ``watcher``'s prefix, or until it fails, is removed or its
        :meth:`_Watcher.wake` is called. Returns at once if it has events left to read."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        waiter = watcher.waiter = self._loop.create_future()
        idle = watcher.hits is not None and not watcher.hits
        if not idle or watcher.error is not None or watcher not in self._watchers:
            waiter.set_result(None)
        try:
            await waiter
        finally:
            watcher.waiter = None

    def _track(self, watcher: _Watcher) -> None:
        """From now on, writes under its prefix record themselves in ``watcher.hits``."""
        watcher.hits = []
        self._tracked.setdefault(watcher.prefix, set()).add(watcher)

    def _untrack(self, watcher: _Watcher) -> None:
        """Stop tracking: from now on it scans the log from its cursor, its first unread event
        (or the end of the log if it had none)."""
        hits = watcher.hits
        if hits is None:
            return
        watcher.cursor = hits[0] if hits else self._log_base + len(self._log)
        watcher.hits = None
        same = self._tracked.get(watcher.prefix)
        if same is not None:
            same.discard(watcher)
            if not same:
                del self._tracked[watcher.prefix]

    def read_events(self, watcher: _Watcher) -> list[WatchEvent]:
        """Every event for ``watcher`` not yet read (advances its cursor)."""
        if watcher.error is not None:
            raise watcher.error
        log, base = self._log, self._log_base
        minimum = watcher.min_revision
        hits = watcher.hits
        if hits is not None:  # tracked: its unread events are known
            watcher.cursor = base + len(log)
            if not hits:
                return []
            watcher.hits = []
            events = [log[index - base] for index in hits]
            if events[0].revision < minimum:  # a watch that starts at a future revision
                events = [e for e in events if e.revision >= minimum]
            self._work[2] += len(events)
            return events
        start = watcher.cursor - base
        if start < 0:  # pragma: no cover - _drop_history_before fails such watchers first
            raise CompactedError(minimum, self._compact_revision)
        watcher.cursor = base + len(log)
        if watcher in self._watchers:
            self._scanning.discard(watcher)
            self._track(watcher)  # caught up: writes under its prefix are recorded from here
        prefix = watcher.prefix
        self._work[4] += len(log) - start
        events = [e for e in log[start:] if e.kv.key.startswith(prefix) and e.revision >= minimum]
        self._work[2] += len(events)
        return events

    # -- leases

    def lease_grant(self, ttl: float, lease_id: int | None = None) -> LeaseGrant:
        self._check_open()
        last_lease_id = self._last_lease_id
        if lease_id is None:
            self._last_lease_id += 1
            lease_id = self._last_lease_id
        elif lease_id in self._leases:
            raise ValueError(f"lease {lease_id:#x} already exists")
        else:
            self._last_lease_id = max(self._last_lease_id, lease_id)
        lease = _Lease(lease_id, ttl, self._time() + ttl)
        self._leases[lease_id] = lease
        self._schedule(lease)
        if self.on_lease:
            change = LeaseChange(lease_id, ttl)
            try:
                for callback in self.on_lease:
                    callback(change)
            except BaseException:
                del self._leases[lease_id]
                if lease.handle is not None:
                    lease.handle.cancel()
                self._last_lease_id = last_lease_id
                raise
        return LeaseGrant(lease_id, ttl)

    def lease_keep_alive(self, lease_id: int) -> float:
        self._check_open()
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseNotFoundError(lease_id)
        lease.deadline = self._time() + lease.ttl
        return lease.ttl

    def lease_revoke(self, lease_id: int) -> None:
        self._check_open()
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseNotFoundError(lease_id)
        try:
            self._end_lease(lease)
        except BaseException:  # vetoed: the lease stays, with its deadline
            self._schedule(lease)
            raise

    def lease_time_to_live(self, lease_id: int) -> LeaseStatus:
        self._check_open()
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseNotFoundError(lease_id)
        remaining = max(0.0, lease.deadline - self._time())
        return LeaseStatus(lease.id, lease.ttl, remaining, tuple(sorted(lease.keys)))

    def leases(self) -> list[LeaseStatus]:
        """A snapshot of every live lease."""
        return [self.lease_time_to_live(lease_id) for lease_id in list(self._leases)]

    def _schedule(self, lease: _Lease) -> None:
        assert self._loop is not None
        # in a context of its own: the expiry needs none of the granting caller's (and a copy
        # of it per lease would be one more object per lease for the garbage collector)
        lease.handle = self._loop.call_at(
            lease.deadline, self._on_lease_timer, lease, context=_TIMER_CONTEXT
        )

    def _on_lease_timer(self, lease: _Lease) -> None:
        if self._leases.get(lease.id) is not lease:
            return
        if self._time() < lease.deadline:  # kept alive since: sleep until the new deadline
            self._schedule(lease)
            return
        try:
            self._end_lease(lease)
        except Exception:  # a hook vetoed it (the log cannot be written): the lease stays
            assert self._loop is not None
            lease.handle = self._loop.call_later(1.0, self._on_lease_timer, lease)

    def _end_lease(self, lease: _Lease) -> None:
        del self._leases[lease.id]
        if lease.handle is not None:
            lease.handle.cancel()
        if lease.keys:
            self._revision += 1
            try:
                self._commit(tuple(self._remove(k) for k in sorted(lease.keys)), lease.id)
            except BaseException:  # vetoed: the keys are back; so is the lease
                self._leases[lease.id] = lease
                raise
            lease.keys.clear()
        if self.on_lease:
            change = LeaseChange(lease.id, None)
            try:
                for callback in self.on_lease:
                    callback(change)
            except BaseException:  # vetoed after its keys' deletion was recorded: it stays
                self._leases[lease.id] = lease
                raise

    # -- snapshots and replay (persistence); none of these calls the hooks

    def export_state(self) -> EngineState:
        """A complete image of the engine (see :class:`EngineState`)."""
        self._check_open()
        return EngineState(
            revision=self._revision,
            compact_revision=self._compact_revision,
            kvs=tuple(self._data[k] for k in self._keys),
            history=tuple(self._log),
            leases={lease.id: lease.ttl for lease in self._leases.values()},
            last_lease_id=self._last_lease_id,
        )

    def restore(self, state: EngineState) -> None:
        """Load ``state`` into this fresh engine; leases get a full TTL from now."""
        self._check_open()
        if self._revision or self._data or self._leases or self._log:
            raise RuntimeError("restore() needs a fresh engine")
        self._revision = state.revision
        self._compact_revision = state.compact_revision
        self._last_lease_id = state.last_lease_id
        for lease_id, ttl in sorted(state.leases.items()):
            self.restore_lease(lease_id, ttl)
        for kv in state.kvs:
            self._data[kv.key] = kv
            if kv.lease and kv.lease in self._leases:
                self._leases[kv.lease].keys.add(kv.key)
        self._keys = sorted(self._data)
        self._log = list(state.history)
        self._log_base = 0

    def restore_commit(self, commit: Commit) -> None:
        """Re-apply a logged :class:`Commit` exactly (same revision, same key-values)."""
        self._check_open()
        if commit.revision <= self._revision:
            raise ValueError(
                f"commit revision {commit.revision} is not after the engine's {self._revision}"
            )
        self._revision = commit.revision
        for event in commit.events:
            key = event.kv.key
            if event.type is EventType.PUT:
                old = self._data.get(key)
                if old is None:
                    bisect.insort(self._keys, key)
                elif old.lease and (held := self._leases.get(old.lease)):
                    held.keys.discard(key)
                self._data[key] = event.kv
                if event.kv.lease and (held := self._leases.get(event.kv.lease)):
                    held.keys.add(key)
            elif key in self._data:
                self._remove(key)
        # restores run before anyone watches; should one not, wake them all to scan the log
        for watchers in list(self._tracked.values()):
            for watcher in list(watchers):
                self._untrack(watcher)
                self._scanning.add(watcher)
                watcher.wake()
        self._log.extend(commit.events)
        self._undo.clear()
        if len(self._log) > self._compact_at:
            self._auto_compact()

    def restore_lease(self, lease_id: int, ttl: float) -> None:
        """Re-create a logged lease with a full TTL from now (its keys come with their commits)."""
        self._check_open()
        lease = _Lease(lease_id, ttl, self._time() + ttl)
        self._leases[lease_id] = lease
        self._last_lease_id = max(self._last_lease_id, lease_id)
        self._schedule(lease)

    def restore_lease_end(self, lease_id: int) -> None:
        """Forget a logged lease that ended (its key deletions were logged before this)."""
        lease = self._leases.pop(lease_id, None)
        if lease is not None and lease.handle is not None:
            lease.handle.cancel()

    def restore_compact(self, revision: int) -> None:
        """Re-apply a logged explicit compaction."""
        if revision > self._compact_revision:
            self._drop_history_before(revision)

    # -- lifecycle

    def close(self) -> None:
        """Stop every lease timer and end every watch with :class:`StoreClosedError`."""
        if self._closed:
            return
        self._closed = True
        for lease in self._leases.values():
            if lease.handle is not None:
                lease.handle.cancel()
        for watcher in self._watchers:
            watcher.fail(StoreClosedError("the store was closed"))

    def fail_watchers_of(self, owner: object, error: BaseException) -> None:
        """Fail every watcher registered by ``owner`` (its own only: O(its watchers))."""
        owned = self._owned.get(id(owner), ())
        self._work[3] += len(owned)
        for watcher in list(owned):
            watcher.fail(error)


def _event_revision(event: WatchEvent) -> int:
    return event.kv.mod_revision


class _MemoryWatch(Watch):
    def __init__(self, store: MemoryStore, prefix: str, start_revision: int | None) -> None:
        super().__init__(prefix, start_revision)
        self._store = store
        self._watcher: _Watcher | None = None
        self._pending: deque[WatchEvent] = deque()

    @property
    def start_revision(self) -> int:
        if self._watcher is None:
            raise RuntimeError("the watch has not started")
        return self._watcher.min_revision

    async def _start(self) -> None:
        self._store._check_open()
        engine = self._store.engine
        self._watcher = engine.add_watcher(self.prefix, self.requested_revision, self._store)

    async def _next(self) -> WatchEvent:
        watcher = self._watcher
        assert watcher is not None
        engine = self._store.engine
        while not self._pending:
            if self._closed:
                raise StopAsyncIteration
            events = engine.read_events(watcher)
            if events:
                self._pending.extend(events)
                break
            await engine.wait(watcher)
        return self._pending.popleft()

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
