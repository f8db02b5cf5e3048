"""The memory engine's persistence side: a complete image of it, and the replay of a log
(commits, lease grants and ends, compactions) into a fresh engine. None of these calls the
engine's hooks. :class:`~aioelastic.store.memory.MemoryEngine` inherits them."""

from __future__ import annotations

from ..errors import StoreClosedError
from ._memory_keys import KeySpace
from ._memory_leases import LeaseTable
from ._memory_types import Commit, EngineState
from ._memory_watch_hub import WatchHub

__all__ = ["EngineReplay"]


class EngineReplay:
    """Snapshots and replay, over the parts of the engine that inherits this."""

    history_limit: int
    _revision: int
    _closed: bool
    _compact_at: int
    _keyspace: KeySpace
    _leases: LeaseTable
    _hub: WatchHub

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the memory store engine is closed")

    def _auto_compact(self) -> None:
        log = self._hub.log
        excess = len(log) - self.history_limit
        # Drop whole revisions only, and never the newest one (a watch must be able to start
        # at the current revision even if its events alone exceed the limit).
        cut_revision = min(log[excess - 1].kv.mod_revision + 1, self._revision)
        if cut_revision > self._hub.compact_revision:
            self._hub.drop_before(cut_revision)

    def export_state(self) -> EngineState:
        """A complete image of the engine (see :class:`EngineState`)."""
        self._check_open()
        keyspace, leases = self._keyspace, self._leases
        return EngineState(
            revision=self._revision,
            compact_revision=self._hub.compact_revision,
            kvs=tuple(keyspace.data[k] for k in keyspace.keys),
            history=tuple(self._hub.log),
            leases={lease.id: lease.ttl for lease in leases.by_id.values()},
            last_lease_id=leases.last_id,
        )

    def restore(self, state: EngineState) -> None:
        """Load ``state`` into this fresh engine; leases get a full TTL from now."""
        self._check_open()
        if self._revision or self._keyspace.data or self._leases.by_id or self._hub.log:
            raise RuntimeError("restore() needs a fresh engine")
        self._revision = state.revision
        self._hub.compact_revision = state.compact_revision
        self._leases.last_id = state.last_lease_id
        for lease_id, ttl in sorted(state.leases.items()):
            self.restore_lease(lease_id, ttl)
        self._keyspace.load(state.kvs)
        self._hub.log.extend(state.history)

    def restore_commit(self, commit: Commit) -> None:
        """Re-apply a logged :class:`Commit` exactly (same revision, same key-values)."""
        self._check_open()
        if commit.revision <= self._revision:
            raise ValueError(
                f"commit revision {commit.revision} is not after the engine's {self._revision}"
            )
        self._revision = commit.revision
        self._keyspace.replay(commit.events)
        # restores run before anyone watches; should one not, wake them all to scan the log
        self._hub.rescan_all()
        self._hub.log.extend(commit.events)
        if len(self._hub.log) > self._compact_at:
            self._auto_compact()

    def restore_lease(self, lease_id: int, ttl: float) -> None:
        """Re-create a logged lease with a full TTL from now (its keys come with their commits)."""
        self._check_open()
        self.restore_lease_end(lease_id)  # a lease logged twice is the later one
        self._leases.add(lease_id, ttl)

    def restore_lease_end(self, lease_id: int) -> None:
        """Forget a logged lease that ended (its key deletions were logged before this)."""
        lease = self._leases.by_id.get(lease_id)
        if lease is not None:
            self._leases.discard(lease)

    def restore_compact(self, revision: int) -> None:
        """Re-apply a logged explicit compaction."""
        if revision > self._hub.compact_revision:
            self._hub.drop_before(revision)
