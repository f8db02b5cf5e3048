"""The channels to one cluster's members: one ``grpc.aio`` channel per endpoint, opened on first
use (a client that never fails over opens one), the current one used until it fails, and the
pings that find a hung member (see ``_liveness``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import StoreClosedError
from ._endpoints import Endpoint, TLSConfig
from ._liveness import LeaderChangedError, MemberHungError, member_liveness
from ._rpc import EtcdStub, grpc, rpc_pb2

__all__ = ["CHANNEL_OPTIONS", "MemberChannel", "MemberChannels", "grpc_call"]

log = logging.getLogger("aioelastic.store.etcd")

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


class MemberChannel:
    """The channel to one member, opened on first use (a client that never fails over opens
    one channel, not one per endpoint); :meth:`reset` replaces a hung one (``generation``
    counts)."""

    __slots__ = ("_channel", "_stub", "endpoint", "generation", "liveness", "tls")

    def __init__(self, endpoint: Endpoint, tls: TLSConfig | None) -> None:
        self.endpoint = endpoint
        self.tls = tls
        self.generation = 0
        self.liveness = member_liveness(endpoint.target)
        self._channel: grpc.aio.Channel | None = None
        self._stub: EtcdStub | None = None

    @property
    def opened(self) -> bool:
        return self._channel is not None

    @property
    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel, self._stub = self._open()
        return self._channel

    @property
    def stub(self) -> EtcdStub:
        if self._stub is None:
            self._channel, self._stub = self._open()
        return self._stub

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

    def reset(self) -> grpc.aio.Channel | None:
        """Drop this channel for a fresh one (opened on next use); return the old one (to be
        closed, which cancels every call and stream still on it), None if it was never opened."""
        old, self._channel, self._stub = self._channel, None, None
        self.generation += 1
        return old


class MemberChannels:
    """A channel per endpoint (created on first use, in the running event loop; each opens its
    ``grpc.aio`` channel on first use too) and which one is current. ``connect_timeout`` bounds
    the wait for a connection to one endpoint; ``ping_after``/``ping_timeout``: a member silent
    for ``ping_after`` seconds while a call or stream waits on it is pinged, and taken as hung
    when the ping gets no answer within ``ping_timeout`` (nor anything else meanwhile).
    ``token`` gives the auth token the pings carry."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        tls: TLSConfig | None,
        *,
        connect_timeout: float,
        ping_after: float,
        ping_timeout: float,
        token: Callable[[], str | None],
    ) -> None:
        self.endpoints = tuple(endpoints)
        self.tls = tls
        self.connect_timeout = connect_timeout
        self.ping_after = ping_after
        self.ping_timeout = ping_timeout
        self._token = token
        self._closing: set[asyncio.Task[None]] = set()  # hung channels being closed
        self._channels: list[MemberChannel] | None = None
        self._current = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def members(self) -> list[MemberChannel]:
        if self._closed:
            raise StoreClosedError("the etcd client is closed")
        if self._channels is None:
            self._channels = [MemberChannel(e, self.tls) for e in self.endpoints]
        return self._channels

    def current(self) -> MemberChannel:
        return self.members()[self._current]

    def rotate(self, failed: MemberChannel) -> None:
        """Move on to the next endpoint (if ``failed`` is still the current one), skipping
        members taken as hung while another one is not."""
        channels = self.members()
        if channels[self._current] is not failed:
            return
        n = len(channels)
        following = [(self._current + i) % n for i in range(1, n + 1)]
        healthy = [i for i in following if channels[i].liveness.hung is None]
        self._current = (healthy or following)[0]

    # -- liveness (see _liveness)

    async def wait_answer(
        self, ch: MemberChannel, answer: asyncio.Future[Any], *, leader_bound: bool = False
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
                raise MemberHungError(self.hung_message(ch))
            ping = self.shared_ping(ch)
            await asyncio.wait((answer, ping), return_when=asyncio.FIRST_COMPLETED)
            if answer.done():
                break
            alive = ping.result()
            if alive is None:  # the ping's own client closed under it: no verdict, ask again
                continue
            if not alive:
                self.mark_hung(ch, generation)
                raise MemberHungError(self.hung_message(ch))
            if leader_bound and sent_term and live.term > sent_term:
                raise LeaderChangedError(
                    f"etcd elected a new leader (raft term {sent_term} -> {live.term}) while the "
                    f"call waited at {ch.endpoint}"
                )
            sent_term = sent_term or live.term  # nothing heard before: the first ping's term
        if not answer.cancelled() and answer.exception() is None:
            live.heard(answer.result())

    def shared_ping(self, ch: MemberChannel) -> asyncio.Future[bool | None]:
        """The ping of ``ch``'s member in flight, started if none is (one per member, shared by
        every waiter; never cancel it: wait on it with ``asyncio.wait``)."""
        live = ch.liveness
        ping = live.ping
        if ping is None:
            ping = live.ping = asyncio.ensure_future(self._ping(ch))
            ping.add_done_callback(lambda _: setattr(live, "ping", None))
        return ping

    async def _ping(self, ch: MemberChannel) -> bool | None:
        """Whether the member answers a serializable read within ``ping_timeout``, or answers
        anything else meanwhile (busy, not hung); None when this client closed under the ping
        (no verdict for the other clients sharing it)."""
        request = rpc_pb2.RangeRequest(key=b"\0", serializable=True, count_only=True, limit=1)
        token = self._token()
        metadata = (("token", token),) if token is not None else ()
        live, response = ch.liveness, None
        heard_before = live.last_heard
        try:
            response = await grpc_call(
                ch.stub.methods["Range"](
                    request, timeout=self.ping_timeout, metadata=metadata, wait_for_ready=False
                )
            )
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if self._closed and code is grpc.StatusCode.CANCELLED:
                return None
            if code is grpc.StatusCode.DEADLINE_EXCEEDED and live.last_heard > heard_before:
                return True  # other answers came meanwhile: queued behind them, not hung
            if code in (
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.CANCELLED,
            ):
                return False
        live.heard(response)  # any answer, an error included, comes from a live member
        return True

    def mark_hung(self, ch: MemberChannel, generation: int) -> None:
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
        old = ch.reset()
        if old is not None:
            task = asyncio.ensure_future(old.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def hung_message(self, ch: MemberChannel) -> str:
        return ch.liveness.hung or f"etcd member {ch.endpoint} stopped answering"

    async def ensure_ready(self, ch: MemberChannel, timeout: float | None = None) -> bool:
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

    async def aclose(self) -> None:
        """Close every channel (which ends the calls and streams on them); idempotent."""
        if self._closed:
            return
        self._closed = True
        channels, self._channels = self._channels, None
        if channels:
            await asyncio.gather(*(ch.channel.close() for ch in channels if ch.opened))
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
