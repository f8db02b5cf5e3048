"""The driver of a forming round: it counts the registrations and writes the round record.

One node per round (the one whose claim of ``c/driver`` landed) watches the node records ``n/``,
keeps a local count, and completes the round at ``max_nodes``, at the last-call deadline after
``min_nodes``, or at once for a re-form of survivors (``fast_reform``), never while a member of
the previous round is still in it. It writes the roster (the members with their ranks,
:func:`assign_ranks`, in chunks under ``r/<round>/``), then finalises by compare-and-swap of the
small ``c/round``, both only while its claim of ``c/driver`` holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Container, Iterable
from typing import TYPE_CHECKING

import anyio

from ..errors import CompactedError, LeaseNotFoundError
from ..store import (
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    Compare,
    DeletePrefix,
    EventType,
    KeyValue,
    Put,
    RangeResult,
    TxnOp,
    Watch,
    WatchEvent,
)
from ._state import (
    DueRecord,
    MemberRecord,
    NodeRecord,
    RoundRecord,
    read_roster,
    roster_chunks,
    roster_members,
)

#: roster writes per transaction: within the store's limits with room for the round's own ops
_BATCH_OPS = MAX_TXN_OPS - 8
_BATCH_BYTES = MAX_TXN_BYTES // 2

#: registrations a driver's claim reads in its own transaction at most (more: it reads them all
#: with its watch, as a driver that claimed by itself does), so that answer stays small
SNAPSHOT_LIMIT = 256

if TYPE_CHECKING:
    from .dynamic import DynamicRendezvousHandler

log = logging.getLogger("aioelastic.rendezvous")


def assign_ranks(
    candidates: Iterable[tuple[str, int]], previous: tuple[str, ...], max_nodes: int
) -> tuple[str, ...]:
    """The members of a round in rank order, from ``(node_id, registration revision)`` pairs.

    Members of the ``previous`` round come first (they are chosen before newcomers when there are
    more than ``max_nodes`` candidates) and keep their previous rank when it is below the new world
    size; the other chosen nodes fill the free ranks in order of registration, then node id.
    """
    prev_rank = {node: rank for rank, node in enumerate(previous)}

    def priority(item: tuple[str, int]) -> tuple[int, int, str]:
        node, revision = item
        rank = prev_rank.get(node)
        return (0, rank, "") if rank is not None else (1, revision, node)

    chosen = sorted(candidates, key=priority)[:max_nodes]
    size = len(chosen)
    slots: list[str | None] = [None] * size
    rest: list[str] = []
    for node, _ in chosen:
        rank = prev_rank.get(node)
        if rank is not None and rank < size:
            slots[rank] = node
        else:
            rest.append(node)
    fill = iter(rest)
    return tuple(slot if slot is not None else next(fill) for slot in slots)


class RoundDriver:
    """Drives round ``target`` for ``handler``: :meth:`run` counts, then finalises.

    ``prev_kv`` is the round record as the joiner last saw it, ``claim`` the mod_revision of
    this node's ``c/driver`` claim (every write compares both: it fails harmlessly if either has
    changed since). ``finalizing`` is True while the driver writes the round (or cleans up after
    it): the joiner lets it finish then instead of cancelling it. ``ranks``: after a successful
    :meth:`finalize`, the members' ranks (the joiner's own needs no read then). ``snapshot``:
    the registrations as of the claim (read in the claiming transaction, whose revision it has),
    if they were: the driver then opens its watch of ``n/`` only if the round does not complete
    from them (a round of one completes without one); ``prev_roster``: the previous round's
    roster chunks, if they were read with the claim too; ``told``: the claim told them this
    node (one of them) restarts their round.
    """

    def __init__(
        self,
        handler: DynamicRendezvousHandler,
        target: int,
        prev_kv: KeyValue | None,
        claim: int,
        snapshot: RangeResult | None = None,
        *,
        prev_roster: tuple[KeyValue, ...] | None = None,
        told: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._handler = handler
        self._loop = loop  # the running loop, if the joiner has it (else looked up)
        self._prev_roster = prev_roster  # the previous round's roster chunks, if read with it
        self._snapshot = None if snapshot is None or snapshot.more else snapshot
        self._events: Watch | None = None  # the watch of n/, once opened
        self._seen = 0  # the revision the count is current as of
        self.target = target
        self._prev_kv = prev_kv
        self._claim = claim
        self._prev = None if prev_kv is None else RoundRecord.decode(prev_kv.key, prev_kv.value)
        self._prev_ranks: dict[str, int] = {}  # the previous round's members (read in run)
        self.ranks: dict[str, int] | None = None
        self.members: tuple[str, ...] | None = None
        self._current: dict[str, KeyValue] = {}  # registered for target
        self._previous: set[str] = set()  # still registered for target - 1 (it must drain)
        self._newcomers: set[str] = set()  # registered for target, not members of target - 1
        # a member of target - 1 registered: its members were told (``told``: with the claim)
        self._restart = told
        self._due: list[DueRecord] = []  # to tell the members of target - 1, in order
        self.finalizing = False

    def apply(self, type_: EventType, kv: KeyValue, *, told: Container[str] = ()) -> None:
        """Count a node record (from the range, or a watch event newer than it); ``told``:
        nodes whose arrival was counted already (a count started afresh)."""
        parsed = self._handler._keys.parse_node_key(kv.key)
        if parsed is None:
            return
        round_, node = parsed
        if round_ == self.target:
            if type_ is EventType.PUT:
                NodeRecord.decode(kv.key, kv.value)  # validate on read
                arrived = node not in self._current and node not in told
                self._current[node] = kv
                if node not in self._prev_ranks:
                    self._newcomers.add(node)
                if arrived:
                    self._arrived(node)
            else:
                self._current.pop(node, None)
                self._newcomers.discard(node)
        elif round_ == self.target - 1:
            if type_ is EventType.PUT:
                self._previous.add(node)
            else:
                self._previous.discard(node)

    def _arrived(self, node: str) -> None:
        """A registration the members of the previous round are told of (``m/<round>/~due``):
        the first of their own (a restart), and each newcomer a round could take. Telling them
        is this node's one write per such registration, so that they need not watch ``n/``:
        N members re-registering cost N events in all, not N each."""
        prev = self._prev
        if prev is None:
            return
        if node in self._prev_ranks:
            if self._restart or prev.world_size == 1:  # told, or nobody else to tell
                return
            self._restart = True
        elif prev.world_size >= self._handler._max:
            return  # a standby of a full round: a restart could not take it
        self._due.append(DueRecord(node, len(self._current), self._restart))

    async def _tell_members(self) -> None:
        if self._due and self._prev is not None:
            key = self._handler._keys.due(self._prev.round)
            for due in self._due:
                await self._handler._store.put(key, due.encode())
            self._due.clear()

    async def run(self) -> None:
        """Count registrations for the round; complete it at max, or at the last-call deadline."""
        if (-1 if self._prev is None else self._prev.round) != self.target - 1:
            return  # a newer round completed meanwhile: the joiner sees it on its watch
        try:
            await self._load()
            await self._count()
        finally:
            events, self._events = self._events, None
            if events is not None:
                await events.aclose()

    async def _load(self) -> None:
        """The previous round's members, and the registrations (from the claim's transaction,
        or read with the watch of ``n/``)."""
        handler = self._handler
        if self._prev is not None:  # the previous roster: O(N), for this node only
            known = handler._result
            if known is not None and known.round == self._prev.round and known.participants:
                members = known.participants  # this node has it: no read
            elif self._prev_roster is not None:  # read with the claim
                roster, self._prev_roster = self._prev_roster, None
                keys = handler._keys
                members = roster_members(keys, self._prev, roster) if roster else ()
            else:
                members = await read_roster(handler._store, handler._keys, self._prev)
            self._prev_ranks = {node: rank for rank, node in enumerate(members)}
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is None:
            snapshot, self._events = await handler._store.range_and_watch(handler._keys.nodes)
        self._recount(snapshot)

    def _recount(self, snapshot: RangeResult) -> None:
        """Count the registrations of ``snapshot`` (afresh: a node counted before is not told
        of again)."""
        told = set(self._current)
        self._current, self._previous, self._newcomers = {}, set(), set()
        for kv in sorted(snapshot, key=lambda kv: kv.mod_revision):  # in store order
            self.apply(EventType.PUT, kv, told=told)
        self._seen = snapshot.revision

    async def _count(self) -> None:
        loop = self._loop or asyncio.get_running_loop()
        last_call_at: float | None = None
        while True:
            await self._tell_members()
            now = loop.time()
            last_call_at = self._window(now, last_call_at)
            complete = last_call_at is not None and self._complete_now(now, last_call_at)
            if complete and await self.finalize() is not None:
                return
            if self._events is None and await self._follow():
                continue  # counted afresh: look again before waiting
            events = self._events
            assert events is not None
            if complete:  # a registrant's lease ended: its records' deletion is on the watch
                event: WatchEvent | None = await events.__anext__()
            else:
                event = await self._next_event(events, last_call_at)
            if event is not None and event.revision > self._seen:
                self.apply(event.type, event.kv)

    async def _follow(self) -> bool:
        """Watch ``n/`` from after the count; True if its history was compacted since (the
        registrations were read and counted afresh)."""
        store, nodes = self._handler._store, self._handler._keys.nodes
        watch = store.watch(nodes, start_revision=self._seen + 1)
        try:
            await watch.start()
        except CompactedError:
            await watch.aclose()
            snapshot, self._events = await store.range_and_watch(nodes)
            self._recount(snapshot)
            return True
        except BaseException:
            with anyio.CancelScope(shield=True):
                await watch.aclose()
            raise
        self._events = watch
        return False

    def _window(self, now: float, last_call_at: float | None) -> float | None:
        """The last call's deadline once the previous round has drained and ``min_nodes`` have
        registered; None below that (the window restarts, as torch's)."""
        handler = self._handler
        if self._previous or len(self._current) < handler._min:
            return None
        if last_call_at is None:
            last_call_at = now + handler._last_call
            handler._stats.last_call_deadline = last_call_at
        return last_call_at

    def _complete_now(self, now: float, last_call_at: float) -> bool:
        # Once the last round has drained (each member registered again or died), a round of its
        # survivors only (no newcomer) forms at once when fast_reform is on: the last call would
        # wait for nodes that are not coming (torchft's fast quorum).
        return (
            len(self._current) >= self._handler._max
            or now >= last_call_at
            or (self._handler._fast_reform and self._prev is not None and not self._newcomers)
        )

    @staticmethod
    async def _next_event(events: Watch, last_call_at: float | None) -> WatchEvent | None:
        """The next registration change; None when the last call ends first."""
        if last_call_at is None:
            return await events.__anext__()
        delay = max(0.0, last_call_at - asyncio.get_running_loop().time())
        with anyio.move_on_after(delay):
            return await events.__anext__()
        return None

    async def finalize(self) -> bool | None:
        """Write the roster (members in rank order, in chunks) and each member's record (bound
        to its lease), then the round record (rank 0's address, the world size) by
        compare-and-swap, while this node's claim holds. Whether it was written; None when a
        member's lease had ended (its deletion is on the way: count again, then write)."""
        handler = self._handler
        store, keys = handler._store, handler._keys
        members = self._rank_order()
        record, ops = self._round_ops(members)
        expected = 0 if self._prev_kv is None else self._prev_kv.mod_revision
        compare = [
            Compare.mod_revision(keys.round) == expected,
            Compare.mod_revision(keys.driver) == self._claim,
        ]
        *early, last = _batches(ops)
        self.finalizing = True  # from here the joiner lets this task finish (see JoinTasks)
        try:
            # (no shielding scope: on asyncio this task is in no anyio scope that could cancel it,
            # and a native cancel goes through a shield; the joiner, which may see the write
            # before this returns, lets it finish instead: ``finalizing``)
            try:
                for batch in early:  # a roster too large for one transaction: written first
                    if not (await store.txn(compare=compare, success=batch)).succeeded:
                        return False
                encoded = record.encode()  # (once: the next-round marker is the same bytes)
                result = await store.txn(
                    compare=compare,
                    success=[*last, Put(keys.round, encoded), *self._garbage(encoded)],
                )
            except LeaseNotFoundError as exc:
                log.debug("run %r: %s; counting again", handler.run_id, exc)
                return None
            if result.succeeded:
                self._completed(members)
        finally:
            self.finalizing = False
        return result.succeeded

    def _rank_order(self) -> tuple[str, ...]:
        """The members of the round, in rank order (the previous round's order kept)."""
        previous = sorted(self._prev_ranks, key=self._prev_ranks.__getitem__)
        return assign_ranks(
            ((node, kv.create_revision) for node, kv in self._current.items()),
            tuple(previous),
            self._handler._max,
        )

    def _round_ops(self, members: tuple[str, ...]) -> tuple[RoundRecord, list[Put]]:
        """The round record, and the roster's chunks and members' records to write before it."""
        keys, current = self._handler._keys, self._current
        rank0 = current[members[0]]
        master = NodeRecord.decode(rank0.key, rank0.value)
        chunks = [
            Put(keys.chunk(self.target, i), chunk.encode())
            for i, chunk in enumerate(roster_chunks(members))
        ]
        member_records = [
            Put(keys.member(self.target, node), MemberRecord(rank).encode(), current[node].lease)
            for rank, node in enumerate(members)
        ]
        kept = sum(1 for node in members if node in self._prev_ranks)
        departed = len(self._prev_ranks) - kept  # 0 for a first round (no previous members)
        record = RoundRecord(
            self.target, len(members), master.addr, master.port, len(chunks), departed
        )
        return record, [*chunks, *member_records]

    def _garbage(self, record: bytes) -> list[TxnOp]:
        """What goes with the round record's write: the previous round has drained, so its data
        store and roster are garbage; its members are told it is over (they have all moved on,
        unless one lost its lease); the members' records of the round before go. ``record``: the
        round record's bytes (the marker of the next round is the same)."""
        prev, keys = self._prev, self._handler._keys
        if prev is None:
            return []
        garbage: list[TxnOp] = [
            Put(keys.next_marker(prev.round), record),
            DeletePrefix(keys.data(prev.round)),
            DeletePrefix(keys.roster_of(prev.round)),
        ]
        if prev.round > 0:
            garbage.append(DeletePrefix(keys.members_of(prev.round - 1)))
        return garbage

    def _completed(self, members: tuple[str, ...]) -> None:
        handler = self._handler
        handler._stats.rounds_driven += 1
        self.ranks = {node: rank for rank, node in enumerate(members)}
        self.members = members
        log.info("run %r round %d complete: %d members", handler.run_id, self.target, len(members))
        handler._emit("rendezvous.round_finalized", round=self.target, world_size=len(members))


def _batches(puts: list[Put]) -> list[list[TxnOp]]:
    """``puts`` cut into transactions within the store's limits (at least one, maybe empty)."""
    batches: list[list[TxnOp]] = [[]]
    size = 0
    for put in puts:
        cost = len(put.key) + len(put.value)
        if len(batches[-1]) >= _BATCH_OPS or (batches[-1] and size + cost > _BATCH_BYTES):
            batches.append([])
            size = 0
        batches[-1].append(put)
        size += cost
    return batches
