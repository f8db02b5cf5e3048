"""Membership and change notification of a completed round (``wait_for_change``).

A member watches its round's prefix ``m/<round>/`` from the revision the round completed at: its
members' lease-bound records (a deletion is a loss), and what the next round's driver, a close
and the next round write there. Nothing a member's re-registration writes is in it, so N members
rejoining at once cost O(N) events, not N each. Each event is interpreted as at most one change:
a node waiting for the next round, a member lost, the round superseded, the run closed.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import anyio

from ..errors import (
    LeaseExpiredError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    StoreError,
)
from ..store import EventType, RangeResult, Watch, WatchEvent
from ._state import ClosedRecord, DueRecord, RoundRecord, RunKeys
from .api import RendezvousEvent, RendezvousEventKind

if TYPE_CHECKING:
    from ..store import Store
    from .dynamic import DynamicRendezvousHandler

#: the event kind (aioelastic.events) of each membership change
CHANGE_KINDS = {
    RendezvousEventKind.NODES_WAITING: "rendezvous.nodes_waiting",
    RendezvousEventKind.PARTICIPANT_LOST: "rendezvous.member_lost",
    RendezvousEventKind.ROUND_SUPERSEDED: "rendezvous.round_superseded",
    RendezvousEventKind.CLOSED: "rendezvous.closed",
    RendezvousEventKind.ERROR: "rendezvous.error",
}


async def registrations(
    store: Store, keys: RunKeys, round_: int
) -> tuple[RangeResult, RangeResult]:
    """Counts (no key-values) of the nodes registered for ``round_`` and for the next."""
    # one after the other: on one pooled connection, not two
    live = await store.range(keys.nodes_of(round_), limit=1)
    waiting = await store.range(keys.nodes_of(round_ + 1), limit=1)
    return live, waiting


def nodes_waiting(live: int, waiting: int, world_size: int, max_nodes: int) -> int:
    """``num_nodes_waiting`` from ``live`` registrations for a round of ``world_size`` and
    ``waiting`` ones for the next."""
    if live < world_size:  # members gone or restarting: a new round is due
        return max(waiting, world_size - live)
    if world_size >= max_nodes:  # full and all alive: a restart could not take anyone
        return 0
    return waiting


async def count_waiting(store: Store, keys: RunKeys, max_nodes: int) -> int:
    """``num_nodes_waiting`` after the latest round (its record, and two counts)."""
    kv = await store.get(keys.round)
    latest = None if kv is None else RoundRecord.decode(kv.key, kv.value)
    if latest is None:
        return (await store.range(keys.nodes_of(0), limit=1)).count
    live, waiting = await registrations(store, keys, latest.round)
    return nodes_waiting(live.count, waiting.count, latest.world_size, max_nodes)


async def wait_for_change(h: DynamicRendezvousHandler) -> RendezvousEvent:
    """:meth:`DynamicRendezvousHandler.wait_for_change`."""
    if h._handler_closed:
        raise RendezvousClosedError(f"the rendezvous handler for {h.run_id!r} is closed")
    if h._result is None or h._round_record is None:
        raise RendezvousError("wait_for_change() needs a completed round: call next_rendezvous")
    round_ = h._result.round
    if h._closed_seen:
        return RendezvousEvent(RendezvousEventKind.CLOSED, round_, 0)
    keeper = h._keeper
    if h._error is not None or keeper is None or keeper.lost:
        return RendezvousEvent(RendezvousEventKind.ERROR, round_, 0, error=h._error)
    try:
        with keeper.guard(), h._translate("wait_for_change"):
            change = await h._members.next_change(round_, h._round_record)
    except LeaseExpiredError as exc:
        h._error = exc
        h._note_status()
        return RendezvousEvent(RendezvousEventKind.ERROR, round_, 0, error=exc)
    if change is not None:
        return change
    if h._handler_closed:
        raise RendezvousClosedError(f"the rendezvous handler for {h.run_id!r} is closed")
    raise RendezvousConnectionError(f"the watch of {h.run_id!r} ended")  # pragma: no cover


class MemberWatch:
    """The change notification of the round last returned to ``handler``.

    A member watches ``m/<round>/`` only (from the revision its round completed at): the
    members' records (a deletion is a loss: the lease expired, or the node left), the driver's
    word of a next round forming (``~due``), the close (``~closed``) and the next round
    (``~next``). A member's re-registration writes only under ``n/``, which the driver alone
    watches: N members rejoining at once cost the others nothing.

    :meth:`reset` starts over for a new round (completed at ``revision``); :meth:`next_change`
    waits for the next change; :meth:`aclose` drops the watch (a join does, first thing).
    """

    def __init__(self, handler: DynamicRendezvousHandler) -> None:
        self._handler = handler
        self._watch: Watch | None = None
        self._revision = 0  # the revision the round completed at
        self._lost: set[str] = set()
        self._due: DueRecord | None = None  # the driver's last word of a forming round

    def reset(self, revision: int) -> None:
        self._revision = revision
        self._lost = set()
        self._due = None

    async def aclose(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            with contextlib.suppress(StoreError):
                await watch.aclose()

    async def _open(self, round_: int) -> Watch:
        if self._watch is None:
            handler = self._handler
            watch = handler._store.watch(
                handler._keys.members_of(round_), start_revision=self._revision + 1
            )
            try:
                await watch.start()
            except BaseException:
                with anyio.CancelScope(shield=True), contextlib.suppress(StoreError):
                    await watch.aclose()
                raise
            self._watch = watch
        return self._watch

    async def next_change(self, round_: int, record: RoundRecord) -> RendezvousEvent | None:
        """The next change to ``round_`` (``record``); None if the watch ended."""
        watch = await self._open(round_)
        async for event in watch:
            change = self._interpret(event, round_, record)
            if change is not None:
                self._emit(change)
                return change
        return None

    def _emit(self, change: RendezvousEvent) -> None:
        kind = CHANGE_KINDS[change.kind]
        fields: dict[str, Any] = {"round": change.round, "revision": change.revision}
        if change.kind is RendezvousEventKind.PARTICIPANT_LOST:
            fields["member"] = change.node_id
        elif change.kind is RendezvousEventKind.NODES_WAITING:
            fields["waiting_node"] = change.node_id
        if change.kind in (RendezvousEventKind.PARTICIPANT_LOST, RendezvousEventKind.NODES_WAITING):
            fields["num_nodes_waiting"] = change.num_nodes_waiting
        if change.kind is RendezvousEventKind.CLOSED:
            fields["by_this_node"] = False
        self._handler._emit(kind, **fields)
        self._handler._note_status()

    def _interpret(
        self, event: WatchEvent, round_: int, record: RoundRecord
    ) -> RendezvousEvent | None:
        handler, kv = self._handler, event.kv
        keys = handler._keys
        put = event.type is EventType.PUT
        if kv.key == keys.closed_marker(round_) and put:
            if not handler._joiner.closed_by(ClosedRecord.decode(kv.key, kv.value)):
                return None
            handler._closed_seen = True
            return RendezvousEvent(RendezvousEventKind.CLOSED, round_, event.revision)
        if kv.key == keys.next_marker(round_) and put:
            RoundRecord.decode(kv.key, kv.value)
            return RendezvousEvent(RendezvousEventKind.ROUND_SUPERSEDED, round_, event.revision)
        if kv.key == keys.due(round_):
            if not put:
                return None
            due = self._due = DueRecord.decode(kv.key, kv.value)
            waiting = self._waiting(record)
            if not waiting:
                return None
            return RendezvousEvent(
                RendezvousEventKind.NODES_WAITING,
                round_,
                event.revision,
                node_id=due.node_id,
                num_nodes_waiting=waiting,
            )
        node = kv.key[len(keys.members_of(round_)) :]
        if put or node.startswith("~") or node == handler.node_id or node in self._lost:
            return None
        self._lost.add(node)
        return RendezvousEvent(
            RendezvousEventKind.PARTICIPANT_LOST,
            round_,
            event.revision,
            node_id=node,
            num_nodes_waiting=max(1, self._waiting(record)),
        )

    def _waiting(self, record: RoundRecord) -> int:
        """``num_nodes_waiting`` as this member knows it: the losses it saw and the driver's
        last count of the next round's registrations."""
        due = self._due
        world = record.world_size
        waiting = nodes_waiting(
            world - len(self._lost), 0 if due is None else due.waiting, world, self._handler._max
        )
        return max(waiting, 1) if due is not None and due.restart else waiting
