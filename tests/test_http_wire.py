"""The HTTP client's own HTTP/1.1 reading (aioelastic.store.http._wire), property-tested: however
the bytes of an answer are cut into reads, the same status, headers, body lines and end come out;
malformed framing is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.store.http import _wire


class _Transport:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


def _stream() -> tuple[_wire.LineStream, _Transport]:
    stream = _wire.LineStream(max_line=10_000)
    transport = _Transport()
    stream.transport = transport  # type: ignore[assignment]
    return stream, transport


def _feed(stream: _wire.LineStream, data: bytes, cuts: list[int]) -> None:
    last = 0
    for cut in [*sorted({min(c, len(data)) for c in cuts}), len(data)]:
        stream.data_received(data[last:cut])
        last = cut


_LINES = st.lists(st.binary(max_size=300).map(lambda b: b.replace(b"\n", b" ")), max_size=8)


@given(
    lines=_LINES,
    chunk_sizes=st.lists(st.integers(1, 200), min_size=1),
    cuts=st.lists(st.integers(0, 5000)),
)
def test_chunked_lines_survive_any_cutting(
    lines: list[bytes], chunk_sizes: list[int], cuts: list[int]
) -> None:
    body = b"".join(line + b"\n" for line in lines)
    chunks = []
    pos = 0
    i = 0
    while pos < len(body):
        size = chunk_sizes[i % len(chunk_sizes)]
        part = body[pos : pos + size]
        chunks.append(b"%x%s\r\n%s\r\n" % (len(part), b";x=1" if i % 3 == 2 else b"", part))
        pos += size
        i += 1
    data = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(chunks) + b"0\r\n\r\n"
    )
    stream, transport = _stream()
    _feed(stream, data, cuts)
    assert stream.status == 200
    assert stream.headers["content-type"] == "application/x-ndjson"
    assert list(stream._lines) == lines
    assert stream._eof
    assert not transport.aborted


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY",
        b"FTP/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    ],
)
def test_malformed_streams_end_with_connection_lost(data: bytes) -> None:
    stream, transport = _stream()
    stream.data_received(data)
    assert isinstance(stream._ended, _wire.ConnectionLost)
    assert transport.aborted


def test_an_error_answer_is_read_whole() -> None:
    stream, _ = _stream()
    body = b'{"error":"compacted"}'
    stream.data_received(
        b"HTTP/1.1 410 Gone\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body[:5])
    )
    assert not stream.error_body
    stream.data_received(body[5:])
    assert stream.status == 410
    assert stream.error_body == body


def test_a_line_too_long_is_refused() -> None:
    stream = _wire.LineStream(max_line=10)
    transport = _Transport()
    stream.transport = transport  # type: ignore[assignment]
    stream.data_received(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n" + b"x" * 16 + b"\r\n"
    )
    assert isinstance(stream._ended, _wire.ConnectionLost)
