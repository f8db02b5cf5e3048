"""White-box tests of the requests a dynamic join sends to its store, counted one by one.

A join is one round trip where it can be: no request on the join path is there to find out
something a watch already says. These tests pin the exact requests of a first join, of a rejoin
that goes on from the kept control watch, and of a rejoin into a round another node drives, on
the memory store (the backend does not change what the handler asks for). A regression (a read
added to the join, a doomed driver claim, a second watch of ``c/``) fails them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aioelastic.rendezvous import (
    DynamicRendezvousHandler,
    RendezvousEventKind,
    RendezvousResult,
    RendezvousStatus,
    RendezvousStoreInfo,
)
from aioelastic.rendezvous._state import (
    MemberRecord,
    RosterChunk,
    RoundRecord,
    RunKeys,
    kept_rank,
    kept_roster,
)
from aioelastic.store import Delete, DeletePrefix, MemoryEngine, MemoryStore, Put, Txn, TxnOp
from aioelastic.store.memory import _MemoryWatch
from aioelastic.testing import virtual_test

KEYS = RunKeys("job")


class _LoggedWatch(_MemoryWatch):
    """A watch whose end is logged as the ``unwatch`` an http client sends for it."""

    async def _aclose(self) -> None:
        if self._watcher is not None:
            store = self._store
            assert isinstance(store, _RequestLog)
            store.requests.append(("unwatch", self.prefix))
        await super()._aclose()


class _RequestLog(MemoryStore):
    """A memory store that logs each request a client would send: ``(operation, key)``.

    ``range_and_watch`` is one request (it is on the http store), not the range and the watch
    it is made of here; the end of a started watch is one (``unwatch``).
    """

    def __init__(self, engine: MemoryEngine) -> None:
        super().__init__(engine)
        self.requests: list[tuple[str, str]] = []
        self._inside = False

    def _log(self, op: str, key: str) -> None:
        if not self._inside:
            self.requests.append((op, key))

    async def _get(self, key: str) -> Any:
        self._log("get", key)
        return await super()._get(key)

    async def _range(self, prefix: str, limit: int | None) -> Any:
        self._log("range", prefix)
        return await super()._range(prefix, limit)

    async def _put(self, key: str, value: bytes, lease: int) -> Any:
        self._log("put", key)
        return await super()._put(key, value, lease)

    async def _delete(self, key: str, prefix: bool) -> Any:
        self._log("delete_prefix" if prefix else "delete", key)
        return await super()._delete(key, prefix)

    async def _compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, lease: int
    ) -> Any:
        result = await super()._compare_and_swap(key, expected_mod_revision, value, lease)
        self._log("cas" if result.succeeded else "failed cas", key)
        return result

    async def _compare_and_delete(self, key: str, expected_mod_revision: int) -> Any:
        self._log("cad", key)
        return await super()._compare_and_delete(key, expected_mod_revision)

    def _watch(self, prefix: str, start_revision: int | None) -> Any:
        self._log("watch", prefix)
        return _LoggedWatch(self, prefix, start_revision)

    async def _range_and_watch(self, prefix: str) -> Any:
        self._log("range_and_watch", prefix)
        self._inside = True
        try:
            return await super()._range_and_watch(prefix)
        finally:
            self._inside = False

    async def _txn(self, txn: Txn) -> Any:
        # one request: what the branch that ran did (its compares aside)
        result = await super()._txn(txn)
        branch = txn.success if result.succeeded else txn.failure
        self._log("txn", ", ".join(_describe(op) for op in branch))
        return result

    async def _lease_grant(self, ttl: float) -> Any:
        self._log("lease_grant", "")
        return await super()._lease_grant(ttl)

    def take(self) -> list[tuple[str, str]]:
        requests, self.requests = self.requests, []
        return requests


def _describe(op: TxnOp) -> str:
    if isinstance(op, Put):
        return f"put {op.key}"
    if isinstance(op, Delete):
        return f"delete {op.key}"
    if isinstance(op, DeletePrefix):
        return f"delete_prefix {op.prefix}"
    return f"{type(op).__name__.lower()} {getattr(op, 'key', getattr(op, 'prefix', ''))}"


def _handler(
    engine: MemoryEngine, min_nodes: int, max_nodes: int, **kw: Any
) -> DynamicRendezvousHandler:
    return DynamicRendezvousHandler(
        _RequestLog(engine), "job", min_nodes, max_nodes, lease_ttl=6.0, last_call_timeout=0, **kw
    )


def _log_of(handler: DynamicRendezvousHandler) -> _RequestLog:
    store = handler.store
    assert isinstance(store, _RequestLog)
    return store


def _driving(
    node: str, round_: int, *, roster_read: bool = False, due: bool = False, watched: bool = False
) -> list[tuple[str, str]]:
    """What driving ``round_`` of one member (``node``) adds to a join: the previous
    roster when this node does not have it, the count (a watch of the registrations, only if
    ``watched``: a driver whose claim read them all and that can complete the round at once
    needs none), the word to the previous round's members that a round forms (``due``), and
    the roster (one chunk here), the members' records and the round record, written with the
    previous round's garbage and its members told it is over (one transaction)."""
    garbage = ""
    if round_ > 0:
        garbage = (
            f", put {KEYS.next_marker(round_ - 1)}, delete_prefix {KEYS.data(round_ - 1)}, "
            f"delete_prefix {KEYS.roster_of(round_ - 1)}"
        )
        if round_ > 1:
            garbage += f", delete_prefix {KEYS.members_of(round_ - 2)}"
    return [
        *([("range", KEYS.roster_of(round_ - 1))] if roster_read else []),
        *([("range_and_watch", KEYS.nodes)] if watched else []),
        *([("put", KEYS.due(round_ - 1))] if due else []),
        (
            "txn",
            f"put {KEYS.chunk(round_, 0)}, put {KEYS.member(round_, node)}, "
            f"put {KEYS.round}{garbage}",
        ),
        *([("unwatch", KEYS.nodes)] if watched else []),
    ]


def _claiming(node: str, round_: int) -> tuple[str, str]:
    """A registration for ``round_`` (leaving the round before) that claims the driver and
    reads the registrations present, in one transaction."""
    left = f", delete {KEYS.node(round_ - 1, node)}" if round_ else ""
    return ("txn", f"put {KEYS.node(round_, node)}{left}, put {KEYS.driver}, range {KEYS.nodes}")


@virtual_test
async def test_a_first_join_and_a_rejoin_send_only_what_they_must() -> None:
    engine = MemoryEngine()
    handler = _handler(engine, 1, 1)
    log = _log_of(handler)
    me = handler.node_id
    await handler.next_rendezvous()
    # the view of c/ and the lease at once; the registration; then the round it drives
    assert log.take() == [
        ("range_and_watch", KEYS.ctl),
        ("lease_grant", ""),
        _claiming(me, 0),  # with the driver claim and the registrations it counts from
        *_driving(me, 0),
    ]
    await handler.next_rendezvous()
    # the kept watch: no watch to open, nothing read; the registration leaving the old round,
    # with the driver claim (one transaction); the round complete from what it read: the
    # round's write, and no watch of the registrations (two requests in all)
    assert log.take() == [
        _claiming(me, 1),
        *_driving(me, 1),  # (a round of one restarting: no other member to tell)
    ]
    await handler.aclose()


@virtual_test
async def test_a_rejoin_into_a_round_another_node_drives_is_its_registration() -> None:
    engine = MemoryEngine()
    members = [_handler(engine, 2, 3) for _ in range(2)]
    newcomer = _handler(engine, 2, 3)
    await asyncio.gather(*(h.next_rendezvous() for h in members))
    # a first join beside another: its claim of the driver is not sent once the watch has it
    drivers = [h for h in members if h.statistics().rounds_driven]
    (other,) = [h for h in members if h not in drivers]
    assert _log_of(other).take() == [
        ("range_and_watch", KEYS.ctl),
        ("lease_grant", ""),
        ("cas", KEYS.node(0, other.node_id)),
        ("range", KEYS.roster_of(0)),  # participants: the roster, read once the round is out
    ]
    for h in members:
        _log_of(h).take()
    late = asyncio.ensure_future(newcomer.next_rendezvous())  # it claims the driver of round 1
    for h in members:
        assert (await h.wait_for_change()).kind is RendezvousEventKind.NODES_WAITING
        _log_of(h).take()  # (the member watch's counts: not the join's)
    await asyncio.gather(*(h.next_rendezvous() for h in members), late)
    for h in members:
        # the kept watch already holds the newcomer's claim: no read, no claim, one request:
        # the registration with the removal of the old one (how a member leaves its round),
        # after the end of the member watch of its round (an unwatch nobody waits for)
        assert _log_of(h).take() == [
            ("unwatch", KEYS.members_of(0)),
            ("txn", f"put {KEYS.node(1, h.node_id)}, delete {KEYS.node(0, h.node_id)}"),
            ("range", KEYS.roster_of(1)),
        ]
    assert newcomer.statistics().rounds_driven == 1
    # the newcomer drove round 1 without the roster of round 0: it read it (O(N), one node),
    # with the registrations present, in its claiming transaction: no read of its own
    (claiming,) = [r for r in _log_of(newcomer).take() if f"put {KEYS.driver}" in r[1]]
    assert claiming == (
        "txn",
        f"put {KEYS.node(1, newcomer.node_id)}, put {KEYS.driver}, range {KEYS.nodes}, "
        f"range {KEYS.roster_of(0)}",
    )
    await asyncio.gather(*(h.aclose() for h in [*members, newcomer]))


@virtual_test
async def test_a_prepared_handler_first_join_is_its_registration() -> None:
    """A registry creator prepares the handler: the view of c/ is read and the lease granted
    then, not in the join, so a first join registers at once, as a rejoin does."""
    engine = MemoryEngine()
    handler = _handler(engine, 1, 1)
    log = _log_of(handler)
    await handler._prepare()
    assert log.take() == [("range_and_watch", KEYS.ctl), ("lease_grant", "")]
    early = handler.lease
    assert early is not None
    await handler.next_rendezvous()
    me = handler.node_id
    assert log.take() == [_claiming(me, 0), *_driving(me, 0)]
    assert handler.lease is early
    await handler.aclose()
    assert not engine.watcher_count  # the prepared view closed with the handler
    assert not engine.lease_count  # and the prepared lease was revoked


@virtual_test
async def test_a_prepared_lease_lost_before_the_first_join_is_replaced_not_an_error() -> None:
    engine = MemoryEngine()
    handler = _handler(engine, 1, 1)
    log = _log_of(handler)
    await handler._prepare()
    early = handler.lease
    assert early is not None
    engine.lease_revoke(early.id)
    await asyncio.sleep(10)  # past a keep-alive: the keeper finds its lease gone
    assert early.lost
    assert handler.status is RendezvousStatus.ACTIVE  # nothing of this node was on it
    log.take()
    result = await handler.next_rendezvous()
    assert log.take() == [
        ("lease_grant", ""),
        _claiming(handler.node_id, 0),
        *_driving(handler.node_id, 0),
    ]
    assert result.rank == 0
    assert handler.lease is not None
    assert handler.lease is not early
    assert not handler.lease.lost
    await handler.aclose()


@virtual_test
async def test_without_participants_a_member_reads_only_its_own_record() -> None:
    """``participants=False``: a member that did not drive finds its rank with one get of its
    member record (O(1) bytes), not a read of the whole roster."""
    engine = MemoryEngine()
    hs = [_handler(engine, 2, 2, participants=False) for _ in range(2)]
    results = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    assert sorted(r.rank for r in results) == [0, 1]
    assert all(r.participants == () and r.world_size == 2 for r in results)
    (driver,) = [h for h in hs if h.statistics().rounds_driven]
    (other,) = [h for h in hs if h is not driver]
    assert _log_of(other).take() == [
        ("range_and_watch", KEYS.ctl),
        ("lease_grant", ""),
        ("cas", KEYS.node(0, other.node_id)),
        ("get", KEYS.member(0, other.node_id)),
    ]
    assert ("get", KEYS.member(0, driver.node_id)) not in _log_of(driver).take()  # it wrote it
    await asyncio.gather(*(h.aclose() for h in hs))


def _writes(requests: list[tuple[str, str]]) -> list[tuple[str, str]]:
    reads = ("get", "range", "range_and_watch", "watch", "unwatch", "lease_grant")
    return [r for r in requests if r[0] not in reads]


@virtual_test
async def test_nodes_joining_at_once_each_write_once_and_send_no_doomed_claim() -> None:
    """N fresh nodes joining together, then all rejoining: each one's join path is one write,
    its registration, which carries the driver claim (won or lost in it) whenever its view shows
    no claim for the round; no node sends a claim of its own, none fails (the driver's writes
    aside)."""
    n = 6
    engine = MemoryEngine()
    hs = [_handler(engine, n, n) for _ in range(n)]
    for round_ in range(2):
        driven = {h: h.statistics().rounds_driven for h in hs}
        for h in hs:
            _log_of(h).take()
        await asyncio.gather(*(h.next_rendezvous() for h in hs))
        (driver,) = [h for h in hs if h.statistics().rounds_driven > driven[h]]
        for h in sorted(hs, key=lambda h: h is driver):  # the driver last
            me, left = KEYS.node(round_, h.node_id), KEYS.node(round_ - 1, h.node_id)
            register = f"put {me}" + (f", delete {left}" if round_ else "")
            # (a rejoin's driver, a member of the last round, tells its members with the claim)
            due = f", put {KEYS.due(round_ - 1)}" if round_ else ""
            claim = f", put {KEYS.driver}{due}, range {KEYS.nodes}" if h is driver else ""
            writes = _writes(_log_of(h).take())
            if h is driver:  # and the driver's: the round (and its word to the members)
                writes = [w for w in writes if w[1] != KEYS.due(round_ - 1)]
                assert len(writes) == 2, writes  # (no claim of its own)
                assert writes[1][0] == "txn", writes
                assert f"put {KEYS.round}" in writes[1][1], writes
            # one registration (a cas or transaction without a claim, a transaction with one)
            assert writes[0] in {("txn", register + claim), ("cas", me)}, writes
            assert len(writes) == (2 if h is driver else 1), writes
    await asyncio.gather(*(h.aclose() for h in hs))


@virtual_test
async def test_a_warm_join_is_two_requests_for_the_driver_and_for_a_member() -> None:
    """A warm join (the lease and the control watch kept) as the driver of a round it can
    complete from its own registration (a round of one) is its registration and the round's
    write: the registrations it counts from come back in the claiming transaction, so no watch
    of them is opened or closed (main sent a range-and-watch and an unwatch as well). A member
    of a round another node drives is its registration: the round record says no member of
    the round before departed, so it kept its rank (main read it: a get of its member record)."""
    engine = MemoryEngine()
    alone = _handler(engine, 1, 1)
    await alone.next_rendezvous()
    _log_of(alone).take()
    await alone.next_rendezvous()
    driver_requests = _log_of(alone).take()
    assert [op for op, _ in driver_requests] == ["txn", "txn"], driver_requests
    assert ("range_and_watch", KEYS.nodes) not in driver_requests

    other = MemoryEngine()
    pair = [_handler(other, 2, 2, participants=False) for _ in range(2)]
    await asyncio.gather(*(h.next_rendezvous() for h in pair))
    driven = {h: h.statistics().rounds_driven for h in pair}
    for h in pair:
        _log_of(h).take()
    await asyncio.gather(*(h.next_rendezvous() for h in pair))
    (member,) = [h for h in pair if h.statistics().rounds_driven == driven[h]]
    (driver,) = [h for h in pair if h is not member]
    me = member.node_id
    assert _log_of(member).take() == [
        ("txn", f"put {KEYS.node(1, me)}, delete {KEYS.node(0, me)}"),
    ]
    # the driver of that rejoin round (participants=False: it has no roster of round 0) reads
    # the last roster in its claiming transaction too, not by a range of its own, and tells
    # the last round's members it restarts it there, not by a put of its own: then the count
    # (it waits for the other member) and the round
    requests = _log_of(driver).take()
    assert requests == [
        (
            "txn",
            f"put {KEYS.node(1, driver.node_id)}, delete {KEYS.node(0, driver.node_id)}, "
            f"put {KEYS.driver}, put {KEYS.due(0)}, range {KEYS.nodes}, "
            f"range {KEYS.roster_of(0)}",
        ),
        ("watch", KEYS.nodes),
        ("txn", requests[2][1]),
        ("unwatch", KEYS.nodes),
    ]
    assert f"put {KEYS.round}" in requests[2][1]
    await asyncio.gather(*(h.aclose() for h in [alone, *pair]))


async def _check_ranks(engine: MemoryEngine, results: dict[DynamicRendezvousHandler, Any]) -> None:
    """Each result's rank is the one its member record says (the driver's word)."""
    store = MemoryStore(engine)
    for h, result in results.items():
        key = KEYS.member(result.round, h.node_id)
        kv = await store.get(key)
        assert kv is not None
        assert MemberRecord.decode(key, kv.value).rank == result.rank
    assert sorted(r.rank for r in results.values()) == list(range(len(results)))


def _rank_reads(h: DynamicRendezvousHandler) -> list[tuple[str, str]]:
    return [r for r in _log_of(h).take() if r[0] == "get" and r[1].startswith(KEYS.members)]


@virtual_test
async def test_a_member_reads_its_rank_only_when_a_member_of_the_round_before_departed() -> None:
    """A member of the round before keeps its rank when none of that round's members departed
    (a newcomer joining does not move it): it reads nothing then. When one departed, ranks may
    move: each member that did not drive reads its own record. Every rank matches the member
    records the driver wrote."""
    engine = MemoryEngine()
    members = [_handler(engine, 2, 3, participants=False) for _ in range(2)]
    await asyncio.gather(*(h.next_rendezvous() for h in members))
    for h in members:
        _log_of(h).take()
    newcomer = _handler(engine, 2, 3, participants=False)
    late = asyncio.ensure_future(newcomer.next_rendezvous())  # it drives round 1
    for h in members:
        assert (await h.wait_for_change()).kind is RendezvousEventKind.NODES_WAITING
    joined = await asyncio.gather(*(h.next_rendezvous() for h in members))
    results = dict(zip(members, joined, strict=True))
    results[newcomer] = await late
    assert {r.round for r in results.values()} == {1}
    assert all(r.departed == 0 and r.world_size == 3 for r in results.values())
    assert [_rank_reads(h) for h in members] == [[], []]  # (main: a get each)
    await _check_ranks(engine, results)

    everyone = [*members, newcomer]
    gone = next(h for h in everyone if results[h].rank == 0)  # rank 0 leaves: ranks move
    assert gone.lease is not None
    engine.lease_revoke(gone.lease.id)
    survivors = [h for h in everyone if h is not gone]
    for h in survivors:
        assert (await h.wait_for_change()).kind is RendezvousEventKind.PARTICIPANT_LOST
        _log_of(h).take()
    driven = {h: h.statistics().rounds_driven for h in survivors}
    again = await asyncio.gather(*(h.next_rendezvous() for h in survivors))
    results = dict(zip(survivors, again, strict=True))
    assert all(r.round == 2 and r.departed == 1 for r in again)
    for h in survivors:
        drove = h.statistics().rounds_driven > driven[h]
        reads = [] if drove else [("get", KEYS.member(2, h.node_id))]
        assert _rank_reads(h) == reads
    await _check_ranks(engine, results)
    await asyncio.gather(*(h.aclose() for h in everyone))


def _result(round_: int, rank: int) -> RendezvousResult:
    return RendezvousResult(
        run_id="job",
        round=round_,
        rank=rank,
        world_size=4,
        participants=(),
        node_id="n",
        store=MemoryStore(MemoryEngine()),
        bootstrap_store_info=RendezvousStoreInfo("a", 1),
    )


def test_a_rank_is_kept_only_from_the_round_right_before_with_nobody_departed() -> None:
    record = RoundRecord(5, 4, "a", 1, 1, departed=0)
    assert kept_rank(record, _result(4, 2)) == 2
    assert kept_rank(record, _result(3, 2)) is None  # a round was missed: ranks may have moved
    assert kept_rank(record, None) is None  # not a member before
    assert kept_rank(RoundRecord(5, 4, "a", 1, 1, departed=1), _result(4, 2)) is None
    assert kept_rank(RoundRecord(5, 4, "a", 1, 1), _result(4, 2)) is None  # an older writer's
    assert kept_roster(record, _result(4, 2)) is None  # participants off: no roster to keep


@virtual_test
async def test_a_round_of_the_same_members_is_known_without_reading_its_roster() -> None:
    """``participants=True`` (the default): a rejoin round that kept every member of the round
    before and no more is that round's roster, at the same ranks: a member reads nothing (main
    read the roster, O(N) bytes, each). A round that grew is read (the newcomer's rank)."""
    engine = MemoryEngine()
    hs = [_handler(engine, 3, 3) for _ in range(3)]
    first = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    for h in hs:
        _log_of(h).take()
    again = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    for h, before, now in zip(hs, first, again, strict=True):
        assert [r for r in _log_of(h).take() if r[0] in ("get", "range")] == []
        assert (now.round, now.rank, now.participants) == (1, before.rank, before.participants)
    roster = await MemoryStore(engine).range(KEYS.roster_of(1))
    assert len(roster.kvs) == 1
    chunk = RosterChunk.decode(roster.kvs[0].key, roster.kvs[0].value)
    assert chunk.members == again[0].participants  # what the driver wrote
    await asyncio.gather(*(h.aclose() for h in hs))


def test_a_roster_is_kept_only_when_the_round_has_the_same_members() -> None:
    last = RendezvousResult(
        run_id="job",
        round=4,
        rank=1,
        world_size=2,
        participants=("a", "b"),
        node_id="b",
        store=MemoryStore(MemoryEngine()),
        bootstrap_store_info=RendezvousStoreInfo("a", 1),
    )
    assert kept_roster(RoundRecord(5, 2, "a", 1, 1, departed=0), last) == ("a", "b")
    assert kept_roster(RoundRecord(5, 3, "a", 1, 1, departed=0), last) is None  # one more
    assert kept_roster(RoundRecord(5, 2, "a", 1, 1, departed=1), last) is None
    assert kept_roster(RoundRecord(6, 2, "a", 1, 1, departed=0), last) is None
    assert kept_roster(RoundRecord(5, 2, "a", 1, 1), last) is None
