"""The encoded-events cache the REST watch streams and the session watches share: one encoding
per position within a revision, a fresh cache at the next revision, at most MAX_BLOBS entries."""

from __future__ import annotations

from collections.abc import Callable

import msgpack
import pytest

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


def test_the_watchers_one_write_woke_get_the_last_answer_without_a_lookup() -> None:
    """The N watchers one write wakes read the same event objects one after the other: the
    cache answers them from its last answer, not its table (which it does not look at)."""
    encode = _Counting()
    cache = BlobCache(encode)
    events = [_event(3), _event(4)]
    first = cache.get("p/", events, 4)
    cache._blobs.clear()  # (the table forgotten: only the last answer can give it again)
    assert cache.get("p/", list(events), 4) is first
    assert encode.calls == 1


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(lambda e: ("q/", e, 4), id="another prefix"),
        pytest.param(lambda e: ("p/", e, 5), id="the next revision"),
        pytest.param(lambda e: ("p/", e[1:], 4), id="another first event"),
        pytest.param(lambda e: ("p/", [e[0], e[1], _event(6)], 4), id="another last event"),
        pytest.param(lambda e: ("p/", [e[0], e[1], e[1], e[2]], 4), id="another count"),
        pytest.param(lambda e: ("p/", [_event(3), e[1], _event(5)], 4), id="equal, not the same"),
    ],
)
def test_the_last_answer_is_given_only_for_the_same_events_prefix_and_revision(
    other: Callable[[list[WatchEvent]], tuple[str, list[WatchEvent], int]],
) -> None:
    encode = _Counting()
    cache = BlobCache(encode)
    events = [_event(3), _event(4), _event(5)]
    first = cache.get("p/", events, 4)
    cache._blobs.clear()
    assert cache.get(*other(events)) != first  # encoded again: another answer
    assert encode.calls == 2


def test_the_watchers_one_write_woke_read_the_same_event_objects() -> None:
    """What the last answer relies on: the engine's reader gives every watcher the log's own
    event objects, so the N watchers of a prefix ask the cache with the same first and last."""
    engine = MemoryEngine()
    read = engine.events_reader()
    watchers = [engine.add_watcher("p/", None, owner=None) for _ in range(3)]
    engine.put("p/a", b"x")
    batches = [read(w) for w in watchers]
    assert all(len(b) == 1 and b[0] is batches[0][0] for b in batches)
    encode = _Counting()
    cache = BlobCache(encode)
    blobs = [cache.get("p/", b, engine.revision) for b in batches]
    assert all(blob is blobs[0] for blob in blobs)
    assert encode.calls == 1
