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
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..errors import CompactedError, LeaseNotFoundError, RendezvousNotFoundError
from ._state import ClosedRecord, DriverRecord, NodeRecord, RoundRecord, RunKeys

if TYPE_CHECKING:
    from ..store import Store

__all__ = [
    "MemberStatus",
    "NodeStatus",
    "RunStatus",
    "format_run_status",
    "read_run_status",
    "watch_run_status",
]


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """A member of the latest completed round.

    ``alive``: its record for that round is still in the store (False once its lease expired or it
    left). ``lease_remaining``: seconds its lease has left (None when not alive or the lease is
    gone). ``rejoined``: it has registered for the next round (it is restarting).
    """

    rank: int
    node_id: str
    alive: bool
    lease_remaining: float | None
    addr: str | None
    rejoined: bool


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """A node registered for the round being formed (``waiting`` or ``standby``).

    ``registered_revision``: the store revision of its registration (earlier fills free ranks
    first). ``member``: it is a member of the latest round (re-registering to restart).
    """

    node_id: str
    addr: str
    lease_remaining: float | None
    registered_revision: int
    member: bool


@dataclass(frozen=True, slots=True)
class RunStatus:
    """A run's rendezvous state at store ``revision`` (see the module docstring).

    ``round`` is the latest completed round (None before the first); ``members`` are its members in
    rank order; ``forming_round`` is the round nodes register for now and ``driver`` the node
    driving it (None when nobody does). ``closed``: the run is closed for new handlers;
    ``closed_after_round`` is the round it was closed after (-1: before any) and ``reopened`` tells
    that a ``reopen_closed`` handler started a new generation since.
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

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict of the snapshot (what ``aioelastic status --json`` prints)."""
        return asdict(self)


async def read_run_status(store: Store, run_id: str) -> RunStatus:
    """Read ``run_id``'s rendezvous state from ``store`` as one :class:`RunStatus` snapshot.

    Raises :class:`~aioelastic.errors.RendezvousNotFoundError` if the store holds nothing for the
    run, :class:`~aioelastic.errors.RendezvousStateError` for corrupt or foreign records, and the
    store's errors (``StoreConnectionError`` ...) as they are.
    """
    status = await _read(store, RunKeys(run_id))
    if status is None:
        raise RendezvousNotFoundError(f"no rendezvous state for run id {run_id!r} in the store")
    return status


async def _read(store: Store, keys: RunKeys) -> RunStatus | None:
    result = await store.range(keys.root)
    round_record: RoundRecord | None = None
    driver: DriverRecord | None = None
    closed: ClosedRecord | None = None
    # round -> node -> (record, create revision, lease)
    nodes: dict[int, dict[str, tuple[NodeRecord, int, int]]] = {}
    for kv in result.kvs:
        if kv.key == keys.round:
            round_record = RoundRecord.decode(kv.key, kv.value)
        elif kv.key == keys.driver:
            driver = DriverRecord.decode(kv.key, kv.value)
        elif kv.key == keys.closed:
            closed = ClosedRecord.decode(kv.key, kv.value)
        else:
            parsed = keys.parse_node_key(kv.key)
            if parsed is not None:
                record = NodeRecord.decode(kv.key, kv.value)
                nodes.setdefault(parsed[0], {})[parsed[1]] = (
                    record,
                    kv.create_revision,
                    kv.lease,
                )
    if not result.kvs:
        return None

    remaining: dict[int, float | None] = {}

    async def lease_left(lease: int) -> float | None:
        if lease == 0:
            return None
        if lease not in remaining:
            try:
                remaining[lease] = (await store.lease_time_to_live(lease)).remaining
            except LeaseNotFoundError:  # expired since the range: the node is gone
                remaining[lease] = None
        return remaining[lease]

    forming = 0 if round_record is None else round_record.round + 1
    registered = nodes.get(forming, {})
    members: list[MemberStatus] = []
    intact = round_record is not None
    if round_record is not None:
        live = nodes.get(round_record.round, {})
        for rank, node_id in enumerate(round_record.members):
            entry = live.get(node_id)
            rejoined = node_id in registered
            if entry is None or rejoined:
                intact = False
            members.append(
                MemberStatus(
                    rank=rank,
                    node_id=node_id,
                    alive=entry is not None,
                    lease_remaining=None if entry is None else await lease_left(entry[2]),
                    addr=None if entry is None else entry[0].addr,
                    rejoined=rejoined,
                )
            )
    member_ids = set() if round_record is None else set(round_record.members)
    candidates: list[NodeStatus] = []
    for node_id, (record, revision, lease) in sorted(
        registered.items(), key=lambda item: (item[1][1], item[0])
    ):
        candidates.append(
            NodeStatus(
                node_id=node_id,
                addr=record.addr,
                lease_remaining=await lease_left(lease),
                registered_revision=revision,
                member=node_id in member_ids,
            )
        )
    return RunStatus(
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
    )


async def watch_run_status(store: Store, run_id: str) -> AsyncGenerator[RunStatus, None]:
    """Yield ``run_id``'s status now, then again after every change under the run's prefix.

    A burst of changes yields one snapshot covering all of them (a snapshot read after an event
    includes every event up to its revision). Raises
    :class:`~aioelastic.errors.RendezvousNotFoundError` if the run does not exist at the start; a
    run whose records all vanish later yields nothing until they come back.
    """
    keys = RunKeys(run_id)
    status = await read_run_status(store, run_id)
    yield status
    seen = status.revision
    while True:
        try:
            async with store.watch(keys.root, start_revision=seen + 1) as events:
                async for event in events:
                    if event.revision <= seen:
                        continue  # already in the last snapshot
                    current = await _read(store, keys)
                    if current is None:
                        seen = event.revision
                        continue
                    seen = current.revision
                    yield current
        except CompactedError:  # history we missed was compacted: read afresh, watch from there
            current = await _read(store, keys)
            if current is not None:
                seen = current.revision
                yield current
            else:
                seen = await store.current_revision()


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
            f"round: {status.round}  world size {len(status.members)}  "
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
    return "\n".join(lines)
