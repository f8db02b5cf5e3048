"""``python -m aioelastic serve`` as a real process: kill -9 mid-run and restart with the same
data dir (nothing acknowledged is lost, revisions continue, leases and watches come back), and a
graceful SIGTERM."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from helpers import free_port
from helpers.http import ServerProcess

from aioelastic.errors import StoreAuthError, StoreConnectionError, WriteOutcomeUnknownError
from aioelastic.store import EventType, Store, WatchEvent, open_store
from aioelastic.store.http.server import HttpStoreServer


async def _start(*args: str) -> ServerProcess:
    return await asyncio.to_thread(ServerProcess(*args).start)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_kill_9_then_restart_loses_nothing_acknowledged(tmp_path: Path) -> None:
    port = free_port()
    args = ("--port", str(port), "--data-dir", str(tmp_path / "data"))
    first = await _start(*args)
    acknowledged: dict[str, int] = {}
    unknown: set[str] = set()
    failures: list[tuple[BaseException, float]] = []
    try:
        async with (
            open_store(first.url) as store,
            open_store(first.url, progress_interval=0.5, reconnect_timeout=60) as watcher_store,
        ):
            grant = await store.lease_grant(20)
            await store.put("lease/k", b"held", lease=grant.id)
            enough = asyncio.Event()
            watch = watcher_store.watch("run/")
            await watch.start()

            async def writer(w: int, client: Store) -> None:
                i = 0
                while True:
                    key = f"run/{w}/{i}"
                    try:
                        acknowledged[key] = await client.put(key, b"x" * (i % 50))
                        if len(acknowledged) >= 300:
                            enough.set()
                    except StoreConnectionError as exc:
                        if isinstance(exc, WriteOutcomeUnknownError):
                            unknown.add(key)
                        failures.append((exc, time.monotonic()))
                        return
                    i += 1

            clients = [await open_store(first.url) for _ in range(8)]
            tasks = [asyncio.ensure_future(writer(w, c)) for w, c in enumerate(clients)]
            await asyncio.wait_for(enough.wait(), 30)
            first.kill()
            killed_at = time.monotonic()
            await asyncio.wait_for(asyncio.gather(*tasks), 15)  # no hang
            for client in clients:
                await client.aclose()
            assert len(failures) == 8
            assert all(at - killed_at < 5 for _, at in failures)
            # connecting is retried within the request deadline: a short one says so soon
            async with open_store(first.url, timeout=1.0, read_retries=0) as impatient:
                with pytest.raises(StoreConnectionError):
                    await impatient.get("lease/k")

            second = await _start(*args)
            try:
                assert second.url == first.url
                top = max(acknowledged.values())
                for key, revision in acknowledged.items():
                    kv = await store.get(key)
                    assert kv is not None, key
                    assert kv.mod_revision == revision
                after = await store.put("run/after", b"done")
                assert after > top  # the revision counter continues
                status = await store.lease_time_to_live(grant.id)
                assert status.keys == ("lease/k",)
                assert status.remaining > 15  # the TTL restarted
                # the watch resumed on its own: every acknowledged write once, in order
                seen: list[WatchEvent] = []
                while not seen or seen[-1].kv.key != "run/after":
                    seen.append(await asyncio.wait_for(watch.__anext__(), 30))
                keys = [e.kv.key for e in seen if e.type is EventType.PUT]
                assert len(keys) == len(set(keys))
                assert set(acknowledged) <= set(keys) <= set(acknowledged) | unknown | {"run/after"}
                revisions = [e.revision for e in seen]
                assert revisions == sorted(revisions)
            finally:
                await watch.aclose()
                await asyncio.to_thread(second.terminate)
    finally:
        first.kill()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_sigterm_ends_watches_flushes_and_exits(tmp_path: Path) -> None:
    args = ("--data-dir", str(tmp_path / "data"), "--fsync", "interval")
    server = await _start(*args)
    try:
        async with open_store(server.url, progress_interval=0.5, reconnect_timeout=1) as store:
            for i in range(100):
                await store.put(f"k/{i}", str(i).encode())
            async with store.watch("k/") as events:
                code, output = await asyncio.to_thread(server.terminate)
                assert code == 0
                assert "stopped" in output
                started = time.monotonic()
                with pytest.raises(StoreConnectionError):
                    await asyncio.wait_for(events.__anext__(), 20)
                assert time.monotonic() - started < 10
    finally:
        server.kill()
    again = await _start(*args)
    try:
        async with open_store(again.url) as store:
            assert len(await store.range("k/")) == 100
            assert await store.current_revision() == 100
    finally:
        await asyncio.to_thread(again.terminate)


@pytest.mark.asyncio
async def test_in_flight_requests_finish_on_graceful_stop() -> None:
    server = HttpStoreServer(port=0)
    await server.start()
    # A put not yet sent when the server goes retries the connect until its timeout: 2 s, not 30.
    async with open_store(server.url, timeout=2.0) as store:
        puts = [asyncio.ensure_future(store.put(f"f/{i}", b"v")) for i in range(50)]
        await asyncio.sleep(0)  # deliberate: one loop pass, so the stop meets puts in flight
        await server.stop()
        results = await asyncio.gather(*puts, return_exceptions=True)
    for i, result in enumerate(results):
        if isinstance(result, BaseException):
            assert isinstance(result, StoreConnectionError), result
        else:
            assert server.engine.get(f"f/{i}") is None or result >= 1


@pytest.mark.asyncio
async def test_serve_with_token_file_and_tls(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    from helpers.http import self_signed_cert

    token = tmp_path / "token"
    token.write_text("t0ken\n")
    with self_signed_cert(tmp_path) as (cert, key):
        server = await _start(
            "--token-file", str(token), "--tls-cert", str(cert), "--tls-key", str(key)
        )
        try:
            assert server.url.startswith("https://127.0.0.1:")
            assert "token required" in server.banner[-1]
            async with open_store(server.url, cafile=str(cert), token_file=str(token)) as store:
                await store.put("secure", b"yes")
                assert (await store.get("secure")) is not None
            async with open_store(server.url, cafile=str(cert), token="nope") as store:
                with pytest.raises(StoreAuthError):
                    await store.get("secure")
        finally:
            await asyncio.to_thread(server.terminate)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--tls-cert", "/nonexistent.pem"), "go together"),
        (("--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"), "cannot be loaded"),
        (("--token-file", "/nonexistent/token"), "token"),
        (("--port", "70000"), "--port"),
        (("--max-value-bytes", "-1"), "--max-value-bytes"),
        (("--read-timeout", "0"), "--read-timeout must be a finite number of seconds > 0"),
        (("--read-timeout", "nan"), "--read-timeout must be a finite number of seconds > 0"),
        (("--read-timeout", "-2"), "--read-timeout must be a finite number of seconds > 0"),
        (("--read-timeout", "soon"), "--read-timeout"),
        (("--session-grace", "-0.1"), "--session-grace must be a number of seconds >= 0"),
        (("--session-grace", "inf"), "--session-grace must be a number of seconds >= 0"),
    ],
)
def test_serve_refuses_bad_flags(args: tuple[str, ...], words: str) -> None:
    import subprocess
    import sys

    from helpers.http import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "aioelastic", "serve", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert words in done.stderr


@pytest.mark.asyncio
async def test_serve_read_timeout_closes_a_stalled_request() -> None:
    server = await _start("--read-timeout", "0.3")
    try:
        host, _, port = server.url.removeprefix("http://").rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(b"GET /v1/kv/a HTTP/1.1\r\nHost: x\r\n")  # no blank line: stalled
            answer = await asyncio.wait_for(reader.read(), 10)  # until the server closes
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b'"error":"request_timeout"' in answer
        assert b"0.3s" in answer
    finally:
        server.kill()
