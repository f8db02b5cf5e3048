"""Every wait and observer of the primitives rides out store connection errors: it watches again
from where it stopped (no event lost or seen twice), re-reads its state when that history was
compacted meanwhile, and ends only at its own deadline, cancellation or lease loss.

Unit level: several clients of one memory engine, each a ``FaultInjectingStore`` (dropped watch
streams, partitions, random failures, hanging calls), on a virtual-time loop. Over the real HTTP
server: ``test_http_server_restart_*``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from aioelastic.errors import StoreAuthError, StoreConnectionError, SyncTimeoutError
from aioelastic.store import MemoryEngine, MemoryStore, Store, open_store
from aioelastic.sync import (
    Barrier,
    DoubleBarrier,
    Election,
    EventChannel,
    JobState,
    JobStateRecord,
    LeaseConfig,
    Parameters,
    store_lock,
)
from aioelastic.testing import FaultInjectingStore, virtual_test
from aioelastic.testing.http import ServerThread

CONFIG = LeaseConfig(ttl=6, renew_deadline=4, retry_period=0.5)


# each scenario fails after 60 (virtual) seconds rather than hanging
_in_virtual_time = virtual_test(timeout=60)


def _clients(engine: MemoryEngine, count: int) -> list[FaultInjectingStore]:
    return [FaultInjectingStore(MemoryStore(engine), seed=index) for index in range(count)]


async def _outage(store: FaultInjectingStore, seconds: float) -> None:
    """Cut ``store`` off for ``seconds``: its open watches break and every call fails."""
    store.partition()
    store.drop_watches()
    await anyio.sleep(seconds)
    store.heal()


# -- waits with a deadline -------------------------------------------------------------------------


def test_barrier_waiter_rides_out_an_outage_and_a_compaction() -> None:
    async def main() -> None:
        engine = MemoryEngine()
        waiter, other, admin = _clients(engine, 3)
        passed = anyio.Event()

        async def wait() -> None:
            await Barrier(waiter, "B", 3, config=CONFIG).wait(timeout=30)
            passed.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.5)
            waiter.drop_watches()  # a short break: watched again at once
            await anyio.sleep(0.5)
            tg.start_soon(_outage, waiter, 2.0)
            await anyio.sleep(0.1)
            tg.start_soon(Barrier(other, "B", 3, config=CONFIG).wait)
            await anyio.sleep(0.5)
            assert not passed.is_set()
            # The third party opens the barrier while the waiter is cut off, and the history it
            # missed is compacted: the waiter must read the state again and pass.
            await Barrier(admin, "B", 3, config=CONFIG).wait(timeout=5)
            await admin.compact(await admin.current_revision())
            with anyio.fail_after(5):
                await passed.wait()
        assert any(fault.kind == "watch_dropped" for fault in waiter.log)

    _in_virtual_time(main)()


def test_barrier_outage_longer_than_the_timeout_is_a_timeout() -> None:
    async def main() -> None:
        (store,) = _clients(MemoryEngine(), 1)
        barrier = Barrier(store, "B", 2, config=LeaseConfig(ttl=60, renew_deadline=40))

        async def cut_off() -> None:
            await anyio.sleep(0.5)
            store.partition()
            store.drop_watches()

        async with anyio.create_task_group() as tg:
            tg.start_soon(cut_off)
            started = anyio.current_time()
            with pytest.raises(SyncTimeoutError, match="an unknown number of 2 parties"):
                await barrier.wait(timeout=3)
            assert anyio.current_time() - started == pytest.approx(3, abs=0.1)
        store.heal()

    _in_virtual_time(main)()


def test_double_barrier_leave_rides_out_an_outage() -> None:
    async def main() -> None:
        a, b = _clients(MemoryEngine(), 2)
        first = DoubleBarrier(a, "D", 2, config=CONFIG, timeout=30)
        second = DoubleBarrier(b, "D", 2, config=CONFIG, timeout=30)
        left = anyio.Event()

        async def leave_first() -> None:
            await first.leave()
            left.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(first.enter)
            tg.start_soon(second.enter)
        async with anyio.create_task_group() as tg:
            tg.start_soon(leave_first)
            await anyio.sleep(0.5)
            await _outage(a, 1.5)
            assert not left.is_set()  # b is still in the barrier
            await second.leave()
            with anyio.fail_after(5):
                await left.wait()
        assert (await b.range("D/")).count == 0  # the ready key was removed

    _in_virtual_time(main)()


@pytest.mark.parametrize("kind", ["lock", "election"])
def test_queue_waiter_rides_out_a_failed_first_read_and_dropped_watches(kind: str) -> None:
    async def main() -> None:
        holder_store, waiter_store = _clients(MemoryEngine(), 2)
        got = anyio.Event()

        async def wait() -> None:
            if kind == "lock":
                async with store_lock(waiter_store, "Q", config=CONFIG, timeout=30):
                    got.set()
            else:
                async with Election(waiter_store, "Q", config=CONFIG).leadership("w", timeout=30):
                    got.set()

        if kind == "lock":
            holder = store_lock(holder_store, "Q", config=CONFIG)
            await holder.acquire()
            release: Callable[[], Awaitable[None]] = holder.release
        else:
            election = Election(holder_store, "Q", config=CONFIG)
            await election.campaign("h")
            release = election.resign
        # The waiter's first read of its place in the queue fails: it must read again, not fail.
        waiter_store.fail_next("range", StoreConnectionError("injected"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.5)
            waiter_store.drop_watches()
            await anyio.sleep(0.5)
            assert not got.is_set()
            await release()
            with anyio.fail_after(5):
                await got.wait()

    _in_virtual_time(main)()


def test_a_timed_out_wait_is_not_held_by_a_store_that_stops_answering() -> None:
    async def main() -> None:
        holder_store, waiter_store = _clients(MemoryEngine(), 2)
        holder = store_lock(holder_store, "Q", config=CONFIG)
        await holder.acquire()
        async with CONFIG.lease(waiter_store) as lease:  # shared: leaving deletes the key itself
            waiter = store_lock(waiter_store, "Q", lease=lease)
            started = anyio.current_time()

            async def stop_answering() -> None:
                await anyio.sleep(0.5)
                waiter_store.drop_watches()
                waiter_store.hang("watch")
                waiter_store.hang("compare_and_delete")

            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_answering)
                with pytest.raises(SyncTimeoutError):
                    await waiter.acquire(timeout=2)
            # the deadline, then at most the bounded clean-up
            assert anyio.current_time() - started <= 2 + 5 + 0.1
            waiter_store.release()
        await holder.release()

    _in_virtual_time(main)()


def test_event_wait_rides_out_random_failures_and_hangs_but_not_other_errors() -> None:
    async def main() -> None:
        waiter, publisher = _clients(MemoryEngine(), 2)
        channel = EventChannel(waiter)
        waiter.failure_rate = 0.5  # half of the waiter's calls fail before reaching the store

        async def publish_later() -> None:
            await anyio.sleep(1)
            waiter.drop_watches()
            await anyio.sleep(1)
            await EventChannel(publisher).publish("saved", {"step": 2})

        async with anyio.create_task_group() as tg:
            tg.start_soon(publish_later)
            with anyio.fail_after(10):
                event = await channel.wait("saved", timeout=30)
        assert event.payload == {"step": 2}
        assert any(fault.kind == "random_failure" for fault in waiter.log)
        waiter.failure_rate = 0.0

        # A store that hangs when the watch is re-established: the deadline still ends the wait.
        waiter.hang("watch")
        waiter.drop_watches()
        with pytest.raises(SyncTimeoutError):
            await channel.wait("saved", after_revision=event.revision, timeout=2)
        waiter.release()

        # Errors other than connection errors end the wait.
        waiter.fail_next("watch", StoreAuthError("permission denied"))
        with pytest.raises(StoreAuthError):
            await channel.wait("saved", after_revision=event.revision, timeout=30)

    _in_virtual_time(main)()


def test_job_state_wait_rides_out_an_outage() -> None:
    async def main() -> None:
        waiter, agent = _clients(MemoryEngine(), 2)

        async def finish() -> None:
            await JobStateRecord(agent).set("running")
            await anyio.sleep(0.5)
            await _outage(waiter, 1.5)
            await JobStateRecord(agent).set("succeeded")

        async with anyio.create_task_group() as tg:
            tg.start_soon(finish)
            with anyio.fail_after(10):
                status = await JobStateRecord(waiter).wait_final(timeout=30)
        assert status.state is JobState.SUCCEEDED

    _in_virtual_time(main)()


# -- long-lived observers --------------------------------------------------------------------------


def test_event_stream_never_skips_or_duplicates_across_breaks() -> None:
    async def main() -> None:
        watcher, publisher = _clients(MemoryEngine(), 2)
        published: list[int] = []
        seen: list[int] = []

        async def publish() -> None:
            channel = EventChannel(publisher)
            for step in range(30):
                published.append((await channel.publish("step", step)).revision)
                if step % 7 == 3:
                    watcher.drop_watches()
                if step == 15:
                    await _outage(watcher, 1.5)
                await anyio.sleep(0.01)

        async with EventChannel(watcher).stream() as stream, anyio.create_task_group() as tg:
            tg.start_soon(publish)
            with anyio.fail_after(20):
                async for event in stream:
                    assert event.payload == len(seen)
                    seen.append(event.revision)
                    if len(seen) == 30:
                        break
        assert seen == published

    _in_virtual_time(main)()


def test_event_stream_after_compaction_reports_what_it_missed_once() -> None:
    async def main() -> None:
        watcher, publisher = _clients(MemoryEngine(), 2)
        channel = EventChannel(publisher)
        async with EventChannel(watcher).stream() as stream:
            first = await channel.publish("a", 1)
            assert (await stream.__anext__()).revision == first.revision
            watcher.partition()
            watcher.drop_watches()
            await channel.publish("a", 2)
            await channel.publish("b", 1)
            await channel.publish("a", 3)
            await publisher.compact(await publisher.current_revision())
            watcher.heal()
            missed = [await stream.__anext__() for _ in range(2)]
            # the latest publication of each name, in revision order (a compacted history
            # cannot be replayed), then the stream goes on
            assert [(e.name, e.payload) for e in missed] == [("b", 1), ("a", 3)]
            later = await channel.publish("b", 2)
            assert await stream.__anext__() == later

    _in_virtual_time(main)()


def test_parameter_watch_resumes_in_the_middle_of_a_revision() -> None:
    async def main() -> None:
        watcher, writer = _clients(MemoryEngine(), 2)
        params = Parameters(writer, "P")
        for name in "abcd":
            await params.set(name, 1)
        async with Parameters(watcher, "P").watch() as changes:
            deleted_at = await writer.delete_prefix("P/")  # four deletions at one revision
            assert deleted_at
            first = await changes.__anext__()
            watcher.drop_watches()  # the stream breaks after one of the four
            rest = [await changes.__anext__() for _ in range(3)]
            await params.set("e", 5)
            after = await changes.__anext__()
        names = [c.name for c in [first, *rest]]
        assert sorted(names) == ["a", "b", "c", "d"], names  # none lost, none twice
        assert all(c.deleted for c in [first, *rest])
        assert (after.name, after.value) == ("e", 5)

    _in_virtual_time(main)()


def test_parameter_watch_after_compaction_reports_values_and_deletions() -> None:
    async def main() -> None:
        watcher, writer = _clients(MemoryEngine(), 2)
        params = Parameters(writer, "P")
        await params.set("keep", 1)
        await params.set("drop", 1)
        async with Parameters(watcher, "P").watch() as changes:
            await params.set("keep", 2)
            assert (await changes.__anext__()).value == 2
            watcher.partition()
            watcher.drop_watches()
            await params.set("keep", 3)
            await params.set("keep", 4)
            await params.delete("drop")
            await params.set("new", 7)
            await writer.compact(await writer.current_revision())
            watcher.heal()
            got = [await changes.__anext__() for _ in range(3)]
        assert sorted((c.name, c.value, c.deleted) for c in got) == [
            ("drop", None, True),
            ("keep", 4, False),
            ("new", 7, False),
        ]

    _in_virtual_time(main)()


def test_job_state_watch_resumes_and_rereads_after_compaction() -> None:
    async def main() -> None:
        watcher, agent = _clients(MemoryEngine(), 2)
        record = JobStateRecord(agent)
        async with JobStateRecord(watcher).watch() as statuses:
            assert (await statuses.__anext__()).state is JobState.PENDING
            await record.set("running")
            watcher.drop_watches()
            assert (await statuses.__anext__()).state is JobState.RUNNING
            watcher.partition()
            watcher.drop_watches()
            await record.set("pending")
            await record.set("running", "restarted")
            await agent.compact(await agent.current_revision())
            watcher.heal()
            status = await statuses.__anext__()
            assert (status.state, status.reason) == (JobState.RUNNING, "restarted")
            await record.set("succeeded")
            assert (await statuses.__anext__()).state is JobState.SUCCEEDED

    _in_virtual_time(main)()


def test_leader_observer_reports_every_leader_once_across_an_outage() -> None:
    async def main() -> None:
        observer_store, a, b = _clients(MemoryEngine(), 3)
        seen: list[str | None] = []
        first, second = Election(a, "E", config=CONFIG), Election(b, "E", config=CONFIG)
        async with Election(observer_store, "E").observe() as leaders:
            assert await leaders.__anext__() is None
            await first.campaign("a")
            seen.append(_text(await leaders.__anext__()))
            observer_store.partition()
            observer_store.drop_watches()
            async with anyio.create_task_group() as tg:
                tg.start_soon(second.campaign, "b")
                await anyio.sleep(0.1)
                await first.resign()  # b leads while the observer is cut off
            await second.proclaim("b2")
            await anyio.sleep(1)
            observer_store.heal()
            with anyio.fail_after(5):
                while len(seen) < 3:
                    seen.append(_text(await leaders.__anext__()))
            await second.resign()
            seen.append(_text(await leaders.__anext__()))
        assert seen == ["a", "b", "b2", None]

    _in_virtual_time(main)()


def _text(leader: object) -> str | None:
    return None if leader is None else leader.text()  # type: ignore[attr-defined]


# -- over the real HTTP server, restarted on the same port with its data dir -------------------


def test_http_server_restart_while_a_barrier_and_a_lock_wait(tmp_path: Path) -> None:
    config = LeaseConfig(ttl=8, renew_deadline=6, retry_period=0.5)
    running: list[ServerThread] = []

    def serve(port: int = 0) -> ServerThread:
        server = ServerThread(data_dir=str(tmp_path), fsync="never", port=port)
        server.__enter__()
        running.append(server)
        return server

    def stop() -> None:  # graceful: watch streams end, the log is flushed
        running.pop().__exit__()

    async def main() -> None:
        url = serve().url
        port = int(url.rsplit(":", 1)[1])
        # The clients' own watch reconnection gives up after 0.5 s, so the outage below (2 s)
        # reaches the primitives as StoreConnectionError.
        options = {"reconnect_timeout": 0.5, "progress_interval": 0.2}
        async with open_store(url, **options) as waiter, open_store(url, **options) as other:
            holder = store_lock(other, "L", config=config)
            await holder.acquire()
            passed = anyio.Event()
            got_lock = anyio.Event()

            async def barrier_wait(store: Store) -> None:
                await Barrier(store, "B", 2, config=config).wait(timeout=30)
                passed.set()

            async def lock_wait() -> None:
                async with store_lock(waiter, "L", config=config, timeout=30):
                    got_lock.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(barrier_wait, waiter)
                tg.start_soon(lock_wait)
                await anyio.sleep(0.5)
                await anyio.to_thread.run_sync(stop)
                await anyio.sleep(2.0)
                await anyio.to_thread.run_sync(serve, port)  # same port, same data dir
                assert not passed.is_set()
                assert not got_lock.is_set()
                tg.start_soon(barrier_wait, other)
                with anyio.fail_after(15):
                    await passed.wait()
                await holder.release()
                with anyio.fail_after(15):
                    await got_lock.wait()

    try:
        anyio.run(main)
    finally:
        while running:
            stop()
