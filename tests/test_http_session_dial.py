"""A fresh session's cost on the wire (real sockets, 127.0.0.1): the client's writes and round
trips from the TCP connect to its first answer. A fresh participant of a large job is one of
these per process or handler, so each write saved is a wake-up saved on both sides."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aioelastic.rendezvous import DynamicRendezvousHandler
from aioelastic.store import open_store
from aioelastic.store.http import HttpStore
from aioelastic.store.http._client_conn import Connection
from aioelastic.store.http._frames import REQUEST, unpack_all
from aioelastic.store.http.server import HttpStoreServer

#: Generous: the machine is shared.
SLACK = 10.0


class _Writes:
    """Every ``transport.write`` of the client's session connections, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writes: list[bytes] = []
        made = Connection.connection_made
        writes = self.writes

        def counting(conn: Connection, transport: Any) -> None:
            made(conn, transport)
            real = transport.write

            def write(data: bytes) -> None:
                writes.append(bytes(data))
                real(data)

            transport.write = write

        monkeypatch.setattr(Connection, "connection_made", counting)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    return _Writes(monkeypatch).writes


@pytest.mark.asyncio
async def test_a_fresh_session_says_hello_only_after_the_101(writes: list[bytes]) -> None:
    """The hello waits for the upgrade's answer: a head the server's direct path does not take
    (cut over reads, or with a proxy's extra headers) goes to aiohttp, whose parser would lose
    bytes sent behind it, and such a hello would be refused only at ``hello_timeout``."""
    async with HttpStoreServer(port=0) as server, open_store(server.url) as store:
        assert isinstance(store, HttpStore)
        assert await store.current_revision() >= 0
        assert store.session.connects == 1
    # the upgrade request alone, the hello, then the request
    assert len(writes) == 3, writes
    assert writes[0].startswith(b"GET /v1/session HTTP/1.1\r\n")
    assert writes[0].endswith(b"\r\n\r\n")
    [hello] = list(unpack_all(writes[1][4:], max_len=1 << 20))
    assert hello[:3] == [REQUEST, 0, "hello"]
    assert int.from_bytes(writes[1][:4], "big") == len(writes[1]) - 4


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
    assert [_ops(w) for w in writes[2:]] == [["revision", "put", "get"], ["get"]]


@pytest.mark.asyncio
async def test_a_prepared_first_join_opens_its_view_and_lease_in_one_write(
    writes: list[bytes],
) -> None:
    """What a registry creator does for a first join (the view of c/, the lease), over http:
    the session's upgrade, its hello, then the watch and the lease grant in one message."""
    async with HttpStoreServer(port=0) as server:
        store = await open_store(server.url)
        handler = DynamicRendezvousHandler(store, "job", 1, 1, local_addr="127.0.0.1")
        try:
            await handler._prepare()
            assert handler.lease is not None
            assert [_ops(w) for w in writes[2:]] == [["watch", "lease_grant"]]
            assert (await handler.next_rendezvous()).world_size == 1
        finally:
            await handler.aclose()
            await store.aclose()
