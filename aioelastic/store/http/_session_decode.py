"""A session message that is one frame, decoded with one call (the server's short path for a
caller with one request in flight; :func:`~._frames.unpack_all` judges everything else)."""

from __future__ import annotations

from typing import Any

import msgpack

__all__ = ["NOT_ONE", "unpack_one"]

#: What msgpack raises for a message that is not exactly one object (several frames included).
NOT_ONE = (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError)


def unpack_one(body: bytes | memoryview, max_len: int) -> Any:
    """The one msgpack object that is the whole of ``body``, with the limits of
    :func:`~._frames.unpack_all` (which judges everything this does not take)."""
    return msgpack.unpackb(
        body,
        raw=False,
        strict_map_key=True,
        max_bin_len=max_len,
        max_str_len=max_len,
        max_array_len=1_000_000,
        max_map_len=10_000,
        max_ext_len=0,
    )
