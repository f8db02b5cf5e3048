"""The http store's watch as the server's frames drive it (a fake session server,
``helpers.fake_session``): its start refused or unanswered, its end (each code to its error;
``closing`` resumed), events sent twice after a resume delivered once, a progress frame moving
the revision a resume asks for, and the waker a rendezvous reader takes events with."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from helpers.fake_session import Peer, fake_session_server
from helpers.waiting import eventually

from aioelastic.errors import (
    CompactedError,
    StoreClosedError,
    StoreConnectionError,
    WriteOutcomeUnknownError,
)
from aioelastic.store import EventType, KeyValue, WatchEvent, open_store
from aioelastic.store.http import HttpStore
from aioelastic.store.http._frames import ERROR, EVENTS, PROGRESS, RESULT, WATCH_END, encode_events
from aioelastic.store.http.client import SessionWatch
from aioelastic.store.http.server import HttpStoreServer

PREFIX = "p/"


def _events(*revisions: int) -> bytes:
    return encode_events(
        [WatchEvent(EventType.PUT, KeyValue(f"p/{r}", b"v", r, r, 1, 0)) for r in revisions]
    )


class Script:
    """The fake server's side of each watch request: what it answers, then sends."""

    def __init__(self) -> None:
        self.watches: list[list[Any]] = []  # each watch request's args
        self.peers: list[tuple[Peer, int]] = []  # (its connection, its watch id)

    async def answer(self, peer: Peer, frame: list[Any]) -> str | None:
        if frame[2] == "watch":
            self.watches.append(frame[3])
            self.peers.append((peer, frame[1]))
            peer.send([RESULT, frame[1], [frame[3][1] or 1, 4, None]])
        return None

    def send(self, *frames: list[Any]) -> None:
        """Frames to the last watch: ``[kind, ...]`` with its id put in second."""
        peer, wid = self.peers[-1]
        peer.send(*([kind, wid, *rest] for kind, *rest in frames))

    def hang_up(self) -> None:
        self.peers[-1][0].hang_up()


@pytest_asyncio.fixture
async def scripted() -> AsyncIterator[tuple[Script, HttpStore]]:
    script = Script()
    async with (
        fake_session_server(script.answer) as (url, _),
        open_store(url, timeout=5) as store,
    ):
        assert isinstance(store, HttpStore)
        yield script, store


@pytest.mark.parametrize(
    ("code", "error", "words"),
    [
        ("bad_request", ValueError, "watch 'p/': nope"),
        ("storage_error", StoreConnectionError, "watch 'p/': nope (storage_error)"),
    ],
)
@pytest.mark.asyncio
async def test_a_watch_refused_at_its_start_names_the_watch(
    code: str, error: type[Exception], words: str
) -> None:
    """(A watch is a read: a storage error is not an unknown write outcome.)"""

    async def refuse(peer: Peer, frame: list[Any]) -> None:
        peer.send([ERROR, frame[1], code, "nope", {}])

    async with fake_session_server(refuse) as (url, _), open_store(url) as store:
        watch = store.watch(PREFIX)
        with pytest.raises(error) as raised:
            await anext(watch)
        assert str(raised.value) == words
        assert not isinstance(raised.value, WriteOutcomeUnknownError)


@pytest.mark.asyncio
async def test_a_watch_the_server_never_confirms_fails_at_the_request_timeout() -> None:
    async def silent(peer: Peer, frame: list[Any]) -> None:
        return None

    async with fake_session_server(silent) as (url, _), open_store(url, timeout=0.3) as store:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(StoreConnectionError, match=r"^watch 'p/': no answer from http://"):
            await anext(store.watch(PREFIX))
        assert loop.time() - started < 5


@pytest.mark.asyncio
async def test_a_watch_s_end_raises_its_code_s_error_and_closing_resumes_it(
    scripted: tuple[Script, HttpStore],
) -> None:
    script, store = scripted
    compacted = store.watch(PREFIX)
    await compacted.start()
    script.send(
        [WATCH_END, "compacted", "behind", {"requested_revision": 3, "compact_revision": 9}]
    )
    with pytest.raises(CompactedError) as behind:
        await anext(compacted)
    assert (behind.value.requested_revision, behind.value.compact_revision) == (3, 9)
    assert compacted not in store.session.watches
    refused = store.watch(PREFIX)
    await refused.start()
    script.send([WATCH_END, "storage_error", "the disk", None])
    with pytest.raises(StoreConnectionError, match=r"^watch 'p/': the disk \(storage_error\)$"):
        await anext(refused)
    kept = store.watch(PREFIX)
    await kept.start()
    script.send([WATCH_END, "closing", "the server is stopping", None])
    script.send([EVENTS, _events(5)])  # (a frame for a watch ended: dropped)
    conn = store.session._conn
    assert conn is not None
    assert isinstance(kept, SessionWatch)
    await eventually(lambda: kept.wire_id not in conn.watches, 10, "the closing frame")
    assert kept in store.session.watches  # not failed: resumed on the next connection
    script.hang_up()
    await eventually(lambda: len(script.watches) == 4, 10, "the fake server's or the watch's state")
    script.send([EVENTS, _events(6)])
    assert (await anext(kept)).kv.mod_revision == 6


@pytest.mark.asyncio
async def test_events_sent_again_after_a_resume_are_delivered_once(
    scripted: tuple[Script, HttpStore],
) -> None:
    script, store = scripted
    watch = store.watch(PREFIX)
    await watch.start()
    script.send([EVENTS, _events(5, 6)])
    assert [(await anext(watch)).kv.mod_revision for _ in range(2)] == [5, 6]
    script.hang_up()
    await eventually(lambda: len(script.watches) == 2, 10, "the fake server's or the watch's state")
    assert script.watches[1] == [PREFIX, 7, False]  # from the next unseen revision
    script.send([EVENTS, _events(5, 6, 7)], [EVENTS, _events(6)], [EVENTS, _events(8)])
    assert [(await anext(watch)).kv.mod_revision for _ in range(2)] == [7, 8]
    assert isinstance(watch, SessionWatch)
    assert watch.reconnects == 1
    script.hang_up()
    await eventually(lambda: len(script.watches) == 3, 10, "the fake server's or the watch's state")
    await eventually(lambda: watch.reconnects == 2, 10, "the fake server's or the watch's state")


@pytest.mark.asyncio
async def test_a_progress_frame_moves_where_a_resume_starts(
    scripted: tuple[Script, HttpStore],
) -> None:
    script, store = scripted
    watch = store.watch(PREFIX)
    await watch.start()
    script.send([PROGRESS, 10], [PROGRESS, 7])  # (never backwards)
    assert isinstance(watch, SessionWatch)
    await eventually(lambda: watch._next_revision == 11, 10, "the progress frames")
    script.hang_up()
    await eventually(lambda: len(script.watches) == 2, 10, "the fake server's or the watch's state")
    assert script.watches[1] == [PREFIX, 11, False]


@pytest.mark.parametrize(
    ("code", "error", "words"),
    [
        ("bad_request", ValueError, r"^watch 'p/': no more$"),
        ("storage_error", StoreConnectionError, r"^watch 'p/': no more \(storage_error\)$"),
    ],
)
@pytest.mark.asyncio
async def test_a_resume_the_server_refuses_fails_the_watch_naming_it(
    code: str, error: type[Exception], words: str
) -> None:
    """(A resume is a read: a storage error is not an unknown write outcome.)"""
    script = Script()

    async def answer(peer: Peer, frame: list[Any]) -> None:
        if frame[2] == "watch" and script.watches:
            peer.send([ERROR, frame[1], code, "no more", {}])
            return
        await script.answer(peer, frame)

    async with fake_session_server(answer) as (url, _), open_store(url) as store:
        assert isinstance(store, HttpStore)
        watch = store.watch(PREFIX)
        await watch.start()
        script.hang_up()
        with pytest.raises(error, match=words) as failed:
            await anext(watch)
        assert not isinstance(failed.value, WriteOutcomeUnknownError)
        assert watch not in store.session.watches


@pytest.mark.asyncio
async def test_the_waker_is_called_for_each_event_and_the_end_and_takes_them(
    scripted: tuple[Script, HttpStore],
) -> None:
    script, store = scripted
    watch = store.watch(PREFIX)
    woken: list[int] = []
    assert watch._set_waker(lambda: woken.append(1)) is False  # not started: __anext__'s
    await watch.start()
    assert watch._set_waker(lambda: woken.append(1)) is True
    assert watch._take_event() is None
    assert watch._event_ready() is False
    script.send([EVENTS, _events(5)])
    await eventually(lambda: bool(woken), 10, "the fake server's or the watch's state")
    assert watch._event_ready() is True
    event = watch._take_event()
    assert event is not None
    assert event.kv.mod_revision == 5
    assert watch._take_event() is None
    script.send([WATCH_END, "bad_request", "over", None])
    await eventually(lambda: len(woken) == 2, 10, "the fake server's or the watch's state")
    assert watch._event_ready() is True
    with pytest.raises(ValueError, match="over"):
        watch._take_event()
    assert watch._set_waker(None) is True
    unhooked = store.watch(PREFIX)
    await unhooked.start()
    assert unhooked._set_waker(lambda: woken.append(2)) is True
    assert unhooked._set_waker(None) is True
    script.send([EVENTS, _events(6)])
    assert (await anext(unhooked)).kv.mod_revision == 6
    assert 2 not in woken
    await unhooked.aclose()
    assert unhooked._event_ready() is True
    with pytest.raises(StopAsyncIteration):
        unhooked._take_event()


@pytest.mark.asyncio
async def test_a_watch_from_the_past_resumed_delivers_no_revision_twice() -> None:
    """Its history comes in the message of its answer, before the start returns: where the
    watch resumes is after that history, not its start (a real server, the connection cut)."""
    async with HttpStoreServer(port=0) as server:
        for i in range(3):
            server.engine.put(f"p/{i}", b"v")
        async with open_store(server.url) as store:
            assert isinstance(store, HttpStore)
            await store.lease_grant(30)  # (a session with a lease reconnects at once)
            watch = store.watch(PREFIX, start_revision=1)
            assert [(await anext(watch)).kv.mod_revision for _ in range(3)] == [1, 2, 3]
            conn = store.session._conn
            assert conn is not None
            conn.abort("cut by the test")
            server.engine.put("p/3", b"v")
            event = await asyncio.wait_for(anext(watch), 10)
            assert event.kv.mod_revision == 4


@pytest.mark.asyncio
async def test_a_watch_lost_or_closed_while_it_starts_says_so_and_is_forgotten() -> None:
    async def hang_up(peer: Peer, frame: list[Any]) -> str | None:
        return "hang up" if frame[2] == "watch" else None

    async with fake_session_server(hang_up) as (url, _), open_store(url) as store:
        assert isinstance(store, HttpStore)
        lost = store.watch(PREFIX)
        with pytest.raises(StoreConnectionError, match=r"^watch 'p/': the session was lost \("):
            await lost.start()
        assert lost not in store.session.watches

    async def silent(peer: Peer, frame: list[Any]) -> None:
        return None

    async with fake_session_server(silent) as (url, seen):
        store = await open_store(url)
        assert isinstance(store, HttpStore)
        pending = store.watch(PREFIX)
        starting = asyncio.ensure_future(pending.start())
        await eventually(lambda: "watch" in seen.ops, 10, "the watch request")
        await store.aclose()
        with pytest.raises(StoreClosedError, match=r"^the store was closed during watch 'p/'$"):
            await starting


@pytest.mark.asyncio
async def test_a_plain_watch_has_no_snapshot_and_a_closed_one_is_forgotten(
    scripted: tuple[Script, HttpStore],
) -> None:
    _, store = scripted
    watch = store.watch(PREFIX)
    await watch.start()
    assert isinstance(watch, SessionWatch)
    assert watch.snapshot is None
    assert watch in store.session.watches
    await watch.aclose()
    assert watch not in store.session.watches  # (a lost session need not resume it)
