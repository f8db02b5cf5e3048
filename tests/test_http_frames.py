"""The session frames' records made from their slots (``new_kv``, ``new_event``): the same
frozen records as their dataclasses' own constructors make, field for field."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.store._types import EventType, KeyValue, LeaseStatus, WatchEvent
from aioelastic.store.http._frames import (
    RESULT,
    FrameError,
    decode_events,
    encode_events,
    kv_from_wire,
    kv_to_wire,
    lease_status_from_wire,
    lease_status_to_wire,
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


# -- the limits of a frame, wherever it is in its message: the first (one call), the next four
# (one call each) and the rest (an Unpacker): the same limits and the same words everywhere

LIMIT = 64
POSITIONS = [0, 2, 5]  # frames before it: the first, among the next four, an Unpacker's


def _at(position: int, frame: Any) -> list[list[Any]]:
    """Every frame of a message whose frame number ``position`` is ``frame``."""
    before = b"".join(pack([RESULT, i, None]) for i in range(position))
    return list(unpack_all(before + pack(frame), max_len=LIMIT))


@pytest.mark.parametrize("position", POSITIONS)
def test_a_frame_at_every_limit_is_read(position: int) -> None:
    frames: list[list[Any]] = [
        [RESULT, 1, "s" * LIMIT],
        [RESULT, 1, b"b" * LIMIT],
        [RESULT, 1, {f"k{i}": i for i in range(10_000)}],
        [RESULT, 1, "é"],  # text stays text (raw=False)
    ]
    for frame in frames:
        assert _at(position, frame)[-1] == frame
    many = _at(position, [RESULT, 1, [0] * 1_000_000])
    assert len(many[-1][2]) == 1_000_000


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize(
    ("frame", "said"),
    [
        ([RESULT, 1, "s" * (LIMIT + 1)], "65 exceeds max_str_len(64)"),
        ([RESULT, 1, b"b" * (LIMIT + 1)], "65 exceeds max_bin_len(64)"),
        ([RESULT, 1, {f"k{i}": i for i in range(10_001)}], "10001 exceeds max_map_len(10000)"),
        ([RESULT, 1, [0] * 1_000_001], "1000001 exceeds max_array_len(1000000)"),
        ([RESULT, 1, {1: 2}], "int is not allowed for map key when strict_map_key=True"),
        ([RESULT, 1, msgpack.ExtType(1, b"xy")], "exceeds max_ext_len(0)"),
    ],
    ids=["str", "bin", "map", "array", "int-key", "ext"],
)
def test_a_frame_over_a_limit_is_refused_saying_which(
    position: int, frame: list[Any], said: str
) -> None:
    with pytest.raises(FrameError) as refused:
        _at(position, frame)
    assert str(refused.value).startswith("the message is not valid msgpack: ")
    assert str(refused.value).endswith(said)


@pytest.mark.parametrize("position", POSITIONS)
def test_bytes_that_are_not_msgpack_are_named_by_their_error(position: int) -> None:
    before = b"".join(pack([RESULT, i, None]) for i in range(position))
    with pytest.raises(FrameError) as refused:
        list(unpack_all(before + b"\xc1", max_len=LIMIT))
    assert str(refused.value) == "the message is not valid msgpack: FormatError"


@pytest.mark.parametrize("position", [1, 5])
def test_one_byte_of_a_frame_at_the_end_is_a_message_that_ends_inside_a_frame(
    position: int,
) -> None:
    before = b"".join(pack([RESULT, i, None]) for i in range(position))
    frames = unpack_all(before + b"\x93", max_len=LIMIT)
    assert [next(frames) for _ in range(position)] == [[RESULT, i, None] for i in range(position)]
    with pytest.raises(FrameError) as refused:
        next(frames)
    assert str(refused.value) == "the message is not valid msgpack: it ends inside a frame"


def test_a_lease_status_goes_through_the_wire_and_back() -> None:
    status = LeaseStatus(7, 10.0, 3.5, ("a", "b"))
    assert lease_status_to_wire(status) == [7, 10.0, 3.5, ["a", "b"]]
    back = lease_status_from_wire([7, 10, 3, ["a", "b"]])  # (msgpack may carry whole floats)
    assert back == LeaseStatus(7, 10.0, 3.0, ("a", "b"))
    assert type(back.granted_ttl) is float
    assert type(back.remaining) is float
    assert type(back.keys) is tuple


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize(("frame", "kind"), [(5, "int"), ([], "list"), ({"a": 1}, "dict")])
def test_a_frame_that_is_not_a_non_empty_array_is_refused(
    position: int, frame: Any, kind: str
) -> None:
    before = b"".join(pack([RESULT, i, None]) for i in range(position))
    with pytest.raises(FrameError) as refused:
        list(unpack_all(before + msgpack.packb(frame), max_len=LIMIT))
    assert str(refused.value) == f"a frame must be a non-empty array, got {kind}"
