"""Watch fan-out on the session server: a session's watches are served without a task each, one
put reaches every watch of a connection in a few messages, and a watch closed while it was queued
to be pumped is skipped (real server, real sockets on 127.0.0.1)."""

from __future__ import annotations

import asyncio

import pytest

from aioelastic.store import open_store
from aioelastic.store.http import HttpStore
from aioelastic.store.http.server import HttpStoreServer

WATCHES = 300


@pytest.mark.asyncio
async def test_a_sessions_watches_cost_the_server_no_task_each() -> None:
    async with HttpStoreServer(port=0) as server, open_store(server.url) as store:
        await store.put("warm", b"")  # the session is up, its connection's tasks exist
        before = len(asyncio.all_tasks())
        watches = [store.watch("fan/") for _ in range(WATCHES)]
        await asyncio.gather(*(w.start() for w in watches))
        assert server.statistics()["session_watches"] == WATCHES
        # server and client share this loop: a task per served watch would add WATCHES here
        assert len(asyncio.all_tasks()) - before < 10
        await store.put("fan/k", b"v")
        events = await asyncio.wait_for(asyncio.gather(*(anext(w) for w in watches)), 30)
        assert {(e.kv.key, e.kv.value) for e in events} == {("fan/k", b"v")}
        for watch in watches:
            await watch.aclose()


@pytest.mark.asyncio
async def test_one_put_reaches_a_thousand_watches_of_a_session_in_a_few_messages() -> None:
    async with (
        HttpStoreServer(port=0) as server,
        open_store(server.url) as writer,
        open_store(server.url) as reader,
    ):
        watches = [reader.watch("fan/") for _ in range(1000)]
        for i in range(0, len(watches), 100):
            await asyncio.gather(*(w.start() for w in watches[i : i + 100]))
        assert isinstance(reader, HttpStore)
        conn = await reader.session.connection()
        before = conn.messages_received
        await writer.put("fan/k", b"x" * 100)
        events = await asyncio.wait_for(asyncio.gather(*(anext(w) for w in watches)), 30)
        assert all(e.kv.value == b"x" * 100 for e in events)
        # the frames go out as they are encoded, in chunks, never as a message per watch
        assert 1 <= conn.messages_received - before <= 20
        for watch in watches:
            await watch.aclose()


@pytest.mark.asyncio
async def test_watches_closed_while_queued_are_skipped_and_the_others_deliver() -> None:
    async with (
        HttpStoreServer(port=0) as server,
        open_store(server.url) as writer,
        open_store(server.url) as reader,
    ):
        watches = [reader.watch("q/") for _ in range(200)]
        await asyncio.gather(*(w.start() for w in watches))
        for round_ in range(5):
            # the put and the unwatches race: a watch may be queued on the server, then closed
            put = asyncio.ensure_future(writer.put("q/k", str(round_).encode()))
            for watch in watches[-10:]:
                await watch.aclose()
            del watches[-10:]
            await put
            events = await asyncio.wait_for(asyncio.gather(*(anext(w) for w in watches)), 30)
            assert {e.kv.value for e in events} == {str(round_).encode()}
        await reader.get("q/k")  # behind the unwatches on the reader's connection
        assert server.statistics()["session_watches"] == len(watches)
        for watch in watches:
            await watch.aclose()
