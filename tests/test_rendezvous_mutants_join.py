"""Tests for the dynamic rendezvous' join path that mutation testing showed missing (issue 22).

``dynamic.py`` (the handler), ``_join.py`` (the join coordinator) and ``_driver.py`` (the
round's driver): each test pins a behaviour a small, realistic bug would break and no other test
checked (see docs/testing.md, "Mutation testing"). Memory stores, virtual time.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

import anyio
import pytest
from helpers.events import ListSink

from aioelastic.errors import (
    LeaseExpiredError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousStateError,
    RendezvousTimeoutError,
    StoreConnectionError,
    WriteOutcomeUnknownError,
)
from aioelastic.rendezvous import DynamicRendezvousHandler, RendezvousStatus, _join, dynamic
from aioelastic.rendezvous._driver import RoundDriver
from aioelastic.rendezvous._state import ClosedRecord, DriverRecord, NodeRecord, RunKeys
from aioelastic.store import (
    MemoryEngine,
    MemoryStore,
    Put,
    RangeResult,
    Store,
    Txn,
    TxnResult,
    Watch,
    WatchEvent,
)
from aioelastic.testing import FaultInjectingStore, run_virtual, virtual_test

TTL = 6.0
KEYS = RunKeys("job")


def handler(
    store: Store, min_nodes: int = 1, max_nodes: int = 1, **kw: Any
) -> DynamicRendezvousHandler:
    kw.setdefault("lease_ttl", TTL)
    kw.setdefault("last_call_timeout", 10.0)
    kw.setdefault("join_timeout", 100.0)
    return DynamicRendezvousHandler(store, "job", min_nodes, max_nodes, **kw)


# -- dynamic.py: the handler --------------------------------------------------------------------


@virtual_test
async def test_a_lost_lease_is_the_handlers_error_at_once_with_its_events() -> None:
    sink = ListSink()
    h = handler(MemoryStore(MemoryEngine()), event_sink=sink)
    await h.next_rendezvous()
    assert h.lease is not None
    lost = asyncio.Event()
    h.lease.on_lost(lambda _error: lost.set())
    await h.store.lease_revoke(h.lease.id)
    await lost.wait()  # (no wait_for_change: the handler's own callback set the error)
    error = h.error
    assert isinstance(error, LeaseExpiredError)
    assert h.status is RendezvousStatus.ERROR
    assert sink.of("rendezvous.lease_lost") == [{"round": 0, "error": str(error)}]
    assert sink.of("rendezvous.status") == [  # the one change of status, nothing else
        {
            "status": "ERROR",
            "previous": "ACTIVE",
            "round": 0,
            "error": f"LeaseExpiredError: {error}",
        }
    ]
    assert {(e.run_id, e.node) for e in sink.events} == {("job", h.node_id)}
    await h.aclose()


@virtual_test
async def test_a_failed_join_is_an_event_in_full() -> None:
    sink = ListSink()
    h = handler(MemoryStore(MemoryEngine()), 2, 2, join_timeout=5.0, event_sink=sink)
    with pytest.raises(RendezvousTimeoutError) as caught:
        await h.next_rendezvous()
    assert sink.of("rendezvous.join_started") == [{"previous_round": -1}]
    assert sink.of("rendezvous.join_failed") == [
        {"previous_round": -1, "error_type": "RendezvousTimeoutError", "error": str(caught.value)}
    ]
    assert sink.of("rendezvous.status") == []  # a timeout leaves the handler ACTIVE
    await h.aclose()


@virtual_test
async def test_a_lease_lost_after_the_handler_closed_is_not_its_error() -> None:
    sink = ListSink()
    h = handler(MemoryStore(MemoryEngine()), event_sink=sink)
    await h.next_rendezvous()
    keeper = h.lease
    assert keeper is not None
    h._handler_closed = True  # aclose() has begun: the lease's end is its own doing
    h._on_lease_lost(LeaseExpiredError(keeper.id))
    assert h.error is None
    assert sink.of("rendezvous.lease_lost") == []
    h._handler_closed = False
    await h.aclose()


@pytest.mark.parametrize("operation", ["num_nodes_waiting", "is_closed", "set_closed"])
def test_a_store_failure_names_the_operation(operation: str) -> None:
    run_virtual(_store_failure_names(operation))


async def _store_failure_names(operation: str) -> None:
    store = FaultInjectingStore(MemoryStore(MemoryEngine()))
    h = handler(store)
    store.partition()
    with pytest.raises(RendezvousConnectionError) as caught:
        await getattr(h, operation)()
    assert str(caught.value).startswith(f"{operation} failed for run 'job': ")
    assert h.error is caught.value
    store.heal()
    await h.aclose()


@pytest.mark.parametrize("operation", ["is_closed", "set_closed"])
def test_a_closed_handler_refuses_with_its_message(operation: str) -> None:
    run_virtual(_closed_handler_refuses(operation))


async def _closed_handler_refuses(operation: str) -> None:
    h = handler(MemoryStore(MemoryEngine()))
    await h.aclose()
    with pytest.raises(RendezvousClosedError) as caught:
        await getattr(h, operation)()
    assert str(caught.value) == "the rendezvous handler for 'job' is closed"


@virtual_test
async def test_a_corrupt_close_record_is_named_by_its_key() -> None:
    store = MemoryStore(MemoryEngine())
    await store.put(KEYS.closed, b"not json")
    h = handler(store)
    with pytest.raises(RendezvousStateError) as caught:
        await h.is_closed()
    assert repr(KEYS.closed) in str(caught.value)
    await h.aclose()


@virtual_test
async def test_is_closed_is_sticky_except_for_a_new_handler_that_may_reopen() -> None:
    engine = MemoryEngine()
    store = MemoryStore(engine)
    await store.put(KEYS.closed, ClosedRecord(-1).encode())
    plain = handler(MemoryStore(engine))
    assert await plain.is_closed()
    assert plain.status is RendezvousStatus.CLOSED  # sticky: seen closed
    reopener = handler(MemoryStore(engine), reopen_closed=True)
    assert await reopener.is_closed()
    assert reopener.status is RendezvousStatus.ACTIVE  # its first join reopens the run
    result = await reopener.next_rendezvous()
    assert result.round == 0
    await plain.aclose()
    await reopener.aclose()


@virtual_test
async def test_is_closed_is_sticky_for_a_reopening_handler_that_took_part() -> None:
    engine = MemoryEngine()
    h = handler(MemoryStore(engine), reopen_closed=True)
    await h.next_rendezvous()
    closer = handler(MemoryStore(engine))
    await closer.set_closed()
    assert await h.is_closed()
    assert h.status is RendezvousStatus.CLOSED
    await h.aclose()
    await closer.aclose()


@virtual_test
async def test_set_closed_gives_up_after_close_timeout() -> None:
    store = FaultInjectingStore(MemoryStore(MemoryEngine()))
    h = handler(store, close_timeout=3.0)
    store.hang()
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(RendezvousTimeoutError) as caught:
        await h.set_closed()
    assert loop.time() - start == pytest.approx(3.0)
    assert str(caught.value) == "closing 'job' took longer than close_timeout=3.0s"
    store.release()
    await h.aclose()


@virtual_test
async def test_shutdown_says_whether_it_closed_the_run() -> None:
    store = FaultInjectingStore(MemoryStore(MemoryEngine()))
    h = handler(store)
    store.partition()
    assert await h.shutdown() is False
    store.heal()
    ok = handler(MemoryStore(MemoryEngine()))
    assert await ok.shutdown() is True


@virtual_test
async def test_statistics_in_full() -> None:
    engine = MemoryEngine()
    h = handler(MemoryStore(engine), 1, 2, last_call_timeout=4.0)
    before = h.statistics()
    assert (before.node_id, before.status, before.round, before.world_size) == (
        h.node_id,
        RendezvousStatus.ACTIVE,
        -1,
        0,
    )
    assert (before.joins, before.rounds_driven, before.lease_id) == (0, 0, 0)
    assert (before.join_started, before.completed_at, before.last_call_deadline) == (None,) * 3
    loop = asyncio.get_running_loop()
    start = loop.time()
    await h.next_rendezvous()  # one of at most two: the last call is waited out
    after = h.statistics()
    assert h.lease is not None
    assert (after.round, after.world_size, after.joins, after.rounds_driven) == (0, 1, 1, 1)
    assert after.join_started == start
    assert after.last_call_deadline == start + 4.0
    assert after.completed_at == start + 4.0
    assert after.lease_id == h.lease.id != 0
    await h.store.lease_revoke(h.lease.id)
    await h.lease.wait_lost()  # lost: no live lease
    assert h.statistics().lease_id == 0
    await h.aclose()


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        (("2", 2), "min_nodes must be an int, got str"),
        ((1, 2.0), "max_nodes must be an int, got float"),
        ((True, 2), "min_nodes must be an int, got bool"),
    ],
)
def test_node_counts_must_be_ints_named_in_the_error(sizes: tuple[Any, Any], message: str) -> None:
    with pytest.raises(TypeError) as caught:
        DynamicRendezvousHandler(MemoryStore(), "job", *sizes)
    assert str(caught.value) == message


def test_sub_second_timeouts_are_accepted_and_infinity_is_not() -> None:
    h = DynamicRendezvousHandler(
        MemoryStore(), "job", 1, 1, join_timeout=0.5, close_timeout=0.5, lease_ttl=0.5
    )
    assert (h._join_timeout, h._close_timeout, h._lease_ttl) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="join_timeout must be a finite number"):
        DynamicRendezvousHandler(MemoryStore(), "job", 1, 1, join_timeout=float("inf"))


def test_creating_a_handler_imports_anyios_backend_now(monkeypatch: pytest.MonkeyPatch) -> None:
    imported: list[str] = []
    real = importlib.import_module

    def recording(name: str, package: str | None = None) -> ModuleType:
        imported.append(name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", recording)
    DynamicRendezvousHandler(MemoryStore(), "job", 1, 1, local_addr="127.0.0.1")
    assert imported == ["anyio._backends._asyncio"]


def test_a_handler_is_made_when_anyios_backend_does_not_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def failing(name: str, package: str | None = None) -> ModuleType:
        raise ImportError(name)

    monkeypatch.setattr(importlib, "import_module", failing)
    h = DynamicRendezvousHandler(MemoryStore(), "job", 1, 1, local_addr="127.0.0.1")
    assert h.round == -1  # the import is only a head start: the first join does it otherwise


@virtual_test
async def test_the_handlers_defaults() -> None:
    store = MemoryStore(MemoryEngine())
    h = DynamicRendezvousHandler(store, "job", 1, 1)
    assert h.get_backend() == "memory"
    assert (h._join_timeout, h._last_call, h._close_timeout) == (600.0, 30.0, 30.0)
    assert (h._lease_ttl, h._keep_alive_interval) == (15.0, None)
    assert (h._reopen_closed, h._fast_reform, h._with_participants) == (False, True, True)
    await h.next_rendezvous()
    await h.aclose()
    assert not store.closed  # not owned by default
    await store.put("k", b"v")


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("last_call_timeout", -1.0),
        ("close_timeout", 0.0),
        ("lease_ttl", 0.0),
        ("join_timeout", 0.0),
    ],
)
def test_each_number_of_seconds_is_checked(setting: str, value: float) -> None:
    settings: dict[str, Any] = {setting: value}
    with pytest.raises(ValueError, match=f"^{setting} must be a finite number of seconds > 0"):
        DynamicRendezvousHandler(MemoryStore(), "job", 1, 1, **settings)


def test_a_last_call_of_zero_is_allowed() -> None:
    h = DynamicRendezvousHandler(MemoryStore(), "job", 1, 2, last_call_timeout=0)
    assert h._last_call == 0.0


@virtual_test
async def test_the_lease_address_and_node_id_a_handler_is_given_or_makes() -> None:
    engine = MemoryEngine()
    given = handler(MemoryStore(engine), keep_alive_interval=1.5, local_addr="10.1.2.3")
    result = await given.next_rendezvous()
    assert result.bootstrap_store_info.master_addr == "10.1.2.3"  # published as rank 0's
    assert given.lease is not None
    assert given.lease._interval == 1.5
    made = DynamicRendezvousHandler(MemoryStore(engine), "other", 1, 1)
    assert len(made.node_id) == 12  # 6 random bytes, in hex
    int(made.node_id, 16)
    await given.aclose()


# -- _driver.py: the round's driver ---------------------------------------------------------------


@virtual_test
async def test_a_driver_whose_fresh_count_completes_the_round_completes_it_at_once() -> None:
    """The history after the claim's read was compacted: the registrations read afresh are all
    the round needs (max), so it completes at once, without waiting for one more event."""
    engine = MemoryEngine(history_limit=4)
    store = MemoryStore(engine)
    h = DynamicRendezvousHandler(store, "job", 3, 3, last_call_timeout=0)
    claim = await store.put(KEYS.driver, DriverRecord(0, h.node_id).encode())
    await store.put(KEYS.node(0, "a"), NodeRecord("a", "h", 1).encode())
    snapshot = await store.range(KEYS.nodes)
    for node in ("b", "c"):
        await store.put(KEYS.node(0, node), NodeRecord(node, "h", 1).encode())
    for _ in range(10):
        await store.put("elsewhere", b"x")
    assert engine.compact_revision > snapshot.revision
    driver = RoundDriver(h, 0, None, claim, snapshot)
    await asyncio.wait_for(driver.run(), 5)
    assert driver.members == ("a", "b", "c")
    await h.aclose()


class _RoundWrites(MemoryStore):
    """Counts the transactions that write the round record; the first ends lease ``doomed``
    just before it is applied."""

    doomed: int | None = None
    round_writes = 0

    async def _txn(self, txn: Txn) -> TxnResult:
        if any(isinstance(op, Put) and op.key == KEYS.round for op in txn.success):
            self.round_writes += 1
            if self.doomed is not None:
                self.engine.lease_revoke(self.doomed)
                self.doomed = None
        return await super()._txn(txn)


@virtual_test
async def test_a_failed_write_from_the_claims_count_waits_for_the_deletion() -> None:
    """The round is complete from the claim's read, but a member's lease ends as it is written:
    the driver opens its watch and writes again once the deletion is counted, not at once (a
    write bound to the ended lease again)."""
    store = _RoundWrites(MemoryEngine())
    h = DynamicRendezvousHandler(store, "job", 1, 2, last_call_timeout=0)
    claim = await store.put(KEYS.driver, DriverRecord(0, h.node_id).encode())
    grant = await store.lease_grant(TTL)
    await store.put(KEYS.node(0, "a"), NodeRecord("a", "h", 1).encode())
    await store.put(KEYS.node(0, "b"), NodeRecord("b", "h", 1).encode(), lease=grant.id)
    store.doomed = grant.id
    driver = RoundDriver(h, 0, None, claim, await store.range(KEYS.nodes))
    await asyncio.wait_for(driver.run(), 5)
    assert driver.members == ("a",)
    assert store.round_writes == 2
    await h.aclose()


@virtual_test
async def test_a_sub_second_last_call_is_waited_exactly() -> None:
    h = handler(MemoryStore(MemoryEngine()), 1, 2, last_call_timeout=0.25)
    loop = asyncio.get_running_loop()
    start = loop.time()
    result = await h.next_rendezvous()
    assert loop.time() - start == pytest.approx(0.25)
    assert result.world_size == 1
    await h.aclose()


@virtual_test
async def test_closing_the_run_is_an_event_and_a_status_without_an_error() -> None:
    sink = ListSink()
    h = handler(MemoryStore(MemoryEngine()), event_sink=sink)
    await h.next_rendezvous()
    await h.set_closed()
    assert sink.of("rendezvous.closed") == [{"round": 0, "by_this_node": True}]
    assert sink.of("rendezvous.status") == [
        {"status": "CLOSED", "previous": "ACTIVE", "round": 0, "error": None}
    ]
    await h.aclose()


@virtual_test
async def test_a_store_failure_of_a_join_names_next_rendezvous() -> None:
    store = FaultInjectingStore(MemoryStore(MemoryEngine()))
    h = handler(store)
    store.partition()
    with pytest.raises(RendezvousConnectionError) as caught:
        await h.next_rendezvous()
    assert str(caught.value).startswith("next_rendezvous failed for run 'job': ")
    store.heal()
    await h.aclose()


@pytest.mark.parametrize(("local_addr", "looked_up"), [(None, 1), ("10.0.0.1", 0)])
def test_preparing_a_handler_waits_for_its_address_lookup_only_without_one(
    monkeypatch: pytest.MonkeyPatch, local_addr: str | None, looked_up: int
) -> None:
    calls: list[None] = []

    async def lookup() -> str:
        calls.append(None)
        return "host"

    monkeypatch.setattr(dynamic, "looked_up_default_addr", lookup)

    async def main() -> None:
        h = handler(MemoryStore(MemoryEngine()), local_addr=local_addr)
        await h._prepare()
        await h.aclose()

    run_virtual(main())
    assert len(calls) == looked_up


class _CancelledWhileOpening(Watch):
    """A watch whose start is cancelled (by the caller's cancel scope) and whose close takes a
    turn of the loop, as a network backend's does."""

    def __init__(self, scope: anyio.CancelScope) -> None:
        super().__init__(KEYS.nodes, 1)
        self.scope = scope
        self.released = False

    @property
    def start_revision(self) -> int:
        return 1

    async def _start(self) -> None:
        self.scope.cancel()
        await asyncio.sleep(0)  # the cancellation arrives here

    async def _next(self) -> WatchEvent:
        raise AssertionError("never started")

    async def _aclose(self) -> None:
        await asyncio.sleep(0)
        self.released = True


class _OpensCancelledWatches(MemoryStore):
    def __init__(self, engine: MemoryEngine) -> None:
        super().__init__(engine)
        self.watches: list[_CancelledWhileOpening] = []
        self.scope = anyio.CancelScope()

    def watch(self, prefix: str, *, start_revision: int | None = None) -> Watch:
        if prefix != KEYS.nodes:
            return super().watch(prefix, start_revision=start_revision)
        watch = _CancelledWhileOpening(self.scope)
        self.watches.append(watch)
        return watch


@virtual_test
async def test_a_driver_cancelled_while_its_watch_opens_still_closes_the_watch() -> None:
    store = _OpensCancelledWatches(MemoryEngine())
    h = DynamicRendezvousHandler(store, "job", 2, 2)
    claim = await store.put(KEYS.driver, DriverRecord(0, h.node_id).encode())
    driver = RoundDriver(h, 0, None, claim, await store.range(KEYS.nodes))
    with store.scope:
        await driver.run()
    assert store.scope.cancelled_caught
    (watch,) = store.watches
    assert watch.released  # closed under a shield: the cancellation does not cut it short
    await h.aclose()


# -- _join.py: the join coordinator -------------------------------------------------------------


class _AfterRegistering(MemoryStore):
    """A memory store that runs ``then`` (once) right after the transaction that registers
    ``key``: another handler's write landing between a join's registration and its next
    request."""

    def __init__(
        self, engine: MemoryEngine, key: str, then: Callable[[], Awaitable[object]]
    ) -> None:
        super().__init__(engine)
        self._key = key
        self._then: Callable[[], Awaitable[object]] | None = then

    async def _txn(self, txn: Txn) -> TxnResult:
        result = await super()._txn(txn)
        then = self._then
        if then is not None and any(
            isinstance(op, Put) and op.key == self._key for op in txn.success
        ):
            self._then = None
            await then()
        return result


async def _duplicate_registered(
    then: Callable[[MemoryStore, int], Awaitable[object]],
) -> tuple[MemoryStore, bytes, int]:
    """Another live handler registered as node-a for round 0 (its lease, no driver claim): a
    join as node-a claims the driver in its registration, which replaces that record; ``then``
    (given the other handler's store and lease) runs right after, before the join puts it back.
    Returns a store, the other record and its lease, once the join failed as a duplicate."""
    engine = MemoryEngine()
    theirs = MemoryStore(engine)
    lease = (await theirs.lease_grant(TTL * 10)).id
    key = KEYS.node(0, "node-a")
    record = NodeRecord("node-a", "10.0.0.9", 4242).encode()
    await theirs.put(key, record, lease=lease)
    store = _AfterRegistering(engine, key, lambda: then(theirs, lease))
    h = handler(store, 2, 3, node_id="node-a")
    with pytest.raises(RendezvousError, match="already registered for round 0") as caught:
        await h.next_rendezvous()
    assert type(caught.value) is RendezvousError
    await h.aclose()
    return theirs, record, lease


@virtual_test
async def test_a_duplicates_record_is_not_put_back_over_its_own_later_write() -> None:
    # the other handler withdrew (or wrote again) after our registration replaced its record:
    # putting its old record back would resurrect a registration nobody holds
    async def withdraw(theirs: MemoryStore, _lease: int) -> None:
        await theirs.delete(KEYS.node(0, "node-a"))

    theirs, _record, _lease = await _duplicate_registered(withdraw)
    assert await theirs.get(KEYS.node(0, "node-a")) is None


@virtual_test
async def test_a_duplicates_record_whose_lease_is_gone_is_dropped_not_put_back() -> None:
    async def lose(theirs: MemoryStore, lease: int) -> None:
        await theirs.lease_revoke(lease)

    theirs, _record, _lease = await _duplicate_registered(lose)
    assert await theirs.get(KEYS.node(0, "node-a")) is None  # ours is deleted too


@virtual_test
async def test_a_reopen_drops_a_driver_claim_left_from_before_the_close() -> None:
    # a node that claimed the driver, then the run was closed; its lease outlives the join's
    # timeout: a reopening handler must clear the claim, or it waits for a driver that is gone
    store = MemoryStore(MemoryEngine())
    lease = (await store.lease_grant(1000.0)).id
    await store.put(KEYS.driver, DriverRecord(0, "gone").encode(), lease=lease)
    await store.put(KEYS.closed, ClosedRecord(-1).encode())
    h = handler(store, reopen_closed=True, join_timeout=30.0)
    result = await h.next_rendezvous()
    assert (result.round, result.rank) == (0, 0)
    await h.aclose()


@virtual_test
async def test_a_completed_join_is_its_result_and_its_event_in_full() -> None:
    engine = MemoryEngine()
    sink = ListSink()
    first = handler(MemoryStore(engine), 2, 2, event_sink=sink, node_id="node-a")
    second = handler(MemoryStore(engine), 2, 2, node_id="node-b")
    await asyncio.sleep(10.0)  # (the join does not start at the clock's 0)
    joining = asyncio.ensure_future(first.next_rendezvous())
    await asyncio.sleep(1.2345678)  # the join's duration, until the second node arrives
    other = await second.next_rendezvous()
    result = await joining
    assert (result.run_id, result.round, result.world_size, result.node_id) == (
        "job",
        0,
        2,
        "node-a",
    )
    assert result.participants == other.participants == ("node-a", "node-b")
    assert (result.rank, other.rank) == (0, 1)
    assert result.departed == 0
    info = result.bootstrap_store_info
    assert info == other.bootstrap_store_info
    (event,) = sink.of("rendezvous.round_completed")
    assert event == {
        "round": 0,
        "rank": 0,
        "world_size": 2,
        "participants": ["node-a", "node-b"],
        "master_addr": info.master_addr,
        "master_port": info.master_port,
        "duration": 1.234568,  # rounded to the microsecond
    }
    assert first.statistics().joins == 1
    await first.aclose()
    await second.aclose()


@virtual_test
async def test_a_lease_lost_after_two_joins_is_one_loss() -> None:
    # the first join grants and arms the lease; the second goes on with it, armed once
    sink = ListSink()
    h = handler(MemoryStore(MemoryEngine()), event_sink=sink)
    await h.next_rendezvous()
    await h.next_rendezvous()
    assert h.statistics().joins == 2
    assert h.lease is not None
    lost = asyncio.Event()
    h.lease.on_lost(lambda _error: lost.set())
    await h.store.lease_revoke(h.lease.id)
    await lost.wait()
    assert len(sink.of("rendezvous.lease_lost")) == 1
    await h.aclose()


@virtual_test
async def test_a_node_of_the_closed_generation_whose_last_join_failed_stays_closed_out() -> None:
    # node-a completed round 0, then its next join timed out (its registration withdrawn):
    # after the run's close and a reopen by a new handler, it is still of the closed generation
    engine = MemoryEngine()
    a = handler(MemoryStore(engine), 2, 2, join_timeout=20.0, node_id="node-a")
    b = handler(MemoryStore(engine), 2, 2, node_id="node-b")
    await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    await b.aclose()
    with pytest.raises(RendezvousTimeoutError):
        await a.next_rendezvous()
    closer = handler(MemoryStore(engine), 1, 2)
    await closer.set_closed()
    reopener = handler(MemoryStore(engine), 1, 2, reopen_closed=True)
    assert (await reopener.next_rendezvous()).round == 1
    assert await a.is_closed()
    with pytest.raises(RendezvousClosedError, match="is closed"):
        await a.next_rendezvous()
    for h in (a, closer, reopener):
        await h.aclose()


class _DeleteLog(MemoryStore):
    """A memory store that logs the keys it is asked to delete (plain deletes), each a round
    trip of 10 ms as over a network (a cancellation can arrive during it)."""

    def __init__(self, engine: MemoryEngine) -> None:
        super().__init__(engine)
        self.deleted: list[str] = []

    async def _delete(self, key: str, prefix: bool) -> Any:
        self.deleted.append(key)
        await asyncio.sleep(0.01)
        return await super()._delete(key, prefix)


@virtual_test
async def test_a_join_cut_short_by_the_callers_scope_withdraws_in_full() -> None:
    # anyio's cancellation is level-triggered: the withdrawal's requests run shielded, or they
    # would be cancelled too and leave the registration and the claim behind
    store = _DeleteLog(MemoryEngine())
    h = handler(store, 2, 2)
    with anyio.move_on_after(5.0) as scope:
        await h.next_rendezvous()
    assert scope.cancelled_caught
    assert store.deleted == [KEYS.node(0, h.node_id)]  # the registration: no other round
    assert (await store.range(KEYS.nodes)).count == 0
    assert await store.get(KEYS.driver) is None
    await h.aclose()


@virtual_test
async def test_a_withdrawal_from_a_later_round_deletes_that_registration() -> None:
    # node-a's third join (for round 2) is cut short: it withdraws its registration for round 2
    # and its record of round 1, the round it was leaving
    engine = MemoryEngine()
    store = _DeleteLog(engine)
    a = handler(store, 2, 2, node_id="node-a")
    b = handler(MemoryStore(engine), 2, 2, node_id="node-b")
    for _ in range(2):  # rounds 0 and 1
        await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    await b.aclose()
    store.deleted.clear()
    with anyio.move_on_after(5.0):
        await a.next_rendezvous()
    assert sorted(store.deleted) == [KEYS.node(1, "node-a"), KEYS.node(2, "node-a")]
    assert (await store.range(KEYS.nodes)).count == 0
    await a.aclose()


@virtual_test
async def test_a_withdrawal_gives_up_after_close_timeout_on_a_store_that_hangs() -> None:
    store = FaultInjectingStore(MemoryStore(MemoryEngine()))
    h = handler(store, 2, 2, join_timeout=10.0, close_timeout=3.0, lease_ttl=1000.0)
    loop = asyncio.get_running_loop()
    joining = asyncio.ensure_future(h.next_rendezvous())
    await asyncio.sleep(1.0)  # registered, waiting for a second node
    store.hang()
    loop.call_later(50.0, store.release)  # (a withdrawal without a bound would wait until then)
    with pytest.raises(RendezvousTimeoutError):
        await joining
    assert loop.time() == pytest.approx(10.0 + 3.0)
    await h.aclose()


@virtual_test
async def test_a_join_whose_lease_is_lost_deletes_nothing() -> None:
    # its records went with the lease; a blind delete could only remove someone else's, such as
    # a restarted node's registration under the same id
    engine = MemoryEngine()
    h = handler(MemoryStore(engine), 2, 2, node_id="node-a")
    joining = asyncio.ensure_future(h.next_rendezvous())
    await asyncio.sleep(1.0)
    assert h.lease is not None
    other = MemoryStore(engine)
    restarted = (await other.lease_grant(TTL)).id
    record = NodeRecord("node-a", "10.0.0.9", 4242).encode()
    await other.lease_revoke(h.lease.id)
    await other.put(KEYS.node(0, "node-a"), record, lease=restarted)
    with pytest.raises(RendezvousConnectionError, match="lost: expired or revoked"):
        await joining
    kv = await other.get(KEYS.node(0, "node-a"))
    assert kv is not None
    assert kv.lease == restarted
    await h.aclose()


@virtual_test
async def test_a_handler_whose_first_join_lost_its_lease_is_still_new_to_a_reopened_run() -> None:
    engine = MemoryEngine()
    h = handler(MemoryStore(engine), 2, 2, node_id="node-a")
    joining = asyncio.ensure_future(h.next_rendezvous())
    await asyncio.sleep(1.0)
    assert h.lease is not None
    await MemoryStore(engine).lease_revoke(h.lease.id)
    with pytest.raises(RendezvousConnectionError, match="lost: expired or revoked"):
        await joining
    closer = handler(MemoryStore(engine), 1, 2)
    await closer.set_closed()
    reopener = handler(MemoryStore(engine), 1, 2, reopen_closed=True)
    await reopener.next_rendezvous()
    assert not await h.is_closed()  # it took part in no round of the closed generation
    for each in (h, closer, reopener):
        await each.aclose()


@virtual_test
async def test_a_reopening_handler_whose_first_join_timed_out_may_still_reopen() -> None:
    engine = MemoryEngine()
    h = handler(MemoryStore(engine), 2, 2, reopen_closed=True, join_timeout=10.0)
    with pytest.raises(RendezvousTimeoutError):
        await h.next_rendezvous()
    closer = handler(MemoryStore(engine), 1, 2)
    await closer.set_closed()
    with pytest.raises(RendezvousTimeoutError):  # it reopened the run, then waited alone
        await h.next_rendezvous()
    kv = await closer.store.get(KEYS.closed)
    assert kv is not None
    assert ClosedRecord.decode(kv.key, kv.value).reopened
    await h.aclose()
    await closer.aclose()


@virtual_test
async def test_preparing_a_handler_spends_at_most_its_budget_on_a_store_that_hangs() -> None:
    store = FaultInjectingStore(MemoryStore(MemoryEngine()))
    h = handler(store, local_addr="10.0.0.1")
    store.hang()
    loop = asyncio.get_running_loop()
    loop.call_later(30.0, store.release)  # (an unbounded prepare would wait until then)
    await h._prepare()
    assert loop.time() == pytest.approx(_join.PREPARE_BUDGET)
    store.release()
    await h.aclose()


@virtual_test
async def test_preparing_a_handler_whose_view_fails_leaves_no_lease_grant_running() -> None:
    store = FaultInjectingStore(MemoryStore(MemoryEngine()))
    await store.put(KEYS.round, b"not json")  # the view's load fails at once
    h = handler(store, local_addr="10.0.0.1")
    store.hang("lease_grant")
    await h._prepare()
    assert h.lease is None
    store.release()
    await asyncio.sleep(1.0)
    assert h.lease is None  # the grant was cancelled, not left to finish behind prepare
    assert store.granted_leases == frozenset()
    await h.aclose()


@virtual_test
async def test_a_handler_closed_while_its_lease_is_granted_ends_the_join_at_once() -> None:
    store = FaultInjectingStore(MemoryStore(MemoryEngine()))
    h = handler(store, 2, 2)
    store.hang("lease_grant")
    loop = asyncio.get_running_loop()
    joining = asyncio.ensure_future(h.next_rendezvous())
    await asyncio.sleep(1.0)
    closing = asyncio.ensure_future(h.aclose())
    await asyncio.sleep(1.0)
    store.release()
    with pytest.raises(RendezvousClosedError, match="was closed while joining"):
        await joining
    assert loop.time() == pytest.approx(2.0)  # not at the join timeout
    await closing


@virtual_test
async def test_a_deadline_passed_during_a_request_ends_the_join_when_it_returns() -> None:
    # node-b's registration (no driver claim: node-a drives) is answered after its deadline,
    # and nothing in c/ changes after it: the join must see its deadline without a wake-up
    engine = MemoryEngine()
    a = handler(MemoryStore(engine), 3, 3, node_id="node-a")
    driving = asyncio.ensure_future(a.next_rendezvous())
    await asyncio.sleep(1.0)
    store = FaultInjectingStore(MemoryStore(engine))
    b = handler(store, 3, 3, join_timeout=10.0, lease_ttl=1000.0, node_id="node-b")
    store.hang("compare_and_swap")
    loop = asyncio.get_running_loop()
    loop.call_later(20.0, store.release)
    with anyio.fail_after(60.0), pytest.raises(RendezvousTimeoutError) as caught:
        await b.next_rendezvous()
    assert str(caught.value) == "the rendezvous 'job' did not complete within join_timeout=10.0s"
    assert loop.time() == pytest.approx(1.0 + 20.0)
    await b.aclose()
    await a.aclose()
    with pytest.raises(RendezvousClosedError):
        await driving


@virtual_test
async def test_closing_a_handler_ends_its_parked_join_at_once() -> None:
    h = handler(MemoryStore(MemoryEngine()), 2, 2)
    loop = asyncio.get_running_loop()
    joining = asyncio.ensure_future(h.next_rendezvous())
    await asyncio.sleep(1.0)  # parked, waiting for a second node
    await h.aclose()
    with pytest.raises(RendezvousClosedError, match="was closed while joining"):
        await joining
    assert loop.time() == pytest.approx(1.0)


@virtual_test
async def test_a_standby_waits_past_its_join_timeout_for_the_next_round() -> None:
    engine = MemoryEngine()
    member = handler(MemoryStore(engine), node_id="node-a")
    await member.next_rendezvous()
    standby = handler(MemoryStore(engine), join_timeout=10.0, node_id="node-b")
    waiting = asyncio.ensure_future(standby.next_rendezvous())
    await asyncio.sleep(30.0)  # past its join timeout: a standby has none
    assert not waiting.done()
    await member.aclose()  # the round's member leaves: the standby's round forms
    result = await waiting
    assert (result.round, result.participants) == (1, ("node-b",))
    await standby.aclose()


@virtual_test
async def test_a_member_that_finds_the_run_closed_is_closed_not_a_standby_exiting() -> None:
    engine = MemoryEngine()
    h = handler(MemoryStore(engine))
    await h.next_rendezvous()  # a member of round 0, not a standby
    closer = handler(MemoryStore(engine))
    await closer.set_closed()
    with pytest.raises(RendezvousClosedError) as caught:
        await h.next_rendezvous()
    assert type(caught.value) is RendezvousClosedError
    await h.aclose()
    await closer.aclose()


@virtual_test
async def test_a_join_after_a_lost_lease_registers_again_for_the_same_round() -> None:
    engine = MemoryEngine()
    a = handler(MemoryStore(engine), 2, 2, node_id="node-a")
    joining = asyncio.ensure_future(a.next_rendezvous())
    await asyncio.sleep(1.0)  # registered for round 0 under its lease
    assert a.lease is not None
    await MemoryStore(engine).lease_revoke(a.lease.id)
    with pytest.raises(RendezvousConnectionError, match="lost: expired or revoked"):
        await joining
    b = handler(MemoryStore(engine), 2, 2, node_id="node-b")
    with anyio.fail_after(50.0):  # round 0 again: a's new lease needs a new registration
        first, second = await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    assert first.round == second.round == 0
    await a.aclose()
    await b.aclose()


@virtual_test
async def test_a_handler_closed_while_its_lease_is_granted_ends_a_join_it_does_not_drive() -> None:
    # node-b's registration (node-a drives) changes nothing in c/: no event wakes its wait,
    # which must see the close by itself
    engine = MemoryEngine()
    a = handler(MemoryStore(engine), 3, 3, node_id="node-a")
    driving = asyncio.ensure_future(a.next_rendezvous())
    await asyncio.sleep(1.0)
    store = FaultInjectingStore(MemoryStore(engine))
    b = handler(store, 3, 3, node_id="node-b")
    store.hang("lease_grant")
    loop = asyncio.get_running_loop()
    joining = asyncio.ensure_future(b.next_rendezvous())
    await asyncio.sleep(1.0)
    closing = asyncio.ensure_future(b.aclose())
    await asyncio.sleep(1.0)
    store.release()
    with pytest.raises(RendezvousClosedError, match="was closed while joining"):
        await joining
    assert loop.time() == pytest.approx(3.0)  # not at the join timeout
    await closing
    await a.aclose()
    with pytest.raises(RendezvousClosedError):
        await driving


@virtual_test
async def test_a_join_that_fails_leaves_no_task_of_its_own_running() -> None:
    h = handler(MemoryStore(MemoryEngine()), 2, 2, join_timeout=10.0)
    before = asyncio.all_tasks()
    with pytest.raises(RendezvousTimeoutError):
        await h.next_rendezvous()  # it drove (alone): its driver and watch reader end with it
    left = [t for t in asyncio.all_tasks() - before if t.get_name().startswith("aioelastic-rdzv")]
    assert left == []
    await h.aclose()


@virtual_test
async def test_a_duplicate_is_refused_when_registering_while_leaving_the_round_before() -> None:
    # node-a, a member of round 0, registers for round 1 (node-b drives it: no claim) in one
    # transaction with leaving round 0; another live handler holds node-a's round-1 key
    engine = MemoryEngine()
    a = handler(MemoryStore(engine), 2, 2, node_id="node-a")
    b = handler(MemoryStore(engine), 2, 2, node_id="node-b")
    await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    theirs = MemoryStore(engine)
    lease = (await theirs.lease_grant(TTL * 10)).id
    record = NodeRecord("node-a", "10.0.0.9", 4242).encode()
    await theirs.put(KEYS.node(1, "node-a"), record, lease=lease)
    driving = asyncio.ensure_future(b.next_rendezvous())
    await asyncio.sleep(1.0)  # node-b registered for round 1 and holds its driver claim
    with pytest.raises(RendezvousError, match="already registered for round 1") as caught:
        await a.next_rendezvous()
    assert type(caught.value) is RendezvousError
    kv = await theirs.get(KEYS.node(1, "node-a"))
    assert kv is not None
    assert (kv.value, kv.lease) == (record, lease)
    await a.aclose()
    await b.aclose()
    with pytest.raises(RendezvousClosedError):
        await driving


class _ClaimedFirst(MemoryStore):
    """A memory store on which another node's driver claim lands (``claim``, once) just before
    the first transaction that claims the driver: a claim the join's view has not seen yet."""

    def __init__(self, engine: MemoryEngine, claim: Callable[[], Awaitable[object]]) -> None:
        super().__init__(engine)
        self._claim: Callable[[], Awaitable[object]] | None = claim

    async def _txn(self, txn: Txn) -> TxnResult:
        claim = self._claim
        if claim is not None and any(
            isinstance(op, Put) and op.key == KEYS.driver for op in txn.success
        ):
            self._claim = None
            await claim()
        return await super()._txn(txn)


@virtual_test
async def test_a_registration_claiming_the_driver_does_not_take_a_claim_it_did_not_see() -> None:
    engine = MemoryEngine()
    other = MemoryStore(engine)
    lease = (await other.lease_grant(TTL * 10)).id
    theirs = DriverRecord(0, "node-x").encode()

    async def claim() -> None:
        await other.put(KEYS.driver, theirs, lease=lease)

    h = handler(_ClaimedFirst(engine, claim), 2, 2, node_id="node-a")
    with anyio.move_on_after(5.0):
        await h.next_rendezvous()
    kv = await other.get(KEYS.driver)
    assert kv is not None
    assert (kv.value, kv.lease) == (theirs, lease)  # node-x's claim stands; ours was refused
    await h.aclose()


class _AnswerLost(MemoryStore):
    """A memory store that applies the first transaction registering ``key``, then loses its
    answer (``WriteOutcomeUnknownError``), as a network store does when the connection drops
    after the request was sent."""

    def __init__(self, engine: MemoryEngine, key: str) -> None:
        super().__init__(engine)
        self._key: str | None = key

    async def _txn(self, txn: Txn) -> TxnResult:
        result = await super()._txn(txn)
        if self._key is not None and any(
            isinstance(op, Put) and op.key == self._key for op in txn.success
        ):
            self._key = None
            raise WriteOutcomeUnknownError("injected: the answer was lost")
        return result


@virtual_test
async def test_a_registration_whose_answer_was_lost_is_withdrawn() -> None:
    # the registration may have landed: the failed join's withdrawal deletes it, or it stays
    # under the live lease and counts the node for a round it is not joining
    store = _AnswerLost(MemoryEngine(), KEYS.node(0, "node-a"))
    h = handler(store, 2, 2, node_id="node-a")
    with pytest.raises(RendezvousConnectionError):
        await h.next_rendezvous()
    assert await store.get(KEYS.node(0, "node-a")) is None
    assert await store.get(KEYS.driver) is None
    await h.aclose()


@virtual_test
async def test_a_registration_our_own_lease_holds_already_leaves_the_old_round() -> None:
    """Registering for round 1 finds the key held by this node's own lease (a registration that
    landed although its join was cut short before the answer, whose withdrawal did not reach
    the store): it is ours, not a duplicate's; the node is registered, and leaves round 0."""
    store = MemoryStore(MemoryEngine())
    h = handler(store, node_id="node-a")
    keeper = store.lease(TTL)
    await keeper.start()
    record = NodeRecord("node-a", "h", 1).encode()
    await store.put(KEYS.node(0, "node-a"), record, lease=keeper.id)
    mine = await store.put(KEYS.node(1, "node-a"), record, lease=keeper.id)
    await store.put(KEYS.node(0, "node-b"), record)  # (not ours: stays)
    joiner = h._joiner
    joiner.record_round = 0
    assert await _join._register(joiner, 1, keeper) is None
    assert joiner.record_round == 1
    assert await store.get(KEYS.node(0, "node-a")) is None
    kv = await store.get(KEYS.node(1, "node-a"))
    assert kv is not None
    assert (kv.mod_revision, kv.lease) == (mine, keeper.id)  # not written again
    assert await store.get(KEYS.node(0, "node-b")) is not None
    await keeper.aclose()
    await h.aclose()


@virtual_test
async def test_a_lease_granted_early_is_armed_once_by_the_first_join() -> None:
    # prepare() grants the lease unarmed (its loss before a registration is nobody's); the
    # first join arms it, once: its loss after two joins is the handler's error, one event
    sink = ListSink()
    h = handler(MemoryStore(MemoryEngine()), event_sink=sink)
    await h._prepare()
    keeper = h.lease
    assert keeper is not None
    await h.next_rendezvous()
    await h.next_rendezvous()
    assert h.lease is keeper
    lost = asyncio.Event()
    keeper.on_lost(lambda _error: lost.set())
    await h.store.lease_revoke(keeper.id)
    await lost.wait()
    assert isinstance(h.error, LeaseExpiredError)
    assert len(sink.of("rendezvous.lease_lost")) == 1
    await h.aclose()


class _CtlWatches(MemoryStore):
    """Records the watches of ``c/`` opened (the control view's)."""

    def __init__(self, engine: MemoryEngine) -> None:
        super().__init__(engine)
        self.ctl_watches: list[Watch] = []

    async def range_and_watch(self, prefix: str) -> tuple[RangeResult, Watch]:
        snapshot, watch = await super().range_and_watch(prefix)
        if prefix == KEYS.ctl:
            self.ctl_watches.append(watch)
        return snapshot, watch


@virtual_test
async def test_a_completed_join_keeps_its_view_and_a_failed_one_closes_it() -> None:
    store = _CtlWatches(MemoryEngine())
    h = handler(store, 1, 2, last_call_timeout=1.0, join_timeout=5.0)
    await h.next_rendezvous()
    await h.next_rendezvous()
    (kept,) = store.ctl_watches  # the second join went on from the first one's view
    assert not kept._closed
    h._min = 2  # (the next round cannot form: its join times out)
    with pytest.raises(RendezvousTimeoutError):
        await h.next_rendezvous()
    assert kept._closed  # a failed join's view is not kept
    h._min = 1
    await h.next_rendezvous()
    assert len(store.ctl_watches) == 2
    assert not store.ctl_watches[1]._closed
    await h.aclose()
    assert store.ctl_watches[1]._closed


class _SlowRoundWrite(MemoryStore):
    """The answer to the transaction that writes the round record arrives 10 ms after it is
    applied (as over a network): the joiner sees the round on its watch first."""

    async def _txn(self, txn: Txn) -> TxnResult:
        result = await super()._txn(txn)
        if any(isinstance(op, Put) and op.key == KEYS.round for op in txn.success):
            await asyncio.sleep(0.01)
        return result


@virtual_test
async def test_a_driver_whose_round_write_answers_after_the_event_is_let_finish() -> None:
    sink = ListSink()
    h = handler(_SlowRoundWrite(MemoryEngine()), event_sink=sink)
    result = await h.next_rendezvous()
    assert result.round == 0
    assert h.statistics().rounds_driven == 1  # counted: not cancelled mid-write
    assert sink.of("rendezvous.round_finalized") == [{"round": 0, "world_size": 1}]
    await h.aclose()


class _StuckRoundWrite(MemoryStore):
    """The transaction that writes the round record takes 100 s to reach the store (it is
    applied then): a driver stays in ``finalize`` that long."""

    async def _txn(self, txn: Txn) -> TxnResult:
        if any(isinstance(op, Put) and op.key == KEYS.round for op in txn.success):
            await asyncio.sleep(100.0)
        return await super()._txn(txn)


@virtual_test
async def test_a_join_that_times_out_while_its_driver_writes_the_round_fails_at_once() -> None:
    # only a completed join lets its driver finish the write; a failed one cancels it and
    # fails at its deadline, not after the write (or close_timeout)
    h = handler(_StuckRoundWrite(MemoryEngine()), join_timeout=5.0, last_call_timeout=0.0)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(RendezvousTimeoutError):
        await h.next_rendezvous()
    assert loop.time() - start == pytest.approx(5.0)
    await h.aclose()


@virtual_test
async def test_a_closed_run_is_named_in_the_members_and_the_standbys_errors() -> None:
    engine = MemoryEngine()
    member = handler(MemoryStore(engine), node_id="node-a")
    await member.next_rendezvous()
    standby = handler(MemoryStore(engine), node_id="node-b")
    waiting = asyncio.ensure_future(standby.next_rendezvous())
    await asyncio.sleep(1.0)  # the round is full: node-b waits as a standby
    closer = handler(MemoryStore(engine))
    await closer.set_closed()
    with pytest.raises(RendezvousGracefulExitError) as exited:
        await waiting
    assert str(exited.value) == "the rendezvous 'job' closed while this node was a standby"
    with pytest.raises(RendezvousClosedError) as closed:
        await member.next_rendezvous()
    assert str(closed.value) == "the rendezvous 'job' is closed"
    for h in (member, standby, closer):
        await h.aclose()


@virtual_test
async def test_a_first_join_whose_view_fails_leaves_no_lease_grant_running() -> None:
    store = FaultInjectingStore(MemoryStore(MemoryEngine()))
    await store.put(KEYS.round, b"not json")  # the view's load fails at once
    h = handler(store, local_addr="10.0.0.1")
    store.hang("lease_grant")
    with pytest.raises(RendezvousStateError):
        await h.next_rendezvous()
    store.release()
    await asyncio.sleep(1.0)
    assert h.lease is None  # the grant was cancelled, not left to finish behind the join
    assert store.granted_leases == frozenset()
    await h.aclose()


@virtual_test
async def test_a_join_after_a_lost_lease_drops_and_closes_the_lost_keeper_first() -> None:
    # while the new lease is granted, the handler has none (not the lost one, whose id would
    # be reported as live); the lost keeper is closed, not left behind
    store = FaultInjectingStore(MemoryStore(MemoryEngine()))
    h = handler(store)
    await h.next_rendezvous()
    lost = h.lease
    assert lost is not None
    await store.lease_revoke(lost.id)
    await lost.wait_lost()
    store.hang("lease_grant")
    joining = asyncio.ensure_future(h.next_rendezvous())
    await asyncio.sleep(1.0)
    assert h.lease is None
    assert h.statistics().lease_id == 0
    assert lost._closed
    store.release()
    result = await joining
    assert result.round == 1
    assert h.lease is not None
    assert h.lease is not lost
    await h.aclose()


@virtual_test
async def test_a_join_resumes_driving_under_its_claim_left_by_the_last_join() -> None:
    # node-a's first join claimed the driver of round 0 and timed out; its withdrawal could not
    # delete the claim (a store error), which its lease still holds. Its next join registers
    # (the view shows the claim: no new one) and drives again under it: nobody else can.
    engine = MemoryEngine()
    store = FaultInjectingStore(MemoryStore(engine))
    a = handler(store, 2, 2, node_id="node-a", join_timeout=10.0)
    store.fail_next("compare_and_delete", StoreConnectionError("the store is unreachable"))
    with pytest.raises(RendezvousTimeoutError):
        await a.next_rendezvous()
    kv = await store.get(KEYS.driver)
    assert kv is not None
    assert DriverRecord.decode(kv.key, kv.value) == DriverRecord(0, "node-a")
    b = handler(MemoryStore(engine), 2, 2, node_id="node-b")
    with anyio.fail_after(5.0):  # (without a driver both would wait out their join timeouts)
        first, second = await asyncio.gather(a.next_rendezvous(), b.next_rendezvous())
    assert first.round == second.round == 0
    assert a.statistics().rounds_driven == 1
    await a.aclose()
    await b.aclose()


@virtual_test
async def test_a_join_after_a_lost_lease_finds_a_reopened_run_still_closed_to_it() -> None:
    # node-a took part in round 0; the run was closed, then reopened by a new node (round 1):
    # node-a, of the closed generation, rejoining under a new lease after losing its own, is
    # told the run is closed (its lost registration is gone, not a round of its own). A short
    # history: its kept view's watch falls behind a compaction, so it reads c/ afresh and sees
    # the reopened close, not the close before it
    engine = MemoryEngine(history_limit=4)
    a = handler(MemoryStore(engine), node_id="node-a")
    assert (await a.next_rendezvous()).round == 0
    closer = handler(MemoryStore(engine), 1, 2)
    await closer.set_closed()
    reopener = handler(MemoryStore(engine), reopen_closed=True, node_id="node-r")
    assert (await reopener.next_rendezvous()).round == 1
    lost = a.lease
    assert lost is not None
    await MemoryStore(engine).lease_revoke(lost.id)
    await lost.wait_lost()
    with pytest.raises(RendezvousClosedError, match="is closed"):
        await a.next_rendezvous()
    for h in (a, closer, reopener):
        await h.aclose()


@virtual_test
async def test_a_standby_past_its_join_timeout_not_chosen_again_waits_for_the_round_after() -> None:
    # node-b, a standby past its join timeout, is not chosen in round 1 (node-c registered
    # first): it registers for round 2 and waits on, without a deadline (a wait that still
    # watched its passed deadline would return at once, again and again, never yielding)
    engine = MemoryEngine()
    member = handler(MemoryStore(engine), node_id="node-a")
    await member.next_rendezvous()
    first = handler(MemoryStore(engine), node_id="node-c")
    waiting_first = asyncio.ensure_future(first.next_rendezvous())
    await asyncio.sleep(1.0)  # node-c: a standby for round 1, registered first
    standby = handler(MemoryStore(engine), join_timeout=10.0, node_id="node-b")
    waiting = asyncio.ensure_future(standby.next_rendezvous())
    await asyncio.sleep(30.0)  # past node-b's join timeout
    await member.aclose()  # round 1 forms: node-c only (max_nodes=1)
    assert (await waiting_first).participants == ("node-c",)
    await asyncio.sleep(30.0)
    assert not waiting.done()
    await first.aclose()  # round 2 forms: node-b
    result = await waiting
    assert (result.round, result.participants) == (2, ("node-b",))
    await standby.aclose()


class _ClaimLog(MemoryStore):
    """A memory store whose watches hand their events over through a reader task (as etcd's
    do: no waker), and which counts the transactions that claim the driver (compare
    ``c/driver``)."""

    def __init__(self, engine: MemoryEngine) -> None:
        super().__init__(engine)
        self.claims = 0

    def _watch(self, prefix: str, start_revision: int | None) -> Watch:
        watch = super()._watch(prefix, start_revision)
        watch._set_waker = lambda wake: wake is None  # type: ignore[method-assign]
        return watch

    async def _txn(self, txn: Txn) -> TxnResult:
        if any(compare.key == KEYS.driver for compare in txn.compare):
            self.claims += 1
        return await super()._txn(txn)


@virtual_test
async def test_a_join_applies_a_buffered_claim_before_registering_with_its_own() -> None:
    # node-b's view was opened early (prepare), then node-a claimed the driver: node-b's first
    # step finds that claim buffered in its watch (its reader task takes a loop turn to hand
    # it over) and registers without a claim of its own, which would be doomed to fail
    engine = MemoryEngine()
    b_store = _ClaimLog(engine)
    b = handler(b_store, 2, 2, node_id="node-b", local_addr="10.0.0.2")
    await b._prepare()
    a = handler(MemoryStore(engine), 2, 2, node_id="node-a")
    a_joining = asyncio.ensure_future(a.next_rendezvous())
    await asyncio.sleep(1.0)  # node-a registered and claimed the driver
    first, second = await asyncio.gather(a_joining, b.next_rendezvous())
    assert first.round == second.round == 0
    assert b_store.claims == 0
    await a.aclose()
    await b.aclose()


@virtual_test
async def test_only_a_reopening_handler_reopens_a_closed_run_and_new_nodes_then_join() -> None:
    engine = MemoryEngine()
    closer = handler(MemoryStore(engine), 2, 2)
    await closer.set_closed()
    plain = handler(MemoryStore(engine), 2, 2, node_id="node-p")  # (reopen_closed=False)
    with pytest.raises(RendezvousClosedError, match="is closed"):
        await plain.next_rendezvous()
    kv = await MemoryStore(engine).get(KEYS.closed)
    assert kv is not None
    assert not ClosedRecord.decode(kv.key, kv.value).reopened
    reopener = handler(MemoryStore(engine), 2, 2, reopen_closed=True, node_id="node-r")
    reopening = asyncio.ensure_future(reopener.next_rendezvous())
    await asyncio.sleep(1.0)  # the run is reopened; node-r waits for a second node
    newcomer = handler(MemoryStore(engine), 2, 2, node_id="node-n")  # new to the run
    with anyio.fail_after(5.0):
        first, second = await asyncio.gather(reopening, newcomer.next_rendezvous())
    assert first.round == second.round == 0
    for h in (closer, plain, reopener, newcomer):
        await h.aclose()
