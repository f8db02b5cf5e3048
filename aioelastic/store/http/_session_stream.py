"""The byte stream under the session protocol: an HTTP/1.1 Upgrade, then length-prefixed messages.

Shared by both ends (:mod:`._session_server`, :mod:`._session_client`); described in
``docs/http-api.md`` ("The session protocol"). The client opens the session with::

    GET /v1/session HTTP/1.1
    Host: ...
    Connection: Upgrade
    Upgrade: aioelastic-session/1
    Authorization: Bearer <token>      (when the server has one)

and sends nothing more until the server's ``101 Switching Protocols`` (with the same
``Upgrade`` header). A new session's hello may ride in the upgrade itself, saving a round trip:
the header ``Aioelastic-Hello: <the hello message, base64url>`` (:func:`hello_header`); a server
that takes it answers the 101 with ``Aioelastic-Hello: taken`` and the hello's answer (the
welcome, or an error frame and the end) as the first message after it. Without that header in
the 101 (a server older than it) the client sends the hello as its first message, as always.
Only a new session's hello goes in a header: a resume's carries the resume token, which stays
inside the stream. Any other answer is an ordinary HTTP answer with a JSON error body. After the
101, each direction is a sequence of **messages**: a 4-byte big-endian length ``n`` (``1 <= n <=``
the peer's maximum) and then ``n`` bytes, one or more msgpack frames back to back
(:mod:`._frames`). A batch of requests, or of answers and events, is one message and one write.

A connection-level error (a frame that is not valid, a client too slow to read, a session resumed
elsewhere, the server stopping) is the error frame ``[ERROR, 0, code, message, extra]`` as the
last message, after which the sender closes the connection. The end of the connection (FIN or
RST) ends the session's connection: there is no close handshake.
"""

from __future__ import annotations

import base64
import binascii

from ._frames import FrameError

__all__ = [
    "HEADER_BYTES",
    "HELLO_HEADER",
    "HELLO_TAKEN",
    "MAX_HELLO_HEADER",
    "UPGRADE",
    "MessageLengthError",
    "MessageReader",
    "hello_from_header",
    "hello_header",
    "message_header",
]

#: The ``Upgrade`` token of the session transport. The protocol's own version is negotiated by
#: the hello (``PROTOCOL_VERSIONS``); this names the framing, and changes only with it.
UPGRADE = "aioelastic-session/1"
#: Bytes of a message's length prefix.
HEADER_BYTES = 4
#: The upgrade's header that carries a new session's hello, and its value in a 101 that took it.
HELLO_HEADER = "Aioelastic-Hello"
HELLO_TAKEN = "taken"
#: The longest hello header value a server reads (a hello is some 100 bytes; aiohttp's limit
#: for a header line is 8,190).
MAX_HELLO_HEADER = 4096


def hello_header(hello: bytes) -> str:
    """The ``Aioelastic-Hello`` value that carries the hello message ``hello``: base64url,
    unpadded."""
    return base64.urlsafe_b64encode(hello).rstrip(b"=").decode("ascii")


def hello_from_header(value: str) -> bytes | None:
    """The hello message an ``Aioelastic-Hello`` value carries; None when it is not one
    (not base64url, empty, or over :data:`MAX_HELLO_HEADER` characters)."""
    value = value.strip()
    if not value or len(value) > MAX_HELLO_HEADER:
        return None
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        return None


def message_header(length: int) -> bytes:
    """The length prefix of a message of ``length`` bytes (write it, then the body: a shared
    body, such as an event blob sent to many sessions, is then never copied per session)."""
    return length.to_bytes(HEADER_BYTES, "big")


class MessageLengthError(FrameError):
    """A message length of 0 or over the maximum: the stream can no longer be trusted.
    ``messages``: the whole messages that came before it in the same read (answer them, then
    close)."""

    def __init__(self, message: str, messages: list[bytes]) -> None:
        super().__init__(message)
        self.messages = messages


class MessageReader:
    """Cuts a byte stream into messages, whatever the reads' boundaries.

    ``feed(data)`` returns the messages that ``data`` completed, in order; the bytes of a message
    not complete yet are kept for the next call. A length of 0, or one over ``max_message``,
    raises :class:`MessageLengthError` (a :class:`FrameError`; the stream can no longer be
    trusted: close it), which carries the whole messages before it.
    """

    __slots__ = ("_buffer", "_wanted", "max_message")

    def __init__(self, max_message: int) -> None:
        if max_message < 1:
            raise ValueError(f"max_message must be >= 1, got {max_message}")
        self.max_message = max_message
        self._buffer = bytearray()
        #: bytes the buffer must hold before a message in it can be complete (header included)
        self._wanted = HEADER_BYTES

    @property
    def pending(self) -> int:
        """Bytes received that are not part of a complete message yet."""
        return len(self._buffer)

    def whole(self, data: bytes) -> memoryview | None:
        """The body of ``data`` if it is exactly one whole message and nothing is buffered (the
        common read: one answer, one batch), without a copy; else ``None``: :meth:`feed` it."""
        if self._buffer:
            return None
        length = int.from_bytes(data[:HEADER_BYTES], "big")
        if length != len(data) - HEADER_BYTES or not 1 <= length <= self.max_message:
            return None
        return memoryview(data)[HEADER_BYTES:]

    def feed(self, data: bytes) -> list[bytes]:
        if not self._buffer:
            # the common case: a read that starts at a message boundary is cut without copying
            # it into the buffer first
            return self._cut(memoryview(data))
        self._buffer += data
        if len(self._buffer) < self._wanted:
            return []  # a long message arriving in many reads: no copy until it is whole
        buffered = bytes(self._buffer)
        self._buffer.clear()
        return self._cut(memoryview(buffered))

    def _cut(self, view: memoryview) -> list[bytes]:
        out: list[bytes] = []
        at, end = 0, len(view)
        self._wanted = HEADER_BYTES
        while end - at >= HEADER_BYTES:
            length = int.from_bytes(view[at : at + HEADER_BYTES], "big")
            if length < 1 or length > self.max_message:
                raise MessageLengthError(
                    f"a message of {length} bytes (the limit is 1 to {self.max_message})", out
                )
            start = at + HEADER_BYTES
            if end - start < length:
                self._wanted = HEADER_BYTES + length
                break
            out.append(bytes(view[start : start + length]))
            at = start + length
        if at < end:
            self._buffer += view[at:]
        return out
