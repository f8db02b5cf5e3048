"""The records the memory engine hands out: its work counters, commits, lease changes and a
complete image for snapshots. Public through :mod:`aioelastic.store.memory`."""

from __future__ import annotations

from dataclasses import dataclass

from ._types import KeyValue, WatchEvent

__all__ = ["Commit", "EngineState", "EngineWork", "LeaseChange"]


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


#: the indexes of EngineWork's fields in the engine's list of counters
WRITES, EVENTS_LOGGED, EVENTS_DELIVERED, WATCHER_VISITS, KEYS_SCANNED = range(5)


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
