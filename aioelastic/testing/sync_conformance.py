"""The coordination-primitives conformance suite: lock, election, barriers, events, parameters
and job state, run against any store backend.

Subclass :class:`SyncConformance` in a pytest module, name it ``Test...``, and implement
:meth:`~SyncConformance.open_store` so that each call opens a *new client of the same store*
(several clients act as separate processes)::

    class TestSyncOnMyStore(SyncConformance):
        def open_store(self):
            return open_store("http://127.0.0.1:2380")

Each test runs in its own event loop (virtual time when ``virtual_time = True``), inside a fresh
namespace of the store. Every client is wrapped in a
:class:`~aioelastic.testing.FaultInjectingStore`, so tests can count store calls (no polling, no
thundering herd) and cut a client off (a crashed or partitioned process).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import anyio
import pytest

from ..errors import (
    JobStateError,
    LeaseExpiredError,
    NotLeaderError,
    SyncTimeoutError,
)
from ..store import Store
from ..sync import (
    Barrier,
    DoubleBarrier,
    Election,
    EventChannel,
    JobState,
    JobStateRecord,
    Leader,
    LeaseConfig,
    Parameters,
    store_lock,
)
from ._virtual_time import virtual_time_loop
from .faults import FaultInjectingStore

__all__ = ["SyncConformance", "SyncEnv"]

_Body = Callable[[Any, "SyncEnv"], Awaitable[None]]


class SyncEnv:
    """What a test gets: new clients of the store under test, and the lease timing to use."""

    def __init__(self, suite: SyncConformance, stack: contextlib.AsyncExitStack) -> None:
        self.suite = suite
        self.config = suite.config
        self.slack = suite.timing_slack
        self._settle_factor = suite.settle_factor
        self._stack = stack
        self._namespace = f"sync-conformance/{uuid.uuid4().hex}/"

    async def settle(self, seconds: float) -> None:
        """Let a step land before the next (a few store round trips), scaled for the backend."""
        await anyio.sleep(seconds * self._settle_factor)

    async def client(self) -> FaultInjectingStore:
        """A new client (a separate "process"), namespaced to this test."""
        store = await self._stack.enter_async_context(self.suite.open_store())
        faulty = FaultInjectingStore(store.namespace(self._namespace))
        self._stack.push_async_callback(faulty.aclose)
        return faulty

    async def clients(self, count: int) -> list[FaultInjectingStore]:
        return [await self.client() for _ in range(count)]

    def now(self) -> float:
        return asyncio.get_running_loop().time()


def sync_test(body: _Body) -> Callable[[Any], None]:
    """Turn ``async def test_x(self, env)`` into a plain pytest test run by the suite."""

    def test(self: SyncConformance) -> None:
        self.run(body)

    test.__name__ = body.__name__
    test.__qualname__ = body.__qualname__
    test.__doc__ = body.__doc__
    return test


async def _call_count(stores: list[FaultInjectingStore]) -> int:
    return sum(sum(store.calls.values()) for store in stores)


class SyncConformance:
    """The suite. Subclasses implement :meth:`open_store` and may set the class attributes."""

    #: Lease timing for the primitives under test (etcd grants whole seconds: keep ttl >= 2).
    config: ClassVar[LeaseConfig] = LeaseConfig(ttl=3.0, renew_deadline=2.0, retry_period=0.5)
    #: Allowed lateness of a timed event, in seconds (generous for real servers under load).
    timing_slack: ClassVar[float] = 1.0
    #: Scales the short pauses that let a step land before the next (3x for real servers, whose
    #: round trips stretch on a loaded machine; free on a virtual-time loop).
    settle_factor: ClassVar[float] = 3.0
    #: Run each test on a virtual-time loop (only for in-process backends).
    virtual_time: ClassVar[bool] = False
    #: Bound on each test, in (loop) seconds.
    test_timeout: ClassVar[float] = 60.0

    def open_store(self) -> contextlib.AbstractAsyncContextManager[Store]:
        """A new client of the store under test (each call: another "process")."""
        raise NotImplementedError("subclasses of SyncConformance implement open_store()")

    def run(self, body: _Body) -> None:
        factory = virtual_time_loop if self.virtual_time else None
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(self._run(body))

    async def _run(self, body: _Body) -> None:
        with anyio.fail_after(self.test_timeout):
            async with contextlib.AsyncExitStack() as stack:
                await body(self, SyncEnv(self, stack))

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

        async with anyio.create_task_group() as tg:
            for index in range(4):
                tg.start_soon(worker, index)
                await env.settle(0.02)  # enqueue in index order
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

    # -- election

    @sync_test
    async def test_election_campaign_resign_and_terms(self, env: SyncEnv) -> None:
        a, b = await env.clients(2)
        ea, eb = Election(a, "E", config=env.config), Election(b, "E", config=env.config)
        assert await ea.leader() is None
        me = await ea.campaign("node-a")
        assert ea.is_leader
        assert me.text() == "node-a"
        assert await eb.leader() == me
        campaign = asyncio.ensure_future(eb.campaign(b"node-b"))
        await env.settle(0.2)
        assert not campaign.done()
        proclaimed = await ea.proclaim("node-a2")
        assert proclaimed.term == me.term
        assert (await eb.leader()) == proclaimed
        await ea.resign()
        with anyio.fail_after(env.slack + 1):
            second = await campaign
        assert second.text() == "node-b"
        assert second.term > me.term
        assert eb.term == second.term
        with pytest.raises(NotLeaderError):
            await ea.proclaim("x")
        await eb.resign()
        assert await ea.leader() is None

    @sync_test
    async def test_observe_reports_leader_changes(self, env: SyncEnv) -> None:
        a, b, watcher = await env.clients(3)
        seen: list[Leader | None] = []
        ea, eb = Election(a, "E", config=env.config), Election(b, "E", config=env.config)
        async with Election(watcher, "E").observe() as changes:
            seen.append(await changes.__anext__())
            await ea.campaign("a")
            with anyio.fail_after(env.slack + 1):
                seen.append(await changes.__anext__())
            async with watcher.watch(ea.prefix) as queue:
                campaign = asyncio.ensure_future(eb.campaign("b"))
                with anyio.fail_after(env.slack + 1):
                    await queue.__anext__()  # b is queued behind a (not a sleep: a race on etcd)
            await ea.proclaim("a2")
            with anyio.fail_after(env.slack + 1):
                seen.append(await changes.__anext__())
            await ea.resign()
            with anyio.fail_after(env.slack + 1):
                seen.append(await changes.__anext__())
                await campaign
            await eb.resign()
            with anyio.fail_after(env.slack + 1):
                seen.append(await changes.__anext__())
        values = [None if leader is None else leader.text() for leader in seen]
        assert values == [None, "a", "a2", "b", None]

    @sync_test
    async def test_leadership_loss_cancels_the_leader(self, env: SyncEnv) -> None:
        a, b, admin = await env.clients(3)
        finished = False
        terms: list[int] = []

        async def lead() -> None:
            nonlocal finished
            async with Election(a, "E", config=env.config).leadership("a") as me:
                terms.append(me.term)
                assert await Election(admin, "E").leader() == me
                kv = await admin.get(me.key)
                assert kv is not None
                await admin.lease_revoke(kv.lease)
                await anyio.sleep(env.config.ttl * 3)
                finished = True

        with pytest.raises(LeaseExpiredError):
            await lead()
        assert not finished
        async with Election(b, "E", config=env.config).leadership("b", timeout=1) as other:
            assert other.term > terms[0]

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

    # -- events

    @sync_test
    async def test_events_publish_wait_and_stream(self, env: SyncEnv) -> None:
        a, b = await env.clients(2)
        pub, sub = EventChannel(a, "ev"), EventChannel(b, "ev")
        early = await pub.publish("started", {"rank": 0})
        assert (await sub.wait("started", timeout=1)) == early  # published before the wait
        waiting = asyncio.ensure_future(sub.wait("saved", timeout=30))
        async with sub.stream() as stream:
            await env.settle(0.1)
            assert not waiting.done()
            saved = await pub.publish("saved", {"step": 100, "path": "/ckpt/100"})
            with anyio.fail_after(env.slack + 1):
                assert (await waiting).payload == {"step": 100, "path": "/ckpt/100"}
            again = await pub.publish("saved", {"step": 200})
            with anyio.fail_after(env.slack + 1):
                got = [await stream.__anext__(), await stream.__anext__()]
        assert got == [saved, again]
        newer = await sub.wait("saved", after_revision=saved.revision, timeout=1)
        assert newer == again
        with pytest.raises(SyncTimeoutError, match="'never'"):
            await sub.wait("never", timeout=0.2)
        with pytest.raises(TypeError, match="JSON"):
            await pub.publish("bad", {"x": object()})
        assert await pub.clear() == 2

    @sync_test
    async def test_a_lease_bound_event_goes_with_its_publisher(self, env: SyncEnv) -> None:
        a, b = await env.clients(2)
        async with env.config.lease(a) as lease:
            await EventChannel(a).publish("alive", "a", lease=lease)
            assert await EventChannel(b).get("alive") is not None
        assert await EventChannel(b).get("alive") is None

    # -- parameters

    @sync_test
    async def test_parameters_typed_cas_and_watch(self, env: SyncEnv) -> None:
        a, b = await env.clients(2)
        schema: dict[str, type | tuple[type, ...]] = {"lr": float, "batch": int, "note": str}
        pa, pb = Parameters(a, "p", schema=schema), Parameters(b, "p", schema=schema)
        async with pb.watch() as changes:
            await pa.set("lr", 1)
            assert await pb.get("lr") == 1
            entry = await pb.get_entry("lr")
            assert entry is not None
            assert await pb.compare_and_set("lr", 0.5, expected_revision=entry.revision)
            assert not await pa.compare_and_set("lr", 0.1, expected_revision=entry.revision)
            assert not await pa.compare_and_set("lr", 0.1, expected_revision=0)
            await pa.delete("lr")
            with anyio.fail_after(env.slack + 1):
                got = [await changes.__anext__() for _ in range(3)]
        assert [(c.name, c.value, c.deleted) for c in got] == [
            ("lr", 1, False),
            ("lr", 0.5, False),
            ("lr", None, True),
        ]
        with pytest.raises(TypeError, match="'batch' must be int"):
            await pa.set("batch", True)
        with pytest.raises(KeyError, match="unknown parameter"):
            await pa.set("other", 1)
        with pytest.raises(KeyError, match="not set"):
            await pa.get("note")
        assert await pa.get("note", "none") == "none"

    @sync_test
    async def test_parameter_updates_do_not_lose_writes(self, env: SyncEnv) -> None:
        stores = await env.clients(4)

        async def bump(store: Store) -> None:
            params = Parameters(store, "p")
            for _ in range(10):
                await params.update("count", lambda n: n + 1, default=0)

        async with anyio.create_task_group() as tg:
            for store in stores:
                tg.start_soon(bump, store)
        assert await Parameters(stores[0], "p").snapshot() == {"count": 40}

    # -- job state

    @sync_test
    async def test_job_state_transitions_and_waits(self, env: SyncEnv) -> None:
        agent, worker = await env.clients(2)
        record, view = JobStateRecord(agent, "job"), JobStateRecord(worker, "job")
        assert (await view.get()).state is JobState.PENDING
        running = asyncio.ensure_future(view.wait("running", timeout=30))
        final = asyncio.ensure_future(view.wait_final(timeout=30))
        await env.settle(0.1)
        await record.set(JobState.RUNNING)
        with anyio.fail_after(env.slack + 1):
            assert (await running).state is JobState.RUNNING
        with pytest.raises(ValueError, match="reason"):
            await record.set("failed")
        status = await record.set("failed", "rank 3 exited with 1", details={"rank": 3})
        with anyio.fail_after(env.slack + 1):
            assert await final == status
        assert (await view.get()).reason == "rank 3 exited with 1"
        with pytest.raises(JobStateError, match="failed to running"):
            await view.set("running")

    @sync_test
    async def test_job_state_racing_writers_cannot_both_finish(self, env: SyncEnv) -> None:
        a, b = await env.clients(2)
        await JobStateRecord(a).set("running")
        outcomes: list[str] = []

        async def finish(store: Store, state: str) -> None:
            try:
                await JobStateRecord(store).set(state, "done" if state == "failed" else None)
                outcomes.append(state)
            except JobStateError:
                outcomes.append("refused")

        async with anyio.create_task_group() as tg:
            tg.start_soon(finish, a, "succeeded")
            tg.start_soon(finish, b, "failed")
        assert outcomes.count("refused") == 1
        final = await JobStateRecord(a).get()
        assert final.state.value in outcomes
