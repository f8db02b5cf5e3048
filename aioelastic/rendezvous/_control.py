"""A node's view of a run's control records (``c/``): the latest round, its driver, the close.

Loaded from one range, then kept current by a watch of ``c/`` opened at the same time
(``range_and_watch``: one request on the http store). The view and its watch outlive a completed
join, so the handler's next join starts from them: no watch to open, nothing to read.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import anyio

from ..errors import StoreError
from ..store import Compare, EventType, KeyValue, Put, RangeResult, Watch, WatchEvent
from ._state import ClosedRecord, DriverRecord, RoundRecord, RunKeys

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger("aioelastic.rendezvous")


class ControlView:
    """The round, driver and closed records of ``c/`` (decoded) and the watch that keeps them
    current. ``seen`` is the revision the view is current as of; ``usable`` is False once the
    watch failed (the view is not kept then)."""

    def __init__(self, keys: RunKeys, watch: Watch) -> None:
        self.keys = keys
        self.watch = watch
        self.round_kv: KeyValue | None = None
        self.round: RoundRecord | None = None
        self.driver_kv: KeyValue | None = None
        self.driver: DriverRecord | None = None
        self.closed: ClosedRecord | None = None
        self.closed_kv: KeyValue | None = None
        self.seen = 0
        self.usable = True

    @classmethod
    async def open(cls, store: Store, keys: RunKeys) -> ControlView:
        """Read ``c/`` and watch it from there (one request on the http store)."""
        snapshot, watch = await store.range_and_watch(keys.ctl)
        view = cls(keys, watch)
        try:
            view.load(snapshot)  # RendezvousStateError on a corrupt record
        except BaseException:
            await view.aclose()
            raise
        return view

    async def resync(self, store: Store) -> None:
        """The watch fell behind a compaction (events unread while this node was a member, on
        the memory store): a new watch, ``c/`` read afresh."""
        log.debug("%s: the control watch fell behind a compaction; reading afresh", self.keys.ctl)
        await self.aclose()
        fresh = await ControlView.open(store, self.keys)
        self.__dict__.update(fresh.__dict__)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True), contextlib.suppress(StoreError):
            await self.watch.aclose()

    def load(self, snapshot: RangeResult) -> None:
        for kv in snapshot:
            self.apply(EventType.PUT, kv)
        self.seen = snapshot.revision

    def apply_event(self, event: WatchEvent) -> None:
        """Apply a watch event of ``c/`` that is newer than this view (older ones are in it)."""
        if event.revision > self.seen:
            self.apply(event.type, event.kv)
            self.seen = event.revision

    def apply(self, type_: EventType, kv: KeyValue) -> None:
        keys = self.keys
        put = type_ is EventType.PUT
        if kv.key == keys.round:
            self.round_kv = kv if put else None
            self.round = RoundRecord.decode(kv.key, kv.value) if put else None
        elif kv.key == keys.driver:
            self.driver_kv = kv if put else None
            self.driver = DriverRecord.decode(kv.key, kv.value) if put else None
        elif kv.key == keys.closed:
            self.closed_kv = kv if put else None
            self.closed = ClosedRecord.decode(kv.key, kv.value) if put else None


async def write_closed(store: Store, keys: RunKeys) -> ClosedRecord:
    """Close the run: the close record, and its marker where the latest round's members watch
    (``m/<round>/~closed``), in one transaction as of the round record read (again if it
    changed meanwhile)."""
    while True:
        kv = await store.get(keys.round)
        if kv is None:
            record = ClosedRecord(-1)
            await store.put(keys.closed, record.encode())
            return record
        record = ClosedRecord(RoundRecord.decode(kv.key, kv.value).round)
        result = await store.txn(
            compare=[Compare.mod_revision(keys.round) == kv.mod_revision],
            success=[
                Put(keys.closed, record.encode()),
                Put(keys.closed_marker(record.round), record.encode()),
            ],
        )
        if result.succeeded:
            return record
