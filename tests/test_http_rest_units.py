"""The REST routes' building blocks, unit by unit: the request parsing (``_parsing``: integers,
JSON fields, ETags, refused codings, the JSON body), the JSON answers (``_encoding``) and the
error answers (``_errors``), each limit at its edge and each message word for word (a client
reads them). The routes on a real server: ``tests/test_http_server.py``."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from multidict import CIMultiDict

from aioelastic.store import EventType, KeyValue, WatchEvent
from aioelastic.store.http._encoding import (
    NDJSON,
    event_json,
    events_lines,
    frame,
    json_response,
    kv_json,
    precondition_failed,
    written,
)
from aioelastic.store.http._errors import ApiError, bad, error_response
from aioelastic.store.http._limits import MAX_JSON_BODY_BYTES
from aioelastic.store.http._parsing import (
    etag_revision,
    int_param,
    json_int,
    json_number,
    parse_int,
    read_json_body,
    refuse_codings,
)


def _refused(call: Any, *args: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args)
    return caught.value


def _request(path: str = "/", **headers: str) -> web.Request:
    return make_mocked_request("GET", path, headers=CIMultiDict(headers))


# -- integers -------------------------------------------------------------------------------------


def test_an_integer_parameter_is_read_stripped_or_defaulted() -> None:
    assert int_param(_request("/?limit=%2012%20"), "limit", minimum=1) == 12
    assert int_param(_request("/"), "limit", minimum=1, default=7) == 7
    assert int_param(_request("/?other=3"), "limit", minimum=1, default=7) == 7
    assert int_param(_request("/?limit=0"), "limit", minimum=0, default=7) == 0


def test_a_required_integer_parameter_says_so() -> None:
    for path in ("/", "/?other=1"):
        error = _refused(lambda p=path: int_param(_request(p), "limit", minimum=1))
        assert (error.status, error.code) == (400, "bad_request")
        assert error.message == "query parameter 'limit' is required (an integer >= 1)"


def test_integers_at_their_edges() -> None:
    assert parse_int("9" * 18, "x", 0) == int("9" * 18)
    assert parse_int(str(2**63 - 1), "x", 0) == 2**63 - 1
    assert parse_int("-5", "x", -5) == -5
    assert parse_int(" 3 ", "x", 3) == 3
    assert (
        _refused(parse_int, str(2**63), "x", 0).message
        == f"x must be an integer in [0, 2**63), got {2**63}"
    )
    assert _refused(parse_int, "4", "x", 5).message == "x must be an integer in [5, 2**63), got 4"
    assert (
        _refused(parse_int, "1" * 20, "x", 0).message
        == f"x must be a decimal integer >= 0, got {'1' * 20!r}"
    )


@pytest.mark.parametrize("raw", ["", "1.0", "0x10", "+1", "1e3", "--1", "1 2", "\u0661"])
def test_what_is_not_a_decimal_integer_is_refused_quoting_it(raw: str) -> None:
    error = _refused(parse_int, raw, "header If-Match", 0)
    assert error.message == f"header If-Match must be a decimal integer >= 0, got {raw.strip()!r}"


def test_a_long_bad_integer_is_quoted_to_40_characters() -> None:
    error = _refused(parse_int, "x" * 100, "y", 0)
    assert error.message == f"y must be a decimal integer >= 0, got {'x' * 40!r}"


def test_json_integers_at_their_edges() -> None:
    assert json_int({"n": 0}, "n", 0) == 0
    assert json_int({"n": 2**63 - 1}, "n", 0) == 2**63 - 1
    assert _refused(json_int, {"n": 2**63}, "n", 0).message == (
        f"field 'n' must be an integer in [0, 2**63), got {2**63}"
    )
    assert _refused(json_int, {"n": 0}, "n", 1).message == (
        "field 'n' must be an integer in [1, 2**63), got 0"
    )
    for value in (True, 1.0, "1", None):
        assert _refused(json_int, {"n": value}, "n", 1).message == (
            f"field 'n' must be an integer >= 1, got {value!r}"
        )
    assert _refused(json_int, {}, "n", 1).message == "field 'n' must be an integer >= 1, got None"
    long = _refused(json_int, {"n": "z" * 500}, "n", 1).message
    assert long == f"field 'n' must be an integer >= 1, got {'z' * 500!r}"[:200]
    assert len(long) == 200


def test_json_numbers_of_seconds_at_their_edges() -> None:
    assert json_number({"ttl": 1e9}, "ttl") == 1e9
    assert json_number({"ttl": 5}, "ttl") == 5.0
    assert isinstance(json_number({"ttl": 5}, "ttl"), float)
    assert json_number({"ttl": 0.001}, "ttl") == 0.001
    for value in (0, -1, 1e9 + 1, math.inf, math.nan):
        assert _refused(json_number, {"ttl": value}, "ttl").message == (
            f"field 'ttl' must be a finite number of seconds in (0, 1e9], got {value!r}"
        )
    for other in (True, "5", None):
        assert _refused(json_number, {"ttl": other}, "ttl").message == (
            f"field 'ttl' must be a number of seconds > 0, got {other!r}"
        )
    assert len(_refused(json_number, {"ttl": "z" * 500}, "ttl").message) == 200


@pytest.mark.parametrize(
    ("raw", "revision"), [('"5"', 5), ("5", 5), ('W/"5"', 5), (' W/"12" ', 12)]
)
def test_an_etag_is_its_revision_quoted_or_not_weak_or_not(raw: str, revision: int) -> None:
    assert etag_revision(raw, "If-Match") == revision


def test_an_etag_loses_one_pair_of_quotes_no_more() -> None:
    assert _refused(etag_revision, '""', "If-Match").message == (
        "header If-Match must be a decimal integer >= 0, got ''"
    )
    assert _refused(etag_revision, '""0""', "If-Match").message == (
        "header If-Match must be a decimal integer >= 0, got '\"0\"'"
    )


@pytest.mark.parametrize("raw", ['"', '"5', '5"', "W/", "W/5x", "w/5"])
def test_an_etag_that_is_no_revision_names_its_header(raw: str) -> None:
    error = _refused(etag_revision, raw, "If-Match")
    assert error.message.startswith("header If-Match must be a decimal integer >= 0, got ")


# -- codings --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Content-Encoding": "identity"},
        {"Content-Encoding": " Identity "},
        {"Transfer-Encoding": "chunked"},
        {"Transfer-Encoding": " Chunked "},
    ],
)
def test_a_plain_or_chunked_body_is_taken(headers: dict[str, str]) -> None:
    refuse_codings(_request(**headers))


def test_a_content_coding_is_a_415_that_asks_for_identity() -> None:
    error = _refused(refuse_codings, _request(**{"Content-Encoding": " GZip "}))
    assert (error.status, error.code) == (415, "unsupported_content_encoding")
    assert error.message == (
        "request bodies are taken as they are (Content-Encoding: identity); 'gzip' is not "
        "accepted: send the body uncompressed"
    )
    assert error.headers == {"Accept-Encoding": "identity"}
    long = _refused(refuse_codings, _request(**{"Content-Encoding": "x" * 100}))
    assert f"{'x' * 40!r} is not accepted" in long.message


def test_a_transfer_coding_besides_chunked_is_a_415() -> None:
    error = _refused(refuse_codings, _request(**{"Transfer-Encoding": "gzip, chunked"}))
    assert (error.status, error.code) == (415, "unsupported_transfer_encoding")
    assert error.message == "the only transfer coding accepted is chunked, got 'gzip, chunked'"
    assert error.headers is None
    long = _refused(refuse_codings, _request(**{"Transfer-Encoding": "y" * 100}))
    assert long.message.endswith(f"got {'y' * 40!r}")


# -- the JSON body, over a real server ------------------------------------------------------------


@pytest_asyncio.fixture
async def body_client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async def echo(request: web.Request) -> web.Response:
        try:
            return web.json_response({"body": await read_json_body(request)})
        except ApiError as exc:
            return exc.response()

    app = web.Application()
    app.router.add_post("/", echo)
    async with TestClient(TestServer(app)) as client:
        yield client


async def _post(client: TestClient[Any, Any], data: bytes, **headers: str) -> tuple[int, Any]:
    async with client.post("/", data=data, headers=headers) as response:
        return response.status, await response.json()


@pytest.mark.asyncio
async def test_a_json_body_of_the_largest_size_is_read(body_client: TestClient[Any, Any]) -> None:
    head = b'{"a":"'
    data = head + b"x" * (MAX_JSON_BODY_BYTES - len(head) - 2) + b'"}'
    assert len(data) == MAX_JSON_BODY_BYTES
    status, answer = await _post(body_client, data)
    assert status == 200
    assert len(answer["body"]["a"]) == MAX_JSON_BODY_BYTES - len(head) - 2
    assert await _post(body_client, b"") == (200, {"body": {}})
    assert await _post(body_client, b'{"n": 1}') == (200, {"body": {"n": 1}})


@pytest.mark.asyncio
async def test_a_json_body_one_byte_too_large_is_a_413_by_length_or_by_reading(
    body_client: TestClient[Any, Any],
) -> None:
    data = b"{" + b" " * (MAX_JSON_BODY_BYTES - 1) + b"}"
    assert len(data) == MAX_JSON_BODY_BYTES + 1
    expected = {
        "error": "body_too_large",
        "message": f"JSON body too large: at most {MAX_JSON_BODY_BYTES} bytes",
    }
    assert await _post(body_client, data) == (413, expected)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: found by reading
        yield data[:1000]
        yield data[1000:]

    async with body_client.post("/", data=chunks()) as response:
        assert response.status == 413
        assert await response.json() == expected


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{", "the request body is not valid JSON"),
        (b"\xff", "the request body is not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "the request body is not valid JSON"),
        (b"[1]", "the request body must be a JSON object, got list"),
        (b'"s"', "the request body must be a JSON object, got str"),
        (b"null", "the request body must be a JSON object, got NoneType"),
    ],
)
async def test_a_body_that_is_no_json_object_is_a_400_that_says_which(
    body_client: TestClient[Any, Any], data: bytes, message: str
) -> None:
    if len(data) > MAX_JSON_BODY_BYTES:  # (the nesting needs room: a smaller one)
        data = b"[" * (MAX_JSON_BODY_BYTES // 2) + b"]" * (MAX_JSON_BODY_BYTES // 2)
    assert await _post(body_client, data) == (400, {"error": "bad_request", "message": message})


# -- errors ---------------------------------------------------------------------------------------


def _body(response: web.Response) -> Any:
    assert isinstance(response.body, bytes)
    return json.loads(response.body)


def test_an_error_answer_is_its_code_message_and_extra_fields_as_json() -> None:
    response = error_response(409, "conflict", "no", {"X-A": "1"}, revision=4)
    assert response.status == 409
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["X-A"] == "1"
    assert _body(response) == {"error": "conflict", "message": "no", "revision": 4}
    assert response.body == b'{"error":"conflict","message":"no","revision":4}'


def test_bad_is_a_400_bad_request() -> None:
    error = bad("why")
    assert (error.status, error.code, error.message, str(error)) == (
        400,
        "bad_request",
        "why",
        "why",
    )
    assert error.headers is None
    assert error.extra == {}


def test_an_api_errors_answer_carries_its_headers_and_extra_fields() -> None:
    response = ApiError(429, "slow_down", "later", headers={"Retry-After": "1"}, n=2).response()
    assert response.status == 429
    assert response.headers["Retry-After"] == "1"
    assert _body(response) == {"error": "slow_down", "message": "later", "n": 2}
    assert response.keep_alive is None  # (aiohttp decides: the connection is kept)


def test_a_401_asks_for_a_bearer_token_whatever_headers_it_had() -> None:
    response = ApiError(401, "unauthorized", "token?", headers={"X-B": "2"}).response()
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="aioelastic"'
    assert "X-B" not in response.headers


@pytest.mark.parametrize("status", [415, 417])
def test_a_refused_body_ends_the_connection(status: int) -> None:
    assert ApiError(status, "no", "no").response().keep_alive is False


# -- the JSON answers -----------------------------------------------------------------------------


KV = KeyValue("k/é", b"\x00\xffv", 3, 5, 2, 7)


def test_a_key_value_as_json_field_by_field() -> None:
    assert kv_json(KV) == {
        "key": "k/é",
        "create_revision": 3,
        "mod_revision": 5,
        "version": 2,
        "lease": 7,
        "value_b64": "AP92",
    }
    assert list(kv_json(KV)) == [
        "key",
        "create_revision",
        "mod_revision",
        "version",
        "lease",
        "value_b64",
    ]
    assert "value_b64" not in kv_json(KV, value=False)
    assert event_json(WatchEvent(EventType.DELETE, KV)) == {"type": "DELETE", **kv_json(KV)}


def test_a_written_answer_is_the_encoders_bytes_and_the_etag() -> None:
    response = written(9, KV)
    assert response.body == json_response({"revision": 9, "kv": kv_json(KV, value=False)}).body
    assert response.headers["ETag"] == '"9"'
    assert response.headers["Content-Type"] == "application/json"
    assert response.status == 200


def test_a_json_response_is_compact_with_its_headers_added() -> None:
    response = json_response({"a": [1, "é"]}, 201, {"X-C": "3", "Content-Type": "text/x"})
    assert response.status == 201
    assert response.body == b'{"a":[1,"\\u00e9"]}'
    assert response.headers["X-C"] == "3"
    assert response.headers["Content-Type"] == "text/x"
    assert json_response({}).status == 200
    assert json_response({}).headers["Content-Type"] == "application/json"
    assert frame({"b": 1}) == b'{"b":1}\n'
    assert NDJSON == "application/x-ndjson"


def test_events_are_one_line_per_revision_in_order() -> None:
    def put(key: str, revision: int) -> WatchEvent:
        return WatchEvent(EventType.PUT, KeyValue(key, b"", revision, revision, 1, 0))

    events = [put("a", 4), put("b", 4), put("c", 6), put("d", 7), put("e", 7)]
    lines = [json.loads(line) for line in events_lines(events).splitlines()]
    assert [(line["type"], line["revision"]) for line in lines] == [
        ("events", 4),
        ("events", 6),
        ("events", 7),
    ]
    assert [[e["key"] for e in line["events"]] for line in lines] == [["a", "b"], ["c"], ["d", "e"]]
    assert lines[0]["events"][0] == event_json(events[0])
    assert events_lines(events[:1]).count(b"\n") == 1


def test_a_failed_compare_says_what_it_found() -> None:
    absent = precondition_failed("k" * 300, 8, None)
    assert absent.status == 412
    assert _body(absent) == {
        "error": "precondition_failed",
        "message": f"compare failed for {'k' * 200!r}: it is absent",
        "revision": 8,
        "kv": None,
    }
    found = precondition_failed("k/é", 8, KV)
    assert _body(found) == {
        "error": "precondition_failed",
        "message": "compare failed for 'k/é': its mod_revision is 5",
        "revision": 8,
        "kv": kv_json(KV),
    }
