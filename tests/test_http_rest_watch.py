"""The REST watch stream (``GET /v1/watch/{prefix}``, NDJSON) on a real server (127.0.0.1):
its created frame field by field, one line per revision, progress when idle, the closing frame,
each parameter's refusal word for word, the stream limit; and its progress timer."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from helpers.clock import FakeClock
from helpers.waiting import eventually

from aioelastic.store import Put, Txn
from aioelastic.store.http._rest_watch import (
    DEFAULT_PROGRESS_INTERVAL,
    MAX_PROGRESS_INTERVAL,
    MIN_PROGRESS_INTERVAL,
    ProgressTimer,
)
from aioelastic.store.http.server import HttpStoreServer

TIMEOUT = 10.0


class _Stream:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self) -> dict[str, Any]:
        line = await asyncio.wait_for(self.response.content.readline(), TIMEOUT)
        assert line.endswith(b"\n"), line
        frame: dict[str, Any] = json.loads(line)
        return frame


async def _open(
    http: aiohttp.ClientSession, url: str
) -> AsyncIterator[tuple[int, Any, _Stream | None]]:
    async with http.get(url) as response:
        if response.status != 200:
            yield response.status, await response.json(), None
            return
        assert response.headers["Content-Type"] == "application/x-ndjson"
        assert response.headers["Cache-Control"] == "no-store"
        yield 200, None, _Stream(response)


@pytest.mark.asyncio
async def test_a_watch_says_where_it_starts_then_one_line_per_revision() -> None:
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as http:
        server.engine.put("p/old", b"0")
        server.engine.put("q/x", b"0")
        async for status, _, stream in _open(http, f"{server.url}/v1/watch/p/"):
            assert status == 200
            assert stream is not None
            assert await stream.next() == {
                "type": "created",
                "start_revision": 3,
                "revision": 2,
                "progress_interval": DEFAULT_PROGRESS_INTERVAL,
            }
            server.engine.put("q/y", b"1")  # another prefix: no line
            server.engine.put("p/a", b"1")
            server.engine.delete("p/", True)
            first = await stream.next()
            assert (first["type"], first["revision"]) == ("events", 4)
            assert [(e["type"], e["key"]) for e in first["events"]] == [("PUT", "p/a")]
            assert first["events"][0]["value_b64"] == base64.b64encode(b"1").decode()
            second = await stream.next()
            assert (second["type"], second["revision"]) == ("events", 5)
            assert sorted(e["key"] for e in second["events"]) == ["p/a", "p/old"]
            assert {e["type"] for e in second["events"]} == {"DELETE"}


@pytest.mark.asyncio
async def test_a_watch_from_a_revision_replays_from_there() -> None:
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as http:
        for i in range(3):
            server.engine.put(f"p/{i}", b"v")
        async for _, _, stream in _open(http, f"{server.url}/v1/watch/p/?start_revision=2"):
            assert stream is not None
            created = await stream.next()
            assert (created["start_revision"], created["revision"]) == (2, 3)
            assert [(await stream.next())["revision"] for _ in range(2)] == [2, 3]


@pytest.mark.asyncio
async def test_a_snapshot_watch_starts_with_the_prefix_now() -> None:
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as http:
        server.engine.put("p/a", b"1")
        server.engine.put("p/b", b"2")
        server.engine.put("q/c", b"3")
        url = f"{server.url}/v1/watch/p/?snapshot=1&progress_interval=60"
        async for _, _, stream in _open(http, url):
            assert stream is not None
            created = await stream.next()
            assert (created["start_revision"], created["revision"], created["count"]) == (4, 3, 2)
            assert created["progress_interval"] == 60.0
            assert [kv["key"] for kv in created["kvs"]] == ["p/a", "p/b"]
            assert created["kvs"][1]["value_b64"] == base64.b64encode(b"2").decode()
        async for _, _, stream in _open(http, f"{server.url}/v1/watch/p/?snapshot=0"):
            assert stream is not None
            assert "kvs" not in await stream.next()


@pytest.mark.asyncio
async def test_an_idle_watch_gets_progress_and_a_busy_one_events() -> None:
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as http:
        server.engine.put("x", b"1")
        url = f"{server.url}/v1/watch/p/?progress_interval={MIN_PROGRESS_INTERVAL}"
        async for _, _, stream in _open(http, url):
            assert stream is not None
            assert (await stream.next())["progress_interval"] == MIN_PROGRESS_INTERVAL
            assert await stream.next() == {"type": "progress", "revision": 1}
            server.engine.put("x", b"2")
            assert await stream.next() == {"type": "progress", "revision": 2}
            server.engine.put("p/a", b"1")
            while (frame := await stream.next())["type"] == "progress":
                pass
            assert (frame["type"], frame["revision"]) == ("events", 3)


@pytest.mark.asyncio
async def test_a_server_that_stops_ends_its_watch_streams_with_closing() -> None:
    async with aiohttp.ClientSession() as http:
        server = HttpStoreServer(port=0)
        await server.__aenter__()
        try:
            async for _, _, stream in _open(http, f"{server.url}/v1/watch/p/"):
                assert stream is not None
                await stream.next()
                stopping = asyncio.ensure_future(server.aclose())
                assert await stream.next() == {"type": "closing"}
                await stopping
        finally:
            await server.aclose()


@pytest.mark.asyncio
async def test_a_watch_from_a_compacted_revision_is_a_410() -> None:
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as http:
        for i in range(4):
            server.engine.put(f"p/{i}", b"v")
        server.engine.compact(3)
        async for status, body, _ in _open(http, f"{server.url}/v1/watch/p/?start_revision=2"):
            assert status == 410
            assert body["error"] == "compacted"


BAD = [
    (
        "start_revision=0",
        "query parameter 'start_revision' must be an integer in [1, 2**63), got 0",
    ),
    ("progress_interval=x", "progress_interval must be a number of seconds, got 'x'"),
    (
        "progress_interval=0.049",
        f"progress_interval must be in [{MIN_PROGRESS_INTERVAL}, {MAX_PROGRESS_INTERVAL}] "
        "seconds, got '0.049'",
    ),
    (
        "progress_interval=300.1",
        f"progress_interval must be in [{MIN_PROGRESS_INTERVAL}, {MAX_PROGRESS_INTERVAL}] "
        "seconds, got '300.1'",
    ),
    ("progress_interval=" + "9" * 60, "progress_interval must be in "),
    ("snapshot=2", "snapshot must be 0 or 1, got '2'"),
    ("snapshot=true", "snapshot must be 0 or 1, got 'true'"),
    ("snapshot=1&start_revision=1", "snapshot=1 reads the prefix now: it takes no start_revision"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(("query", "message"), BAD, ids=[q for q, _ in BAD])
async def test_a_watch_with_a_bad_parameter_is_a_400_that_says_which(
    query: str, message: str
) -> None:
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as http:
        async for status, body, _ in _open(http, f"{server.url}/v1/watch/p/?{query}"):
            assert (status, body["error"]) == (400, "bad_request")
            assert body["message"].startswith(message)
            if query.startswith("progress_interval=99"):
                assert body["message"].endswith(f"got {'9' * 40!r}")
        assert server.statistics()["watch_streams"] == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("interval", [MIN_PROGRESS_INTERVAL, MAX_PROGRESS_INTERVAL])
async def test_the_progress_interval_s_bounds_are_taken(interval: float) -> None:
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as http:
        url = f"{server.url}/v1/watch/p/?progress_interval={interval}"
        async for status, _, stream in _open(http, url):
            assert status == 200
            assert stream is not None
            assert (await stream.next())["progress_interval"] == interval


@pytest.mark.asyncio
async def test_watch_streams_past_the_limit_are_a_503_and_a_slot_freed_is_taken() -> None:
    async with (
        HttpStoreServer(port=0, max_watch_streams=1) as server,
        aiohttp.ClientSession() as http,
    ):
        async for _, _, stream in _open(http, f"{server.url}/v1/watch/a/"):
            assert stream is not None
            await stream.next()
            assert server.statistics()["watch_streams"] == 1
            async for status, body, _ in _open(http, f"{server.url}/v1/watch/b/"):
                assert (status, body) == (
                    503,
                    {
                        "error": "too_many_watches",
                        "message": "this server serves at most 1 watch streams",
                    },
                )
        await eventually(lambda: server.statistics()["watch_streams"] == 0, TIMEOUT, "freed")
        async for status, _, _stream in _open(http, f"{server.url}/v1/watch/b/"):
            assert status == 200


# -- the progress timer ---------------------------------------------------------------------------


def _timer(clock: FakeClock, interval: float, woken: list[float]) -> ProgressTimer:
    return ProgressTimer(clock, interval, lambda: woken.append(clock.now))  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_the_progress_timer_fires_once_per_silent_interval() -> None:
    clock, woken = FakeClock(), list[float]()
    timer = _timer(clock, 5.0, woken)
    assert clock.pending == [105.0]
    clock.run_until(104.9)
    assert (woken, timer.due) == ([], False)
    clock.run_until(105.0)
    assert (woken, timer.due) == ([105.0], True)
    assert clock.pending == [110.0]  # re-armed an interval on
    timer.sent()
    assert not timer.due
    clock.run_until(120.0)
    assert woken == [105.0, 110.0, 115.0, 120.0]


@pytest.mark.asyncio
async def test_a_stream_that_sends_is_not_due() -> None:
    """Each send pushes the deadline: the timer that fires before it re-arms for the rest."""
    clock, woken = FakeClock(), list[float]()
    timer = _timer(clock, 5.0, woken)
    for at in (102.0, 104.0, 106.0, 108.0):
        clock.run_until(at)
        timer.sent()
    clock.run_until(112.9)
    assert (woken, timer.due) == ([], False)
    assert clock.pending == [113.0]  # the last send, 108, plus 5
    clock.run_until(113.0)
    assert (woken, timer.due) == ([113.0], True)


# -- found by mutation testing (scripts/mutants store-http-rest) ----------------------------------


@pytest.mark.asyncio
async def test_a_stream_compacted_past_its_position_ends_with_a_compacted_frame() -> None:
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as http:
        async for _, _, stream in _open(http, f"{server.url}/v1/watch/p/"):
            assert stream is not None
            await stream.next()
            # (the server runs on this loop: the stream reads nothing before the compaction)
            server.engine.put("p/a", b"1")
            server.engine.put("p/b", b"2")
            server.engine.compact(2)
            frame = await stream.next()
            assert frame == {
                "type": "error",
                "error": "compacted",
                "message": frame["message"],
                "requested_revision": 1,
                "compact_revision": 2,
            }
            assert "compacted" in frame["message"]
            assert await stream.response.content.read() == b""  # the stream ended


@pytest.mark.asyncio
async def test_streams_of_two_prefixes_each_get_their_own_events_of_one_revision() -> None:
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as http:
        async for _, _, a in _open(http, f"{server.url}/v1/watch/a/"):
            async for _, _, b in _open(http, f"{server.url}/v1/watch/b/"):
                assert a is not None
                assert b is not None
                await a.next()
                await b.next()
                server.engine.put("b/0", b"0")  # revision 1: b/ only
                assert [e["key"] for e in (await b.next())["events"]] == ["b/0"]
                # revision 2: both prefixes at once
                server.engine.txn(Txn(success=(Put("a/1", b"1"), Put("b/1", b"1"))))
                assert [e["key"] for e in (await a.next())["events"]] == ["a/1"]
                assert [e["key"] for e in (await b.next())["events"]] == ["b/1"]


@pytest.mark.asyncio
@pytest.mark.parametrize("name", ["snapshot", "progress_interval"])
async def test_a_long_bad_parameter_is_quoted_to_40_characters(name: str) -> None:
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as http:
        async for status, body, _ in _open(http, f"{server.url}/v1/watch/p/?{name}={'q' * 60}"):
            assert status == 400
            assert body["message"].endswith(f"got {'q' * 40!r}")
