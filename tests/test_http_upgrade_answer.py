"""The client's half of the session's HTTP Upgrade, byte for byte: the request it writes and
the answer it reads, whatever the reads' boundaries (``store/http/_upgrade_answer.py``).

Pinned so that a slip in the reader (a limit off by one, a body cut short or read past, a
refusal's reason lost) fails here rather than as a hung or misreported connection."""

from __future__ import annotations

import json

import pytest

from aioelastic.store.http._upgrade_answer import (
    BODY_LIMIT,
    HEAD_LIMIT,
    Answer,
    AnswerReader,
    HeadError,
    upgrade_request,
)

SWITCHING = (
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: aioelastic-session/1\r\n"
    b"Connection: Upgrade\r\n\r\n"
)


def read(*chunks: bytes) -> tuple[Answer | None, AnswerReader]:
    reader = AnswerReader()
    answer = None
    for chunk in chunks:
        answer = reader.feed(chunk)
    return answer, reader


def test_the_request_is_the_upgrade_with_its_headers_in_order() -> None:
    raw = upgrade_request("/v1/session", "h:1", {"Authorization": "Bearer t", "X-A": "é"})
    assert raw == (
        b"GET /v1/session HTTP/1.1\r\nHost: h:1\r\nConnection: Upgrade\r\n"
        b"Upgrade: aioelastic-session/1\r\nAuthorization: Bearer t\r\nX-A: \xe9\r\n\r\n"
    )
    assert upgrade_request("/p", "h", {}).endswith(b"Upgrade: aioelastic-session/1\r\n\r\n")


@pytest.mark.parametrize(
    ("status", "upgrade", "upgraded"),
    [
        (101, "aioelastic-session/1", True),
        (101, "AIOELASTIC-Session/1", True),
        (101, "websocket", False),
        (101, "", False),
        (200, "aioelastic-session/1", False),
    ],
)
def test_upgraded_is_a_101_to_the_session_transport(
    status: int, upgrade: str, upgraded: bool
) -> None:
    headers = {"upgrade": upgrade} if upgrade else {}
    assert Answer(status, "", headers).upgraded is upgraded


def test_a_json_error_gives_its_code_and_message() -> None:
    body = json.dumps({"error": "unauthorized", "message": "m" * 600}).encode()
    assert Answer(401, "Unauthorized", {}, body).error() == ("unauthorized", "m" * 500)
    no_message = json.dumps({"error": "gone"}).encode()
    assert Answer(404, "Not Found", {}, no_message).error() == ("gone", "")
    number = json.dumps({"error": "x", "message": 7}).encode()
    assert Answer(400, "", {}, number).error() == ("x", "7")


def test_a_body_that_is_not_the_json_error_is_its_text_on_one_line() -> None:
    not_ours = json.dumps({"error": 3}).encode()
    assert Answer(502, "Bad Gateway", {}, not_ours).error() == (None, '{"error": 3}')
    listed = json.dumps(["error"]).encode()
    assert Answer(502, "", {}, listed).error() == (None, '["error"]')
    text = b"  proxy\n\n  says\tno  " + b"x" * 400
    code, message = Answer(502, "Bad Gateway", {}, text).error()
    assert code is None
    assert message == ("proxy says no " + "x" * 400)[:300]
    assert Answer(502, "", {}, b"\xff oops").error() == (None, "\ufffd oops")


def test_an_empty_body_gives_the_reason_or_says_none_was_given() -> None:
    assert Answer(503, "Service Unavailable", {}).error() == (None, "Service Unavailable")
    assert Answer(503, "", {}, b" \r\n ").error() == (None, "no reason given")


def test_a_101_in_pieces_is_read_and_the_session_bytes_after_it_kept() -> None:
    reader = AnswerReader()
    assert reader.feed(SWITCHING[:10]) is None
    assert reader.feed(SWITCHING[10:-2]) is None
    answer = reader.feed(SWITCHING[-2:] + b"\x00\x00\x00\x01z")
    assert answer is not None
    assert answer.upgraded
    assert answer.status == 101
    assert answer.reason == "Switching Protocols"
    assert answer.headers == {"upgrade": "aioelastic-session/1", "connection": "Upgrade"}
    assert answer.body == b""
    assert reader.rest == b"\x00\x00\x00\x01z"


def test_a_refusal_is_read_to_its_content_length_across_reads() -> None:
    head = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 10\r\n\r\n"
    reader = AnswerReader()
    assert reader.feed(head + b"01234") is None
    assert reader.feed(b"5678") is None
    answer = reader.feed(b"9tail")
    assert answer is not None
    assert (answer.status, answer.body, reader.rest) == (401, b"0123456789", b"tail")


def test_a_refusal_without_a_length_is_read_to_the_end_or_the_limit() -> None:
    head = b"HTTP/1.0 502 Bad Gateway\r\n\r\n"
    answer, reader = read(head + b"x" * (BODY_LIMIT - 1))
    assert answer is None
    answer = reader.feed(b"yz")
    assert answer is not None
    assert answer.body == b"x" * (BODY_LIMIT - 1) + b"y"
    assert reader.rest == b"z"
    answer, reader = read(head + b"partial")
    assert answer is None
    ended = reader.eof()
    assert (ended.status, ended.reason, ended.body) == (502, "Bad Gateway", b"partial")


def test_a_long_content_length_reads_at_most_the_limit() -> None:
    head = f"HTTP/1.1 400 Bad Request\r\nContent-Length: {BODY_LIMIT + 5}\r\n\r\n".encode()
    answer, reader = read(head + b"a" * BODY_LIMIT + b"b")
    assert answer is not None
    assert answer.body == b"a" * BODY_LIMIT
    assert reader.rest == b"b"


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\n",
        b"HTTP/1.1 199 Odd\r\nContent-Length: 5\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
        b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n",
    ],
)
def test_answers_without_a_body_to_read_end_at_their_head(head: bytes) -> None:
    answer, reader = read(head + b"after")
    assert answer is not None
    assert answer.body == b""
    assert reader.rest == b"after"


def test_answers_from_200_on_read_their_body() -> None:
    answer, reader = read(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokmore")
    assert answer is not None
    assert answer.body == b"ok"
    assert reader.rest == b"more"
    answer, _ = read(b"HTTP/1.1 205 Reset\r\nContent-Length: 1\r\n\r\n")
    assert answer is None  # (waits for its one byte)


def test_a_content_length_that_is_not_a_number_is_a_head_error() -> None:
    with pytest.raises(HeadError, match=r"a malformed Content-Length in the answer: '1e3'"):
        read(b"HTTP/1.1 400 Bad\r\nContent-Length: 1e3\r\n\r\n")
    with pytest.raises(HeadError, match="Content-Length"):
        read(b"HTTP/1.1 400 Bad\r\nContent-Length: -1\r\n\r\n")


def test_a_head_up_to_the_limit_is_read_and_one_over_it_is_refused() -> None:
    line = b"HTTP/1.1 101 Switching Protocols\r\nX: "
    filler = b"a" * (HEAD_LIMIT - len(line))
    answer, _ = read(line + filler + b"\r\n\r\n")  # the blank line starts at HEAD_LIMIT
    assert answer is not None
    assert answer.headers["x"] == filler.decode()
    with pytest.raises(HeadError, match=f"an answer head over {HEAD_LIMIT} bytes"):
        read(line + filler + b"a\r\n\r\n")
    answer, reader = read(line + filler)  # no end yet, at the limit: keep reading
    assert answer is None
    with pytest.raises(HeadError, match=f"over {HEAD_LIMIT} bytes"):
        reader.feed(b"a")


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b"HTTP/2 101 Switching\r\n\r\n", "not an HTTP/1.1 answer: 'HTTP/2 101 Switching'"),
        (b"HTTP/1.1 99 Low\r\n\r\n", "not an HTTP/1.1 answer"),
        (b"HTTP/1.1 600 High\r\n\r\n", "not an HTTP/1.1 answer"),
        (b"HTTP/1.1 101 X\r\nno colon here\r\n\r\n", "a malformed header line in the answer: "
         "'no colon here'"),
        (b"HTTP/1.1 101 X\r\n: empty name\r\n\r\n", "a malformed header line"),
        (b"HTTP/1.1 101 X\r\nbad name: v\r\n\r\n", "a malformed header line"),
    ],
)  # fmt: skip
def test_a_head_that_is_not_http_is_refused_saying_why(raw: bytes, said: str) -> None:
    with pytest.raises(HeadError) as caught:
        read(raw)
    assert said in str(caught.value)


def test_header_names_are_lower_case_values_trimmed_and_repeats_joined() -> None:
    answer, _ = read(
        b"HTTP/1.1 101\r\nUpgrade:  aioelastic-session/1 \r\nVia: a\r\n via :b\r\n\r\n"
    )
    assert answer is not None
    assert answer.reason == ""
    assert answer.upgraded
    assert answer.headers == {"upgrade": "aioelastic-session/1", "via": "a, b"}


def test_the_end_of_the_connection_before_or_inside_the_head_is_a_head_error() -> None:
    with pytest.raises(HeadError, match=r"^the connection ended before an answer$"):
        AnswerReader().eof()
    _, reader = read(b"HTTP/1.1 40")
    with pytest.raises(HeadError, match=r"^the connection ended inside the answer's head$"):
        reader.eof()


def test_the_end_of_the_connection_keeps_at_most_the_limit_of_body() -> None:
    head = b"HTTP/1.1 413 Too Large\r\nContent-Length: 9\r\n\r\n"
    _, reader = read(head + b"1234")
    ended = reader.eof()
    assert (ended.status, ended.reason, ended.body) == (413, "Too Large", b"1234")
    assert ended.headers == {"content-length": "9"}


def test_a_body_of_exactly_the_limit_without_a_length_is_the_answer() -> None:
    answer, reader = read(b"HTTP/1.1 502 Bad Gateway\r\n\r\n" + b"x" * BODY_LIMIT)
    assert answer is not None
    assert answer.body == b"x" * BODY_LIMIT
    assert reader.rest == b""


def test_an_empty_head_is_not_an_answer() -> None:
    with pytest.raises(HeadError, match=r"^not an HTTP/1\.1 answer: ''$"):
        read(b"\r\n\r\nHTTP/1.1 101 X\r\n\r\n")


def test_what_a_refused_head_quotes_is_cut_short() -> None:
    with pytest.raises(HeadError) as caught:
        read(b"HTTP/1.1 400 Bad\r\nContent-Length: " + b"9x" * 40 + b"\r\n\r\n")
    assert str(caught.value) == f"a malformed Content-Length in the answer: {'9x' * 25!r}"
    with pytest.raises(HeadError) as caught:
        read(b"ICY " + b"s" * 200 + b"\r\n\r\n")
    assert str(caught.value) == f"not an HTTP/1.1 answer: {'ICY ' + 's' * 96!r}"
    with pytest.raises(HeadError) as caught:
        read(b"HTTP/1.1 101 X\r\n" + b"h" * 200 + b"\r\n\r\n")
    assert str(caught.value) == f"a malformed header line in the answer: {'h' * 100!r}"
