"""A full disk under ``serve --data-dir`` (``ulimit -f`` on a real server process): a write that
does not fit in the log is refused with 507 and leaves no trace, the server takes writes again
once they fit, and after a kill -9 and restart nothing acknowledged is lost and no revision is
handed out twice."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from helpers.http import ServerProcess

from aioelastic.errors import StoreConnectionError, WriteOutcomeUnknownError
from aioelastic.store import EventType, open_store

_LIMIT = 24_000  # bytes any file of the server may hold
_VALUE = 1_000


async def _put(
    http: aiohttp.ClientSession, url: str, key: str, value: bytes
) -> tuple[int, dict[str, Any]]:
    async with http.put(f"{url}/v1/kv/{key}", data=value) as answer:
        return answer.status, json.loads(await answer.read())


@pytest.mark.parametrize("snapshot_every", [10_000, 4], ids=["log-fills", "snapshot-fails-too"])
@pytest.mark.asyncio
async def test_a_full_disk_refuses_writes_and_loses_nothing(
    tmp_path: Path, snapshot_every: int
) -> None:
    data = tmp_path / "data"
    args = ("--data-dir", str(data), "--snapshot-every", str(snapshot_every))
    server = ServerProcess(*args, file_size_limit=_LIMIT)
    await asyncio.to_thread(server.start)
    acknowledged: dict[str, tuple[bytes, int]] = {}
    refused: list[str] = []
    try:
        async with aiohttp.ClientSession() as http:
            for i in range(200):
                key, value = f"k{i:03}", bytes([65 + i % 26]) * _VALUE
                status, body = await _put(http, server.url, key, value)
                if status == 200:
                    assert not refused, "a big write fitted after one was refused"
                    acknowledged[key] = (value, body["revision"])
                    continue
                assert status == 507, body
                assert body["error"] == "insufficient_storage"
                assert "not applied" in body["message"]
                refused.append(key)
                if len(refused) == 3:
                    break
            assert len(refused) == 3, "the disk never filled up"
            async with http.get(f"{server.url}/openapi.json") as answer:  # the answer is documented
                documented = (await answer.json())["paths"]["/v1/kv/{key}"]["put"]["responses"]
            assert "507" in documented
            last = max(revision for _, revision in acknowledged.values())
            assert last == len(acknowledged)  # one revision per write, none skipped
            # reads go on; the refused writes left no trace (key, revision)
            async with http.get(f"{server.url}/v1/revision") as answer:
                assert (await answer.json())["revision"] == last
            for key in refused:
                async with http.get(f"{server.url}/v1/kv/{key}") as answer:
                    assert answer.status == 404
            # the session client is told the same, as a write that was not applied
            async with open_store(server.url) as store:
                with pytest.raises(StoreConnectionError, match="insufficient_storage") as caught:
                    await store.put("big-over-session", b"s" * _VALUE)
                assert not isinstance(caught.value, WriteOutcomeUnknownError)
                assert await store.get("big-over-session") is None
            # a write that fits is taken again, at the very next revision
            status, body = await _put(http, server.url, "small", b"x")
            assert status == 200, body
            assert body["revision"] == last + 1
            acknowledged["small"] = (b"x", last + 1)
    finally:
        server.kill()  # kill -9: only what reached the log survives

    restarted = ServerProcess(*args)
    await asyncio.to_thread(restarted.start)
    try:
        async with open_store(restarted.url) as store:
            found = {kv.key: (kv.value, kv.mod_revision) for kv in (await store.range("")).kvs}
            assert found == acknowledged
            assert (await store.range("")).revision == last + 1
            assert await store.put("after", b"restart") == last + 2
            seen: list[int] = []
            with anyio.fail_after(20):
                async for event in store.watch("", start_revision=1):
                    assert event.type is EventType.PUT
                    seen.append(event.kv.mod_revision)
                    if len(seen) == last + 2:
                        break
            assert seen == list(range(1, last + 3))  # each revision once, in order
    finally:
        restarted.kill()
    assert not list(data.glob("*.torn-*"))  # the record cut short was cut at once
    assert not list(data.glob("*.tmp"))
