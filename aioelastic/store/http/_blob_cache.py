"""The encoded events of the current revision, shared by every watcher at the same position.

A write seen by 1,000 watchers of one prefix is encoded once, not 1,000 times: the REST watch
streams (NDJSON frames) and the session watches (msgpack blobs) each keep one of these.
"""

from __future__ import annotations

from collections.abc import Callable

from .._types import WatchEvent

__all__ = ["MAX_BLOBS", "BlobCache"]

#: Entries kept within one revision at most (then the cache starts again): many prefixes at
#: many positions cost memory, never correctness.
MAX_BLOBS = 1024


class BlobCache:
    """``encode(events)`` once per (prefix, first and last revision, count) within a revision.

    Two watchers of one prefix that read the same revision range got the same events (a read
    always ends at a revision boundary), so their encodings can be shared. The cache holds the
    current revision's entries only, at most :data:`MAX_BLOBS` of them.
    """

    __slots__ = ("_blobs", "_encode", "_last", "_revision")

    def __init__(self, encode: Callable[[list[WatchEvent]], bytes]) -> None:
        self._encode = encode
        self._blobs: dict[tuple[str, int, int, int], bytes] = {}
        self._revision = -1
        #: the last answer: (first event, last event, count, prefix, blob); the N watchers one
        #: write wakes read the same event objects, one after the other
        self._last: tuple[WatchEvent, WatchEvent, int, str, bytes] | None = None

    def __len__(self) -> int:
        return len(self._blobs)

    def get(self, prefix: str, events: list[WatchEvent], revision: int) -> bytes:
        """The encoding of ``events`` (not empty), read from ``prefix`` at ``revision``."""
        last = self._last
        if (
            last is not None
            and last[0] is events[0]
            and last[1] is events[-1]
            and last[2] == len(events)
            and last[3] == prefix
            and revision == self._revision
        ):
            return last[4]
        if revision != self._revision:
            self._blobs.clear()
            self._revision = revision
        # (kv.mod_revision: each event's revision, without the property's call per pump)
        key = (prefix, events[0].kv.mod_revision, events[-1].kv.mod_revision, len(events))
        blob = self._blobs.get(key)
        if blob is None:
            blob = self._blobs[key] = self._encode(events)
            if len(self._blobs) > MAX_BLOBS:
                self._blobs.clear()
        self._last = (events[0], events[-1], len(events), prefix, blob)
        return blob
