"""Timers across processes over the Unix socket: real child processes, real signals."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from helpers import ROOT
from helpers.waiting import eventually

from aioelastic.errors import TimerError
from aioelastic.timer import (
    BlockingUnixTimerClient,
    ExpiredTimer,
    SignalReaper,
    UnixTimerClient,
    UnixTimerServer,
    expires,
    unix,
)

CHILD = """
import asyncio, signal, sys, time
from aioelastic.timer import BlockingUnixTimerClient, UnixTimerClient

async def main(path: str, mode: str) -> None:
    sig = signal.SIGTERM if mode == "hang-term" else None
    client = UnixTimerClient(path, signal=sig)
    await client.connect()
    if mode.startswith("hang"):
        await client.acquire("hang", 0.3)
        print("armed", flush=True)
        time.sleep(60)  # blocks the event loop: only the server can end this
    elif mode == "release":
        await client.acquire("ok", 0.3)
        await client.release("ok")
        print("released", flush=True)
        time.sleep(0.6)  # alive past the 0.3 s deadline: a released timer is not reaped
    elif mode == "exit":
        await client.acquire("gone", 0.5)
        print("armed", flush=True)  # and exit without releasing

if sys.argv[2] == "hang-blocking":  # a synchronous worker: no event loop at all
    with BlockingUnixTimerClient(sys.argv[1]) as client, client.expires(after=0.3):
        print("armed", flush=True)
        time.sleep(60)  # blocks: only the server can end this
else:
    asyncio.run(main(sys.argv[1], sys.argv[2]))
"""
BLOCKING_WITH = (
    "    with BlockingUnixTimerClient(sys.argv[1]) as client, client.expires(after=0.3):"
)


@pytest.fixture
def socket_path() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="aet-", dir="/tmp")  # AF_UNIX paths are short
    try:
        yield os.path.join(directory, "timers.sock")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def spawn(path: str, mode: str) -> asyncio.subprocess.Process:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, path, mode, stdout=asyncio.subprocess.PIPE, env=env
    )


async def read_line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    async with asyncio.timeout(20):
        return (await proc.stdout.readline()).decode().strip()


@pytest.mark.asyncio
@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["hang", "hang-blocking"])
async def test_hung_child_is_sigkilled(socket_path: str, mode: str) -> None:
    async with UnixTimerServer(socket_path) as server:
        proc = await spawn(socket_path, mode)
        assert await read_line(proc) == "armed"
        assert server.armed == 1
        async with asyncio.timeout(20):
            code = await proc.wait()
        assert code == -signal.SIGKILL
        (event,) = server.reaps
        assert event.timer.worker_id == proc.pid
        if mode == "hang":
            assert event.timer.scope_id == "hang"
        else:  # the default scope: the caller's file#line, the child's `with` line
            line = CHILD.splitlines().index(BLOCKING_WITH) + 1
            assert event.timer.scope_id == f"<string>#{line}"
        assert event.error is None
        assert 0 <= event.lateness < 1.0  # generous: 2 busy cores
        assert server.armed == 0
        assert server.running  # the server did not kill itself


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_timer_can_carry_its_own_signal(socket_path: str) -> None:
    async with UnixTimerServer(socket_path) as server:
        proc = await spawn(socket_path, "hang-term")
        assert await read_line(proc) == "armed"
        async with asyncio.timeout(20):
            assert await proc.wait() == -signal.SIGTERM
        assert server.reaps[0].timer.signal == signal.SIGTERM


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_released_timer_is_not_reaped(socket_path: str) -> None:
    async with UnixTimerServer(socket_path) as server:
        proc = await spawn(socket_path, "release")
        assert await read_line(proc) == "released"
        async with asyncio.timeout(20):
            assert await proc.wait() == 0
        assert list(server.reaps) == []
        assert server.statistics().released == 1


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_timers_of_an_exited_worker_are_dropped(socket_path: str) -> None:
    async with UnixTimerServer(socket_path) as server:
        proc = await spawn(socket_path, "exit")
        assert await read_line(proc) == "armed"
        async with asyncio.timeout(20):
            assert await proc.wait() == 0
        await asyncio.sleep(0.8)  # under test: past the 0.5 s deadline, nothing is reaped
        assert list(server.reaps) == []
        assert server.armed == 0
        assert server.statistics().dropped == 1
        if unix._HAVE_PIDFD:  # the exited worker's pidfd is closed and off the loop
            assert server._pidfds == {}
            assert not _open_pidfds()


def _open_pidfds() -> list[str]:
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone already
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    return [link for link in links if "pidfd" in link]


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_server_never_reaps_its_own_process(socket_path: str) -> None:
    async with (
        UnixTimerServer(socket_path) as server,
        UnixTimerClient(socket_path) as client,
    ):
        await client.acquire("self", 0.05)
        (event,) = await asyncio.wait_for(server.wait_reaped(1), 10)
        assert event.timer.worker_id == os.getpid()
        assert event.error is not None
        assert "refuses" in event.error
        assert server.statistics().reaper_failures == 1
        assert server.running


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_guard_over_unix_client(socket_path: str) -> None:
    reaped: list[ExpiredTimer] = []
    async with (
        UnixTimerServer(socket_path, reaped.append) as server,
        UnixTimerClient(socket_path) as client,
    ):
        async with expires(after=5, scope="quick", client=client):
            assert server.armed == 1
        assert server.armed == 0
        with pytest.raises(TimeoutError):
            async with expires(after=0.05, scope="slow", client=client):
                await asyncio.sleep(5)  # overruns on purpose: the timer ends it
        await asyncio.wait_for(server.wait_reaped(1), 10)
    assert [t.scope_id for t in reaped] == ["slow"]
    assert reaped[0].expiration_time is not None


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_malformed_requests_are_rejected_and_server_keeps_running(
    socket_path: str,
) -> None:
    reaped: list[ExpiredTimer] = []
    async with UnixTimerServer(socket_path, reaped.append) as server:
        reader, writer = await asyncio.open_unix_connection(socket_path, limit=1 << 20)

        async def send(line: bytes) -> dict[str, object]:
            writer.write(line + b"\n")
            await writer.drain()
            reply = json.loads(await reader.readline())
            assert isinstance(reply, dict)
            return reply

        me = os.getpid()
        bad = [
            (b"this is not json", "must be JSON"),
            (b"\xff\xfe not even UTF-8", "must be JSON"),
            (b'{"v":1,"worker":1,"scope":"s","expiration":1,"id":"x"}', "'id'"),
            (b'{"v":9,"worker":1,"scope":"s","expiration":1}', "version"),
            (b'{"v":1,"worker":"w","scope":"s","expiration":1}', "process id"),
            (b'{"v":1,"worker":1,"scope":"s","expiration":1e400}', "expiration"),
            (f'{{"v":1,"worker":{me + 1},"scope":"s","expiration":1}}'.encode(), "only arm"),
            (
                f'{{"v":1,"worker":{me},"pid":{me + 1},"scope":"s","expiration":1}}'.encode(),
                "worker must be the client's process id",
            ),
            (b"x" * 40_000, "longer than"),
        ]
        for line, message in bad:
            reply = await send(line)
            assert message in str(reply.get("error")), (line[:60], reply)
            assert reply["id"] is None  # no usable id in the request
        assert server.statistics().rejected == len(bad)
        # the same connection still works
        ok = f'{{"v":1,"worker":{me},"scope":"s","expiration":null,"id":7}}'.encode()
        assert await send(b"\n  \n" + ok) == {"id": 7, "ok": True}  # blank lines are skipped
        writer.close()
        async with UnixTimerClient(socket_path) as client:
            await client.acquire("fine", 30)
            assert server.armed == 1
            await client.release("fine")
        assert server.armed == 0
    assert reaped == []


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_client_errors_are_timer_errors(socket_path: str) -> None:
    with pytest.raises(TimerError, match="cannot reach"):
        await UnixTimerClient(socket_path).acquire("s", 1)
    async with UnixTimerServer(socket_path, SignalReaper()):
        client = UnixTimerClient(socket_path)
        with pytest.raises(ValueError, match="after"):
            await client.acquire("s", float("nan"))
        await client.aclose()
    with pytest.raises(ValueError, match="signal"):
        UnixTimerClient(socket_path, signal=0)


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_stale_socket_is_replaced_and_live_one_is_not(socket_path: str) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(socket_path)
    stale.close()  # leaves the file behind, nobody listening
    async with UnixTimerServer(socket_path) as server:
        assert oct(os.stat(socket_path).st_mode & 0o777) == oct(0o600)
        with pytest.raises(TimerError, match="already listening"):
            async with UnixTimerServer(socket_path):
                pass
        assert server.running
    assert not os.path.exists(socket_path)  # noqa: ASYNC240 - a test on a local file
    Path(socket_path).write_text("not a socket")  # noqa: ASYNC240
    with pytest.raises(TimerError, match="not a socket"):
        async with UnixTimerServer(socket_path):
            pass


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_blocking_client(socket_path: str) -> None:
    reaped: list[ExpiredTimer] = []
    async with UnixTimerServer(socket_path, reaped.append) as server:
        loop = asyncio.get_running_loop()

        def work() -> list[str]:
            scopes: list[str] = []
            with BlockingUnixTimerClient(socket_path) as client:
                scopes.append(f"{__file__}#{sys._getframe().f_lineno + 1}")
                with client.expires(after=30):
                    scopes.append(server._timers.of_worker(os.getpid())[0].scope_id)
                with pytest.raises(ValueError, match="after"):
                    client.acquire("s", -1)
                client.acquire("overrun", 0.05)
                asyncio.run_coroutine_threadsafe(server.wait_reaped(1), loop).result(10)
                client.release("overrun")  # too late: already reaped
            return scopes

        scopes = await asyncio.to_thread(work)
        assert scopes[0] == scopes[1]  # the default scope is the caller's file#line
        assert server.armed == 0
    assert [t.scope_id for t in reaped] == ["overrun"]
    with pytest.raises(TimerError, match="cannot reach"):
        BlockingUnixTimerClient(socket_path).acquire("s", 1)


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_exited_worker_is_dropped_without_pidfd(
    socket_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where pidfds are missing, the server checks the process when its connection closes."""
    monkeypatch.setattr(unix, "_HAVE_PIDFD", False)
    async with UnixTimerServer(socket_path) as server:
        proc = await spawn(socket_path, "exit")
        assert await read_line(proc) == "armed"
        async with asyncio.timeout(20):
            assert await proc.wait() == 0
        await asyncio.sleep(0.8)  # under test: past the 0.5 s deadline, nothing is reaped
        assert list(server.reaps) == []
        assert server.statistics().dropped == 1


FORKER = """
import os, sys
from aioelastic.timer import BlockingUnixTimerClient

client = BlockingUnixTimerClient(sys.argv[1])
client.acquire("parent", 30)
pid = os.fork()
if pid == 0:
    try:
        client.acquire("child", 30)  # as itself, on a connection of its own
    except BaseException as exc:
        print(exc, file=sys.stderr)
        os._exit(1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
client.release("parent")
print(pid, os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_blocking_client_reconnects_after_fork(socket_path: str) -> None:
    """A forked child arms timers as itself, not on the parent's connection."""
    reaped: list[ExpiredTimer] = []
    async with UnixTimerServer(socket_path, reaped.append) as server:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", FORKER, socket_path, stdout=asyncio.subprocess.PIPE, env=env
        )
        child, code = map(int, (await read_line(proc)).split())
        assert code == 0
        async with asyncio.timeout(20):
            assert await proc.wait() == 0
        await eventually(lambda: server.statistics().dropped >= 1, 20, "the child's timer")
        assert server.statistics().acquired == 2
        assert server.statistics().rejected == 0
        assert server.deadline_of(child, "child") is None  # dropped when the child exited
        assert server.deadline_of(proc.pid, "parent") is None  # released
        assert server.statistics().dropped == 1
    assert reaped == []


# A scripted timer server: answers each request line by the next entry of ``replies`` (a
# function of the request's id giving the raw reply line, or None to hang up), and records what
# it received.
_Reply = Callable[[int], bytes | None]


@contextlib.asynccontextmanager
async def _scripted_server(
    path: str, replies: list[_Reply]
) -> AsyncIterator[list[dict[str, object]]]:
    received: list[dict[str, object]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                request = json.loads(line)
                received.append(request)
                answer = replies.pop(0)(request["id"])
                if answer is None:
                    break
                for part in (answer + b"\n").split(_SPLIT):  # in pieces, if it asks so
                    writer.write(part)
                    await writer.drain()
                    await asyncio.sleep(0.01)  # deliberate: each piece in a read of its own
        finally:
            writer.close()

    server = await asyncio.start_unix_server(handle, path)
    try:
        yield received
    finally:
        server.close()
        await server.wait_closed()


_SPLIT = b"\x00"  # where a scripted reply is cut into separately sent pieces


def _in_pieces(rid: int) -> bytes:
    return _SPLIT.join([b'{"i', b'd": ', str(rid).encode(), b"}"])


def _ok(rid: int) -> bytes:
    return json.dumps({"id": rid}).encode()


def _refuse(rid: int) -> bytes:
    return json.dumps({"id": rid, "error": "no such thing"}).encode()


def _wrong_id(rid: int) -> bytes:
    return json.dumps({"id": rid + 7}).encode()


def _not_json(rid: int) -> bytes:
    return b"{not json"


def _hang_up(rid: int) -> None:
    return None


# (reply, the TimerError's message, whether the client drops its connection)
_BAD_REPLIES = [
    (_refuse, "refused the request: no such thing", False),
    (_wrong_id, "unexpected reply", True),
    (_not_json, "lost the timer server", True),
    (_hang_up, "closed the connection", True),
]


@pytest.mark.asyncio
@pytest.mark.timeout(30)
@pytest.mark.parametrize(("bad", "message", "reconnects"), _BAD_REPLIES)
async def test_the_client_reads_each_reply_and_refuses_a_bad_one(
    socket_path: str, bad: _Reply, message: str, reconnects: bool
) -> None:
    async with _scripted_server(socket_path, [_in_pieces, bad, _ok, _ok]) as received:
        client = UnixTimerClient(socket_path, signal=signal.SIGUSR1)
        await client.acquire("a", 30)
        with pytest.raises(TimerError, match=message):
            await client.release("a")
        assert (client._writer is None) == reconnects  # a reply out of step: start afresh
        await client.acquire("b", 30)  # the client carries on (on a new connection if need be)
        await client.release("b")
        await client.aclose()
    assert [r["id"] for r in received] == [1, 2, 3, 4]  # each request has the next id
    assert [(r["scope"], r["worker"], r.get("signal")) for r in received] == [
        ("a", os.getpid(), signal.SIGUSR1),
        ("a", os.getpid(), None),
        ("b", os.getpid(), signal.SIGUSR1),
        ("b", os.getpid(), None),
    ]
    assert received[1]["expiration"] is None
    assert 29 < float(received[0]["expiration"]) - time.time() <= 30  # type: ignore[arg-type]


@pytest.mark.asyncio
@pytest.mark.timeout(30)
@pytest.mark.parametrize(("bad", "message", "reconnects"), _BAD_REPLIES)
async def test_the_blocking_client_reads_each_reply_and_refuses_a_bad_one(
    socket_path: str, bad: _Reply, message: str, reconnects: bool
) -> None:
    async with _scripted_server(socket_path, [_in_pieces, bad, _ok, _ok]) as received:

        def work() -> None:
            with BlockingUnixTimerClient(socket_path, signal=signal.SIGUSR1, timeout=10) as client:
                client.acquire("a", 30)
                with pytest.raises(TimerError, match=message):
                    client.release("a")
                assert (client._sock is None) == reconnects
                client.acquire("b", 30)
                client.release("b")

        await asyncio.to_thread(work)
    assert [r["id"] for r in received] == [1, 2, 3, 4]
    assert [(r["scope"], r.get("signal")) for r in received] == [
        ("a", signal.SIGUSR1),
        ("a", None),
        ("b", signal.SIGUSR1),
        ("b", None),
    ]
    assert 29 < float(received[0]["expiration"]) - time.time() <= 30  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_client_used_after_a_fork_says_so(socket_path: str) -> None:
    async with _scripted_server(socket_path, [_ok]) as received:
        client = UnixTimerClient(socket_path)
        client.pid = os.getpid() + 1  # as if created in the parent of a fork
        with pytest.raises(TimerError) as info:
            await client.acquire("s", 30)
        await client.aclose()
    assert str(info.value) == (
        "this UnixTimerClient was created in another process (before a fork); "
        "create a new client in this process"
    )
    assert received == []


def test_the_blocking_client_checks_its_timeout() -> None:
    with pytest.raises(ValueError, match=r"^timeout "):
        BlockingUnixTimerClient("/nonexistent", timeout=-1)


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_the_blocking_client_gives_up_on_a_silent_server(socket_path: str) -> None:
    release = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        await release.wait()  # reads the request, never answers
        writer.close()

    server = await asyncio.start_unix_server(silent, socket_path)
    try:

        def work() -> float:
            started = time.monotonic()
            with (
                BlockingUnixTimerClient(socket_path, timeout=0.3) as client,
                pytest.raises(TimerError, match="lost the timer server"),
            ):
                client.acquire("s", 30)
            return time.monotonic() - started

        assert 0.25 <= await asyncio.to_thread(work) < 10
    finally:
        release.set()
        server.close()
        await server.wait_closed()


TWO_TIMERS_THEN_EXIT = """
import asyncio, sys
from aioelastic.timer import UnixTimerClient

async def main() -> None:
    client = UnixTimerClient(sys.argv[1])
    await client.acquire("a", 30)
    await client.acquire("b", 30)

asyncio.run(main())
"""


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_every_timer_of_every_exited_worker_is_counted_as_dropped(socket_path: str) -> None:
    async with UnixTimerServer(socket_path) as server:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        for _ in range(2):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", TWO_TIMERS_THEN_EXIT, socket_path, env=env
            )
            async with asyncio.timeout(20):
                assert await proc.wait() == 0
        # the exits arrive as loop events (pidfd), as above
        await eventually(lambda: server.statistics().dropped >= 4, 20, "the exits' timers")
        assert server.statistics().dropped == 4
        assert server.armed == 0


def test_the_server_needs_a_path() -> None:
    with pytest.raises(ValueError, match="path") as info:
        UnixTimerServer("")
    assert str(info.value) == "path must not be empty"
