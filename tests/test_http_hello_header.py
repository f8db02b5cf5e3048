"""A new session's hello in the upgrade's ``Aioelastic-Hello`` header (real server, 127.0.0.1,
driven by hand with ``helpers.session_wire``): answered with ``Aioelastic-Hello: taken`` in the
101 and the welcome (or the refusal) as the first message after it, on the server's direct path
and on aiohttp's alike; a header that is not a hello is a 400, never a hang or a 5xx."""

from __future__ import annotations

import json

import pytest
from helpers.session_wire import hello_value, session_wire, upgrade_answer

from aioelastic.store.http._frames import ERROR, REQUEST, RESULT
from aioelastic.store.http._session_stream import (
    MAX_HELLO_HEADER,
    UPGRADE,
    hello_from_header,
    hello_header,
)
from aioelastic.store.http.server import HttpStoreServer

#: 1: the whole head in one read (the server's direct path); 2: cut over two reads (aiohttp's)
PATHS = pytest.mark.parametrize("pieces", [1, 2], ids=["direct", "aiohttp"])


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 100, 1000])
def test_the_header_value_carries_any_bytes_unpadded(size: int) -> None:
    body = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    value = hello_header(body)
    assert "=" not in value
    assert value.isascii()
    assert hello_from_header(value) == (body or None)  # (an empty value is no hello)
    assert hello_from_header(f"  {value}  ") == (body or None)


def test_a_value_that_ends_in_any_letter_keeps_it() -> None:
    """Only the padding is cut: ``X`` is a base64 digit (bytes 0, 0, 0x17 are ``AAAX``)."""
    assert hello_header(b"\x00\x00\x17") == "AAAX"
    assert hello_header(b"\xff\xff") == "__8"
    assert hello_from_header("__8") == b"\xff\xff"


def test_a_value_of_the_longest_length_is_read_and_one_longer_is_not() -> None:
    longest = "A" * MAX_HELLO_HEADER
    assert hello_from_header(longest) == bytes(MAX_HELLO_HEADER * 3 // 4)
    assert hello_from_header(longest + "AAAA") is None


@pytest.mark.parametrize(
    "value", ["a", "!!!!", "YQ=Y", "é", "YW Jj", "x" * (MAX_HELLO_HEADER + 4), ""]
)
def test_what_is_not_base64url_is_no_hello(value: str) -> None:
    assert hello_from_header(value) is None


@PATHS
@pytest.mark.asyncio
async def test_a_hello_in_the_upgrade_is_welcomed_right_after_the_101(pieces: int) -> None:
    async with (
        HttpStoreServer(port=0, token="sekrit") as server,
        session_wire(server.url, token="sekrit", pieces=pieces, hello=hello_value()) as wire,
    ):
        assert wire.headers["aioelastic-hello"] == "taken"
        [welcome] = await wire.recv()
        assert welcome[:2] == [RESULT, 0]
        assert welcome[2]["version"] == 1
        assert welcome[2]["resumed"] is False
        await wire.send([[REQUEST, 1, "get", ["k"]], [REQUEST, 2, "revision", []]])
        frames = await wire.recv()
        assert [f[:2] for f in frames] == [[RESULT, 1], [RESULT, 2]]
        assert server.statistics()["sessions"] == 1


@PATHS
@pytest.mark.asyncio
async def test_requests_right_behind_a_hello_header_are_answered_after_the_welcome(
    pieces: int,
) -> None:
    """The welcome goes first, whatever came with the head (on the direct path, in its read)."""
    async with (
        HttpStoreServer(port=0) as server,
        session_wire(server.url, pieces=pieces, hello=hello_value()) as wire,
    ):
        await wire.send([[REQUEST, 7, "revision", []]])
        [welcome] = await wire.recv()
        assert welcome[:2] == [RESULT, 0]
        [answer] = await wire.recv()
        assert answer[:2] == [RESULT, 7]


@PATHS
@pytest.mark.asyncio
async def test_a_refused_hello_header_is_an_error_frame_after_the_101_then_the_end(
    pieces: int,
) -> None:
    async with (
        HttpStoreServer(port=0) as server,
        session_wire(server.url, pieces=pieces, hello=hello_value(versions=[99])) as wire,
    ):
        assert wire.headers["aioelastic-hello"] == "taken"
        [error] = await wire.recv()
        assert error[:3] == [ERROR, 0, "unsupported_version"]
        assert error[4]["supported"] == [1, 2]
        assert await wire.closed()
        assert server.statistics()["sessions"] == 0


@pytest.mark.asyncio
async def test_a_header_that_is_not_a_hello_is_a_400_that_says_so() -> None:
    async with HttpStoreServer(port=0) as server:
        status, headers, body = await upgrade_answer(server.url, UPGRADE, hello="not base64!")
        assert status == 400
        assert "aioelastic-hello" not in headers
        answer = json.loads(body)
        assert answer["error"] == "bad_hello"
        assert "Aioelastic-Hello" in answer["message"]
        assert server.statistics()["sessions"] == 0


@pytest.mark.asyncio
async def test_a_hello_header_without_the_token_is_not_greeted() -> None:
    async with HttpStoreServer(port=0, token="sekrit") as server:
        status, headers, _ = await upgrade_answer(server.url, UPGRADE, hello=hello_value())
        assert status == 401
        assert "aioelastic-hello" not in headers
        assert server.statistics()["sessions"] == 0


@pytest.mark.asyncio
async def test_without_the_header_the_101_says_nothing_of_a_hello() -> None:
    """The client sends its hello as a message when the 101 has no ``Aioelastic-Hello``."""
    async with HttpStoreServer(port=0) as server, session_wire(server.url) as wire:
        assert "aioelastic-hello" not in wire.headers
        assert (await wire.hello())["version"] == 1
