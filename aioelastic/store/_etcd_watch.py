"""The etcd backend's watch: one gRPC ``Watch`` stream per watch, resumed from the last delivered
revision + 1 after a reconnect (on another member if this one is hung or gone)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio

from .._etcd._call_watch import CallWatch
from .._etcd._liveness import MemberHungError
from .._etcd._rpc import grpc, rpc_pb2
from ..errors import CompactedError, StoreAuthError, StoreConnectionError, StoreTimeoutError
from ._base import Watch
from ._etcd_codec import prefix_range, to_event
from ._etcd_streams import retrieve
from ._types import WatchEvent

if TYPE_CHECKING:
    from .etcd import EtcdStore

__all__ = ["EtcdWatch"]


async def _read_watched(call: Any, watch: CallWatch | None, channel: Any) -> Any:
    """The next message of a stream being created; ``watch``'s verdict if it cancelled the
    stream (its member is hung), a connection error if the channel was closed under it."""
    try:
        response = await call.read()
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # our caller was cancelled; grpc.aio replaced its CancelledError by a message-less
            # one, which an anyio scope (ours: the creation's deadline, or the caller's) would
            # let out: yielding once lets the scope deliver its own (grpc/grpc#43502)
            if not exc.args:
                await asyncio.sleep(0)
            raise
        if watch is not None and watch.verdict is not None:
            raise watch.verdict from None
        # the channel was replaced: its member hung
        raise StoreConnectionError(f"etcd Watch at {channel.endpoint}: hung") from None
    channel.liveness.heard(response)
    return response


def _auth_refusal(response: Any) -> bool:
    reason: str = response.cancel_reason.lower()
    return any(
        word in reason
        for word in ("permission denied", "invalid auth token", "user name is empty", "auth")
    )


class EtcdWatch(Watch):
    """One etcd watch on its own gRPC stream; resumes from the last event's revision + 1."""

    def __init__(self, store: EtcdStore, prefix: str, start_revision: int | None) -> None:
        super().__init__(prefix, start_revision)
        self._store = store
        self._key, self._end = prefix_range(prefix)
        self._next_revision = 0  # the first revision not yet received (the resume point)
        self._start_revision = 0
        self._call: Any = None
        self._channel: Any = None
        # The pending read of ``_call``, in a task of its own: grpc cancels a whole stream when
        # a read is cancelled, so a caller's cancelled ``__anext__`` must not cancel the read
        # (it stays pending, and the next ``__anext__`` takes its answer).
        self._read: asyncio.Future[Any] | None = None
        self._pending: deque[WatchEvent] = deque()
        self._error: BaseException | None = None

    @property
    def start_revision(self) -> int:
        if not self._start_revision:
            raise RuntimeError("the watch has not started")
        return self._start_revision

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._drop()

    def _drop(self) -> None:
        call, self._call = self._call, None
        self._read = None
        if call is not None:
            call.cancel()  # ends a pending read too

    async def _start(self) -> None:
        store = self._store
        store._check_open()
        start = self.requested_revision
        if start is None:
            # Ask from an explicit revision so that "every change after __aenter__" is exact.
            start = await store._current_revision() + 1
        self._start_revision = self._next_revision = start
        store._watches.add(self)
        try:
            try:
                await self._connect()
            except MemberHungError:
                await self._connect()  # once more, on the member the client moved to
        except BaseException:
            store._watches.discard(self)
            raise

    async def _connect(self, *, reauthenticate: bool = True) -> None:
        """Open a stream on a reachable member and create the watch from ``_next_revision``."""
        client = self._store.client
        call, channel = await client.open_stream("Watch")
        token = client.token
        create = rpc_pb2.WatchCreateRequest(
            key=self._key, range_end=self._end, start_revision=self._next_revision
        )
        # until it is created the stream is read directly (any failure cancels it): watched by
        # one timer for a silent member (MemberHungError: the caller tries the next member)
        watch = client.watch_call(channel, call, leader_bound=False)
        try:
            with anyio.fail_after(client.timeout):
                await call.write(rpc_pb2.WatchRequest(create_request=create))
                while True:
                    response = await _read_watched(call, watch, channel)
                    if response is grpc.aio.EOF:
                        raise StoreConnectionError(f"etcd Watch at {channel.endpoint}: EOF")
                    if response.created:
                        break
        except grpc.aio.AioRpcError as exc:
            call.cancel()
            error = client.map_error(exc, "Watch", write=False, endpoint=channel.endpoint)
            if isinstance(error, StoreAuthError) and client.username is not None:
                await client.authenticate(stale=client.token)
            if exc.code() is grpc.StatusCode.UNAVAILABLE:
                client.rotate(channel)
            raise error from None
        except TimeoutError:
            call.cancel()
            client.rotate(channel)
            raise StoreTimeoutError(
                f"etcd Watch at {channel.endpoint}: not created within {client.timeout:g}s"
            ) from None
        except BaseException:
            call.cancel()
            raise
        finally:
            if watch is not None:
                watch.close()
        self._call = call
        self._read = None
        self._channel = channel
        if response.canceled:  # created and cancelled at once: compacted, or refused
            if _auth_refusal(response) and reauthenticate and client.username is not None:
                # etcd refuses a watch made with an expired token this way (not by failing the
                # call): get a new token and try once more.
                self._drop()
                await client.authenticate(stale=token)
                await self._connect(reauthenticate=False)
                return
            self._handle_cancel(response)
        self._take(response)

    def _handle_cancel(self, response: Any) -> None:
        self._drop()
        if response.compact_revision:
            raise CompactedError(self._next_revision, response.compact_revision)
        if _auth_refusal(response):
            raise StoreAuthError(f"etcd Watch: {response.cancel_reason}")
        # Anything else (e.g. the member lost its leader): reconnect elsewhere.

    def _take(self, response: Any) -> None:
        for pb in response.events:
            event = to_event(pb)
            if event.revision >= self._next_revision:
                self._pending.append(event)
        if response.events:
            self._next_revision = max(self._next_revision, response.events[-1].kv.mod_revision + 1)

    async def _reconnect(self) -> None:
        """Re-establish the watch, backing off, until ``watch_reconnect_timeout`` runs out."""
        store = self._store
        loop = asyncio.get_running_loop()
        deadline = loop.time() + store.watch_reconnect_timeout
        delay = 0.05
        while True:
            store._check_open()
            try:
                await self._connect()
                return
            except (StoreConnectionError, StoreTimeoutError) as exc:
                if loop.time() + delay > deadline:
                    raise StoreConnectionError(
                        f"etcd watch on {self.prefix!r} lost and not re-established within "
                        f"{store.watch_reconnect_timeout:g}s (resume from revision "
                        f"{self._next_revision}): {exc}"
                    ) from None
            except StoreAuthError:
                if store.client.username is None or loop.time() + delay > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _next(self) -> WatchEvent:
        while not self._pending:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise StopAsyncIteration
            if self._call is None:
                await self._reconnect()
                continue
            call = self._call
            read = self._read
            if read is None:
                read = self._read = asyncio.ensure_future(call.read())
                read.add_done_callback(retrieve)
            try:
                # Events may be rare: a silent member is pinged, and left if it is hung.
                await self._store.client.wait_answer(self._channel, read)
                response = read.result()
            except MemberHungError:
                self._drop()  # resumed on another member from _next_revision: nothing skipped
                continue
            except grpc.aio.AioRpcError as exc:
                if self._error is not None:
                    raise self._error from None
                self._drop()
                if exc.code() is grpc.StatusCode.UNAUTHENTICATED:
                    await self._store.client.authenticate(stale=self._store.client.token)
                elif exc.code() is grpc.StatusCode.UNAVAILABLE and self._channel is not None:
                    self._store.client.rotate(self._channel)
                continue
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not read.done() or (task is not None and task.cancelling()):
                    # our caller was cancelled (also when the read ended in the same loop turn:
                    # its answer is then taken by the next call): the read goes on
                    raise
                # the read ended because the stream was cancelled: by _drop (failed, closed)
                if self._error is not None:
                    raise self._error from None
                if self._call is call:  # cancelled under us otherwise: open it again
                    self._drop()
                continue
            if self._read is read:
                self._read = None
            if response is grpc.aio.EOF:
                self._drop()
                continue
            if response.canceled:
                self._handle_cancel(response)
                continue
            self._take(response)
        return self._pending.popleft()

    async def _aclose(self) -> None:
        self._store._watches.discard(self)
        self._drop()
