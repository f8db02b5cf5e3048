"""The REST connection's read deadline and its malformed-request answers, byte for byte
(``_protocol.JsonErrorRequestHandler``), on a real server over raw sockets (127.0.0.1): a head
too slow gets the 408 as written; a second request's deadline is its own (the first one's timer,
still armed, fires early and waits again); a body too slow gets its own words; a watch given a
body it never reads is closed at the deadline; a whole request without a body, then silence, is
no read; what aiohttp cannot parse is a JSON 400 or 431."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from helpers.http import request_meter

from aioelastic.store.http.server import HttpStoreServer

TIMEOUT = 0.4
#: Generous: the machine is shared.
SLACK = 3.0


@pytest_asyncio.fixture
async def server() -> AsyncIterator[HttpStoreServer]:
    async with HttpStoreServer(port=0, read_timeout=TIMEOUT) as srv:
        yield srv


class Raw:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.loop = asyncio.get_running_loop()

    async def answer(self) -> tuple[bytes, dict[str, Any]]:
        """One Content-Length answer: (its head, its JSON body)."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        body = await asyncio.wait_for(self.reader.readexactly(length), 10)
        return head, json.loads(body) if body else {}

    async def closed(self, within: float) -> bool:
        """Whether the server closes the connection within ``within`` seconds (what it sent
        before is skipped)."""
        try:
            async with asyncio.timeout(within):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            return False
        return True


@pytest_asyncio.fixture
async def raw(server: HttpStoreServer) -> AsyncIterator[Raw]:
    """A raw connection to the server, closed after the test."""
    connection = Raw(*await asyncio.open_connection("127.0.0.1", server.port))
    try:
        yield connection
    finally:
        connection.writer.close()
        with contextlib.suppress(ConnectionError):
            await connection.writer.wait_closed()


@pytest.mark.asyncio
async def test_a_head_too_slow_gets_the_408_as_written(server: HttpStoreServer, raw: Raw) -> None:
    started = raw.loop.time()
    raw.writer.write(b"GET /v1/revision HTTP/1.1\r\nHost: x\r\n")  # (the blank line never comes)
    head, body = await raw.answer()
    took = raw.loop.time() - started
    assert head.startswith(
        b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nContent-Length: "
    )
    assert head.endswith(b"\r\nConnection: close\r\n\r\n")
    assert body == {
        "error": "request_timeout",
        "message": f"the request's head did not arrive within {TIMEOUT:g}s (the server's read "
        "timeout); closing the connection",
    }
    assert TIMEOUT * 0.9 <= took < TIMEOUT + SLACK
    assert await raw.closed(SLACK)
    meter = request_meter(server)
    assert meter.count("other", 408) == 1
    waited = meter._latency["other"][1][0]
    assert TIMEOUT * 0.9 <= waited < TIMEOUT + SLACK  # the time waited, not a clock's reading


@pytest.mark.asyncio
async def test_a_second_request_s_deadline_runs_from_its_own_first_byte(
    server: HttpStoreServer, raw: Raw
) -> None:
    raw.writer.write(b"GET /v1/revision HTTP/1.1\r\nHost: x\r\n")
    await asyncio.sleep(TIMEOUT / 2)  # deliberate: the first head completes late in its deadline
    raw.writer.write(b"\r\n")
    head, _ = await raw.answer()
    assert head.startswith(b"HTTP/1.1 200")
    await asyncio.sleep(TIMEOUT / 4)  # deliberate: the next head begins before the first deadline
    begun = raw.loop.time()
    raw.writer.write(b"GET /v1/revision HTTP/1.1\r\n")
    head, _ = await raw.answer()
    took = raw.loop.time() - begun
    assert head.startswith(b"HTTP/1.1 408")
    assert TIMEOUT * 0.9 <= took < TIMEOUT + SLACK  # its own deadline, not the first one's


@pytest.mark.asyncio
async def test_a_body_too_slow_gets_its_own_words(server: HttpStoreServer, raw: Raw) -> None:
    raw.writer.write(b"PUT /v1/kv/a HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
    head, body = await raw.answer()
    assert head.startswith(b"HTTP/1.1 408")
    assert body == {
        "error": "request_timeout",
        "message": f"the request body did not arrive within {TIMEOUT:g}s of its headers (the "
        "server's read timeout); closing the connection",
    }
    assert await raw.closed(SLACK)
    assert server.engine.get("a") is None


@pytest.mark.asyncio
async def test_a_watch_given_a_body_it_never_reads_is_closed_at_the_deadline(
    server: HttpStoreServer, raw: Raw
) -> None:
    started = raw.loop.time()
    raw.writer.write(
        b"GET /v1/watch/w/?progress_interval=300 HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
        b"\r\nabc"
    )
    assert await raw.closed(TIMEOUT + SLACK)
    assert raw.loop.time() - started >= TIMEOUT * 0.9


@pytest.mark.asyncio
async def test_a_whole_request_without_a_body_then_silence_is_no_read(
    server: HttpStoreServer, raw: Raw
) -> None:
    raw.writer.write(b"GET /v1/revision HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _ = await raw.answer()
    assert head.startswith(b"HTTP/1.1 200")
    assert not await raw.closed(TIMEOUT * 3)  # idle between requests: aiohttp's keep-alive's
    raw.writer.write(b"GET /v1/revision HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _ = await raw.answer()
    assert head.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize(
    ("request_bytes", "status", "code", "words"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "bad_request", "malformed HTTP request: "),
        (
            b"GET /v1/revision HTTP/1.1\r\nX-Big: " + b"x" * 9000 + b"\r\n\r\n",
            431,
            "headers_too_large",
            "request line or headers too large: ",
        ),
        (
            b"GET /v1/revision HTTP/1.1\r\n"
            + b"".join(b"X-%d: y\r\n" % i for i in range(200))
            + b"\r\n",
            431,
            "headers_too_large",
            "request line or headers too large: ",
        ),
    ],
    ids=["not-http", "header-too-long", "too-many-headers"],
)
@pytest.mark.asyncio
async def test_what_aiohttp_cannot_parse_is_a_json_error(
    server: HttpStoreServer, raw: Raw, request_bytes: bytes, status: int, code: str, words: str
) -> None:
    raw.writer.write(request_bytes)
    head, body = await raw.answer()
    assert head.split(b" ")[1] == b"%d" % status  # (HTTP/1.0: aiohttp knows no version yet)
    assert body["error"] == code
    assert body["message"].startswith(words)
    assert len(body["message"]) <= len(words) + 200
    assert await raw.closed(SLACK)


@pytest.mark.asyncio
async def test_a_new_connection_s_first_head_is_timed_from_the_connection() -> None:
    """A socket that connects, waits most of the deadline, then starts a head it never ends:
    the 408 comes at the deadline from the connection, not a whole deadline after the first
    byte (a client cannot keep a connection by sending a byte now and then)."""
    timeout = 1.5
    async with HttpStoreServer(port=0, read_timeout=timeout) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        try:
            loop = asyncio.get_running_loop()
            await asyncio.sleep(1.0)  # deliberate: most of the deadline, silent
            first_byte = loop.time()
            writer.write(b"GET /v1/revision HTTP/1.1\r\n")
            raw = Raw(reader, writer)
            head, _ = await raw.answer()
            assert head.startswith(b"HTTP/1.1 408")
            assert loop.time() - first_byte < timeout - 0.3  # (~0.5 s; a whole deadline: 1.5)
        finally:
            writer.close()


@pytest.mark.asyncio
async def test_a_head_too_slow_after_a_body_in_pieces_is_timed_too(
    server: HttpStoreServer, raw: Raw
) -> None:
    raw.writer.write(b"PUT /v1/kv/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n")
    await asyncio.sleep(0.05)  # deliberate: the body in a chunk of its own
    raw.writer.write(b"v")
    await asyncio.sleep(0.05)
    raw.writer.write(b"w")
    head, _ = await raw.answer()
    assert head.startswith(b"HTTP/1.1 200")
    raw.writer.write(b"GET /v1/revision HTTP/1.1\r\n")  # (the next head, never ended)
    head, _ = await raw.answer()
    assert head.startswith(b"HTTP/1.1 408")


@pytest.mark.asyncio
async def test_without_a_read_timeout_requests_are_served_and_never_timed() -> None:
    async with HttpStoreServer(port=0, read_timeout=None) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        try:
            raw = Raw(reader, writer)
            writer.write(b"GET /v1/revision HTTP/1.1\r\nHost: x\r\n\r\n")
            head, _ = await raw.answer()
            assert head.startswith(b"HTTP/1.1 200")
        finally:
            writer.close()
