"""A read-only snapshot of a run's rendezvous state, for ``aioelastic status`` and for programs.

``await read_run_status(store, run_id)`` reads every record under the run's prefix in **one**
range (so the records are consistent at one store revision), decodes them with the validated
parsers of :mod:`aioelastic.rendezvous._state`, then asks the store how long each node's lease has
left. ``watch_run_status`` yields a new snapshot after every change, driven by a store watch on the
run's prefix (nothing polls).

The store cannot tell a standby from a waiting node by itself (it does not know ``max_nodes``), so
a node registered for the next round is reported as a **standby** while the latest round is intact
(every member alive and none re-registered: no re-rendezvous is under way), and as **waiting**
otherwise (no round yet, or a member has left, died or re-registered).

Active watchdog timers of the run are listed too when they live in the store: the
:class:`~aioelastic.timer.StoreTimerClient` keys under the run's conventional prefix
(:func:`aioelastic.timer.run_prefix`, ``aioelastic/run-timers/<run_id>/``) or under the
``timers_prefix`` given. They are read right after the rendezvous records (a second range: the two
are not one atomic snapshot); ``time_left`` is against this host's wall clock at that moment.
Timers on an agent's Unix-socket server are not in the store and are not listed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import CompactedError, LeaseNotFoundError, RendezvousNotFoundError
from ._state import ClosedRecord, DriverRecord, NodeRecord, RoundRecord, RunKeys, roster_members

if TYPE_CHECKING:
    from ..store import KeyValue, Store

__all__ = [
    "MemberStatus",
    "NodeStatus",
    "RunStatus",
    "TimerStatus",
    "format_run_status",
    "read_run_status",
    "watch_run_status",
]


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """A member of the latest completed round.

    ``alive``: its record for that round is still in the store (False once its lease expired or it
    left). ``lease_remaining``: seconds its lease has left (None when not alive or the lease is
    gone); ``lease_ttl``: the TTL the lease was granted with (what a keep-alive restores).
    ``rejoined``: it has registered for the next round (it is restarting).
    """

    rank: int
    node_id: str
    alive: bool
    lease_remaining: float | None
    addr: str | None
    rejoined: bool
    lease_ttl: float | None = None


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """A node registered for the round being formed (``waiting`` or ``standby``).

    ``registered_revision``: the store revision of its registration (earlier fills free ranks
    first). ``member``: it is a member of the latest round (re-registering to restart).
    ``lease_ttl``: the TTL its lease was granted with.
    """

    node_id: str
    addr: str
    lease_remaining: float | None
    registered_revision: int
    member: bool
    lease_ttl: float | None = None


@dataclass(frozen=True, slots=True)
class TimerStatus:
    """An armed watchdog timer of the run, as kept in the store (not yet released nor reaped).

    ``expiration_time`` is wall-clock (epoch seconds); ``time_left`` is seconds until it, from this
    host's clock when read (negative: overdue, its server has not reaped it yet). ``pid`` is the
    process a signal reaper would kill, when the worker gave one.
    """

    worker_id: int | str
    scope_id: str
    pid: int | None
    expiration_time: float
    time_left: float
    key: str


@dataclass(frozen=True, slots=True)
class RunStatus:
    """A run's rendezvous state at store ``revision`` (see the module docstring).

    ``round`` is the latest completed round (None before the first); ``members`` are its members in
    rank order; ``forming_round`` is the round nodes register for now and ``driver`` the node
    driving it (None when nobody does). ``closed``: the run is closed for new handlers;
    ``closed_after_round`` is the round it was closed after (-1: before any) and ``reopened`` tells
    that a ``reopen_closed`` handler started a new generation since. ``timers`` are the run's
    armed store timers under ``timers_prefix``, soonest first (see the module docstring).
    """

    run_id: str
    revision: int
    round: int | None
    members: tuple[MemberStatus, ...]
    master_addr: str | None
    master_port: int | None
    forming_round: int
    driver: str | None
    waiting: tuple[NodeStatus, ...]
    standby: tuple[NodeStatus, ...]
    closed: bool
    closed_after_round: int | None
    reopened: bool
    timers: tuple[TimerStatus, ...] = ()
    timers_prefix: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict of the snapshot (what ``aioelastic status --json`` prints)."""
        return asdict(self)


async def read_run_status(
    store: Store, run_id: str, *, timers_prefix: str | None = None
) -> RunStatus:
    """Read ``run_id``'s rendezvous state from ``store`` as one :class:`RunStatus` snapshot.

    ``timers_prefix``: where the run's store timers live (default: the run's conventional
    prefix, :func:`aioelastic.timer.run_prefix`). Raises
    :class:`~aioelastic.errors.RendezvousNotFoundError` if the store holds nothing for the run,
    :class:`~aioelastic.errors.RendezvousStateError` for corrupt or foreign records, and the
    store's errors (``StoreConnectionError`` ...) as they are.
    """
    keys = RunKeys(run_id)
    status, _, _ = await _read(store, keys, _timers_prefix(keys, timers_prefix))
    if status is None:
        raise RendezvousNotFoundError(f"no rendezvous state for run id {run_id!r} in the store")
    return status


def _timers_prefix(keys: RunKeys, timers_prefix: str | None) -> str:
    if timers_prefix is None:
        from ..timer import run_prefix

        return run_prefix(keys.run_id)
    if not isinstance(timers_prefix, str) or not timers_prefix:
        raise ValueError(f"timers_prefix must be a non-empty str, got {timers_prefix!r}")
    return timers_prefix


async def _read_timers(store: Store, prefix: str) -> tuple[tuple[TimerStatus, ...], int]:
    """The armed timers under ``prefix``, soonest first, and the revision of the read."""
    from ..timer import TimerRequest, timer_key

    result = await store.range(prefix)
    now = time.time()
    timers: list[TimerStatus] = []
    for kv in result.kvs:
        try:
            request = TimerRequest.from_json(kv.value)
        except (ValueError, TypeError):
            continue  # not a timer (its server rejects it too)
        expiration = request.expiration_time
        if expiration is None or kv.key != timer_key(
            prefix, str(request.worker_id), request.scope_id
        ):
            continue
        timers.append(
            TimerStatus(
                worker_id=request.worker_id,
                scope_id=request.scope_id,
                pid=request.pid,
                expiration_time=expiration,
                time_left=expiration - now,
                key=kv.key,
            )
        )
    timers.sort(key=lambda t: (t.expiration_time, t.key))
    return tuple(timers), result.revision


#: round -> node -> (record, create revision, lease)
_Nodes = dict[int, dict[str, tuple[NodeRecord, int, int]]]


@dataclass(slots=True)
class _RunRecords:
    """The decoded records of one run, from one range."""

    round: RoundRecord | None = None
    members: tuple[str, ...] = ()  # the round's, in rank order (from its roster)
    driver: DriverRecord | None = None
    closed: ClosedRecord | None = None
    nodes: _Nodes = field(default_factory=dict)


def _decode(keys: RunKeys, kvs: Sequence[KeyValue]) -> _RunRecords:
    found = _RunRecords()
    roster: list[KeyValue] = []
    for kv in kvs:
        if kv.key.startswith(keys.roster):
            roster.append(kv)
        elif kv.key == keys.round:
            found.round = RoundRecord.decode(kv.key, kv.value)
        elif kv.key == keys.driver:
            found.driver = DriverRecord.decode(kv.key, kv.value)
        elif kv.key == keys.closed:
            found.closed = ClosedRecord.decode(kv.key, kv.value)
        else:
            parsed = keys.parse_node_key(kv.key)
            if parsed is not None:
                record = NodeRecord.decode(kv.key, kv.value)
                found.nodes.setdefault(parsed[0], {})[parsed[1]] = (
                    record,
                    kv.create_revision,
                    kv.lease,
                )
    if found.round is not None:
        found.members = roster_members(keys, found.round, roster)
    return found


class _LeaseTimes:
    """How long each node's lease has left, asked of the store once per lease."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._leases: dict[int, tuple[float | None, float | None]] = {}

    async def left(self, lease: int) -> tuple[float | None, float | None]:
        """(seconds left, granted TTL) of ``lease``; (None, None) when it is gone or none."""
        if lease == 0:
            return None, None
        if lease not in self._leases:
            try:
                found = await self._store.lease_time_to_live(lease)
                self._leases[lease] = (found.remaining, found.granted_ttl)
            except LeaseNotFoundError:  # expired since the range: the node is gone
                self._leases[lease] = (None, None)
        return self._leases[lease]


async def _members(
    found: _RunRecords, registered: dict[str, tuple[NodeRecord, int, int]], leases: _LeaseTimes
) -> tuple[list[MemberStatus], bool]:
    """The latest round's members, and whether it is intact (all alive, none re-registered)."""
    if found.round is None:
        return [], False
    members: list[MemberStatus] = []
    intact = True
    live = found.nodes.get(found.round.round, {})
    for rank, node_id in enumerate(found.members):
        entry = live.get(node_id)
        rejoined = node_id in registered
        if entry is None or rejoined:
            intact = False
        left, ttl = (None, None) if entry is None else await leases.left(entry[2])
        members.append(
            MemberStatus(
                rank=rank,
                node_id=node_id,
                alive=entry is not None,
                lease_remaining=left,
                addr=None if entry is None else entry[0].addr,
                rejoined=rejoined,
                lease_ttl=ttl,
            )
        )
    return members, intact


async def _candidates(
    found: _RunRecords, registered: dict[str, tuple[NodeRecord, int, int]], leases: _LeaseTimes
) -> list[NodeStatus]:
    """The nodes registered for the forming round, in registration order."""
    member_ids = set(found.members)
    candidates: list[NodeStatus] = []
    for node_id, (record, revision, lease) in sorted(
        registered.items(), key=lambda item: (item[1][1], item[0])
    ):
        left, ttl = await leases.left(lease)
        candidates.append(
            NodeStatus(
                node_id=node_id,
                addr=record.addr,
                lease_remaining=left,
                registered_revision=revision,
                member=node_id in member_ids,
                lease_ttl=ttl,
            )
        )
    return candidates


async def _read(
    store: Store, keys: RunKeys, timers_prefix: str
) -> tuple[RunStatus | None, int, int | None]:
    """The run's status (None if it has no records), the revision of the read of its records,
    and that of its timers (None when they were not read)."""
    result = await store.range(keys.root)
    found = _decode(keys, result.kvs)
    if not result.kvs:
        return None, result.revision, None
    timers, timers_revision = await _read_timers(store, timers_prefix)
    round_record, driver, closed = found.round, found.driver, found.closed
    forming = 0 if round_record is None else round_record.round + 1
    registered = found.nodes.get(forming, {})
    leases = _LeaseTimes(store)
    members, intact = await _members(found, registered, leases)
    candidates = await _candidates(found, registered, leases)
    status = RunStatus(
        run_id=keys.run_id,
        revision=result.revision,
        round=None if round_record is None else round_record.round,
        members=tuple(members),
        master_addr=None if round_record is None else round_record.master_addr,
        master_port=None if round_record is None else round_record.master_port,
        forming_round=forming,
        driver=driver.node_id if driver is not None and driver.round == forming else None,
        waiting=() if intact else tuple(candidates),
        standby=tuple(candidates) if intact else (),
        closed=closed is not None and not closed.reopened,
        closed_after_round=None if closed is None else closed.round,
        reopened=closed is not None and closed.reopened,
        timers=timers,
        timers_prefix=timers_prefix,
    )
    return status, result.revision, timers_revision


async def watch_run_status(
    store: Store, run_id: str, *, timers_prefix: str | None = None
) -> AsyncGenerator[RunStatus, None]:
    """Yield ``run_id``'s status now, then again after every change under the run's prefix or
    its timers prefix (see :func:`read_run_status`).

    A burst of changes yields one snapshot covering all of them (a snapshot read after an event
    includes every event up to its revision). Raises
    :class:`~aioelastic.errors.RendezvousNotFoundError` if the run does not exist at the start; a
    run whose records all vanish later yields nothing until they come back.
    """
    keys = RunKeys(run_id)
    tprefix = _timers_prefix(keys, timers_prefix)
    prefixes = (keys.root, tprefix)
    status, run_rev, timers_rev = await _read(store, keys, tprefix)
    if status is None:
        raise RendezvousNotFoundError(f"no rendezvous state for run id {run_id!r} in the store")
    yield status
    # the revision each prefix's last read saw: an event at or below it is in the last snapshot
    seen = [run_rev, run_rev if timers_rev is None else timers_rev]
    while True:
        try:
            async for index, revision in _changes(store, prefixes, min(seen) + 1):
                if revision <= seen[index]:
                    continue
                current, run_rev, timers_rev = await _read(store, keys, tprefix)
                seen[0] = run_rev
                if timers_rev is not None:
                    seen[1] = timers_rev
                elif index == 1:  # the run is gone: its timers were not read
                    seen[1] = revision
                if current is not None:
                    yield current
        except CompactedError:  # history we missed was compacted: read afresh, watch from there
            current, run_rev, timers_rev = await _read(store, keys, tprefix)
            seen = [run_rev, run_rev if timers_rev is None else timers_rev]
            if current is not None:
                yield current


async def _changes(
    store: Store, prefixes: Sequence[str], start_revision: int
) -> AsyncIterator[tuple[int, int]]:
    """``(index of the prefix, revision)`` of each change under any of ``prefixes``, from
    ``start_revision``: one store watch per prefix, merged as the events arrive."""
    watches = [store.watch(prefix, start_revision=start_revision) for prefix in prefixes]
    pending: dict[asyncio.Future[Any], int] = {}
    try:
        for watch in watches:
            await watch.__aenter__()
        pending = {asyncio.ensure_future(anext(w)): i for i, w in enumerate(watches)}
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: pending[t]):
                index = pending.pop(task)
                try:
                    event = task.result()
                except StopAsyncIteration:
                    continue  # that watch ended
                pending[asyncio.ensure_future(anext(watches[index]))] = index
                yield index, event.revision
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
            for task in pending:
                if not task.cancelled():
                    task.exception()
        for watch in watches:
            await watch.aclose()


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]


def format_run_status(status: RunStatus, *, as_json: bool = False) -> str:
    """``status`` as aligned plain text (or one line of JSON with ``as_json``)."""
    if as_json:
        return json.dumps(status.to_json(), sort_keys=True)
    if status.closed:
        state = f"closed after round {status.closed_after_round}"
    elif status.reopened:
        state = f"open (reopened; closed after round {status.closed_after_round} before)"
    else:
        state = "open"
    lines = [f"run {status.run_id}  (store revision {status.revision})", f"state: {state}"]
    if status.round is None:
        lines.append("round: none completed yet")
    else:
        lines.append(
            f"round: {status.round}  nodes {len(status.members)}  "
            f"master {status.master_addr}:{status.master_port}"
        )
        rows = [
            (
                str(m.rank),
                m.node_id,
                "alive" if m.alive else "gone",
                _seconds(m.lease_remaining),
                m.addr or "-",
                "yes" if m.rejoined else "",
            )
            for m in status.members
        ]
        lines.append("members:")
        lines.extend(_table(("RANK", "NODE", "STATE", "LEASE LEFT", "ADDR", "REJOINED"), rows))
    driver = status.driver or "none"
    lines.append(f"forming round: {status.forming_round}  driver {driver}")
    for title, group in (("waiting", status.waiting), ("standby", status.standby)):
        if not group:
            lines.append(f"{title}: none")
            continue
        lines.append(f"{title}:")
        node_rows = [
            (n.node_id, _seconds(n.lease_remaining), n.addr, "yes" if n.member else "")
            for n in group
        ]
        lines.extend(_table(("NODE", "LEASE LEFT", "ADDR", "MEMBER"), node_rows))
    if not status.timers:
        lines.append(f"timers: none under {status.timers_prefix}")
    else:
        lines.append(f"timers ({len(status.timers)} under {status.timers_prefix}):")
        timer_rows = [
            (
                str(t.worker_id),
                t.scope_id,
                "-" if t.pid is None else str(t.pid),
                _utc(t.expiration_time),
                f"{t.time_left:.1f}s" if t.time_left >= 0 else f"overdue {-t.time_left:.1f}s",
            )
            for t in status.timers
        ]
        lines.extend(_table(("WORKER", "SCOPE", "PID", "DEADLINE (UTC)", "TIME LEFT"), timer_rows))
    return "\n".join(lines)


def _utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 10)}"
