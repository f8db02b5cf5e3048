"""The direct upgrade (``store/http/_session_raw.py``: ``DirectUpgrade.take``) header by header
over a recording transport, no socket: what it takes (and then writes), and every request it
leaves to aiohttp untouched (which answers it as it always has: a 101 too, or the refusal;
``tests/test_http_session_intake.py`` runs both paths on real sockets)."""

from __future__ import annotations

import pytest
from helpers.session_conn import make_hub
from helpers.transport import Transport

from aioelastic.store.http._frames import REQUEST, RESULT, pack
from aioelastic.store.http._session_raw import (
    SESSION_REQUEST_LINE,
    SWITCHING,
    SWITCHING_HELLO,
    DirectUpgrade,
    RawSession,
)
from aioelastic.store.http._session_stream import hello_header, message_header
from aioelastic.store.memory import MemoryEngine

TOKEN = b"s3cret-token"
HELLO = pack([REQUEST, 0, "hello", {"versions": [1]}])


def _head(*lines: bytes) -> bytes:
    return SESSION_REQUEST_LINE + b"".join(line + b"\r\n" for line in lines) + b"\r\n"


PLAIN = (b"Host: h", b"Connection: Upgrade", b"Upgrade: aioelastic-session/1")


def _take(data: bytes, token: bytes | None = None) -> tuple[RawSession | None, Transport]:
    hub = make_hub(MemoryEngine())
    transport = Transport()
    lost: list[Exception | None] = []
    session = DirectUpgrade(hub, token).take(transport, data, lost.append)
    if session is None:
        assert transport.data == b""  # nothing done: aiohttp gets the bytes as they came
        assert transport.protocol is None
        assert not hub.raw_sessions
    else:
        assert transport.protocol is session
        assert hub.raw_sessions == {session}
    return session, transport


@pytest.mark.parametrize(
    "lines",
    [
        PLAIN,
        (b"Connection: keep-alive, Upgrade", b"Upgrade: aioelastic-session/1"),
        (b"Connection: UPGRADE ,close", b"Upgrade:  Aioelastic-Session/1 "),
        (b"Connection: Upgrade,close", b"Upgrade: aioelastic-session/1"),
        (b"connection: upgrade", b"upgrade: aioelastic-session/1", b"X-Other: 1"),
    ],
)
@pytest.mark.asyncio
async def test_an_upgrade_to_the_session_is_taken_and_answered_101(lines: tuple[bytes]) -> None:
    session, transport = _take(_head(*lines))
    assert session is not None
    assert transport.data == SWITCHING
    assert session.connection is None  # the hello is still to come


@pytest.mark.parametrize(
    "lines",
    [
        (b"Host: h", b"Upgrade: aioelastic-session/1"),  # no Connection: Upgrade
        (b"Connection: upgraded", b"Upgrade: aioelastic-session/1"),
        (b"Connection: Upgrade", b"Upgrade: websocket"),
        (b"Connection: Upgrade", b"Upgrade: aioelastic-session/2"),
        (b"Connection: Upgrade",),
        (*PLAIN, b"Content-Length: 0"),
        (*PLAIN, b"Transfer-Encoding: chunked"),
        (*PLAIN, b"Content-Encoding: gzip"),
        (*PLAIN, b"Expect: 100-continue"),
        (*PLAIN, b"Aioelastic-Hello: not base64url!"),
    ],
)
@pytest.mark.asyncio
async def test_a_request_the_direct_path_does_not_take_is_left_untouched(
    lines: tuple[bytes],
) -> None:
    session, _ = _take(_head(*lines))
    assert session is None


@pytest.mark.asyncio
async def test_a_stopping_hub_takes_nothing() -> None:
    hub = make_hub(MemoryEngine())
    hub.closing = True
    transport = Transport()
    assert DirectUpgrade(hub, None).take(transport, _head(*PLAIN), lambda exc: None) is None
    assert transport.data == b""


@pytest.mark.parametrize(
    "authorization", [b"Bearer s3cret-token", b"bearer s3cret-token", b"BEARER  s3cret-token "]
)
@pytest.mark.asyncio
async def test_with_a_token_the_bearer_token_is_taken(authorization: bytes) -> None:
    session, _ = _take(_head(*PLAIN, b"Authorization: " + authorization), TOKEN)
    assert session is not None


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        b"Bearer",
        b"Bearer ",
        b"Basic s3cret-token",
        b"Bearer s3cret-toke",
        b"Bearer s3cret-token2",
        b"s3cret-token",
        b"Bearer\ts3cret-token",  # (the scheme ends at a space)
    ],
)
@pytest.mark.asyncio
async def test_with_a_token_anything_else_is_left_to_aiohttp_to_refuse(
    authorization: bytes | None,
) -> None:
    lines = PLAIN if authorization is None else (*PLAIN, b"Authorization: " + authorization)
    session, _ = _take(_head(*lines), TOKEN)
    assert session is None


@pytest.mark.asyncio
async def test_without_a_token_any_authorization_is_taken() -> None:
    session, _ = _take(_head(*PLAIN, b"Authorization: Basic x"))
    assert session is not None


@pytest.mark.asyncio
async def test_a_hello_in_the_header_is_welcomed_in_the_same_write_as_the_101() -> None:
    header = b"Aioelastic-Hello: " + hello_header(HELLO).encode()
    session, transport = _take(_head(*PLAIN, header))
    assert session is not None
    assert session.connection is not None
    assert transport.data.startswith(SWITCHING_HELLO)
    (welcome,) = transport.frames_after(len(SWITCHING_HELLO))
    assert welcome[:2] == [RESULT, 0]


@pytest.mark.asyncio
async def test_the_bytes_after_the_head_are_the_sessions_first_read() -> None:
    session, transport = _take(_head(*PLAIN) + message_header(len(HELLO)) + HELLO)
    assert session is not None
    assert session.connection is not None
    assert transport.data.startswith(SWITCHING)
    (welcome,) = transport.frames_after(len(SWITCHING))
    assert welcome[:2] == [RESULT, 0]
