"""FaultInjectingStore and FaultPlan: each fault the test kit promises (latency and seeded jitter,
failing and hanging calls, dropped watch streams, forced lease expiry, partitions between named
clients), its determinism under a seed, and a rendezvous living through them. Virtual time:
every wait is free."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from aioelastic.errors import LeaseNotFoundError, StoreConnectionError, WriteOutcomeUnknownError
from aioelastic.rendezvous import DynamicRendezvousHandler, RendezvousEventKind
from aioelastic.store import EventType, MemoryEngine, MemoryStore
from aioelastic.testing import FaultInjectingStore, FaultPlan, run_virtual


def now() -> float:
    return asyncio.get_running_loop().time()


def test_latency_and_seeded_jitter() -> None:
    async def delays(seed: int) -> list[float]:
        store = FaultInjectingStore(MemoryStore(), seed=seed)
        store.latency, store.jitter = 0.5, 0.25
        out = []
        for i in range(10):
            start = now()
            await store.put(f"k{i}", b"v")
            out.append(now() - start)
        await store.aclose()
        return out

    first = run_virtual(delays(3))
    assert all(0.5 <= d <= 0.75 for d in first), first
    assert len(set(first)) > 1, "jitter should vary"
    assert run_virtual(delays(3)) == first  # the same seed, the same delays
    assert run_virtual(delays(4)) != first


def test_random_failures_are_seeded_and_never_applied() -> None:
    async def scenario(seed: int) -> tuple[list[int], list[str]]:
        inner = MemoryStore()
        store = FaultInjectingStore(inner, seed=seed)
        store.failure_rate = 0.3
        failed: list[int] = []
        for i in range(40):
            try:
                await store.put(f"k{i}", b"v")
            except StoreConnectionError:
                failed.append(i)
        present = {kv.key for kv in await inner.range("")}
        assert present == {f"k{i}" for i in range(40) if i not in failed}  # failed: not applied
        assert [f.kind for f in store.log] == ["random_failure"] * len(failed)
        await store.aclose()
        return failed, [str(f) for f in store.log]

    failed, log = run_virtual(scenario(11))
    assert 0 < len(failed) < 40
    assert run_virtual(scenario(11)) == (failed, log)


def test_fail_next_queues_in_order_and_names_unknown_operations() -> None:
    async def scenario() -> None:
        store = FaultInjectingStore(MemoryStore())
        store.fail_next("put", WriteOutcomeUnknownError("lost reply"))
        store.fail_next("put", StoreConnectionError("refused"))
        with pytest.raises(WriteOutcomeUnknownError):
            await store.put("k", b"1")
        with pytest.raises(StoreConnectionError):
            await store.put("k", b"2")
        assert await store.put("k", b"3") == 1
        assert store.calls["put"] == 3
        await store.aclose()

    run_virtual(scenario())
    with pytest.raises(ValueError, match="operation must be one of"):
        FaultInjectingStore(MemoryStore()).fail_next("puts", RuntimeError())
    with pytest.raises(ValueError, match="operation must be one of"):
        FaultInjectingStore(MemoryStore()).hang("gte")


def test_hanging_calls_block_until_released_or_cancelled() -> None:
    async def scenario() -> None:
        store = FaultInjectingStore(MemoryStore())
        store.hang("put")
        with anyio.move_on_after(100) as scope:
            await store.put("k", b"v")
        assert scope.cancelled_caught  # a hung call is cancellable
        assert await store.get("k") is None  # and never reached the store
        assert await store.current_revision() == 0  # other operations are not hung

        done = anyio.Event()

        async def put() -> None:
            await store.put("k", b"v")
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(put)
            await anyio.sleep(50)
            assert not done.is_set()
            store.release()
            with anyio.fail_after(1):
                await done.wait()
        assert (await store.get("k")) is not None
        store.hang()  # every operation
        with anyio.move_on_after(1) as scope:
            await store.get("k")
        assert scope.cancelled_caught
        await store.aclose()

    run_virtual(scenario())


def test_dropped_watch_streams() -> None:
    async def scenario() -> None:
        store = FaultInjectingStore(MemoryStore())
        async with store.watch("p/") as watch:
            await store.put("p/1", b"x")
            assert (await watch.__anext__()).kv.key == "p/1"

            async def dropper() -> None:
                await anyio.sleep(5)
                assert store.drop_watches() == 1

            async with anyio.create_task_group() as tg:
                tg.start_soon(dropper)
                start = now()
                with pytest.raises(StoreConnectionError, match="dropped watch"):
                    await watch.__anext__()  # a pending read fails when the stream drops
                assert now() - start == pytest.approx(5)
            with pytest.raises(StoreConnectionError):
                await watch.__anext__()
        async with store.watch("p/", start_revision=1) as again:  # a new watch works
            assert (await again.__anext__()).kv.key == "p/1"
        assert [f.kind for f in store.log] == ["watch_dropped", "watch_dropped"]
        await store.aclose()

    run_virtual(scenario())


def test_forced_lease_expiry() -> None:
    async def scenario() -> None:
        store = FaultInjectingStore(MemoryStore())
        async with store.lease(30) as keeper, store.watch("l/") as watch:
            await store.put("l/a", b"1", lease=keeper.id)
            await store.put("l/b", b"2", lease=keeper.id)
            await store.put("other", b"3")
            assert store.granted_leases == {keeper.id}
            assert await store.expire_leases() == [keeper.id]
            events = [await watch.__anext__() for _ in range(4)]
            deletes = [e for e in events if e.type is EventType.DELETE]
            assert sorted(e.kv.key for e in deletes) == ["l/a", "l/b"]
            assert len({e.revision for e in deletes}) == 1  # one revision, as an expiry
            with pytest.raises(LeaseNotFoundError):
                await store.lease_keep_alive(keeper.id)
            with anyio.fail_after(30):
                await keeper.wait_lost()  # the keeper reports it at its next renewal
            assert await store.get("other") is not None
        await store.aclose()

    run_virtual(scenario())


def test_plan_partitions_named_clients() -> None:
    async def scenario() -> None:
        engine = MemoryEngine()
        plan = FaultPlan(seed=1)
        a = plan.client(MemoryStore(engine), "a")
        b = plan.client(MemoryStore(engine), "b")
        with pytest.raises(ValueError, match="already has a client"):
            plan.client(MemoryStore(engine), "a")
        async with a.watch("") as a_watch:
            plan.partition("a")
            assert a.partitioned
            assert not b.partitioned
            with pytest.raises(StoreConnectionError, match="injected partition"):
                await a.put("k", b"from a")
            await b.put("k", b"from b")  # b carries on
            with pytest.raises(StoreConnectionError):
                await a_watch.__anext__()  # a's watch broke with the partition
            with pytest.raises(ValueError, match="no client named"):
                plan.partition("c")
            plan.heal()
            assert (await a.get("k")).value == b"from b"  # type: ignore[union-attr]
        await a.aclose()
        await b.aclose()

    run_virtual(scenario())


def test_a_partitioned_rendezvous_member_is_lost_for_the_others() -> None:
    """A member cut off, its lease forced to expire (no waiting for the TTL): the others see
    PARTICIPANT_LOST at once; the cut-off node learns that its lease is gone."""

    async def scenario() -> None:
        engine = MemoryEngine()
        plan = FaultPlan(seed=5)
        nodes = [
            DynamicRendezvousHandler(
                plan.client(MemoryStore(engine), f"node-{i}"),
                "job",
                2,
                2,
                lease_ttl=10,
                last_call_timeout=0,
                owns_store=True,
            )
            for i in range(2)
        ]
        async with anyio.create_task_group() as tg:
            for node in nodes:
                tg.start_soon(node.next_rendezvous)
        cut = nodes[1]
        plan.partition("node-1")
        await anyio.sleep(3)  # shorter than the TTL: the store still holds the lease...
        assert await plan.expire_leases("node-1")  # ...until forced to expire it
        with anyio.fail_after(1):
            event = await nodes[0].wait_for_change()
        assert event.kind is RendezvousEventKind.PARTICIPANT_LOST
        assert event.node_id == cut.node_id
        with anyio.fail_after(30):
            assert cut.lease is not None
            await cut.lease.wait_lost()
        for node in nodes:
            await node.aclose()

    run_virtual(scenario())


def test_virtual_test_runs_a_body_in_virtual_time_and_bounds_it() -> None:
    """The public decorator: the body's waits take no real time, and a hang fails at the
    virtual timeout instead of blocking the test run."""
    import time

    from aioelastic.testing import virtual_test

    seen: list[float] = []

    @virtual_test
    async def sleeps_an_hour() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(3000)
        seen.append(loop.time() - start)

    @virtual_test(timeout=5)
    async def hangs() -> None:
        await asyncio.Event().wait()

    began = time.monotonic()
    sleeps_an_hour()
    assert seen == [3000]
    with pytest.raises(TimeoutError):
        hangs()
    assert time.monotonic() - began < 5  # real seconds: nothing waited for real
    assert sleeps_an_hour.__name__ == "sleeps_an_hour"
