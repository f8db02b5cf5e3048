"""The memory engine's watches: the event log kept for them (and its compaction), the
registered watchers, and the fan-out of each commit to the watchers it concerns.

A watcher is *tracked* when its unread events are known exactly (by their log indexes, in
``hits``): a commit looks only at the prefixes it concerns (at a cost that grows with the number
of distinct tracked prefixes or with the key's length, whichever is smaller), appends the
event's index to those watchers' hits and wakes those that had none. So reading costs a watcher
the events under its prefix, not every event written since it last read. A watcher that starts
in the past *scans* the log from its cursor once, then is tracked.

Every registered watcher is alive for as long as its watch: the objects it holds are tracked by
the garbage collector and traversed by each full collection, so a watcher with nothing unread
holds no container of its own (``hits`` is the shared empty tuple; with one unread event, a
tuple of one number, which the collector does not track), and the compaction's record
of first unread events is two deques of plain values, not a tuple (and a list) per wake-up.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from collections.abc import Callable, Sequence

from ..errors import CompactedError
from ._memory_types import EVENTS_DELIVERED, KEYS_SCANNED, WATCHER_VISITS
from ._types import WatchEvent

__all__ = ["WatchHub"]

#: ``hits`` of a tracked watcher with nothing unread (shared: no list per idle watcher)
_NO_HITS: tuple[int, ...] = ()


class _Watcher:
    """One registered watch on the engine: a cursor into the event log and a wake-up future."""

    __slots__ = ("cursor", "error", "hits", "min_revision", "on_wake", "owner", "prefix", "waiter")

    def __init__(self, prefix: str, cursor: int, min_revision: int, owner: object) -> None:
        self.prefix = prefix
        # absolute index into the event log of the next event to read while it scans (while
        # tracked, ``hits`` says; _untrack sets the cursor again from them)
        self.cursor = cursor
        self.min_revision = min_revision
        self.owner = owner
        self.waiter: asyncio.Future[None] | None = None
        #: called (synchronously, inside the write; it must be cheap and never raise) where the
        #: waiter would be woken: a reader that serves many watchers (the session server) gets
        #: told which ones have something, without a task parked on each
        self.on_wake: Callable[[], None] | None = None
        self.error: BaseException | None = None
        # While tracked: the absolute log indexes of its unread events, exactly (_NO_HITS, a
        # 1-tuple, then a list); None while it must scan the log from its cursor instead.
        self.hits: Sequence[int] | None = None

    def wake(self) -> None:
        on_wake = self.on_wake
        if on_wake is not None:
            on_wake()
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None  # a woken watcher keeps nothing of its wake-up
            if not waiter.done():
                waiter.set_result(None)

    def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.wake()


def _event_revision(event: WatchEvent) -> int:
    return event.kv.mod_revision


class WatchHub:
    """The event log (from ``compact_revision`` on) and the watchers reading it."""

    __slots__ = (
        "_first_unread",
        "_first_unread_of",
        "_loop",
        "_owned",
        "_scanning",
        "_tracked",
        "base",
        "compact_revision",
        "log",
        "watchers",
        "work",
    )

    def __init__(self, work: list[int]) -> None:
        self.work = work
        self.log: list[WatchEvent] = []
        self.base = 0  # absolute index of log[0]
        self.compact_revision = 0
        self.watchers: set[_Watcher] = set()
        # by id(owner): fail_owned is O(its own); an owner of one watcher (the common case: a
        # rendezvous participant's store) maps to it, without a set of its own
        self._owned: dict[int, _Watcher | set[_Watcher]] = {}
        self._tracked: dict[str, set[_Watcher]] = {}  # by prefix
        # Registered watchers that are not tracked, and, in log order, the index and the
        # watcher each time a tracked watcher got its first unread event (two deques in step):
        # a compaction looks at those only (O(1) amortised per event), not at every watcher. An
        # entry is stale once the watcher has read (its first unread event is another, or none).
        self._scanning: set[_Watcher] = set()
        self._first_unread: deque[int] = deque()
        self._first_unread_of: deque[_Watcher] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the log

    def offset_of(self, revision: int) -> int:
        """The index in ``log`` of the first event at ``revision`` or later."""
        return bisect.bisect_left(self.log, revision, key=_event_revision)

    def publish(self, events: tuple[WatchEvent, ...]) -> None:
        """Tell the tracked watchers under each event's key (already appended to the log)."""
        tracked = self._tracked
        if not tracked:
            return
        work = self.work
        first_unread, first_unread_of = self._first_unread, self._first_unread_of
        first = self.base + len(self.log) - len(events)  # absolute index of events[0]
        for index, event in enumerate(events, first):
            key = event.kv.key
            if len(tracked) > len(key):  # look the key's own prefixes up instead
                prefixes = [p for p in (key[:i] for i in range(len(key) + 1)) if p in tracked]
            else:
                prefixes = [p for p in tracked if key.startswith(p)]
            for prefix in prefixes:
                watchers = tracked[prefix]
                work[WATCHER_VISITS] += len(watchers)
                for watcher in watchers:
                    hits = watcher.hits
                    if type(hits) is list:
                        hits.append(index)
                    elif hits:  # its second: a list from now on
                        watcher.hits = [*hits, index]
                    else:
                        # its first: a tuple of one number, which the collector stops tracking
                        # (N watchers woken by one write hold one each until they read)
                        watcher.hits = (index,)
                        first_unread.append(index)
                        first_unread_of.append(watcher)
                        # (wake, inline: one write wakes N watchers)
                        on_wake = watcher.on_wake
                        if on_wake is not None:
                            on_wake()
                        waiter = watcher.waiter
                        if waiter is not None:
                            watcher.waiter = None
                            if not waiter.done():
                                waiter.set_result(None)

    def drop_before(self, revision: int) -> None:
        """Discard the events before ``revision``; fail the watchers that had not read them."""
        drop = self.offset_of(revision)
        cut = self.base + drop  # absolute index of the first event kept
        # A watcher loses something only if an unread event goes: a scanning one whose cursor
        # is before the cut, a tracked one whose first unread event is (a tracked watcher
        # with nothing unread loses nothing; its cursor is set when it stops being tracked).
        lost = [w for w in self._scanning if w.cursor < cut]
        first_unread, first_unread_of = self._first_unread, self._first_unread_of
        while first_unread and first_unread[0] < cut:
            index, watcher = first_unread.popleft(), first_unread_of.popleft()
            # not read since (indexes only grow: a later first unread event is another index)
            hits = watcher.hits
            if hits and hits[0] == index and watcher in self.watchers:
                lost.append(watcher)
        self.work[WATCHER_VISITS] += len(self._scanning) + len(lost)
        for watcher in lost:
            if watcher.error is None:
                first = watcher.cursor if watcher.hits is None else watcher.hits[0]
                unread = self.log[first - self.base].kv.mod_revision
                watcher.fail(CompactedError(max(unread, watcher.min_revision), revision))
        if drop:
            del self.log[:drop]
            self.base += drop
        self.compact_revision = revision

    def rescan_all(self) -> None:
        """Make every tracked watcher scan the log again (the log was replayed under it)."""
        for watchers in list(self._tracked.values()):
            for watcher in list(watchers):
                self._untrack(watcher)
                self._scanning.add(watcher)
                watcher.wake()

    # -- watchers

    def add(self, prefix: str, start_revision: int, owner: object) -> _Watcher:
        """Register a watcher of events from ``start_revision`` on."""
        if start_revision < self.compact_revision:
            raise CompactedError(start_revision, self.compact_revision)
        cursor = self.base + self.offset_of(start_revision)
        watcher = _Watcher(prefix, cursor, start_revision, owner)
        self.watchers.add(watcher)
        owned = self._owned.get(id(owner))
        if owned is None:
            self._owned[id(owner)] = watcher
        elif isinstance(owned, set):
            owned.add(watcher)
        else:
            self._owned[id(owner)] = {owned, watcher}
        if watcher.cursor == self.base + len(self.log):
            self._track(watcher)
        else:
            self._scanning.add(watcher)
        return watcher

    def remove(self, watcher: _Watcher) -> None:
        if watcher in self.watchers:
            self.watchers.remove(watcher)
            key = id(watcher.owner)
            owned = self._owned[key]
            if isinstance(owned, set):
                owned.discard(watcher)
                if len(owned) == 1:
                    self._owned[key] = owned.pop()
            else:
                del self._owned[key]
        self._scanning.discard(watcher)
        self._untrack(watcher)
        watcher.wake()

    def wait(self, watcher: _Watcher) -> asyncio.Future[None]:
        """A future resolved by a write under ``watcher``'s prefix, by its failure or removal, or
        by :meth:`_Watcher.wake` (which drops it); resolved already if it has events left to read.

        A future, not a coroutine: a reader parked on it holds one frame fewer (and each of a
        process's 10,000 participants parks one, which every full collection traverses).
        """
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        waiter = self._loop.create_future()
        idle = watcher.hits is not None and not watcher.hits
        if not idle or watcher.error is not None or watcher not in self.watchers:
            waiter.set_result(None)
        else:
            watcher.waiter = waiter
        return waiter

    def _track(self, watcher: _Watcher) -> None:
        """From now on, writes under its prefix record themselves in ``watcher.hits``."""
        watcher.hits = _NO_HITS
        same = self._tracked.get(watcher.prefix)
        if same is None:
            self._tracked[watcher.prefix] = {watcher}
        else:
            same.add(watcher)

    def _untrack(self, watcher: _Watcher) -> None:
        """Stop tracking: from now on it scans the log from its cursor, its first unread event
        (or the end of the log if it had none)."""
        hits = watcher.hits
        if hits is None:
            return
        watcher.cursor = hits[0] if hits else self.base + len(self.log)
        watcher.hits = None
        same = self._tracked.get(watcher.prefix)
        if same is not None:
            same.discard(watcher)
            if not same:
                del self._tracked[watcher.prefix]

    def read(self, watcher: _Watcher) -> list[WatchEvent]:
        """Every event for ``watcher`` not yet read (advances its cursor)."""
        if watcher.error is not None:
            raise watcher.error
        log, base, work = self.log, self.base, self.work
        minimum = watcher.min_revision
        hits = watcher.hits
        if hits is not None:  # tracked: its unread events are known (its cursor is not used)
            if not hits:
                return []
            watcher.hits = _NO_HITS
            # (kv.mod_revision: the event's revision without its property's call, per read)
            if len(hits) == 1:  # the usual read: one event since the last
                event = log[hits[0] - base]
                if event.kv.mod_revision < minimum:  # a watch that starts at a future revision
                    return []
                work[EVENTS_DELIVERED] += 1
                return [event]
            events = [log[index - base] for index in hits]
            if events[0].kv.mod_revision < minimum:
                events = [e for e in events if e.revision >= minimum]
            work[EVENTS_DELIVERED] += len(events)
            return events
        start = watcher.cursor - base
        if start < 0:  # pragma: no cover - drop_before fails such watchers first
            raise CompactedError(minimum, self.compact_revision)
        watcher.cursor = base + len(log)
        if watcher in self.watchers:
            self._scanning.discard(watcher)
            self._track(watcher)  # caught up: writes under its prefix are recorded from here
        prefix = watcher.prefix
        work[KEYS_SCANNED] += len(log) - start
        events = [e for e in log[start:] if e.kv.key.startswith(prefix) and e.revision >= minimum]
        work[EVENTS_DELIVERED] += len(events)
        return events

    def fail_owned(self, owner: object, error: BaseException) -> None:
        """Fail every watcher registered by ``owner`` (its own only: O(its watchers))."""
        owned = self._owned.get(id(owner))
        if owned is None:
            return
        watchers = list(owned) if isinstance(owned, set) else [owned]
        self.work[WATCHER_VISITS] += len(watchers)
        for watcher in watchers:
            watcher.fail(error)
