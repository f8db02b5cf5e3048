"""The server's raw session transport (``Upgrade: aioelastic-session/1`` on ``/v1/session``) on
real sockets, driven by hand (``helpers.session_wire``): the upgrade and its refusals, batches
answered in one message, connection-level errors as a last error frame then the end of the
connection, too slow, replaced, grace and revoke on FIN and RST, the connection accounting, TLS
and uvloop, and the shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from helpers.http import self_signed_cert
from helpers.session_wire import UpgradeRefused, session_wire, upgrade_answer
from helpers.waiting import eventually

from aioelastic.store import open_store
from aioelastic.store.http._app import SESSIONS
from aioelastic.store.http._frames import (
    ERROR,
    EVENTS,
    REQUEST,
    RESULT,
    WATCH_END,
    decode_events,
    pack,
    unpack_all,
)
from aioelastic.store.http._session_server import SessionHub
from aioelastic.store.http._session_stream import UPGRADE, message_header
from aioelastic.store.http.server import HttpStoreServer

LOOPS = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])


def _hub(server: HttpStoreServer) -> SessionHub:
    app = server._app
    assert app is not None
    return app[SESSIONS]


def _run(loop: str, coro: Any) -> Any:
    factory = importlib.import_module("uvloop").new_event_loop if loop == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


async def _no_sessions(server: HttpStoreServer) -> None:
    """The server counts no session (a connection's end is a callback away)."""
    await eventually(lambda: server.statistics()["sessions"] == 0, 10, "the sessions ended")


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[tuple[ssl.SSLContext, ssl.SSLContext]]:
    pytest.importorskip("cryptography")
    with self_signed_cert(tmp_path) as (cert, key):
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(cert, key)
        yield server, ssl.create_default_context(cafile=str(cert))


# -- the upgrade ----------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("secure", [False, True], ids=["tcp", "tls"])
def test_a_batch_is_answered_in_one_message_on_both_loops_with_and_without_tls(
    loop: str, secure: bool, tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    async def main() -> None:
        async with HttpStoreServer(
            port=0, token="sekrit", ssl_context=tls[0] if secure else None
        ) as server:
            async with session_wire(
                server.url, token="sekrit", tls=tls[1] if secure else None
            ) as wire:
                welcome = await wire.hello()
                assert welcome["version"] == 1
                assert welcome["resumed"] is False
                await wire.send(
                    [
                        [REQUEST, 1, "put", ["a", b"1", 0]],
                        [REQUEST, 2, "get", ["a"]],
                        [REQUEST, 3, "get", ["missing"]],
                    ]
                )
                frames = await wire.recv()  # the three answers: one message
                assert [f[:2] for f in frames] == [[RESULT, 1], [RESULT, 2], [RESULT, 3]]
                assert frames[1][2][1] == b"1"
                assert frames[2][2] is None
                assert server.statistics()["sessions"] == 1
            await _no_sessions(server)

    _run(loop, main())


@pytest.mark.asyncio
async def test_the_upgrade_needs_the_token_and_names_its_protocol_when_refused() -> None:
    async with HttpStoreServer(port=0, token="sekrit") as server:
        with pytest.raises(UpgradeRefused) as refused:
            async with session_wire(server.url):
                pass
        assert refused.value.status == 401
        assert refused.value.json()["error"] == "unauthorized"
        for upgrade, connection in (
            ("", "keep-alive"),
            ("h2c", "Upgrade"),
            ("aioelastic-session/2", "Upgrade"),
            (UPGRADE, "keep-alive"),  # an Upgrade header without "Connection: Upgrade"
        ):
            status, headers, body = await upgrade_answer(
                server.url, upgrade, token="sekrit", connection=connection
            )
            assert status == 426, (upgrade, status)
            assert headers["upgrade"] == UPGRADE
            answer = json.loads(body)
            assert answer["error"] == "upgrade_required"
            assert UPGRADE in answer["message"]
            assert answer["upgrade"] == UPGRADE


@pytest.mark.asyncio
async def test_an_old_or_unknown_protocol_version_gets_an_error_frame_then_the_end() -> None:
    async with HttpStoreServer(port=0) as server:
        for versions in ([0], [99, 100], "one"):
            async with session_wire(server.url) as wire:
                await wire.send([[REQUEST, 0, "hello", {"versions": versions}]])
                [frame] = await wire.recv()
                assert frame[:3] == [ERROR, 0, "unsupported_version"]
                assert "versions [1, 2]" in frame[3]
                assert frame[4] == {"supported": [1, 2]}
                assert await wire.closed()
        async with session_wire(server.url) as wire:  # not a hello at all
            await wire.send([[REQUEST, 1, "get", ["x"]]])
            [frame] = await wire.recv()
            assert frame[:3] == [ERROR, 0, "bad_hello"]
            assert await wire.closed()
        async with session_wire(server.url) as wire:  # not even msgpack
            await wire.send_raw(message_header(5) + b"GET /")
            [frame] = await wire.recv()
            assert frame[:3] == [ERROR, 0, "bad_hello"]
            assert await wire.closed()
        _hub(server).hello_timeout = 0.2
        async with session_wire(server.url) as wire:  # no hello at all
            [frame] = await wire.recv()
            assert frame[:3] == [ERROR, 0, "hello_timeout"]
            assert await wire.closed()
        assert server.statistics()["sessions"] == 0


@pytest.mark.asyncio
async def test_invalid_frames_get_a_clear_error_never_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with HttpStoreServer(port=0) as server:
        async with session_wire(server.url) as wire:
            await wire.hello()
            # a well-formed frame with bad arguments or an unknown op: an error, and it goes on
            await wire.send(
                [
                    [REQUEST, 1, "put", ["k"]],
                    [REQUEST, 2, "nope", []],
                    [REQUEST, 3, "get", [7]],
                    [REQUEST, 4, "put", ["k", "text, not bytes", 0]],
                    [REQUEST, 5, "get", ["k"]],
                ]
            )
            frames = await wire.recv()
            assert [f[:3] for f in frames] == [
                [ERROR, 1, "bad_request"],
                [ERROR, 2, "unknown_op"],
                [ERROR, 3, "bad_request"],
                [ERROR, 4, "bad_request"],
                [RESULT, 5, None],
            ]
            assert "put takes 3 argument(s)" in frames[0][3]
            # bytes that are not frames: the error frame as the last message, then the end
            await wire.send_raw(message_header(13) + b"\xc1\xc1 not msgpack")
            [frame] = await wire.recv()
            assert frame[:3] == [ERROR, 0, "bad_frame"]
            assert await wire.closed()
        assert server.engine.get("k") is None  # nothing was written
        async with open_store(server.url) as store:  # the server is fine
            assert await store.put("k", b"v") >= 1
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


@pytest.mark.asyncio
async def test_a_message_that_ends_inside_a_frame_is_a_bad_frame_after_its_whole_frames() -> None:
    async with HttpStoreServer(port=0) as server:
        # a lone truncated frame, and one behind a whole frame (answered: it came first)
        for body, answered in (
            (pack([REQUEST, 1, "put", ["t", b"v", 0]])[:-1], []),
            (pack([REQUEST, 2, "get", ["t"]]) + pack([REQUEST, 3, "get", ["t"]])[:-2], [2]),
        ):
            async with session_wire(server.url) as wire:
                await wire.hello()
                await wire.send_raw(message_header(len(body)) + body)
                if answered:
                    frames = await wire.recv()
                    assert [f[1] for f in frames if f[0] == RESULT] == answered
                [frame] = await wire.recv()  # the error: a message of its own, the last
                assert frame[:3] == [ERROR, 0, "bad_frame"]
                assert "ends inside a frame" in frame[3] or "incomplete" in frame[3]
                assert await wire.closed()
        assert server.engine.get("t") is None  # the cut-off put was not applied


@pytest.mark.asyncio
async def test_a_bad_message_length_is_a_bad_frame() -> None:
    async with HttpStoreServer(port=0, max_value_bytes=1000, max_key_bytes=100) as server:
        limit = _hub(server).max_message_bytes
        for header in (message_header(0), message_header(limit + 1)):
            async with session_wire(server.url) as wire:
                await wire.hello()
                await wire.send_raw(header + b"x" * 8)
                [frame] = await wire.recv()
                assert frame[:3] == [ERROR, 0, "bad_frame"]
                assert f"the limit is 1 to {limit}" in frame[3]
                assert await wire.closed()
        async with session_wire(server.url) as wire:  # a whole message before it is answered
            await wire.hello()
            body = pack([REQUEST, 1, "put", ["before", b"1", 0]])
            await wire.send_raw(message_header(len(body)) + body + message_header(0))
            [answer] = await wire.recv()
            assert answer[:2] == [RESULT, 1]
            [frame] = await wire.recv()
            assert frame[:3] == [ERROR, 0, "bad_frame"]
            assert await wire.closed()
        assert server.engine.get("before") is not None
        async with session_wire(server.url) as wire:  # before the hello too
            await wire.send_raw(message_header(0))
            [frame] = await wire.recv()
            assert frame[:3] == [ERROR, 0, "bad_frame"]
            assert await wire.closed()


@pytest.mark.asyncio
async def test_messages_cut_anywhere_by_the_reads_are_answered_whole() -> None:
    async with HttpStoreServer(port=0) as server, session_wire(server.url) as wire:
        await wire.hello()
        body = pack([REQUEST, 1, "put", ["cut", b"v" * 300, 0]])
        body += pack([REQUEST, 2, "get", ["cut"]])
        data = message_header(len(body)) + body
        for at in range(0, len(data), 7):  # seven bytes a write (TCP_NODELAY: small segments)
            await wire.send_raw(data[at : at + 7])
        frames = await wire.recv()
        assert [f[:2] for f in frames] == [[RESULT, 1], [RESULT, 2]]
        assert frames[1][2][1] == b"v" * 300


# -- watches, too slow, replaced ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_watch_gets_its_events_after_its_created_answer() -> None:
    async with (
        HttpStoreServer(port=0) as server,
        session_wire(server.url) as watcher,
        session_wire(server.url) as writer,
    ):
        await watcher.hello()
        await writer.hello()
        await watcher.send([[REQUEST, 7, "watch", ["w/", None, False]]])
        [created] = await watcher.recv()
        assert created[:2] == [RESULT, 7]
        await writer.send([[REQUEST, 1, "put", ["w/a", b"x", 0]]])
        [put] = await writer.recv()
        [events] = await watcher.recv()
        assert events[:2] == [EVENTS, 7]
        [event] = decode_events(events[2])
        assert event.kv.key == "w/a"
        assert event.revision == put[2]


@pytest.mark.asyncio
async def test_a_client_that_stops_reading_is_too_slow() -> None:
    async with HttpStoreServer(port=0, max_value_bytes=100_000) as server:
        _hub(server).max_outbox_bytes = 256 * 1024
        server.engine.put("big", b"b" * 100_000)
        async with session_wire(server.url) as wire:
            await wire.hello()
            frames = [[REQUEST, i, "get", ["big"]] for i in range(1, 21)]
            for _ in range(100):  # 200 MB of answers asked for, none read
                try:
                    await wire.send(frames)
                except ConnectionError:  # the server aborted the connection
                    break
                if server.statistics()["sessions"] == 0:
                    break
            await _no_sessions(server)
        assert server.statistics()["sessions"] == 0
        async with open_store(server.url) as store:  # the server goes on
            assert (await store.get("big")) is not None


@pytest.mark.asyncio
async def test_a_session_resumed_elsewhere_ends_its_old_connection_with_replaced() -> None:
    async with (
        HttpStoreServer(port=0) as server,
        session_wire(server.url) as old,
        session_wire(server.url) as new,
    ):
        welcome = await old.hello()
        await old.send([[REQUEST, 1, "lease_grant", [30]]])
        [[_, _, (lease, _)]] = await old.recv()
        again = await new.hello(resume=welcome["resume"])
        assert again["resumed"] is True
        assert again["session"] == welcome["session"]
        assert again["leases"] == [lease]
        [frame] = await old.recv()
        assert frame[:3] == [ERROR, 0, "replaced"]
        assert await old.closed()
        await asyncio.sleep(_hub(server).grace * 2)  # the old connection's end: no revoke
        assert server.engine.lease_count == 1
        assert server.statistics()["sessions"] == 1


# -- the end of a connection --------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["fin", "rst"])
async def test_a_connection_that_ends_revokes_its_leases_after_the_grace_and_counts_no_more(
    how: str,
) -> None:
    async with HttpStoreServer(port=0, session_grace=0.2, max_connections=2) as server:
        async with session_wire(server.url) as wire:
            await wire.hello()
            await wire.send([[REQUEST, 1, "lease_grant", [30]]])
            [[_, _, (lease, _)]] = await wire.recv()
            await wire.send([[REQUEST, 2, "put", ["held", b"1", lease]]])
            await wire.recv()
            revoked = asyncio.Event()
            server.engine.on_lease.append(lambda change: revoked.set())
            loop = asyncio.get_running_loop()
            ended = loop.time()
            if how == "rst":
                wire.reset()
            else:
                wire.writer.close()
            await asyncio.wait_for(revoked.wait(), 10)
            assert loop.time() - ended >= 0.15  # not before the grace
        assert server.engine.get("held") is None
        assert server.statistics()["sessions"] == 0
        runner_server = server._runner.server if server._runner else None
        assert runner_server is not None
        await eventually(lambda: not runner_server.connections, 10, "aiohttp forgot it")
        # the connection budget too: twice as many sessions as max_connections, one by one
        for _ in range(4):
            async with session_wire(server.url) as wire:
                await wire.hello()
            await eventually(lambda: not runner_server.connections, 10, "aiohttp forgot it")
        async with (  # and /metrics says so
            aiohttp.ClientSession() as http,
            http.get(f"{server.url}/metrics") as answer,
        ):
            text = await answer.text()
        assert "\naioelastic_sessions 0.0\n" in text
        assert "\naioelastic_connections 1.0\n" in text  # the /metrics request's own


@pytest.mark.asyncio
async def test_shutdown_ends_sessions_at_once_with_unavailable() -> None:
    server = HttpStoreServer(port=0, shutdown_timeout=30)
    await server.start()
    async with session_wire(server.url) as wire, session_wire(server.url) as silent:
        await wire.hello()
        await wire.send([[REQUEST, 3, "watch", ["w/", None, False]]])
        await wire.recv()
        loop = asyncio.get_running_loop()
        started = loop.time()
        closing = asyncio.ensure_future(server.aclose())
        [end] = await wire.recv()
        assert end[:3] == [WATCH_END, 3, "closing"]
        [frame] = await wire.recv()
        assert frame[:3] == [ERROR, 0, "unavailable"]
        assert await wire.closed()
        [frame] = await silent.recv()  # upgraded, no hello yet
        assert frame[:3] == [ERROR, 0, "unavailable"]
        assert await silent.closed()
        await asyncio.wait_for(closing, 10)
        assert loop.time() - started < 5  # not aiohttp's wait of its shutdown timeout


@pytest.mark.asyncio
async def test_an_idle_session_outlives_the_servers_read_deadline() -> None:
    async with (
        HttpStoreServer(port=0, read_timeout=0.2) as server,
        session_wire(server.url) as wire,
    ):
        await wire.hello()
        await asyncio.sleep(0.8)  # four read deadlines: no 408, no close
        await wire.send([[REQUEST, 1, "revision", []]])
        [answer] = await wire.recv()
        assert answer[:2] == [RESULT, 1]


@pytest.mark.asyncio
async def test_two_hundred_raw_sessions_at_once() -> None:
    async with HttpStoreServer(port=0) as server, contextlib.AsyncExitStack() as stack:
        wires = await asyncio.gather(
            *(stack.enter_async_context(session_wire(server.url)) for _ in range(200))
        )
        await asyncio.gather(*(wire.hello() for wire in wires))
        assert server.statistics()["sessions"] == 200
        await asyncio.gather(
            *(w.send([[REQUEST, 1, "put", [f"many/{i}", b"x", 0]]]) for i, w in enumerate(wires))
        )
        answers = await asyncio.gather(*(wire.recv() for wire in wires))
        assert sorted(frames[0][2] for frames in answers) == list(range(1, 201))
    assert server.statistics()["sessions"] == 0


@pytest.mark.asyncio
async def test_requests_sent_right_behind_the_hello_are_answered_after_the_welcome() -> None:
    async with HttpStoreServer(port=0) as server, session_wire(server.url) as wire:
        hello = pack([REQUEST, 0, "hello", {"versions": [1]}])
        get = pack([REQUEST, 1, "get", ["x"]]) + pack([REQUEST, 2, "revision", []])
        await wire.send_raw(message_header(len(hello)) + hello + message_header(len(get)) + get)
        [welcome] = await wire.recv()
        assert welcome[:2] == [RESULT, 0]
        assert [f[:2] for f in await wire.recv()] == [[RESULT, 1], [RESULT, 2]]


@pytest.mark.asyncio
async def test_a_websocket_upgrade_is_refused_with_a_clear_426() -> None:
    async with HttpStoreServer(port=0) as server:
        status, headers, body = await upgrade_answer(server.url, "websocket")
        assert status == 426
        assert headers["upgrade"] == UPGRADE
        answer = json.loads(body)
        assert answer["error"] == "upgrade_required"
        assert "older than the server" in answer["message"]
        async with aiohttp.ClientSession() as http:  # what a client from before sees: no hang
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await asyncio.wait_for(http.ws_connect(f"{server.url}/v1/session"), 10)
        assert refused.value.status == 426


@pytest.mark.asyncio
async def test_a_session_over_max_connections_is_refused_503_and_its_slot_is_freed_after() -> None:
    async with HttpStoreServer(port=0, max_connections=1) as server:
        async with session_wire(server.url) as first:
            await first.hello()
            with pytest.raises(UpgradeRefused) as refused:
                async with session_wire(server.url):
                    pass
            assert refused.value.status == 503
            assert refused.value.json()["error"] == "too_many_connections"
        await _no_sessions(server)
        runner_server = server._runner.server if server._runner else None
        assert runner_server is not None
        await eventually(lambda: not runner_server.connections, 10, "aiohttp forgot them")
        async with session_wire(server.url) as again:  # the slot is free again
            assert (await again.hello())["resumed"] is False


class _Writes:
    """A transport's writes, recorded (and passed on)."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.calls: list[tuple[str, bytes]] = []

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))
        self._transport.write(data)

    def writelines(self, parts: list[bytes]) -> None:
        self.calls.append(("writelines", b"".join(parts)))
        self._transport.writelines(parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("size", "calls"), [(10, "write"), (8000, "writelines")], ids=["small", "large"]
)
async def test_an_events_frame_goes_out_in_one_transport_write_when_small(
    size: int, calls: str
) -> None:
    """An events frame is two parts (its watch's head, the blob it shares with other sessions):
    a small one is joined and written as one buffer, a large one handed on as its parts; the
    client reads the same message either way."""
    async with (
        HttpStoreServer(port=0) as server,
        session_wire(server.url) as watcher,
        session_wire(server.url) as writer,
    ):
        await watcher.hello()
        [raw] = [s for s in _hub(server).raw_sessions if s.connection is not None]
        writes = raw.transport = _Writes(raw.transport)
        await watcher.send([[REQUEST, 7, "watch", ["w/", None, False]]])
        [created] = await watcher.recv()
        assert created[:2] == [RESULT, 7]
        await writer.hello()
        writes.calls.clear()
        await writer.send([[REQUEST, 1, "put", ["w/a", b"x" * size, 0]]])
        await writer.recv()
        message = await watcher.recv_message()
        assert writes.calls == [(calls, message_header(len(message)) + message)]
        [frame] = list(unpack_all(message, max_len=1 << 30))
        assert frame[:2] == [EVENTS, 7]
        [event] = decode_events(frame[2])
        assert event.kv.value == b"x" * size
