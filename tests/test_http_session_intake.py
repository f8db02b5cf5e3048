"""A new connection's first read (``store/http/_intake.py``): a session's whole upgrade request
is taken to the session stream directly, never through aiohttp's request machinery; anything
else (a head cut over reads, a wrong token, a header the direct path does not take, a server
over its limit) is aiohttp's, answered as it always was. Real servers on loopback, plus the head
parser on its own."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest
from helpers.session_wire import UpgradeRefused, session_wire
from helpers.waiting import eventually
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.store import LeaseStatus
from aioelastic.store.http._frames import REQUEST, RESULT, pack, unpack_all
from aioelastic.store.http._session_raw import (
    MAX_DIRECT_HEAD,
    SESSION_REQUEST_LINE,
    SWITCHING,
    session_head,
)
from aioelastic.store.http._session_stream import UPGRADE, MessageReader, message_header
from aioelastic.store.http.server import HttpStoreServer

HEAD = (
    b"GET /v1/session HTTP/1.1\r\nHost: 127.0.0.1:1\r\nConnection: Upgrade\r\n"
    b"Upgrade: aioelastic-session/1\r\n\r\n"
)


def _aiohttp_connections(server: HttpStoreServer) -> int:
    runner = server._runner
    assert runner is not None
    assert runner.server is not None
    return len(runner.server.connections)


async def _metrics(server: HttpStoreServer) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/metrics") as answer:
        return await answer.text()


def _sample(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


# -- real servers ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_whole_upgrade_in_one_read_is_a_session_aiohttp_never_sees() -> None:
    async with HttpStoreServer(port=0, max_connections=4) as server:
        async with session_wire(server.url) as wire:
            welcome = await wire.hello()
            assert welcome["resumed"] is False
            assert _aiohttp_connections(server) == 0  # aiohttp never had the connection
            text = await _metrics(server)
            assert _sample(text, "aioelastic_connections") == 2  # this and the scrape's own
            assert _sample(text, "aioelastic_sessions") == 1
        await eventually(lambda: server.statistics()["sessions"] == 0, 10, "the session ended")
        text = await _metrics(server)
        # metered at its end, as the upgrade through aiohttp's route is
        assert _sample(text, "aioelastic_requests_total", '{code="101",op="session"}') == 1
        assert _sample(text, "aioelastic_connections") == 1
        # the budget forgot it: max_connections sessions, one after another, and then all at once
        for _ in range(6):
            async with session_wire(server.url) as wire:
                await wire.hello()
        await eventually(lambda: server.statistics()["sessions"] == 0, 10, "the sessions ended")
        wires = [session_wire(server.url) for _ in range(4)]
        opened = [await w.__aenter__() for w in wires]
        try:
            await asyncio.gather(*(w.hello() for w in opened))
        finally:
            for w in reversed(wires):
                await w.__aexit__(None, None, None)


@pytest.mark.asyncio
async def test_an_upgrade_cut_over_two_reads_goes_through_aiohttp_to_the_same_session() -> None:
    async with (
        HttpStoreServer(port=0) as server,
        session_wire(server.url, pieces=2) as cut,
        session_wire(server.url) as whole,
    ):
        assert _aiohttp_connections(server) == 1  # the cut one: aiohttp's route upgraded it
        cut_welcome, whole_welcome = await cut.hello(), await whole.hello()
        assert cut_welcome.keys() == whole_welcome.keys()
        for wire in (cut, whole):
            await wire.send([[REQUEST, 1, "put", ["k", b"v", 0]]])
            [answer] = await wire.recv()
            assert answer[:2] == [RESULT, 1]


@pytest.mark.asyncio
async def test_the_upgrade_and_the_hello_and_requests_in_one_write() -> None:
    async with HttpStoreServer(port=0) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            hello = pack([REQUEST, 0, "hello", {"versions": [1]}])
            ops = pack([REQUEST, 1, "put", ["a", b"1", 0]]) + pack([REQUEST, 2, "get", ["a"]])
            writer.write(HEAD + message_header(len(hello)) + hello + message_header(len(ops)) + ops)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head == SWITCHING
            messages = MessageReader(1 << 20)
            frames: list[list[object]] = []
            while len(frames) < 3:
                data = await asyncio.wait_for(reader.read(1 << 16), 10)
                assert data, "the server closed the connection"
                for body in messages.feed(data):
                    frames += unpack_all(body, max_len=1 << 20)
            assert [frame[:2] for frame in frames] == [[RESULT, 0], [RESULT, 1], [RESULT, 2]]
            assert frames[2][2][1] == b"1"  # type: ignore[index]
        finally:
            writer.close()


@pytest.mark.asyncio
async def test_with_a_token_the_direct_upgrade_needs_it_and_a_wrong_one_gets_the_401() -> None:
    async with HttpStoreServer(port=0, token="s3cret") as server:
        async with session_wire(server.url, token="s3cret") as wire:
            await wire.hello()
            assert _aiohttp_connections(server) == 0
        for token in (None, "wrong"):
            with pytest.raises(UpgradeRefused) as refused:
                async with session_wire(server.url, token=token):
                    pass
            assert refused.value.status == 401
            assert refused.value.json()["error"] == "unauthorized"
            assert "s3cret" not in refused.value.body.decode()


@pytest.mark.asyncio
async def test_a_silent_connection_still_gets_the_408_at_the_read_deadline() -> None:
    async with HttpStoreServer(port=0, read_timeout=0.3) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            answer = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b'"request_timeout"' in answer
        # and a head begun but never finished: the deadline runs from the connection
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            loop = asyncio.get_running_loop()
            started = loop.time()
            await asyncio.sleep(0.2)
            writer.write(b"GET /healthz HTTP/1.1\r\n")
            answer = await asyncio.wait_for(reader.read(), 10)
            assert loop.time() - started < 0.45  # not 0.3 s after the first byte
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 408 ")


@pytest.mark.asyncio
async def test_shutdown_waits_for_directly_taken_sessions_to_end() -> None:
    server = HttpStoreServer(port=0, shutdown_timeout=30)
    await server.start()
    async with session_wire(server.url) as wire:
        await wire.hello()
        await asyncio.wait_for(server.aclose(), 10)
        [frame] = await wire.recv()
        assert frame[2] == "unavailable"
        assert await wire.closed()


@pytest.mark.asyncio
async def test_a_408_is_metered_as_other_with_its_wait_and_frees_its_budget_slot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The silent connection's end after its 408 reaches the budget like any other end (a
    connection that never spoke must not hold a slot), and the 408 is metered with the time
    it waited."""
    async with HttpStoreServer(port=0, read_timeout=0.3, max_connections=2) as server:
        for _ in range(3):  # more than max_connections, one after another
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            try:
                answer = await asyncio.wait_for(reader.read(), 10)
            finally:
                writer.close()
            assert answer.startswith(b"HTTP/1.1 408 ")
        intake = server._intake
        assert intake is not None
        assert intake.budget is not None
        budget = intake.budget
        await eventually(lambda: not intake.live and budget.open == 0, 10, "the budget forgot them")
        text = await _metrics(server)
        assert _sample(text, "aioelastic_requests_total", '{code="408",op="other"}') == 3
        waited = _sample(text, "aioelastic_request_duration_seconds_sum", '{op="other"}')
        assert 3 * 0.25 <= waited < 3 * 5, waited
        assert _sample(text, "aioelastic_connections") == 1  # the scrape's own
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


# -- the head parser ------------------------------------------------------------------------------


def test_a_plain_session_head_is_parsed_with_the_bytes_after_it() -> None:
    parsed = session_head(HEAD + b"\x00\x00\x00\x01x")
    assert parsed == (
        {"host": "127.0.0.1:1", "connection": "Upgrade", "upgrade": UPGRADE},
        b"\x00\x00\x00\x01x",
    )
    assert session_head(b"GET /v1/session HTTP/1.1\r\n\r\n") == ({}, b"")


@pytest.mark.parametrize(
    "data",
    [
        HEAD.replace(b"HTTP/1.1", b"HTTP/1.0"),
        HEAD.replace(b"/v1/session", b"/v1/session?x=1"),
        HEAD.replace(b"/v1/session", b"/v1/sessions"),
        HEAD.replace(b"GET", b"POST"),
        HEAD.replace(b"Upgrade:", b"Upgrade :"),  # a space before the colon
        HEAD.replace(b"Connection: Upgrade\r\n", b"Connection: Upgrade\r\n continued\r\n"),
        HEAD.replace(b"Connection: Upgrade\r\n", b"Connection: Upgrade\r\nconnection: x\r\n"),
        HEAD.replace(b"Host: 127.0.0.1:1", b"Host: a\x00b"),
        HEAD.replace(b"\r\nHost", b"\nHost"),
        HEAD.replace(b"Host: 127.0.0.1:1", b"Host: " + b"h" * 9000),
        HEAD.replace(b"\r\n\r\n", b"\r\n" + b"X-A: 1\r\n" * 40 + b"\r\n"),
    ],
)
def test_a_head_the_direct_path_does_not_take_is_left_to_aiohttp(data: bytes) -> None:
    assert session_head(data) is None


@given(st.integers(min_value=0, max_value=len(HEAD) - 1))
def test_a_head_not_whole_yet_is_left_to_aiohttp(cut: int) -> None:
    assert session_head(HEAD[:cut]) is None


def _head_of(*lines: bytes) -> bytes:
    return SESSION_REQUEST_LINE + b"".join(line + b"\r\n" for line in lines) + b"\r\n"


def test_the_bytes_after_the_head_are_all_the_tail_whatever_they_hold() -> None:
    assert session_head(SESSION_REQUEST_LINE + b"\r\ntail") == ({}, b"tail")
    tail = b"\x00\x00\x00\x04\r\n\r\n"  # (a message whose bytes look like a head's end)
    parsed = session_head(HEAD + tail)
    assert parsed is not None
    assert parsed[1] == tail


def test_a_head_of_32_header_lines_is_taken_and_one_of_33_is_not() -> None:
    lines = [b"X-%d: 1" % i for i in range(32)]
    parsed = session_head(_head_of(*lines))
    assert parsed is not None
    assert len(parsed[0]) == 32
    assert session_head(_head_of(*lines, b"X-32: 1")) is None


def test_a_head_of_8_kib_is_taken_and_a_byte_longer_is_not() -> None:
    pad = MAX_DIRECT_HEAD - len(SESSION_REQUEST_LINE) - len(b"X-Pad: ")
    longest = _head_of(b"X-Pad: " + b"p" * pad)
    assert longest.index(b"\r\n\r\n") == MAX_DIRECT_HEAD
    assert session_head(longest) == ({"x-pad": "p" * pad}, b"")
    assert session_head(_head_of(b"X-Pad: " + b"p" * (pad + 1))) is None


def test_header_names_are_lower_cased_and_values_trimmed_and_read_as_latin_1() -> None:
    parsed = session_head(
        _head_of(b"X-Mixed-Case:\t v a l \t ", b"X-Empty:", b"X-Latin: caf\xe9") + b"tail"
    )
    assert parsed == ({"x-mixed-case": "v a l", "x-empty": "", "x-latin": "caf\u00e9"}, b"tail")


@pytest.mark.asyncio
async def test_a_new_session_adopts_the_live_leases_it_claims_without_a_lease_snapshot() -> None:
    """A client back after a server restart names its leases in the hello: the new session owns
    those that are live and unowned, each looked up alone (ten thousand clients coming back at
    once must not each copy the whole lease table)."""
    async with HttpStoreServer(port=0) as server:
        engine = server.engine
        mine, theirs = engine.lease_grant(30).id, engine.lease_grant(30).id
        for _ in range(50):
            engine.lease_grant(30)
        async with session_wire(server.url) as other:
            await other.hello(leases=[theirs])  # owned by a live session now
            snapshots = 0
            leases = engine.leases

            def counted() -> list[LeaseStatus]:
                nonlocal snapshots
                snapshots += 1
                return leases()

            engine.leases = counted  # type: ignore[method-assign]
            async with session_wire(server.url) as wire:
                welcome = await wire.hello(leases=[mine, theirs, 999_999, "x"])
            assert welcome["leases"] == [mine]
            assert snapshots == 0
