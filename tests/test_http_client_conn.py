"""The client connection's own rules, at unit level (a recording transport stands in for the
socket; the real-socket behaviour is in test_http_client.py): one write per loop turn, a lone
request at once, back-pressure respected, one deadline timer for all requests."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aioelastic.store.http._client_conn import Connection, ConnectionLost
from aioelastic.store.http._client_requests import Requests
from aioelastic.store.http._frames import RESULT, pack, unpack_all
from aioelastic.store.http._session_stream import MessageReader, message_header


class _Transport:
    """Records writes; ``abort`` ends the connection as a real transport does (soon)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.writes: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def abort(self) -> None:
        self.aborted = True
        asyncio.get_running_loop().call_soon(self.conn.connection_lost, None)

    close = abort

    def messages(self) -> list[list[str]]:
        """The ops of each message written."""
        reader = MessageReader(1 << 20)
        return [
            [frame[2] for frame in unpack_all(message, max_len=1 << 20)]
            for message in reader.feed(b"".join(self.writes))
        ]


def _open() -> tuple[Connection, _Transport]:
    conn = Connection(asyncio.get_running_loop())
    transport = _Transport(conn)
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: aioelastic-session/1\r\n\r\n")
    conn.attach(lambda _: None, 1 << 20)
    return conn, transport


def _request(conn: Connection, rid: int, op: str, timeout: float = 30) -> asyncio.Future[Any]:
    return conn.request(rid, op, [], False, timeout)


@pytest.mark.asyncio
async def test_a_lone_request_goes_at_once_and_a_turns_others_in_one_write() -> None:
    conn, transport = _open()
    _request(conn, 1, "a")
    assert transport.messages() == [["a"]]  # written before the caller awaits anything
    for rid, op in ((2, "b"), (3, "c"), (4, "d")):
        _request(conn, rid, op)
    assert len(transport.writes) == 1  # queued until the end of this loop turn
    await asyncio.sleep(0)
    assert len(transport.writes) == 2
    assert transport.messages() == [["a"], ["b", "c", "d"]]


@pytest.mark.asyncio
async def test_callers_answered_by_one_message_send_their_next_requests_in_one_write() -> None:
    # 8 callers in flight, answered in one message: each sends its next request as it wakes;
    # the first of them is then the one request pending, yet it waits for the others (one
    # message), instead of going alone and the rest after it.
    conn, transport = _open()
    callers = 8

    async def caller(n: int) -> None:
        await _request(conn, n, "first")
        await _request(conn, 100 + n, "next")

    tasks = [asyncio.ensure_future(caller(n)) for n in range(callers)]
    for _ in range(2):  # the callers' first steps, then the flush of what they queued
        await asyncio.sleep(0)
    assert [len(ops) for ops in transport.messages()] == [1, callers - 1]
    answers = b"".join(pack([RESULT, n, None]) for n in range(callers))
    conn.data_received(message_header(len(answers)) + answers)
    await asyncio.sleep(0)  # the callers wake and send; the flush after them
    assert transport.messages()[2:] == [["next"] * callers]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.asyncio
async def test_a_lone_answer_leaves_the_next_request_to_go_at_once() -> None:
    conn, transport = _open()
    first = _request(conn, 1, "first")
    answer = pack([RESULT, 1, None])
    conn.data_received(message_header(len(answer)) + answer)
    await first
    _request(conn, 2, "next")
    assert transport.messages() == [["first"], ["next"]]  # written before any loop turn


@pytest.mark.asyncio
async def test_a_batch_over_the_servers_message_bound_goes_as_several_messages() -> None:
    conn, transport = _open()
    conn.max_message = 40
    _request(conn, 1, "first")
    for rid in range(2, 8):
        _request(conn, rid, "x" * 10)  # about 16 bytes a frame
    await asyncio.sleep(0)
    sizes = [len(ops) for ops in transport.messages()]
    assert sizes[0] == 1
    assert sum(sizes[1:]) == 6
    assert len(sizes) > 2


@pytest.mark.asyncio
async def test_nothing_is_written_while_the_transport_pauses_us() -> None:
    conn, transport = _open()
    conn.pause_writing()
    _request(conn, 1, "a")
    _request(conn, 2, "b")
    await asyncio.sleep(0)
    assert transport.writes == []
    conn.resume_writing()
    assert transport.messages() == [["a", "b"]]


@pytest.mark.asyncio
async def test_a_deadline_passing_while_paused_ends_the_connection() -> None:
    conn, transport = _open()
    conn.pause_writing()
    stuck = _request(conn, 1, "a", timeout=0.05)
    other = _request(conn, 2, "b", timeout=30)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(stuck, 10)
    assert transport.aborted
    assert "stopped reading" in conn.reason
    conn.pending.fail_all(ConnectionLost(conn.reason))  # what the session does when it ends
    with pytest.raises(ConnectionLost, match="stopped reading"):
        await other


@pytest.mark.asyncio
async def test_one_timer_keeps_every_requests_deadline_even_a_shorter_later_one() -> None:
    loop = asyncio.get_running_loop()
    expired: list[int] = []
    requests = Requests(loop, lambda: expired.append(len(requests)))
    futures = [loop.create_future() for _ in range(100)]
    for rid, future in enumerate(futures):
        requests.track(rid, future, False, 30.0)
    timer = requests._timer
    assert timer is not None
    for rid, future in enumerate(futures[:50]):  # answered
        requests.pop(rid)
        future.set_result(None)
    assert requests._timer is timer  # one timer, not one made and cancelled per request
    short = loop.create_future()
    requests.track(1000, short, True, 0.05)  # later, with a shorter timeout (changed meanwhile)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(short, 10)
    assert 1000 not in requests
    assert len(requests) == 50  # the others are still waiting for their answers
    assert not any(f.done() for f in futures[50:])
    assert expired == [50]
    requests.cancel()
