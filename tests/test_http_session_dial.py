"""A fresh session's cost on the wire (real sockets, 127.0.0.1): the client's writes and round
trips from the TCP connect to its first answer. A fresh participant of a large job is one of
these per process or handler, so each write saved is a wake-up saved on both sides."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers.fake_session import Peer, fake_session_server
from helpers.waiting import eventually

from aioelastic.rendezvous import DynamicRendezvousHandler
from aioelastic.store import open_store
from aioelastic.store.http import HttpStore
from aioelastic.store.http._client_conn import Connection
from aioelastic.store.http._frames import PROTOCOL_VERSIONS, REQUEST, RESULT, unpack_all
from aioelastic.store.http._session_dial import Dialer
from aioelastic.store.http._session_stream import (
    MAX_HELLO_HEADER,
    hello_from_header,
    hello_header,
)
from aioelastic.store.http.server import HttpStoreServer

#: Generous: the machine is shared.
SLACK = 10.0


class _Writes:
    """Every ``transport.write`` of the client's session connections, in order (and their
    transports)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writes: list[bytes] = []
        self.transports: list[Any] = []
        made = Connection.connection_made
        writes = self.writes
        transports = self.transports

        def counting(conn: Connection, transport: Any) -> None:
            made(conn, transport)
            transports.append(transport)
            real = transport.write

            def write(data: bytes) -> None:
                writes.append(bytes(data))
                real(data)

            transport.write = write

        monkeypatch.setattr(Connection, "connection_made", counting)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> _Writes:
    return _Writes(monkeypatch)


@pytest.fixture
def writes(recorded: _Writes) -> list[bytes]:
    return recorded.writes


def _hello_in(head: bytes) -> list[Any] | None:
    """The hello frame an upgrade request's ``Aioelastic-Hello`` header carries, if it has one."""
    values = [
        line.split(b":", 1)[1].strip()
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"aioelastic-hello:")
    ]
    if not values:
        return None
    [value] = values
    body = hello_from_header(value.decode("ascii"))
    assert body is not None
    [hello] = list(unpack_all(body, max_len=1 << 20))
    return hello


@pytest.mark.asyncio
async def test_a_fresh_session_s_hello_rides_in_the_upgrade(writes: list[bytes]) -> None:
    """A new session's hello is in the upgrade's ``Aioelastic-Hello`` header, not a message of
    its own behind the head: a head the server's direct path does not take (cut over reads, or
    with a proxy's extra headers) goes to aiohttp, whose parser would lose bytes sent behind it;
    a header both paths read. So the first request is the client's second write."""
    async with HttpStoreServer(port=0) as server, open_store(server.url) as store:
        assert isinstance(store, HttpStore)
        assert await store.current_revision() >= 0
        assert store.session.connects == 1
        assert store.session.version == max(PROTOCOL_VERSIONS)  # (the welcome was read)
    # the upgrade request with the hello, then the request
    assert len(writes) == 2, writes
    head = writes[0]
    assert head.startswith(b"GET /v1/session HTTP/1.1\r\n")
    assert head.endswith(b"\r\n\r\n")
    hello = _hello_in(head)
    assert hello is not None
    assert hello[:3] == [REQUEST, 0, "hello"]
    assert hello[3] == {
        "versions": list(PROTOCOL_VERSIONS),
        "client": "aioelastic",
        "resume": None,
        "leases": [],
        "progress_interval": store.session.progress_interval,
    }
    assert _ops(writes[1]) == ["revision"]


def _ops(write: bytes) -> list[str]:
    """The operations of the requests in one write (its messages, their frames)."""
    ops: list[str] = []
    while write:
        length = int.from_bytes(write[:4], "big")
        ops += [frame[2] for frame in unpack_all(write[4 : 4 + length], max_len=1 << 20)]
        write = write[4 + length :]
    return ops


@pytest.mark.asyncio
async def test_the_requests_that_waited_for_a_fresh_session_go_in_one_write(
    writes: list[bytes],
) -> None:
    """A first join asks for its watch and its lease at once, before the session exists: both
    go in one write once it does (the first used to go alone, the rest a write later)."""
    async with HttpStoreServer(port=0) as server, open_store(server.url) as store:
        assert isinstance(store, HttpStore)
        revision, _, kv = await asyncio.gather(
            store.current_revision(), store.put("a", b"1"), store.get("a")
        )
        assert revision >= 0
        assert kv is not None
        assert kv.value == b"1"
        assert store.session.connects == 1
        sent = len(writes)
        assert await store.get("a") is not None  # a later lone request: written at once
        assert len(writes) == sent + 1
    assert [_ops(w) for w in writes[1:]] == [["revision", "put", "get"], ["get"]]


@pytest.mark.asyncio
async def test_a_prepared_first_join_opens_its_view_and_lease_in_one_write(
    writes: list[bytes],
) -> None:
    """What a registry creator does for a first join (the view of c/, the lease), over http:
    the session's upgrade (its hello in it), then the watch and the lease grant in one
    message."""
    async with HttpStoreServer(port=0) as server:
        store = await open_store(server.url)
        handler = DynamicRendezvousHandler(store, "job", 1, 1, local_addr="127.0.0.1")
        try:
            await handler._prepare()
            assert handler.lease is not None
            assert [_ops(w) for w in writes[1:]] == [["watch", "lease_grant"]]
            assert (await handler.next_rendezvous()).world_size == 1
        finally:
            await handler.aclose()
            await store.aclose()


@pytest.mark.asyncio
async def test_a_resume_says_hello_only_after_the_101(recorded: _Writes) -> None:
    """A resume's hello carries the resume token: it stays inside the stream, a message after
    the 101, never in a header a proxy might log."""
    async with (
        HttpStoreServer(port=0, session_grace=5.0) as server,
        open_store(server.url) as store,
    ):
        assert isinstance(store, HttpStore)
        await store.put("k", b"1")
        recorded.transports[0].abort()  # the client's end drops: the next call resumes
        await eventually(lambda: store.session._conn is None, 10, "the drop seen")
        assert await store.get("k") is not None
        assert store.session.resumes == 1
    first, second = [i for i, w in enumerate(recorded.writes) if w.startswith(b"GET ")]
    assert _hello_in(recorded.writes[first]) is not None
    assert _hello_in(recorded.writes[second]) is None
    [hello] = list(unpack_all(recorded.writes[second + 1][4:], max_len=1 << 20))
    assert hello[:3] == [REQUEST, 0, "hello"]
    assert isinstance(hello[3]["resume"], str)
    assert hello[3]["resume"]


@pytest.mark.asyncio
async def test_a_server_that_ignores_the_hello_header_gets_the_hello_after_the_101() -> None:
    """A server older than the header (the fake one: it answers a plain 101 and waits for a
    hello message) opens a session all the same: the client sends the hello when the 101 does
    not say ``Aioelastic-Hello: taken``."""

    async def revision(peer: Peer, frame: list[Any]) -> None:
        peer.send([RESULT, frame[1], 3])

    async with fake_session_server(revision) as (url, seen), open_store(url) as store:
        assert await store.current_revision() == 3
        assert "aioelastic-hello" in seen.headers[0]
        assert seen.ops == ["revision"]  # (the fake records requests after its welcome)


@pytest.mark.asyncio
async def test_a_hello_too_long_for_a_header_goes_as_a_message(recorded: _Writes) -> None:
    async with HttpStoreServer(port=0) as server:
        dialer = Dialer(server.url, headers={}, ssl=None, connect_timeout=5.0)
        fields: dict[str, Any] = {"resume": None, "leases": [], "padding": "x" * MAX_HELLO_HEADER}
        assert dialer._with_hello(fields) is None
        assert dialer._with_hello({"resume": None}) is not None
        conn, welcome = await dialer.dial(fields, 10.0)
        try:
            assert welcome["resumed"] is False
        finally:
            conn.close()
    head, hello = recorded.writes[:2]
    assert _hello_in(head) is None
    [frame] = list(unpack_all(hello[4:], max_len=1 << 20))
    assert frame[3]["padding"] == "x" * MAX_HELLO_HEADER


def test_a_hello_of_exactly_the_headers_limit_still_rides_in_the_upgrade() -> None:
    dialer = Dialer("http://127.0.0.1:1", headers={}, ssl=None, connect_timeout=1.0)

    def value_length(pad: int) -> int:
        return len(hello_header(dialer._hello_message({"pad": "x" * pad})))

    pad = next(n for n in range(2000, 4000) if value_length(n) == MAX_HELLO_HEADER)
    assert dialer._with_hello({"pad": "x" * pad}) is not None
    assert value_length(pad + 1) > MAX_HELLO_HEADER
    assert dialer._with_hello({"pad": "x" * (pad + 1)}) is None


@pytest.mark.asyncio
async def test_the_session_dials_the_url_s_own_host() -> None:
    """A server on another loopback address (127.0.0.2: all of 127/8 is loopback on Linux) is
    reached there: the connect goes to the URL's host, not to a default one (asyncio connects a
    missing host to 127.0.0.1, which every other test's server listens on)."""
    async with (
        HttpStoreServer(host="127.0.0.2", port=0) as server,
        open_store(server.url, timeout=5) as store,
    ):
        assert server.url.startswith("http://127.0.0.2:")
        await store.put("k", b"v")
        assert (await store.get("k")) is not None
