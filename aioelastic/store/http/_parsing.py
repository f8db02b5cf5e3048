"""Reading the REST requests: integer parameters, JSON fields, ETags, refused codings."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from aiohttp import web

from ._errors import ApiError, bad
from ._limits import MAX_JSON_BODY_BYTES

__all__ = [
    "DECIMAL",
    "etag_revision",
    "int_param",
    "json_int",
    "json_number",
    "parse_int",
    "read_json_body",
    "refuse_codings",
]


def int_param(request: web.Request, name: str, *, minimum: int, default: int | None = None) -> int:
    raw = request.query.get(name) if request.query_string else None
    if raw is None:
        if default is None:
            raise bad(f"query parameter {name!r} is required (an integer >= {minimum})")
        return default
    return parse_int(raw, f"query parameter {name!r}", minimum)


DECIMAL = re.compile(r"-?[0-9]{1,19}")


def parse_int(raw: str, what: str, minimum: int) -> int:
    raw = raw.strip()
    if not DECIMAL.fullmatch(raw):
        raise bad(f"{what} must be a decimal integer >= {minimum}, got {raw[:40]!r}")
    value = int(raw)
    if value < minimum or value >= 2**63:
        raise bad(f"{what} must be an integer in [{minimum}, 2**63), got {value}")
    return value


def json_int(body: dict[str, Any], name: str, minimum: int) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"field {name!r} must be an integer >= {minimum}, got {value!r}"[:200])
    if value < minimum or value >= 2**63:
        raise bad(f"field {name!r} must be an integer in [{minimum}, 2**63), got {value}")
    return value


def json_number(body: dict[str, Any], name: str) -> float:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(f"field {name!r} must be a number of seconds > 0, got {value!r}"[:200])
    number = float(value)
    if not math.isfinite(number) or number <= 0 or number > 1e9:
        raise bad(f"field {name!r} must be a finite number of seconds in (0, 1e9], got {value!r}")
    return number


def etag_revision(raw: str, header: str) -> int:
    raw = raw.strip()
    if raw.startswith("W/"):
        raw = raw[2:]
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        raw = raw[1:-1]
    return parse_int(raw, f"header {header}", 0)


def refuse_codings(request: web.Request) -> None:
    """415 for a body in a content coding (gzip, deflate, ...) or a transfer coding besides
    ``chunked``. The server does not decompress (``auto_decompress=False``): a decoded size is
    unbounded by the body's, a part is never stored, and a compressed one never as the value."""
    coding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if coding != "identity":
        raise ApiError(
            415,
            "unsupported_content_encoding",
            f"request bodies are taken as they are (Content-Encoding: identity); "
            f"{coding[:40]!r} is not accepted: send the body uncompressed",
            headers={"Accept-Encoding": "identity"},
        )
    transfer = request.headers.get("Transfer-Encoding")
    if transfer is not None and transfer.strip().lower() != "chunked":
        raise ApiError(
            415,
            "unsupported_transfer_encoding",
            f"the only transfer coding accepted is chunked, got {transfer[:40]!r}",
        )


async def read_json_body(request: web.Request) -> dict[str, Any]:
    """The request's body, a JSON object of at most :data:`MAX_JSON_BODY_BYTES` (empty: ``{}``)."""
    too_large = ApiError(
        413, "body_too_large", f"JSON body too large: at most {MAX_JSON_BODY_BYTES} bytes"
    )
    length = request.content_length
    if length is not None and length > MAX_JSON_BODY_BYTES:
        raise too_large
    raw = await request.read()
    if len(raw) > MAX_JSON_BODY_BYTES:
        raise too_large
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise bad("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    return body
