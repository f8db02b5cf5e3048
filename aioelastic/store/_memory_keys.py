"""The memory engine's key space: key-values by key, the keys in order (for ranges), which keys
each lease holds, and the undo list of the write in progress (a vetoing hook puts it back)."""

from __future__ import annotations

from ._base import prefix_end
from ._memory_leases import _Lease
from ._memory_sorted import SortedKeys
from ._memory_types import KEYS_SCANNED
from ._records import new_event, new_kv
from ._types import EventType, KeyValue, WatchEvent

_DELETE = EventType.DELETE

__all__ = ["KeySpace"]


class KeySpace:
    """Key-values at the engine's current revision; every change is recorded for undo."""

    __slots__ = ("data", "keys", "leases", "undo", "work")

    def __init__(self, leases: dict[int, _Lease], work: list[int]) -> None:
        self.data: dict[str, KeyValue] = {}
        self.keys = SortedKeys()
        self.leases = leases  # the lease table's, to keep each lease's keys
        self.undo: list[tuple[str, KeyValue | None]] = []  # the current write's old values
        self.work = work

    def range_keys(self, prefix: str, limit: int | None) -> tuple[list[str], int]:
        """The keys under ``prefix`` in order (at most ``limit``), and how many there are."""
        found, count = self.keys.range(prefix, prefix_end(prefix), limit)
        self.work[KEYS_SCANNED] += len(found)
        return found, count

    def write(self, key: str, value: bytes, lease: int, revision: int) -> KeyValue:
        old = self.data.get(key)
        self.undo.append((key, old))
        if old is None:
            self.keys.add(key)
            kv = new_kv(key, value, revision, revision, 1, lease)
        else:
            if old.lease and old.lease != lease and (held := self.leases.get(old.lease)):
                held.keys.discard(key)
            kv = new_kv(key, value, old.create_revision, revision, old.version + 1, lease)
        if lease:
            self.leases[lease].keys.add(key)
        self.data[key] = kv
        return kv

    def remove(self, key: str, revision: int) -> WatchEvent:
        old = self.data.pop(key)
        self.undo.append((key, old))
        self.keys.remove(key)
        if old.lease and (held := self.leases.get(old.lease)):
            held.keys.discard(key)
        return new_event(_DELETE, new_kv(key, b"", 0, revision, 0, 0))

    def undo_writes(self) -> None:
        """Put back what the current write changed (a hook vetoed it)."""
        undo, self.undo = self.undo, []
        data, leases = self.data, self.leases
        for key, old in reversed(undo):
            current = data.get(key)
            if current is not None and current.lease and (held := leases.get(current.lease)):
                held.keys.discard(key)
            if old is None:
                if current is not None:
                    del data[key]
                    self.keys.remove(key)
                continue
            if current is None:
                self.keys.add(key)
            data[key] = old
            if old.lease and (held := leases.get(old.lease)):
                held.keys.add(key)

    def load(self, kvs: tuple[KeyValue, ...]) -> None:
        """Fill this empty key space with ``kvs`` (a snapshot's), keys of known leases held."""
        for kv in kvs:
            self.data[kv.key] = kv
            if kv.lease and kv.lease in self.leases:
                self.leases[kv.lease].keys.add(kv.key)
        self.keys = SortedKeys(sorted(self.data))

    def replay(self, events: tuple[WatchEvent, ...]) -> None:
        """Apply a logged commit's events exactly (their key-values as they were logged)."""
        data, leases = self.data, self.leases
        for event in events:
            key = event.kv.key
            if event.type is EventType.PUT:
                old = data.get(key)
                if old is None:
                    self.keys.add(key)
                elif old.lease and (held := leases.get(old.lease)):
                    held.keys.discard(key)
                data[key] = event.kv
                if event.kv.lease and (held := leases.get(event.kv.lease)):
                    held.keys.add(key)
            elif key in data:
                self.remove(key, event.kv.mod_revision)
        self.undo.clear()
