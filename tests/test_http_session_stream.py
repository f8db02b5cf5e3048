"""The session transport's message framing (``_session_stream``): any cut of the byte stream
gives the same messages; a bad length is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.store.http._frames import FrameError
from aioelastic.store.http._session_stream import (
    HEADER_BYTES,
    MessageLengthError,
    MessageReader,
    message_header,
)


def _stream(bodies: list[bytes]) -> bytes:
    return b"".join(message_header(len(b)) + b for b in bodies)


@given(
    bodies=st.lists(st.binary(min_size=1, max_size=300), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=20),
)
def test_any_cut_of_the_stream_gives_the_same_messages(
    bodies: list[bytes], cuts: list[int]
) -> None:
    data = _stream(bodies)
    reader = MessageReader(max_message=300)
    got: list[bytes] = []
    at = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        got += reader.feed(data[at:cut])
        at = cut
    assert got == bodies
    assert reader.pending == 0


def test_a_partial_message_is_kept_until_it_is_whole() -> None:
    reader = MessageReader(max_message=1000)
    data = _stream([b"a" * 600, b"bc"])
    assert reader.feed(data[:2]) == []
    assert reader.feed(data[2:300]) == []
    assert reader.pending == 300
    assert reader.feed(data[300:605]) == [b"a" * 600]
    assert reader.pending == 1
    assert reader.feed(data[605:]) == [b"bc"]


@pytest.mark.parametrize("length", [0, 101, 2**32 - 1])
def test_a_length_out_of_bounds_is_refused_with_its_figures(length: int) -> None:
    reader = MessageReader(max_message=100)
    expected = f"a message of {length} bytes \\(the limit is 1 to 100\\)"
    with pytest.raises(FrameError, match=expected):
        reader.feed(length.to_bytes(HEADER_BYTES, "big") + b"x")


def test_the_messages_before_a_bad_length_come_with_the_error() -> None:
    reader = MessageReader(max_message=100)
    with pytest.raises(MessageLengthError) as raised:
        reader.feed(_stream([b"ok", b"fine"]) + (0).to_bytes(HEADER_BYTES, "big"))
    assert isinstance(raised.value, FrameError)  # what a caller that only knows frames catches
    assert raised.value.messages == [b"ok", b"fine"]  # to answer before closing: nothing lost


def test_max_message_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_message must be >= 1, got 0"):
        MessageReader(0)


@given(bodies=st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=3))
def test_whole_is_the_one_message_a_read_is_or_none(bodies: list[bytes]) -> None:
    data = _stream(bodies)
    reader = MessageReader(max_message=40)
    whole = reader.whole(data)
    if len(bodies) == 1:
        assert whole is not None
        assert bytes(whole) == bodies[0]
    else:
        assert whole is None
        assert reader.feed(data) == bodies  # whole() took nothing: feed still has it all


def test_whole_leaves_a_buffered_stream_a_bad_length_and_a_short_read_to_feed() -> None:
    reader = MessageReader(max_message=4)
    assert reader.whole(message_header(5) + b"12345") is None  # over the bound: feed refuses
    assert reader.whole(message_header(0)) is None
    assert reader.whole(b"\0\0") is None
    assert reader.feed(message_header(3) + b"a") == []
    assert reader.whole(message_header(1) + b"b") is None  # the read continues a message
    assert reader.feed(b"bc") == [b"abc"]


def test_a_message_of_exactly_the_limit_is_cut_and_taken_whole() -> None:
    body = bytes(range(50))
    reader = MessageReader(max_message=50)
    whole = reader.whole(message_header(50) + body)
    assert whole is not None
    assert bytes(whole) == body
    raw = message_header(50) + body
    assert reader.feed(raw[:10]) == []
    assert reader.feed(raw[10:]) == [body]
    assert reader.feed(raw + raw[:3]) == [body]  # (a message, then the start of a header)
    assert reader.pending == 3
    assert reader.feed(raw[3:]) == [body]
    assert reader.pending == 0


def test_a_reader_of_one_byte_messages_reads_them() -> None:
    reader = MessageReader(max_message=1)
    assert reader.feed(message_header(1) + b"a" + message_header(1) + b"b") == [b"a", b"b"]
    with pytest.raises(MessageLengthError):
        reader.feed(message_header(2) + b"ab")
