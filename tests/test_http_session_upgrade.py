"""The client's half of the session's HTTP Upgrade (``_upgrade_answer``, ``_session_dial``): the
server's answer read whatever the reads' boundaries, and every refusal mapped to a clear error."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import pytest
from helpers.fake_session import Peer, fake_session_server, raw_answer
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.errors import StoreAuthError, StoreConnectionError, WriteOutcomeUnknownError
from aioelastic.store import open_store
from aioelastic.store.http import HttpStore
from aioelastic.store.http._frames import ERROR, RESULT, pack
from aioelastic.store.http._session_dial import NotYet, refusal_error
from aioelastic.store.http._session_stream import message_header
from aioelastic.store.http._upgrade_answer import (
    BODY_LIMIT,
    HEAD_LIMIT,
    Answer,
    AnswerReader,
    HeadError,
    upgrade_request,
)
from aioelastic.store.http.server import HttpStoreServer

URL = "http://store:29400"
SWITCH = (
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: aioelastic-session/1\r\n"
    b"Connection: Upgrade\r\n\r\n"
)


def _feed(data: bytes, cuts: list[int]) -> tuple[Answer | None, bytes, AnswerReader]:
    """``data`` fed in pieces cut at ``cuts``: the answer (once complete) and what followed it."""
    reader = AnswerReader()
    answer: Answer | None = None
    after = b""
    at = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        piece, at = data[at:cut], cut
        if answer is None:
            answer = reader.feed(piece)
            after = reader.rest if answer is not None else b""
        else:
            after += piece
    return answer, after, reader


@given(
    messages=st.binary(max_size=200),
    cuts=st.lists(st.integers(min_value=0, max_value=1000), max_size=12),
)
def test_any_cut_of_a_101_gives_the_same_answer_and_the_bytes_after_it(
    messages: bytes, cuts: list[int]
) -> None:
    answer, after, _ = _feed(SWITCH + messages, cuts)
    assert answer is not None
    assert answer.upgraded
    assert answer.status == 101
    assert answer.headers["connection"] == "Upgrade"
    assert after == messages  # the session's first bytes, none lost, none taken as the head's


@given(
    body=st.binary(max_size=300),
    extra=st.binary(max_size=50),
    cuts=st.lists(st.integers(min_value=0, max_value=1000), max_size=12),
)
def test_any_cut_of_a_refusal_gives_its_body_by_content_length(
    body: bytes, extra: bytes, cuts: list[int]
) -> None:
    head = f"HTTP/1.1 503 Service Unavailable\r\ncontent-LENGTH: {len(body)}\r\n\r\n".encode()
    answer, after, _ = _feed(head + body + extra, cuts)
    assert answer is not None
    assert not answer.upgraded
    assert (answer.status, answer.reason, answer.body) == (503, "Service Unavailable", body)
    assert after == extra


@given(cut=st.integers(min_value=0, max_value=200))
def test_a_body_without_a_length_ends_with_the_connection(cut: int) -> None:
    data = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n\r\nNo WebSocket UPGRADE hdr"
    reader = AnswerReader()
    assert reader.feed(data[:cut]) is None
    assert reader.feed(data[cut:]) is None  # more may come until the server closes
    answer = reader.eof()
    assert (answer.status, answer.body) == (400, b"No WebSocket UPGRADE hdr")


def test_an_unending_body_is_cut_at_the_limit() -> None:
    reader = AnswerReader()
    assert reader.feed(b"HTTP/1.1 500 Oops\r\n\r\n" + b"x" * (BODY_LIMIT - 1)) is None
    answer = reader.feed(b"xx")
    assert answer is not None
    assert len(answer.body) == BODY_LIMIT
    big = AnswerReader().feed(
        b"HTTP/1.1 500 Oops\r\nContent-Length: 999999\r\n\r\n" + b"y" * BODY_LIMIT
    )
    assert big is not None
    assert len(big.body) == BODY_LIMIT


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not an HTTP/1.1 answer: 'SSH-2.0"),
        (b"HTTP/1.1 20 OK\r\n\r\n", "not an HTTP/1.1 answer"),
        (b"HTTP/1.1 101 Switching\r\nUpgrade aioelastic\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 101 Switching\r\nBad Name: x\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 400 No\r\nContent-Length: -1\r\n\r\n", "malformed Content-Length"),
        (b"HTTP/1.1 101 " + b"x" * HEAD_LIMIT + b"\r\n\r\n", "over 16384 bytes"),
    ],
)
def test_what_is_not_an_answer_head_is_refused(data: bytes, error: str) -> None:
    with pytest.raises(HeadError, match=error):
        AnswerReader().feed(data)


def test_an_endless_head_is_refused_before_its_end() -> None:
    reader = AnswerReader()
    for _ in range(HEAD_LIMIT // 1000):
        assert reader.feed(b"x" * 1000) is None
    with pytest.raises(HeadError, match="over 16384"):
        reader.feed(b"x" * 1000)


def test_a_connection_ended_before_or_inside_the_head_is_said() -> None:
    with pytest.raises(HeadError, match="before an answer"):
        AnswerReader().eof()
    reader = AnswerReader()
    reader.feed(b"HTTP/1.1 101 Swi")
    with pytest.raises(HeadError, match="inside the answer's head"):
        reader.eof()


def test_a_101_to_another_protocol_is_not_an_upgrade() -> None:
    answer = AnswerReader().feed(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")
    assert answer is not None
    assert not answer.upgraded


def test_the_upgrade_request_carries_the_path_host_and_token() -> None:
    request = upgrade_request("/prefix/v1/session", "h:1", {"Authorization": "Bearer t"})
    assert request == (
        b"GET /prefix/v1/session HTTP/1.1\r\nHost: h:1\r\nConnection: Upgrade\r\n"
        b"Upgrade: aioelastic-session/1\r\nAuthorization: Bearer t\r\n\r\n"
    )


def _answer(status: int, body: object = None, **headers: str) -> Answer:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode() if body else b""
    return Answer(status, "Reason", headers, raw)


def test_refusals_map_to_the_errors_the_docs_list() -> None:
    auth = refusal_error(URL, _answer(401, {"error": "unauthorized", "message": "bad token"}))
    assert isinstance(auth, StoreAuthError)
    assert "refused the token" in str(auth)
    assert isinstance(refusal_error(URL, _answer(403)), StoreAuthError)
    for status in (429, 502, 503, 504):
        busy = refusal_error(URL, _answer(status, {"error": "unavailable", "message": "full"}))
        assert isinstance(busy, NotYet)  # tried again, with backoff
        assert (busy.status, busy.reason) == (status, "full")
    missing = refusal_error(URL, _answer(404, {"error": "not_found", "message": "no route"}))
    assert type(missing) is StoreConnectionError
    assert "has no session endpoint (/v1/session): an older server? (HTTP 404: no route)" in str(
        missing
    )
    other = refusal_error(URL, _answer(413, {"error": "too_large", "message": "big"}))
    assert type(other) is StoreConnectionError
    assert str(other) == f"cannot open a session to {URL}: HTTP 413: big"


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (
            _answer(400, b'No WebSocket UPGRADE hdr: aioelastic-session/1\n Can "Upgrade" only to'),
            'HTTP 400: No WebSocket UPGRADE hdr: aioelastic-session/1 Can "Upgrade" only to',
        ),
        (
            _answer(400, {"error": "bad_request", "message": "No WebSocket UPGRADE hdr"}),
            "HTTP 400: No WebSocket UPGRADE hdr",
        ),
        (_answer(426, b"Upgrade Required"), "HTTP 426: Upgrade Required"),
        (_answer(101, upgrade="websocket"), "Upgrade: websocket"),
        (_answer(101), "Upgrade: "),  # a 101 naming no protocol at all
    ],
)
def test_a_server_without_the_session_transport_is_told_to_upgrade(
    answer: Answer, said: str
) -> None:
    error = refusal_error(URL, answer)
    assert type(error) is StoreConnectionError
    assert str(error) == (
        f"the server at {URL} does not speak the session transport aioelastic-session/1 "
        f"({said}); upgrade aioelastic on the server"
    )


def test_a_refusal_whose_json_error_has_no_message_is_said_by_its_status() -> None:
    error = refusal_error(URL, _answer(500, {"error": "internal"}))
    assert str(error) == f"cannot open a session to {URL}: HTTP 500"


def test_a_reason_that_is_not_json_is_quoted_in_short() -> None:
    answer = _answer(400, b"<html>\n  <body>" + b"x" * 1000 + b"</body></html>")
    code, message = answer.error()
    assert code is None
    assert message.startswith("<html> <body>xxx")
    assert len(message) == 300


# -- against servers on 127.0.0.1 -------------------------------------------------------------


@contextlib.asynccontextmanager
async def _websocket_only_server() -> AsyncIterator[str]:
    """An aiohttp app whose ``/v1/session`` is a WebSocket, as aioelastic's before the raw
    session transport: it answers any other upgrade with aiohttp's 400."""

    async def session(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        ws = aiohttp.web.WebSocketResponse()
        await ws.prepare(request)
        await ws.close()
        return ws

    app = aiohttp.web.Application()
    app.router.add_get("/v1/session", session)
    runner = aiohttp.web.AppRunner(app, access_log=None, shutdown_timeout=1)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_a_websocket_only_server_is_a_clear_error_at_once() -> None:
    async with _websocket_only_server() as url, open_store(url, timeout=30) as store:
        assert isinstance(store, HttpStore)
        started = time.monotonic()
        with pytest.raises(StoreConnectionError) as info:
            await store.get("k")
        assert time.monotonic() - started < 10  # not retried until the deadline
        message = str(info.value)
        assert message.startswith(
            f"the server at {url} does not speak the session transport aioelastic-session/1 "
            "(HTTP 400: "
        )
        assert "WebSocket" in message  # aiohttp's own words, quoted
        assert message.endswith("upgrade aioelastic on the server")
        assert store.session.connect_retries == 0


@pytest.mark.asyncio
async def test_a_503_at_the_upgrade_is_tried_again_then_the_session_opens() -> None:
    busy = raw_answer(503, b'{"error": "too_many_connections", "message": "full, 4 of 4"}')
    async with (
        fake_session_server(_echo_none, refuse=lambda n: busy if n <= 2 else None) as (url, seen),
        open_store(url, timeout=30) as store,
    ):
        assert isinstance(store, HttpStore)
        assert await store.get("k") is None
        assert store.session.connect_retries == 2
        assert seen.connections == 3


@pytest.mark.asyncio
async def test_a_503_until_the_deadline_says_the_servers_reason() -> None:
    busy = raw_answer(503, b'{"error": "too_many_connections", "message": "full, 4 of 4"}')
    async with (
        fake_session_server(_echo_none, refuse=lambda n: busy) as (url, _),
        open_store(url, timeout=0.5, read_retries=0) as store,
    ):
        with pytest.raises(NotYet, match=r"HTTP 503: full, 4 of 4 \(still, after") as info:
            await store.get("k")
    assert (info.value.status, info.value.reason) == (503, "full, 4 of 4")


@pytest.mark.asyncio
async def test_a_401_at_the_upgrade_is_an_auth_error_with_the_servers_words() -> None:
    async with (
        HttpStoreServer(port=0, token="right") as server,
        open_store(server.url, token="wrong") as store,
    ):
        with pytest.raises(StoreAuthError, match=r"refused the token \(HTTP 401: .+\)"):
            await store.get("k")


async def _echo_none(peer: Peer, frame: list[Any]) -> None:
    peer.send([RESULT, frame[1], None])


@pytest.mark.asyncio
@pytest.mark.parametrize("length", [0, 1 << 31 | 1])
async def test_a_bad_message_length_from_the_server_ends_the_connection(length: int) -> None:
    async def bad_length(peer: Peer, frame: list[Any]) -> None:
        peer.send_raw(length.to_bytes(4, "big") + b"xyz")

    async with (
        fake_session_server(bad_length) as (url, seen),
        open_store(url, read_retries=1) as store,
    ):
        with pytest.raises(StoreConnectionError, match="malformed answer") as info:
            await store.get("k")
        assert not isinstance(info.value, WriteOutcomeUnknownError)
        assert f"a message of {length} bytes" in str(info.value)
        assert seen.ops == ["get", "get"]  # a read is sent again, on a new connection
        with pytest.raises(WriteOutcomeUnknownError, match="malformed answer"):
            await store.put("k", b"v")
        assert seen.connections == 3


@pytest.mark.asyncio
async def test_the_answers_before_a_bad_message_length_are_delivered() -> None:
    async def answer_then_bad_length(peer: Peer, frame: list[Any]) -> None:
        answer = pack([RESULT, frame[1], [frame[3][0], b"v", 1, 1, 1, 0]])
        peer.send_raw(message_header(len(answer)) + answer + message_header(0))  # one write

    async with (
        fake_session_server(answer_then_bad_length) as (url, seen),
        open_store(url, read_retries=0) as store,
    ):
        kv = await store.get("k")  # answered, although the same read then broke the stream
        assert kv is not None
        assert kv.value == b"v"
        kv = await store.get("k2")  # on a new connection: the first one ended at the bad length
        assert kv is not None
        assert seen.connections == 2


@pytest.mark.asyncio
async def test_the_servers_last_error_frame_is_the_reason_callers_get() -> None:
    async def too_slow(peer: Peer, frame: list[Any]) -> str:
        peer.send([ERROR, 0, "too_slow", "the client read nothing for 30 s", {}])
        return "hang up"

    async with (
        fake_session_server(too_slow) as (url, _),
        open_store(url, read_retries=0) as store,
    ):
        with pytest.raises(StoreConnectionError) as info:
            await store.get("k")
        assert "the server said: the client read nothing for 30 s (too_slow)" in str(info.value)
        with pytest.raises(WriteOutcomeUnknownError, match=r"\(too_slow\)"):
            await store.put("k", b"v")
