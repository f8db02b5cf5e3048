"""The transport-agnostic session connection (``_session_conn.Connection``) over a recording
sender: every frame one read brought is answered in one write, watches woken together are pumped
in one write, an event blob shared by many sessions reaches each transport as the same object
(never copied per session), and a full buffer is ``too_slow``."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from helpers.session_conn import connect, make_hub, message_body, next_iteration

from aioelastic.store.http._frames import ERROR, EVENTS, PROGRESS, REQUEST, RESULT, pack, unpack_all
from aioelastic.store.http._session_conn import WATCH_CHUNK_BYTES
from aioelastic.store.http._session_raw import RawSession
from aioelastic.store.http._session_stream import message_header
from aioelastic.store.memory import MemoryEngine


@pytest.mark.asyncio
async def test_every_frame_of_a_read_is_answered_in_one_write() -> None:
    engine = MemoryEngine()
    connection, recorder = connect(make_hub(engine))
    connection.received(
        [
            message_body([REQUEST, 1, "put", ["a", b"1", 0]], [REQUEST, 2, "get", ["a"]]),
            message_body([REQUEST, 3, "get", ["b"]], [REQUEST, 4, "nope", []]),
        ]
    )
    assert len(recorder.writes) == 1  # two messages of one read: one write
    assert [f[:2] for f in recorder.frames(0)] == [
        [RESULT, 1],
        [RESULT, 2],
        [RESULT, 3],
        [ERROR, 4],
    ]
    await next_iteration()
    assert len(recorder.writes) == 1  # and nothing more came after
    connection.end()


@pytest.mark.asyncio
async def test_a_shared_event_blob_reaches_every_session_as_the_same_object() -> None:
    engine = MemoryEngine()
    hub = make_hub(engine)
    sessions = [connect(hub) for _ in range(3)]
    for connection, recorder in sessions:
        connection.received([message_body([REQUEST, 9, "watch", ["w/", None, False]])])
        assert [f[:2] for f in recorder.frames(0)] == [[RESULT, 9]]
        recorder.writes.clear()
    engine.put("w/a", b"v" * 1000)
    await next_iteration()
    blobs = []
    for _, recorder in sessions:
        [write] = recorder.writes  # the woken watch: one write
        [frame] = recorder.frames(0)
        assert frame[:2] == [EVENTS, 9]
        blobs.append(write[-1])  # the frame's head, then the blob as it came from the cache
    assert blobs[0] is blobs[1] is blobs[2]
    assert len(blobs[0]) > 1000
    for connection, _ in sessions:
        connection.end()


@pytest.mark.asyncio
async def test_many_watches_woken_together_are_pumped_in_one_write() -> None:
    engine = MemoryEngine()
    connection, recorder = connect(make_hub(engine))
    connection.received(
        [message_body(*([REQUEST, i, "watch", [f"p{i}/", None, False]] for i in range(1, 51)))]
    )
    recorder.writes.clear()
    for i in range(1, 51):
        engine.put(f"p{i}/k", b"x")  # in one loop iteration: one flush for all
    await next_iteration()
    assert len(recorder.writes) == 1
    assert sorted(f[1] for f in recorder.frames(0)) == list(range(1, 51))
    connection.end()


@pytest.mark.asyncio
async def test_a_v1_pump_of_many_watches_writes_every_16_kib_queued() -> None:
    engine = MemoryEngine()
    connection, recorder = connect(make_hub(engine))  # (version 1: a frame per watch)
    connection.received(
        [message_body(*([REQUEST, i, "watch", [f"p{i}/", None, False]] for i in range(1, 11)))]
    )
    recorder.writes.clear()
    value = b"x" * (WATCH_CHUNK_BYTES // 4)  # four watches' frames pass the chunk
    for i in range(1, 11):
        engine.put(f"p{i}/k", value)
    await next_iteration()
    # each watch's frame is two parts (its head, the shared blob): 4 + 4 + 2 watches
    assert [len(parts) for parts in recorder.writes] == [8, 8, 4]
    assert [sum(map(len, parts)) >= WATCH_CHUNK_BYTES for parts in recorder.writes] == [
        True,
        True,
        False,
    ]
    connection.end()


@pytest.mark.asyncio
async def test_a_transport_buffer_over_the_limit_is_too_slow_and_aborts() -> None:
    engine = MemoryEngine()
    hub = make_hub(engine)
    hub.max_outbox_bytes = 1000
    connection, recorder = connect(hub)
    recorder.buffer = 1001  # the peer has not read what was written
    connection.pause_writing()  # (what the transport says once past its high-water mark)
    connection.received([message_body([REQUEST, 1, "get", ["a"]], [REQUEST, 2, "get", ["b"]])])
    assert recorder.closed is not None
    code, error, abort = recorder.closed
    assert code == "too_slow"
    assert abort is True
    [frame] = unpack_all(error, max_len=1000)
    assert frame[:3] == [ERROR, 0, "too_slow"]
    connection.received([message_body([REQUEST, 3, "get", ["c"]])])  # later frames: ignored
    assert len(recorder.writes) == 1
    connection.end()


@pytest.mark.asyncio
async def test_watches_wait_while_the_transport_is_paused_and_go_out_on_resume() -> None:
    engine = MemoryEngine()
    connection, recorder = connect(make_hub(engine))
    connection.received([message_body([REQUEST, 5, "watch", ["w/", None, False]])])
    recorder.writes.clear()
    connection.pause_writing()
    engine.put("w/a", b"1")
    engine.put("w/b", b"2")
    await next_iteration()
    assert recorder.writes == []  # the buffer is full: events wait in the engine's history
    connection.received([message_body([REQUEST, 6, "get", ["w/a"]])])
    assert [f[:2] for f in recorder.frames(0)] == [[RESULT, 6]]  # answers still go
    connection.resume_writing()
    await next_iteration()
    [events] = recorder.frames(1)
    assert events[:2] == [EVENTS, 5]
    connection.end()


@pytest.mark.asyncio
async def test_the_write_buffer_is_asked_about_only_while_the_transport_is_paused() -> None:
    engine = MemoryEngine()
    hub = make_hub(engine)
    hub.max_outbox_bytes = 1000
    connection, recorder = connect(hub)
    for rid in range(1, 21):
        connection.received([message_body([REQUEST, rid, "get", ["a"]])])
    assert len(recorder.writes) == 20
    assert recorder.asked == 0  # a transport under its high-water mark: nothing to ask
    recorder.buffer = 1001
    connection.pause_writing()
    connection.received_one(message_body([REQUEST, 21, "get", ["a"]]))
    assert recorder.asked == 1
    assert recorder.closed is not None
    assert recorder.closed[0] == "too_slow"
    connection.end()


@pytest.mark.asyncio
async def test_a_lone_frame_is_answered_in_one_write_of_one_part() -> None:
    engine = MemoryEngine()
    engine.put("a", b"1")
    connection, recorder = connect(make_hub(engine))
    connection.received_one(memoryview(message_body([REQUEST, 7, "get", ["a"]])))
    [parts] = recorder.writes
    assert len(parts) == 1
    [frame] = recorder.frames(0)
    assert frame[:2] == [RESULT, 7]
    assert frame[2][:2] == ["a", b"1"]
    # a message of several frames, or a frame that is not a request: as received() has it
    connection.received_one(message_body([REQUEST, 8, "get", ["a"]], [REQUEST, 9, "nope", []]))
    assert [f[:2] for f in recorder.frames(1)] == [[RESULT, 8], [ERROR, 9]]
    connection.received_one(message_body([REQUEST, 10, "watch", ["w/", None, False]]))
    engine.put("w/x", b"2")  # the watch's events: after its answer, by the flush
    await next_iteration()
    assert [f[:2] for f in recorder.frames(2)] == [[RESULT, 10]]
    assert [f[:2] for f in recorder.frames(3)] == [[EVENTS, 10]]
    connection.received_one(pack([RESULT, 11, None]))  # a server's frame from a client
    assert recorder.closed is not None
    assert recorder.closed[0] == "bad_frame"
    connection.end()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",
        pack([REQUEST, 1, "get"]),
        msgpack.packb("x"),
        pack([]),
        pack([REQUEST, 1, "get", ["a"]])[:-1],
    ],
)
async def test_a_lone_message_that_is_not_a_request_is_a_bad_frame_as_before(body: bytes) -> None:
    engine = MemoryEngine()
    fast, fast_out = connect(make_hub(engine))
    slow, slow_out = connect(make_hub(engine))
    fast.received_one(body)
    slow.received([body])
    assert fast_out.closed is not None
    assert slow_out.closed is not None
    assert fast_out.closed == slow_out.closed  # the same code and the same message
    assert fast_out.writes == slow_out.writes == []
    fast.end()
    slow.end()


class WireTransport:
    """The transport calls a :class:`RawSession` makes, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, parts: list[bytes]) -> None:
        self.calls.append(("writelines", b"".join(parts)))

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        self.calls.append(("close", b""))

    def abort(self) -> None:
        self.calls.append(("abort", b""))


def _message(*frames: list[Any]) -> bytes:
    body = message_body(*frames)
    return message_header(len(body)) + body


@pytest.mark.asyncio
async def test_a_read_of_one_request_is_answered_with_one_transport_write() -> None:
    engine = MemoryEngine()
    engine.put("a", b"1")
    transport = WireTransport()
    session = RawSession(make_hub(engine), lambda exc: None, transport)
    session.start()
    session.data_received(_message([REQUEST, 0, "hello", {"versions": [1]}]))
    transport.calls.clear()  # the welcome
    session.data_received(_message([REQUEST, 1, "get", ["a"]]))
    [(call, data)] = transport.calls  # one call, the header and the answer in one buffer
    assert call == "write"
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    [frame] = unpack_all(data[4:], max_len=1 << 20)
    assert frame[:2] == [RESULT, 1]
    transport.calls.clear()
    both = _message([REQUEST, 2, "get", ["a"]]) + _message([REQUEST, 3, "get", ["b"]])
    session.data_received(both)  # two messages in one read: still one write
    [(call, data)] = transport.calls
    assert [f[:2] for f in unpack_all(data[4:], max_len=1 << 20)] == [[RESULT, 2], [RESULT, 3]]
    session.connection_lost(None)


def _last_frame(recorder: Any) -> list[Any]:
    """The error frame the connection ended with."""
    assert recorder.closed is not None
    code, error, abort = recorder.closed
    [frame] = list(unpack_all(error, max_len=1 << 20))
    assert frame[2] == code
    assert abort is False
    return list(frame)


@pytest.mark.asyncio
async def test_a_replaced_connection_ends_with_its_reason() -> None:
    connection, recorder = connect(make_hub(MemoryEngine()))
    connection.replaced()
    assert _last_frame(recorder) == [
        ERROR,
        0,
        "replaced",
        "the session was resumed on another connection",
        {},
    ]
    connection.end()


@pytest.mark.asyncio
async def test_a_bad_frames_message_is_cut_to_300_characters() -> None:
    connection, recorder = connect(make_hub(MemoryEngine()))
    connection.bad_frame("y" * 1000)
    assert _last_frame(recorder) == [ERROR, 0, "bad_frame", "y" * 300, {}]
    connection.end()


# -- what each path costs: the loop callbacks a connection queues --------------------------------


@pytest.mark.asyncio
async def test_a_lone_request_answered_inline_queues_no_flush() -> None:
    hub = make_hub(MemoryEngine())
    connection, recorder = connect(hub)
    connection.received_one(message_body([REQUEST, 1, "get", ["a"]]))
    assert len(recorder.writes) == 1
    assert len(hub.flushes) == 0
    connection.end()


@pytest.mark.asyncio
async def test_a_watch_with_history_is_written_with_its_answer_and_queues_no_flush() -> None:
    engine = MemoryEngine()
    engine.put("w/a", b"1")
    hub = make_hub(engine)
    connection, recorder = connect(hub)
    connection.received([message_body([REQUEST, 1, "watch", ["w/", 1, False]])])
    assert [f[:2] for f in recorder.frames(0)] == [[RESULT, 1], [EVENTS, 1]]
    assert len(hub.flushes) == 0
    connection.end()


@pytest.mark.asyncio
async def test_a_connection_woken_by_many_watches_or_frames_is_queued_once() -> None:
    engine = MemoryEngine()
    hub = make_hub(engine)
    connection, recorder = connect(hub)
    connection.received(
        [message_body(*([REQUEST, i, "watch", [f"p{i}/", None, False]] for i in range(1, 21)))]
    )
    recorder.writes.clear()
    for i in range(1, 21):
        engine.put(f"p{i}/k", b"x")
    connection.send([PROGRESS, 1, 0])  # (frames queued between reads ride along)
    connection.send([PROGRESS, 2, 0])
    assert len(hub.flushes) == 1
    await next_iteration()
    assert len(recorder.writes) == 1
    assert len(hub.flushes) == 0
    connection.end()


@pytest.mark.asyncio
async def test_a_lone_request_while_paused_is_answered_and_the_watches_still_wait() -> None:
    engine = MemoryEngine()
    connection, recorder = connect(make_hub(engine))
    connection.received([message_body([REQUEST, 1, "watch", ["w/", None, False]])])
    recorder.writes.clear()
    connection.pause_writing()
    engine.put("w/k", b"x")
    await next_iteration()
    assert recorder.writes == []
    connection.received_one(message_body([REQUEST, 2, "get", ["w/k"]]))
    assert [f[:2] for f in recorder.frames(0)] == [[RESULT, 2]]
    connection.resume_writing()
    await next_iteration()
    assert [f[:2] for f in recorder.frames(1)] == [[EVENTS, 1]]
    connection.end()


# -- frames that are not requests ------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "frame",
    [[RESULT, 5, "get", ["a"]], [REQUEST, "5", "get", ["a"]], [REQUEST, 5, "get"]],
    ids=["kind", "id", "short"],
)
async def test_a_frame_that_is_not_a_request_ends_the_connection_saying_what_one_is(
    frame: list[Any],
) -> None:
    connection, recorder = connect(make_hub(MemoryEngine()))
    connection.received_one(message_body(frame))
    assert recorder.writes == []
    assert recorder.closed is not None
    code, error, abort = recorder.closed
    assert (code, abort) == ("bad_frame", False)
    assert list(unpack_all(error, max_len=1000)) == [
        [ERROR, 0, "bad_frame", "a request frame is [0, id, op, args]", {}]
    ]
    connection.end()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("name", "said"),
    [(["get"], "no operation \"['get']\""), ("x" * 150, f"no operation {'x' * 100!r}")],
    ids=["a-list", "cut-to-100"],
)
async def test_an_operation_name_that_is_no_operation_is_answered_unknown(
    name: Any, said: str
) -> None:
    connection, recorder = connect(make_hub(MemoryEngine()))
    connection.received_one(message_body([REQUEST, 5, name, []]))
    assert recorder.frames(0) == [[ERROR, 5, "unknown_op", said, {}]]
    assert recorder.closed is None
    connection.end()


@pytest.mark.asyncio
async def test_too_slow_says_so_and_a_buffer_at_the_limit_is_not_too_slow() -> None:
    hub = make_hub(MemoryEngine())
    hub.max_outbox_bytes = 1000
    connection, recorder = connect(hub)
    connection.pause_writing()
    recorder.buffer = 1000  # at the limit: still fine
    connection.received_one(message_body([REQUEST, 1, "get", ["a"]]))
    assert recorder.closed is None
    recorder.buffer = 1001
    connection.received_one(message_body([REQUEST, 2, "get", ["a"]]))
    assert recorder.closed is not None
    code, error, abort = recorder.closed
    assert (code, abort) == ("too_slow", True)
    assert list(unpack_all(error, max_len=1000)) == [
        [ERROR, 0, "too_slow", "the client does not read its answers", {}]
    ]
    connection.end()


@pytest.mark.asyncio
async def test_frames_sent_between_reads_queue_the_connection_once() -> None:
    hub = make_hub(MemoryEngine())
    connection, recorder = connect(hub)
    connection.send([PROGRESS, 1, 0])
    connection.send([PROGRESS, 2, 0])
    assert len(hub.flushes) == 1
    await next_iteration()
    assert recorder.frames(0) == [[PROGRESS, 1, 0], [PROGRESS, 2, 0]]
    connection.end()
