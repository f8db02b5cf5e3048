"""Unit tests of every transition of the dynamic rendezvous, on the memory store in virtual time.

Each test runs on aioelastic's virtual-time loop: lease TTLs, last-call windows and join timeouts
take no real time, and ``loop.time()`` tells exactly when something happened.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import pytest
from helpers import settle

from aioelastic.errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousStateError,
    RendezvousTimeoutError,
    StoreConnectionError,
)
from aioelastic.rendezvous import (
    DynamicRendezvousHandler,
    RendezvousEventKind,
    RendezvousResult,
    RendezvousStatus,
)
from aioelastic.rendezvous._driver import RoundDriver
from aioelastic.rendezvous._state import (
    DriverRecord,
    NodeRecord,
    RoundRecord,
    RunKeys,
    read_roster,
)
from aioelastic.store import EventType, MemoryEngine, MemoryStore, Put, Txn, TxnResult
from aioelastic.testing import run_virtual, virtual_test

T = TypeVar("T")

TTL = 6.0


virtual = virtual_test  # every async test body here runs in virtual time


def handlers(
    engine: MemoryEngine, n: int, min_nodes: int, max_nodes: int, **kw: Any
) -> list[DynamicRendezvousHandler]:
    kw.setdefault("lease_ttl", TTL)
    kw.setdefault("last_call_timeout", 10.0)
    kw.setdefault("join_timeout", 100.0)
    return [
        DynamicRendezvousHandler(MemoryStore(engine), "job", min_nodes, max_nodes, **kw)
        for _ in range(n)
    ]


async def crash(handler: DynamicRendezvousHandler) -> None:
    """Simulate the node's process dying: no more keep-alives, no clean leave, no client."""
    if handler.lease is not None:
        await handler.lease.aclose(revoke=False)
    await handler.store.aclose()


def spawn(coro: Awaitable[T]) -> asyncio.Task[T]:
    async def wrap() -> T:
        return await coro

    return asyncio.get_running_loop().create_task(wrap())


def check_round(results: Sequence[RendezvousResult]) -> None:
    assert results
    first = results[0]
    assert sorted(r.rank for r in results) == list(range(first.world_size))
    assert len(results) == first.world_size
    for r in results:
        assert (r.round, r.participants, r.world_size) == (
            first.round,
            first.participants,
            first.world_size,
        )
        assert r.participants[r.rank] == r.node_id


async def close_all(hs: Sequence[DynamicRendezvousHandler]) -> None:
    for h in hs:
        await h.aclose()


# -- forming a round ------------------------------------------------------------------------------


@virtual
async def test_exact_size_round_completes_at_once() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 4, 4, 4)
    loop = asyncio.get_running_loop()
    start = loop.time()
    results = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    assert loop.time() == start  # no wait of any kind
    check_round(results)
    assert results[0].round == 0
    assert all(h.status is RendezvousStatus.ACTIVE and h.is_active for h in hs)
    info = results[0].bootstrap_store_info
    assert info.master_addr
    assert 0 < info.master_port < 65536
    assert {r.bootstrap_store_info for r in results} == {info}
    await close_all(hs)


@virtual
async def test_single_node_round() -> None:
    engine = MemoryEngine()
    (h,) = handlers(engine, 1, 1, 1)
    result = await h.next_rendezvous()
    assert (result.rank, result.world_size, result.participants) == (0, 1, (h.node_id,))
    await h.aclose()


@virtual
async def test_elastic_round_completes_at_last_call_deadline() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 3, 2, 4, last_call_timeout=10.0)
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = [spawn(h.next_rendezvous()) for h in hs[:2]]
    await asyncio.sleep(4)  # the third arrives inside the window and is included
    tasks.append(spawn(hs[2].next_rendezvous()))
    results = await asyncio.gather(*tasks)
    assert loop.time() - start == pytest.approx(10.0)  # from when min (2) was reached
    check_round(results)
    assert results[0].world_size == 3
    stats = [h.statistics() for h in hs]
    (driver,) = [st for st in stats if st.rounds_driven]
    assert driver.last_call_deadline == pytest.approx(start + 10.0)
    assert all(st.completed_at == loop.time() and st.round == 0 and st.joins == 1 for st in stats)
    assert all(st.world_size == 3 and st.lease_id for st in stats)
    await close_all(hs)


@virtual
async def test_reaching_max_completes_before_the_deadline() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 3, 2, 3, last_call_timeout=10.0)
    loop = asyncio.get_running_loop()
    tasks = [spawn(h.next_rendezvous()) for h in hs[:2]]
    await asyncio.sleep(3)
    start = loop.time()
    tasks.append(spawn(hs[2].next_rendezvous()))
    results = await asyncio.gather(*tasks)
    assert loop.time() == start
    check_round(results)
    await close_all(hs)


@virtual
async def test_below_min_waits_then_join_timeout_withdraws() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 2, 3, 3, join_timeout=20.0)
    loop = asyncio.get_running_loop()
    start = loop.time()
    outcomes = await asyncio.gather(*(h.next_rendezvous() for h in hs), return_exceptions=True)
    assert all(isinstance(o, RendezvousTimeoutError) for o in outcomes)
    assert isinstance(outcomes[0], TimeoutError)  # also the builtin
    assert loop.time() - start == pytest.approx(20.0)
    keys = RunKeys("job")
    assert (await hs[0].store.range(keys.nodes)).count == 0  # both withdrew
    assert all(h.status is RendezvousStatus.ACTIVE for h in hs)  # a timeout is no error
    await close_all(hs)


@virtual
async def test_node_leaving_before_completion_leaves_the_forming_round() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 3, 3, 3)
    loop = asyncio.get_running_loop()
    first = spawn(hs[0].next_rendezvous())
    gone = spawn(hs[1].next_rendezvous())
    await settle()
    await crash(hs[1])
    with pytest.raises(RendezvousConnectionError):
        await gone
    start = loop.time()
    keys = RunKeys("job")
    watch = hs[0].store.watch(keys.nodes_of(0))
    async with watch:
        event = await watch.__anext__()  # the dead node's record goes at its lease expiry
    assert event.kv.key == keys.node(0, hs[1].node_id)
    assert loop.time() - start == pytest.approx(TTL)
    third = spawn(hs[2].next_rendezvous())
    await settle()
    assert not third.done()  # two of three: the dead node is no longer counted
    late = handlers(engine, 1, 3, 3)[0]
    results = await asyncio.gather(first, third, late.next_rendezvous())
    check_round(results)
    assert hs[1].node_id not in results[0].participants
    await close_all([hs[0], hs[2], late])


@virtual
async def test_cancelling_next_rendezvous_withdraws_the_registration() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 2, 2, 2)
    task = spawn(hs[0].next_rendezvous())
    await settle()
    keys = RunKeys("job")
    assert (await hs[0].store.range(keys.nodes_of(0))).count == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await hs[0].store.range(keys.nodes_of(0))).count == 0
    assert await hs[0].store.get(keys.driver) is None
    await close_all(hs)


@virtual
async def test_aclose_ends_a_pending_join() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 2, 2, 2)
    task = spawn(hs[0].next_rendezvous())
    await settle()
    await hs[0].aclose()
    with pytest.raises(RendezvousClosedError, match="closed while joining"):
        await task
    assert (await hs[1].store.range(RunKeys("job").nodes)).count == 0
    assert hs[0].status is RendezvousStatus.CLOSED
    await close_all(hs)


@virtual
async def test_driver_crash_is_taken_over() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 4, 3, 3)
    keys = RunKeys("job")
    driver_task = spawn(hs[0].next_rendezvous())
    await settle()
    kv = await hs[0].store.get(keys.driver)
    assert kv is not None
    assert hs[0].node_id in kv.value.decode()
    others = [spawn(hs[1].next_rendezvous())]
    await settle()
    await crash(hs[0])
    with pytest.raises(RendezvousConnectionError):
        await driver_task
    # after the driver's lease expires, a waiting node drives; the fourth completes the round
    results = await asyncio.gather(*others, hs[2].next_rendezvous(), hs[3].next_rendezvous())
    check_round(results)
    assert hs[0].node_id not in results[0].participants
    await close_all(hs[1:])


# -- surplus nodes, late nodes, rounds ------------------------------------------------------------


@virtual
async def test_surplus_node_is_a_standby_without_timeout_and_exits_gracefully_on_close() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 4, 3, 3, join_timeout=5.0)
    results = await asyncio.gather(*(h.next_rendezvous() for h in hs[:3]))
    check_round(results)
    standby = spawn(hs[3].next_rendezvous())
    await asyncio.sleep(50)  # ten join timeouts: a standby does not time out
    assert not standby.done()
    assert await hs[0].num_nodes_waiting() == 0  # the round is full: restarting cannot take it
    await hs[0].set_closed()
    with pytest.raises(RendezvousGracefulExitError):
        await standby
    assert hs[3].status is RendezvousStatus.CLOSED
    await close_all(hs)


@virtual
async def test_surplus_in_one_forming_round_waits_for_the_next() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 5, 2, 4)
    tasks = [spawn(h.next_rendezvous()) for h in hs]
    done, pending = await asyncio.wait(tasks, timeout=30)
    assert len(done) == 4
    assert len(pending) == 1
    check_round([t.result() for t in done])
    members = [h for h, t in zip(hs, tasks, strict=True) if t in done]
    # a member dies: the standby counts as waiting now, and the next round takes it
    await crash(members[-1])
    assert await members[0].num_nodes_waiting() == 0  # lease still running
    event = await members[0].wait_for_change()
    assert event.kind is RendezvousEventKind.PARTICIPANT_LOST
    assert event.node_id == members[-1].node_id
    assert event.num_nodes_waiting == 1
    results = await asyncio.gather(*(m.next_rendezvous() for m in members[:-1]), *pending)
    check_round(results)
    assert results[0].world_size == 4
    assert results[0].round == 1
    await close_all(hs)


@virtual
async def test_late_node_is_waiting_and_next_round_takes_it_keeping_ranks() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 3, 2, 4, last_call_timeout=0.0)
    loop = asyncio.get_running_loop()
    first = await asyncio.gather(*(h.next_rendezvous() for h in hs[:2]))
    check_round(first)
    joined_at = loop.time()
    late = spawn(hs[2].next_rendezvous())
    for h in hs[:2]:
        event = await h.wait_for_change()
        assert event.kind is RendezvousEventKind.NODES_WAITING
        assert event.num_nodes_waiting == 1
        assert event.node_id == hs[2].node_id
        assert loop.time() == joined_at  # seen at once: a watch event, no poll interval
    assert await hs[0].num_nodes_waiting() == 1
    second = await asyncio.gather(*(h.next_rendezvous() for h in hs[:2]), late)
    check_round(second)
    assert second[0].round == 1
    assert second[0].world_size == 3
    for old, new in zip(first, second[:2], strict=True):
        assert new.rank == old.rank  # stayed, kept its rank
    assert second[2].rank == 2
    await close_all(hs)


@virtual
async def test_new_round_waits_for_every_member_of_the_previous_round() -> None:
    engine = MemoryEngine()
    # (a last call: the driver claims with the first registration, before the others)
    hs = handlers(engine, 3, 1, 3, last_call_timeout=1.0)
    first = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    check_round(first)
    rejoin = [spawn(h.next_rendezvous()) for h in hs[:2]]
    await asyncio.sleep(30)
    assert not any(t.done() for t in rejoin)  # hs[2] is still in round 0: no node in two rounds
    event = await hs[2].wait_for_change()
    assert event.kind is RendezvousEventKind.NODES_WAITING
    second = await asyncio.gather(*rejoin, hs[2].next_rendezvous())
    check_round(second)
    assert [r.rank for r in second] == [r.rank for r in first]
    await close_all(hs)


@virtual
async def test_member_crash_after_completion_is_an_event_for_every_member() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 3, 2, 3)
    loop = asyncio.get_running_loop()
    await asyncio.gather(*(h.next_rendezvous() for h in hs))
    start = loop.time()
    await crash(hs[1])
    for h in (hs[0], hs[2]):
        event = await h.wait_for_change()
        assert event.kind is RendezvousEventKind.PARTICIPANT_LOST
        assert event.node_id == hs[1].node_id
    assert loop.time() - start <= TTL + 0.001
    # an agent that polls num_nodes_waiting (as torch's does) is told to restart (torch #111646)
    assert await hs[0].num_nodes_waiting() == 1
    # survivors re-form
    second = await asyncio.gather(hs[0].next_rendezvous(), hs[2].next_rendezvous())
    check_round(second)
    assert second[0].world_size == 2
    await close_all([hs[0], hs[2]])


@virtual
async def test_survivors_reform_at_once_after_a_loss() -> None:
    """Every survivor of the last round registered again and nobody else waits: no last call."""
    engine = MemoryEngine()
    hs = handlers(engine, 3, 1, 3, last_call_timeout=30.0)
    loop = asyncio.get_running_loop()
    first = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    await crash(hs[1])
    for h in (hs[0], hs[2]):
        assert (await h.wait_for_change()).kind is RendezvousEventKind.PARTICIPANT_LOST
    start = loop.time()
    second = await asyncio.gather(hs[0].next_rendezvous(), hs[2].next_rendezvous())
    assert loop.time() == start  # the 30 s last call was not waited out
    check_round(second)
    assert second[0].world_size == 2
    assert second[0].round == first[0].round + 1
    await close_all([hs[0], hs[2]])


@virtual
async def test_fast_reform_waits_for_a_newcomer_and_can_be_turned_off() -> None:
    """A node that was not in the last round still gets the last call; fast_reform=False keeps
    torch's rule (always wait out the last call)."""
    for fast in (True, False):
        engine = MemoryEngine()
        hs = handlers(engine, 3, 1, 4, last_call_timeout=30.0, fast_reform=fast)
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(h.next_rendezvous() for h in hs[:2]))  # window: nobody else came
        start = loop.time()
        second = await asyncio.gather(*(h.next_rendezvous() for h in hs[:2]))  # a restart
        assert loop.time() - start == (0 if fast else pytest.approx(30.0))
        late = spawn(hs[2].next_rendezvous())
        for h in hs[:2]:
            assert (await h.wait_for_change()).kind is RendezvousEventKind.NODES_WAITING
        start = loop.time()
        third = await asyncio.gather(*(h.next_rendezvous() for h in hs[:2]), late)
        # a newcomer is waited for: the last call runs either way, and it is in the round
        assert loop.time() - start == pytest.approx(30.0)
        check_round(third)
        assert third[0].world_size == 3
        assert second[0].world_size == 2
        await close_all(hs)


@virtual
async def test_events_iterator_ends_with_closed() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 2, 2, 3, last_call_timeout=0.0)
    await asyncio.gather(*(h.next_rendezvous() for h in hs))

    async def collect() -> list[RendezvousEventKind]:
        return [event.kind async for event in hs[0].events()]

    task = spawn(collect())
    await settle()
    extra = handlers(engine, 1, 2, 3)[0]
    joiner = spawn(extra.next_rendezvous())
    await settle()
    await hs[1].set_closed()
    assert await task == [RendezvousEventKind.NODES_WAITING, RendezvousEventKind.CLOSED]
    with pytest.raises(RendezvousClosedError):
        await joiner
    await close_all([*hs, extra])


@virtual
async def test_lease_loss_puts_the_handler_in_error_and_it_can_rejoin() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 2, 2, 2)
    await asyncio.gather(*(h.next_rendezvous() for h in hs))
    lease = hs[0].lease
    assert lease is not None
    await hs[0].store.lease_revoke(lease.id)  # e.g. an operator, or a partition past the TTL
    event = await hs[0].wait_for_change()
    assert event.kind is RendezvousEventKind.ERROR
    assert hs[0].has_error
    assert hs[0].status is RendezvousStatus.ERROR
    message = hs[0].get_error_message()
    assert message is not None
    assert "LeaseExpiredError" in message
    lost = await hs[1].wait_for_change()
    assert lost.kind is RendezvousEventKind.PARTICIPANT_LOST
    results = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    check_round(results)
    assert hs[0].is_active
    assert hs[0].error is None
    await close_all(hs)


# -- closing --------------------------------------------------------------------------------------


@virtual
async def test_close_wakes_waiting_nodes_and_is_sticky() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 3, 3, 3)
    waiting = [spawn(h.next_rendezvous()) for h in hs[:2]]
    await settle()
    assert not await hs[2].is_closed()
    await hs[2].close()
    for task in waiting:
        with pytest.raises(RendezvousClosedError):
            await task
    assert all(h.status is RendezvousStatus.CLOSED for h in hs)
    with pytest.raises(RuntimeError):  # torch code catches RuntimeError
        await hs[0].next_rendezvous()
    newcomer = handlers(engine, 1, 3, 3)[0]
    assert await newcomer.is_closed()
    with pytest.raises(RendezvousClosedError):
        await newcomer.next_rendezvous()
    assert (await hs[0].store.range(RunKeys("job").nodes)).count == 0  # all withdrew
    await close_all([*hs, newcomer])


@virtual
async def test_leaving_does_not_close_and_a_restarted_agent_rejoins() -> None:
    """torch #147064: an interrupted agent closed the run for everyone. Leaving never closes."""
    engine = MemoryEngine()
    hs = handlers(engine, 2, 2, 2)
    await asyncio.gather(*(h.next_rendezvous() for h in hs))
    await hs[1].aclose()  # Ctrl+C: leave
    event = await hs[0].wait_for_change()
    assert event.kind is RendezvousEventKind.PARTICIPANT_LOST
    assert not await hs[0].is_closed()
    with pytest.raises(RendezvousClosedError):  # the handler itself is done
        await hs[1].next_rendezvous()
    restarted = handlers(engine, 1, 2, 2)[0]
    results = await asyncio.gather(hs[0].next_rendezvous(), restarted.next_rendezvous())
    check_round(results)
    assert results[0].round == 1
    assert results[0].rank == 0
    await close_all([hs[0], restarted])


@virtual
async def test_shutdown_closes_the_run_like_torch() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 2, 2, 2)
    await asyncio.gather(*(h.next_rendezvous() for h in hs))
    assert await hs[0].shutdown() is True
    event = await hs[1].wait_for_change()
    assert event.kind is RendezvousEventKind.CLOSED
    assert await hs[1].is_closed()
    await hs[1].aclose()


@virtual
async def test_reopen_closed_starts_a_new_generation_for_new_handlers_only() -> None:
    engine = MemoryEngine()
    old = handlers(engine, 2, 2, 2)
    first = await asyncio.gather(*(h.next_rendezvous() for h in old))
    await old[0].set_closed()
    plain = handlers(engine, 1, 2, 2)[0]
    with pytest.raises(RendezvousClosedError):
        await plain.next_rendezvous()
    fresh = handlers(engine, 2, 2, 2, reopen_closed=True)
    results = await asyncio.gather(*(h.next_rendezvous() for h in fresh))
    check_round(results)
    assert results[0].round > first[0].round  # rounds stay monotonic across generations
    assert await old[1].is_closed()  # it saw the close: it stays closed
    with pytest.raises(RendezvousClosedError):
        await old[1].next_rendezvous()
    await close_all([*old, plain, *fresh])


# -- state validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        b"\x80\x04\x95 pickle",
        b"[]",
        b'{"v": 1, "kind": "node", "r": 0, "m": ["a"], "ma": "h", "mp": 1}',
        b'{"v": 2, "kind": "round", "r": 0, "m": ["a"], "ma": "h", "mp": 1}',
        b'{"v": 1, "kind": "round", "r": -3, "m": ["a"], "ma": "h", "mp": 1}',
        b'{"v": 1, "kind": "round", "r": 0, "m": ["a", "a"], "ma": "h", "mp": 1}',
        b'{"v": 1, "kind": "round", "r": 0, "m": ["a/b"], "ma": "h", "mp": 1}',
    ],
)
def test_corrupt_or_foreign_round_record_is_a_state_error(value: bytes) -> None:
    async def body() -> None:
        engine = MemoryEngine()
        (h,) = handlers(engine, 1, 1, 1)
        await h.store.put(RunKeys("job").round, value)
        with pytest.raises(RendezvousStateError, match="aioelastic/rdzv/job/c/round"):
            await h.next_rendezvous()
        assert h.status is RendezvousStatus.ERROR
        assert isinstance(h.error, RendezvousStateError)
        await h.aclose()

    run_virtual(body())


@virtual
async def test_corrupt_node_record_fails_the_driver_and_the_join() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 2, 2, 2)
    store = hs[0].store
    await store.put(RunKeys("job").node(0, "intruder"), b'{"v":1,"kind":"node","id":"other"}')
    with pytest.raises(RendezvousStateError):
        await hs[0].next_rendezvous()
    await close_all(hs)


@virtual
async def test_duplicate_node_id_is_refused() -> None:
    engine = MemoryEngine()
    a, b = handlers(engine, 2, 3, 3, node_id="node-a")
    task = spawn(a.next_rendezvous())
    await settle()
    with pytest.raises(RendezvousError, match="already registered"):
        await b.next_rendezvous()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await close_all([a, b])


@virtual
async def test_duplicate_node_id_seen_with_the_driver_claim_is_refused_and_put_back() -> None:
    """A registration that carries the driver claim cannot also require its key to be absent:
    the record it replaced shows the other live handler, whose record is put back (with its
    lease); the join fails, and its claim goes with its withdrawal."""
    engine = MemoryEngine()
    (b,) = handlers(engine, 1, 2, 3, node_id="node-a")
    store, keys = b.store, RunKeys("job")
    theirs = await store.lease_grant(TTL * 10)
    record = NodeRecord("node-a", "10.0.0.9", 4242).encode()
    await store.put(keys.node(0, "node-a"), record, lease=theirs.id)  # no driver claim yet
    with pytest.raises(RendezvousError, match="already registered"):
        await b.next_rendezvous()
    kv = await store.get(keys.node(0, "node-a"))
    assert kv is not None
    assert (kv.value, kv.lease) == (record, theirs.id)
    assert await store.get(keys.driver) is None
    await close_all([b])


@virtual
async def test_store_failure_is_a_connection_error_and_error_status() -> None:
    engine = MemoryEngine()
    (h,) = handlers(engine, 1, 1, 1)
    await h.store.aclose()
    with pytest.raises(RendezvousConnectionError):
        await h.next_rendezvous()
    assert h.has_error
    await h.aclose()


@virtual
async def test_result_store_is_namespaced_per_round() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 2, 2, 2)
    results = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    await results[0].store.put("k", b"v")
    kv = await results[1].store.get("k")
    assert kv is not None
    assert kv.value == b"v"
    assert await hs[0].store.get("aioelastic/rdzv-data/job/0/k") is not None
    second = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    assert await second[0].store.get("k") is None
    assert await hs[0].store.get("aioelastic/rdzv-data/job/0/k") is None  # garbage collected
    await close_all(hs)


def test_constructor_validates_arguments() -> None:
    store = MemoryStore()
    with pytest.raises(ValueError, match="min_nodes"):
        DynamicRendezvousHandler(store, "job", 0, 1)
    with pytest.raises(ValueError, match="max_nodes"):
        DynamicRendezvousHandler(store, "job", 3, 2)
    with pytest.raises(ValueError, match="run_id"):
        DynamicRendezvousHandler(store, "a/b", 1, 1)
    with pytest.raises(ValueError, match="node_id"):
        DynamicRendezvousHandler(store, "job", 1, 1, node_id="x y")
    with pytest.raises(ValueError, match="join_timeout"):
        DynamicRendezvousHandler(store, "job", 1, 1, join_timeout=0)
    with pytest.raises(TypeError, match="lease_ttl"):
        DynamicRendezvousHandler(store, "job", 1, 1, lease_ttl="5")  # type: ignore[arg-type]


class _LaggingAnswers(MemoryStore):
    """A store whose compare-and-swap answers arrive after the write's watch events (as with
    etcd or the http store, where the event and the answer travel on different streams)."""

    async def _compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, lease: int
    ) -> Any:
        result = await super()._compare_and_swap(key, expected_mod_revision, value, lease)
        await asyncio.sleep(0.05)
        return result


@virtual
async def test_the_driver_finishes_its_round_when_the_answer_lags_the_event() -> None:
    engine = MemoryEngine()
    hs = [
        DynamicRendezvousHandler(_LaggingAnswers(engine), "job", 2, 2, lease_ttl=TTL)
        for _ in range(2)
    ]
    first = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    await first[0].store.put("checkpoint", b"round 0's data")
    await asyncio.gather(*(h.next_rendezvous() for h in hs))
    # each round counted by the driver that finalised it, though its answer came after the event
    assert sum(h.statistics().rounds_driven for h in hs) == 2
    # and round 1's driver dropped round 0's data store once round 1 was complete
    assert engine.range(RunKeys("job").data(0)).count == 0
    await close_all(hs)


class _CountingStore(MemoryStore):
    """A memory store that records the prefixes it is asked to range over and to watch."""

    def __init__(self, engine: MemoryEngine) -> None:
        super().__init__(engine)
        self.ranges: list[str] = []
        self.watches: list[str] = []

    async def _range(self, prefix: str, limit: int | None) -> Any:
        self.ranges.append(prefix)
        return await super()._range(prefix, limit)

    def _watch(self, prefix: str, start_revision: int | None) -> Any:
        self.watches.append(prefix)
        return super()._watch(prefix, start_revision)


def counted_handlers(
    n: int, min_nodes: int, max_nodes: int
) -> tuple[list[_CountingStore], list[DynamicRendezvousHandler]]:
    """N handlers (no last call) over counting stores of one engine."""
    engine = MemoryEngine()
    stores = [_CountingStore(engine) for _ in range(n)]
    hs = [
        DynamicRendezvousHandler(s, "job", min_nodes, max_nodes, lease_ttl=TTL, last_call_timeout=0)
        for s in stores
    ]
    return stores, hs


@virtual
async def test_a_rejoin_goes_on_from_the_kept_control_watch() -> None:
    stores, hs = counted_handlers(3, 2, 3)
    ctl = RunKeys("job").ctl
    check_round(await asyncio.gather(*(h.next_rendezvous() for h in hs[:2])))
    assert all(s.watches.count(ctl) == 1 and s.ranges.count(ctl) == 1 for s in stores[:2])
    # the control records change while the members are in their round: a newcomer claims the
    # driver of round 1; the members' kept watches buffer that, and the rejoin applies it
    late = spawn(hs[2].next_rendezvous())
    for h in hs[:2]:
        assert (await h.wait_for_change()).kind is RendezvousEventKind.NODES_WAITING
    second = await asyncio.gather(*(h.next_rendezvous() for h in hs[:2]), late)
    check_round(second)
    assert second[0].round == 1
    # no second watch of c/, no second read of it
    assert all(s.watches.count(ctl) == 1 and s.ranges.count(ctl) == 1 for s in stores[:2])
    assert sum(h.statistics().rounds_driven for h in hs) == 2  # each round driven once
    await close_all(hs)
    assert not stores[0].engine.watcher_count  # the kept watches closed with their handlers


@virtual
async def test_a_kept_control_watch_behind_a_compaction_reads_afresh() -> None:
    engine = MemoryEngine()
    hs = handlers(engine, 2, 2, 2)
    check_round(await asyncio.gather(*(h.next_rendezvous() for h in hs)))
    store = hs[0].store
    # an event for the kept c/ watches that nobody reads before history is compacted past it
    await store.put(RunKeys("job").ctl + "note", b"unread")
    await store.compact(await store.put("elsewhere", b"x"))
    second = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    check_round(second)
    assert second[0].round == 1
    await close_all(hs)


@virtual
async def test_member_events_are_counted_from_the_watch_not_read_per_event() -> None:
    stores, hs = counted_handlers(6, 2, 6)
    member = hs[0]
    check_round(await asyncio.gather(*(h.next_rendezvous() for h in hs[:2])))
    stores[0].ranges.clear()
    first = spawn(member.wait_for_change())
    await settle()
    assert not stores[0].ranges  # nothing counted: the driver's word carries the count
    late = [spawn(h.next_rendezvous()) for h in hs[2:]]
    seen: list[int] = []
    for _ in late:
        event = await (first if not seen else member.wait_for_change())
        assert event.kind is RendezvousEventKind.NODES_WAITING
        seen.append(event.num_nodes_waiting)
    assert seen == [1, 2, 3, 4]  # counted as each registration arrived
    assert not stores[0].ranges  # and not read per event
    # a member crash is counted the same way: one gone, four waiting
    await crash(hs[1])
    event = await member.wait_for_change()
    assert event.kind is RendezvousEventKind.PARTICIPANT_LOST
    assert event.num_nodes_waiting == 4 == await member.num_nodes_waiting()
    assert len(stores[0].ranges) == 2  # (num_nodes_waiting just now: two)
    for task in late:
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    await close_all([h for h in hs if h is not hs[1]])


class _LeaseEndsBeforeTheRound(MemoryStore):
    """The driver's store: the lease of ``victim`` ends just before the driver's write of the
    round (its member record would be bound to it)."""

    victim: DynamicRendezvousHandler | None = None

    async def _txn(self, txn: Txn) -> TxnResult:
        victim = self.victim
        if victim is not None and any(
            isinstance(op, Put) and op.key == RunKeys("job").round for op in txn.success
        ):
            self.victim = None
            assert victim.lease is not None
            self.engine.lease_revoke(victim.lease.id)
        return await super()._txn(txn)


@virtual
async def test_a_member_whose_lease_ends_as_the_round_is_written_is_counted_out() -> None:
    """The driver binds each member's record to that member's lease: one that ended since the
    count fails the write, and the driver counts again (the lease's deletions are on its watch)
    and writes the round without it."""
    engine = MemoryEngine()
    store = _LeaseEndsBeforeTheRound(engine)
    kw: dict[str, Any] = {"lease_ttl": TTL, "last_call_timeout": 5.0}
    first = DynamicRendezvousHandler(store, "job", 1, 2, **kw)
    late = DynamicRendezvousHandler(MemoryStore(engine), "job", 1, 2, **kw)
    loop = asyncio.get_running_loop()
    start = loop.time()
    joining = spawn(first.next_rendezvous())
    await settle()
    store.victim = late
    lost = spawn(late.next_rendezvous())  # the second: the round is full, the driver writes it
    result = await joining
    assert store.victim is None  # the write failed once
    assert (result.world_size, result.rank, result.participants) == (1, 0, (first.node_id,))
    assert loop.time() - start == pytest.approx(5.0)  # counted again: the last call ran out
    assert first.statistics().rounds_driven == 1
    with pytest.raises(RendezvousConnectionError):
        await lost
    await close_all([first, late])


@virtual
async def test_a_member_is_told_when_a_next_round_is_out_without_it() -> None:
    """The next round's driver marks the round it replaces (``m/<round>/~next``): a member
    still waiting on it (one whose lease went unnoticed yet) gets ROUND_SUPERSEDED."""
    engine = MemoryEngine()
    hs = handlers(engine, 2, 2, 2)
    check_round(await asyncio.gather(*(h.next_rendezvous() for h in hs)))
    change = spawn(hs[0].wait_for_change())
    await settle()
    keys = RunKeys("job")
    await hs[1].store.put(keys.next_marker(0), RoundRecord(1, 1, "h", 1, 1).encode())
    event = await change
    assert (event.kind, event.round) == (RendezvousEventKind.ROUND_SUPERSEDED, 0)
    await close_all(hs)


@virtual
async def test_a_driver_whose_claim_is_gone_writes_nothing_of_the_round() -> None:
    """Every write of the roster (here 300 members: three transactions) compares the driver's
    claim: a driver that lost it (its lease expired, another node drives) writes nothing."""
    engine = MemoryEngine()
    store = MemoryStore(engine)
    keys = RunKeys("job")
    handler = DynamicRendezvousHandler(store, "job", 1, 300, last_call_timeout=0)
    claim = await store.put(keys.driver, DriverRecord(0, handler.node_id).encode())
    for i in range(300):
        node = f"node-{i:03d}"
        await store.put(keys.node(0, node), NodeRecord(node, "h", 1).encode())

    async def drive(claim: int) -> bool | None:
        driver = RoundDriver(handler, 0, None, claim)
        for kv in await store.range(keys.nodes):
            driver.apply(EventType.PUT, kv)
        return await driver.finalize()

    assert await drive(claim + 1) is False  # not the claim that holds
    assert not (await store.range(keys.roster)).kvs
    assert not (await store.range(keys.members)).kvs
    assert await store.get(keys.round) is None
    assert await drive(claim) is True
    record = await store.get(keys.round)
    assert record is not None
    assert len(await read_roster(store, keys, RoundRecord.decode(record.key, record.value))) == 300
    assert len((await store.range(keys.members)).kvs) == 300
    await handler.aclose()
    await store.aclose()


async def _registered(store: MemoryStore, keys: RunKeys, *nodes: str) -> None:
    for node in nodes:
        await store.put(keys.node(0, node), NodeRecord(node, "h", 1).encode())


@virtual
async def test_a_driver_counts_from_its_claims_read_and_watches_only_what_came_after() -> None:
    """The registrations read with the claim are counted; the watch starts after them, so a
    later registration is counted once and the round completes with both."""
    store, keys = MemoryStore(), RunKeys("job")
    handler = DynamicRendezvousHandler(store, "job", 2, 2, last_call_timeout=0)
    claim = await store.put(keys.driver, DriverRecord(0, handler.node_id).encode())
    await _registered(store, keys, "a")
    driver = RoundDriver(handler, 0, None, claim, await store.range(keys.nodes))
    task = spawn(driver.run())
    await settle()
    assert not task.done()  # one of two: it waits for the next registration
    await _registered(store, keys, "b")
    await asyncio.wait_for(task, 5)
    assert driver.members == ("a", "b")
    await handler.aclose()
    await store.aclose()


@virtual
async def test_a_driver_whose_claims_read_was_cut_reads_the_registrations_itself() -> None:
    """A claim's read of the registrations is bounded (``limit``): a cut one is not counted
    from (it would miss registrations made before the watch starts); the driver reads them all
    with its watch."""
    store, keys = MemoryStore(), RunKeys("job")
    handler = DynamicRendezvousHandler(store, "job", 2, 2, last_call_timeout=0)
    claim = await store.put(keys.driver, DriverRecord(0, handler.node_id).encode())
    await _registered(store, keys, "a", "b")
    cut = await store.range(keys.nodes, limit=1)
    assert cut.more
    driver = RoundDriver(handler, 0, None, claim, cut)
    await asyncio.wait_for(driver.run(), 5)
    assert driver.members == ("a", "b")
    await handler.aclose()
    await store.aclose()


@virtual
async def test_a_driver_whose_claims_read_was_compacted_away_counts_afresh() -> None:
    """The history after the claim's read was compacted before the driver's watch started
    (thousands of registrations in between, on the memory store): it reads the registrations
    again with its watch instead of failing, and tells no node twice."""
    engine = MemoryEngine(history_limit=4)
    store, keys = MemoryStore(engine), RunKeys("job")
    handler = DynamicRendezvousHandler(store, "job", 3, 3, last_call_timeout=0)
    claim = await store.put(keys.driver, DriverRecord(0, handler.node_id).encode())
    await _registered(store, keys, "a")
    snapshot = await store.range(keys.nodes)
    await _registered(store, keys, "b")
    for _ in range(10):
        await store.put("elsewhere", b"x")
    assert engine.compact_revision > snapshot.revision
    driver = RoundDriver(handler, 0, None, claim, snapshot)
    task = spawn(driver.run())
    await settle()
    assert not task.done()  # a and b counted (b from the fresh read): one more is due
    await _registered(store, keys, "c")
    await asyncio.wait_for(task, 5)
    assert driver.members == ("a", "b", "c")
    await handler.aclose()
    await store.aclose()


@virtual
async def test_store_errors_are_translated_and_rendezvous_errors_kept() -> None:
    """A handler's translation of what a call raised: a store error or a lost lease becomes
    RendezvousConnectionError (its cause the original) and the handler's error; another
    RendezvousError is kept as the error and raised as it is; a timeout, a close and anything
    else pass through and leave the handler ACTIVE."""
    (h,) = handlers(MemoryEngine(), 1, 1, 1)

    def error() -> BaseException | None:  # (read afresh: each call below changes it)
        return h.error

    for passing in (RendezvousTimeoutError("t"), RendezvousClosedError("c"), KeyError("k")):
        with pytest.raises(type(passing)) as raised, h._translate("is_closed"):
            raise passing
        assert raised.value is passing
        assert h.status is RendezvousStatus.ACTIVE
    cut = StoreConnectionError("cut")
    with pytest.raises(RendezvousConnectionError) as translated, h._translate("set_closed"):
        raise cut
    assert str(translated.value) == "set_closed failed for run 'job': cut"
    assert translated.value.__cause__ is cut
    assert error() is translated.value
    assert h.status is RendezvousStatus.ERROR
    state = RendezvousStateError("bad state")
    with pytest.raises(RendezvousStateError) as kept, h._translate("next_rendezvous"):
        raise state
    assert kept.value is state
    assert error() is state
    with h._translate("is_closed"):
        pass
    assert error() is state
    await close_all([h])
