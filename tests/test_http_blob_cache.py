"""The encoded-events cache the REST watch streams and the session watches share: one encoding
per position within a revision, a fresh cache at the next revision, at most MAX_BLOBS entries."""

from __future__ import annotations

import msgpack

from aioelastic.store import EventType, KeyValue, MemoryEngine, WatchEvent
from aioelastic.store.http._blob_cache import MAX_BLOBS, BlobCache
from aioelastic.store.http._frames import encode_events
from aioelastic.store.http._session_server import SessionHub


def _event(revision: int) -> WatchEvent:
    return WatchEvent(EventType.PUT, KeyValue(f"k{revision}", b"v", revision, revision, 1, 0))


class _Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, events: list[WatchEvent]) -> bytes:
        self.calls += 1
        return b"%d:%d" % (self.calls, len(events))


def test_one_position_is_encoded_once_per_revision() -> None:
    encode = _Counting()
    cache = BlobCache(encode)
    events = [_event(3), _event(4)]
    first = cache.get("p/", events, 4)
    assert cache.get("p/", list(events), 4) is first  # another watcher at the same position
    assert encode.calls == 1
    assert cache.get("q/", events, 4) != first  # another prefix is another entry
    assert cache.get("p/", events[1:], 4) != first  # another position too
    assert (encode.calls, len(cache)) == (3, 3)
    cache.get("p/", events, 5)  # the next revision starts again
    assert (encode.calls, len(cache)) == (4, 1)


def test_the_cache_is_bounded_within_a_revision() -> None:
    encode = _Counting()
    cache = BlobCache(encode)
    events = [_event(1)]
    for n in range(MAX_BLOBS):
        cache.get(f"p{n}/", events, 1)
    assert len(cache) == MAX_BLOBS
    cache.get("one-more/", events, 1)
    assert len(cache) == 0  # over the bound: cleared, the answer still right
    assert cache.get("p0/", events, 1) == b"%d:1" % (MAX_BLOBS + 2)


def test_the_session_hub_shares_its_blobs_through_the_cache() -> None:
    engine = MemoryEngine()
    hub = SessionHub(engine, grace=0, max_key_bytes=64, max_value_bytes=64, max_watches=4)
    events = [_event(1)]
    blob = hub.blob("p/", events, 1)
    assert msgpack.unpackb(blob) == encode_events(events)  # a bin object, spliced into frames
    assert hub.blob("p/", [_event(1)], 1) is blob
