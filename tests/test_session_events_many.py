"""Session protocol version 2's ``[EVENTS_MANY, [watch, ...], blob]``: the watches of a
connection that read the same events share one frame; a version-1 connection (an old client)
still gets one ``EVENTS`` frame per watch; a watch's frames stay in order (its progress behind
its events), and no event is lost, repeated or reordered per watch. Server side over a recording
sender, client side over a fake transport, and end to end on loopback."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgpack
import pytest

from aioelastic.store import WatchEvent, open_store
from aioelastic.store._txn import Put, check_txn
from aioelastic.store.http import HttpStore
from aioelastic.store.http._client_conn import MAX_MESSAGE
from aioelastic.store.http._client_conn import Connection as ClientConnection
from aioelastic.store.http._frames import (
    EVENTS,
    EVENTS_MANY,
    PROGRESS,
    REQUEST,
    RESULT,
    decode_events,
    encode_events,
    pack,
    unpack_all,
)
from aioelastic.store.http._session_conn import Connection
from aioelastic.store.http._session_server import SessionHub
from aioelastic.store.http._session_stream import MessageReader, message_header
from aioelastic.store.http._session_watch import GROUP_WATCHES
from aioelastic.store.http.server import HttpStoreServer
from aioelastic.store.memory import MemoryEngine


class Recorder:
    """A session connection's sender that keeps what it is given."""

    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []

    def write(self, parts: list[bytes]) -> None:
        self.writes.append(parts)

    def buffered(self) -> int:
        return 0

    def close(self, code: str, error: bytes, *, abort: bool = False) -> None:
        raise AssertionError(f"closed: {code}")

    def frames_by_write(self) -> list[list[list[Any]]]:
        """The frames of each write so far, write by write (kept)."""
        return [list(unpack_all(b"".join(parts), max_len=1 << 24)) for parts in self.writes]

    def frames(self) -> list[list[Any]]:
        """Every frame written so far, in order (then forgotten)."""
        out = [f for parts in self.writes for f in unpack_all(b"".join(parts), max_len=1 << 24)]
        self.writes.clear()
        return out


def _connect(hub: SessionHub, versions: list[int]) -> tuple[Connection, Recorder]:
    recorder = Recorder()
    connection = hub.greet(recorder, pack([REQUEST, 0, "hello", {"versions": versions}]))
    assert connection is not None
    assert connection.version == max(versions)
    recorder.writes.clear()  # the welcome
    return connection, recorder


def _hub(engine: MemoryEngine) -> SessionHub:
    return SessionHub(engine, max_key_bytes=100, max_value_bytes=1000, max_watches=10_000)


def _watch(connection: Connection, recorder: Recorder, wids: range, prefix: str) -> None:
    body = b"".join(pack([REQUEST, i, "watch", [prefix, None, False]]) for i in wids)
    connection.received([body])
    recorder.frames()  # their answers


async def _next_iteration() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_the_watches_of_a_v2_connection_that_read_the_same_events_share_a_frame() -> None:
    engine = MemoryEngine()
    connection, recorder = _connect(_hub(engine), [1, 2])
    _watch(connection, recorder, range(1, 301), "w/")
    _watch(connection, recorder, range(301, 306), "x/")  # not concerned by the put
    engine.put("w/a", b"v")
    await _next_iteration()
    frames = recorder.frames()
    assert {f[0] for f in frames} == {EVENTS_MANY}
    # at most GROUP_WATCHES a frame (the client starts on the first while the rest is read)
    assert [len(frame[1]) for frame in frames] == [GROUP_WATCHES, GROUP_WATCHES, 44]
    wids = [wid for frame in frames for wid in frame[1]]
    assert sorted(wids) == list(range(1, 301))  # each once
    for frame in frames:
        [event] = decode_events(frame[2])
        assert (event.kv.key, event.kv.value) == ("w/a", b"v")
    connection.end()


@pytest.mark.asyncio
async def test_each_prefix_gets_its_own_events_of_one_revision_in_groups_too() -> None:
    """Watches of a v2 connection on prefixes that one txn writes alike (one key each, the
    same revision, as many events): a frame per prefix, each with its own key."""
    engine = MemoryEngine()
    connection, recorder = _connect(_hub(engine), [1, 2])
    _watch(connection, recorder, range(1, 3), "a/")
    _watch(connection, recorder, range(3, 5), "b/")
    engine.txn(check_txn([], [Put("a/k", b"1"), Put("b/k", b"2")], []))
    await _next_iteration()
    read = {
        tuple(sorted(frame[1])): [(e.kv.key, e.kv.value) for e in decode_events(frame[2])]
        for frame in recorder.frames()
    }
    assert read == {(1, 2): [("a/k", b"1")], (3, 4): [("b/k", b"2")]}
    connection.end()


@pytest.mark.asyncio
async def test_a_pump_of_more_progress_frames_than_a_group_holds_writes_at_each_group() -> None:
    """Idle watches at a tick: a progress frame each, queued as they come; the pump writes once
    GROUP_WATCHES of them are queued, then the rest."""
    engine = MemoryEngine()
    connection, recorder = _connect(_hub(engine), [1, 2])
    count = GROUP_WATCHES + 2
    _watch(connection, recorder, range(1, count + 1), "idle/")
    connection._tick()
    await _next_iteration()
    writes = recorder.frames_by_write()
    assert [len(frames) for frames in writes] == [GROUP_WATCHES, 2]
    assert sorted(frame[1] for frames in writes for frame in frames) == list(range(1, count + 1))
    assert {frame[0] for frames in writes for frame in frames} == {PROGRESS}
    connection.end()


@pytest.mark.asyncio
async def test_a_pump_of_more_watches_than_a_group_holds_writes_at_each_group_of_them() -> None:
    """Watches that each read events of their own (a frame each): the pump writes once
    GROUP_WATCHES of them are grouped, then the rest."""
    engine = MemoryEngine()
    connection, recorder = _connect(_hub(engine), [1, 2])
    count = GROUP_WATCHES + 2
    for i in range(1, count + 1):
        _watch(connection, recorder, range(i, i + 1), f"p{i}/")
    for i in range(1, count + 1):
        engine.put(f"p{i}/k", b"v")  # in one loop iteration: one pump for all
    await _next_iteration()
    writes = recorder.frames_by_write()
    assert [len(frames) for frames in writes] == [GROUP_WATCHES, 2]
    assert sorted(frame[1][0] for frames in writes for frame in frames) == list(range(1, count + 1))
    assert all(len(frame[1]) == 1 for frames in writes for frame in frames)
    connection.end()


@pytest.mark.asyncio
async def test_a_lone_watch_woken_gets_an_events_frame_and_one_callback_writes_every_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A put seen by one watch on each of many sessions (a round record reaching N rendezvous
    members): each session's frame is a plain ``EVENTS`` frame (no group of one to make), and
    one loop callback writes them all (main scheduled one per session)."""
    engine = MemoryEngine()
    hub = _hub(engine)
    sessions = [_connect(hub, [1, 2]) for _ in range(64)]
    for connection, recorder in sessions:
        _watch(connection, recorder, range(1, 2), "c/")
    loop = asyncio.get_running_loop()
    scheduled: list[object] = []
    call_soon = loop.call_soon

    def counting(callback: Any, *args: Any, **kwargs: Any) -> asyncio.Handle:
        scheduled.append(callback)
        return call_soon(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon", counting)
    engine.put("c/round", b"r")
    assert len(scheduled) == 1
    monkeypatch.undo()
    await _next_iteration()
    for connection, recorder in sessions:
        [frame] = recorder.frames()
        assert frame[:2] == [EVENTS, 1]
        [event] = decode_events(frame[2])
        assert (event.kv.key, event.kv.value) == ("c/round", b"r")
        connection.end()


@pytest.mark.asyncio
async def test_a_session_ended_while_queued_to_write_writes_nothing() -> None:
    engine = MemoryEngine()
    hub = _hub(engine)
    (first, first_out), (second, second_out) = (_connect(hub, [1, 2]) for _ in range(2))
    for connection, recorder in ((first, first_out), (second, second_out)):
        _watch(connection, recorder, range(1, 2), "c/")
    engine.put("c/round", b"r")
    assert len(hub.flushes) == 2
    first.end()  # (the transport went) before the queue's callback ran
    await _next_iteration()
    assert first_out.frames() == []
    assert [f[0] for f in second_out.frames()] == [EVENTS]
    second.end()


@pytest.mark.asyncio
async def test_watches_at_different_positions_get_a_frame_per_blob() -> None:
    engine = MemoryEngine()
    first = engine.put("w/a", b"1")
    connection, recorder = _connect(_hub(engine), [1, 2])
    _watch(connection, recorder, range(1, 4), "w/")  # from now on
    engine.put("w/b", b"2")  # wakes them; and before they are pumped, two watches from the past
    past = b"".join(pack([REQUEST, i, "watch", ["w/", first, False]]) for i in range(4, 6))
    connection.received([past])  # (its batch pumps every watch woken so far)
    frames = recorder.frames()
    assert [f[:2] for f in frames[:2]] == [[RESULT, 4], [RESULT, 5]]
    groups = {tuple(sorted(f[1])): [e.kv.value for e in decode_events(f[2])] for f in frames[2:]}
    assert groups == {(1, 2, 3): [b"2"], (4, 5): [b"1", b"2"]}
    assert {f[0] for f in frames[2:]} == {EVENTS_MANY}
    connection.end()


@pytest.mark.asyncio
async def test_a_v1_connection_still_gets_an_events_frame_per_watch() -> None:
    engine = MemoryEngine()
    connection, recorder = _connect(_hub(engine), [1])
    _watch(connection, recorder, range(1, 51), "w/")
    engine.put("w/a", b"v")
    await _next_iteration()
    frames = recorder.frames()
    assert [f[0] for f in frames] == [EVENTS] * 50
    assert sorted(f[1] for f in frames) == list(range(1, 51))
    connection.end()


@pytest.mark.asyncio
async def test_a_progress_frame_follows_the_events_of_its_watch_in_the_same_pump() -> None:
    # the client moves a watch's resume position to a progress frame's revision + 1: a
    # progress frame before the events it follows would make the client drop them
    engine = MemoryEngine()
    connection, recorder = _connect(_hub(engine), [1, 2])
    _watch(connection, recorder, range(1, 4), "w/")
    connection._tick()  # every watch idle: progress due
    engine.put("w/a", b"v")  # and events, in the same pump
    await _next_iteration()
    frames = recorder.frames()
    assert [f[0] for f in frames] == [EVENTS_MANY, PROGRESS, PROGRESS, PROGRESS]
    assert frames[0][1] == [1, 2, 3]
    assert [f[2] for f in frames[1:]] == [engine.revision] * 3
    connection.end()


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_no_event_is_lost_repeated_or_reordered_per_watch(seed: int) -> None:
    rng = random.Random(seed)
    engine = MemoryEngine()
    connection, recorder = _connect(_hub(engine), [1, 2])
    prefixes = ["a/", "a/b/", "c/"]
    watches: dict[int, tuple[str, int]] = {}  # wid -> (prefix, start revision)
    received: dict[int, list[int]] = {}
    wid = 0
    for _ in range(30):  # loop iterations: writes, new watches from the past or now, pumps
        for _ in range(rng.randrange(1, 6)):
            engine.put(rng.choice(["a/x", "a/b/y", "c/z", "d/w"]), b"v")
        for _ in range(rng.randrange(0, 8)):
            wid += 1
            prefix = rng.choice(prefixes)
            start = rng.randrange(1, engine.revision + 2)
            watches[wid] = (prefix, start)
            received[wid] = []
            connection.received([pack([REQUEST, wid, "watch", [prefix, start, False]])])
        await _next_iteration()
        for frame in recorder.frames():
            if frame[0] in (EVENTS_MANY, EVENTS):  # (a lone watch's: EVENTS, as the client reads)
                revisions = [e.kv.mod_revision for e in decode_events(frame[2])]
                for one in frame[1] if frame[0] == EVENTS_MANY else [frame[1]]:
                    received[one] += revisions
    history = [(e.kv.key, e.kv.mod_revision) for e in _history(engine)]
    for one, (prefix, start) in watches.items():
        wanted = [rev for key, rev in history if key.startswith(prefix) and rev >= start]
        assert received[one] == wanted, (one, prefix, start)
    connection.end()


def _history(engine: MemoryEngine) -> list[WatchEvent]:
    watcher = engine.add_watcher("", 1, object())
    try:
        return engine.read_events(watcher)
    finally:
        engine.remove_watcher(watcher)


# -- the client's end


class _Watch:
    def __init__(self) -> None:
        self.got: list[tuple[list[Any], float]] = []

    def on_events(self, events: list[Any], now: float) -> None:
        self.got.append((events, now))


def _client() -> ClientConnection:
    conn = ClientConnection(asyncio.get_running_loop())
    conn._answer = None  # as after the 101
    conn._messages = MessageReader(MAX_MESSAGE)
    conn.attach(lambda conn: None, 4 << 20)
    return conn


def _message(*frames: list[Any]) -> bytes:
    body = b"".join(pack(frame) for frame in frames)
    return message_header(len(body)) + body


@pytest.mark.asyncio
async def test_the_client_hands_one_events_many_frame_to_each_of_its_watches_decoded_once() -> None:
    conn = _client()
    watches = {wid: _Watch() for wid in (1, 2, 3)}
    conn.watches.update(watches)
    events = _history_events()
    blob = encode_events(events)
    conn.data_received(_message([EVENTS_MANY, [3, 99, 1], blob], [EVENTS, 2, blob]))
    assert not conn.ending  # an unknown watch (unwatched meanwhile) is skipped
    got = [watch.got for watch in watches.values()]
    assert all(len(g) == 1 for g in got)
    assert got[0][0][0] is got[1][0][0] is got[2][0][0]  # decoded once
    assert [(e.kv.key, e.kv.value) for e in got[0][0][0]] == [("k", b"v")]
    assert got[0][0][1] == conn.last_received


@pytest.mark.asyncio
async def test_a_malformed_events_many_frame_ends_the_connection_with_a_reason() -> None:
    conn = _client()
    conn.watches[1] = _Watch()
    blob = encode_events(_history_events())
    conn.data_received(_message([EVENTS_MANY, 1, blob]))
    assert conn.ending
    assert "a malformed frame from the server" in conn.reason
    conn = _client()
    conn.data_received(_message([EVENTS_MANY, [[1]], blob]))
    assert conn.ending


def _history_events() -> list[Any]:
    engine = MemoryEngine()
    engine.put("k", b"v")
    return _history(engine)


# -- end to end


@pytest.mark.asyncio
async def test_a_client_that_offers_only_version_1_gets_every_event_on_many_watches() -> None:
    async with (
        HttpStoreServer(port=0) as server,
        open_store(server.url) as writer,
        open_store(server.url) as reader,
    ):
        assert isinstance(reader, HttpStore)
        reader.session.dialer.hello_versions = [1]  # as a client from before version 2
        watches = [reader.watch("v1/") for _ in range(200)]
        await asyncio.gather(*(w.start() for w in watches))
        assert reader.session.version == 1
        for value in (b"1", b"2"):
            await writer.put("v1/k", value)
        for watch in watches:
            got = [await asyncio.wait_for(anext(watch), 30) for _ in range(2)]
            assert [e.kv.value for e in got] == [b"1", b"2"]
            await watch.aclose()


@pytest.mark.asyncio
async def test_a_current_client_speaks_version_2_and_gets_every_event_in_order() -> None:
    async with (
        HttpStoreServer(port=0) as server,
        open_store(server.url) as writer,
        open_store(server.url) as reader,
    ):
        assert isinstance(reader, HttpStore)
        watches = [reader.watch("v2/") for _ in range(300)]
        for i in range(0, 300, 100):
            await asyncio.gather(*(w.start() for w in watches[i : i + 100]))
        assert reader.session.version == 2
        conn = await reader.session.connection()
        before = conn.messages_received
        values = [str(i).encode() for i in range(5)]
        for value in values:
            await writer.put("v2/k", value)
        for watch in watches:
            got = [await asyncio.wait_for(anext(watch), 30) for _ in values]
            assert [e.kv.value for e in got] == values
        # five puts to 300 watches: a few frames each (not 1,500 frames)
        assert conn.messages_received - before <= 5 * 4
        for watch in watches:
            await watch.aclose()


def test_the_group_head_is_the_msgpack_of_the_frame() -> None:
    from aioelastic.store.http._session_watch import EventGroups

    sent: list[bytes] = []

    class _Conn:
        def send_parts(self, head: bytes, shared: bytes) -> None:
            sent.append(head + shared)

        def send(self, frame: list[Any]) -> None:
            sent.append(pack(frame))

    groups = EventGroups(_Conn())  # type: ignore[arg-type]
    blob = msgpack.packb(encode_events(_history_events()), use_bin_type=True)
    for wid in (7, 300, 2**40):
        groups.add(wid, blob)
    groups.flush()
    [frame] = sent
    assert msgpack.unpackb(frame, raw=False)[:2] == [EVENTS_MANY, [7, 300, 2**40]]
    assert groups.pending == 0


@pytest.mark.asyncio
async def test_a_started_watch_reads_each_event_through_one_coroutine() -> None:
    # (CPU per delivery: Watch.__anext__ around _next was two coroutines per event) and the
    # semantics stay Watch.__anext__'s: events in order, a closed watch ends
    from aioelastic.store.http.client import SessionWatch

    async with HttpStoreServer(port=0) as server, open_store(server.url) as store:
        watch = store.watch("one/")
        assert isinstance(watch, SessionWatch)
        await watch.start()
        await store.put("one/a", b"1")
        await store.put("one/b", b"2")
        step = watch.__anext__()
        code = step.cr_code  # type: ignore[attr-defined]
        assert (await step).kv.value == b"1"
        assert code is SessionWatch._next.__code__
        assert (await asyncio.wait_for(anext(watch), 30)).kv.value == b"2"
        await watch.aclose()
        with pytest.raises(StopAsyncIteration):
            await watch.__anext__()


@pytest.mark.asyncio
async def test_a_watcher_that_does_not_read_stalls_no_other_watch_of_its_group() -> None:
    async with (
        HttpStoreServer(port=0) as server,
        open_store(server.url) as writer,
        open_store(server.url) as reader,
    ):
        slow = reader.watch("s/")
        others = [reader.watch("s/") for _ in range(100)]
        await asyncio.gather(slow.start(), *(w.start() for w in others))
        values = [str(i).encode() for i in range(50)]
        for value in values:
            await writer.put("s/k", value)  # the slow watch is in every group, and reads nothing
        for watch in others:
            got = [await asyncio.wait_for(anext(watch), 30) for _ in values]
            assert [e.kv.value for e in got] == values
        got = [await asyncio.wait_for(anext(slow), 30) for _ in values]  # all of it, in order
        assert [e.kv.value for e in got] == values
        for watch in [slow, *others]:
            await watch.aclose()
