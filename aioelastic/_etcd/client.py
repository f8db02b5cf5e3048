"""The thin etcd v3 client: one call helper, auth, streams; over the members' channels.

One ``grpc.aio`` channel per endpoint (so host names, IPv6 and TLS all work), opened on first
use, the current one used until it fails; reads and writes that provably never reached etcd
move on to the next endpoint. A write whose outcome is unknown is never retried: it raises
:class:`~aioelastic.errors.WriteOutcomeUnknownError`. Every unary call goes through
:meth:`EtcdClient.call`, which applies the per-call deadline, the anyio cancellation shim
(grpc/grpc#43502), the auth token (re-authenticating once when etcd says it is invalid), and
translates gRPC errors into aioelastic's. The channels and the pings that find a hung member
are in ``_channels.py``, endpoints and TLS in ``_endpoints.py``, the error mapping in
``_errors.py``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from anyio.abc import AsyncResource

from ..errors import (
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
    WriteOutcomeUnknownError,
)
from ._call_watch import CallWatch
from ._channels import MemberChannel, MemberChannels, grpc_call
from ._endpoints import Endpoint, TLSConfig, parse_endpoint
from ._errors import UNKNOWN, map_error, not_sent
from ._liveness import CallAbandonedError, MemberHungError
from ._rpc import grpc, rpc_pb2

__all__ = ["Endpoint", "EtcdClient", "TLSConfig", "parse_endpoint"]


class EtcdClient(AsyncResource):
    """Channels to the endpoints of one etcd cluster and the one helper every call goes through.

    ``timeout`` is each call's deadline (seconds); ``connect_timeout`` bounds the wait for a
    connection to one endpoint before the next is tried. ``ping_after``/``ping_timeout``: a
    member silent for ``ping_after`` seconds while a call or stream waits on it is pinged, and
    taken as hung when the ping gets no answer within ``ping_timeout`` (see ``_liveness``).
    Channels are created on first use, in the running event loop (``_channels.py``).
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
        self._token: str | None = None
        self._auth_lock: asyncio.Lock | None = None
        self._channels = MemberChannels(
            self.endpoints,
            tls,
            connect_timeout=self.connect_timeout,
            ping_after=self.ping_after,
            ping_timeout=self.ping_timeout,
            token=lambda: self._token,
        )

    def __repr__(self) -> str:
        return f"<EtcdClient {','.join(map(str, self.endpoints))}>"

    # -- channels (see _channels)

    @property
    def closed(self) -> bool:
        return self._channels.closed

    def current(self) -> MemberChannel:
        return self._channels.current()

    def rotate(self, failed: MemberChannel) -> None:
        """Move on to the next endpoint (if ``failed`` is still the current one)."""
        self._channels.rotate(failed)

    async def ensure_ready(self, ch: MemberChannel, timeout: float | None = None) -> bool:
        """Wait until ``ch`` is connected; False if a connection attempt failed or time ran out."""
        return await self._channels.ensure_ready(ch, timeout)

    async def wait_answer(
        self, ch: MemberChannel, answer: asyncio.Future[Any], *, leader_bound: bool = False
    ) -> None:
        """Wait until ``answer`` (a call or a read on ``ch``) is done, pinging a silent member
        (:class:`MemberHungError`, :class:`LeaderChangedError`: see ``_channels.py``)."""
        await self._channels.wait_answer(ch, answer, leader_bound=leader_bound)

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
        tries = len(self._channels.members())
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
                last = self._abandoned(exc, method, ch, write=write)
                tries -= 1  # a read: safe to repeat (on the next member if this one hung)
            except grpc.aio.AioRpcError as exc:
                if not reauthenticated and self._token_refused(exc, authenticate):
                    # etcd rejected the token before doing anything: safe to retry once.
                    reauthenticated = True
                    await self.authenticate(stale=token)
                    continue
                last = self._unsent(exc, method, ch, write=write)
                tries -= 1
        if last is None:
            # Nothing was in flight when time ran out (a sent write that gets no answer raises
            # WriteTimeoutError above, from gRPC's deadline), so nothing was applied.
            raise StoreTimeoutError(f"etcd {method}: not sent within the {timeout:g}s deadline")
        raise last

    def _abandoned(
        self, exc: CallAbandonedError, method: str, ch: MemberChannel, *, write: bool
    ) -> StoreError:
        """A call given up on its member: the error to try the next member with (a read), or
        raised (a write's outcome is unknown; the client was closed)."""
        if self.closed:
            raise StoreClosedError("the etcd client is closed") from None
        if write:
            raise WriteOutcomeUnknownError(
                f"etcd {method} at {ch.endpoint}: {exc}; {UNKNOWN}"
            ) from None
        return StoreConnectionError(f"etcd {method}: {exc}")

    def _token_refused(self, exc: grpc.aio.AioRpcError, authenticate: bool) -> bool:
        return (
            exc.code() is grpc.StatusCode.UNAUTHENTICATED
            and authenticate
            and self.username is not None
        )

    def _unsent(
        self, exc: grpc.aio.AioRpcError, method: str, ch: MemberChannel, *, write: bool
    ) -> StoreError:
        """A call etcd failed: the error to try the next member with (it never reached etcd,
        or it is a read), or raised (translated)."""
        code, details = exc.code(), exc.details() or ""
        if code is grpc.StatusCode.UNAVAILABLE and (not write or not_sent(details)):
            self.rotate(ch)
            return StoreConnectionError(f"etcd {method} at {ch.endpoint}: {details}")
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            self.rotate(ch)  # slow or stuck: the next call tries another member
        raise self.map_error(exc, method, write=write, endpoint=ch.endpoint) from None

    def watch_call(self, ch: MemberChannel, call: Any, *, leader_bound: bool) -> CallWatch | None:
        """A :class:`CallWatch` of ``call`` on ``ch`` (None with one endpoint: it has nowhere
        else to go, and giving up would only turn a slow write into an unknown one)."""
        if len(self._channels.endpoints) == 1:
            return None
        return CallWatch(self._channels, ch, call, leader_bound=leader_bound)

    async def _send(
        self,
        ch: MemberChannel,
        method: str,
        request: Any,
        timeout: float,
        metadata: tuple[tuple[str, str], ...],
    ) -> Any:
        """One attempt on ``ch``: the answer, or ``AioRpcError``, or :class:`CallAbandonedError`
        when the member hung or the leader changed while it waited (see ``_call_watch``).

        The call is awaited directly, watched by one timer (no task, no ``asyncio.wait``: most
        calls are answered before it is due)."""
        generation = ch.generation
        call = ch.stub.methods[method](
            request, timeout=timeout, metadata=metadata, wait_for_ready=False
        )
        channels = self._channels
        watch = self.watch_call(ch, call, leader_bound=True)
        try:
            response = await grpc_call(call)
        except (asyncio.CancelledError, grpc.aio.AioRpcError) as exc:
            if (
                isinstance(exc, grpc.aio.AioRpcError)
                and exc.code() is not grpc.StatusCode.CANCELLED
            ):
                raise
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller was cancelled (grpc.aio cancelled the call with it)
            if watch is not None and watch.verdict is not None:
                raise watch.verdict from None
            if self.closed:
                raise StoreClosedError("the etcd client is closed") from None
            if ch.generation != generation:
                # the channel was closed under us: another caller found its member hung
                raise MemberHungError(channels.hung_message(ch)) from None
            raise
        finally:
            if watch is not None:
                watch.close()
        ch.liveness.heard(response)
        return response

    def map_error(
        self, exc: grpc.aio.AioRpcError, method: str, *, write: bool, endpoint: Endpoint
    ) -> Exception:
        """Translate a gRPC error into aioelastic's hierarchy (callers special-case the rest)."""
        return map_error(exc, method, write=write, endpoint=endpoint, closed=self.closed)

    # -- streams

    async def open_stream(self, method: str) -> tuple[Any, MemberChannel]:
        """Open a bidirectional stream (Watch, LeaseKeepAlive) on a connected endpoint."""
        if self._token is None and self.username is not None:
            await self.authenticate()
        channels = self._channels.members()
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
        await self._channels.aclose()
