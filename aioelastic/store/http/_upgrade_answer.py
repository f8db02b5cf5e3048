"""The client's half of the session's HTTP Upgrade: the request it writes, and the server's
answer read off the stream (a ``101 Switching Protocols``, or an ordinary HTTP answer with a JSON
error body), whatever the reads' boundaries. See :mod:`._session_stream` for the wire."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ._session_stream import UPGRADE

__all__ = ["BODY_LIMIT", "HEAD_LIMIT", "Answer", "AnswerReader", "HeadError", "upgrade_request"]

#: The longest answer head read (status line and headers, up to the blank line).
HEAD_LIMIT = 16 * 1024
#: The most of a refusal's body kept (the reason in it is a line or two of JSON).
BODY_LIMIT = 64 * 1024

_STATUS_LINE = re.compile(r"HTTP/1\.[01] ([1-5][0-9][0-9])(?: (.*))?")


class HeadError(ValueError):
    """Bytes that are not an HTTP/1.1 answer head (or one over :data:`HEAD_LIMIT`)."""


def upgrade_request(path: str, host: str, headers: Mapping[str, str]) -> bytes:
    """The ``GET path`` that asks for the session transport (``headers``: the token's)."""
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {host}",
        "Connection: Upgrade",
        f"Upgrade: {UPGRADE}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@dataclass(frozen=True, slots=True)
class Answer:
    """The server's answer to the upgrade: ``headers`` with lower-case names."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes = b""

    @property
    def upgraded(self) -> bool:
        """A 101 to the session transport (anything else is a refusal)."""
        return self.status == 101 and self.headers.get("upgrade", "").lower() == UPGRADE

    def error(self) -> tuple[str | None, str]:
        """The body's ``(error code, message)``: ``(None, the text)`` when it is not the JSON
        error every aioelastic server answers with (an old server's, a proxy's)."""
        text = self.body.decode("utf-8", "replace")
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
            return parsed["error"], str(parsed.get("message", ""))[:500]
        text = " ".join(text.split())[:300]
        return None, text or self.reason or "no reason given"


class AnswerReader:
    """Reads the answer head, then for a refusal its body (by ``Content-Length``, or until the
    connection ends, at most :data:`BODY_LIMIT` bytes).

    ``feed(data)`` returns the :class:`Answer` once complete (else ``None``; keep feeding), and
    :attr:`rest` holds what came after it (after a 101: the first bytes of the session's
    messages). ``eof()`` is the answer when the connection ended, or :class:`HeadError`.
    """

    __slots__ = ("_body_wanted", "_buffer", "_head", "rest")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._head: Answer | None = None
        self._body_wanted = -1  # bytes of body awaited; -1: until the connection ends
        self.rest = b""

    def feed(self, data: bytes) -> Answer | None:
        self._buffer += data
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > HEAD_LIMIT:
                    raise HeadError(f"an answer head over {HEAD_LIMIT} bytes")
                return None
            if end > HEAD_LIMIT:
                raise HeadError(f"an answer head over {HEAD_LIMIT} bytes")
            self._head = _parse_head(bytes(self._buffer[:end]))
            del self._buffer[: end + 4]
            self._body_wanted = _body_length(self._head)
        head = self._head
        wanted = self._body_wanted
        if wanted < 0:
            if len(self._buffer) < BODY_LIMIT:
                return None  # the body ends with the connection
            wanted = BODY_LIMIT
        if len(self._buffer) < wanted:
            return None
        body = bytes(self._buffer[:wanted])
        self.rest = bytes(self._buffer[wanted:])
        self._buffer.clear()
        return Answer(head.status, head.reason, head.headers, body)

    def eof(self) -> Answer:
        """The answer, the connection having ended (its body is what came)."""
        head = self._head
        if head is None:
            raise HeadError(
                "the connection ended before an answer"
                if not self._buffer
                else "the connection ended inside the answer's head"
            )
        return Answer(head.status, head.reason, head.headers, bytes(self._buffer[:BODY_LIMIT]))


def _parse_head(raw: bytes) -> Answer:
    lines = raw.decode("latin-1").split("\r\n")
    match = _STATUS_LINE.fullmatch(lines[0])
    if match is None:
        raise HeadError(f"not an HTTP/1.1 answer: {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        name = name.strip().lower()
        if not colon or not name or name != name.split()[0]:
            raise HeadError(f"a malformed header line in the answer: {line[:100]!r}")
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return Answer(int(match.group(1)), match.group(2) or "", headers)


def _body_length(head: Answer) -> int:
    """Bytes of body to read: 0 for none, -1 for "until the connection ends"."""
    if head.status < 200 or head.status in (204, 304):
        return 0  # (a 101: what follows is the session's)
    if "chunked" in head.headers.get("transfer-encoding", "").lower():
        return 0  # a reason not worth decoding: the status says enough
    length = head.headers.get("content-length")
    if length is None:
        return -1
    if not length.isdigit():
        raise HeadError(f"a malformed Content-Length in the answer: {length[:50]!r}")
    return min(int(length), BODY_LIMIT)
