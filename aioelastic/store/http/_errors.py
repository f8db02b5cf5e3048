"""Errors answered as JSON: ``{"error": code, "message": ...}`` with an HTTP status."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ._encoding import json_response

__all__ = ["STATUS_CODES", "ApiError", "RequestReadTimeout", "bad", "error_response"]


class ApiError(Exception):
    """An error answered as ``{"error": code, "message": ...}`` with an HTTP status."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
        self.extra = extra

    def response(self) -> web.Response:
        headers = self.headers
        if self.status == 401:
            headers = {"WWW-Authenticate": 'Bearer realm="aioelastic"'}
        response = error_response(self.status, self.code, self.message, headers, **self.extra)
        if self.status in (415, 417):
            response.force_close()  # the refused body is not read: end the connection
        return response


def bad(message: str) -> ApiError:
    return ApiError(400, "bad_request", message)


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None, **extra: Any
) -> web.Response:
    body = {"error": code, "message": message, **extra}
    return json_response(body, status, headers)


STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    411: "length_required",
    413: "too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
    431: "headers_too_large",
    503: "unavailable",
}


class RequestReadTimeout(TimeoutError):
    """Set on a request body that did not arrive within the read deadline: the handler reading
    it answers 408 (``ServerState.answer``). A ``TimeoutError`` so that aiohttp's lingering read of
    an answered request's unread body ends quietly."""
