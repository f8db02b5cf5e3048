"""The HTTP store client against real and deliberately broken session servers on 127.0.0.1: error
mapping, no silent write retries, watch resumption without loss or repeats, dead-server detection,
lease keep-alives on the one session, pipelining."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import pytest
from helpers import free_port
from helpers.fake_session import Peer, fake_session_server, loopback_server, raw_answer
from helpers.waiting import eventually

from aioelastic.errors import (
    CompactedError,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
    WriteOutcomeUnknownError,
    WriteTimeoutError,
)
from aioelastic.store import CasResult, EventType, MemoryEngine, open_store
from aioelastic.store.http import HttpStore
from aioelastic.store.http._client_conn import ConnectionLost
from aioelastic.store.http._frames import ERROR, PROGRESS, RESULT
from aioelastic.store.http._session_client import _retrieve, _Slots, retry_pause
from aioelastic.store.http._session_dial import NotYet
from aioelastic.store.http._session_stream import message_header
from aioelastic.store.http.server import HttpStoreServer


async def _hang_up(peer: Peer, frame: list[Any]) -> str:
    return "hang up"  # the request arrived... and the server dies


async def _never_answer(peer: Peer, frame: list[Any]) -> None:
    return None


@pytest.mark.asyncio
async def test_unreachable_server_is_a_connection_error_even_for_writes() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    # connecting is retried within the request deadline (timeout): a short one fails soon
    async with open_store(url, read_retries=1, timeout=0.5) as store:
        for call in (store.get("k"), store.put("k", b"v"), store.compare_and_swap("k", 0, b"v")):
            with pytest.raises(StoreConnectionError) as info:
                await call
            # nothing was sent, so the outcome is known: not applied
            assert not isinstance(info.value, WriteOutcomeUnknownError)
        with pytest.raises(StoreConnectionError):
            await store.watch("x").start()


@pytest.mark.asyncio
async def test_giving_up_on_connecting_says_the_last_error_and_how_long_it_tried() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with open_store(url, read_retries=0, timeout=0.5) as store:
        with pytest.raises(NotYet) as info:
            await store.get("k")
    # the last attempt's own words (refused, or cut by the deadline), with no reason after
    # them: nothing answered
    last = rf"cannot connect to {re.escape(url)}: (timed out|\[Errno 111\] [^()]+\([^()]+\))"
    assert re.fullmatch(rf"{last} \(still, after \d+ attempts within 0\.5s\)", str(info.value))
    assert (info.value.status, info.value.reason) == (0, "")


@pytest.mark.asyncio
async def test_watches_fail_when_the_session_is_not_resumed_within_reconnect_timeout() -> None:
    server = HttpStoreServer(port=0)
    await server.start()
    url = server.url
    async with (
        open_store(url, progress_interval=0.2, reconnect_timeout=0.5) as store,
        store.watch("x") as events,
    ):
        await server.stop()  # and nothing listens on its port any more
        started = time.monotonic()
        with pytest.raises(StoreConnectionError) as info:
            await asyncio.wait_for(events.__anext__(), 20)
        assert time.monotonic() - started < 10
    message = str(info.value)
    said = f"watch 'x': the session to {url} was lost and not resumed within 0.5s: "
    assert message.startswith(said + f"cannot connect to {url}: ")
    assert re.search(r" \(still, after \d+ attempts within 0\.\d+s\)$", message)


@pytest.mark.asyncio
async def test_a_write_lost_after_sending_is_outcome_unknown_and_not_retried() -> None:
    async with (
        fake_session_server(_hang_up) as (url, seen),
        open_store(url, read_retries=2) as store,
    ):
        for write in (
            store.put("k", b"v"),
            store.compare_and_swap("k", 3, b"v"),
            store.add("counter"),
            store.delete("k"),
            store.lease_grant(5),
        ):
            before = len(seen.ops)
            with pytest.raises(WriteOutcomeUnknownError, match="may or may not"):
                await write
            assert len(seen.ops) == before + 1  # sent once, never retried
        before = len(seen.ops)
        with pytest.raises(StoreConnectionError) as info:
            await store.get("k")
        assert not isinstance(info.value, WriteOutcomeUnknownError)
        assert seen.ops[before:] == ["get"] * 3  # a read is retried


class _CountingEngine(MemoryEngine):
    """The real engine, counting the writes a server applies (so a resend shows as two)."""

    def __init__(self) -> None:
        super().__init__()
        self.applied: list[str] = []

    def compare_and_delete(self, key: str, expected_mod_revision: int) -> CasResult:
        self.applied.append(f"compare_and_delete {key}")
        return super().compare_and_delete(key, expected_mod_revision)

    def lease_revoke(self, lease_id: int) -> None:
        self.applied.append(f"lease_revoke {lease_id}")
        super().lease_revoke(lease_id)


@contextlib.asynccontextmanager
async def _answer_dropping_proxy(port: int) -> AsyncIterator[tuple[str, asyncio.Event]]:
    """A TCP proxy on 127.0.0.1 to a server on ``port``, whatever the protocol on top; yields
    (url, drop). While ``drop`` is set, the next bytes the server sends (the answer to the
    request just made) are thrown away and the client's connection is cut: the request was
    applied, and the client never hears so."""
    drop = asyncio.Event()

    async def pump(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answers: bool
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if answers and drop.is_set():
                    drop.clear()
                    break
                writer.write(data)
                await writer.drain()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        legs = [
            asyncio.ensure_future(pump(reader, up_writer, answers=False)),
            asyncio.ensure_future(pump(up_reader, writer, answers=True)),
        ]
        try:
            await asyncio.wait(legs, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for leg in legs:
                leg.cancel()
            await asyncio.gather(*legs, return_exceptions=True)
            writer.transport.abort()
            up_writer.transport.abort()

    async with loopback_server(handle) as proxy_port:
        yield f"http://127.0.0.1:{proxy_port}", drop


@pytest.mark.asyncio
async def test_compare_and_delete_and_lease_revoke_lost_after_sending_are_not_resent() -> None:
    """A write whose answer is lost with the connection is WriteOutcomeUnknownError, and the
    server applied it once: the client did not send it again (on a new connection or a resumed
    session). Seen at the real server's engine, so it holds whatever the client's transport."""
    engine = _CountingEngine()
    async with (
        HttpStoreServer(port=0, engine=engine) as server,
        _answer_dropping_proxy(server.port) as (url, drop),
        open_store(url, read_retries=2, timeout=10) as store,
    ):
        revision = engine.put("k", b"v")
        lease = engine.lease_grant(60)  # not tied to the client's connection or session
        await store.get("k")  # connected: the next answer is the write's
        writes: dict[str, Callable[[], Awaitable[object]]] = {
            "compare_and_delete k": lambda: store.compare_and_delete("k", revision),
            f"lease_revoke {lease.id}": lambda: store.lease_revoke(lease.id),
        }
        for applied, write in writes.items():
            drop.set()
            with pytest.raises(WriteOutcomeUnknownError, match="may or may not"):
                await asyncio.wait_for(write(), 20)
            assert not drop.is_set()  # the server did answer (the proxy dropped it)
            await store.get("k")  # the client carries on (and has had time to resend)
            assert engine.applied == [applied]  # applied once: not sent again
            engine.applied.clear()
        assert engine.get("k") is None
        assert lease.id not in [status.id for status in engine.leases()]


@contextlib.asynccontextmanager
async def _silent_aiohttp_server() -> AsyncIterator[tuple[str, list[str], asyncio.Event]]:
    """A real aiohttp server on 127.0.0.1 that reads every request and never answers; yields
    (url, the requests it received as "METHOD path", an event set at each arrival)."""
    received: list[str] = []
    arrived = asyncio.Event()
    release = asyncio.Event()

    async def never_answer(request: aiohttp.web.Request) -> aiohttp.web.Response:
        await request.read()
        received.append(f"{request.method} {request.path}")
        arrived.set()
        await release.wait()
        return aiohttp.web.Response(status=503)

    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", never_answer)
    runner = aiohttp.web.AppRunner(app, access_log=None, shutdown_timeout=1)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", received, arrived
    finally:
        release.set()
        await runner.cleanup()


@pytest.mark.asyncio
async def test_a_write_with_no_answer_before_the_deadline_is_a_write_timeout() -> None:
    async with fake_session_server(_never_answer) as (url, seen):
        async with open_store(url, timeout=0.3, read_retries=2) as store:
            writes = {
                "put": store.put("k", b"v"),
                "delete": store.delete("k"),
                "cas": store.compare_and_swap("c", 3, b"v"),
                "add": store.add("n"),
                "lease_grant": store.lease_grant(5),
                "lease_revoke": store.lease_revoke(7),
            }
            for op, write in writes.items():
                before = len(seen.ops)
                with pytest.raises(WriteTimeoutError, match="may or may not have applied") as info:
                    await asyncio.wait_for(write, 10)
                # a deadline with an unknown outcome: callers can tell it from a lost connection
                assert isinstance(info.value, WriteOutcomeUnknownError)
                assert isinstance(info.value, StoreTimeoutError)
                assert "0.3s deadline" in str(info.value)
                assert seen.ops[before:] == [op]  # sent once, never retried
            for read in (store.get("k"), store.lease_keep_alive(7)):
                before = len(seen.ops)
                with pytest.raises(StoreTimeoutError) as read_info:
                    await asyncio.wait_for(read, 10)
                assert not isinstance(read_info.value, WriteOutcomeUnknownError)
                assert len(seen.ops) == before + 1
        # A write that could not be sent before its deadline (here: waiting for the one request
        # slot, held by a read that the server never answers) stays a StoreConnectionError:
        # nothing was sent, so its outcome is known (not applied).
        async with open_store(url, timeout=0.3, max_connections=1) as single:
            assert isinstance(single, HttpStore)
            single.session.request_timeout = 30.0
            seen.arrived.clear()
            hung = asyncio.ensure_future(single.get("slow"))
            await asyncio.wait_for(seen.arrived.wait(), 10)  # it holds the one slot now
            single.session.request_timeout = 0.3
            with pytest.raises(StoreConnectionError) as connect_info:
                await asyncio.wait_for(single.put("k", b"v"), 10)
            assert not isinstance(connect_info.value, WriteOutcomeUnknownError)
            assert not isinstance(connect_info.value, StoreTimeoutError)
            hung.cancel()
            with pytest.raises(asyncio.CancelledError):
                await hung
            assert seen.ops[-1] == "get"  # the write was not sent


@pytest.mark.asyncio
async def test_a_watch_notices_a_dead_server_within_a_bounded_time() -> None:
    async def created_then_silence(peer: Peer, frame: list[Any]) -> None:
        if frame[2] == "watch":
            peer.send([RESULT, frame[1], [1, 0, None]])
        # a hung server: the socket stays open, nothing more comes

    async with (
        fake_session_server(created_then_silence) as (url, seen),
        open_store(url, progress_interval=0.1, reconnect_timeout=0.5) as store,
        store.watch("x") as events,
    ):
        started = time.monotonic()
        with pytest.raises(StoreConnectionError, match="no progress"):
            await events.__anext__()
        assert time.monotonic() - started < 5
        assert seen.connections >= 2  # it did reconnect, and still gave up


@pytest.mark.asyncio
async def test_a_server_that_answers_keeps_its_session_however_late_its_progress() -> None:
    # A loaded server (or client host) whose progress frames are held back but which still
    # answers requests: the watchdog asks it (a probe) before giving up, and keeps the session.
    async def answers_but_sends_no_progress(peer: Peer, frame: list[Any]) -> None:
        if frame[2] == "watch":
            peer.send([RESULT, frame[1], [1, 0, None]])
        elif frame[2] == "revision":
            peer.send([RESULT, frame[1], 1])

    async with (
        fake_session_server(answers_but_sends_no_progress) as (url, seen),
        open_store(url, progress_interval=0.25) as store,
        store.watch("x") as events,
    ):
        assert isinstance(store, HttpStore)
        conn = store.session._conn
        await asyncio.sleep(3.0)  # four times the 0.75 s of silence
        assert seen.connections == 1
        assert store.session._conn is conn
        assert conn is not None
        assert not conn.lost
        assert seen.ops.count("revision") >= 2  # it asked, more than once
        assert all(f[3] == [] for f in seen.frames if f[2] == "revision")
        assert events.start_revision == 1


@pytest.mark.asyncio
async def test_a_resume_refused_for_good_fails_the_watches_at_once() -> None:
    refused = raw_answer(401, b'{"error": "unauthorized", "message": "token revoked"}')

    async def created_then_hang_up(peer: Peer, frame: list[Any]) -> str | None:
        if frame[2] == "watch":
            peer.send([RESULT, frame[1], [1, 0, None]])
            await asyncio.sleep(0.05)
            return "hang up"
        return None

    async with (
        fake_session_server(created_then_hang_up, refuse=lambda n: refused if n > 1 else None) as (
            url,
            seen,
        ),
        open_store(url, progress_interval=5.0, reconnect_timeout=30) as store,
        store.watch("x") as events,
    ):
        started = time.monotonic()
        with pytest.raises(StoreConnectionError) as info:
            await asyncio.wait_for(events.__anext__(), 20)
        assert time.monotonic() - started < 10  # not tried until reconnect_timeout
    assert seen.connections == 2
    assert str(info.value) == (
        f"watch 'x': the session to {url} was lost and not resumed within 30s: "
        f"{url}: the server refused the token (HTTP 401: token revoked)"
    )


@pytest.mark.asyncio
async def test_a_closed_watch_is_unwatched_on_the_server_by_its_id() -> None:
    async def watches(peer: Peer, frame: list[Any]) -> None:
        if frame[2] == "watch":
            peer.send([RESULT, frame[1], [1, 0, None]])
        elif frame[2] == "unwatch":
            peer.send([RESULT, frame[1], None])

    async with (
        fake_session_server(watches) as (url, seen),
        open_store(url, progress_interval=5.0) as store,
    ):
        async with store.watch("x"), store.watch("y"):
            pass
        await eventually(lambda: seen.ops.count("unwatch") == 2, 10, "both watches unwatched")
        opened = [f[1] for f in seen.frames if f[2] == "watch"]
        closed = [f[3] for f in seen.frames if f[2] == "unwatch"]
        assert sorted(closed) == sorted([rid] for rid in opened)
        assert len(set(opened)) == 2


@pytest.mark.asyncio
async def test_a_server_that_answers_nothing_is_still_given_up_after_one_probe() -> None:
    # Silence for 3 progress intervals, then a probe unanswered for one more: the connection
    # ends then (not before), and the session dials again.
    async def created_then_nothing(peer: Peer, frame: list[Any]) -> None:
        if frame[2] == "watch":
            peer.send([RESULT, frame[1], [1, 0, None]])

    async with (
        fake_session_server(created_then_nothing) as (url, seen),
        open_store(url, progress_interval=0.1, reconnect_timeout=30) as store,
        store.watch("x"),
    ):
        assert isinstance(store, HttpStore)
        conn = store.session._conn
        assert conn is not None
        quiet_from = conn.last_received  # (loop time) the watch's answer, the last message
        await asyncio.wait_for(conn.closed, 10)
        ended = conn.loop.time() - quiet_from
        assert 0.39 <= ended < 5  # 0.3 s of silence + 0.1 s for the probe's answer
        assert "nor an answer to a probe within 0.1s" in conn.reason
        assert seen.ops.count("revision") == 1


@pytest.mark.asyncio
async def test_silence_before_a_connection_has_watches_does_not_end_it() -> None:
    # The connection's watchdog counts silence only while it has watches: a store idle for
    # longer than 3 progress intervals, then opening a watch the server is slow to confirm,
    # keeps its connection (the silence since the watch began is under the bound).
    async def slow_then_progress(peer: Peer, frame: list[Any]) -> None:
        if frame[2] == "watch":
            await asyncio.sleep(0.2)
            peer.send([RESULT, frame[1], [1, 0, None]])
            for _ in range(40):
                await asyncio.sleep(0.05)
                peer.send([PROGRESS, frame[1], 0])

    async with (
        fake_session_server(slow_then_progress) as (url, seen),
        open_store(url, progress_interval=0.1) as store,
    ):
        assert isinstance(store, HttpStore)
        await store.session.connection()
        await asyncio.sleep(0.5)  # idle, no watches: longer than the 0.3 s bound
        async with store.watch("x") as events:
            await events.start()
            await asyncio.sleep(0.5)
        assert seen.connections == 1


@pytest.mark.asyncio
async def test_a_lone_write_held_up_by_back_pressure_still_meets_its_deadline() -> None:
    # A server that stops reading: the socket buffers fill, and a lone request (written by its
    # caller, not the writer task) waits for the transport to drain; its deadline still ends it.
    async def stop_reading(peer: Peer, frame: list[Any]) -> None:
        await asyncio.sleep(60)

    async with (
        fake_session_server(stop_reading) as (url, seen),
        open_store(url, timeout=0.2) as store,
    ):
        big = b"x" * (900 << 10)  # under the fake server's message bound
        after_reconnect = 0
        for _ in range(60):  # until the socket buffers are full: a few times 10 MiB
            started = time.monotonic()
            with pytest.raises(WriteTimeoutError, match="may or may not have applied"):
                await asyncio.wait_for(store.put("big", big), 10)
            assert time.monotonic() - started < 5
            if seen.connections > 1:
                # the blocked write ended its connection (aiohttp leaves the drain waiter
                # cancelled); the next one goes on a new connection, as any request would
                after_reconnect += 1
                if after_reconnect == 3:
                    break
        assert after_reconnect == 3


@pytest.mark.asyncio
async def test_watch_resumes_after_a_server_restart_without_loss_or_repeats() -> None:
    engine = MemoryEngine()
    port = free_port()
    server = HttpStoreServer(port=port, engine=engine)
    await server.start()
    try:
        async with (
            open_store(server.url, progress_interval=0.2, reconnect_timeout=20) as store,
            store.watch("w/") as events,
        ):
            await store.put("w/1", b"1")
            first = await events.__anext__()
            assert first.kv.key == "w/1"
            await server.stop()  # graceful: the stream ends with a closing frame
            # Changes made while the server is down (straight into the engine)
            engine.put("w/2", b"2")
            engine.put("other", b"x")
            engine.delete("w/", prefix=True)  # deletes w/1 and w/2 at one revision
            server = HttpStoreServer(port=port, engine=engine)
            await server.start()
            await store.put("w/3", b"3")
            got = [await asyncio.wait_for(events.__anext__(), 10) for _ in range(4)]
            assert [(e.type, e.kv.key) for e in got] == [
                (EventType.PUT, "w/2"),
                (EventType.DELETE, "w/1"),
                (EventType.DELETE, "w/2"),
                (EventType.PUT, "w/3"),
            ]
            revisions = [first.revision] + [e.revision for e in got]
            assert revisions == sorted(revisions)
            assert isinstance(events, object)
            assert getattr(events, "reconnects", 0) >= 1
            await store.put("w/4", b"4")
            assert (await asyncio.wait_for(events.__anext__(), 10)).kv.key == "w/4"
    finally:
        await server.stop()


@pytest.mark.asyncio
async def test_watch_resuming_into_compacted_history_raises_compacted() -> None:
    engine = MemoryEngine()
    port = free_port()
    server = HttpStoreServer(port=port, engine=engine)
    await server.start()
    try:
        async with (
            open_store(server.url, progress_interval=0.2, reconnect_timeout=20) as store,
            store.watch("c/") as events,
        ):
            await server.stop()
            engine.put("c/1", b"1")
            engine.put("c/2", b"2")
            engine.compact(engine.revision)
            server = HttpStoreServer(port=port, engine=engine)
            await server.start()
            with pytest.raises(CompactedError) as info:
                await asyncio.wait_for(events.__anext__(), 10)
            assert info.value.compact_revision == engine.revision
    finally:
        await server.stop()


@pytest.mark.asyncio
async def test_lease_keep_alives_ride_the_one_session_connection() -> None:
    async with HttpStoreServer(port=0) as server:
        async with open_store(server.url) as store:
            grant = await store.lease_grant(10)
            for _ in range(30):
                await store.lease_keep_alive(grant.id)
            async with aiohttp.ClientSession() as session:
                metrics = await (await session.get(f"{server.url}/metrics")).text()
        line = next(x for x in metrics.splitlines() if x.startswith("aioelastic_connections "))
        assert float(line.split()[1]) == 2.0  # the store's session + this scrape


@pytest.mark.asyncio
async def test_open_store_options_are_checked() -> None:
    with pytest.raises(TypeError, match="unknown option"):
        await open_store("http://127.0.0.1:1", bogus=1)
    with pytest.raises(ValueError, match="query"):
        await open_store("http://127.0.0.1:1/?token=x")
    with pytest.raises(ValueError, match="credentials"):
        await open_store("http://user:secret@127.0.0.1:1")
    with pytest.raises(ValueError, match="port"):
        await open_store("http://127.0.0.1:99999")
    with pytest.raises(ValueError, match="https"):
        await open_store("http://127.0.0.1:1", cafile="/nonexistent")
    with pytest.raises(ValueError, match="token"):
        await open_store("http://127.0.0.1:1", token_file="/nonexistent/token")
    with pytest.raises(ValueError, match="progress_interval"):
        await open_store("http://127.0.0.1:1", progress_interval=0)
    store = await open_store("https://127.0.0.1:1/prefix", verify=False)
    assert isinstance(store, HttpStore)
    assert store.url == "https://127.0.0.1:1/prefix"
    await store.aclose()


@pytest.mark.asyncio
async def test_closing_the_store_while_a_watch_reconnects_raises_closed() -> None:
    port = free_port()
    server = HttpStoreServer(port=port)
    await server.start()
    store = await open_store(server.url, progress_interval=0.2, reconnect_timeout=30)
    try:
        watch = store.watch("r/")
        await watch.start()
        await server.stop()  # the watch now retries in the background of __anext__
        pending = asyncio.ensure_future(watch.__anext__())
        await asyncio.sleep(0.3)  # under test: meanwhile the watch retries, it does not end
        assert not pending.done()
        await store.aclose()
        with pytest.raises(StoreClosedError):
            await asyncio.wait_for(pending, 5)
    finally:
        await store.aclose()
        await server.stop()


@pytest.mark.asyncio
async def test_a_kept_lease_survives_a_quick_server_restart(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "data")
    port = free_port()
    server = HttpStoreServer(port=port, data_dir=data_dir)
    await server.start()
    try:
        async with (
            open_store(server.url, read_retries=0) as store,
            store.lease(3.0, keep_alive_interval=0.3) as keeper,
        ):
            assert isinstance(store, HttpStore)
            await store.put("held", b"1", lease=keeper.id)
            await server.stop()
            await asyncio.sleep(0.5)  # the outage under test: keep-alives fail meanwhile
            server = HttpStoreServer(port=port, data_dir=data_dir)
            await server.start()
            restarted = asyncio.get_running_loop().time()
            # under test: the lease outlives the restart and is renewed again, within its 3 s
            # TTL (a reconnection's backoff may take a loaded host past a fixed 1 s pause)
            await eventually(
                lambda: keeper.lost or keeper.statistics().last_renewal > restarted,
                2.0,
                "no renewal within 2 s of the restart",
            )
            assert not keeper.lost
            # the keep-alives meanwhile waited for the server (connecting with backoff)
            assert store.session.connect_retries >= 1 or keeper.statistics().failed_renewals >= 1
            assert (await store.get("held")) is not None
            status = await store.lease_time_to_live(keeper.id)
            assert status.keys == ("held",)
        assert server.engine.lease_count == 0  # revoked on exit
    finally:
        await server.stop()


# -- the session's wire ----------------------------------------------------------------------


def test_the_client_runs_on_uvloop() -> None:
    uvloop = pytest.importorskip("uvloop")

    async def main() -> None:
        async with HttpStoreServer(port=0) as server, open_store(server.url) as store:
            assert await store.put("u/1", b"one") == 1
            kv = await store.get("u/1")
            assert kv is not None
            assert kv.value == b"one"
            assert (await store.compare_and_swap("u/1", 1, b"two")).succeeded
            async with store.watch("u/", start_revision=1) as events:
                assert (await events.__anext__()).kv.value == b"one"
                assert (await events.__anext__()).kv.value == b"two"

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


@pytest.mark.asyncio
async def test_a_malformed_answer_is_a_connection_error() -> None:
    async def garbage(peer: Peer, frame: list[Any]) -> None:
        peer.send_raw(message_header(12) + b"\xc1 SMTP ready")  # 0xc1: never used by msgpack

    async with (
        fake_session_server(garbage) as (url, _),
        open_store(url, read_retries=0) as store,
    ):
        with pytest.raises(StoreConnectionError, match="malformed") as info:
            await store.get("k")
        assert not isinstance(info.value, WriteOutcomeUnknownError)
        with pytest.raises(WriteOutcomeUnknownError, match="malformed"):
            await store.put("k", b"v")


@pytest.mark.asyncio
async def test_pipelined_requests_go_in_one_message_with_the_token_at_the_upgrade() -> None:
    async def answer(peer: Peer, frame: list[Any]) -> None:
        peer.send([RESULT, frame[1], None])

    async with (
        fake_session_server(answer) as (url, seen),
        open_store(url, token="s3cret") as store,
    ):
        assert await asyncio.gather(*(store.get(f"k/{i}") for i in range(20))) == [None] * 20
    # all twenty waited for the session to open: one message once it is (on an open session
    # the first would go at once, the rest as one message: tests/test_http_client_conn.py)
    assert seen.messages == [20]
    assert seen.heads[0].startswith("GET /v1/session HTTP/1.1\r\n")
    assert seen.headers[0]["authorization"] == "Bearer s3cret"
    assert seen.headers[0]["upgrade"] == "aioelastic-session/1"
    assert seen.headers[0]["connection"] == "Upgrade"
    with pytest.raises(ValueError, match="token"):
        HttpStore(url, token="bad\r\nX-Injected: 1")


@pytest.mark.asyncio
async def test_request_slots_go_to_waiters_in_order_and_none_is_lost_to_a_cancel() -> None:
    slots = _Slots(1)
    assert slots.try_take()
    assert not slots.try_take()
    got: list[int] = []

    async def wait(n: int) -> None:
        await slots.take()
        got.append(n)

    waiters = [asyncio.ensure_future(wait(n)) for n in range(4)]
    await asyncio.sleep(0)
    waiters[1].cancel()  # gives up while waiting: skipped
    slots.give()  # to waiter 0...
    waiters[0].cancel()  # ...cancelled before it ran: the slot passes on to waiter 2
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert got == [2]
    assert not slots.try_take()  # waiter 2 holds it
    slots.give()
    await asyncio.sleep(0)
    assert got == [2, 3]
    slots.give()
    assert slots.free == 1  # every slot came back
    assert slots.try_take()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert [type(r) for r in results[:2]] == [asyncio.CancelledError] * 2


async def _take(slots: _Slots, got: list[int], n: int) -> None:
    await slots.take()
    got.append(n)


async def _two_waiting() -> tuple[_Slots, list[int], asyncio.Future[None], asyncio.Future[None]]:
    """One slot, taken; two callers waiting for it, in order (each appends its number once
    it has a slot)."""
    slots, got = _Slots(1), list[int]()
    assert slots.try_take()
    first = asyncio.ensure_future(_take(slots, got, 0))
    second = asyncio.ensure_future(_take(slots, got, 1))
    await asyncio.sleep(0)
    return slots, got, first, second


@pytest.mark.asyncio
async def test_a_waiter_that_gives_up_takes_no_slot_and_leaves_the_queue() -> None:
    slots, got, quitter, patient = await _two_waiting()
    quitter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await quitter
    await asyncio.sleep(0)
    assert got == []  # giving up handed nobody a slot
    assert len(slots._waiters) == 1  # the patient one's: the quitter's left the queue
    slots.give()
    await patient
    assert (got, slots.free, len(slots._waiters)) == ([1], 0, 0)


@pytest.mark.asyncio
async def test_a_waiter_cancelled_after_the_queue_skipped_it_ends_cancelled() -> None:
    slots, got, quitter, patient = await _two_waiting()
    quitter.cancel()
    slots.give()  # before the quitter ran: the queue skips it, the slot goes to the next
    with pytest.raises(asyncio.CancelledError):
        await quitter
    await patient
    assert (got, slots.free, len(slots._waiters)) == ([1], 0, 0)


@pytest.mark.asyncio
async def test_a_waiter_cancelled_once_handed_a_slot_passes_it_on() -> None:
    slots, got, handed, patient = await _two_waiting()
    slots.give()  # to the first waiter...
    handed.cancel()  # ...cancelled before it ran
    with pytest.raises(asyncio.CancelledError):
        await handed
    await patient
    assert (got, slots.free) == ([1], 0)
    slots.give()
    assert slots.free == 1  # the one slot, not lost and not doubled


@pytest.mark.asyncio
async def test_max_connections_bounds_requests_in_flight() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        HttpStore("http://127.0.0.1:1", max_connections=-1)
    async with (
        fake_session_server(_never_answer) as (url, seen),
        open_store(url, max_connections=2, timeout=0.5, read_retries=0) as store,
    ):
        results = await asyncio.gather(
            *(store.get(f"m/{i}") for i in range(5)), return_exceptions=True
        )
        assert all(isinstance(r, StoreError) for r in results)
        assert seen.ops.count("get") <= 4  # 2 in flight at once, then 2 more (in 0.5 s each)


def test_request_ids_count_up_and_wrap_to_1_after_2_to_the_62() -> None:
    session = HttpStore("http://127.0.0.1:1").session
    session._next_id = 200
    assert [session._take_id() for _ in range(2)] == [200, 201]
    session._next_id = 2**62 - 1
    assert [session._take_id() for _ in range(4)] == [2**62 - 1, 2**62, 1, 2]


@pytest.mark.asyncio
async def test_an_unanswered_probe_or_unwatch_is_not_reported_as_never_retrieved() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        for end in ("fail", "cancel"):
            future = loop.create_future()
            future.add_done_callback(_retrieve)
            if end == "fail":
                future.set_exception(ConnectionLost("the connection ended"))
            else:
                future.cancel()
            await asyncio.sleep(0)  # its callbacks run
            del future  # (freed here: an unretrieved exception is reported now)
            gc.collect()
    finally:
        loop.set_exception_handler(handler)
    assert reported == []


@pytest.mark.asyncio
async def test_a_store_that_does_not_answer_is_said_once_per_url_not_once_per_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    with caplog.at_level(logging.WARNING, logger="aioelastic.store.http"):
        for url in (urls[0], urls[0], urls[1]):
            async with open_store(url, read_retries=0, timeout=0.3) as store:
                with pytest.raises(StoreConnectionError):
                    await store.get("k")
    said = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
    assert [s.split()[3] for s in said] == urls  # "the store at URL does not answer"
    assert said[0].endswith("retrying with backoff for up to 0.3 s")


def test_a_retry_waits_50_ms_then_doubles() -> None:
    assert [retry_pause(attempt) for attempt in (1, 2, 3, 4)] == [0.05, 0.1, 0.2, 0.4]


@pytest.mark.asyncio
async def test_a_call_not_connected_is_dialled_again_only_if_it_is_a_read() -> None:
    gone = raw_answer(404, b'{"error": "not_found", "message": "no route"}')
    async with (
        fake_session_server(refuse=lambda _: gone) as (url, seen),
        open_store(url, read_retries=2, timeout=10) as store,
    ):
        with pytest.raises(StoreConnectionError, match="has no session endpoint"):
            await store.get("k")
        assert seen.connections == 3  # a read: tried 1 + read_retries times
        with pytest.raises(StoreConnectionError, match="has no session endpoint") as info:
            await store.put("k", b"v")
        assert seen.connections == 4  # a write: once (not sent: its outcome is known)
        assert not isinstance(info.value, WriteOutcomeUnknownError)


@pytest.mark.asyncio
async def test_each_error_of_a_call_names_the_call_and_its_key() -> None:
    async def answers(peer: Peer, frame: list[Any]) -> str | None:
        if frame[2] == "put":
            peer.send([ERROR, frame[1], "value_too_large", "value over 9 bytes", None])
        elif frame[2] == "delete":
            return "hang up"
        return None  # a get: never answered

    async with (
        fake_session_server(answers) as (url, _),
        open_store(url, read_retries=0, timeout=0.3) as store,
    ):
        with pytest.raises(StoreError) as refused:
            await store.put("a/b", b"0123456789")
        assert str(refused.value) == "put 'a/b': value over 9 bytes"
        with pytest.raises(StoreTimeoutError) as late:
            await store.get("a/b")
        assert str(late.value) == f"get 'a/b' timed out ({url})"
        with pytest.raises(WriteOutcomeUnknownError) as lost:
            await store.delete("a/b")
        said = re.escape(f"delete 'a/b': the session to {url} was lost after the request was sent")
        why = r"the connection ended|ConnectionResetError: [^()]*"  # (a FIN or a reset first)
        assert re.fullmatch(rf"{said} \(({why})\); it may or may not have applied", str(lost.value))


@pytest.mark.asyncio
async def test_closing_the_store_fails_its_watches_and_calls_in_flight_saying_so() -> None:
    async def watches_only(peer: Peer, frame: list[Any]) -> None:
        if frame[2] == "watch":
            peer.send([RESULT, frame[1], [1, 0, None]])
        # a get: never answered

    async with fake_session_server(watches_only) as (url, seen):
        store = await open_store(url, progress_interval=5.0)
        events = store.watch("x")
        await events.start()
        get = asyncio.ensure_future(store.get("k"))
        await eventually(lambda: "get" in seen.ops, 10, "the get was sent")
        started = time.monotonic()
        await store.aclose()
        assert time.monotonic() - started < 1.5  # it waits a second at most for the FIN
        with pytest.raises(StoreClosedError) as during:
            await get
        assert str(during.value) == "the store was closed during get 'k'"
        with pytest.raises(StoreClosedError) as watched:
            await events.__anext__()
        assert str(watched.value) == f"the store of {url} was closed"
        with pytest.raises(StoreClosedError):
            await store.get("k")  # (the store's own check: "HttpStore is closed")
