"""Opening a session's WebSocket: the upgrade, the hello and its answer, every failure
translated to aioelastic's errors (see ``docs/http-api.md``, "The session protocol"), and the
full-jitter backoff a client that could not connect yet waits between attempts."""

from __future__ import annotations

import asyncio
import math
import random
import ssl as _ssl
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from ...errors import StoreAuthError, StoreConnectionError
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

__all__ = ["Backoff", "Dialer", "NotYet"]

#: Handshake statuses worth another attempt: over the server's connection limit or stopping
#: (503), a proxy in front of it not ready (502, 504), told to slow down (429).
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: Hello refusals worth another attempt (the server was too busy to read the hello in time).
RETRY_HELLO_CODES = frozenset({"hello_timeout"})


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

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


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
    """Opens WebSockets to ``base_url``'s session endpoint and says hello."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        ssl: _ssl.SSLContext | None,
        connect_timeout: float,
    ) -> None:
        self.url = base_url
        self._ws_url = base_url + SESSION_PATH
        self._headers = dict(headers)
        self._ssl: _ssl.SSLContext | bool = ssl if ssl is not None else True
        self.connect_timeout = connect_timeout
        #: the protocol versions the hello offers
        self.hello_versions = list(PROTOCOL_VERSIONS)
        self._http: aiohttp.ClientSession | None = None

    async def dial(
        self, hello: dict[str, Any], budget: float
    ) -> tuple[aiohttp.ClientWebSocketResponse, dict[str, Any]]:
        """A new WebSocket and the server's welcome to ``hello`` (plus our versions), or
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
    ) -> tuple[aiohttp.ClientWebSocketResponse, dict[str, Any]]:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout),
            )
        try:
            async with asyncio.timeout_at(deadline):
                ws = await self._http.ws_connect(
                    self._ws_url,
                    headers=self._headers,
                    ssl=self._ssl,
                    autoping=True,
                    max_msg_size=0,
                    timeout=aiohttp.ClientWSTimeout(ws_close=1.0),
                )
                try:
                    welcome = await self._hello(ws, hello)
                except BaseException:
                    await ws.close()
                    raise
        except (StoreConnectionError, StoreAuthError):
            raise  # the hello's answer, already ours (a StoreConnectionError is an OSError)
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in (401, 403):
                raise StoreAuthError(f"{self.url}: the server refused the token") from None
            if exc.status == 404:
                raise StoreConnectionError(
                    f"{self.url} has no session endpoint ({SESSION_PATH}): an older server?"
                ) from None
            if exc.status in RETRY_STATUSES:  # the reason is asked for only when giving up
                raise NotYet(
                    f"cannot open a session to {self.url}: HTTP {exc.status}", exc.status
                ) from None
            reason = await self.refusal(exc.status)
            raise StoreConnectionError(
                f"cannot open a session to {self.url}: HTTP {exc.status}: {reason}"
            ) from None
        except TimeoutError:
            raise NotYet(f"cannot connect to {self.url}: timed out") from None
        except (_ssl.SSLError, aiohttp.ClientSSLError) as exc:  # a certificate will not change
            raise StoreConnectionError(f"cannot connect to {self.url}: {exc}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise NotYet(f"cannot connect to {self.url}: {exc}") from None
        return ws, welcome

    async def refusal(self, status: int) -> str:
        """Why the server refused the upgrade (over its connection limit, stopping...).

        aiohttp's handshake error carries no body, so the reason is asked once more with a plain
        request, which the server answers with the same JSON error; nothing is written by it.
        """
        assert self._http is not None
        try:
            async with (
                asyncio.timeout(self.connect_timeout),
                self._http.get(self._ws_url, headers=self._headers, ssl=self._ssl) as response,
            ):
                body = await response.json(content_type=None)
            return str(body.get("message", "")) if isinstance(body, dict) else str(status)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return "no reason given"

    async def _hello(
        self, ws: aiohttp.ClientWebSocketResponse, fields: dict[str, Any]
    ) -> dict[str, Any]:
        hello = {"versions": self.hello_versions, "client": "aioelastic", **fields}
        await ws.send_bytes(pack([REQUEST, 0, "hello", hello]))
        message = await ws.receive()
        if message.type is not aiohttp.WSMsgType.BINARY:  # closed under load, say: try again
            raise NotYet(f"{self.url}: no answer to the session hello ({message.type.name})")
        try:
            frame = next(unpack_all(message.data, max_len=1 << 20))
        except (FrameError, StopIteration):
            raise StoreConnectionError(f"{self.url}: a malformed answer to the hello") from None
        if len(frame) == 5 and frame[0] == ERROR:
            error = NotYet if frame[2] in RETRY_HELLO_CODES else StoreConnectionError
            raise error(f"{self.url} refused the session: {frame[3]} ({frame[2]})")
        if len(frame) != 3 or frame[0] != RESULT or not isinstance(frame[2], dict):
            raise StoreConnectionError(f"{self.url}: a malformed answer to the hello")
        welcome: dict[str, Any] = frame[2]
        return welcome

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
