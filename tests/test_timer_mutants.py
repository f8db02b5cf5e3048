"""Tests that close the gaps mutation testing found in ``aioelastic.timer`` (``scripts/mutants
timer``): each pins a behaviour that a small, realistic bug (a dropped argument, a changed
default, ``or`` for ``and``) changed while every other test still passed.

Virtual time where no real socket is involved; the Unix-socket ones run a real server on a
socket in a temporary directory, in this process (mutmut only runs, for a mutant, the tests that
call the mutated function in-process: a child process's calls are not seen).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import anyio
import pytest
from helpers.events import ListSink
from helpers.waiting import eventually

from aioelastic.errors import (
    StoreConnectionError,
    TimerError,
    TimerExpiredError,
    WriteOutcomeUnknownError,
)
from aioelastic.store import CasResult, KeyValue, MemoryStore, RangeResult, Watch
from aioelastic.testing import FaultInjectingStore, run_virtual, virtual_test
from aioelastic.timer import (
    BlockingUnixTimerClient,
    ExpiredTimer,
    LocalTimerServer,
    SignalReaper,
    StoreTimerClient,
    StoreTimerServer,
    TimerClient,
    TimerRequest,
    TimerServer,
    UnixTimerClient,
    UnixTimerServer,
    expires,
    timer_key,
    unix,
)
from aioelastic.timer._table import Armed, TimerTable
from aioelastic.timer._wire import MAX_ID_LENGTH


@pytest.fixture
def socket_path() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="aetm-", dir="/tmp")  # AF_UNIX paths are short
    try:
        yield os.path.join(directory, "timers.sock")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- the guard -------------------------------------------------------------------------------------


def test_a_bad_guard_scope_is_named_scope_in_its_error() -> None:
    with pytest.raises(TypeError, match=r"^scope must be a str, got int$"):
        expires(after=1, scope=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^scope must not be empty$"):
        expires(after=1, scope="")


class RemoteClient(TimerClient):
    """A remote-style client (not in-process): acquire and release take ``delay`` loop seconds;
    a release raises ``release_error`` if set."""

    def __init__(self, delay: float, release_error: Exception | None = None) -> None:
        self.delay = delay
        self.release_error = release_error
        self.calls: list[str] = []

    async def _acquire(self, scope_id: str, after: float) -> None:
        self.calls.append(f"acquiring {scope_id}")
        await asyncio.sleep(self.delay)
        self.calls.append(f"acquired {scope_id}")

    async def _release(self, scope_id: str) -> None:
        self.calls.append(f"releasing {scope_id}")
        await asyncio.sleep(self.delay)
        if self.release_error is not None:
            raise self.release_error
        self.calls.append(f"released {scope_id}")


@virtual_test
async def test_a_guard_cancelled_while_arming_is_cancelled_even_if_its_release_fails() -> None:
    client = RemoteClient(1, release_error=TimerError("server gone"))
    guard = expires(after=30, scope="s", client=client)
    task = asyncio.ensure_future(guard.acquire())
    await asyncio.sleep(0.5)
    task.cancel()
    # the cancellation is what the caller sees, not the clean-up's failure
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.calls == ["acquiring s", "releasing s"]
    assert guard.state == "released"


@virtual_test
async def test_a_remote_release_is_shielded_from_a_cancel_scope_that_keeps_cancelling() -> None:
    # An anyio cancel scope (a task group's, a move_on_after) re-delivers its cancellation at
    # every await until the scope is left: an unshielded release would be cut short, leaving the
    # timer armed on the server, which would reap a worker whose block had ended.
    client = RemoteClient(1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with anyio.move_on_after(2) as outer:
        async with expires(after=30, scope="s", client=client):
            await asyncio.sleep(60)
    assert outer.cancelled_caught
    assert client.calls == ["acquiring s", "acquired s", "releasing s", "released s"]
    assert loop.time() - started == pytest.approx(3)  # 2 s in the block, then the 1 s release


# -- the local server ------------------------------------------------------------------------------


@virtual_test
async def test_the_local_server_keeps_the_last_1000_reaps_by_default() -> None:
    async with LocalTimerServer(lambda timer: None) as server:
        assert server.reaps.maxlen == 1000
        client = server.client(worker_id="w")
        for i in range(1001):
            await client.acquire(f"s{i}", 0)
        await server.wait_reaped(1001)
        assert len(server.reaps) == 1000
        assert server.reaps[0].timer.scope_id == "s1"  # the oldest one went


# -- the Unix clients ------------------------------------------------------------------------------


def test_the_unix_client_gives_up_connecting_after_its_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def never(*args: object, **kwargs: object) -> None:
        await asyncio.Event().wait()  # a connect that never completes

    monkeypatch.setattr(asyncio, "open_unix_connection", never)

    async def body() -> None:
        loop = asyncio.get_running_loop()
        for client, after in (
            (UnixTimerClient("/x"), 5.0),
            (UnixTimerClient("/x", connect_timeout=2), 2.0),
        ):
            started = loop.time()
            with pytest.raises(TimerError, match=r"^cannot reach the timer server at '/x'"):
                await client.connect()
            assert loop.time() - started == pytest.approx(after)

    async def bounded() -> None:
        async with asyncio.timeout(60):
            await body()

    run_virtual(bounded)


@contextlib.asynccontextmanager
async def _replying(path: str, reply: bytes) -> AsyncIterator[None]:
    """A server that answers every request line with ``reply`` (its id filled in)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while line := await reader.readline():
                request_id = json.loads(line)["id"]
                writer.write(reply.replace(b"ID", str(request_id).encode()) + b"\n")
                await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(handle, path)
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_the_unix_client_refuses_a_reply_line_longer_than_the_line_limit(
    socket_path: str,
) -> None:
    long = b'{"id":ID,"ok":true,"pad":"' + b"x" * unix.MAX_LINE + b'"}'
    async with _replying(socket_path, long):
        client = UnixTimerClient(socket_path)
        with pytest.raises(TimerError, match=r"^lost the timer server"):
            await client.acquire("s", 30)
        assert client._writer is None  # dropped: the rest of that line would be out of step
    short = b'{"id":ID,"ok":true,"pad":"' + b"x" * (unix.MAX_LINE - 100) + b'"}'
    async with _replying(socket_path, short):
        client = UnixTimerClient(socket_path)
        await client.acquire("s", 30)  # a line within the limit is read whole
        await client.aclose()


def test_the_blocking_client_waits_5_seconds_by_default() -> None:
    assert BlockingUnixTimerClient("/x").timeout == 5.0
    assert BlockingUnixTimerClient("/x", timeout=1).timeout == 1.0


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_a_blocking_client_from_another_process_connects_anew_as_this_one(
    socket_path: str,
) -> None:
    # What a forked child sees: a client whose pid and connection are its parent's. Its next
    # request goes on a connection of its own, as its own pid (the server checks the peer's).
    async with UnixTimerServer(socket_path, lambda timer: None) as server:
        client = BlockingUnixTimerClient(socket_path)
        await asyncio.to_thread(client.acquire, "parent", 30)
        parents = client._sock
        client.pid = os.getpid() + 100_000  # created "before the fork", in another process
        await asyncio.to_thread(client.acquire, "child", 30)
        assert client.pid == os.getpid()
        assert client._sock is not None
        assert client._sock is not parents
        assert server.deadline_of(os.getpid(), "child") is not None
        assert server.statistics().rejected == 0
        await asyncio.to_thread(client.release, "child")
        await asyncio.to_thread(client.release, "parent")
        assert server.armed == 0
        client.close()
        assert parents is not None
        parents.close()


@virtual_test
async def test_a_wait_for_reaps_that_times_out_leaves_no_waiter_behind() -> None:
    async with LocalTimerServer(lambda timer: None) as server:
        for _ in range(2):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(1):
                    await server.wait_reaped()
        assert server._reap_waiters == []  # each waiter went with its wait
        await server.client(worker_id="w").acquire("s", 0)
        assert [event.timer.scope_id for event in await server.wait_reaped()] == ["s"]


# -- timers through a store ------------------------------------------------------------------------


class ScriptedStore(MemoryStore):
    """A memory store that records when the prefix is read and the watches it opens, fails the
    next ``failing`` reads, and runs ``after_read`` once after the next read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[float] = []
        self.watches: list[Watch] = []
        self.failing = 0
        self.after_read: Callable[[], Awaitable[object]] | None = None

    async def _range(self, prefix: str, limit: int | None) -> RangeResult:
        self.reads.append(asyncio.get_running_loop().time())
        if self.failing:
            self.failing -= 1
            raise StoreConnectionError("injected")
        result = await super()._range(prefix, limit)
        after, self.after_read = self.after_read, None
        if after is not None:
            await after()
        return result

    def _watch(self, prefix: str, start_revision: int | None) -> Watch:
        watch = super()._watch(prefix, start_revision)
        self.watches.append(watch)
        return watch


def test_store_timer_arguments_get_errors_naming_what_was_given() -> None:
    store = MemoryStore()

    def reaper(timer: ExpiredTimer) -> None:
        pass

    for make in (
        lambda prefix: StoreTimerServer(store, reaper, prefix=prefix),
        lambda prefix: StoreTimerClient(store, "w", prefix=prefix),
    ):
        with pytest.raises(TypeError, match=r"^prefix must be a str, got int$"):
            make(3)
        with pytest.raises(ValueError, match=r"^prefix must not be empty \(timers need a key"):
            make("")
    with pytest.raises(TypeError, match=r"^store must be a Store, got str$"):
        StoreTimerServer("memory://", reaper)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^store must be a Store, got str$"):
        StoreTimerClient("memory://", "w")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^worker_id must be a str, got int$"):
        StoreTimerClient(store, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^retry_interval must be a number of seconds, got str$"):
        StoreTimerServer(store, reaper, retry_interval="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^retry_interval must be a finite number of seconds"):
        StoreTimerServer(store, reaper, retry_interval=-1)
    with pytest.raises(ValueError, match=r"^signal must be a signal number in 1\.\."):
        StoreTimerClient(store, "w", signal=0)


@virtual_test
async def test_a_store_timer_reaches_the_reaper_and_the_event_sink_whole() -> None:
    reaps: list[ExpiredTimer] = []
    sink = ListSink()
    async with MemoryStore() as store:
        server = StoreTimerServer(store, reaps.append, prefix="t/", event_sink=sink, history=2)
        assert StoreTimerServer(store, reaps.append).reaps.maxlen == 1000
        async with server:
            assert server.reaps.maxlen == 2
            client = StoreTimerClient(store, "w", prefix="t/", pid=1234, signal=signal.SIGTERM)
            before = time.time()
            await client.acquire("s", 1)
            await server.wait_reaped()
    (timer,) = reaps
    assert (timer.worker_id, timer.scope_id, timer.pid) == ("w", "s", 1234)
    assert timer.signal == signal.SIGTERM
    assert timer.expiration_time is not None
    assert before + 1 <= timer.expiration_time <= time.time() + 1
    (event,) = sink.events
    assert event.kind == "timer.reaped"
    assert (event.fields["worker"], event.fields["scope"], event.fields["pid"]) == ("w", "s", 1234)


@virtual_test
async def test_a_timer_put_between_the_servers_read_and_its_watch_is_seen() -> None:
    reaps: list[ExpiredTimer] = []
    async with ScriptedStore() as store:
        client = StoreTimerClient(store, "w", prefix="t/")
        store.after_read = lambda: client.acquire("s", 1)  # after the read, before the watch
        async with StoreTimerServer(store, reaps.append, prefix="t/") as server:
            await server.wait_reaped()
    assert [timer.scope_id for timer in reaps] == ["s"]


@virtual_test
async def test_a_lost_store_is_read_again_with_a_doubling_backoff_up_to_5_seconds() -> None:
    loop = asyncio.get_running_loop()
    store = ScriptedStore()
    async with store, StoreTimerServer(store, lambda timer: None, prefix="t/") as server:
        # the watch is lost and the next 8 reads fail: waits of 0.1 s, doubling, at most 5 s
        store.failing = 8
        lost = loop.time()
        store.engine.fail_watchers_of(store, StoreConnectionError("injected"))
        await asyncio.sleep(30)
        waits = [round(b - a, 6) for a, b in itertools.pairwise([lost, *store.reads[1:]])]
        assert waits == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
        assert len(store.watches) == 2  # watching again
        # a watch that ends (closed under the server) is read again after 0.1 s; a read that
        # then fails waits twice that, and so on
        store.reads.clear()
        store.failing = 2
        ended = loop.time()
        await store.watches[-1].aclose()
        await asyncio.sleep(30)
        waits = [round(b - a, 6) for a, b in itertools.pairwise([ended, *store.reads])]
        assert waits == [0.1, 0.2, 0.4]
        assert len(store.watches) == 3
        assert server.running


@virtual_test
async def test_a_store_timer_key_overwritten_with_a_release_or_garbage_is_disarmed() -> None:
    reaps: list[ExpiredTimer] = []
    store = MemoryStore()
    async with store, StoreTimerServer(store, reaps.append, prefix="t/") as server:
        client = StoreTimerClient(store, "w", prefix="t/")
        await client.acquire("released", 1)
        await client.acquire("garbage", 1)
        await store.put(client.key("released"), TimerRequest("w", "released", None).to_json())
        await store.put(client.key("garbage"), b"not a timer")
        await asyncio.sleep(0)
        assert server.armed == 0
        await asyncio.sleep(5)
    assert reaps == []


@virtual_test
async def test_a_timer_unchanged_across_a_lost_watch_is_not_armed_again() -> None:
    reaps: list[ExpiredTimer] = []
    store = MemoryStore()
    async with store, StoreTimerServer(store, reaps.append, prefix="t/") as server:
        client = StoreTimerClient(store, "w", prefix="t/")
        await client.acquire("kept", 10)
        await client.acquire("moved", 10)
        await asyncio.sleep(0.01)  # the server sees both
        kept = server.deadline_of("w", "kept")
        store.engine.fail_watchers_of(store, StoreConnectionError("injected"))
        await client.acquire("moved", 20)  # while the server is cut off
        await asyncio.sleep(1)  # it reads the store again
        assert server.deadline_of("w", "kept") == kept
        assert server.statistics().acquired == 3  # kept once, moved twice
        moved = server.deadline_of("w", "moved")
        assert moved is not None
        assert kept is not None
        assert moved > kept + 9  # the later arming, 20 s from its acquire
        await asyncio.sleep(30)
    assert sorted(timer.scope_id for timer in reaps) == ["kept", "moved"]


def _lose_the_answer(store: FaultInjectingStore, apply: bool) -> None:
    """The next claim's answer is lost (WriteOutcomeUnknownError); it was applied if ``apply``."""
    original = store.inner._compare_and_delete

    async def lost(key: str, expected_mod_revision: int) -> CasResult:
        store.inner._compare_and_delete = original  # type: ignore[method-assign]
        if apply:
            await original(key, expected_mod_revision)
        raise WriteOutcomeUnknownError("injected: the answer was lost")

    store.inner._compare_and_delete = lost  # type: ignore[method-assign]


@virtual_test
async def test_a_claim_whose_answer_was_lost_reaps_iff_the_timer_is_gone() -> None:
    reaps: list[ExpiredTimer] = []
    async with MemoryStore() as inner:
        faulty = FaultInjectingStore(inner)
        async with StoreTimerServer(faulty, reaps.append, prefix="t/") as server:
            client = StoreTimerClient(inner, "w", prefix="t/")
            _lose_the_answer(faulty, apply=True)  # the delete applied: the timer is gone
            await client.acquire("applied", 1)
            await server.wait_reaped()
            assert await inner.get(client.key("applied")) is None
            # the delete did not apply, and the worker re-armed before the read-back: no reap
            _lose_the_answer(faulty, apply=False)

            async def rearm() -> None:
                await client.acquire("rearmed", 60)

            original_get = inner._get

            async def get(key: str) -> KeyValue | None:
                inner._get = original_get  # type: ignore[method-assign]
                await rearm()
                return await original_get(key)

            inner._get = get  # type: ignore[method-assign]
            await client.acquire("rearmed", 1)
            await asyncio.sleep(5)
            assert [timer.scope_id for timer in reaps] == ["applied"]
            assert server.deadline_of("w", "rearmed") is not None  # the new arming stands


@virtual_test
async def test_timer_keys_quote_a_slash_so_two_timers_never_share_a_key() -> None:
    assert timer_key("t/", "a/b", "c") == "t/a%2Fb/c"
    assert timer_key("t/", "a", "b/c") == "t/a/b%2Fc"
    reaps: list[ExpiredTimer] = []
    store = MemoryStore()
    async with store, StoreTimerServer(store, reaps.append, prefix="t/") as server:
        await StoreTimerClient(store, "a/b", prefix="t/").acquire("c", 1)
        await StoreTimerClient(store, "a", prefix="t/").acquire("b/c", 1)
        await server.wait_reaped(2)
    assert sorted((timer.worker_id, timer.scope_id) for timer in reaps) == [
        ("a", "b/c"),
        ("a/b", "c"),
    ]


def test_a_malformed_store_timer_is_logged_with_its_key_and_what_is_wrong(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        store = MemoryStore()
        async with store, StoreTimerServer(store, lambda timer: None, prefix="t/") as server:
            await store.put("t/w/garbage", b"not a timer")
            await store.put("t/5/s", TimerRequest(5, "s", time.time() + 60).to_json())
            await store.put("t/w/other", TimerRequest("w", "s", time.time() + 60).to_json())
            await asyncio.sleep(0.1)
            assert server.statistics().rejected == 3
            assert server.armed == 0

    caplog.set_level(logging.WARNING, "aioelastic.timer")
    run_virtual(body)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rejected")]
    assert lines[0].startswith("rejected timer request at 't/w/garbage': ")
    assert lines[1:] == [
        "rejected timer request at 't/5/s': worker must be a str",
        "rejected timer request at 't/w/other': the key does not match its worker and scope "
        "('t/w/s')",
    ]


@virtual_test
async def test_a_claim_that_cannot_reach_the_store_is_retried_with_a_doubling_backoff() -> None:
    loop = asyncio.get_running_loop()
    reaped_at: list[float] = []
    async with MemoryStore() as inner:
        faulty = FaultInjectingStore(inner)
        async with StoreTimerServer(faulty, lambda t: reaped_at.append(loop.time()), prefix="t/"):
            for _ in range(3):
                faulty.fail_next("compare_and_delete", StoreConnectionError("injected"))
            started = loop.time()
            await StoreTimerClient(inner, "w", prefix="t/").acquire("s", 1)
            await asyncio.sleep(10)
    assert len(reaped_at) == 1
    assert reaped_at[0] - started == pytest.approx(1 + 0.1 + 0.2 + 0.4, abs=0.01)


# -- reaps: what the reaper, the history and the event sink get ------------------------------------


def test_duration_and_protected_pid_errors_name_the_argument() -> None:
    with pytest.raises(TypeError, match=r"^after must be a number of seconds, got str$"):
        expires(after="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^after must be a finite number of seconds >= 0"):
        expires(after=-1)
    with pytest.raises(ValueError, match=r"^protect\[\] must be a process id > 0, got 0$"):
        SignalReaper(protect=[0])


class Worker:
    """A worker id that is neither a str nor an int."""

    def __repr__(self) -> str:
        return "<worker 1>"


@virtual_test
async def test_every_reap_is_recorded_and_emitted_with_its_whole_timer() -> None:
    loop = asyncio.get_running_loop()
    sink = ListSink()

    def failing(timer: ExpiredTimer) -> None:
        raise RuntimeError("no")

    async with LocalTimerServer(failing, event_sink=sink) as server:
        task_worker = Worker()
        deadline = loop.time() + 1.5
        server.submit(TimerRequest("w", "s", time.time() + 1.5, pid=77))
        await server.client(worker_id=task_worker).acquire("t", 2)
        await server.wait_reaped(2)
        assert server.statistics().reaper_failures == 2
        first, second = server.reaps
    assert first.timer.deadline == pytest.approx(deadline, abs=0.01)
    assert first.reaped_at == pytest.approx(deadline, abs=0.01)
    assert second.reaped_at == pytest.approx(loop.time(), abs=0.01)
    assert first.error == second.error == "RuntimeError: no"
    assert [event.kind for event in sink.events] == ["timer.reaped", "timer.reaped"]
    fields = dict(sink.events[0].fields)
    expiration = fields.pop("expiration_time")
    assert isinstance(expiration, float)
    lateness = fields.pop("lateness")
    assert lateness == round(lateness, 6)
    assert abs(lateness) < 0.01
    assert fields == {
        "server": "LocalTimerServer",
        "worker": "w",
        "scope": "s",
        "pid": 77,
        "error": "RuntimeError: no",
    }
    assert sink.events[1].fields["worker"] == "<worker 1>"  # not a str or int: its repr
    assert sink.events[1].fields["pid"] is None


def test_async_reapers_leave_no_task_behind_and_a_failing_one_names_its_timer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        async def reaper(timer: ExpiredTimer) -> None:
            await asyncio.sleep(0.1)
            if timer.scope_id == "bad":
                raise RuntimeError("no")

        async with LocalTimerServer(reaper) as server:
            client = server.client(worker_id="w")
            await client.acquire("good", 1)
            await client.acquire("bad", 1)
            await server.wait_reaped(2)
            await asyncio.sleep(1)
            assert server._children == set()
            assert server.statistics().reaper_failures == 1

    caplog.set_level(logging.DEBUG)
    run_virtual(body)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert errors[0].getMessage().startswith("reaper ")
    assert errors[0].getMessage().endswith(" failed for worker w scope 'bad'")


def test_a_claim_task_that_fails_is_logged_by_name(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        async with MemoryStore() as inner:
            faulty = FaultInjectingStore(inner)
            faulty.fail_next("compare_and_delete", RuntimeError("boom"))
            async with StoreTimerServer(faulty, lambda timer: None, prefix="t/") as server:
                await StoreTimerClient(inner, "w", prefix="t/").acquire("s", 1)
                await asyncio.sleep(3)
                assert server._children == set()
                assert server.reaps == deque()  # not claimed: not reaped

    caplog.set_level(logging.DEBUG)
    run_virtual(body)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["timer server task aioelastic-timer-claim failed"]


# -- the Unix server, in this process --------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_a_unix_timer_carries_its_workers_pid_and_is_reaped_while_the_worker_lives(
    socket_path: str,
) -> None:
    # the worker is this very process: the reaper is a list, and the probe at the deadline
    # (is the worker still there?) must not signal it
    reaps: list[ExpiredTimer] = []
    server = UnixTimerServer(socket_path, reaps.append)
    async with server, UnixTimerClient(socket_path) as client:
        await client.acquire("s", 0.05)
        await server.wait_reaped()
    (timer,) = reaps
    assert (timer.worker_id, timer.pid, timer.scope_id) == (os.getpid(), os.getpid(), "s")


async def _request(path: str, line: bytes) -> dict[str, object]:
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        writer.write(line + b"\n")
        await writer.drain()
        reply = json.loads(await reader.readline())
        assert isinstance(reply, dict)
        return reply
    finally:
        writer.close()


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_the_unix_server_says_what_was_wrong_with_a_request(
    socket_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with UnixTimerServer(socket_path, lambda timer: None):
        request = TimerRequest(os.getpid(), "s", time.time() + 60).to_dict()
        reply = await _request(socket_path, json.dumps({**request, "id": "one"}).encode())
        assert reply == {"id": None, "error": "'id' must be an int"}

        def gone(pid: int) -> int:
            raise ProcessLookupError(pid)

        monkeypatch.setattr(os, "pidfd_open", gone, raising=False)
        reply = await _request(socket_path, json.dumps({**request, "id": 2}).encode())
        assert reply == {"id": 2, "error": "the worker process has exited"}


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_a_timer_of_a_worker_gone_at_its_deadline_is_dropped_quietly(
    socket_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()  # a pid that no longer exists
    reaps: list[ExpiredTimer] = []
    loop = asyncio.get_running_loop()
    async with UnixTimerServer(socket_path, reaps.append) as server:
        server._arm(proc.pid, "s", loop.time() + 0.05, pid=proc.pid)
        await asyncio.sleep(0.3)
        assert server.armed == 0
        assert server.statistics().dropped == 1
    assert reaps == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


@virtual_test
async def test_a_late_reap_emits_its_lateness_to_the_microsecond() -> None:
    sink = ListSink()
    loop = asyncio.get_running_loop()
    async with LocalTimerServer(lambda timer: None, event_sink=sink) as server:
        server._arm("w", "s", loop.time() - 1.2345678)  # already past its deadline
        (event,) = await server.wait_reaped()
    assert event.lateness == pytest.approx(1.2345678)
    assert sink.events[0].fields["lateness"] == 1.234568


def _pidfds() -> int:
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if _link(fd) == "anon_inode:[pidfd]")


def _link(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # closed since the listing
        return ""


@pytest.mark.asyncio
@pytest.mark.timeout(30)
@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds here")
async def test_a_worker_is_watched_once_however_many_timers_it_arms(socket_path: str) -> None:
    before = _pidfds()
    server = UnixTimerServer(socket_path, lambda timer: None)
    async with server, UnixTimerClient(socket_path) as client:
        await client.acquire("a", 30)
        await client.acquire("b", 30)
        await client.acquire("a", 30)
        assert list(server._pidfds) == [os.getpid()]
        assert _pidfds() == before + 1
    assert _pidfds() == before


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_a_closed_connection_leaves_nothing_behind_in_the_server(socket_path: str) -> None:
    async with UnixTimerServer(socket_path, lambda timer: None) as server:
        for _ in range(3):
            async with UnixTimerClient(socket_path) as client:
                await client.acquire("a", 30)
                await client.release("a")
            await eventually(lambda: not server._handlers, 20, "the connection's handler ended")
            assert server._writers == set()


@virtual_test
async def test_a_scope_id_may_be_1024_characters_long_and_no_longer() -> None:
    async with LocalTimerServer(lambda timer: None) as server:
        client = server.client(worker_id="w")
        await client.acquire("s" * 1024, 30)
        with pytest.raises(ValueError, match=r"^scope_id is longer than 1024 characters$"):
            await client.acquire("s" * 1025, 30)
        with pytest.raises(TypeError, match=r"^scope_id must be a str, got int$"):
            await client.acquire(5, 30)  # type: ignore[arg-type]


@virtual_test
async def test_released_and_reaped_timers_leave_nothing_in_the_table() -> None:
    async with LocalTimerServer(lambda timer: None) as server:
        client = server.client(worker_id="w")
        await client.acquire("released", 30)
        await client.acquire("reaped", 1)
        await client.release("released")
        await server.wait_reaped()
        assert server.armed == 0
        assert server._timers._by_worker == {}


def test_the_unix_server_keeps_its_history_and_event_sink(socket_path: str) -> None:
    sink = ListSink()
    assert UnixTimerServer(socket_path).reaps.maxlen == 1000
    server = UnixTimerServer(socket_path, history=3, event_sink=sink)
    assert server.reaps.maxlen == 3
    assert server.event_sink is sink


@pytest.mark.asyncio
@pytest.mark.timeout(30)
@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds here")
async def test_closing_the_unix_server_takes_its_pidfds_off_the_loop(socket_path: str) -> None:
    loop = asyncio.get_running_loop()
    server = UnixTimerServer(socket_path, lambda timer: None)
    async with server, UnixTimerClient(socket_path) as client:
        await client.acquire("a", 30)
        fds = list(server._pidfds.values())
        assert len(fds) == 1
    # a closed fd left registered would be watched under its number when it is reused
    assert [loop.remove_reader(fd) for fd in fds] == [False]


# -- the guard's deadline --------------------------------------------------------------------------


@virtual_test
async def test_a_block_cut_at_its_deadline_raises_even_if_it_released_its_guard_first() -> None:
    # release() takes the timer off the server, but the block keeps its local deadline: cut
    # there, it must not leave as if it had run to its end (it did, silently, before)
    reached_end = False
    async with LocalTimerServer(lambda timer: None) as server:
        guard = expires(after=1, scope="s", client=server.client(worker_id="w"))

        async def block() -> None:
            nonlocal reached_end
            async with guard:
                await guard.release()
                await asyncio.sleep(2)
                reached_end = True

        with pytest.raises(TimerExpiredError, match=r"^timer of scope 's' expired"):
            await block()
        assert not reached_end
        assert guard.state == "released"
        assert server.reaps == deque()  # released in time: the server reaps nobody


# -- the request record ----------------------------------------------------------------------------


def test_timer_request_errors_say_what_was_given() -> None:
    with pytest.raises(TypeError, match=r"^worker_id must be an int or a str, got float$"):
        TimerRequest(1.5, "s", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^worker_id must not be empty$"):
        TimerRequest("", "s", None)
    assert TimerRequest("w" * MAX_ID_LENGTH, "s", None).worker_id == "w" * MAX_ID_LENGTH
    too_long = rf"^worker_id is longer than {MAX_ID_LENGTH} characters$"
    with pytest.raises(ValueError, match=too_long):
        TimerRequest("w" * (MAX_ID_LENGTH + 1), "s", None)
    bad_type = r"^expiration_time must be seconds since the epoch or None, got str$"
    with pytest.raises(TypeError, match=bad_type):
        TimerRequest("w", "s", "soon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^a timer request must be a JSON object, got list$"):
        TimerRequest.from_dict([1])


def test_an_expiration_at_or_just_after_the_epoch_arms_and_only_a_negative_one_releases() -> None:
    # 0 and 0.5 are long past: such a timer is reaped at once, never taken for a release
    assert TimerRequest("w", "s", 0).expiration_time == 0
    assert TimerRequest("w", "s", 0.5).expiration_time == 0.5
    wire = {"v": 1, "worker": "w", "scope": "s"}
    assert TimerRequest.from_dict({**wire, "expiration": 0}).expiration_time == 0
    assert TimerRequest.from_dict({**wire, "expiration": 0.5}).expiration_time == 0.5
    assert TimerRequest.from_dict({**wire, "expiration": -1}).is_release


# -- the server engine and its lifecycle -----------------------------------------------------------


class _Transport(TimerServer):
    """A transport of the tests' own: ``script`` says what its background task does."""

    def __init__(self, script: str) -> None:
        super().__init__(lambda timer: None)  # TimerServer's own defaults
        self.script = script

    async def _run(self, ready: Callable[[], None]) -> None:
        if self.script == "stops before ready":
            return
        ready()
        if self.script == "ready twice":
            ready()  # e.g. on every reconnect: the second call changes nothing
        if self.script != "stops after ready":
            await asyncio.Event().wait()


def test_timer_server_arguments_get_errors_naming_what_was_given() -> None:
    assert _Transport("runs").reaps.maxlen == 1000
    with pytest.raises(TypeError, match=r"^reaper must be callable, got str$"):
        LocalTimerServer("kill")  # type: ignore[arg-type]
    for history in (1.5, "3", -1, True):
        with pytest.raises(ValueError, match=rf"^history must be an int >= 0, got {history!r}$"):
            LocalTimerServer(history=history)  # type: ignore[arg-type]


@virtual_test
async def test_a_server_with_no_history_still_reaps_and_records_none() -> None:
    async with LocalTimerServer(lambda timer: None, history=0) as server:
        await server.client(worker_id="w").acquire("s", 1)
        assert await server.wait_reaped() == []
        assert server.statistics().reaped == 1


_who = contextvars.ContextVar("_who", default="nobody")


@virtual_test
async def test_a_deadline_runs_in_the_servers_context_not_the_acquiring_workers() -> None:
    seen: list[str] = []
    async with LocalTimerServer(lambda timer: seen.append(_who.get())) as server:

        async def worker() -> None:
            _who.set("worker")
            await server.client(worker_id="w").acquire("s", 1)

        await asyncio.create_task(worker())
        await server.wait_reaped()
    assert seen == ["nobody"]


@virtual_test
async def test_the_lifecycle_errors_name_the_server() -> None:
    server = LocalTimerServer(lambda timer: None)
    client = server.client(worker_id="w")
    not_running = r"^LocalTimerServer is not running \(use `async with server:`\)$"
    with pytest.raises(TimerError, match=not_running):
        await client.acquire("s", 1)
    async with server:
        names = {task.get_name() for task in asyncio.all_tasks()}
        assert "aioelastic-LocalTimerServer" in names  # findable in a dump of the tasks
        with pytest.raises(RuntimeError, match=r"^LocalTimerServer has already been started$"):
            await server.start()
    with pytest.raises(TimerError, match=r"^LocalTimerServer is closed$"):
        await client.acquire("s", 1)
    with pytest.raises(RuntimeError, match=r"^LocalTimerServer is closed$"):
        await server.start()


@virtual_test
async def test_a_server_that_stops_while_starting_says_so_and_stays_closed() -> None:
    server = _Transport("stops before ready")
    with pytest.raises(TimerError, match=r"^_Transport stopped while starting$"):
        await server.start()
    with pytest.raises(RuntimeError, match=r"^_Transport is closed$"):
        await server.start()


@virtual_test
async def test_a_server_whose_task_ended_arms_no_more_timers() -> None:
    server = _Transport("stops after ready")
    await server.start()
    await asyncio.sleep(0)  # its task returns
    assert not server.running
    with pytest.raises(TimerError, match=r"^_Transport is not running"):
        server._arm("w", "s", 1.0)
    await server.aclose()


@virtual_test
async def test_a_transport_may_say_ready_more_than_once() -> None:
    async with _Transport("ready twice") as server:
        await asyncio.sleep(0)
        assert server.running
        server._arm("w", "s", 30.0)
        assert server.armed == 1


def test_closing_the_server_cancels_an_async_reaper_still_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = asyncio.Event()
    outcome: list[str] = []

    async def reaper(timer: ExpiredTimer) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    async def body() -> None:
        async with LocalTimerServer(reaper) as server:
            await server.client(worker_id="w").acquire("s", 1)
            await started.wait()

    run_virtual(body)
    assert outcome == ["cancelled"]
    # and the server's task ended cancelled, waiting for the reaper, not by an error
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@virtual_test
async def test_re_arming_or_clearing_the_table_cancels_the_deadlines_it_drops() -> None:
    # a deadline left scheduled holds its timer (and the worker: a task, for in-process timers)
    # in the loop until it would have fired: an hour, for each re-arming of an hour's timer
    loop = asyncio.get_running_loop()

    def armed(scope: str, deadline: float | None) -> tuple[Armed, asyncio.TimerHandle | None]:
        timer = Armed("w", scope, deadline or 0.0, None, None, None, None)
        if deadline is not None:
            timer.handle = loop.call_at(deadline, lambda: None)
        return timer, timer.handle

    table = TimerTable()
    first, first_handle = armed("s", 3600)
    table.put(first)
    second, second_handle = armed("s", 3600)
    table.put(second)
    assert first_handle is not None
    assert first_handle.cancelled()
    assert second_handle is not None
    assert not second_handle.cancelled()
    other, other_handle = armed("t", 3600)
    table.put(other)
    fired, _ = armed("u", None)  # its deadline already ran: no handle
    table.put(fired)
    table.clear()
    assert second_handle.cancelled()
    assert other_handle is not None
    assert other_handle.cancelled()
    assert len(table) == 0


# -- the Unix server: peers and closing ----------------------------------------------------------


class _PeerSocket:
    """What ``SO_PEERCRED`` reports for a peer whose pid is ``pid`` here."""

    def __init__(self, pid: int) -> None:
        self.creds = struct.pack("3i", pid, 1000, 1000)

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        assert (level, option, size) == (socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        return self.creds


class _PeerWriter:
    def __init__(self, pid: int) -> None:
        self.sock = _PeerSocket(pid)

    def get_extra_info(self, name: str) -> object:
        return self.sock if name == "socket" else None


@pytest.mark.skipif(not hasattr(socket, "SO_PEERCRED"), reason="no SO_PEERCRED here")
def test_a_peer_in_another_pid_namespace_has_no_pid_and_pid_1_is_a_pid() -> None:
    # the kernel reports pid 0 for a peer not visible in this pid namespace: no pid to check
    # requests against (or to signal: kill(0) would signal this process's own group)
    assert unix._peer_pid(_PeerWriter(0)) is None  # type: ignore[arg-type]
    assert unix._peer_pid(_PeerWriter(1)) == 1  # type: ignore[arg-type]  # a container's init
    assert unix._peer_pid(_PeerWriter(4242)) == 4242  # type: ignore[arg-type]


def test_closing_the_unix_server_cancels_a_handler_stuck_on_a_client_that_does_not_read(
    socket_path: str,
) -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        server = UnixTimerServer(socket_path, lambda timer: None)
        await server.start()
        _reader, writer = await asyncio.open_unix_connection(socket_path)
        # error replies the client never reads: once they fill the socket, the handler waits
        # for the client forever, and closing its connection cannot end it
        writer.write(b"{}\n" * 100_000)

        def stuck() -> bool:
            return any(w.transport.get_write_buffer_size() > 0 for w in server._writers)

        await eventually(stuck, 60, "the server's replies back up")
        started = loop.time()
        async with asyncio.timeout(60):
            await server.aclose()
        assert loop.time() - started == pytest.approx(1.0)  # the stragglers' grace, then cancel
        assert server._handlers == set()
        directory, name = os.path.split(socket_path)
        assert name not in os.listdir(directory)  # the socket file removed
        writer.close()

    run_virtual(body)


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_a_unix_server_whose_socket_file_was_removed_closes_cleanly(
    socket_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with UnixTimerServer(socket_path, lambda timer: None):
        os.unlink(socket_path)  # e.g. a clean-up of /tmp
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


_SEND_CONNECTION = """
import socket, sys
parent = socket.socket(fileno=int(sys.argv[2]))
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect(sys.argv[1])
socket.send_fds(parent, [b"c"], [conn.fileno()])
conn.close()  # the test's copy is the connection now
if sys.argv[3] == "stay":
    sys.stdin.read()  # until the test closes our stdin
"""


async def _handed_over(
    path: str, stay: bool
) -> tuple[asyncio.subprocess.Process, asyncio.StreamReader, asyncio.StreamWriter]:
    """A worker process connects to the server at ``path`` and hands its connection over to
    this process (the server knows it by the worker's pid); it exits then, or, if ``stay``,
    once its stdin is closed."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _SEND_CONNECTION,
            path,
            str(theirs.fileno()),
            "stay" if stay else "go",
            pass_fds=[theirs.fileno()],
            stdin=asyncio.subprocess.PIPE,
        )
        _data, fds, _flags, _address = await asyncio.to_thread(socket.recv_fds, ours, 1, 1)
    reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=fds[0]))
    request = TimerRequest(proc.pid, "s", time.time() + 600).to_dict()
    writer.write(json.dumps({**request, "id": 1}).encode() + b"\n")
    assert json.loads(await reader.readline()) == {"id": 1, "ok": True}
    return proc, reader, writer


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_without_pidfds_a_live_worker_whose_connection_closes_is_left_alone(
    socket_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unix, "_HAVE_PIDFD", False)  # an old kernel, or not Linux
    async with UnixTimerServer(socket_path, lambda timer: None) as server:
        proc, _reader, writer = await _handed_over(socket_path, stay=True)
        writer.close()
        await eventually(lambda: not server._handlers, 30, "the connection's handler ended")
        assert server.armed == 1  # alive: its timer stays armed
        assert proc.stdin is not None
        proc.stdin.close()
        assert await proc.wait() == 0  # and the check did not signal it


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_without_pidfds_a_worker_gone_when_its_connection_closes_loses_its_timers(
    socket_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unix, "_HAVE_PIDFD", False)  # an old kernel, or not Linux
    async with UnixTimerServer(socket_path, lambda timer: None) as server:
        proc, _reader, writer = await _handed_over(socket_path, stay=False)
        assert await proc.wait() == 0  # the worker is gone; its connection lives on here
        assert server.armed == 1
        writer.close()
        # without a pidfd the server checks the worker when its connection closes
        await eventually(lambda: server.armed == 0, 30, "the gone worker's timer dropped")
        assert server.statistics().dropped == 1
