"""The session transport through the store client on real sockets (127.0.0.1): an old protocol
version, session-bound leases (a killed client's leases go within the grace; a frozen one's at
their TTL), a connection cut by a proxy and resumed within the grace, many sessions at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from helpers.http import ROOT, ServerProcess

from aioelastic.errors import StoreConnectionError
from aioelastic.store import EventType, open_store
from aioelastic.store.http import HttpStore
from aioelastic.store.http.server import HttpStoreServer

#: A client process: it holds a kept-alive lease with a key on it, says the lease id, and waits.
CLIENT = """
import asyncio, sys
from aioelastic.store import open_store

async def main() -> None:
    async with open_store(sys.argv[1]) as store, store.lease(float(sys.argv[2])) as keeper:
        await store.put(sys.argv[3], b"alive", lease=keeper.id)
        print(keeper.id, flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


@contextlib.contextmanager
def client_process(url: str, ttl: float, key: str) -> Iterator[subprocess.Popen[str]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT, url, str(ttl), key],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip().isdigit(), "the client process did not start"
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


async def _deleted_after(url: str, key: str, act: Any, timeout: float) -> float:
    """Seconds from ``act()`` until ``key`` is deleted (seen by a watch of another client)."""
    async with open_store(url) as observer:
        kv = await observer.get(key)
        assert kv is not None
        async with observer.watch(key, start_revision=kv.mod_revision + 1) as events:
            act()
            started = time.monotonic()
            async with asyncio.timeout(timeout):
                async for event in events:
                    if event.type is EventType.DELETE and event.kv.key == key:
                        return time.monotonic() - started
    raise AssertionError("unreachable")


# -- a client process that dies, and one that freezes --------------------------------------------


@pytest.mark.asyncio
async def test_a_killed_client_loses_its_leases_within_the_grace() -> None:
    with (
        ServerProcess("--session-grace", "0.25") as server,
        client_process(server.url, 30.0, "kill/me") as proc,
    ):
        seconds = await _deleted_after(server.url, "kill/me", proc.kill, 10)
    # the grace is 0.25 s; the TTL (30 s) is far away. Generous bound: a loaded machine.
    assert 0.2 <= seconds < 2.0, seconds


@pytest.mark.asyncio
async def test_a_frozen_client_keeps_its_leases_until_their_ttl() -> None:
    with (
        ServerProcess("--session-grace", "0.25") as server,
        client_process(server.url, 3.0, "frozen/me") as proc,
    ):
        # its connection stays open (no FIN): only the TTL tells it is gone, 2-3 s after the
        # stop (its keeper renews every second); far more than the grace
        seconds = await _deleted_after(
            server.url, "frozen/me", lambda: proc.send_signal(signal.SIGSTOP), 20
        )
    assert 1.0 <= seconds < 10.0, seconds


@pytest.mark.asyncio
async def test_grace_zero_revokes_at_once_and_a_clean_close_ends_the_session() -> None:
    async with HttpStoreServer(port=0, session_grace=0) as server:
        store = await open_store(server.url)
        grant = await store.lease_grant(30)
        await store.put("bye", b"1", lease=grant.id)
        assert server.engine.lease_count == 1
        removed = asyncio.Event()
        server.engine.on_lease.append(lambda change: removed.set())
        await store.aclose()
        await asyncio.wait_for(removed.wait(), 5)
        assert server.engine.lease_count == 0
        assert server.engine.get("bye") is None
    with pytest.raises(ValueError, match="session grace"):
        await HttpStoreServer(port=0, session_grace=-1).start()


# -- a connection cut and resumed -----------------------------------------------------------------


class _Proxy:
    """A TCP proxy on 127.0.0.1 whose connections :meth:`cut` aborts: RST on both sides, or
    (``server_sees=False``) on the client's side only, the server's side left open and silent
    (so the server learns of the drop only from the client's resumed session)."""

    def __init__(self, port: int, *, server_sees: bool = True) -> None:
        self.port = port
        self.server_sees = server_sees
        self.transports: list[asyncio.WriteTransport] = []
        self.upstream: list[asyncio.WriteTransport] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, close: bool = True
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        if close:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.transports.append(writer.transport)
        self.upstream.append(up_writer.transport)
        self.writers += [writer, up_writer]
        await asyncio.gather(
            self._pipe(reader, up_writer, close=self.server_sees), self._pipe(up_reader, writer)
        )

    def cut(self) -> None:
        for transport in self.transports + (self.upstream if self.server_sees else []):
            transport.abort()
        self.transports.clear()

    def close_all(self) -> None:
        for transport in self.transports + self.upstream:
            transport.abort()
        for writer in self.writers:
            writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            self.close_all()
            self.server.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("server_sees", [True, False], ids=["cut-both-sides", "server-unaware"])
async def test_a_cut_connection_resumed_within_the_grace_loses_nothing(server_sees: bool) -> None:
    async with HttpStoreServer(port=0, session_grace=1.0) as server:
        proxy = _Proxy(server.port, server_sees=server_sees)
        async with (
            proxy.running() as url,
            open_store(url, progress_interval=0.2) as client,
            open_store(server.url) as writer,
            client.lease(30.0) as keeper,
        ):
            assert isinstance(client, HttpStore)
            await client.put("cut/held", b"1", lease=keeper.id)
            async with client.watch("cut/w/") as events:
                await writer.put("cut/w/0", b"0")
                assert (await anext(events)).kv.key == "cut/w/0"
                proxy.cut()
                for i in range(1, 4):  # written while the client is cut off
                    await writer.put(f"cut/w/{i}", str(i).encode())
                got = [await asyncio.wait_for(anext(events), 10) for _ in range(3)]
                assert [e.kv.key for e in got] == ["cut/w/1", "cut/w/2", "cut/w/3"]
                await writer.put("cut/w/4", b"4")
                assert (await asyncio.wait_for(anext(events), 10)).kv.key == "cut/w/4"
                await asyncio.sleep(1.5)  # past the grace: nothing was revoked
                assert server.engine.get("cut/held") is not None
                assert not keeper.lost
                assert client.session.resumes >= 1
                # the session lives on one connection (an old one the server had not seen end
                # was closed when the client resumed)
                assert server.statistics()["sessions"] == 2  # the client's and the writer's
                await writer.put("cut/w/5", b"5")
                assert (await asyncio.wait_for(anext(events), 10)).kv.key == "cut/w/5"
                assert len(events._pending) == 0  # type: ignore[attr-defined]  # no repeats


# -- the hello (the protocol by hand: tests/test_http_session_raw.py) ----------------------------


@pytest.mark.asyncio
async def test_an_old_or_unknown_protocol_version_is_a_clear_client_error() -> None:
    async with (
        HttpStoreServer(port=0) as server,
        open_store(server.url, read_retries=0) as store,
    ):
        assert isinstance(store, HttpStore)
        store.session.dialer.hello_versions = [0]
        with pytest.raises(StoreConnectionError, match="unsupported_version"):
            await store.get("x")


# -- many sessions ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_two_hundred_sessions_at_once() -> None:
    async with HttpStoreServer(port=0) as server:
        stores = await asyncio.gather(*(open_store(server.url) for _ in range(200)))
        try:
            watches = [store.watch("many/") for store in stores]
            await asyncio.gather(*(w.start() for w in watches))
            assert server.statistics()["sessions"] == 200
            await asyncio.gather(*(s.put(f"many/{i}", b"x") for i, s in enumerate(stores)))
            firsts = await asyncio.wait_for(asyncio.gather(*(anext(w) for w in watches)), 30)
            assert {e.revision for e in firsts} == {firsts[0].revision}  # the same first write
            for watch in watches:
                await watch.aclose()
        finally:
            await asyncio.gather(*(store.aclose() for store in stores))
