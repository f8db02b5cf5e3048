"""The on-disk encoding of ``serve --data-dir``: checksummed lines, records, the log header and
the snapshot document (the format is described in docs/http-api.md, "The data directory")."""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any

from .._types import EventType, KeyValue, WatchEvent
from ..memory import EngineState

__all__ = [
    "FORMAT",
    "LEGACY_FORMAT",
    "LOCK",
    "SNAPSHOT",
    "WAL",
    "decode_line",
    "encode_line",
    "event_in",
    "event_out",
    "snapshot_document",
    "snapshot_state",
]

FORMAT = 2  # framed, checksummed snapshot; log starting with a header line
LEGACY_FORMAT = 1  # bare JSON snapshot without a checksum; log without a header
WAL = "wal.log"
SNAPSHOT = "snapshot.json"
LOCK = "LOCK"


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def kv_out(kv: KeyValue) -> list[Any]:
    return [kv.key, _b64(kv.value), kv.create_revision, kv.mod_revision, kv.version, kv.lease]


def kv_in(row: list[Any]) -> KeyValue:
    key, value, create, mod, version, lease = row
    return KeyValue(key, base64.b64decode(value, validate=True), create, mod, version, lease)


def event_out(event: WatchEvent) -> list[Any]:
    if event.type is EventType.PUT:
        return ["P", *kv_out(event.kv)]
    return ["D", event.kv.key, event.kv.mod_revision]


def event_in(row: list[Any]) -> WatchEvent:
    if row[0] == "P":
        return WatchEvent(EventType.PUT, kv_in(row[1:]))
    if row[0] == "D":
        return WatchEvent(EventType.DELETE, KeyValue(row[1], b"", 0, row[2], 0, 0))
    raise ValueError(f"unknown event type {row[0]!r}")


def encode_line(document: dict[str, Any]) -> bytes:
    """``<crc32 of the JSON, 8 hex digits> <JSON>\\n``: one log line, or the whole snapshot."""
    body = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def decode_line(line: bytes) -> dict[str, Any] | str:
    """The JSON object on ``line`` (its ``\\n`` removed), or a string saying why it is damaged."""
    if len(line) < 10 or line[8:9] != b" ":
        return "not a checksummed line"
    body = line[9:]
    try:
        checksum = int(line[:8], 16)
    except ValueError:
        return "not a checksummed line"
    if checksum != zlib.crc32(body):
        return "bad checksum"
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # summed by another writer (or a hand), not ours
        return "not JSON"
    return document if isinstance(document, dict) else "not a JSON object"


def snapshot_document(state: EngineState, sequence: int) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "q": sequence,
        "revision": state.revision,
        "compact_revision": state.compact_revision,
        "last_lease_id": state.last_lease_id,
        "leases": [[lease_id, ttl] for lease_id, ttl in state.leases.items()],
        "kvs": [kv_out(kv) for kv in state.kvs],
        "history": [event_out(e) for e in state.history],
    }


def snapshot_state(document: dict[str, Any]) -> tuple[EngineState, int]:
    """The engine state and sequence number in a snapshot document (``ValueError`` etc. if bad)."""
    state = EngineState(
        revision=int(document["revision"]),
        compact_revision=int(document["compact_revision"]),
        kvs=tuple(kv_in(row) for row in document["kvs"]),
        history=tuple(event_in(row) for row in document["history"]),
        leases={int(i): float(t) for i, t in document["leases"]},
        last_lease_id=int(document["last_lease_id"]),
    )
    return state, int(document["q"])
