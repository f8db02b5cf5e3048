"""How ``HttpStoreServer`` sets up and tears down (``server.py``): its statistics, a second
start refused, the port and listen backlog it was given, the request bounds it gives aiohttp
(the request target by the key limit, a header's value, the number of headers), the
connections gauge, the log limiter attached while it runs; the session upgrade on a REST
connection. Real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from helpers import free_port
from helpers.waiting import eventually

from aioelastic.errors import StoreClosedError
from aioelastic.store import MemoryEngine, open_store
from aioelastic.store.http import server as server_module
from aioelastic.store.http._app import SESSIONS
from aioelastic.store.http.server import HttpStoreServer

ZEROS = {
    "keys": 0,
    "leases": 0,
    "watch_streams": 0,
    "sessions": 0,
    "session_watches": 0,
    "revision": 0,
}


@pytest.mark.asyncio
async def test_statistics_before_during_and_a_second_start_refused() -> None:
    server = HttpStoreServer(port=0)
    assert server.statistics() == ZEROS
    async with server:
        with pytest.raises(RuntimeError, match=r"^the server has already started$"):
            await server.start()
        async with open_store(server.url) as store, aiohttp.ClientSession() as http:
            lease = await store.lease_grant(30)
            await store.put("a", b"1", lease=lease.id)
            await store.put("b", b"2")
            watch = store.watch("a")
            await watch.start()
            async with http.get(f"{server.url}/v1/watch/a?progress_interval=300") as stream:
                assert stream.status == 200
                await eventually(
                    lambda: server.statistics()["watch_streams"] == 1, 10, "the REST watch"
                )
                assert server.statistics() == {
                    "keys": 2,
                    "leases": 1,
                    "watch_streams": 1,
                    "sessions": 1,
                    "session_watches": 1,
                    "revision": 2,
                }
            await watch.aclose()
    await server.aclose()  # again: nothing more


def _listen_backlog(port: int) -> int:
    """The listening socket's backlog, as ``ss`` shows it (its Send-Q column)."""
    ss = shutil.which("ss")
    if ss is None:
        pytest.skip("needs ss (iproute2) to read a listening socket's backlog")
    out = subprocess.run(
        [ss, "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout.split()
    return int(out[2])


@pytest.mark.asyncio
async def test_the_port_and_the_listen_backlog_given_are_used() -> None:
    port = free_port()
    async with HttpStoreServer(port=port, backlog=77) as server:
        assert server.port == port
        assert server.url == f"http://127.0.0.1:{port}"
        assert _listen_backlog(port) == 77


async def _status(port: int, request: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        line = await asyncio.wait_for(reader.readline(), 10)
        return int(line.split(b" ")[1])
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@pytest.mark.parametrize("max_key", [16, 100])
@pytest.mark.asyncio
async def test_the_request_target_is_bounded_by_the_key_limit(max_key: int) -> None:
    """3 bytes per key byte (a key percent-encoded whole) and 1 KiB for the rest."""
    bound = 3 * max_key + 1024
    async with HttpStoreServer(port=0, max_key_bytes=max_key) as server:
        for length, status in ((bound, 200), (bound + 1, 431)):
            target = b"/v1/revision?x=" + b"a" * (length - len(b"/v1/revision?x="))
            request = b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n"
            assert await _status(server.port, request) == status, length


@pytest.mark.asyncio
async def test_a_header_s_value_and_the_number_of_headers_are_bounded() -> None:
    async with HttpStoreServer(port=0) as server:
        for length, status in ((8190, 200), (8191, 431)):
            request = b"GET /v1/revision HTTP/1.1\r\nHost: x\r\nX-A: " + b"y" * length
            assert await _status(server.port, request + b"\r\n\r\n") == status, length
        for count, status in ((64, 200), (65, 431)):
            headers = b"".join(b"X-%d: y\r\n" % i for i in range(count - 1))
            request = b"GET /v1/revision HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"
            assert await _status(server.port, request) == status, count


@pytest.mark.asyncio
async def test_the_connections_gauge_counts_silent_and_speaking_connections() -> None:
    pytest.importorskip("prometheus_client")
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as http:
        silent = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
        try:

            async def gauge() -> float:
                async with http.get(f"{server.url}/metrics") as response:
                    text = await response.text()
                line = next(x for x in text.splitlines() if x.startswith("aioelastic_connections "))
                return float(line.split()[1])

            assert await gauge() == 3.0  # two silent ones, and the scrape's own
        finally:
            for _, writer in silent:
                writer.close()


@pytest.mark.asyncio
async def test_the_log_limiter_filters_aiohttp_s_log_only_while_the_server_runs() -> None:
    aiohttp_log = logging.getLogger("aiohttp.server")
    served = logging.getLogger("aioelastic.serve")
    server = HttpStoreServer(port=0)
    async with server:
        assert server.log_limiter in aiohttp_log.filters
        assert server.log_limiter in served.filters
    assert server.log_limiter not in aiohttp_log.filters
    assert server.log_limiter not in served.filters


@pytest.mark.asyncio
async def test_stopping_closes_silent_connections_and_ends_every_session_first() -> None:
    """When ``aclose`` returns, a connection that never spoke has been closed, and every
    session's connection has ended (those taken directly too): nothing is left to the loop."""
    server = HttpStoreServer(port=0)
    await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    store = await open_store(server.url)
    try:
        await store.current_revision()
        app = server._app
        assert app is not None
        sessions = app[SESSIONS]
        taken = list(sessions.raw_sessions)
        assert len(taken) == 1
        await server.aclose()
        assert all(session.closed.done() for session in taken)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, not left open
    finally:
        writer.close()
        await store.aclose()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"token": ""}, "token must not be empty"),
        ({"max_connections": 0}, "max_connections must be an int >= 1, got 0"),
        ({"max_connections": True}, "max_connections must be an int >= 1, got True"),
        ({"max_connections": 2.5}, "max_connections must be an int >= 1, got 2.5"),
        (
            {"read_timeout": float("inf")},
            "read_timeout must be a finite number of seconds > 0, or None for no deadline; got inf",
        ),
    ],
)
def test_a_bad_server_option_is_refused_naming_it(options: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(words) + "$"):
        HttpStoreServer(port=0, **options)


def test_an_engine_and_a_data_dir_are_not_both_taken(tmp_path: Path) -> None:
    words = "give engine or data_dir, not both (a data dir loads its own engine)"
    with pytest.raises(ValueError, match="^" + re.escape(words) + "$"):
        HttpStoreServer(port=0, engine=MemoryEngine(), data_dir=str(tmp_path))


def test_the_data_dir_options_reach_the_data_directory(tmp_path: Path) -> None:
    default = HttpStoreServer(port=0, data_dir=str(tmp_path / "a"))
    assert default.data is not None
    assert (default.data.fsync, default.data.snapshot_every) == ("always", 10_000)
    assert default.data.accept_data_loss is False
    given = HttpStoreServer(
        port=0,
        data_dir=str(tmp_path / "b"),
        fsync="never",
        snapshot_every=7,
        accept_data_loss=True,
    )
    assert given.data is not None
    assert (given.data.fsync, given.data.snapshot_every) == ("never", 7)
    assert given.data.accept_data_loss is True


@pytest.mark.asyncio
async def test_a_given_engine_is_served_and_left_open_at_stop() -> None:
    engine = MemoryEngine()
    engine.put("before", b"1")
    async with HttpStoreServer(port=0, engine=engine) as server, open_store(server.url) as store:
        assert server.engine is engine
        assert (await store.get("before")) is not None
    engine.put("after", b"2")  # still open: the caller's to close
    engine.close()
    own = HttpStoreServer(port=0)
    async with own:
        pass
    with pytest.raises(StoreClosedError):
        own.engine.put("k", b"v")  # its own engine: closed with it


@pytest.mark.asyncio
async def test_a_server_never_started_stops_at_once() -> None:
    server = HttpStoreServer(port=0)
    await server.aclose()
    await server.aclose()


@pytest.mark.parametrize(
    ("somaxconn", "backlog", "warned"),
    [
        (1024, None, True),
        (4095, None, True),
        (4096, None, False),
        (None, None, False),
        (1024, 50, False),
    ],
)
@pytest.mark.asyncio
async def test_a_small_somaxconn_is_warned_of_unless_a_backlog_is_given(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    somaxconn: int | None,
    backlog: int | None,
    warned: bool,
) -> None:
    monkeypatch.setattr(server_module, "listen_backlog", lambda: (64, somaxconn))
    with caplog.at_level(logging.WARNING, logger="aioelastic.serve"):
        async with HttpStoreServer(port=0, backlog=backlog):
            pass
    said = [r.getMessage() for r in caplog.records if "somaxconn" in r.getMessage()]
    words = (
        f"net.core.somaxconn is {somaxconn}: a burst of more clients connecting at once can be "
        "refused (raise it: sysctl -w net.core.somaxconn=65535)"
    )
    assert said == ([words] if warned else [])


@pytest.mark.parametrize(("given", "warned"), [(100, True), (50, False), (49, False)])
@pytest.mark.asyncio
async def test_a_connection_limit_over_the_open_file_limit_is_warned_of(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, given: int, warned: bool
) -> None:
    monkeypatch.setattr(server_module, "connection_room", lambda: 50)
    with caplog.at_level(logging.WARNING, logger="aioelastic.serve"):
        async with HttpStoreServer(port=0, max_connections=given) as server:
            assert server.max_connections == min(given, 50)
    said = [r.getMessage() for r in caplog.records if "open-file limit" in r.getMessage()]
    words = f"max_connections {given} is more than the open-file limit allows: 50"
    assert said == ([words] if warned else [])


@pytest.mark.asyncio
async def test_the_session_grace_given_is_the_one_sessions_get() -> None:
    async with (
        HttpStoreServer(port=0, session_grace=0.7) as server,
        open_store(server.url) as store,
    ):
        await store.current_revision()
        assert store.session.grace == 0.7  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_connections_closed_give_their_place_back_under_the_limit() -> None:
    async with HttpStoreServer(port=0, max_connections=2) as server:
        for _ in range(6):  # more than the limit, one after another
            status = await _status(server.port, b"GET /v1/revision HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 200


@pytest.mark.asyncio
async def test_no_access_log_is_written(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="aiohttp.access"):
        async with HttpStoreServer(port=0) as server:
            assert (
                await _status(server.port, b"GET /v1/revision HTTP/1.1\r\nHost: x\r\n\r\n") == 200
            )
    assert [r for r in caplog.records if r.name == "aiohttp.access"] == []


@pytest.mark.asyncio
async def test_a_port_in_use_fails_the_start_and_leaves_nothing_open() -> None:
    async with HttpStoreServer(port=0) as taken:
        before = sorted(os.listdir("/proc/self/fd"))
        second = HttpStoreServer(port=taken.port)
        with pytest.raises(OSError, match="address already in use"):
            await second.start()
        assert sorted(os.listdir("/proc/self/fd")) == before
