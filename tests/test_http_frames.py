"""The session frames' records made from their slots (``new_kv``, ``new_event``): the same
frozen records as their dataclasses' own constructors make, field for field."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.store._types import EventType, KeyValue, WatchEvent
from aioelastic.store.http._frames import (
    RESULT,
    FrameError,
    decode_events,
    encode_events,
    kv_from_wire,
    kv_to_wire,
    pack,
    slot_setters,
    unpack_all,
)

ints = st.integers(min_value=0, max_value=2**63 - 1)
kvs = st.builds(KeyValue, st.text(min_size=1), st.binary(), ints, ints, ints, ints)


@given(kv=kvs)
def test_a_kv_from_the_wire_is_the_kv_its_constructor_makes(kv: KeyValue) -> None:
    made = kv_from_wire(kv_to_wire(kv))
    assert type(made) is KeyValue
    assert dataclasses.astuple(made) == dataclasses.astuple(kv)
    assert made == kv
    assert hash(made) == hash(kv)
    assert repr(made) == repr(kv)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.key = "other"  # type: ignore[misc]


@given(events=st.lists(st.builds(WatchEvent, st.sampled_from(EventType), kvs), max_size=5))
def test_events_decoded_are_the_events_encoded(events: list[WatchEvent]) -> None:
    decoded = decode_events(encode_events(events))
    assert decoded == events
    assert [type(e) for e in decoded] == [WatchEvent] * len(events)
    assert [hash(e) for e in decoded] == [hash(e) for e in events]


def test_a_field_the_fast_path_does_not_know_stops_the_import() -> None:
    @dataclass(frozen=True, slots=True)
    class Grown:
        key: str
        added: int

    with pytest.raises(AssertionError, match=r"Grown's fields are \('key', 'added'\)"):
        slot_setters(Grown, ("key",))


@pytest.mark.parametrize("count", [1, 2, 5, 6, 12])
def test_every_frame_of_a_message_comes_out_in_order(count: int) -> None:
    """The first frames one call each, the rest through an Unpacker: all of them, in order."""
    frames = [[RESULT, i, "x" * i] for i in range(count)]
    message = b"".join(pack(frame) for frame in frames)
    assert list(unpack_all(message, max_len=1 << 20)) == frames


@pytest.mark.parametrize("whole", [1, 3, 7])
def test_a_message_that_ends_inside_a_frame_says_so_after_the_frames_before(whole: int) -> None:
    message = b"".join(pack([RESULT, i, None]) for i in range(whole)) + pack([RESULT, 9, "y"])[:-1]
    frames = unpack_all(message, max_len=1 << 20)
    got = [next(frames)[1] for _ in range(whole)]
    assert got == list(range(whole))
    with pytest.raises(FrameError, match="ends inside a frame"):
        next(frames)
