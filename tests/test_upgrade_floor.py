"""The upgrade prototype of ``benchmarks/upgrade_floor.py`` takes the connection over from aiohttp
cleanly: on asyncio and uvloop, with and without TLS, past aiohttp's keep-alive timer, and
aiohttp forgets the connection when it ends (FIN or RST) or when the server shuts down."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import ssl
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from aiohttp import web
from helpers.http import self_signed_cert

from benchmarks.upgrade_floor import (
    SESSIONS,
    TOKEN,
    UPGRADE,
    UpgradeClient,
    _frame,
    build_app,
    open_upgrade,
)

LOOPS = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])


def _run(loop: str, coro: Any) -> Any:
    factory = importlib.import_module("uvloop").new_event_loop if loop == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[tuple[ssl.SSLContext, ssl.SSLContext]]:
    pytest.importorskip("cryptography")
    with self_signed_cert(tmp_path) as (cert, key):
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(cert, key)
        yield server, ssl.create_default_context(cafile=str(cert))


async def _server(
    server_tls: ssl.SSLContext | None = None, keepalive_timeout: float = 75.0
) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(
        build_app({"k": b"v"}), access_log=None, keepalive_timeout=keepalive_timeout
    )
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls).start()
    return runner, runner.addresses[0][1]


class _Replies:
    """A client's replies as they arrive, and an event per new one."""

    def __init__(self) -> None:
        self.got: list[list[Any]] = []
        self.changed = asyncio.Event()

    def __call__(self, body: memoryview) -> None:
        self.got.append(msgpack.unpackb(body))
        self.changed.set()

    async def wait_for(self, count: int) -> list[list[Any]]:
        async with asyncio.timeout(10):
            while len(self.got) < count:
                self.changed.clear()
                await self.changed.wait()
        return self.got


async def _lost(protocol: UpgradeClient) -> asyncio.Future[Exception | None]:
    """A future set when ``protocol``'s connection ends."""
    lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
    original: Callable[[Exception | None], None] = protocol.connection_lost

    def connection_lost(exc: Exception | None) -> None:
        original(exc)
        if not lost.done():
            lost.set_result(exc)

    protocol.connection_lost = connection_lost  # type: ignore[method-assign]
    return lost


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("secure", [False, True], ids=["tcp", "tls"])
def test_gets_round_trip_pipelined_and_outlive_aiohttps_keep_alive_timer(
    loop: str, secure: bool, tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    async def main() -> None:
        runner, port = await _server(tls[0] if secure else None, keepalive_timeout=0.2)
        replies = _Replies()
        protocol = await open_upgrade(port, "/session/get", replies, tls[1] if secure else None)
        for request_id in range(5):  # one write: the server answers them in one too
            protocol.send(_frame(msgpack.packb([request_id, "get", "k"])))
        assert await replies.wait_for(5) == [[i, b"v"] for i in range(5)]
        await asyncio.sleep(0.6)  # idle for three keep-alive timeouts: aiohttp leaves it alone
        assert not protocol.transport.is_closing()
        protocol.send(_frame(msgpack.packb([9, "get", "missing"])))
        assert (await replies.wait_for(6))[-1] == [9, None]
        assert len(runner.server.connections) == 1  # type: ignore[union-attr]
        lost = await _lost(protocol)
        protocol.transport.close()
        await lost
        await runner.cleanup()

    _run(loop, main())


@pytest.mark.parametrize("loop", LOOPS)
def test_aiohttp_forgets_a_session_closed_or_reset_by_its_client(loop: str) -> None:
    async def main() -> None:
        runner, port = await _server()
        server, app = runner.server, runner.app
        assert server is not None
        for reset in (False, True):
            protocol = await open_upgrade(port, "/session/get", _Replies())
            assert len(server.connections) == 1
            (session,) = app[SESSIONS]
            if reset:
                sock = protocol.transport.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                protocol.transport.abort()
            else:
                protocol.transport.close()
            assert session.task is not None
            async with asyncio.timeout(10):
                await asyncio.wait([session.task])  # aiohttp's task for the connection ends
            assert server.connections == []  # forwarded connection_lost: nothing leaks
        await runner.cleanup()

    _run(loop, main())


@pytest.mark.parametrize("loop", LOOPS)
def test_shutdown_closes_open_sessions_at_once(loop: str) -> None:
    async def main() -> None:
        runner, port = await _server()
        protocol = await open_upgrade(port, "/session/get", _Replies())
        lost = await _lost(protocol)
        async with asyncio.timeout(5):  # aiohttp alone would wait 2 x shutdown_timeout (60 s)
            await runner.cleanup()
            await lost

    _run(loop, main())


def test_a_bad_token_or_upgrade_gets_an_http_error_not_a_session() -> None:
    async def main() -> None:
        runner, port = await _server()
        loop = asyncio.get_running_loop()
        for headers, status in (
            (f"Upgrade: {UPGRADE}\r\nAuthorization: Bearer wrong", "401"),
            (f"Upgrade: websocket\r\nAuthorization: Bearer {TOKEN}", "426"),
        ):
            transport, protocol = await loop.create_connection(
                lambda: UpgradeClient(_Replies()), "127.0.0.1", port
            )
            transport.write(
                f"GET /session/get HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n{headers}"
                "\r\n\r\n".encode()
            )
            with pytest.raises(ValueError, match=f"no upgrade: 'HTTP/1.1 {status}"):
                await protocol.upgraded
        await runner.cleanup()

    _run("asyncio", main())
