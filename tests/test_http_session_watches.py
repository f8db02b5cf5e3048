"""A server session connection's watches (``store/http/_session_conn_watches.py``) over a
recording sender: the server's watch limit and the answer past it, a watch id used twice, the
created answer with and without a snapshot, each prefix's own events at one revision, an
unknown id unwatched, an id free again once its watch ended, progress frames for idle watches
every interval, and nothing left in the engine once the connection ends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers.session_conn import Recorder, connect, make_hub, message_body, next_iteration

from aioelastic.store._txn import Put, check_txn
from aioelastic.store.http._frames import (
    ERROR,
    EVENTS,
    PROGRESS,
    REQUEST,
    RESULT,
    WATCH_END,
    decode_events,
)
from aioelastic.store.memory import MemoryEngine


def watch(rid: int, prefix: str, *, snapshot: bool = False) -> list[Any]:
    return [REQUEST, rid, "watch", [prefix, None, snapshot]]


def frames(recorder: Recorder) -> list[list[Any]]:
    """Every frame written so far, in order (then forgotten)."""
    out = [frame for i in range(len(recorder.writes)) for frame in recorder.frames(i)]
    recorder.writes.clear()
    return out


@pytest.mark.asyncio
async def test_watches_up_to_the_servers_limit_and_a_clear_refusal_past_it() -> None:
    engine = MemoryEngine()
    hub = make_hub(engine, max_watches=3)
    hub.other_watches = lambda: 1  # a REST watch stream counts too
    connection, recorder = connect(hub)
    connection.received([message_body(watch(1, "a/"), watch(2, "b/"), watch(3, "c/"))])
    answers = frames(recorder)
    assert [f[:2] for f in answers] == [[RESULT, 1], [RESULT, 2], [ERROR, 3]]
    assert answers[2][2:4] == ["too_many_watches", "this server serves at most 3 watches"]
    assert hub.watches == 2
    connection.received([message_body([REQUEST, 4, "unwatch", [1]], watch(5, "e/"))])
    assert [f[:2] for f in frames(recorder)] == [[RESULT, 4], [RESULT, 5]]
    connection.end()
    assert hub.watches == 0
    assert engine.watcher_count == 0


@pytest.mark.asyncio
async def test_a_watch_id_in_use_is_refused_and_an_unknown_one_unwatched_is_fine() -> None:
    engine = MemoryEngine()
    connection, recorder = connect(make_hub(engine))
    connection.received([message_body(watch(7, "a/"), watch(7, "b/"))])
    answers = frames(recorder)
    assert [f[:2] for f in answers] == [[RESULT, 7], [ERROR, 7]]
    assert answers[1][2:4] == ["bad_request", "watch id 7 is already in use"]
    connection.received([message_body([REQUEST, 8, "unwatch", [99]])])
    assert frames(recorder) == [[RESULT, 8, None]]
    assert engine.watcher_count == 1
    connection.end()


@pytest.mark.asyncio
async def test_the_created_answer_carries_a_snapshot_only_when_asked() -> None:
    engine = MemoryEngine()
    engine.put("a/1", b"x")
    engine.put("b/1", b"y")
    connection, recorder = connect(make_hub(engine))
    connection.received([message_body(watch(1, "a/"), watch(2, "a/", snapshot=True))])
    plain, snap = frames(recorder)
    assert plain == [RESULT, 1, [3, 2, None]]
    count, kvs = snap[2][2]
    assert snap[:2] == [RESULT, 2]
    assert snap[2][:2] == [3, 2]
    assert count == 1
    assert [kv[:2] for kv in kvs] == [["a/1", b"x"]]
    connection.end()


@pytest.mark.asyncio
async def test_each_prefix_gets_its_own_events_of_one_revision() -> None:
    """Two watches of one connection on prefixes that one txn writes alike (one key each, the
    same revision): each reads its own key, not the other's encoding."""
    engine = MemoryEngine()
    connection, recorder = connect(make_hub(engine))
    connection.received([message_body(watch(1, "a/"), watch(2, "b/"))])
    frames(recorder)
    engine.txn(check_txn([], [Put("a/k", b"1"), Put("b/k", b"2")], []))
    await next_iteration()
    events = {f[1]: decode_events(f[2]) for f in frames(recorder) if f[0] == EVENTS}
    assert {wid: [(e.kv.key, e.kv.value) for e in evs] for wid, evs in events.items()} == {
        1: [("a/k", b"1")],
        2: [("b/k", b"2")],
    }
    connection.end()


@pytest.mark.asyncio
async def test_a_watch_that_ended_frees_its_id() -> None:
    engine = MemoryEngine(history_limit=1)
    connection, recorder = connect(make_hub(engine))
    connection.received([message_body(watch(4, "w/"))])
    frames(recorder)
    connection.pause_writing()  # its events wait in the engine's history
    for i in range(20):
        engine.put(f"w/{i}", b"v")
    await next_iteration()
    connection.resume_writing()
    await next_iteration()
    ended = [f for f in frames(recorder) if f[0] == WATCH_END]
    assert [f[:3] for f in ended] == [[WATCH_END, 4, "compacted"]]
    assert engine.watcher_count == 0
    connection.received([message_body(watch(4, "w/"))])  # the id is free again
    assert [f[:2] for f in frames(recorder)] == [[RESULT, 4]]
    connection.end()


@pytest.mark.asyncio
async def test_at_each_tick_a_progress_frame_for_each_watch_idle_since_the_last() -> None:
    """The ticks by hand (the interval is long): a watch that sent events since the last tick
    gets no progress frame at this one; one that did not gets one, with the revision."""
    engine = MemoryEngine()
    connection, recorder = connect(make_hub(engine), {"progress_interval": 300.0})
    connection.received([message_body(watch(1, "idle/"), watch(2, "busy/"))])
    frames(recorder)
    engine.put("busy/k", b"x")
    await next_iteration()
    assert [f[:2] for f in frames(recorder)] == [[EVENTS, 2]]
    connection._tick()
    await next_iteration()
    assert frames(recorder) == [[PROGRESS, 1, 1]]
    connection._tick()  # nothing since: both idle
    await next_iteration()
    assert sorted(frames(recorder)) == [[PROGRESS, 1, 1], [PROGRESS, 2, 1]]
    connection.end()


@pytest.mark.asyncio
async def test_an_idle_watch_gets_a_progress_frame_every_interval() -> None:
    engine = MemoryEngine()
    connection, recorder = connect(make_hub(engine), {"progress_interval": 0.05})
    connection.received([message_body(watch(1, "idle/"))])
    frames(recorder)
    seen: list[list[Any]] = []
    deadline = asyncio.get_running_loop().time() + 30.0
    while len(seen) < 3:  # (the timer sets itself again after each tick)
        assert asyncio.get_running_loop().time() < deadline, seen
        await asyncio.sleep(0.02)
        seen += frames(recorder)
    assert seen[:3] == [[PROGRESS, 1, 0]] * 3
    connection.end()


@pytest.mark.asyncio
async def test_a_progress_frame_is_sent_once_and_follows_the_events_of_its_pump() -> None:
    """A version-1 connection (no groups): the tick's progress and an event in one pump go out
    as the events, then the progress; the next event has no progress frame after it."""
    engine = MemoryEngine()
    connection, recorder = connect(make_hub(engine), {"progress_interval": 300.0})
    connection.received([message_body(watch(1, "w/"))])
    frames(recorder)
    connection._tick()  # idle since the start: a progress frame is due
    engine.put("w/k", b"1")  # before the pump: it carries both
    await next_iteration()
    assert [f[:2] for f in frames(recorder)] == [[EVENTS, 1], [PROGRESS, 1]]
    engine.put("w/k", b"2")
    await next_iteration()
    assert [f[:2] for f in frames(recorder)] == [[EVENTS, 1]]
    connection.end()


@pytest.mark.asyncio
async def test_a_watch_whose_events_were_compacted_unread_ends_saying_the_revisions() -> None:
    engine = MemoryEngine()
    connection, recorder = connect(make_hub(engine))
    connection.received([message_body(watch(1, "w/"))])
    frames(recorder)
    connection.pause_writing()  # (the client stopped reading: its watch waits)
    for value in (b"1", b"2", b"3"):
        engine.put("w/k", value)
    engine.compact(engine.revision)
    connection.resume_writing()
    await next_iteration()
    [end] = frames(recorder)
    assert end[:3] == [WATCH_END, 1, "compacted"]
    assert end[4] == {"requested_revision": 1, "compact_revision": 3}
    assert "compacted" in end[3]
    assert "3" in end[3]
    assert engine.watcher_count == 0
    connection.end()


@pytest.mark.asyncio
async def test_a_watch_of_a_closed_store_ends_closing_with_the_stores_words() -> None:
    engine = MemoryEngine()
    connection, recorder = connect(make_hub(engine))
    connection.received([message_body(watch(1, "w/"))])
    frames(recorder)
    engine.close()
    await next_iteration()
    [end] = frames(recorder)
    assert end[:3] == [WATCH_END, 1, "closing"]
    assert end[3]
    assert end[3] != "None"
    assert end[4] == {}
    connection.end()


@pytest.mark.asyncio
async def test_releasing_a_watch_twice_is_harmless() -> None:
    engine = MemoryEngine()
    hub = make_hub(engine)
    connection, recorder = connect(hub)
    connection.received([message_body(watch(1, "w/"))])
    frames(recorder)
    [served] = connection._watches.values()
    served.release()
    served.release()
    assert hub.watches == 0
    assert engine.watcher_count == 0
    served.woken()  # (a late wake-up of a released watch queues nothing)
    assert connection._ready == []
    await next_iteration()
    assert recorder.writes == []
    connection.end()


@pytest.mark.asyncio
async def test_a_watch_woken_twice_before_its_pump_is_queued_once() -> None:
    engine = MemoryEngine()
    connection, recorder = connect(make_hub(engine))
    connection.received([message_body(watch(1, "w/"))])
    frames(recorder)
    engine.put("w/a", b"1")
    engine.put("w/b", b"2")
    [served] = connection._ready
    served.woken()  # (the tick's wake-up, say)
    assert len(connection._ready) == 1
    await next_iteration()
    [events] = frames(recorder)
    assert [e.kv.key for e in decode_events(events[2])] == ["w/a", "w/b"]
    connection.end()
