"""``benchmarks/server_join_replay.py``: a recording's reads reach the server code as they were
read (hello, requests, a connection's end), in order, and each warm round gets its figure."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import msgpack

from aioelastic.store.http._frames import REQUEST, pack
from aioelastic.store.http._session_stream import message_header
from aioelastic.store.memory import MemoryEngine
from benchmarks.server_join_replay import _replay, _segments


def _read(session: int, *frames: list[object]) -> list[object]:
    body = b"".join(pack(frame) for frame in frames)
    return ["D", session, base64.b64encode(message_header(len(body)) + body).decode()]


def test_a_recording_is_replayed_in_order_into_the_server(tmp_path: Path) -> None:
    hello = [REQUEST, 0, "hello", {"versions": [1, 2]}]
    lines = [
        _read(0, hello),
        _read(1, hello),
        _read(1, [REQUEST, 1, "put", ["k", b"1", 0]]),
        ["MARK"],
        _read(0, [REQUEST, 1, "put", ["k", b"2", 0]]),
        _read(1, [REQUEST, 2, "txn", [[["k", "value", "==", b"2"]], [["put", "k", b"3", 0]], []]]),
        ["END"],
        ["L", 1],
    ]
    path = tmp_path / "round.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [len(segment) for segment in _segments(path)] == [3, 2, 1]
    # each hello asks for progress ticks too slow to fire within a replay (callgrind's included)
    first = _segments(path)[0][0][2]
    assert msgpack.unpackb(first[4:])[3] == {"versions": [1, 2], "progress_interval": 300.0}
    assert int.from_bytes(first[:4], "big") == len(first) - 4

    async def main() -> tuple[MemoryEngine, list[float]]:
        engine = MemoryEngine()
        return engine, await _replay(_segments(path), 2, engine)

    engine, rounds = asyncio.run(main())
    assert len(rounds) == 1
    kv = engine.get("k")
    assert kv is not None
    assert (kv.value, kv.version) == (b"3", 3)  # the txn saw the put before it
