"""In-process timers: the guard, the local server and client, reapers, bad input; virtual time."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import signal
import time
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio

import aioelastic
from aioelastic import timer as timer_pkg
from aioelastic.errors import TimeoutException, TimerError, TimerExpiredError
from aioelastic.testing import run_virtual, virtual_test
from aioelastic.timer import (
    CallbackReaper,
    CancelTaskReaper,
    ExpiredTimer,
    LocalTimerClient,
    LocalTimerServer,
    SignalReaper,
    TimerClient,
    TimerGuard,
    TimerRequest,
    configure,
    expires,
    get_client,
)
from aioelastic.timer import api as timer_api

virtual = virtual_test  # every async test body here runs in virtual time


class Recorder:
    """A callback reaper that records every expired timer with the loop time it was reaped."""

    def __init__(self) -> None:
        self.timers: list[ExpiredTimer] = []
        self.times: list[float] = []

    def __call__(self, timer: ExpiredTimer) -> None:
        self.timers.append(timer)
        self.times.append(asyncio.get_running_loop().time())


def test_public_names_are_exported() -> None:
    for name in timer_pkg.__all__:
        assert hasattr(timer_pkg, name), name
    public = {
        name
        for module in (timer_api, timer_pkg.local, timer_pkg.unix, timer_pkg.store)
        for name in module.__all__
    }
    assert public - {"DEFAULT_PREFIX"} <= set(timer_pkg.__all__)
    assert TimeoutException is TimerExpiredError
    assert issubclass(TimerExpiredError, TimeoutError)
    assert issubclass(TimerExpiredError, aioelastic.TimerError)


@virtual
async def test_block_in_time_releases_and_is_not_reaped() -> None:
    reaps = Recorder()
    async with LocalTimerServer(reaps) as server:
        client = server.client()
        async with expires(after=5, scope="work", client=client) as guard:
            assert server.armed == 1
            await asyncio.sleep(4)
            assert 0.9 < guard.remaining <= 1.0
        assert guard.state == "released"
        assert server.armed == 0
        await asyncio.sleep(10)
    assert reaps.timers == []
    assert server.statistics().released == 1


@virtual
async def test_overrun_interrupts_block_and_server_reaps_once_at_deadline() -> None:
    reaps = Recorder()
    loop = asyncio.get_running_loop()
    async with LocalTimerServer(reaps) as server:
        client = server.client(worker_id="w1")
        start = loop.time()
        with pytest.raises(TimerExpiredError, match="'slow'"):
            async with expires(after=2, scope="slow", client=client) as guard:
                await asyncio.sleep(60)
        assert loop.time() - start == pytest.approx(2, abs=1e-6)
        assert guard.expired
        assert guard.remaining == 0
        await asyncio.sleep(10)
        assert server.armed == 0
        events = list(server.reaps)
    assert [(t.worker_id, t.scope_id) for t in reaps.timers] == [("w1", "slow")]
    assert reaps.times[0] == pytest.approx(start + 2, abs=1e-6)
    assert len(events) == 1
    assert events[0].lateness == pytest.approx(0, abs=1e-6)


@virtual
async def test_cancel_task_reaper_cancels_a_worker_that_hangs() -> None:
    async with LocalTimerServer() as server:  # default reaper: CancelTaskReaper
        client = server.client()
        reached_end = False

        async def worker() -> None:
            nonlocal reached_end
            await client.acquire("step", 3)
            await asyncio.Event().wait()  # hangs
            reached_end = True

        task = asyncio.create_task(worker())
        await asyncio.sleep(2.9)
        assert not task.done()
        await asyncio.sleep(0.2)
        assert task.cancelled()
        assert not reached_end
        (event,) = server.reaps
        assert event.timer.worker_id is task
        assert event.timer.scope_id == "step"


@virtual
async def test_cancel_stops_the_timer_without_reaping() -> None:
    reaps = Recorder()
    async with LocalTimerServer(reaps) as server:
        async with expires(after=1, scope="s", client=server.client()) as guard:
            await guard.cancel()
            assert guard.state == "cancelled"
            assert server.armed == 0
            await asyncio.sleep(5)  # runs on past the old deadline, uninterrupted
        assert guard.state == "cancelled"
    assert reaps.timers == []


@virtual
async def test_outside_cancellation_releases_in_finally() -> None:
    reaps = Recorder()
    async with LocalTimerServer(reaps) as server:
        client = server.client()

        async def worker() -> None:
            async with expires(after=5, scope="s", client=client):
                await asyncio.sleep(60)

        task = asyncio.create_task(worker())
        await asyncio.sleep(1)
        assert server.armed == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert server.armed == 0
        await asyncio.sleep(10)
    assert reaps.timers == []


@virtual
async def test_exception_in_block_releases_and_propagates() -> None:
    reaps = Recorder()
    async with LocalTimerServer(reaps) as server:
        with pytest.raises(KeyError):
            async with expires(after=5, scope="s", client=server.client()):
                raise KeyError("boom")
        assert server.armed == 0
        await asyncio.sleep(10)
    assert reaps.timers == []


@virtual
async def test_reacquire_same_scope_replaces_the_timer() -> None:
    reaps = Recorder()
    loop = asyncio.get_running_loop()
    async with LocalTimerServer(reaps) as server:
        client = server.client("w")
        start = loop.time()
        await client.acquire("s", 2)
        await asyncio.sleep(1)
        await client.acquire("s", 5)  # now due at start + 6
        assert server.armed == 1
        await asyncio.sleep(10)
    assert len(reaps.timers) == 1
    assert reaps.times[0] == pytest.approx(start + 6, abs=1e-6)


def test_the_default_scope_is_the_callers_file_and_line() -> None:
    line = inspect.currentframe().f_lineno  # type: ignore[union-attr]
    by_expires = expires(after=5)
    by_guard = TimerGuard(5)
    assert by_expires.scope_id == f"{__file__}#{line + 1}"
    assert by_guard.scope_id == f"{__file__}#{line + 2}"


@virtual
async def test_recursive_default_scope_reuses_one_timer() -> None:
    async with LocalTimerServer(Recorder()) as server:
        client = server.client("w")
        seen: list[str] = []

        async def recurse(depth: int) -> None:
            guard = expires(after=5, client=client)
            seen.append(guard.scope_id)
            async with guard:
                assert server.armed == 1
                if depth:
                    await recurse(depth - 1)

        await recurse(3)
        assert len(set(seen)) == 1
        assert seen[0].startswith(__file__ + "#")
        assert server.armed == 0


@virtual
async def test_remaining_and_expires_count_down() -> None:
    guard = TimerGuard(10, scope="s")
    assert guard.remaining == 10
    async with guard:
        await asyncio.sleep(3)
        assert guard.expires() == pytest.approx(7)
        assert guard.deadline is not None


@virtual
async def test_guard_without_client_is_a_local_deadline() -> None:
    configure(None)
    with pytest.raises(TimerExpiredError):
        async with expires(after=1):
            await asyncio.sleep(5)
    async with expires(after=1):
        await asyncio.sleep(0.5)


@virtual
async def test_configure_sets_the_global_client() -> None:
    reaps = Recorder()
    async with LocalTimerServer(reaps) as server:
        client = server.client("global")
        configure(client)
        try:
            assert get_client() is client
            with pytest.raises(TimerExpiredError):
                async with expires(after=1, scope="g"):
                    await asyncio.sleep(5)
        finally:
            configure(None)
    assert [t.worker_id for t in reaps.timers] == ["global"]


def test_configure_rejects_non_clients() -> None:
    with pytest.raises(TypeError, match="TimerClient"):
        configure("not a client")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("after", "error"),
    [
        (-1, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (-math.inf, ValueError),
        ("5", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
def test_bad_durations_are_rejected(after: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="after"):
        expires(after=after)  # type: ignore[arg-type]


@virtual
async def test_client_validates_its_arguments() -> None:
    async with LocalTimerServer(Recorder()) as server:
        client = server.client("w")
        with pytest.raises(ValueError, match="after"):
            await client.acquire("s", -0.5)
        with pytest.raises(ValueError, match="scope_id"):
            await client.acquire("", 1)
        with pytest.raises(TypeError, match="scope_id"):
            await client.acquire(3, 1)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="scope"):
            expires(after=1, scope="")
        assert server.armed == 0
    with pytest.raises(TypeError, match="hashable"):
        server.client(worker_id=["not", "hashable"])  # type: ignore[arg-type]


@virtual
async def test_server_must_be_running() -> None:
    server = LocalTimerServer(Recorder())
    with pytest.raises(TimerError, match="not running"):
        await server.client("w").acquire("s", 1)
    async with server:
        pass
    with pytest.raises(TimerError, match="closed"):
        await server.client("w").acquire("s", 1)
    with pytest.raises(RuntimeError, match="closed"):
        await server.start()


@virtual
async def test_aclose_disarms_everything() -> None:
    reaps = Recorder()
    async with LocalTimerServer(reaps) as server:
        for i in range(10):
            await server.client(i).acquire("s", 1)
        assert server.armed == 10
    assert server.armed == 0
    await asyncio.sleep(5)
    assert reaps.timers == []


@virtual
async def test_failing_reaper_is_logged_and_server_keeps_reaping() -> None:
    calls: list[str] = []

    def reaper(timer: ExpiredTimer) -> None:
        calls.append(timer.scope_id)
        if timer.scope_id == "bad":
            raise RuntimeError("reaper broke")

    async with LocalTimerServer(reaper) as server:
        client = server.client("w")
        await client.acquire("bad", 1)
        await client.acquire("good", 2)
        await asyncio.sleep(3)
        stats = server.statistics()
    assert calls == ["bad", "good"]
    assert stats.reaped == 2
    assert stats.reaper_failures == 1
    assert server.reaps[0].error == "RuntimeError: reaper broke"
    assert server.reaps[1].error is None


@virtual
async def test_async_reaper_is_awaited_in_the_server_task() -> None:
    done: list[str] = []

    async def reaper(timer: ExpiredTimer) -> None:
        await asyncio.sleep(0.5)
        done.append(timer.scope_id)

    async with LocalTimerServer(CallbackReaper(reaper)) as server:
        await server.client("w").acquire("s", 1)
        await server.wait_reaped(1)
        assert done == []
        await asyncio.sleep(1)
    assert done == ["s"]


@virtual
async def test_wait_reaped_returns_recorded_events() -> None:
    async with LocalTimerServer(Recorder()) as server:
        client = server.client("w")
        await client.acquire("a", 1)
        await client.acquire("b", 2)
        events = await server.wait_reaped(2)
    assert [e.timer.scope_id for e in events] == ["a", "b"]


@virtual
async def test_cancel_task_reaper_rejects_non_tasks() -> None:
    async with LocalTimerServer() as server:
        await server.client("not-a-task").acquire("s", 1)
        await asyncio.sleep(2)
        assert server.statistics().reaper_failures == 1
        assert "asyncio.Task" in (server.reaps[0].error or "")


@virtual
async def test_submit_accepts_wire_records() -> None:
    import time

    reaps = Recorder()
    async with LocalTimerServer(reaps) as server:
        server.submit(TimerRequest(7, "s", time.time() + 2))
        server.submit(TimerRequest(8, "s", time.time() + 2))
        server.submit(TimerRequest(8, "s", None))  # release
        assert server.armed == 1
        await asyncio.sleep(3)
        with pytest.raises(TypeError):
            server.submit({"worker": 1})  # type: ignore[arg-type]
    assert [t.worker_id for t in reaps.timers] == [7]
    assert reaps.timers[0].expiration_time is not None


def test_bad_reaper_and_history_are_rejected() -> None:
    with pytest.raises(TypeError, match="callable"):
        LocalTimerServer("nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="history"):
        LocalTimerServer(history=-1)


def test_guard_is_single_use() -> None:
    async def body() -> None:
        guard = expires(after=1, scope="s")
        async with guard:
            pass
        with pytest.raises(RuntimeError, match="single-use"):
            await guard.acquire()

    run_virtual(body)


# -- the wire record ----------------------------------------------------------------------------


def test_timer_request_round_trips() -> None:
    request = TimerRequest("host-1:42", "scope/with#odd chars", 1.7e9, pid=42, signal=15)
    assert TimerRequest.from_json(request.to_json()) == request
    release = TimerRequest(5, "s", None)
    assert release.is_release
    assert TimerRequest.from_json(release.to_json()) == release


def test_negative_expiration_on_the_wire_means_release() -> None:
    parsed = TimerRequest.from_json(b'{"v":1,"worker":5,"scope":"s","expiration":-1}')
    assert parsed.is_release


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json", "must be JSON"),
        (b"[1,2]", "JSON object"),
        (b'{"v":2,"worker":1,"scope":"s","expiration":1}', "version"),
        (b'{"v":1,"scope":"s","expiration":1}', "'worker'"),
        (b'{"v":1,"worker":1,"expiration":1}', "'scope'"),
        (b'{"v":1,"worker":1,"scope":"s"}', "'expiration'"),
        (b'{"v":1,"worker":1,"scope":"","expiration":1}', "scope_id"),
        (b'{"v":1,"worker":true,"scope":"s","expiration":1}', "worker_id"),
        (b'{"v":1,"worker":[1],"scope":"s","expiration":1}', "worker_id"),
        (b'{"v":1,"worker":"","scope":"s","expiration":1}', "worker_id"),
        (b'{"v":1,"worker":1,"scope":"s","expiration":"soon"}', "expiration_time"),
        (b'{"v":1,"worker":1,"scope":"s","expiration":1e999}', "expiration_time"),
        (b'{"v":1,"worker":1,"scope":"s","expiration":1,"signal":0}', "signal"),
        (b'{"v":1,"worker":1,"scope":"s","expiration":1,"signal":999}', "signal"),
        (b'{"v":1,"worker":1,"scope":"s","expiration":1,"pid":-3}', "pid"),
        (b'{"v":1,"worker":1,"scope":"s","expiration":1,"extra":1}', "unknown field"),
    ],
)
def test_malformed_wire_requests_are_rejected(raw: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TimerRequest.from_json(raw)


# -- the signal reaper's safety --------------------------------------------------------------------


def test_signal_reaper_never_signals_its_own_process_or_parent() -> None:
    reaper = SignalReaper()
    for pid in (os.getpid(), os.getppid()):
        with pytest.raises(TimerError, match="refuses"):
            reaper(ExpiredTimer(pid, "s", 0.0))
    with pytest.raises(TimerError, match="refuses"):
        SignalReaper(protect=[12345])(ExpiredTimer(12345, "s", 0.0))
    with pytest.raises(TimerError, match="no process id"):
        reaper(ExpiredTimer("named-worker", "s", 0.0))
    with pytest.raises(TimerError, match="no process id"):
        reaper(ExpiredTimer(0, "s", 0.0))  # os.kill(0) would signal our process group


def test_signal_reaper_validates_its_signal() -> None:
    with pytest.raises(ValueError, match="signal"):
        SignalReaper(signal=0)
    assert "SIGTERM" in repr(SignalReaper(signal.SIGTERM))


def test_signal_reaper_tolerates_an_exited_process(caplog: pytest.LogCaptureFixture) -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with caplog.at_level(logging.INFO, logger="aioelastic.timer"):
        SignalReaper()(ExpiredTimer(child.pid, "s", 0.0))
    assert "already exited" in caplog.text


def test_cancel_task_reaper_repr() -> None:
    assert repr(CancelTaskReaper()) == "CancelTaskReaper()"


@virtual
async def test_wait_reaped_fails_when_the_server_closes() -> None:
    server = LocalTimerServer(Recorder())
    await server.start()
    waiter = asyncio.create_task(server.wait_reaped(1))
    await asyncio.sleep(1)
    await server.aclose()
    with pytest.raises(TimerError, match="closed after 0 of 1"):
        await waiter


@virtual
async def test_reaps_are_logged_with_worker_scope_and_lateness() -> None:
    records: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Capture()
    logger = logging.getLogger("aioelastic.timer")
    logger.addHandler(handler)
    try:
        async with LocalTimerServer(Recorder()) as server:
            await server.client("worker-7").acquire("epoch-3", 1)
            await server.wait_reaped(1)
    finally:
        logger.removeHandler(handler)
    (message,) = [r.getMessage() for r in records if "reaping" in r.getMessage()]
    assert "worker-7" in message
    assert "'epoch-3'" in message
    assert "ms ago" in message


@pytest_asyncio.fixture
async def fixture_server() -> AsyncIterator[LocalTimerServer]:
    # pytest-asyncio sets up and tears down in different tasks: the server must allow that
    async with LocalTimerServer(Recorder()) as server:
        yield server


@pytest.mark.asyncio
async def test_server_works_as_a_pytest_asyncio_fixture(fixture_server: LocalTimerServer) -> None:
    client = fixture_server.client("w")
    await client.acquire("s", 0.01)
    events = await asyncio.wait_for(fixture_server.wait_reaped(1), 10)
    assert events[0].timer.scope_id == "s"


@virtual
async def test_acquire_cancelled_in_flight_disarms_the_timer() -> None:
    """A guard cancelled while its acquire is in flight leaves no timer armed behind it."""
    from aioelastic.timer import TimerClient

    reaps = Recorder()
    async with LocalTimerServer(reaps) as server:
        inner = server.client("w")

        class SlowClient(TimerClient):  # the server gets the request; the answer is slow
            async def _acquire(self, scope_id: str, after: float) -> None:
                await inner.acquire(scope_id, after)
                await asyncio.sleep(1)

            async def _release(self, scope_id: str) -> None:
                await inner.release(scope_id)

        async def worker() -> None:
            async with expires(after=5, scope="s", client=SlowClient()):
                await asyncio.sleep(60)

        task = asyncio.create_task(worker())
        await asyncio.sleep(0.5)
        assert server.armed == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert server.armed == 0
        await asyncio.sleep(10)
    assert reaps.timers == []


@virtual
async def test_remaining_after_cancel_is_infinite() -> None:
    async with expires(after=5, scope="s") as guard:
        await guard.cancel()
        assert guard.remaining == math.inf


def _message(call: Callable[[], object]) -> str:
    try:
        call()
    except (TypeError, ValueError, RuntimeError) as exc:
        return str(exc)
    raise AssertionError("no error")


def test_bad_arguments_get_errors_naming_what_was_given() -> None:
    server = LocalTimerServer()
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: configure(3), "client must be a TimerClient or None, got int"),  # type: ignore[arg-type]
        (lambda: TimerGuard(1, client="c"), "client must be a TimerClient, got str"),  # type: ignore[arg-type]
        (lambda: CallbackReaper(7), "callback must be callable, got int"),  # type: ignore[arg-type]
        (lambda: server.submit("r"), "request must be a TimerRequest, got str"),  # type: ignore[arg-type]
        (lambda: LocalTimerClient(7), "server must be a LocalTimerServer, got int"),  # type: ignore[arg-type]
        (lambda: LocalTimerClient(server, []), "worker_id must be hashable, got list"),  # type: ignore[arg-type]
        (lambda: TimerRequest(1, "s", None, pid=True), "pid must be a process id (int), got bool"),
    ]
    for call, message in cases:
        assert _message(call) == message
    assert "scope" in _message(lambda: TimerGuard(1, scope=""))
    assert TimerRequest(1, "s", None, pid=1).pid == 1  # pid 1 is a process id


@virtual
async def test_a_submitted_request_reaches_the_reaper_whole() -> None:
    reaps = Recorder()
    async with LocalTimerServer(reaps) as server:
        expiration = time.time() + 1
        server.submit(TimerRequest(42, "s", expiration, pid=4242, signal=signal.SIGUSR1))
        await server.wait_reaped(1)
    (timer,) = reaps.timers
    assert (timer.worker_id, timer.scope_id, timer.pid, timer.signal) == (
        42,
        "s",
        4242,
        signal.SIGUSR1,
    )
    assert timer.expiration_time == expiration


@virtual
async def test_the_server_keeps_its_history_and_event_sink() -> None:
    events: list[object] = []

    class Sink:
        def emit(self, event: object) -> None:
            events.append(event)

    async with LocalTimerServer(Recorder(), history=2, event_sink=Sink()) as server:
        client = server.client("w")
        for scope in ("a", "b", "c"):
            await client.acquire(scope, 1)
        await server.wait_reaped(3)
    assert [e.timer.scope_id for e in server.reaps] == ["b", "c"]  # the last `history` reaps
    assert events  # reaps went to the sink given, not the default one


@virtual
async def test_each_failing_async_reap_is_counted() -> None:
    async def reaper(timer: ExpiredTimer) -> None:
        raise RuntimeError("broke")

    async with LocalTimerServer(CallbackReaper(reaper)) as server:
        client = server.client("w")
        await client.acquire("a", 1)
        await client.acquire("b", 1)
        await asyncio.sleep(2)
        assert server.statistics().reaper_failures == 2


@virtual
async def test_a_reaped_task_is_told_which_scope_expired() -> None:
    async with LocalTimerServer() as server:
        client = server.client()

        async def work() -> None:
            await client.acquire("step", 1)
            await asyncio.sleep(10)

        task = asyncio.ensure_future(work())
        with pytest.raises(asyncio.CancelledError, match="watchdog timer of scope 'step' expired"):
            await task


def test_a_client_without_a_worker_id_needs_a_task() -> None:
    client = LocalTimerServer().client()
    with asyncio.Runner() as runner:
        loop = runner.get_loop()
        said: asyncio.Future[str] = loop.create_future()
        loop.call_soon(lambda: said.set_result(_message(client._worker)))  # a callback, no task

        async def message() -> str:
            return await said

        assert runner.run(message()) == (
            "LocalTimerClient without a worker_id must be used from a task"
        )


class SlowClient(TimerClient):
    """A remote-style client (not in-process) whose requests take ``delay`` loop seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls: list[str] = []

    async def _acquire(self, scope_id: str, after: float) -> None:
        self.calls.append(f"acquiring {scope_id}")
        await asyncio.sleep(self.delay)
        self.calls.append(f"acquired {scope_id}")

    async def _release(self, scope_id: str) -> None:
        await asyncio.sleep(self.delay)
        self.calls.append(f"released {scope_id}")


@virtual
async def test_a_guard_cancelled_while_arming_releases_what_it_may_have_armed() -> None:
    client = SlowClient(1)
    guard = expires(after=30, scope="s", client=client)
    task = asyncio.ensure_future(guard.acquire())
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert guard.state == "released"
    assert client.calls == ["acquiring s", "released s"]


@virtual
async def test_a_remote_release_finishes_even_when_the_block_is_cancelled() -> None:
    client = SlowClient(1)
    entered = asyncio.Event()

    async def work() -> None:
        async with expires(after=30, scope="s", client=client):
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.ensure_future(work())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.calls[-1] == "released s"  # shielded: not cut short by the cancellation


@virtual
async def test_a_hung_release_gives_up_after_its_timeout() -> None:
    client = SlowClient(0)
    loop = asyncio.get_running_loop()
    async with expires(after=30, scope="s", client=client) as guard:
        client.delay = 3600
        started = loop.time()
    assert loop.time() - started == pytest.approx(timer_pkg._guard.RELEASE_TIMEOUT)
    assert guard.state == "released"


@virtual
async def test_cancel_outside_a_block_disarms() -> None:
    client = SlowClient(0)
    guard = expires(after=30, scope="s", client=client)
    await guard.acquire()
    await guard.cancel()
    assert guard.state == "cancelled"
    assert guard.remaining == math.inf
    assert client.calls[-1] == "released s"


@virtual
async def test_wait_reaped_waits_for_one_by_default_and_says_when_the_server_closed() -> None:
    server = LocalTimerServer(Recorder())
    async with server:
        client = server.client("w")
        await client.acquire("a", 1)
        await client.acquire("b", 5)
        assert server.statistics().armed == 2
        events = await server.wait_reaped()
        assert [e.timer.scope_id for e in events] == ["a"]
        assert server.statistics().armed == 1
        waiting = asyncio.ensure_future(server.wait_reaped(3))
        await asyncio.sleep(0)
    with pytest.raises(TimerError) as info:
        await waiting
    assert str(info.value) == "LocalTimerServer closed after 1 of 3 reaps"


@pytest.mark.asyncio
async def test_the_signal_reaper_signals_the_timers_pid_before_its_worker_id() -> None:
    proc = await asyncio.create_subprocess_exec("sleep", "30")
    try:
        # the worker id is an int too, of no live process: the pid wins
        SignalReaper(signal.SIGTERM)(ExpiredTimer(2**22 + 12345, "s", 0.0, pid=proc.pid))
        async with asyncio.timeout(10):
            assert await proc.wait() == -signal.SIGTERM
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_a_signal_is_a_number_in_1_to_nsig() -> None:
    for good in (1, signal.NSIG - 1):
        assert TimerRequest(1, "s", 1.0, signal=good).signal == good
    for bad in (0, signal.NSIG):
        with pytest.raises(ValueError, match="signal") as info:
            TimerRequest(1, "s", 1.0, signal=bad)
        assert (
            str(info.value) == f"signal must be a signal number in 1..{signal.NSIG - 1}, got {bad}"
        )
    with pytest.raises(TypeError, match="signal") as type_info:
        TimerRequest(1, "s", 1.0, signal=True)
    assert str(type_info.value) == "signal must be a signal number (int), got bool"


@virtual
async def test_every_release_is_counted() -> None:
    async with LocalTimerServer(Recorder()) as server:
        client = server.client("w")
        for _ in range(3):
            await client.acquire("s", 5)
            await client.release("s")
        await client.release("s")  # not armed: not a release
        assert server.statistics().released == 3


def test_a_request_is_compact_json_on_the_wire() -> None:
    request = TimerRequest(7, "s", 12.5, pid=7, signal=15)
    assert request.to_json() == (
        b'{"v":1,"worker":7,"scope":"s","expiration":12.5,"pid":7,"signal":15}'
    )
