"""The barrier part of the coordination-primitives suite: single and double barriers, timeouts,
dead parties, and waits that ride out broken watches.

Mixed into :class:`~aioelastic.testing.sync_conformance.SyncConformance`, which runs each
test."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from ..errors import SyncTimeoutError
from ..store import Store
from ..sync import Barrier, DoubleBarrier, EventChannel
from ._sync_kit import sync_test

if TYPE_CHECKING:
    from .sync_conformance import SyncEnv

__all__ = ["BarrierConformance"]


class BarrierConformance:
    """``Barrier`` and ``DoubleBarrier`` on every backend."""

    # -- barriers

    @sync_test
    async def test_barrier_opens_when_all_parties_entered(self, env: SyncEnv) -> None:
        stores = await env.clients(3)
        passed: list[int] = []
        entered: list[int] = []

        async def party(index: int) -> None:
            entered.append(index)
            await Barrier(stores[index], "B", 3, config=env.config).wait(timeout=30)
            assert len(entered) == 3, "passed before all parties entered"
            passed.append(index)

        async with anyio.create_task_group() as tg:
            tg.start_soon(party, 0)
            tg.start_soon(party, 1)
            await env.settle(0.3)
            assert passed == []
            tg.start_soon(party, 2)
        assert sorted(passed) == [0, 1, 2]

    @sync_test
    async def test_barrier_timeout_says_how_many_came(self, env: SyncEnv) -> None:
        (store,) = await env.clients(1)
        with pytest.raises(SyncTimeoutError, match="1 of 2 parties"):
            await Barrier(store, "B", 2, config=env.config).wait(timeout=0.3)
        assert (await store.range("B/parties/")).count == 0

    @sync_test
    async def test_a_dead_party_does_not_count(self, env: SyncEnv) -> None:
        dead, a, b = await env.clients(3)
        passed: list[str] = []

        async def party(store: Store, name: str) -> None:
            await Barrier(store, "B", 2, config=env.config).wait(timeout=30)
            passed.append(name)

        async with anyio.create_task_group() as tg:
            doomed = anyio.CancelScope()

            async def dying() -> None:
                with doomed:
                    await party(dead, "dead")

            tg.start_soon(dying)
            await env.settle(0.2)
            dead.partition()
            doomed.cancel()  # the process dies; its lease must expire before it stops counting
            await anyio.sleep(env.config.ttl + env.slack)
            tg.start_soon(party, a, "a")
            await env.settle(0.3)
            assert passed == [], "a dead party counted"
            tg.start_soon(party, b, "b")
        assert sorted(passed) == ["a", "b"]

    @sync_test
    async def test_double_barrier_waits_on_the_way_out(self, env: SyncEnv) -> None:
        stores = await env.clients(3)
        log: list[str] = []

        async def party(index: int, work: float) -> None:
            async with DoubleBarrier(stores[index], "D", 3, config=env.config, timeout=30):
                log.append(f"in{index}")
                await anyio.sleep(work)
                log.append(f"done{index}")
            log.append(f"out{index}")

        async with anyio.create_task_group() as tg:
            for index, work in enumerate([0.05, 0.3, 0.1]):
                tg.start_soon(party, index, work)
        first_out = min(log.index(f"out{i}") for i in range(3))
        assert all(log.index(f"done{i}") < first_out for i in range(3)), log
        assert (await stores[0].range("D/")).count == 0

    @sync_test
    async def test_waits_and_observers_ride_out_broken_watches(self, env: SyncEnv) -> None:
        """Dropped watch streams and a short outage end no wait and lose or repeat no event."""
        waiter, other = await env.clients(2)
        passed = anyio.Event()

        async def party(store: Store) -> None:
            await Barrier(store, "B", 2, config=env.config).wait(timeout=30)
            if store is waiter:
                passed.set()

        publisher = EventChannel(other, "ev")
        async with EventChannel(waiter, "ev").stream() as stream, anyio.create_task_group() as tg:
            tg.start_soon(party, waiter)
            await env.settle(0.2)
            first = await publisher.publish("x", 1)
            waiter.drop_watches()
            second = await publisher.publish("x", 2)
            waiter.partition()  # shorter than the renew deadline: nobody may give up
            waiter.drop_watches()
            third = await publisher.publish("x", 3)
            await anyio.sleep(env.config.renew_deadline / 4)
            waiter.heal()
            tg.start_soon(party, other)
            with anyio.fail_after(env.slack + 5):
                got = [await stream.__anext__() for _ in range(3)]
                await passed.wait()
        assert got == [first, second, third]
