"""The raw session transport's edges over a recording transport (no socket): a transport
paused before the hello, the hello's deadline and the end after it, the write buffer the
connection is told of, messages cut to their bound, and a silent connection's read deadline
when its transport is already closing. The same paths on real sockets are
``tests/test_http_session_raw.py``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers.session_conn import make_hub
from helpers.transport import Transport
from helpers.waiting import eventually

from aioelastic.store.http._frames import (
    ERROR,
    PROTOCOL_VERSIONS,
    REQUEST,
    RESULT,
    pack,
)
from aioelastic.store.http._intake import Intake
from aioelastic.store.http._session_raw import RawSession, upgrade
from aioelastic.store.http._session_server import SessionHub
from aioelastic.store.http._session_stream import message_header
from aioelastic.store.memory import MemoryEngine


def _message(*frames: list[Any]) -> bytes:
    body = b"".join(pack(frame) for frame in frames)
    return message_header(len(body)) + body


HELLO = _message([REQUEST, 0, "hello", {"versions": [1]}])


def _raw(hub: SessionHub) -> tuple[RawSession, Transport, list[Exception | None]]:
    transport, lost = Transport(), list[Exception | None]()
    session = RawSession(hub, lost.append, transport)
    hub.raw_sessions.add(session)
    return session, transport, lost


@pytest.mark.asyncio
async def test_a_transport_paused_before_the_hello_pauses_the_connection_it_makes() -> None:
    session, transport, _ = _raw(make_hub(MemoryEngine()))
    session.start()
    session.pause_writing()  # (a client that sent its hello and stopped reading)
    session.data_received(HELLO)
    assert session.connection is not None
    assert session.connection._paused
    session.resume_writing()
    assert not session.connection._paused
    [welcome] = transport.frames()
    assert welcome[:2] == [RESULT, 0]


@pytest.mark.asyncio
async def test_the_connection_is_told_the_transports_write_buffer_until_the_end() -> None:
    session, transport, _ = _raw(make_hub(MemoryEngine()))
    transport.buffer = 12345
    assert session.buffered() == 12345
    session.connection_lost(None)
    assert session.buffered() == 0  # (ended: nothing more is written)


@pytest.mark.asyncio
async def test_no_hello_in_time_is_refused_and_the_end_after_it_is_quiet() -> None:
    hub = make_hub(MemoryEngine())
    hub.hello_timeout = 0.01
    session, transport, lost = _raw(hub)
    session.start()
    await eventually(lambda: transport.closed, 10, "the hello's deadline")
    assert transport.frames() == [[ERROR, 0, "hello_timeout", "no hello within 0.01s", {}]]
    session.connection_lost(None)  # the FIN after the error frame
    assert lost == [None]  # the budget and aiohttp are told
    assert session.closed.done()
    assert session not in hub.raw_sessions


@pytest.mark.asyncio
async def test_a_refused_hello_cuts_its_message_to_300_characters() -> None:
    session, transport, _ = _raw(make_hub(MemoryEngine()))
    session.refuse("bad_hello", "x" * 1000)
    [frame] = transport.frames()
    assert frame[:3] == [ERROR, 0, "bad_hello"]
    assert frame[3] == "x" * 300
    assert transport.closed


@pytest.mark.asyncio
async def test_a_hello_refused_by_the_hub_cuts_its_message_to_300_characters() -> None:
    """An unsupported version list is quoted in the refusal, cut to its bound."""
    session, transport, _ = _raw(make_hub(MemoryEngine()))
    session.start()
    session.data_received(_message([REQUEST, 0, "hello", {"versions": [99] * 500}]))
    [frame] = transport.frames()
    assert frame[:3] == [ERROR, 0, "unsupported_version"]
    assert len(frame[3]) == 300
    supported = list(PROTOCOL_VERSIONS)
    assert frame[3].startswith(f"this server speaks session protocol versions {supported}")
    assert frame[4] == {"supported": supported}
    assert session.connection is None


@pytest.mark.asyncio
async def test_a_silent_connection_whose_transport_is_closing_gets_no_408() -> None:
    observed: list[tuple[str, int, float]] = []
    intake = Intake(
        lambda *args: None,  # type: ignore[arg-type]
        budget=None,
        read_timeout=0.01,
        observe=lambda *args: observed.append(args),
        upgrade=None,
    )
    connection = intake()
    transport = Transport(closing=True)  # (the client's FIN is being read)
    connection.connection_made(transport)  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert transport.data == b""
    assert not transport.closed
    assert observed == []
    connection.connection_lost(None)
    assert not intake.live


@pytest.mark.asyncio
async def test_a_shutdown_refuses_an_upgraded_connection_still_without_its_hello() -> None:
    hub = make_hub(MemoryEngine())
    waiting, waiting_transport, _ = _raw(hub)
    waiting.start()
    greeted, greeted_transport, _ = _raw(hub)
    greeted.start()
    greeted.data_received(HELLO)
    greeted_transport.data = b""  # (the welcome)
    hub.shutdown()
    assert waiting_transport.frames() == [
        [ERROR, 0, "unavailable", "the server is shutting down", {}]
    ]
    assert waiting_transport.closed
    assert greeted_transport.frames() == [
        [ERROR, 0, "unavailable", "the server is shutting down", {}]
    ]
    assert greeted_transport.closed


@pytest.mark.asyncio
async def test_wait_closed_waits_for_the_ends_then_drops_what_is_left() -> None:
    hub = make_hub(MemoryEngine())
    ending, ending_transport, _ = _raw(hub)
    stuck, stuck_transport, _ = _raw(hub)
    for session in (ending, stuck):
        session.start()
    hub.shutdown()
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, ending.connection_lost, None)  # the FIN after the error frame
    started = loop.time()
    await hub.wait_closed(0.3)
    assert loop.time() - started >= 0.25  # (the stuck one was waited for, to the timeout)
    assert not ending_transport.aborted
    assert stuck_transport.aborted
    written = stuck_transport.data
    stuck.write([pack([RESULT, 1, None])])  # (dropped: nothing more is written)
    assert stuck_transport.data == written
    assert hub.raw_sessions == {stuck}  # (its connection_lost, after the abort, forgets it)
    stuck.connection_lost(None)
    assert hub.raw_sessions == set()


@pytest.mark.asyncio
async def test_wait_closed_returns_at_once_when_every_session_has_ended() -> None:
    hub = make_hub(MemoryEngine())
    session, transport, _ = _raw(hub)
    session.start()
    hub.shutdown()
    session.connection_lost(None)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await hub.wait_closed(5.0)
    assert loop.time() - started < 1.0
    assert not transport.aborted


@pytest.mark.asyncio
async def test_bytes_read_before_the_101_is_out_are_read_after_it() -> None:
    """A client that sent its hello before the 101 was written (aiohttp's path: the protocol is
    the session's before the answer goes out): held, then read once the session starts."""
    session, transport, _ = _raw(make_hub(MemoryEngine()))
    session.data_received(HELLO[:5])
    session.data_received(HELLO[5:])
    assert transport.data == b""
    assert session.connection is None
    session.start()
    assert session.connection is not None
    [welcome] = transport.frames()
    assert welcome[:2] == [RESULT, 0]


@pytest.mark.asyncio
async def test_a_transport_resumed_before_the_hello_leaves_the_connection_writing() -> None:
    session, _, _ = _raw(make_hub(MemoryEngine()))
    session.start()
    session.pause_writing()
    session.resume_writing()
    session.data_received(HELLO)
    assert session.connection is not None
    assert not session.connection._paused


@pytest.mark.asyncio
async def test_after_its_close_a_session_writes_nothing_more() -> None:
    session, transport, _ = _raw(make_hub(MemoryEngine()))
    session.start()
    session.close("first", pack([ERROR, 0, "first", "the end", {}]))
    written = transport.data
    session.close("second", pack([ERROR, 0, "second", "again", {}]))
    session.write([pack([RESULT, 1, None])])
    assert transport.data == written
    assert transport.frames() == [[ERROR, 0, "first", "the end", {}]]
    assert session.buffered() == 0


@pytest.mark.asyncio
async def test_the_transports_end_is_told_with_its_error() -> None:
    session, _, lost = _raw(make_hub(MemoryEngine()))
    session.start()
    error = ConnectionResetError("reset by peer")
    session.connection_lost(error)
    assert lost == [error]


@pytest.mark.asyncio
async def test_aiohttps_route_without_a_transport_says_the_client_went_away() -> None:
    class Request:
        headers: dict[str, str] = {}
        transport = None

    with pytest.raises(ConnectionResetError, match=r"^the client went away before the upgrade$"):
        await upgrade(make_hub(MemoryEngine()), Request())  # type: ignore[arg-type]
