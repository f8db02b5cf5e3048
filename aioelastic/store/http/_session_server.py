"""The session endpoint of ``aioelastic serve``: one WebSocket per client carries its requests,
watches and lease keep-alives (see ``docs/http-api.md``, "The session protocol").

:class:`SessionHub` holds the sessions of one server. A session outlives its connection for a
grace period: the leases it granted are revoked when the connection ends (FIN or RST) and the
client has not resumed the session (its hello names the session's resume token) within
``grace`` seconds. A :class:`Connection` reads every frame that has arrived, answers each from
the operation table (:mod:`._session_ops`) and writes the answers of a batch as one message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
from aiohttp import WSMsgType, web

from ...errors import CompactedError, LeaseNotFoundError, StoreClosedError
from ..memory import LeaseChange, MemoryEngine
from ._blob_cache import BlobCache
from ._frames import (
    ERROR,
    PROTOCOL_VERSIONS,
    REQUEST,
    RESULT,
    WATCH_END,
    FrameError,
    encode_events,
    kv_to_wire,
    pack,
    unpack_all,
)
from ._persist import LogWriteError
from ._session_ops import OPS, OpError, bad, seconds_arg
from ._session_watch import ServedWatch

__all__ = ["DEFAULT_SESSION_GRACE", "SessionHub"]

log = logging.getLogger("aioelastic.serve")

#: Seconds a session's leases outlive its connection, waiting for the client to resume it.
DEFAULT_SESSION_GRACE = 0.25
#: Seconds the client has to send its hello after the upgrade.
HELLO_TIMEOUT = 10.0
#: Answers waiting to be written beyond this (a client that stopped reading) end the connection.
MAX_OUTBOX_BYTES = 64 * 1024 * 1024
#: Pumping many watches at once, write whenever this much is queued: the client starts on the
#: first frames while the server encodes the rest.
WATCH_CHUNK_BYTES = 16 * 1024
#: WebSocket close codes of the protocol (the 4000s are the application's).
CLOSE_BAD_HELLO = 4400
CLOSE_BAD_FRAME = 4401
CLOSE_TOO_SLOW = 4408
CLOSE_REPLACED = 4409


#: What ``receive()`` returns once the WebSocket has ended (its async iterator stops at these).
_ENDED = (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED)

#: The HTTP status an error code is metered as (the ``code`` label of the request metrics).
_STATUS = {
    "bad_request": 400,
    "unknown_op": 404,
    "lease_not_found": 404,
    "compacted": 410,
    "key_too_large": 413,
    "value_too_large": 413,
    "too_many_watches": 503,
    "unavailable": 503,
    "insufficient_storage": 507,
    "storage_unavailable": 503,
}


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
        # Encoded event blobs (their msgpack, bin headers included) of the current revision,
        # shared by watchers at the same position.
        self._blobs = BlobCache(_packed_events)
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
        live = {status.id for status in self.engine.leases()} if claimed else set()
        for lease_id in claimed[:100_000]:
            if isinstance(lease_id, int) and lease_id in live and lease_id not in self._owner:
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
        """``GET /v1/session``: the WebSocket upgrade (authenticated by the middleware)."""
        if self.closing:
            return web.json_response(
                {"error": "unavailable", "message": "the server is shutting down"}, status=503
            )
        ws = web.WebSocketResponse(
            max_msg_size=self.max_message_bytes,
            compress=False,
            autoping=True,
        )
        await ws.prepare(request)
        connection = await self._hello(ws)
        if connection is None:
            return ws
        self._connections.add(connection)
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)
            connection.end()
            state = connection.state
            if state.connection is connection:
                state.connection = None
                self._detached(state)
        return ws

    async def _hello(self, ws: web.WebSocketResponse) -> Connection | None:
        try:
            message = await ws.receive(timeout=HELLO_TIMEOUT)
        except TimeoutError:
            await _refuse(ws, "hello_timeout", f"no hello within {HELLO_TIMEOUT:g}s")
            return None
        if message.type is not WSMsgType.BINARY:
            await _refuse(ws, "bad_hello", "the first message must be a binary hello frame")
            return None
        try:
            frames = list(unpack_all(message.data, max_len=64 * 1024))
            kind, rid, op, fields = frames[0]
            if (kind, rid, op) != (REQUEST, 0, "hello") or not isinstance(fields, dict):
                raise FrameError("the first frame must be [0, 0, 'hello', {...}]")
        except (FrameError, ValueError, TypeError) as exc:
            await _refuse(ws, "bad_hello", f"not a hello frame: {exc}"[:300])
            return None
        versions = fields.get("versions")
        common = (
            [v for v in versions if v in PROTOCOL_VERSIONS] if isinstance(versions, list) else []
        )
        if not common:
            await _refuse(
                ws,
                "unsupported_version",
                f"this server speaks session protocol versions {list(PROTOCOL_VERSIONS)}, "
                f"the client offered {versions!r}"[:300],
                supported=list(PROTOCOL_VERSIONS),
            )
            return None
        try:
            interval = seconds_arg(fields.get("progress_interval", 5.0), "progress_interval")
        except OpError as exc:
            await _refuse(ws, "bad_hello", exc.message)
            return None
        state, resumed = self._session_for(fields)
        connection = Connection(self, ws, state, max(0.05, min(interval, 300.0)))
        await ws.send_bytes(
            pack(
                [
                    RESULT,
                    0,
                    {
                        "version": max(common),
                        "session": state.id,
                        "resume": state.resume_token,
                        "resumed": resumed,
                        "grace": self.grace,
                        "max_message": self.max_message_bytes,
                        "leases": sorted(state.leases),
                    },
                ]
            )
        )
        return connection

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

    def blob(self, prefix: str, events: list[Any], revision: int) -> bytes:
        return self._blobs.get(prefix, events, revision)


def _packed_events(events: list[Any]) -> bytes:
    """The events' blob as a msgpack bin object, ready to splice into a frame."""
    packed: bytes = msgpack.packb(encode_events(events), use_bin_type=True)
    return packed


async def _refuse(ws: web.WebSocketResponse, code: str, message: str, **extra: Any) -> None:
    """An error frame for the hello, then a close with the reason (never a hang)."""
    try:
        await ws.send_bytes(pack([ERROR, 0, code, message, extra]))
        await ws.close(code=CLOSE_BAD_HELLO, message=code.encode()[:120])
    except ConnectionError:
        pass


class Connection:
    """One WebSocket of a session: its reader loop, its outbox and its watches."""

    def __init__(
        self, hub: SessionHub, ws: web.WebSocketResponse, state: SessionState, interval: float
    ) -> None:
        self.hub = hub
        self.ws = ws
        self.state = state
        self.progress_interval = interval
        state.connection = self
        self._outbox: list[bytes] = []
        self._outbox_bytes = 0
        self._wake = asyncio.Event()
        self._watches: dict[int, ServedWatch] = {}
        self._ready: list[ServedWatch] = []  # watches with something to send (see _pump)
        self._pumping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._dispatching = False
        self._close_code = 1000
        self._close_reason = b""
        self._ticker: asyncio.TimerHandle | None = None

    # -- output

    def send(self, frame: list[Any]) -> None:
        self.send_bytes(pack(frame))

    def send_bytes(self, data: bytes) -> None:
        """Queue one encoded frame."""
        if self._closing:
            return
        self._outbox.append(data)
        self._outbox_bytes += len(data)
        if not self._dispatching and not self._pumping:  # those write their own (see run)
            self._wake.set()
        if self._outbox_bytes > MAX_OUTBOX_BYTES:
            self._outbox, self._outbox_bytes = [], 0
            self._finish(CLOSE_TOO_SLOW, b"the client does not read its answers")

    async def _writer(self) -> None:
        """Write what the reader and the watches queued, one message per batch; close the
        WebSocket (after the last answers) once :meth:`_finish` asked for it."""
        ws = self.ws
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._ready and not self._closing:
                await self._pump()
            if self._outbox:
                batch, self._outbox, self._outbox_bytes = self._outbox, [], 0
                await ws.send_bytes(batch[0] if len(batch) == 1 else b"".join(batch))
            if self._closing:
                await ws.close(code=self._close_code, message=self._close_reason)
                return

    async def _pump(self) -> None:
        """Every watch that has something: its frames, written in chunks as they come."""
        self._pumping = True
        try:
            ready, self._ready = self._ready, []
            for served in ready:
                served.pump()
                if self._outbox_bytes >= WATCH_CHUNK_BYTES and not self._closing:
                    batch, self._outbox, self._outbox_bytes = self._outbox, [], 0
                    await self.ws.send_bytes(b"".join(batch))
        finally:
            self._pumping = False

    def watch_ready(self, served: ServedWatch) -> None:
        """``served`` has something to send: pump it with the others (one wake-up for all)."""
        self._ready.append(served)
        self._wake.set()

    # -- input

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        writer = asyncio.ensure_future(self._writer())
        self._ticker = loop.call_later(self.progress_interval, self._tick)
        ws = self.ws
        try:
            while True:
                message = await ws.receive()  # (the async iterator is this, one call deeper)
                kind = message.type
                if kind is WSMsgType.BINARY:
                    self._dispatching = True
                    try:
                        self._received(message.data)
                    finally:
                        self._dispatching = False
                    if self._outbox and not self._closing:
                        # every frame of the message handled: its answers go out as one
                        # message, from here (no hand-over to the writer task)
                        batch, self._outbox, self._outbox_bytes = self._outbox, [], 0
                        await ws.send_bytes(batch[0] if len(batch) == 1 else b"".join(batch))
                elif kind is WSMsgType.TEXT:
                    self._bad_frame("session frames are binary messages (msgpack), not text")
                elif kind in _ENDED:
                    break
        finally:
            self._ticker.cancel()
            self._closing = True
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    def _received(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            for frame in unpack_all(data, max_len=self.hub.max_message_bytes):
                self._dispatch(frame)
        except FrameError as exc:
            self._bad_frame(str(exc))

    def _dispatch(self, frame: list[Any]) -> None:
        if len(frame) != 4 or frame[0] != REQUEST or not isinstance(frame[1], int):
            raise FrameError("a request frame is [0, id, op, args]")
        _, rid, name, args = frame
        op = OPS.get(name) if isinstance(name, str) else None
        if op is None:
            self.send([ERROR, rid, "unknown_op", f"no operation {str(name)[:100]!r}", {}])
            return
        if not isinstance(args, list):
            self.send([ERROR, rid, "bad_request", "the arguments must be an array", {}])
            return
        hub = self.hub
        start = time.perf_counter()
        try:
            value = op.handler(self, rid, args)
        except Exception as exc:
            frame = _error_frame(rid, exc)
            self.send(frame)
            hub.observe(name, _STATUS.get(frame[2], 500), time.perf_counter() - start)
            return
        durable = hub.durable
        if op.write and durable is not None:
            self._spawn(self._answer_when_durable(rid, value, durable))
        else:
            self.send([RESULT, rid, value])
        hub.observe(name, 200, time.perf_counter() - start)

    async def _answer_when_durable(
        self, rid: int, value: Any, durable: Callable[[], Awaitable[None]]
    ) -> None:
        try:
            await durable()
        except OSError as exc:
            log.error("storage failure answering a session write: %s", exc)
            self.send([ERROR, rid, "storage_error", f"the data directory failed: {exc}", {}])
            return
        self.send([RESULT, rid, value])

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _bad_frame(self, message: str) -> None:
        """A message that is not valid frames: say so, then close (the stream is not trusted)."""
        self.send([ERROR, 0, "bad_frame", message[:300], {}])
        self._finish(CLOSE_BAD_FRAME, b"bad_frame")

    def _finish(self, code: int, reason: bytes) -> None:
        """Write what is queued, then close with ``code``; later frames are ignored."""
        if not self._closing:
            self._close_code, self._close_reason = code, reason
            self._closing = True
            self._wake.set()

    # -- watches

    def open_watch(self, wid: int, prefix: str, start: int | None, snapshot: bool) -> Any:
        hub = self.hub
        if hub.watches + hub.other_watches() >= hub.max_watches:
            raise OpError(
                "too_many_watches", f"this server serves at most {hub.max_watches} watches"
            )
        if wid in self._watches:
            raise bad(f"watch id {wid} is already in use")
        engine = hub.engine
        result = engine.range(prefix, None) if snapshot else None
        watcher = engine.add_watcher(prefix, start, self)  # CompactedError -> an error answer
        served = ServedWatch(self, wid, prefix, watcher)
        self._watches[wid] = served
        hub.watches += 1
        served.woken()  # a start in the past has events to send (after this answer)
        created: list[Any] = [watcher.min_revision, engine.revision, None]
        if result is not None:
            created[2] = [result.count, [kv_to_wire(kv) for kv in result.kvs]]
        return created

    def close_watch(self, wid: int) -> None:
        served = self._watches.pop(wid, None)
        if served is not None:
            served.release()

    def forget_watch(self, served: ServedWatch) -> None:
        if self._watches.get(served.wid) is served:
            del self._watches[served.wid]

    def _tick(self) -> None:
        """Every progress interval: a progress frame for each watch idle since the last tick."""
        if self._closing:
            return
        for served in self._watches.values():
            if served.idle:
                served.progress_due = True
                served.woken()
            served.idle = True
        self._ticker = asyncio.get_running_loop().call_later(self.progress_interval, self._tick)

    # -- the end

    def replaced(self) -> None:
        """The session was resumed on another connection: end this one."""
        self._finish(CLOSE_REPLACED, b"resumed elsewhere")

    def shutdown(self) -> None:
        for served in self._watches.values():
            self.send([WATCH_END, served.wid, "closing", "the server is shutting down", {}])
        self._finish(1001, b"the server is shutting down")

    def end(self) -> None:
        self._closing = True
        for served in list(self._watches.values()):
            served.release()
        self._watches.clear()
        self._ready.clear()
        for task in list(self._tasks):
            task.cancel()


def _error_frame(rid: int, exc: Exception) -> list[Any]:
    if isinstance(exc, OpError):
        return [ERROR, rid, exc.code, exc.message, exc.extra]
    if isinstance(exc, CompactedError):
        return [
            ERROR,
            rid,
            "compacted",
            str(exc),
            {
                "requested_revision": exc.requested_revision,
                "compact_revision": exc.compact_revision,
            },
        ]
    if isinstance(exc, LeaseNotFoundError):
        return [ERROR, rid, "lease_not_found", str(exc), {"lease": exc.lease_id}]
    if isinstance(exc, StoreClosedError):
        return [ERROR, rid, "unavailable", str(exc), {}]
    if isinstance(exc, LogWriteError):  # the log cannot take the write: it was not made
        code = "insufficient_storage" if exc.full else "storage_unavailable"
        return [ERROR, rid, code, f"{exc.strerror}; the write was not applied", {}]
    if isinstance(exc, (ValueError, TypeError)):  # the engine's argument errors
        return [ERROR, rid, "bad_request", str(exc)[:500], {}]
    log.exception("session operation failed", exc_info=exc)
    return [ERROR, rid, "internal", f"the server failed: {type(exc).__name__}", {}]
