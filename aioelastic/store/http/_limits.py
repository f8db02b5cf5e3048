"""The server's size limits: keys, values, JSON and transaction bodies, watch streams."""

from __future__ import annotations

from .._txn import MAX_TXN_BYTES

__all__ = [
    "DEFAULT_MAX_KEY_BYTES",
    "DEFAULT_MAX_VALUE_BYTES",
    "DEFAULT_MAX_WATCH_STREAMS",
    "MAX_JSON_BODY_BYTES",
    "MAX_TXN_BODY",
    "Limits",
]

DEFAULT_MAX_VALUE_BYTES = 1024 * 1024
DEFAULT_MAX_KEY_BYTES = 4096
DEFAULT_MAX_WATCH_STREAMS = 10_000
#: Largest JSON request body (``/v1/compact``, ``/v1/lease``: a few bytes each), whatever the
#: value limit (which bounds ``PUT /v1/kv`` bodies).
MAX_JSON_BODY_BYTES = 64 * 1024
#: The largest ``POST /v1/txn`` body: room for MAX_TXN_BYTES in base64 with JSON around it.
MAX_TXN_BODY = 4 * MAX_TXN_BYTES


class Limits:
    """The limits one server was started with (``make_app``'s arguments)."""

    def __init__(self, max_key_bytes: int, max_value_bytes: int, max_watch_streams: int) -> None:
        self.max_key_bytes = max_key_bytes
        self.max_value_bytes = max_value_bytes
        self.max_watch_streams = max_watch_streams
