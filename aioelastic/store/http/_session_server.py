"""The session endpoint of ``aioelastic serve``: one connection per client carries its requests,
watches and lease keep-alives (see ``docs/http-api.md``, "The session protocol").

:class:`SessionHub` holds the sessions of one server. A session outlives its connection for a
grace period: the leases it granted are revoked when the connection ends (FIN or RST) and the
client has not resumed the session (its hello names the session's resume token) within
``grace`` seconds. ``GET /v1/session`` upgrades to the session stream (:mod:`._session_raw`,
any other upgrade gets 426); the connection's first message is the hello
(:meth:`SessionHub.greet`) and the rest is a :class:`~._session_conn.Connection`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
from aiohttp import web

from ...errors import LeaseNotFoundError, StoreClosedError
from ..memory import LeaseChange, MemoryEngine
from . import _session_raw
from ._blob_cache import BlobCache
from ._errors import error_response
from ._frames import (
    ERROR,
    PROTOCOL_VERSIONS,
    REQUEST,
    RESULT,
    FrameError,
    encode_events,
    pack,
    unpack_all,
)
from ._session_conn import Connection, Sender
from ._session_flush import FlushQueue
from ._session_ops import OpError, seconds_arg
from ._session_raw import RawSession
from ._session_stream import UPGRADE

__all__ = ["DEFAULT_SESSION_GRACE", "Connection", "SessionHub"]

#: Seconds a session's leases outlive its connection, waiting for the client to resume it.
DEFAULT_SESSION_GRACE = 0.25
#: Seconds the client has to send its hello after the upgrade.
HELLO_TIMEOUT = 10.0
#: Answers waiting to be written beyond this (a client that stopped reading) end the connection
#: (``too_slow``): the transport's write buffer, which the kernel's socket buffer drains.
MAX_OUTBOX_BYTES = 64 * 1024 * 1024


def _no_metrics(op: str, status: int, seconds: float) -> None:
    pass


class SessionState:
    """What outlives a connection: the session's id, resume token and leases."""

    __slots__ = ("connection", "id", "leases", "resume_token", "revoke_timer")

    def __init__(self) -> None:
        self.id = secrets.token_hex(8)
        self.resume_token = secrets.token_urlsafe(24)
        self.leases: set[int] = set()
        self.connection: Connection | None = None
        self.revoke_timer: asyncio.TimerHandle | None = None


class SessionHub:
    """The sessions of one server over one engine."""

    def __init__(
        self,
        engine: MemoryEngine,
        *,
        grace: float = DEFAULT_SESSION_GRACE,
        max_key_bytes: int,
        max_value_bytes: int,
        max_watches: int,
        durable: Callable[[], Awaitable[None]] | None = None,
        observe: Callable[[str, int, float], None] | None = None,
        other_watches: Callable[[], int] | None = None,
    ) -> None:
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace < 1e6:
            raise ValueError(f"session grace must be a number of seconds >= 0, got {grace!r}")
        self.engine = engine
        self.grace = float(grace)
        self.max_key_bytes = max_key_bytes
        self.max_value_bytes = max_value_bytes
        self.max_watches = max_watches
        self.durable = durable
        #: ``observe(op, status, seconds)``: each operation, metered as the REST routes are
        self.observe = observe or _no_metrics
        #: watches served elsewhere (the REST watch streams) that count against ``max_watches``
        self.other_watches = other_watches or (lambda: 0)
        #: a message's size bound: a few maximal values with their keys
        self.max_message_bytes = 4 * (max_value_bytes + max_key_bytes) + 1024 * 1024
        self.closing = False
        self.watches = 0
        self._sessions: dict[str, SessionState] = {}  # by resume token
        self._owner: dict[int, SessionState] = {}  # lease id -> the session that owns it
        self._connections: set[Connection] = set()
        #: raw connections from their 101 to their end (a hello may still be due)
        self.raw_sessions: set[RawSession] = set()
        self.hello_timeout = HELLO_TIMEOUT
        self.max_outbox_bytes = MAX_OUTBOX_BYTES
        # Encoded event blobs (their msgpack, bin headers included) of the current revision,
        # shared by watchers at the same position.
        self._blobs = BlobCache(_packed_events)
        #: ``blob(prefix, events, revision)``: the events' encoded blob (the cache's own get)
        self.blob: Callable[[str, list[Any], int], bytes] = self._blobs.get
        self.flushes = FlushQueue()  # the connections' writes, one callback for those that woke
        engine.on_lease.append(self._on_lease)

    @property
    def session_count(self) -> int:
        return len(self._connections)

    # -- leases

    def own_lease(self, state: SessionState, lease_id: int) -> None:
        state.leases.add(lease_id)
        self._owner[lease_id] = state

    def _on_lease(self, change: LeaseChange) -> None:
        if change.ttl is None:  # ended (revoked or expired): forget its owner
            owner = self._owner.pop(change.id, None)
            if owner is not None:
                owner.leases.discard(change.id)

    def _adopt(self, state: SessionState, claimed: Any) -> None:
        """A new session for a client whose old one is gone (a server restart): it owns the
        leases it names that still exist and that no live session owns."""
        if not isinstance(claimed, list):
            return
        engine = self.engine
        for lease_id in claimed[:100_000]:
            if (
                isinstance(lease_id, int)
                and lease_id not in self._owner
                and engine.has_lease(lease_id)  # (O(1): ten thousand clients back at once)
            ):
                self.own_lease(state, lease_id)

    def _detached(self, state: SessionState) -> None:
        """The connection of ``state`` ended: revoke its leases after the grace."""
        if self.closing or self._sessions.get(state.resume_token) is not state:
            return  # a server shutdown keeps leases (to their TTL); a replaced one lives on
        if self.grace == 0:
            self._end(state)
        else:
            loop = asyncio.get_running_loop()
            state.revoke_timer = loop.call_later(self.grace, self._end, state)

    def _end(self, state: SessionState) -> None:
        state.revoke_timer = None
        if state.connection is not None or self.closing:
            return
        self._sessions.pop(state.resume_token, None)
        for lease_id in sorted(state.leases):
            with contextlib.suppress(LeaseNotFoundError, StoreClosedError):
                self.engine.lease_revoke(lease_id)
        state.leases.clear()

    # -- connections

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/session`` (authenticated by the middleware): the upgrade it asks for."""
        if self.closing:
            return error_response(503, "unavailable", "the server is shutting down")
        upgrade = request.headers.get("Upgrade", "").strip().lower()
        connection = request.headers.get("Connection", "").lower()
        if "upgrade" not in (token.strip() for token in connection.split(",")):
            upgrade = ""  # an Upgrade header means nothing without "Connection: Upgrade"
        if upgrade == UPGRADE:
            return await _session_raw.upgrade(self, request)
        message = (
            f"/v1/session speaks the session protocol: send 'Connection: Upgrade' and "
            f"'Upgrade: {UPGRADE}' (got Upgrade {request.headers.get('Upgrade', '')[:60]!r})"
        )
        if upgrade == "websocket":  # a client from before the session stream
            message = (
                f"this server's sessions are {UPGRADE}, no longer a WebSocket: the client is "
                "older than the server; upgrade aioelastic on the client"
            )
        return error_response(
            426,
            "upgrade_required",
            message,
            {"Upgrade": UPGRADE, "Connection": "Upgrade"},
            upgrade=UPGRADE,
        )

    def greet(self, sender: Sender, body: bytes) -> Connection | None:
        """The first message of a connection: a hello, answered with the session's welcome (the
        connection then counts), or refused with an error frame and a close (None)."""
        try:
            frames = list(unpack_all(body, max_len=64 * 1024))
            kind, rid, op, fields = frames[0]
            if (kind, rid, op) != (REQUEST, 0, "hello") or not isinstance(fields, dict):
                raise FrameError("the first frame must be [0, 0, 'hello', {...}]")
        except (FrameError, ValueError, TypeError) as exc:
            return _refuse(sender, "bad_hello", f"not a hello frame: {exc}")
        versions = fields.get("versions")
        common = (
            [v for v in versions if v in PROTOCOL_VERSIONS] if isinstance(versions, list) else []
        )
        if not common:
            return _refuse(
                sender,
                "unsupported_version",
                f"this server speaks session protocol versions {list(PROTOCOL_VERSIONS)}, "
                f"the client offered {versions!r}",
                supported=list(PROTOCOL_VERSIONS),
            )
        try:
            interval = seconds_arg(fields.get("progress_interval", 5.0), "progress_interval")
        except OpError as exc:
            return _refuse(sender, "bad_hello", exc.message)
        state, resumed = self._session_for(fields)
        connection = Connection(self, sender, state, max(0.05, min(interval, 300.0)))
        connection.version = max(common)
        self._connections.add(connection)
        welcome = {
            "version": max(common),
            "session": state.id,
            "resume": state.resume_token,
            "resumed": resumed,
            "grace": self.grace,
            "max_message": self.max_message_bytes,
            "leases": sorted(state.leases),
        }
        sender.write([pack([RESULT, 0, welcome])])
        return connection

    def detach(self, connection: Connection) -> None:
        """The transport of ``connection`` ended: it no longer counts; its session waits for a
        resume through the grace (idempotent)."""
        self._connections.discard(connection)
        connection.end()
        state = connection.state
        if state.connection is connection:
            state.connection = None
            self._detached(state)

    def _session_for(self, fields: dict[str, Any]) -> tuple[SessionState, bool]:
        token = fields.get("resume")
        state = self._sessions.get(token) if isinstance(token, str) else None
        if state is not None:
            if state.revoke_timer is not None:
                state.revoke_timer.cancel()
                state.revoke_timer = None
            old = state.connection
            if old is not None:  # the client saw a drop the server has not seen yet
                old.replaced()
                state.connection = None  # (so that detaching the old one starts no grace)
                self.detach(old)
            resumed = True
        else:
            state = SessionState()
            self._sessions[state.resume_token] = state
            self._adopt(state, fields.get("leases"))
            resumed = False
        return state, resumed

    def shutdown(self) -> None:
        """The server stops: end every connection (leases stay, to their TTL)."""
        self.closing = True
        with contextlib.suppress(ValueError):  # an engine may outlive this server
            self.engine.on_lease.remove(self._on_lease)
        for connection in list(self._connections):
            connection.shutdown()
        for session in list(self.raw_sessions):
            if session.connection is None:  # upgraded, no hello yet
                session.refuse("unavailable", "the server is shutting down")

    async def wait_closed(self, timeout: float) -> None:
        """After :meth:`shutdown`: wait (``timeout`` seconds at most) until every session's
        connection has ended, then drop those that have not. (aiohttp's shutdown waits for the
        sessions it upgraded; those taken directly, never aiohttp's, are waited for here.)"""
        pending = [session.closed for session in self.raw_sessions]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        for session in list(self.raw_sessions):
            session.abort()


def _packed_events(events: list[Any]) -> bytes:
    """The events' blob as a msgpack bin object, ready to splice into a frame."""
    packed: bytes = msgpack.packb(encode_events(events), use_bin_type=True)
    return packed


def _refuse(sender: Sender, code: str, message: str, **extra: Any) -> Connection | None:
    """An error frame for the hello, then the end of the connection (never a hang): None, the
    connection the hello did not make."""
    sender.close(code, pack([ERROR, 0, code, message[:300], extra]))
    return None
