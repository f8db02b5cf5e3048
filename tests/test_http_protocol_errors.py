"""The connection handler's answer to what aiohttp could not parse or answer
(``_protocol.JsonErrorRequestHandler.handle_error``), case by case: the status and code, the
words (the message given, the exception's, or a default; cut to 200 characters), a 431 for a
line or headers too large whatever status aiohttp chose, a 5xx logged with its traceback, and a
response already started, which cannot be answered. Called directly on a handler of a real
aiohttp server object; the end-to-end cases are in ``tests/test_http_read_deadline.py``."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.test_utils import make_mocked_request

from aioelastic.store.http._protocol import JsonErrorRequestHandler


async def _unused(request: web.BaseRequest) -> web.StreamResponse:
    raise AssertionError("not called")


@pytest_asyncio.fixture
async def handler() -> JsonErrorRequestHandler:
    return JsonErrorRequestHandler(
        web.Server(_unused),
        read_timeout=None,
        budget=None,
        entry=None,
        since=0.0,
        over_limit=False,
        observe=lambda op, status, seconds: None,
        loop=asyncio.get_running_loop(),
    )


def _request(output_size: int = 0) -> Any:
    return make_mocked_request("GET", "/x", writer=SimpleNamespace(output_size=output_size))


def _answer(response: web.StreamResponse) -> tuple[int, dict[str, Any]]:
    assert isinstance(response, web.Response)
    assert response.body is not None
    body: dict[str, Any] = json.loads(bytes(response.body))  # type: ignore[arg-type]
    return response.status, body


@pytest.mark.parametrize(
    ("status", "exc", "message", "answer"),
    [
        (
            400,
            ValueError("bad line"),
            None,
            (400, "bad_request", "malformed HTTP request: bad line"),
        ),
        (400, None, "given words", (400, "bad_request", "malformed HTTP request: given words")),
        (400, None, None, (400, "bad_request", "malformed HTTP request: malformed request")),
        (
            400,
            ValueError("x" * 300),
            None,
            (400, "bad_request", "malformed HTTP request: " + "x" * 200),
        ),
        (
            400,
            LineTooLong("a line", "8190", "9000"),
            None,
            (431, "headers_too_large", "request line or headers too large: "),
        ),
        (
            400,
            ValueError("Too many headers received"),
            None,
            (
                431,
                "headers_too_large",
                "request line or headers too large: Too many headers received",
            ),
        ),
        (413, None, "too big", (413, "too_large", "too big")),
        (418, None, "teapot", (418, "error", "teapot")),
    ],
)
@pytest.mark.asyncio
async def test_an_unparsable_request_gets_its_status_code_and_words(
    handler: JsonErrorRequestHandler,
    status: int,
    exc: BaseException | None,
    message: str | None,
    answer: tuple[int, str, str],
) -> None:
    response = handler.handle_error(_request(), status, exc, message)
    got_status, body = _answer(response)
    assert (got_status, body["error"]) == answer[:2]
    if isinstance(exc, LineTooLong):  # (its words are aiohttp's)
        assert body["message"].startswith(answer[2])
    else:
        assert body["message"] == answer[2]
    assert response.keep_alive is False  # (closed after the answer)


@pytest.mark.asyncio
async def test_a_server_error_is_logged_with_its_traceback_and_a_client_one_is_not(
    handler: JsonErrorRequestHandler, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    try:
        raise KeyError("the bug")
    except KeyError as exc:
        bug = exc
    status, body = _answer(handler.handle_error(_request(), 500, bug))
    assert (status, body["error"]) == (500, "error")
    logged = [r for r in caplog.records if r.getMessage() == "Error handling request"]
    assert len(logged) == 1
    assert logged[0].exc_info is not None
    assert logged[0].exc_info[1] is bug
    caplog.clear()
    handler.handle_error(_request(), 499, ValueError("gone"))
    assert not [r for r in caplog.records if r.getMessage() == "Error handling request"]


@pytest.mark.asyncio
async def test_a_response_already_started_cannot_be_answered(
    handler: JsonErrorRequestHandler,
) -> None:
    with pytest.raises(ConnectionError, match=r"^response already started; cannot send an error$"):
        handler.handle_error(_request(output_size=1), 500, KeyError("late"))
    handler.handle_error(_request(output_size=0), 400)  # (nothing written yet: answered)
