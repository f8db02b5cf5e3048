"""The lock part of the coordination-primitives suite: exclusion, FIFO order, try-acquire, shared
leases, wake-ups without polling, timeouts, crashed holders, outages and lost leases.

Mixed into :class:`~aioelastic.testing.sync_conformance.SyncConformance`, which runs each
test."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from ..errors import LeaseExpiredError, SyncTimeoutError
from ..store import EventType, Watch
from ..sync import store_lock
from ._sync_kit import sync_test

if TYPE_CHECKING:
    from .sync_conformance import SyncEnv

__all__ = ["LockConformance"]


async def _enqueued(queue: Watch) -> None:
    """The next queue entry written (a contender's put; a release is a delete)."""
    while (await queue.__anext__()).type is not EventType.PUT:
        pass


class LockConformance:
    """``store_lock`` on every backend."""

    # -- lock

    @sync_test
    async def test_lock_excludes_and_is_fifo(self, env: SyncEnv) -> None:
        stores = await env.clients(4)
        inside: list[int] = []
        order: list[int] = []
        tokens: list[int] = []

        async def worker(index: int) -> None:
            async with store_lock(stores[index], "L", config=env.config) as lock:
                inside.append(index)
                assert len(inside) == 1, f"two holders: {inside}"
                order.append(index)
                tokens.append(lock.fencing_token)
                await env.settle(0.05)
                inside.remove(index)

        async with stores[0].watch("L/") as queue, anyio.create_task_group() as tg:
            for index in range(4):
                tg.start_soon(worker, index)
                await _enqueued(queue)  # in index order: the next starts once this one queued
        assert order == [0, 1, 2, 3]
        assert tokens == sorted(tokens)
        assert len(set(tokens)) == 4
        assert (await stores[0].range("L/")).count == 0

    @sync_test
    async def test_try_acquire_never_waits_and_leaves_nothing(self, env: SyncEnv) -> None:
        a, b = await env.clients(2)
        first = store_lock(a, "L", config=env.config)
        assert await first.try_acquire()
        token = first.fencing_token
        second = store_lock(b, "L", config=env.config)
        with anyio.fail_after(env.slack + 1):
            assert not await second.try_acquire()
        assert not second.held
        holder = await second.holder()
        assert holder is not None
        assert holder.create_revision == token
        assert (await a.range("L/")).count == 1
        await first.release()
        assert await second.try_acquire()
        assert second.fencing_token > token
        await second.release()
        assert (await a.range("L/")).count == 0

    @sync_test
    async def test_a_contender_whose_key_sorts_first_waits_its_turn(self, env: SyncEnv) -> None:
        """The queue is ordered by create revision, never by key: a contender that comes second
        with a key sorting before the holder's (chosen so here, not left to its lease id) neither
        takes the lock nor is told it is next."""
        clients = await env.clients(2)
        async with env.config.lease(clients[0]) as one, env.config.lease(clients[1]) as two:
            # a queue key starts with its lease id in hex: the contender's must sort first
            (first, first_lease), (last, last_lease) = sorted(
                zip(clients, (one, two), strict=True), key=lambda pair: f"{pair[1].id:x}_"
            )
            holder = store_lock(last, "L", lease=last_lease)
            contender = store_lock(first, "L", lease=first_lease)
            token = await holder.acquire()
            assert not await contender.try_acquire()
            with pytest.raises(SyncTimeoutError):
                await contender.acquire(timeout=0.3)
            async with anyio.create_task_group() as tg:
                tg.start_soon(contender.acquire)
                await env.settle(0.2)
                queue = (await first.range("L/")).kvs
                assert min(queue, key=lambda kv: kv.key).lease == first_lease.id
                assert not contender.held
                await holder.release()
            assert contender.held
            assert contender.fencing_token > token
            await contender.release()

    @sync_test
    async def test_lock_with_a_shared_lease(self, env: SyncEnv) -> None:
        (store,) = await env.clients(1)
        async with env.config.lease(store) as lease:
            async with (
                store_lock(store, "A", lease=lease) as a,
                store_lock(store, "B", lease=lease),
            ):
                assert a.lease is lease
                assert (await store.lease_time_to_live(lease.id)).keys != ()
            assert not lease.lost  # releasing does not revoke a lease the caller owns
            assert (await store.lease_time_to_live(lease.id)).keys == ()

    @sync_test
    async def test_release_wakes_only_the_next_waiter_and_nothing_polls(self, env: SyncEnv) -> None:
        stores = await env.clients(6)
        holder = store_lock(stores[0], "L", config=env.config)
        await holder.acquire()
        acquired: list[int] = []
        release = [anyio.Event() for _ in stores]
        got = [anyio.Event() for _ in stores]

        async def waiter(index: int) -> None:
            async with store_lock(stores[index], "L", config=env.config):
                acquired.append(index)
                got[index].set()
                await release[index].wait()

        async with anyio.create_task_group() as tg:
            for index in range(1, 6):
                tg.start_soon(waiter, index)
                await env.settle(0.02)
            await env.settle(0.2)
            reads = sum(s.calls["range"] + s.calls["get"] for s in stores)
            await anyio.sleep(env.config.retry_period * 3)  # idle: only keep-alives happen
            assert sum(s.calls["range"] + s.calls["get"] for s in stores) == reads, "polling"
            await holder.release()
            with anyio.fail_after(env.slack + 1):
                await got[1].wait()
            await env.settle(0.2)
            assert acquired == [1]
            reads_after = [s.calls["range"] for s in stores]
            release[1].set()
            with anyio.fail_after(env.slack + 1):
                await got[2].wait()
            await env.settle(0.1)
            woke = [i for i, s in enumerate(stores) if s.calls["range"] != reads_after[i]]
            assert woke == [2], f"release woke {woke}, expected only the next waiter"
            for event in release:
                event.set()
        assert acquired == [1, 2, 3, 4, 5]

    @sync_test
    async def test_acquire_timeout_and_cancellation_leave_no_entry(self, env: SyncEnv) -> None:
        a, b = await env.clients(2)
        async with store_lock(a, "L", config=env.config):
            lock = store_lock(b, "L", config=env.config)
            with pytest.raises(SyncTimeoutError, match="'L'"):
                await lock.acquire(timeout=0.3)
            with anyio.move_on_after(0.3):
                await lock.acquire()
            assert not lock.held
            assert (await a.range("L/")).count == 1
        assert (await a.range("L/")).count == 0

    @sync_test
    async def test_crashed_holder_is_replaced_within_the_ttl(self, env: SyncEnv) -> None:
        crashed, survivor = await env.clients(2)
        holding = anyio.Event()
        lost: list[BaseException] = []

        async def doomed() -> None:
            try:
                async with store_lock(crashed, "L", config=env.config):
                    holding.set()
                    await anyio.sleep_forever()
            except LeaseExpiredError as exc:
                lost.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(doomed)
            await holding.wait()
            crashed.partition()  # the holder's process is cut off: it can renew nothing
            cut = env.now()
            async with store_lock(survivor, "L", config=env.config) as lock:
                took = env.now() - cut
                assert lost, "the old holder was still running when the new one acquired"
                assert lock.held
        assert took <= env.config.ttl + env.slack
        assert took >= env.config.renew_deadline

    @sync_test
    async def test_a_waiter_rides_out_a_short_outage(self, env: SyncEnv) -> None:
        a, b = await env.clients(2)
        holder = store_lock(a, "L", config=env.config)
        await holder.acquire()
        got = anyio.Event()

        async def wait() -> None:
            async with store_lock(b, "L", config=env.config):
                got.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await env.settle(0.1)
            b.partition()  # shorter than the renew deadline: the waiter must not give up
            await holder.release()
            await anyio.sleep(env.config.renew_deadline / 4)
            assert not got.is_set()
            b.heal()
            with anyio.fail_after(env.slack + 2):
                await got.wait()

    @sync_test
    async def test_losing_the_lease_cancels_the_holder(self, env: SyncEnv) -> None:
        a, admin = await env.clients(2)
        finished = False
        lock = store_lock(a, "L", config=env.config)

        async def hold() -> None:
            nonlocal finished
            async with lock:
                await admin.lease_revoke(lock.lease.id)
                await anyio.sleep(env.config.ttl * 3)
                finished = True

        with pytest.raises(LeaseExpiredError):
            await hold()
        assert not finished
        assert not lock.held
