"""The thin etcd v3 client: endpoints and channels, one call helper, auth, error mapping.

One ``grpc.aio`` channel per endpoint (so host names, IPv6 and TLS all work), the current one
used until it fails; reads and writes that provably never reached etcd move on to the next
endpoint. A write whose outcome is unknown is never retried: it raises
:class:`~aioelastic.errors.WriteOutcomeUnknownError`. Every unary call goes through
:meth:`EtcdClient.call`, which applies the per-call deadline, the anyio cancellation shim
(grpc/grpc#43502), the auth token (re-authenticating once when etcd says it is invalid), and
translates gRPC errors into aioelastic's.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import (
    StoreAuthError,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
    ValueTooLargeError,
    WriteOutcomeUnknownError,
    WriteTimeoutError,
)
from ._liveness import CallAbandonedError, LeaderChangedError, Liveness, MemberHungError
from ._rpc import EtcdStub, grpc, rpc_pb2

__all__ = ["Endpoint", "EtcdClient", "TLSConfig", "parse_endpoint"]

log = logging.getLogger("aioelastic.store.etcd")

DEFAULT_PORT = 2379

#: gRPC channel options: quick reconnects after an outage (gRPC's default backoff grows to 120 s),
#: keep-alive pings that etcd's default enforcement policy (5 s minimum; more often and it sends
#: GOAWAY too_many_pings) accepts, also on an idle watch (gRPC sends only 2 pings without data by
#: default), and room for big catch-up watch responses. The pings are a backstop (a dead
#: connection in ~15 s); a hung member is found in ~1.5 s by our own pings (``_liveness``).
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
)

#: Codes with which etcd rejects a request before applying it (a failed write, not an unknown one).
_REJECTED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)

#: Fragments of UNAVAILABLE details that say the request never reached etcd's state machine:
#: the connection could not be made, or a member without a leader refused it up front (we send
#: ``hasleader: true``, so such a member rejects before proposing).
_NOT_SENT = (
    "failed to connect",
    "connection refused",
    "connections to all backends failing",
    "etcdserver: no leader",
    "name resolution",
    "dns resolution failed",
)


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """TLS settings: a CA bundle (None: the system roots), an optional client certificate."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str | None, what: str) -> bytes | None:
            if path is None:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as exc:
                raise ValueError(f"{what}: cannot read {path!r}: {exc.strerror}") from None

        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be given together (client certificate)")
        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file, "ca_file"),
            private_key=read(self.key_file, "key_file"),
            certificate_chain=read(self.cert_file, "cert_file"),
        )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One etcd member's client address."""

    host: str
    port: int

    @property
    def target(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return self.target


def parse_endpoint(text: str) -> Endpoint:
    """``host[:port]``, ``[v6]:port`` or ``http(s)://host:port`` (default port 2379)."""
    original = text
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"endpoint must look like host:port, got {original!r}")
    text = text.strip()
    for scheme in ("http://", "https://", "etcd://", "etcds://"):
        if text.startswith(scheme):
            text = text[len(scheme) :]
    text = text.rstrip("/")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"endpoint must look like [ipv6]:port, got {original!r}")
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    elif ":" in text:  # a bare IPv6 address
        host, port_text = text, ""
    else:
        host, port_text = text, ""
    if not host or "/" in host or "@" in host:
        raise ValueError(f"endpoint must look like host:port, got {original!r}")
    try:
        port = int(port_text) if port_text else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"endpoint {original!r} has a bad port {port_text!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"endpoint {original!r} has a port out of range")
    return Endpoint(host, port)


async def grpc_call(awaitable: Any) -> Any:
    """Await a grpc.aio unary call so that anyio cancel scopes work around it (grpc/grpc#43502).

    grpc.aio swallows the canceller's ``CancelledError`` and raises a new, message-less one that
    an anyio scope cannot recognise as its own; yielding once lets the scope re-deliver its own
    cancellation.
    """
    try:
        return await awaitable
    except asyncio.CancelledError as exc:
        if not exc.args:
            await asyncio.sleep(0)
        raise


class _Channel:
    """The channel to one member; :meth:`reset` replaces a hung one (``generation`` counts)."""

    __slots__ = ("channel", "endpoint", "generation", "liveness", "stub", "tls")

    def __init__(self, endpoint: Endpoint, tls: TLSConfig | None) -> None:
        self.endpoint = endpoint
        self.tls = tls
        self.generation = 0
        self.liveness = Liveness()
        self.channel, self.stub = self._open()

    def _open(self) -> tuple[grpc.aio.Channel, EtcdStub]:
        options = list(CHANNEL_OPTIONS)
        tls, target = self.tls, self.endpoint.target
        if tls is not None:
            if tls.server_name:
                options.append(("grpc.ssl_target_name_override", tls.server_name))  # type: ignore[arg-type]
            channel = grpc.aio.secure_channel(target, tls.credentials(), options)
        else:
            channel = grpc.aio.insecure_channel(target, options)
        return channel, EtcdStub(channel)

    def reset(self) -> grpc.aio.Channel:
        """Open a fresh channel in place of this one; return the old one (to be closed, which
        cancels every call and stream still on it)."""
        old = self.channel
        self.channel, self.stub = self._open()
        self.generation += 1
        return old


class EtcdClient:
    """Channels to the endpoints of one etcd cluster and the one helper every call goes through.

    ``timeout`` is each call's deadline (seconds); ``connect_timeout`` bounds the wait for a
    connection to one endpoint before the next is tried. ``ping_after``/``ping_timeout``: a
    member silent for ``ping_after`` seconds while a call or stream waits on it is pinged, and
    taken as hung when the ping gets no answer within ``ping_timeout`` (see ``_liveness``).
    Channels are created on first use, in the running event loop.
    """

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint],
        *,
        tls: TLSConfig | None = None,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 10.0,
        connect_timeout: float = 3.0,
        ping_after: float = 0.75,
        ping_timeout: float = 0.75,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        parsed = [e if isinstance(e, Endpoint) else parse_endpoint(e) for e in endpoints]
        if not parsed:
            raise ValueError("endpoints must name at least one etcd member (host:port)")
        for name, value in (
            ("timeout", timeout),
            ("connect_timeout", connect_timeout),
            ("ping_after", ping_after),
            ("ping_timeout", ping_timeout),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if (username is None) != (password is None):
            raise ValueError("username and password must be given together")
        self.endpoints: tuple[Endpoint, ...] = tuple(dict.fromkeys(parsed))
        self.tls = tls
        self.username = username
        self._password = password
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.ping_after = float(ping_after)
        self.ping_timeout = float(ping_timeout)
        self._closing: set[asyncio.Task[None]] = set()  # hung channels being closed
        self._channels: list[_Channel] | None = None
        self._current = 0
        self._token: str | None = None
        self._auth_lock: asyncio.Lock | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<EtcdClient {','.join(map(str, self.endpoints))}>"

    # -- channels

    @property
    def closed(self) -> bool:
        return self._closed

    def _all(self) -> list[_Channel]:
        if self._closed:
            raise StoreClosedError("the etcd client is closed")
        if self._channels is None:
            self._channels = [_Channel(e, self.tls) for e in self.endpoints]
        return self._channels

    def current(self) -> _Channel:
        return self._all()[self._current]

    def rotate(self, failed: _Channel) -> None:
        """Move on to the next endpoint (if ``failed`` is still the current one), skipping
        members taken as hung while another one is not."""
        channels = self._all()
        if channels[self._current] is not failed:
            return
        n = len(channels)
        following = [(self._current + i) % n for i in range(1, n + 1)]
        healthy = [i for i in following if channels[i].liveness.hung is None]
        self._current = (healthy or following)[0]

    # -- liveness (see _liveness)

    async def wait_answer(
        self, ch: _Channel, answer: asyncio.Future[Any], *, leader_bound: bool = False
    ) -> None:
        """Wait until ``answer`` (a call or a read on ``ch``) is done, pinging the member when it
        has been silent for ``ping_after``; :class:`MemberHungError` if the ping goes unanswered
        (the member is then marked hung and its channel replaced; with one endpoint only, there
        is nowhere else to go and this just waits). ``leader_bound`` (a call that
        needs the leader): :class:`LeaderChangedError` when a ping shows a newer raft term than
        the one it was sent in. ``answer`` is never cancelled here: that is the caller's."""
        loop = asyncio.get_running_loop()
        live, generation, start = ch.liveness, ch.generation, loop.time()
        sent_term = live.term
        if len(self.endpoints) == 1:
            # Nowhere else to go: giving up would only turn a slow write into an unknown one.
            await asyncio.wait((answer,))
        while not answer.done():
            wait = live.quiet_until(start, self.ping_after) - loop.time()
            if wait > 0:
                await asyncio.wait((answer,), timeout=wait)
                continue
            if ch.generation != generation:  # taken as hung by another caller meanwhile
                raise MemberHungError(self._hung_message(ch))
            ping = live.ping
            if ping is None:
                ping = live.ping = asyncio.ensure_future(self._ping(ch))
                ping.add_done_callback(lambda _: setattr(live, "ping", None))
            await asyncio.wait((answer, ping), return_when=asyncio.FIRST_COMPLETED)
            if answer.done():
                break
            if not ping.result():
                self.mark_hung(ch, generation)
                raise MemberHungError(self._hung_message(ch))
            if leader_bound and sent_term and live.term > sent_term:
                raise LeaderChangedError(
                    f"etcd elected a new leader (raft term {sent_term} -> {live.term}) while the "
                    f"call waited at {ch.endpoint}"
                )
            sent_term = sent_term or live.term  # nothing heard before: the first ping's term
        if not answer.cancelled() and answer.exception() is None:
            live.heard(answer.result())

    async def _ping(self, ch: _Channel) -> bool:
        """Whether the member answers a serializable read within ``ping_timeout``."""
        request = rpc_pb2.RangeRequest(key=b"\0", serializable=True, count_only=True, limit=1)
        token = (("token", self._token),) if self._token is not None else ()
        response = None
        try:
            response = await grpc_call(
                ch.stub.methods["Range"](
                    request, timeout=self.ping_timeout, metadata=token, wait_for_ready=False
                )
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.CANCELLED,
            ):
                return False
        ch.liveness.heard(response)  # any answer, an error included, comes from a live member
        return True

    def mark_hung(self, ch: _Channel, generation: int) -> None:
        """Take ``ch``'s member as hung (once per channel generation): move to another member and
        replace the channel, closing the old one (which ends every call still waiting on it)."""
        if ch.generation != generation or self._closed:
            return
        ch.liveness.hung = (
            f"etcd member {ch.endpoint} stopped answering (no answer to a ping within "
            f"{self.ping_timeout:g}s after {self.ping_after:g}s of silence)"
        )
        log.warning("%s; moving to another member", ch.liveness.hung)
        self.rotate(ch)
        task = asyncio.ensure_future(ch.reset().close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _hung_message(self, ch: _Channel) -> str:
        return ch.liveness.hung or f"etcd member {ch.endpoint} stopped answering"

    async def ensure_ready(self, ch: _Channel, timeout: float | None = None) -> bool:
        """Wait until ``ch`` is connected; False if a connection attempt failed or time ran out.

        A channel backing off after a failure waits for its next attempt (reconnects come at
        most ~2 s apart) and reports that attempt's outcome.
        """
        channel = ch.channel
        state = channel.get_state(try_to_connect=True)
        if state is grpc.ChannelConnectivity.READY:
            return True
        limit = self.connect_timeout if timeout is None else min(timeout, self.connect_timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        seen_attempt = state is not grpc.ChannelConnectivity.TRANSIENT_FAILURE
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                async with asyncio.timeout(left):
                    await channel.wait_for_state_change(state)
            except TimeoutError:
                return False
            state = channel.get_state(try_to_connect=True)
            if state is grpc.ChannelConnectivity.READY:
                return True
            if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                if seen_attempt:
                    return False
            elif state is grpc.ChannelConnectivity.SHUTDOWN:
                return False
            else:
                seen_attempt = True

    # -- auth

    @property
    def token(self) -> str | None:
        """The auth token the calls carry now (None before the first authentication, or without
        auth). A caller whose call was refused passes the token it used back as
        ``authenticate(stale=...)``, so a token another task already replaced is not replaced
        twice. A secret: never log it."""
        return self._token

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Metadata for a call: the auth token, and ``hasleader`` so that a member cut off from
        its leader refuses at once instead of hanging until the deadline."""
        if self._token is not None:
            return (("hasleader", "true"), ("token", self._token))
        return (("hasleader", "true"),)

    async def authenticate(self, *, stale: str | None = None) -> None:
        """Get a fresh token (unless another task already replaced ``stale``)."""
        if self.username is None or self._password is None:
            return
        if self._auth_lock is None:
            self._auth_lock = asyncio.Lock()
        async with self._auth_lock:
            if self._token is not None and self._token != stale:
                return
            request = rpc_pb2.AuthenticateRequest(name=self.username, password=self._password)
            # Sent without the old token: etcd 3.4 rejects Authenticate carrying a stale one.
            response = await self.call("Authenticate", request, write=False, authenticate=False)
            self._token = response.token

    # -- calls

    async def call(
        self,
        method: str,
        request: Any,
        *,
        write: bool,
        timeout: float | None = None,
        authenticate: bool = True,
    ) -> Any:
        """Call a unary etcd method, failing over between endpoints only where that is safe.

        ``write``: the call changes state (never retried once it may have reached etcd).
        """
        timeout = self.timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if authenticate and self._token is None and self.username is not None:
            await self.authenticate()
        channels = self._all()
        tries = len(channels)
        reauthenticated = False
        last: StoreError | None = None
        while tries > 0:
            ch = self.current()
            left = deadline - loop.time()
            if left <= 0:
                break
            if not await self.ensure_ready(ch, left):
                tries -= 1
                last = StoreConnectionError(
                    f"etcd {method}: cannot connect to {ch.endpoint} "
                    f"(tried for up to {self.connect_timeout:g}s)"
                )
                self.rotate(ch)
                continue
            metadata = self.metadata() if authenticate else (("hasleader", "true"),)
            token = self._token
            try:
                return await self._send(ch, method, request, max(left, 0.001), metadata)
            except CallAbandonedError as exc:
                if self._closed:
                    raise StoreClosedError("the etcd client is closed") from None
                if write:
                    raise WriteOutcomeUnknownError(
                        f"etcd {method} at {ch.endpoint}: {exc}; {_UNKNOWN}"
                    ) from None
                tries -= 1
                last = StoreConnectionError(f"etcd {method}: {exc}")
                continue  # a read: safe to repeat (on the next member if this one hung)
            except grpc.aio.AioRpcError as exc:
                code, details = exc.code(), exc.details() or ""
                if (
                    code is grpc.StatusCode.UNAUTHENTICATED
                    and authenticate
                    and self.username is not None
                    and not reauthenticated
                ):
                    # etcd rejected the token before doing anything: safe to retry once.
                    reauthenticated = True
                    await self.authenticate(stale=token)
                    continue
                if code is grpc.StatusCode.UNAVAILABLE and (not write or _not_sent(details)):
                    tries -= 1
                    last = StoreConnectionError(f"etcd {method} at {ch.endpoint}: {details}")
                    self.rotate(ch)
                    continue
                if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                    self.rotate(ch)  # slow or stuck: the next call tries another member
                raise self.map_error(exc, method, write=write, endpoint=ch.endpoint) from None
        if last is None:
            # Nothing was in flight when time ran out (a sent write that gets no answer raises
            # WriteTimeoutError above, from gRPC's deadline), so nothing was applied.
            raise StoreTimeoutError(f"etcd {method}: not sent within the {timeout:g}s deadline")
        raise last

    async def _send(
        self,
        ch: _Channel,
        method: str,
        request: Any,
        timeout: float,
        metadata: tuple[tuple[str, str], ...],
    ) -> Any:
        """One attempt on ``ch``: the answer, or ``AioRpcError``, or :class:`CallAbandonedError`
        when the member hung or the leader changed while it waited (see ``wait_answer``)."""
        generation = ch.generation
        rpc = asyncio.ensure_future(
            ch.stub.methods[method](
                request, timeout=timeout, metadata=metadata, wait_for_ready=False
            )
        )
        rpc.add_done_callback(_retrieve)
        try:
            await self.wait_answer(ch, rpc, leader_bound=True)
        finally:
            if not rpc.done():
                rpc.cancel()  # our caller was cancelled, or we gave up on the member
        if self._closed and _cancelled(rpc):
            raise StoreClosedError("the etcd client is closed")
        if ch.generation != generation and _cancelled(rpc):
            # the channel was closed under us: another caller found its member hung
            raise MemberHungError(self._hung_message(ch))
        return rpc.result()

    def map_error(
        self, exc: grpc.aio.AioRpcError, method: str, *, write: bool, endpoint: Endpoint
    ) -> Exception:
        """Translate a gRPC error into aioelastic's hierarchy (callers special-case the rest)."""
        code, details = exc.code(), exc.details() or ""
        where = f"etcd {method} at {endpoint}"
        if code is grpc.StatusCode.CANCELLED and self._closed:
            return StoreClosedError("the etcd client is closed")
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            if write:
                return WriteTimeoutError(f"{where}: no answer before the deadline; {_UNKNOWN}")
            return StoreTimeoutError(f"{where}: no answer before the deadline")
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or (
            code is grpc.StatusCode.INVALID_ARGUMENT
            and ("authentication failed" in details or "user name is empty" in details)
        ):
            return StoreAuthError(f"{where}: {details}")
        if code is grpc.StatusCode.INVALID_ARGUMENT and "too large" in details:
            return ValueTooLargeError(f"{where}: {details}")
        if write and code not in _REJECTED:
            return WriteOutcomeUnknownError(f"{where}: {code.name}: {details}; {_UNKNOWN}")
        if code is grpc.StatusCode.UNAVAILABLE:
            return StoreConnectionError(f"{where}: {details}")
        return StoreError(f"{where}: {code.name}: {details}")

    # -- streams

    async def open_stream(self, method: str) -> tuple[Any, _Channel]:
        """Open a bidirectional stream (Watch, LeaseKeepAlive) on a connected endpoint."""
        if self._token is None and self.username is not None:
            await self.authenticate()
        channels = self._all()
        for _ in range(len(channels)):
            ch = self.current()
            if await self.ensure_ready(ch):
                return ch.stub.methods[method](metadata=self.metadata()), ch
            self.rotate(ch)
        raise StoreConnectionError(
            f"etcd {method}: cannot connect to any of {', '.join(map(str, self.endpoints))}"
        )

    # -- lifecycle

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        channels, self._channels = self._channels, None
        if channels:
            await asyncio.gather(*(ch.channel.close() for ch in channels))
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


_UNKNOWN = "the write may or may not have been applied (read the key back)"


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Retrieve a finished call's outcome (an abandoned one is never reported unretrieved)."""
    if not future.cancelled():
        future.exception()


def _cancelled(future: asyncio.Future[Any]) -> bool:
    if future.cancelled():
        return True
    exc = future.exception()
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() is grpc.StatusCode.CANCELLED


def _not_sent(details: str) -> bool:
    lowered = details.lower()
    return any(fragment in lowered for fragment in _NOT_SENT)
