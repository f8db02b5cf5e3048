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
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from aioelastic.errors import TimerError
from aioelastic.testing import run_virtual, virtual_test
from aioelastic.timer import (
    BlockingUnixTimerClient,
    LocalTimerServer,
    TimerClient,
    UnixTimerClient,
    UnixTimerServer,
    expires,
    unix,
)


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
