"""Opening a session's connection: TCP (and TLS), the HTTP Upgrade to the session transport, the
hello and its answer, every failure translated to aioelastic's errors (see ``docs/http-api.md``,
"The session protocol"), and the full-jitter backoff a client that could not connect yet waits
between attempts. No aiohttp here: the session path is asyncio's own transport."""

from __future__ import annotations

import asyncio
import math
import random
import ssl as _ssl
import weakref
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from ...errors import StoreAuthError, StoreConnectionError
from ._client_conn import Connection
from ._frames import (
    ERROR,
    PROTOCOL_VERSIONS,
    REQUEST,
    RESULT,
    SESSION_PATH,
    FrameError,
    pack,
    unpack_all,
)
from ._session_stream import (
    HELLO_HEADER,
    HELLO_TAKEN,
    MAX_HELLO_HEADER,
    UPGRADE,
    hello_header,
    message_header,
)
from ._upgrade_answer import Answer, upgrade_request

__all__ = ["Backoff", "Dialer", "NotYet", "refusal_error"]

#: Handshake statuses worth another attempt: over the server's connection limit or stopping
#: (503), a proxy in front of it not ready (502, 504), told to slow down (429).
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: Hello refusals worth another attempt (the server was too busy to read the hello in time).
RETRY_HELLO_CODES = frozenset({"hello_timeout"})
_TAKEN_KEY = HELLO_HEADER.lower()  # (the answer's header names are lower-cased)


#: Connections being opened at once from one event loop (every store of the process): more wait
#: their turn before their connect timeout starts. A thousand participants in one process that
#: all dial at once would otherwise time out together on a busy server, close, and try again:
#: work the server did for nothing, and the next storm.
DIALS_AT_ONCE = 32
_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def _dial_slots() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    slots = _SLOTS.get(loop)
    if slots is None:
        slots = _SLOTS[loop] = asyncio.Semaphore(DIALS_AT_ONCE)
    return slots


class NotYet(StoreConnectionError):
    """Connecting failed in a way that may pass: refused, reset, timed out, or an HTTP status in
    :data:`RETRY_STATUSES` (``status``). Anything else (a refused token, no session endpoint, a
    rejected hello) will not change and is raised as it is."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        #: the server's own words for a refusal (said when giving up, not at every attempt)
        self.reason = reason


class Backoff:
    """Full-jitter exponential backoff: the n-th wait (from 0) is uniform in
    ``[0, min(cap, base * 2**n)]``, so thousands of clients refused at once come back spread
    over the window instead of all together (a synchronised retry is the next storm)."""

    def __init__(
        self, base: float = 0.05, cap: float = 2.0, rng: Callable[[], float] = random.random
    ) -> None:
        self.base, self.cap, self._rng = base, cap, rng
        self.attempts = 0

    def next_delay(self) -> float:
        ceiling = min(self.cap, math.ldexp(self.base, min(self.attempts, 30)))
        self.attempts += 1
        return ceiling * self._rng()


class Dialer:
    """Opens connections to ``base_url``'s session endpoint and says hello."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        ssl: _ssl.SSLContext | None,
        connect_timeout: float,
    ) -> None:
        self.url = base_url
        parts = urlsplit(base_url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._request = upgrade_request(parts.path + SESSION_PATH, parts.netloc, headers)
        self._ssl = ssl
        self.connect_timeout = connect_timeout
        #: the protocol versions the hello offers
        self.hello_versions = list(PROTOCOL_VERSIONS)

    async def dial(self, hello: dict[str, Any], budget: float) -> tuple[Connection, dict[str, Any]]:
        """A new connection and the server's welcome to ``hello`` (plus our versions), or
        ``StoreConnectionError`` (``StoreAuthError`` for a refused token): nothing else sent.

        Within ``budget`` seconds: waiting for one of the event loop's :data:`DIALS_AT_ONCE`
        slots, then the TCP connection (at most ``connect_timeout`` of it), the upgrade and the
        hello. A server that accepted the connection but is slow to answer (ten thousand
        handshakes at once) is waited for, not abandoned after ``connect_timeout``: an attempt
        given up is work the server did for nothing, and the retry is more of it.
        """
        slots = _dial_slots()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        try:
            async with asyncio.timeout_at(deadline):
                await slots.acquire()
        except TimeoutError:
            raise NotYet(
                f"cannot connect to {self.url}: no dial slot within {budget:g}s "
                f"({DIALS_AT_ONCE} connections being opened from this process)"
            ) from None
        try:
            return await self._dial(hello, deadline)
        finally:
            slots.release()

    async def _dial(
        self, hello: dict[str, Any], deadline: float
    ) -> tuple[Connection, dict[str, Any]]:
        loop = asyncio.get_running_loop()
        conn: Connection | None = None
        try:
            async with asyncio.timeout_at(min(deadline, loop.time() + self.connect_timeout)):
                _, conn = await loop.create_connection(
                    lambda: Connection(loop),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
            async with asyncio.timeout_at(deadline):
                # a new session's hello rides in the upgrade (a resume's stays in the stream)
                head = None if hello.get("resume") else self._with_hello(hello)
                conn.send_now(self._request if head is None else head)
                answer = await conn.answer()
                if not answer.upgraded:
                    raise refusal_error(self.url, answer)
                if head is not None and answer.headers.get(_TAKEN_KEY) == HELLO_TAKEN:
                    welcome = await self._welcome(conn)
                else:  # (a server older than the header: the hello goes as a message)
                    welcome = await self._hello(conn, hello)
        except BaseException as exc:
            if conn is not None:
                conn.abort("not opened")
            if isinstance(exc, (StoreConnectionError, StoreAuthError)):
                raise  # ours already (a StoreConnectionError is an OSError)
            if isinstance(exc, TimeoutError):
                raise NotYet(f"cannot connect to {self.url}: timed out") from None
            if isinstance(exc, _ssl.SSLError):  # a certificate will not change
                raise StoreConnectionError(f"cannot connect to {self.url}: {exc}") from None
            if isinstance(exc, OSError):
                raise NotYet(f"cannot connect to {self.url}: {exc}") from None
            raise
        return conn, welcome

    def _hello_message(self, fields: dict[str, Any]) -> bytes:
        return pack(
            [
                REQUEST,
                0,
                "hello",
                {"versions": self.hello_versions, "client": "aioelastic", **fields},
            ]
        )

    def _with_hello(self, fields: dict[str, Any]) -> bytes | None:
        """The upgrade request with the hello of ``fields`` in its header; None for a hello too
        long for one (:data:`MAX_HELLO_HEADER`: it then goes as a message)."""
        value = hello_header(self._hello_message(fields))
        if len(value) > MAX_HELLO_HEADER:
            return None
        head = self._request[:-2]  # (up to the blank line)
        return head + f"{HELLO_HEADER}: {value}\r\n\r\n".encode("ascii")

    async def _hello(self, conn: Connection, fields: dict[str, Any]) -> dict[str, Any]:
        hello = self._hello_message(fields)
        conn.send_now(message_header(len(hello)) + hello)
        return await self._welcome(conn)

    async def _welcome(self, conn: Connection) -> dict[str, Any]:
        """The server's answer to the hello: its welcome, or the error it refused it with."""
        try:
            message = await conn.next_message()
        except ConnectionResetError as exc:  # closed under load, say: try again
            raise NotYet(f"{self.url}: no answer to the session hello ({exc})") from None
        try:
            frame = next(unpack_all(message, max_len=1 << 20))
        except (FrameError, StopIteration):
            raise StoreConnectionError(f"{self.url}: a malformed answer to the hello") from None
        if len(frame) == 5 and frame[0] == ERROR:
            error = NotYet if frame[2] in RETRY_HELLO_CODES else StoreConnectionError
            raise error(f"{self.url} refused the session: {frame[3]} ({frame[2]})")
        if len(frame) != 3 or frame[0] != RESULT or not isinstance(frame[2], dict):
            raise StoreConnectionError(f"{self.url}: a malformed answer to the hello")
        welcome: dict[str, Any] = frame[2]
        return welcome


def refusal_error(url: str, answer: Answer) -> StoreConnectionError | StoreAuthError:
    """The error for an answer to the upgrade that is not a 101 to the session transport."""
    status = answer.status
    _, message = answer.error()
    said = f"HTTP {status}: {message}" if message else f"HTTP {status}"
    if status in (401, 403):
        return StoreAuthError(f"{url}: the server refused the token ({said})")
    if status in RETRY_STATUSES:
        return NotYet(f"cannot open a session to {url}: HTTP {status}", status, message)
    if status == 404:
        return StoreConnectionError(
            f"{url} has no session endpoint ({SESSION_PATH}): an older server? ({said})"
        )
    if status in (101, 400, 426):
        # an aioelastic server from before the session transport only upgrades to a WebSocket
        got = f"Upgrade: {answer.headers.get('upgrade', '')}" if status == 101 else said
        return StoreConnectionError(
            f"the server at {url} does not speak the session transport {UPGRADE} ({got}); "
            "upgrade aioelastic on the server"
        )
    return StoreConnectionError(f"cannot open a session to {url}: {said}")
