"""The driver claim of a forming round: what claims ``c/driver``, and what goes with it.

A join whose view of ``c/`` shows nobody driving the round it registers for claims the driver in
its registration's transaction (``c/driver`` compared with what the view saw). What the driver
needs first goes in that transaction's success branch too, so that it costs no request of its
own: the registrations present and the last round's roster (its count starts from them), and
its word to the last round's members that one of them (this node) registered again
(``m/<round>/~due``: the round restarts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..store import Compare, KeyValue, Put, PutResult, Range, RangeResult, TxnResult
from ._driver import SNAPSHOT_LIMIT
from ._state import DriverRecord, DueRecord, RoundRecord

if TYPE_CHECKING:
    from ..store import LeaseKeeper
    from ._control import ControlView
    from .dynamic import DynamicRendezvousHandler


@dataclass(frozen=True, slots=True)
class Claim:
    """The compare and the writes that claim ``c/driver`` for a round (the claim first, then
    the word to the last round's members, if any), and the reads that go with them."""

    compare: Compare
    puts: tuple[Put, ...]
    reads: tuple[Range, ...]


@dataclass(frozen=True, slots=True)
class Claimed:
    """A claim that landed: its mod_revision, the registrations and the last round's roster
    chunks read with it (None: not read), and whether it told the last round's members that
    this node restarts it."""

    revision: int
    snapshot: RangeResult | None = None
    roster: tuple[KeyValue, ...] | None = None
    told: bool = False


def claim_ops(
    h: DynamicRendezvousHandler, ctl: ControlView, target: int, keeper: LeaseKeeper
) -> Claim | None:
    """What claims ``c/driver`` for ``target`` (bound to the lease) if the view shows nobody
    holds it for ``target`` yet; None if somebody does.

    The claim reads the registrations present with it, and the last round's roster if this node
    does not have it, unless the previous round's members (still registered for it, or again
    for ``target``) would not fit the read's limit: the driver then reads them itself, once,
    rather than twice. A member of the last round (of more than one) restarts it: the word to
    its members goes with the claim, as the driver would write it on counting this node."""
    current, kv = ctl.driver, ctl.driver_kv
    if current is not None and current.round >= target:
        return None
    expected = 0 if kv is None else kv.mod_revision
    keys = h._keys
    puts = [Put(keys.driver, DriverRecord(target, h.node_id).encode(), keeper.id)]
    latest = ctl.round
    if latest is not None and latest.round == h._round and latest.world_size > 1:
        puts.append(Put(keys.due(latest.round), DueRecord(h.node_id, 1, True).encode()))
    compare = Compare.mod_revision(keys.driver) == expected
    return Claim(compare, tuple(puts), _reads(h, latest))


def _reads(h: DynamicRendezvousHandler, latest: RoundRecord | None) -> tuple[Range, ...]:
    if latest is None:
        return (Range(h._keys.nodes, limit=SNAPSHOT_LIMIT),)
    if latest.world_size >= SNAPSHOT_LIMIT:
        return ()
    nodes = Range(h._keys.nodes, limit=SNAPSHOT_LIMIT)
    known = h._result
    has_it = known is not None and known.round == latest.round and bool(known.participants)
    if latest.chunks == 0 or has_it:
        return (nodes,)  # (a static round's members are known by their count)
    return nodes, Range(h._keys.roster_of(latest.round))


def claimed(claim: Claim, result: TxnResult, skip: int) -> Claimed:
    """What the claiming transaction's success branch returned (after ``skip`` results of the
    registration's own operations)."""
    results = result.results[skip:]
    put = results[0]
    assert isinstance(put, PutResult)
    reads = results[len(claim.puts) :]
    snapshot: RangeResult | None = None
    roster: tuple[KeyValue, ...] | None = None
    if reads:
        nodes = reads[0]
        assert isinstance(nodes, RangeResult)
        # (as of the transaction: a watch from the next revision misses nothing)
        snapshot = RangeResult(nodes.kvs, result.revision, nodes.count, nodes.more)
    if len(reads) > 1:
        assert isinstance(reads[1], RangeResult)
        roster = reads[1].kvs
    return Claimed(put.kv.mod_revision, snapshot, roster, told=len(claim.puts) > 1)


def own_claim(
    h: DynamicRendezvousHandler, ctl: ControlView, target: int, keeper: LeaseKeeper
) -> Claimed | None:
    """The view's claim for ``target`` if it is this node's, from an interrupted join with this
    lease (it drives again), else None."""
    current, kv = ctl.driver, ctl.driver_kv
    mine = current is not None and current.round == target and current.node_id == h.node_id
    return Claimed(kv.mod_revision) if mine and kv is not None and kv.lease == keeper.id else None


async def claim_driver(
    h: DynamicRendezvousHandler, ctl: ControlView, target: int, keeper: LeaseKeeper
) -> Claimed | None:
    """Claim ``c/driver`` for ``target`` by itself (this node registered already): the claim
    if this node drives it, else None. (The driver reads the registrations with its watch, and
    tells the members of this node's registration as it counts it.)"""
    claim = claim_ops(h, ctl, target, keeper)
    if claim is None:
        return own_claim(h, ctl, target, keeper)
    put, expected = claim.puts[0], claim.compare.operand
    assert isinstance(expected, int)
    result = await h._store.compare_and_swap(put.key, expected, put.value, lease=put.lease)
    return Claimed(result.kv.mod_revision) if result.succeeded and result.kv is not None else None
