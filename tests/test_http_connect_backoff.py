"""Connecting with backoff, on real sockets (127.0.0.1): a client that cannot connect yet (nobody
listening, the server over ``max_connections``) retries with full-jitter backoff within its request
deadline and then succeeds; a refused token fails at once; a deadline that runs out says how long
it tried."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from typing import Any

import anyio
import pytest
from helpers.fake_session import loopback_server

from aioelastic.errors import StoreAuthError, StoreClosedError, StoreConnectionError
from aioelastic.store import open_store
from aioelastic.store.http import HttpStore
from aioelastic.store.http._session_dial import DIALS_AT_ONCE, Backoff, Dialer, NotYet
from aioelastic.store.http.server import HttpStoreServer

#: Generous: the machine is shared.
SLACK = 10.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_full_jitter_waits_are_uniform_below_a_doubling_ceiling() -> None:
    top = Backoff(base=0.05, cap=1.0, rng=lambda: 1.0)
    assert [round(top.next_delay(), 3) for _ in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    spread = Backoff(base=0.05, cap=1.0)
    delays = [spread.next_delay() for _ in range(200)]
    assert all(0 <= d <= 1.0 for d in delays)
    late = delays[10:]
    assert min(late) < 0.2
    assert max(late) > 0.8
    assert spread.attempts == 200


@pytest.mark.asyncio
async def test_a_client_started_before_its_server_waits_and_succeeds() -> None:
    port = _free_port()
    async with open_store(f"http://127.0.0.1:{port}", timeout=SLACK + 5) as store:
        assert isinstance(store, HttpStore)
        put = asyncio.ensure_future(store.put("k", b"v"))
        await asyncio.sleep(1.0)  # refused meanwhile: tried again, not failed
        assert not put.done()
        async with HttpStoreServer(port=port) as server:
            await asyncio.wait_for(put, SLACK)
            assert store.session.connect_retries >= 1
            async with open_store(server.url) as other:
                kv = await other.get("k")
                assert kv is not None
                assert kv.value == b"v"


@pytest.mark.asyncio
async def test_a_client_over_max_connections_gets_in_when_a_slot_frees() -> None:
    async with HttpStoreServer(port=0, max_connections=4) as server:
        held = [await open_store(server.url) for _ in range(4)]
        try:
            for i, store in enumerate(held):  # each holds its session's connection
                await store.put(f"held/{i}", b"x")
            async with open_store(server.url, timeout=SLACK + 5) as late:
                assert isinstance(late, HttpStore)
                put = asyncio.ensure_future(late.put("late", b"v"))
                while late.session.connect_retries < 2:  # 503 too_many_connections, twice
                    assert not put.done(), put
                    await asyncio.sleep(0.05)
                await held.pop().aclose()
                await asyncio.wait_for(put, SLACK)
                assert (await late.get("late")) is not None
        finally:
            for store in held:
                await store.aclose()


@pytest.mark.asyncio
async def test_a_refused_token_fails_at_once() -> None:
    async with (
        HttpStoreServer(port=0, token="right") as server,
        open_store(server.url, token="wrong", timeout=30) as store,
    ):
        assert isinstance(store, HttpStore)
        started = time.monotonic()
        with pytest.raises(StoreAuthError, match="refused the token"):
            await store.put("k", b"v")
        assert time.monotonic() - started < 3  # not retried until the 30 s deadline
        assert store.session.connect_retries == 0


@pytest.mark.asyncio
async def test_a_deadline_that_runs_out_says_how_long_it_tried() -> None:
    async with open_store(f"http://127.0.0.1:{_free_port()}", timeout=1.0, read_retries=0) as store:
        assert isinstance(store, HttpStore)
        started = time.monotonic()
        with pytest.raises(StoreConnectionError, match=r"attempts within 1s") as info:
            await store.get("k")
        assert 0.9 < time.monotonic() - started < SLACK
        assert "cannot connect to" in str(info.value)
        assert store.session.connect_retries >= 3


@pytest.mark.asyncio
async def test_a_kept_lease_is_lost_at_its_ttl_while_connecting_is_retried() -> None:
    """The server goes away for good: the keep-alive retries connecting within the request
    deadline (30 s), yet the keeper reports the lease lost once its TTL has passed."""
    server = HttpStoreServer(port=0)
    await server.start()
    try:
        async with (
            open_store(server.url, timeout=30) as store,
            store.lease(1.0, keep_alive_interval=0.2) as keeper,
        ):
            await server.stop()
            started = time.monotonic()
            error = await asyncio.wait_for(keeper.wait_lost(), SLACK)
            assert time.monotonic() - started < 1.0 + SLACK / 2
            assert "unreachable for the whole TTL" in str(error)
    finally:
        await server.stop()


@pytest.mark.asyncio
async def test_a_caller_deadline_later_than_the_request_timeout_is_waited_for() -> None:
    """``anyio.fail_after`` around the call (a join timeout, say): connecting is tried until
    then, past the store's 0.5 s request timeout."""
    port = _free_port()
    async with open_store(f"http://127.0.0.1:{port}", timeout=0.5, read_retries=0) as store:

        async def put_within(seconds: float) -> None:
            with anyio.fail_after(seconds):
                await store.put("k", b"v")

        put = asyncio.ensure_future(put_within(SLACK + 5))
        await asyncio.sleep(1.5)  # three request timeouts: still trying
        assert not put.done()
        async with HttpStoreServer(port=port):
            await asyncio.wait_for(put, SLACK)


@pytest.mark.asyncio
async def test_at_most_dials_at_once_connections_are_opened_at_once_per_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 stores connecting at once from one loop: the others wait for a slot (their connect
    timeout not yet running), and every one connects."""
    at_once = 0
    most = 0
    real = Dialer._dial

    async def counting(self: Dialer, hello: dict[str, Any], deadline: float) -> Any:
        nonlocal at_once, most
        at_once += 1
        most = max(most, at_once)
        try:
            return await real(self, hello, deadline)
        finally:
            at_once -= 1

    monkeypatch.setattr(Dialer, "_dial", counting)
    async with HttpStoreServer(port=0) as server:
        stores = [await open_store(server.url) for _ in range(200)]
        try:
            await asyncio.gather(*(s.put(f"k/{i}", b"x") for i, s in enumerate(stores)))
        finally:
            await asyncio.gather(*(s.aclose() for s in stores))
    assert most == DIALS_AT_ONCE


@pytest.mark.asyncio
async def test_a_rejected_hello_fails_at_once() -> None:
    async with (
        HttpStoreServer(port=0) as server,
        open_store(server.url, timeout=30, read_retries=0) as store,
    ):
        assert isinstance(store, HttpStore)
        store.session.dialer.hello_versions = [0]
        started = time.monotonic()
        with pytest.raises(StoreConnectionError, match="unsupported_version"):
            await store.get("k")
        assert time.monotonic() - started < 3  # not retried until the 30 s deadline
        assert store.session.connect_retries == 0


@pytest.mark.asyncio
async def test_a_server_slow_to_answer_the_upgrade_is_waited_for_past_connect_timeout() -> None:
    """``connect_timeout`` bounds the TCP connect only: a server that accepted the connection
    and is slow to answer (thousands of handshakes at once) is waited for until the request's
    deadline, not abandoned and dialled again (the retry would be more work for it)."""
    accepted: list[int] = []

    async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        await reader.read()  # (until the client gives up)

    async with loopback_server(never_answers) as port:
        url = f"http://127.0.0.1:{port}"
        async with open_store(url, timeout=1.0, connect_timeout=0.1, read_retries=0) as store:
            started = time.monotonic()
            with pytest.raises(NotYet) as info:
                await store.get("k")
            assert time.monotonic() - started >= 0.9
    assert (
        str(info.value) == f"cannot connect to {url}: timed out (still, after 1 attempt within 1s)"
    )
    assert len(accepted) == 1


@pytest.mark.asyncio
async def test_tls_to_a_server_that_does_not_speak_it_fails_at_once() -> None:
    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await reader.read()

    async with loopback_server(plain) as port:
        url = f"https://127.0.0.1:{port}"
        async with open_store(url, timeout=10, read_retries=0, verify=False) as store:
            started = time.monotonic()
            with pytest.raises(StoreConnectionError) as info:
                await store.get("k")
            assert time.monotonic() - started < 5  # a certificate or protocol will not change
    assert not isinstance(info.value, NotYet)
    assert str(info.value).startswith(f"cannot connect to {url}: [SSL")


@pytest.mark.asyncio
async def test_the_servers_refusal_is_what_giving_up_says_not_the_last_attempt_cut_short() -> None:
    busy = b'{"error": "too_many_connections", "message": "full, 4 of 4"}'
    refusal = b"HTTP/1.1 503 Busy\r\nContent-Length: %d\r\n\r\n%s" % (len(busy), busy)
    attempts: list[int] = []

    async def busy_then_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        attempts.append(1)
        if len(attempts) == 1:
            writer.write(refusal)
            await writer.drain()
            writer.close()
            return
        await reader.read()  # never answers: each later attempt is cut by the deadline

    async with loopback_server(busy_then_silent) as port:
        url = f"http://127.0.0.1:{port}"
        async with open_store(url, timeout=1.0, read_retries=0) as store:
            with pytest.raises(NotYet) as info:
                await store.get("k")
    assert len(attempts) >= 2
    assert re.fullmatch(
        re.escape(f"cannot open a session to {url}: HTTP 503: full, 4 of 4 (still, after ")
        + r"\d+ attempts within 1s\)",
        str(info.value),
    )
    assert (info.value.status, info.value.reason) == (503, "full, 4 of 4")


@pytest.mark.asyncio
async def test_a_store_closed_while_it_connects_says_so() -> None:
    store = await open_store(f"http://127.0.0.1:{_free_port()}", timeout=30, read_retries=0)
    get = asyncio.ensure_future(store.get("k"))
    await asyncio.sleep(0.3)  # connecting, with backoff
    await store.aclose()
    with pytest.raises(StoreClosedError) as info:
        await asyncio.wait_for(get, SLACK)
    assert "was closed" in str(info.value)


def test_the_default_backoff_starts_at_50_ms_and_doubles_up_to_2_s() -> None:
    backoff = Backoff(rng=lambda: 1.0)  # the ceiling of each wait
    assert [backoff.next_delay() for _ in range(8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert backoff.attempts == 8


@pytest.mark.parametrize(
    ("url", "host", "port", "path"),
    [
        ("http://example.org", "example.org", 80, "/v1/session"),
        ("https://example.org", "example.org", 443, "/v1/session"),
        ("http://10.0.0.7:8081/store", "10.0.0.7", 8081, "/store/v1/session"),
    ],
)
def test_the_dialer_dials_the_urls_host_and_port_and_upgrades_under_its_path(
    url: str, host: str, port: int, path: str
) -> None:
    dialer = Dialer(url, headers={"Authorization": "Bearer t"}, ssl=None, connect_timeout=1.0)
    assert (dialer._host, dialer._port) == (host, port)
    netloc = url.split("//", 1)[1].split("/", 1)[0]
    assert dialer._request.startswith(f"GET {path} HTTP/1.1\r\nHost: {netloc}\r\n".encode())
    assert dialer._request.endswith(b"Authorization: Bearer t\r\n\r\n")
    assert dialer.connect_timeout == 1.0
