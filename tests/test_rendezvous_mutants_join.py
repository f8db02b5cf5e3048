"""Tests for the dynamic rendezvous' join path that mutation testing showed missing (issue 22).

``dynamic.py`` (the handler), ``_join.py`` (the join coordinator) and ``_driver.py`` (the
round's driver): each test pins a behaviour a small, realistic bug would break and no other test
checked (see docs/testing.md, "Mutation testing"). Memory stores, virtual time.
"""

from __future__ import annotations

import asyncio
import importlib
from types import ModuleType
from typing import Any

import anyio
import pytest
from helpers.events import ListSink

from aioelastic.errors import (
    LeaseExpiredError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from aioelastic.rendezvous import DynamicRendezvousHandler, RendezvousStatus, dynamic
from aioelastic.rendezvous._driver import RoundDriver
from aioelastic.rendezvous._state import ClosedRecord, DriverRecord, NodeRecord, RunKeys
from aioelastic.store import (
    MemoryEngine,
    MemoryStore,
    Put,
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
