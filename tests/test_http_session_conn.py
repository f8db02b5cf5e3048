"""The transport-agnostic session connection (``_session_conn.Connection``) over a recording
sender: every frame one read brought is answered in one write, watches woken together are pumped
in one write, an event blob shared by many sessions reaches each transport as the same object
(never copied per session), and a full buffer is ``too_slow``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aioelastic.store.http._frames import ERROR, EVENTS, REQUEST, RESULT, pack, unpack_all
from aioelastic.store.http._session_conn import Connection
from aioelastic.store.http._session_server import SessionHub
from aioelastic.store.memory import MemoryEngine


class Recorder:
    """A :class:`~aioelastic.store.http._session_conn.Sender` that keeps what it is given."""

    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []
        self.closed: tuple[str, bytes, bool] | None = None
        self.buffer = 0

    def write(self, parts: list[bytes]) -> None:
        self.writes.append(parts)

    def buffered(self) -> int:
        return self.buffer

    def close(self, code: str, error: bytes, *, abort: bool = False) -> None:
        self.closed = (code, error, abort)

    def frames(self, write: int) -> list[list[Any]]:
        return list(unpack_all(b"".join(self.writes[write]), max_len=1 << 20))


def _hub(engine: MemoryEngine) -> SessionHub:
    return SessionHub(engine, max_key_bytes=100, max_value_bytes=100_000, max_watches=100)


def _connect(hub: SessionHub) -> tuple[Connection, Recorder]:
    recorder = Recorder()
    connection = hub.greet(recorder, pack([REQUEST, 0, "hello", {"versions": [1]}]))
    assert connection is not None
    recorder.writes.clear()  # the welcome
    return connection, recorder


def _body(*frames: list[Any]) -> bytes:
    return b"".join(pack(frame) for frame in frames)


async def _next_iteration() -> None:
    """Let the connection's flush callback (scheduled with call_soon) run."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_every_frame_of_a_read_is_answered_in_one_write() -> None:
    engine = MemoryEngine()
    connection, recorder = _connect(_hub(engine))
    connection.received(
        [
            _body([REQUEST, 1, "put", ["a", b"1", 0]], [REQUEST, 2, "get", ["a"]]),
            _body([REQUEST, 3, "get", ["b"]], [REQUEST, 4, "nope", []]),
        ]
    )
    assert len(recorder.writes) == 1  # two messages of one read: one write
    assert [f[:2] for f in recorder.frames(0)] == [
        [RESULT, 1],
        [RESULT, 2],
        [RESULT, 3],
        [ERROR, 4],
    ]
    await _next_iteration()
    assert len(recorder.writes) == 1  # and nothing more came after
    connection.end()


@pytest.mark.asyncio
async def test_a_shared_event_blob_reaches_every_session_as_the_same_object() -> None:
    engine = MemoryEngine()
    hub = _hub(engine)
    sessions = [_connect(hub) for _ in range(3)]
    for connection, recorder in sessions:
        connection.received([_body([REQUEST, 9, "watch", ["w/", None, False]])])
        assert [f[:2] for f in recorder.frames(0)] == [[RESULT, 9]]
        recorder.writes.clear()
    engine.put("w/a", b"v" * 1000)
    await _next_iteration()
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
    connection, recorder = _connect(_hub(engine))
    connection.received(
        [_body(*([REQUEST, i, "watch", [f"p{i}/", None, False]] for i in range(1, 51)))]
    )
    recorder.writes.clear()
    for i in range(1, 51):
        engine.put(f"p{i}/k", b"x")  # in one loop iteration: one flush for all
    await _next_iteration()
    assert len(recorder.writes) == 1
    assert sorted(f[1] for f in recorder.frames(0)) == list(range(1, 51))
    connection.end()


@pytest.mark.asyncio
async def test_a_transport_buffer_over_the_limit_is_too_slow_and_aborts() -> None:
    engine = MemoryEngine()
    hub = _hub(engine)
    hub.max_outbox_bytes = 1000
    connection, recorder = _connect(hub)
    recorder.buffer = 1001  # the peer has not read what was written
    connection.received([_body([REQUEST, 1, "get", ["a"]], [REQUEST, 2, "get", ["b"]])])
    assert recorder.closed is not None
    code, error, abort = recorder.closed
    assert code == "too_slow"
    assert abort is True
    [frame] = unpack_all(error, max_len=1000)
    assert frame[:3] == [ERROR, 0, "too_slow"]
    connection.received([_body([REQUEST, 3, "get", ["c"]])])  # later frames: ignored
    assert len(recorder.writes) == 1
    connection.end()


@pytest.mark.asyncio
async def test_watches_wait_while_the_transport_is_paused_and_go_out_on_resume() -> None:
    engine = MemoryEngine()
    connection, recorder = _connect(_hub(engine))
    connection.received([_body([REQUEST, 5, "watch", ["w/", None, False]])])
    recorder.writes.clear()
    connection.pause_writing()
    engine.put("w/a", b"1")
    engine.put("w/b", b"2")
    await _next_iteration()
    assert recorder.writes == []  # the buffer is full: events wait in the engine's history
    connection.received([_body([REQUEST, 6, "get", ["w/a"]])])
    assert [f[:2] for f in recorder.frames(0)] == [[RESULT, 6]]  # answers still go
    connection.resume_writing()
    await _next_iteration()
    [events] = recorder.frames(1)
    assert events[:2] == [EVENTS, 5]
    connection.end()
