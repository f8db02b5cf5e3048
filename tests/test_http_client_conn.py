"""The client connection's own rules, at unit level (a recording transport stands in for the
socket; the real-socket behaviour is in test_http_client.py): one write per loop turn, a lone
request at once, back-pressure respected, one deadline timer for all requests."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest
from helpers.clock import FakeClock

from aioelastic.store import EventType, KeyValue, WatchEvent
from aioelastic.store.http._client_conn import Connection, ConnectionLost
from aioelastic.store.http._client_requests import Requests
from aioelastic.store.http._frames import (
    ERROR,
    EVENTS,
    EVENTS_MANY,
    PROGRESS,
    REQUEST,
    RESULT,
    WATCH_END,
    FrameError,
    encode_events,
    pack,
    unpack_all,
)
from aioelastic.store.http._session_errors import Refused
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
    return conn.request(rid, op, [], timeout)


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


@pytest.mark.parametrize("callers", [2, 3, 8])
@pytest.mark.asyncio
async def test_callers_answered_by_one_message_send_their_next_requests_in_one_write(
    callers: int,
) -> None:
    # Callers in flight, answered in one message: each sends its next request as it wakes;
    # the first of them is then the one request pending, yet it waits for the others (one
    # message), instead of going alone and the rest after it.
    conn, transport = _open()

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


@pytest.mark.parametrize("before", [[], [[PROGRESS, 9, 5]]])  # (9: no such watch)
@pytest.mark.asyncio
async def test_a_lone_answer_leaves_the_next_request_to_go_at_once(before: list[Any]) -> None:
    conn, transport = _open()
    first = _request(conn, 1, "first")
    answer = b"".join(pack(frame) for frame in [*before, [RESULT, 1, None]])
    conn.data_received(message_header(len(answer)) + answer)
    await first
    _request(conn, 2, "next")
    assert transport.messages() == [["first"], ["next"]]  # written before any loop turn


@pytest.mark.asyncio
async def test_a_batch_over_the_servers_message_bound_goes_as_several_messages() -> None:
    conn, transport = _open()
    frame = len(pack([REQUEST, 2, "x" * 10, []]))
    conn.max_message = 2 * frame  # two frames fill a message exactly
    _request(conn, 1, "first")
    for rid in range(2, 9):
        _request(conn, rid, "x" * 10)
    await asyncio.sleep(0)
    assert [len(ops) for ops in transport.messages()] == [1, 2, 2, 2, 1]


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
    assert conn.paused is False


@pytest.mark.asyncio
async def test_what_is_queued_when_the_connection_is_lost_is_not_written() -> None:
    conn, transport = _open()
    _request(conn, 1, "a")  # at once
    _request(conn, 2, "b")  # queued
    conn.connection_lost(None)
    await asyncio.sleep(0)  # the flush
    assert transport.messages() == [["a"]]


@pytest.mark.asyncio
async def test_a_deadline_passing_while_paused_ends_the_connection() -> None:
    conn, transport = _open()
    conn.pause_writing()
    stuck = _request(conn, 1, "a", timeout=0.05)
    other = _request(conn, 2, "b", timeout=30)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(stuck, 10)
    assert transport.aborted
    assert conn.reason == "the server stopped reading (a request's deadline passed unsent)"
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
        requests.track(rid, future, 30.0)
    timer = requests._timer
    assert timer is not None
    for rid, future in enumerate(futures[:50]):  # answered
        requests.pop(rid)
        future.set_result(None)
    assert requests._timer is timer  # one timer, not one made and cancelled per request
    short = loop.create_future()
    requests.track(1000, short, 0.05)  # later, with a shorter timeout (changed meanwhile)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(short, 10)
    assert 1000 not in requests
    assert len(requests) == 50  # the others are still waiting for their answers
    assert not any(f.done() for f in futures[50:])
    assert expired == [50]
    requests.cancel()


def _requests() -> tuple[FakeClock, Requests, list[int]]:
    """Requests on a clock the test moves, and the pending count at each expiry."""
    clock, expired = FakeClock(), list[int]()
    requests = Requests(clock, lambda: expired.append(len(requests)))  # type: ignore[arg-type]
    return clock, requests, expired


@pytest.mark.asyncio
async def test_a_request_fails_at_its_deadline_exactly_and_leaves_no_timer() -> None:
    clock, requests, expired = _requests()
    future = asyncio.get_running_loop().create_future()
    requests.track(1, future, 5.0)
    assert clock.pending == [105.0]
    clock.run_until(105.0)
    assert isinstance(future.exception(), TimeoutError)
    assert (dict(requests), expired, clock.pending) == ({}, [0], [])


@pytest.mark.asyncio
async def test_the_sweep_drops_requests_nobody_waits_for_and_rearms_for_the_next() -> None:
    clock, requests, expired = _requests()
    loop = asyncio.get_running_loop()
    abandoned, waiting = loop.create_future(), loop.create_future()
    requests.track(1, abandoned, 5.0)
    requests.track(2, waiting, 10.0)
    abandoned.cancel()  # its caller was cancelled
    clock.run_until(105.0)
    assert (list(requests), expired, clock.pending) == ([2], [1], [110.0])
    assert not waiting.done()
    clock.run_until(110.0)
    assert isinstance(waiting.exception(), TimeoutError)
    assert (dict(requests), expired, clock.pending) == ({}, [1, 0], [])


@pytest.mark.asyncio
async def test_a_request_without_a_deadline_arms_nothing_and_fails_with_the_connection() -> None:
    clock, requests, expired = _requests()
    future = asyncio.get_running_loop().create_future()
    requests.track(1, future, 1e9)
    assert clock.pending == []
    clock.run_until(1e12)
    assert not future.done()
    requests.fail_all(ConnectionLost("gone"))
    assert isinstance(future.exception(), ConnectionLost)
    assert (dict(requests), expired) == ({}, [])


class _Watch:
    """What a connection calls on a watch, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_events(self, decoded: list[WatchEvent], now: float) -> None:
        self.calls.append(("events", decoded, now))

    def on_progress(self, revision: int) -> None:
        self.calls.append(("progress", revision))

    def on_end(self, code: str, message: str, extra: Any) -> None:
        self.calls.append(("end", code, message, extra))


def _deliver(conn: Connection, *frames: list[Any]) -> None:
    body = b"".join(pack(frame) for frame in frames)
    conn.data_received(message_header(len(body)) + body)


def _events(*keys: str) -> list[WatchEvent]:
    return [
        WatchEvent(EventType.PUT, KeyValue(key, b"v", 5 + i, 5 + i, 1, 0))
        for i, key in enumerate(keys)
    ]


@pytest.mark.asyncio
async def test_watch_frames_go_to_their_watches_and_one_blob_is_decoded_once() -> None:
    conn, _ = _open()
    a, b, gone = _Watch(), _Watch(), _Watch()
    conn.watches.update({1: a, 2: b})
    blob = encode_events(_events("x/1", "x/2"))
    conn.last_received = -1.0  # (set again by the message's arrival)
    _deliver(conn, [EVENTS, 1, blob], [EVENTS, 2, blob], [EVENTS, 3, blob])  # 3: not open
    (kind, decoded, now), (_, decoded_b, now_b) = a.calls[0], b.calls[0]
    assert (kind, [e.kv.key for e in decoded], now) == ("events", ["x/1", "x/2"], now_b)
    assert now == conn.last_received >= 0
    assert decoded_b is decoded  # decoded once for the frames in a row that carry it
    assert decoded == _events("x/1", "x/2")
    _deliver(conn, [EVENTS_MANY, [2, 3, 1], encode_events(_events("y"))])
    assert [len(w.calls) for w in (a, b, gone)] == [2, 2, 0]
    assert a.calls[1][1] is b.calls[1][1]
    assert a.calls[1][1:] == (_events("y"), conn.last_received)


@pytest.mark.asyncio
async def test_a_progress_frame_and_a_watch_end_reach_their_watch_and_the_end_closes_it() -> None:
    conn, _ = _open()
    a, b = _Watch(), _Watch()
    conn.watches.update({1: a, 2: b})
    _deliver(conn, [PROGRESS, 1, 41])
    _deliver(conn, [WATCH_END, 2, "compacted", "behind", {"compact_revision": 9}])
    assert a.calls == [("progress", 41)]
    assert b.calls == [("end", "compacted", "behind", {"compact_revision": 9})]
    assert list(conn.watches) == [1]  # the ended watch is no longer open
    _deliver(conn, [PROGRESS, 2, 50], [WATCH_END, 2, "x", "y", None])  # for it: dropped
    assert len(b.calls) == 1
    assert not conn.lost


@pytest.mark.asyncio
async def test_an_error_answer_fails_its_request_with_the_servers_code_message_and_extra() -> None:
    conn, _ = _open()
    refused = _request(conn, 7, "get")
    _deliver(conn, [ERROR, 7, "value_too_large", "value over 1024 bytes", {"limit": 1024}])
    with pytest.raises(Refused) as info:
        await refused
    error = info.value
    assert (error.code, error.message, error.extra) == (
        "value_too_large",
        "value over 1024 bytes",
        {"limit": 1024},
    )
    assert str(error.error("put 'k'", write=True)) == "put 'k': value over 1024 bytes"
    _deliver(conn, [ERROR, 0, "shutting_down", "the server is stopping", None])
    assert conn.reason == "the server said: the server is stopping (shutting_down)"


@pytest.mark.parametrize(
    "frames",
    [
        [[RESULT, 99, "late"]],  # for a request no longer pending (its deadline passed)
        [[RESULT, 1, "one"], [RESULT, 99, "late"]],
        [[ERROR, 98, "gone", "for nobody", None], [RESULT, 1, "one"]],
    ],
)
@pytest.mark.asyncio
async def test_an_answer_for_no_pending_request_is_dropped_and_the_connection_goes_on(
    frames: list[list[Any]],
) -> None:
    conn, _ = _open()
    one = _request(conn, 1, "get")
    _deliver(conn, *frames)
    assert not conn.lost
    assert not conn.ending
    if not one.done():
        _deliver(conn, [RESULT, 1, "one"])
    assert await one == "one"


def _malformed(body: bytes) -> str:
    with pytest.raises(FrameError) as info:
        list(unpack_all(body, max_len=1 << 24))
    return f"a malformed frame from the server: {info.value}"


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # not msgpack
        msgpack.packb(5),  # not a frame
        msgpack.packb([]),  # an empty one
        pack([RESULT, 1, None]) + msgpack.packb("x"),  # a good frame, then not a frame
    ],
)
@pytest.mark.asyncio
async def test_a_malformed_message_ends_the_connection_saying_what_was_wrong(body: bytes) -> None:
    conn, transport = _open()
    told: list[Connection] = []
    conn.attach(told.append, 1 << 20)
    conn.data_received(message_header(len(body)) + body)
    assert conn.reason == _malformed(body)
    assert transport.aborted
    assert conn.ending is True
    assert told == [conn]  # the session is told at once, not a loop turn later
    late = pack([RESULT, 1, "late"])
    one = _request(conn, 1, "get")
    conn.data_received(message_header(len(late)) + late)  # read after the end: not handled
    assert not one.done()


@pytest.mark.asyncio
async def test_messages_that_came_before_the_attach_are_handled_by_it_in_order() -> None:
    conn = Connection(asyncio.get_running_loop())
    transport = _Transport(conn)
    conn.connection_made(transport)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()
    conn.pending.track(1, first, 30)
    conn.pending.track(2, second, 30)
    head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: aioelastic-session/1\r\n\r\n"
    messages = [pack([RESULT, rid, f"answer {rid}"]) for rid in (1, 2)]
    conn.data_received(head + message_header(len(messages[0])) + messages[0])
    conn.data_received(message_header(len(messages[1])) + messages[1])  # another read
    assert conn.messages_received == 2
    assert not first.done()  # not before the attach
    conn.attach(lambda _: None, 1 << 20)
    assert (first.result(), second.result()) == ("answer 1", "answer 2")


@pytest.mark.asyncio
async def test_a_malformed_message_before_the_attach_ends_the_connection_at_the_attach() -> None:
    conn = Connection(asyncio.get_running_loop())
    transport = _Transport(conn)
    conn.connection_made(transport)  # type: ignore[arg-type]
    head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: aioelastic-session/1\r\n\r\n"
    bad, good = b"\xc1", pack([RESULT, 1, "unread"])
    conn.data_received(head + message_header(1) + bad + message_header(len(good)) + good)
    told: list[Connection] = []
    conn.attach(told.append, 1 << 20)
    assert told == [conn]
    assert conn.reason == _malformed(bad)


@pytest.mark.asyncio
async def test_close_writes_what_is_queued_then_ends_the_connection() -> None:
    conn, transport = _open()
    _request(conn, 1, "first")  # at once
    _request(conn, 2, "queued")  # for the end of the turn
    conn.close()
    assert transport.messages() == [["first"], ["queued"]]
    assert transport.aborted  # (the recording transport's close)
    assert conn.ending is True


@pytest.mark.asyncio
async def test_close_or_abort_after_the_connection_was_lost_touches_no_transport() -> None:
    conn, transport = _open()
    conn.connection_lost(None)
    transport.aborted = False
    conn.close()
    conn.abort("late")
    assert not transport.aborted


@pytest.mark.asyncio
async def test_a_request_on_a_lost_connection_is_not_written() -> None:
    conn, transport = _open()
    conn.connection_lost(ConnectionResetError("reset"))
    _request(conn, 1, "get")
    assert transport.writes == []
    assert conn.reason == "ConnectionResetError: reset"


@pytest.mark.asyncio
async def test_the_first_reason_a_connection_ends_for_is_the_one_kept() -> None:
    conn, _ = _open()
    conn.abort("the server stopped reading")
    conn.connection_lost(ConnectionResetError("reset"))
    assert conn.reason == "the server stopped reading"


@pytest.mark.parametrize(
    ("error", "said"),
    [(None, "the server closed the connection"), (OSError("refused"), "OSError: refused")],
)
@pytest.mark.asyncio
async def test_the_dialer_waiting_on_a_lost_connection_is_told_why(
    error: Exception | None, said: str
) -> None:
    conn = Connection(asyncio.get_running_loop())
    conn.connection_made(_Transport(conn))  # type: ignore[arg-type]
    conn.connection_lost(error)
    with pytest.raises(ConnectionResetError) as answer:
        await conn.answer()
    with pytest.raises(ConnectionResetError) as message:
        await conn.next_message()
    assert str(answer.value) == str(message.value) == said


@pytest.mark.asyncio
async def test_every_message_received_is_counted_whatever_the_reads() -> None:
    conn, _ = _open()
    frames = [pack([PROGRESS, 9, n]) for n in range(5)]  # (for no open watch: dropped)
    for body in frames[:3]:  # one read each
        conn.data_received(message_header(len(body)) + body)
    conn.data_received(b"".join(message_header(len(b)) + b for b in frames[3:]))  # two in one
    assert conn.messages_received == 5


@pytest.mark.asyncio
async def test_what_arrives_after_a_refusal_is_ignored() -> None:
    conn = Connection(asyncio.get_running_loop())
    transport = _Transport(conn)
    conn.connection_made(transport)  # type: ignore[arg-type]
    waiting = asyncio.ensure_future(conn.answer())  # (the dialer, as the upgrade goes out)
    await asyncio.sleep(0)
    conn.data_received(b"HTTP/1.1 503 Busy\r\nContent-Length: 2\r\n\r\nab")
    answer = await waiting
    assert (answer.status, answer.body) == (503, b"ab")
    conn.data_received(b"more bytes, then a message" + message_header(3) + b"abc")
    assert conn.messages_received == 0
    assert not transport.aborted
