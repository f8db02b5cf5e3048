"""The data directory's encoding (``store/http/_persist_codec``) and the wording of its damage
report (``_persist_load``), exactly: a checksummed line, what a damaged one is called, events
and snapshots both ways, and the ranges a report names. Pure functions; the files themselves
are tests/test_http_persist.py's."""

from __future__ import annotations

import binascii
import zlib

import pytest

from aioelastic.store import EventType, KeyValue, WatchEvent
from aioelastic.store.http._persist_codec import (
    decode_line,
    encode_line,
    event_in,
    event_out,
    kv_in,
    snapshot_document,
    snapshot_state,
)
from aioelastic.store.http._persist_load import _lines, _noun, _ranges
from aioelastic.store.memory import EngineState


def _line(body: bytes) -> bytes:
    return b"%08x %s" % (zlib.crc32(body), body)


def test_a_line_is_its_checksum_a_space_and_compact_json_kept_in_utf8() -> None:
    line = encode_line({"k": "é", "n": [1, 2]})
    body = '{"k":"é","n":[1,2]}'.encode()
    assert line == b"%08x %s\n" % (zlib.crc32(body), body)
    assert decode_line(line[:-1]) == {"k": "é", "n": [1, 2]}


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"", "not a checksummed line"),
        (b"00000000 ", "not a checksummed line"),  # 9 bytes: no body
        (b"0000000000{}", "not a checksummed line"),  # no space after the checksum
        (b"zzzzzzzz {}", "not a checksummed line"),  # not hexadecimal
        (b"00000000 {}", "bad checksum"),
        (_line(b"1"), "not a JSON object"),  # 10 bytes, the shortest line: a JSON number
        (_line(b"[]"), "not a JSON object"),
        (_line(b"{oops"), "not JSON"),  # a good checksum of something else
    ],
)
def test_a_damaged_line_is_named_for_what_is_wrong_with_it(line: bytes, why: str) -> None:
    assert decode_line(line) == why


def test_the_shortest_line_that_holds_an_object_decodes() -> None:
    assert decode_line(_line(b"{}")) == {}


def test_events_go_out_and_come_back_as_they_were() -> None:
    put = WatchEvent(EventType.PUT, KeyValue("k", b"\x00v", 3, 7, 2, 9))
    gone = WatchEvent(EventType.DELETE, KeyValue("k", b"", 0, 8, 0, 0))
    assert event_out(put) == ["P", "k", "AHY=", 3, 7, 2, 9]
    assert event_out(gone) == ["D", "k", 8]
    assert event_in(event_out(put)) == put
    assert event_in(event_out(gone)) == gone


def test_an_event_of_another_kind_or_a_value_not_in_base64_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"^unknown event type 'X'$"):
        event_in(["X", "k", 8])
    with pytest.raises(binascii.Error):  # not skipped over: a value is taken exactly or not
        kv_in(["k", "YQ$=", 1, 1, 1, 0])


def test_a_snapshot_document_holds_the_whole_state_and_gives_it_back() -> None:
    state = EngineState(
        revision=9,
        compact_revision=4,
        kvs=(KeyValue("a", b"1", 2, 9, 3, 7), KeyValue("b", b"", 5, 5, 1, 0)),
        history=(
            WatchEvent(EventType.PUT, KeyValue("a", b"1", 2, 9, 3, 7)),
            WatchEvent(EventType.DELETE, KeyValue("c", b"", 0, 8, 0, 0)),
        ),
        leases={7: 5.0},
        last_lease_id=7,
    )
    document = snapshot_document(state, 12)
    assert (document["format"], document["q"]) == (2, 12)
    assert snapshot_state(document) == (state, 12)


def test_a_report_names_runs_of_numbers_as_ranges_and_at_most_five_of_them() -> None:
    assert _ranges([]) == ""
    assert _ranges([4]) == "4"
    assert _ranges([1, 2, 3, 7]) == "1-3, 7"
    assert _ranges([1, 2, 4, 5, 7]) == "1-2, 4-5, 7"
    assert _ranges([1, 3, 5, 7, 9]) == "1, 3, 5, 7, 9"
    assert _ranges([1, 3, 5, 7, 9, 11]) == "1, 3, 5, 7, 9 and 1 more range"
    assert _ranges([1, 3, 5, 7, 9, 11, 12, 20]) == "1, 3, 5, 7, 9 and 2 more ranges"
    assert (_lines(1), _lines(2), _noun(1), _noun(3)) == (
        "1 damaged line",
        "2 damaged lines",
        "record",
        "records",
    )
