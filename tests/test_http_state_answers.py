"""The server's answers to requests that fail (``_state.ServerState``), word for word: the JSON
body of each error the engine, the data directory or the client cause; aiohttp's own refusals
(no route, a method not allowed, a body too large); the token's two refusals; ``Expect:
100-continue`` refused before the body (and its metrics); a connection over the limit. Real
servers on 127.0.0.1 for what a client sees; the error mapping itself directly, with the
exceptions the engine and the data directory raise."""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from helpers.http import server_state
from helpers.waiting import eventually

from aioelastic.errors import CompactedError, LeaseNotFoundError, StoreClosedError
from aioelastic.store.http._errors import RequestReadTimeout
from aioelastic.store.http._limits import MAX_JSON_BODY_BYTES
from aioelastic.store.http._persist import LogWriteError
from aioelastic.store.http.server import HttpStoreServer

TOKEN = "t0ken"


def _body(response: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(response.body)
    return body


# -- the error mapping ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "status", "body"),
    [
        (
            CompactedError(5, 9),
            410,
            {"error": "compacted", "requested_revision": 5, "compact_revision": 9},
        ),
        (LeaseNotFoundError(7), 404, {"error": "lease_not_found", "lease": 7}),
        (StoreClosedError("the engine is closed"), 503, {"error": "unavailable"}),
        (ValueError("not an integer"), 400, {"error": "bad_request"}),
        (RequestReadTimeout("the body took too long"), 408, {"error": "request_timeout"}),
    ],
)
@pytest.mark.asyncio
async def test_an_engine_error_is_answered_with_its_status_code_message_and_fields(
    exc: Exception, status: int, body: dict[str, Any]
) -> None:
    async with HttpStoreServer(port=0) as server:
        response = server_state(server)._error_answer(make_mocked_request("GET", "/v1/kv/a"), exc)
    assert response.status == status
    got = _body(response)
    message = got.pop("message")
    assert got == body
    assert message.startswith(str(exc))


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (errno.ENOSPC, 507, "insufficient_storage"),
        (errno.EFBIG, 507, "insufficient_storage"),
        (errno.EIO, 503, "storage_unavailable"),
    ],
)
@pytest.mark.asyncio
async def test_a_log_that_cannot_take_a_write_says_the_write_was_not_applied(
    error: int, status: int, code: str
) -> None:
    async with HttpStoreServer(port=0) as server:
        exc = LogWriteError(error, "the disk said no")
        response = server_state(server)._error_answer(make_mocked_request("PUT", "/v1/kv/a"), exc)
    assert response.status == status
    assert _body(response) == {
        "error": code,
        "message": "the disk said no; the write was not applied",
    }


@pytest.mark.asyncio
async def test_a_client_gone_is_499_and_a_failed_data_dir_is_a_storage_error() -> None:
    async with HttpStoreServer(port=0) as server:
        state = server_state(server)
        request = make_mocked_request("PUT", "/v1/kv/a")
        gone = state._error_answer(request, ConnectionResetError("reset by peer"))
        failed = state._error_answer(request, OSError(errno.EIO, "fsync failed"))
        other = state._error_answer(request, KeyError("a bug"))
    assert gone.status == 499
    assert _body(gone) == {"error": "client_closed", "message": "the client closed the connection"}
    assert gone.keep_alive is False  # (closed: the client is gone)
    assert failed.status == 500
    assert _body(failed) == {
        "error": "storage_error",
        "message": "the data directory failed: [Errno 5] fsync failed",
    }
    assert other is None  # not an error it expects: the connection handler answers it


# -- what a client sees --------------------------------------------------------------------------


class Client:
    def __init__(self, server: HttpStoreServer, http: aiohttp.ClientSession) -> None:
        self.server, self.http = server, http

    async def call(self, method: str, path: str, **headers: str) -> tuple[int, Any, Any]:
        url = self.server.url + path
        async with self.http.request(method, url, headers=headers) as response:
            return response.status, json.loads(await response.read()), response.headers


@pytest_asyncio.fixture
async def client() -> AsyncIterator[Client]:
    async with (
        HttpStoreServer(port=0, token=TOKEN, max_value_bytes=1000) as server,
        aiohttp.ClientSession() as http,
    ):
        yield Client(server, http)


AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.asyncio
async def test_aiohttp_s_own_refusals_are_answered_in_our_words(client: Client) -> None:
    status, body, _ = await client.call("GET", "/nowhere/" + "x" * 300, **AUTH)
    assert status == 404
    assert body == {
        "error": "not_found",
        "message": f"no route for GET {('/nowhere/' + 'x' * 300)[:200]!r}; see /openapi.json",
    }
    status, body, headers = await client.call("PATCH", "/v1/lease", **AUTH)
    assert status == 405
    assert body["error"] == "method_not_allowed"
    assert body["message"] == "method PATCH is not allowed on '/v1/lease'"
    long_path = "/v1/kv/" + "k" * 300
    status, body, _ = await client.call("PATCH", long_path, **AUTH)
    assert (status, body["message"]) == (405, f"method PATCH is not allowed on {long_path[:200]!r}")
    assert "POST" in headers["Allow"]


@pytest.mark.asyncio
async def test_aiohttp_s_body_limit_is_answered_with_both_limits() -> None:
    """(Every route reads its body within its own, smaller limit: aiohttp's ``client_max_size``
    is the backstop, so its refusal is checked on the mapping.)"""
    async with HttpStoreServer(port=0, max_value_bytes=1000) as server:
        exc = web.HTTPRequestEntityTooLarge(max_size=65537, actual_size=70000)
        response = server_state(server)._error_answer(make_mocked_request("POST", "/v1/txn"), exc)
    assert response.status == 413
    assert _body(response) == {
        "error": "value_too_large",
        "message": f"request body too large (at most 1000 bytes of value, "
        f"{MAX_JSON_BODY_BYTES} of JSON)",
    }


@pytest.mark.asyncio
async def test_the_token_s_two_refusals_and_the_forms_it_takes(client: Client) -> None:
    needs = {
        "error": "unauthorized",
        "message": "this server needs 'Authorization: Bearer <token>'",
    }
    invalid = {"error": "unauthorized", "message": "the bearer token is not valid"}
    for headers, body in (
        ({}, needs),
        ({"Authorization": "Bearer"}, needs),
        ({"Authorization": "Bearer "}, needs),
        ({"Authorization": f"Basic {TOKEN}"}, needs),
        ({"Authorization": "Bearer nope"}, invalid),
        ({"Authorization": f"Bearer {TOKEN}x"}, invalid),
    ):
        status, got, _ = await client.call("GET", "/v1/revision", **headers)
        assert (status, got) == (401, body), headers
    for form in (f"Bearer {TOKEN}", f"bearer {TOKEN}", f"Bearer  {TOKEN} ", f"BEARER {TOKEN}"):
        status, _, _ = await client.call("GET", "/v1/revision", Authorization=form)
        assert status == 200, form


async def _expect(server: HttpStoreServer, head: str) -> tuple[bytes, dict[str, Any] | None]:
    """Send a head with ``Expect``; (the first status line, the JSON body of a refusal)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(head.encode())
        first = await asyncio.wait_for(reader.readline(), 10)
        if first.startswith(b"HTTP/1.1 100"):
            return first, None
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode().lower()
        length = int(head.partition("content-length:")[2].partition("\r\n")[0])
        return first, json.loads(await asyncio.wait_for(reader.readexactly(length), 10))
    finally:
        writer.close()


def _head(method: str, path: str, length: int, expect: str = "100-continue") -> str:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nExpect: {expect}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Length: {length}\r\n\r\n"
    )


@pytest.mark.asyncio
async def test_an_expect_refused_before_the_body_says_why_and_is_counted(client: Client) -> None:
    server = server_state(client.server)
    first, body = await _expect(client.server, _head("PUT", "/v1/kv/a", 10, "x-" + "y" * 60))
    assert first.startswith(b"HTTP/1.1 417")
    assert body == {
        "error": "expectation_failed",
        "message": f"unknown Expect: {('x-' + 'y' * 60)[:40]!r} (only 100-continue)",
    }
    first, body = await _expect(client.server, _head("PUT", "/v1/kv/a", 1001))
    assert first.startswith(b"HTTP/1.1 413")
    assert body == {
        "error": "value_too_large",
        "message": "the body (1001 bytes) is over this route's limit (1000 bytes)",
    }
    first, body = await _expect(client.server, _head("POST", "/v1/lease", MAX_JSON_BODY_BYTES + 1))
    assert first.startswith(b"HTTP/1.1 413")
    assert body == {
        "error": "body_too_large",
        "message": f"the body ({MAX_JSON_BODY_BYTES + 1} bytes) is over this route's limit "
        f"({MAX_JSON_BODY_BYTES} bytes)",
    }
    assert server.metrics.requests.count("other", 417) == 1
    assert server.metrics.requests.count("other", 413) == 2
    latency = server.metrics.requests._latency["other"][1][0]
    assert 0 <= latency < 5  # the time since the request began, not a clock's reading


@pytest.mark.asyncio
async def test_an_expect_at_its_route_s_limit_is_continued(client: Client) -> None:
    """A value of exactly the limit, and a JSON body over the value limit but within its own:
    both get ``100 Continue``."""
    for head in (_head("PUT", "/v1/kv/a", 1000), _head("POST", "/v1/lease", 2000)):
        first, _ = await _expect(client.server, head)
        assert first == b"HTTP/1.1 100 Continue\r\n", head


@pytest.mark.asyncio
async def test_a_connection_over_the_limit_is_told_to_retry_shortly() -> None:
    async with HttpStoreServer(port=0, max_connections=1) as server:
        held = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            intake = server._intake
            assert intake is not None
            await eventually(lambda: len(intake.live) == 1, 10, "the first connection counted")
            async with (
                aiohttp.ClientSession() as http,
                http.get(server.url + "/v1/revision") as response,
            ):
                status, body, retry = response.status, await response.json(), response.headers
        finally:
            held[1].close()
        state = server_state(server)
    assert status == 503
    assert retry["Retry-After"] == "1"
    assert body == {
        "error": "too_many_connections",
        "message": "this server holds at most 1 connections (--max-connections) and all are "
        "in use; try again shortly",
    }
    assert state.metrics.requests.count("other", 503) == 1
    assert state.metrics.requests._latency["other"][1][0] == 0.0


# -- metering and the end of watch streams -------------------------------------------------------


@pytest.mark.asyncio
async def test_each_answer_is_metered_by_op_status_and_time(client: Client) -> None:
    """A refused token is metered as ``other`` (not the route's op); an error its status; an
    exception no answer maps is a 500 for the meter (the connection handler answers it)."""
    state = server_state(client.server)
    meter = state.metrics.requests
    await client.call("GET", "/v1/revision")  # no token
    await client.call("GET", "/v1/lease/12345", **AUTH)  # no such lease
    assert meter.count("other", 401) == 1
    assert sum(n for (op, status), n in meter._counts.items() if status == 404) == 1

    async def broken(request: web.Request, arg: None) -> web.StreamResponse:
        raise KeyError("a bug")

    request = make_mocked_request("GET", "/v1/revision", headers=AUTH)
    with pytest.raises(KeyError):
        await state.answer(request, "revision", broken, None)
    assert meter.count("revision", 500) == 1
    assert all(0 <= total[0] < 5 for _, total in meter._latency.values())


@pytest.mark.asyncio
async def test_ending_the_watch_streams_refuses_new_ones(client: Client) -> None:
    state = server_state(client.server)
    state.end_watch_streams()
    assert state.closing is True
    status, body, _ = await client.call("GET", "/v1/watch/p/", **AUTH)
    assert (status, body) == (
        503,
        {"error": "unavailable", "message": "the server is shutting down"},
    )
