"""Membership and change notification of a completed round (``wait_for_change``).

A member watches the run's whole prefix from the revision its round completed at. It counts
the registrations for its round (``live``) and for the next (``waiting``) once, when the watch
opens, and keeps the counts from the watch's events: telling N members about a newcomer costs N
watch events and no reads. Each event is interpreted as at most one change: a node waiting for
the next round, a member lost, the round superseded, the run closed.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import anyio

from ..errors import StoreError
from ..store import EventType, RangeResult, Watch, WatchEvent
from ._state import ClosedRecord, NodeRecord, RosterBucket, RoundRecord, RunKeys, bucket_of
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


async def count_waiting(
    store: Store, keys: RunKeys, latest: RoundRecord | None, max_nodes: int
) -> int:
    """``num_nodes_waiting`` after the ``latest`` round (two counts, nothing decoded)."""
    if latest is None:
        return (await store.range(keys.nodes_of(0), limit=1)).count
    live, waiting = await registrations(store, keys, latest.round)
    return nodes_waiting(live.count, waiting.count, latest.world_size, max_nodes)


class Counts:
    """How many nodes are registered for a member's round (``live``) and for the next
    (``waiting``): counted once, then kept by the member watch's events after each count."""

    def __init__(self, keys: RunKeys, round_: int, live: RangeResult, waiting: RangeResult) -> None:
        self.keys = keys
        self.round = round_
        self.live = live.count
        self.waiting = waiting.count
        self._counted_at = (live.revision, waiting.revision)

    def apply(self, event: WatchEvent) -> None:
        parsed = self.keys.parse_node_key(event.kv.key)
        if parsed is None:
            return
        index = parsed[0] - self.round
        if index not in (0, 1) or event.revision <= self._counted_at[index]:
            return  # another round, or already in the count
        kv = event.kv
        if event.type is EventType.DELETE:
            delta = -1
        elif kv.create_revision == kv.mod_revision:  # created (an update changes no count)
            delta = 1
        else:
            return
        if index == 0:
            self.live += delta
        else:
            self.waiting += delta


class MemberWatch:
    """The change notification of the round last returned to ``handler``.

    :meth:`reset` starts over for a new round (completed at ``revision``); :meth:`next_change`
    waits for the next change; :meth:`aclose` drops the watch (a join does, first thing).
    """

    def __init__(self, handler: DynamicRendezvousHandler) -> None:
        self._handler = handler
        self._watch: Watch | None = None
        self._counts: Counts | None = None
        self._revision = 0  # the revision the round completed at
        self.rejoined: set[str] = set()  # members registered for the next round
        self._lost: set[str] = set()
        self._members: frozenset[str] | None = None  # the roster, when the result has it
        self._buckets: dict[int, RosterBucket] = {}  # roster buckets read so far

    def reset(self, revision: int, participants: tuple[str, ...] = ()) -> None:
        self._revision = revision
        self.rejoined = set()
        self._lost = set()
        self._members = frozenset(participants) if participants else None
        self._buckets = {}

    async def _is_member(self, node: str, record: RoundRecord) -> bool:
        """Whether ``node`` is a member of ``record``'s round: from the roster the result has,
        else from the node's roster bucket (one small get, kept: asked only of a node whose
        record went without it registering again, a loss or a standby's)."""
        if self._members is not None:
            return node in self._members
        if record.buckets == 0:  # a static round: every registration is a member
            return True
        index = bucket_of(node, record.buckets)
        bucket = self._buckets.get(index)
        if bucket is None:
            keys = self._handler._keys
            key = keys.bucket(record.round, index)
            kv = await self._handler._store.get(key)
            bucket = RosterBucket({}) if kv is None else RosterBucket.decode(key, kv.value)
            self._buckets[index] = bucket
        return node in bucket.ranks

    async def aclose(self) -> None:
        watch, self._watch = self._watch, None
        self._counts = None
        if watch is not None:
            with contextlib.suppress(StoreError):
                await watch.aclose()

    async def _open(self, round_: int) -> tuple[Watch, Counts]:
        if self._watch is None or self._counts is None:
            handler = self._handler
            store, keys = handler._store, handler._keys
            watch = store.watch(keys.root, start_revision=self._revision + 1)
            try:
                await watch.start()
                # counted once; the watch's events keep the counts (no reads per event)
                live, waiting = await registrations(store, keys, round_)
            except BaseException:
                with anyio.CancelScope(shield=True), contextlib.suppress(StoreError):
                    await watch.aclose()
                raise
            self._watch = watch
            self._counts = Counts(keys, round_, live, waiting)
        return self._watch, self._counts

    async def next_change(self, round_: int, members: RoundRecord) -> RendezvousEvent | None:
        """The next change to ``round_`` (of ``members``); None if the watch ended."""
        watch, counts = await self._open(round_)
        async for event in watch:
            counts.apply(event)
            change = await self._interpret(event, round_, members, counts)
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

    async def _interpret(
        self, event: WatchEvent, round_: int, members: RoundRecord, counts: Counts
    ) -> RendezvousEvent | None:
        handler, kv = self._handler, event.kv
        keys = handler._keys
        put = event.type is EventType.PUT
        if kv.key == keys.closed and put:
            if not handler._joiner.closed_by(ClosedRecord.decode(kv.key, kv.value)):
                return None
            handler._closed_seen = True
            return RendezvousEvent(RendezvousEventKind.CLOSED, round_, event.revision)
        if kv.key == keys.round and put:
            record = RoundRecord.decode(kv.key, kv.value)
            if record.round > round_:
                return RendezvousEvent(RendezvousEventKind.ROUND_SUPERSEDED, round_, event.revision)
            return None
        parsed = keys.parse_node_key(kv.key)
        if parsed is None:
            return None
        node_round, node = parsed
        if node_round == round_ + 1 and put:
            NodeRecord.decode(kv.key, kv.value)
            self.rejoined.add(node)
            return self._node_change(
                RendezvousEventKind.NODES_WAITING, event, node, members, counts
            )
        if (
            node_round == round_
            and not put
            and node != handler.node_id
            and node not in self.rejoined
            and node not in self._lost
            and await self._is_member(node, members)
        ):
            self._lost.add(node)
            return self._node_change(
                RendezvousEventKind.PARTICIPANT_LOST, event, node, members, counts
            )
        return None

    def _node_change(
        self,
        kind: RendezvousEventKind,
        event: WatchEvent,
        node: str,
        members: RoundRecord,
        counts: Counts,
    ) -> RendezvousEvent | None:
        """A change about ``node``; a newcomer only when a new round could take it."""
        waiting = nodes_waiting(counts.live, counts.waiting, members.world_size, self._handler._max)
        if kind is RendezvousEventKind.NODES_WAITING and not waiting:
            return None
        return RendezvousEvent(
            kind, members.round, event.revision, node_id=node, num_nodes_waiting=waiting
        )
