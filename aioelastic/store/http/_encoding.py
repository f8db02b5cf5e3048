"""The JSON forms of the REST answers: key-values, watch frames, compact JSON responses."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from .._types import KeyValue, WatchEvent

__all__ = [
    "NDJSON",
    "encode_json",
    "event_json",
    "events_lines",
    "frame",
    "json_response",
    "json_str",
    "kv_json",
    "precondition_failed",
    "written",
]

NDJSON = "application/x-ndjson"


def kv_json(kv: KeyValue, *, value: bool = True) -> dict[str, Any]:
    """The JSON form of a key-value (``value_b64``: the value, base64)."""
    out: dict[str, Any] = {
        "key": kv.key,
        "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision,
        "version": kv.version,
        "lease": kv.lease,
    }
    if value:
        out["value_b64"] = base64.b64encode(kv.value).decode("ascii")
    return out


def event_json(event: WatchEvent) -> dict[str, Any]:
    return {"type": event.type.value, **kv_json(event.kv)}


def events_lines(events: list[WatchEvent]) -> bytes:
    """One NDJSON line per revision: ``{"type":"events","revision":R,"events":[...]}``."""
    lines: list[bytes] = []
    batch: list[dict[str, Any]] = []
    revision = events[0].revision
    for event in events:
        if event.revision != revision:
            lines.append(frame({"type": "events", "revision": revision, "events": batch}))
            batch, revision = [], event.revision
        batch.append(event_json(event))
    lines.append(frame({"type": "events", "revision": revision, "events": batch}))
    return b"".join(lines)


#: Compact JSON, with the encoder built once (``json.dumps(separators=...)`` builds one per call).
encode_json = json.JSONEncoder(separators=(",", ":")).encode


def frame(obj: dict[str, Any]) -> bytes:
    return encode_json(obj).encode() + b"\n"


def json_response(
    obj: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    all_headers = {"Content-Type": "application/json"}
    if headers:
        all_headers.update(headers)
    return web.Response(status=status, body=encode_json(obj).encode(), headers=all_headers)


def written(revision: int, kv: KeyValue) -> web.Response:
    """The answer to a successful put: ``{"revision": R, "kv": {...}}`` (no value), ``ETag: "R"``.

    The hottest write answer, formatted directly: the same bytes as
    ``json_response({"revision": R, "kv": kv_json(kv, value=False)})`` (compact, ASCII-escaped
    key, the fields in that order) without building two dicts and walking them with the encoder.
    """
    body = (
        f'{{"revision":{revision},"kv":{{"key":{json_str(kv.key)},'
        f'"create_revision":{kv.create_revision},"mod_revision":{kv.mod_revision},'
        f'"version":{kv.version},"lease":{kv.lease}}}}}'
    )
    return web.Response(
        body=body.encode(),
        headers={"Content-Type": "application/json", "ETag": f'"{revision}"'},
    )


#: A JSON string literal, escaped exactly as the (``ensure_ascii``) encoder above escapes it.
json_str: Callable[[str], str] = json.encoder.encode_basestring_ascii


def precondition_failed(key: str, revision: int, kv: KeyValue | None) -> web.Response:
    return json_response(
        {
            "error": "precondition_failed",
            "message": f"compare failed for {key[:200]!r}: "
            + ("it is absent" if kv is None else f"its mod_revision is {kv.mod_revision}"),
            "revision": revision,
            "kv": None if kv is None else kv_json(kv),
        },
        status=412,
    )
