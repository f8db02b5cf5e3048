"""The etcd backend: the store protocol over etcd's native v3 gRPC API.

``etcd://host:2379[,host2:2379...]`` (``etcds://`` for TLS). The semantics are etcd's own (the
store protocol is modelled on them), so this module is a thin mapping: a compare-and-swap is one
``Txn`` (compare ``mod_revision``, put on success, read on failure); a watch is one gRPC watch
stream that resumes from the last delivered revision + 1 after a reconnect; a kept lease has one
long-lived ``LeaseKeepAlive`` stream. Writes whose outcome is unknown raise
:class:`~aioelastic.errors.WriteOutcomeUnknownError` and are never retried.

Differences from the memory backend a user may notice: a fresh etcd starts at revision 1, not 0;
lease TTLs are whole seconds (fractional TTLs are rounded up, and etcd may raise very short ones to
its minimum), and ``remaining`` is whole seconds too.

Needs grpcio and protobuf: ``pip install 'aioelastic[etcd]'``.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections import deque
from collections.abc import Sequence
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote

import anyio

from .._etcd._liveness import CallAbandonedError, MemberHungError
from .._etcd._rpc import grpc, kv_pb2, rpc_pb2
from .._etcd.client import EtcdClient, TLSConfig
from .._secrets import ETCD_PASSWORD_ENV, ETCD_PASSWORD_FILE_ENV, read_secret_file, redact_url
from ..errors import (
    CompactedError,
    LeaseNotFoundError,
    StoreAuthError,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
)
from ._base import Store, Watch
from ._txn import (
    Compare,
    Delete,
    DeleteResult,
    Get,
    GetResult,
    OpResult,
    Put,
    PutResult,
    Range,
    Txn,
    TxnOp,
    TxnResult,
)
from ._types import (
    CasResult,
    EventType,
    KeyValue,
    LeaseGrant,
    LeaseStatus,
    RangeResult,
    WatchEvent,
)

__all__ = ["EtcdStore", "TLSConfig", "open_etcd_store"]

_ALL = b"\0"  # as key and range_end: every key


def _enc(key: str, name: str = "key") -> bytes:
    try:
        return key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ValueError(f"{name} {key!r} cannot be encoded as UTF-8") from None


def _dec(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _prefix_range(prefix: str) -> tuple[bytes, bytes]:
    """``(key, range_end)`` covering every key that starts with ``prefix`` (etcd's rule)."""
    if not prefix:
        return _ALL, _ALL
    raw = bytearray(_enc(prefix, "prefix"))
    key = bytes(raw)
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return key, bytes(raw)
        raw.pop()
    return key, _ALL


def _kv(pb: Any) -> KeyValue:
    return KeyValue(
        _dec(pb.key), bytes(pb.value), pb.create_revision, pb.mod_revision, pb.version, pb.lease
    )


def _event(pb: Any) -> WatchEvent:
    if pb.type == kv_pb2.Event.DELETE:
        return WatchEvent(
            EventType.DELETE, KeyValue(_dec(pb.kv.key), b"", 0, pb.kv.mod_revision, 0)
        )
    return WatchEvent(EventType.PUT, _kv(pb.kv))


_COMPARE_OPS = {
    "==": rpc_pb2.Compare.EQUAL,
    "!=": rpc_pb2.Compare.NOT_EQUAL,
    "<": rpc_pb2.Compare.LESS,
    ">": rpc_pb2.Compare.GREATER,
}
_COMPARE_TARGETS = {
    "value": rpc_pb2.Compare.VALUE,
    "version": rpc_pb2.Compare.VERSION,
    "create_revision": rpc_pb2.Compare.CREATE,
    "mod_revision": rpc_pb2.Compare.MOD,
    "lease": rpc_pb2.Compare.LEASE,
}


def _compare_pb(compare: Compare) -> Any:
    fields: dict[str, Any] = {compare.target: compare.operand}  # the oneof field: our name
    return rpc_pb2.Compare(
        result=_COMPARE_OPS[compare.op],
        target=_COMPARE_TARGETS[compare.target],
        key=_enc(compare.key),
        **fields,
    )


def _op_pb(op: TxnOp) -> Any:
    if isinstance(op, Put):
        put = rpc_pb2.PutRequest(key=_enc(op.key), value=op.value, lease=op.lease, prev_kv=True)
        return rpc_pb2.RequestOp(request_put=put)
    if isinstance(op, Get):
        return rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=_enc(op.key)))
    if isinstance(op, Range):
        key, end = _prefix_range(op.prefix)
        ranged = rpc_pb2.RangeRequest(key=key, range_end=end, limit=op.limit or 0)
        return rpc_pb2.RequestOp(request_range=ranged)
    if isinstance(op, Delete):
        delete = rpc_pb2.DeleteRangeRequest(key=_enc(op.key))
    else:
        start, end = _prefix_range(op.prefix)
        delete = rpc_pb2.DeleteRangeRequest(key=start, range_end=end)
    return rpc_pb2.RequestOp(request_delete_range=delete)


def _op_result(op: TxnOp, pb: Any, revision: int) -> OpResult:
    """One operation's result from its ``ResponseOp``; ``revision``: the transaction's."""
    if isinstance(op, Put):
        put = pb.response_put
        if put.HasField("prev_kv"):
            prev = _kv(put.prev_kv)
            version = prev.version + 1
            kv = KeyValue(op.key, op.value, prev.create_revision, revision, version, op.lease)
            return PutResult(kv, prev)
        return PutResult(KeyValue(op.key, op.value, revision, revision, 1, op.lease))
    if isinstance(op, Get):
        kvs = pb.response_range.kvs
        return GetResult(_kv(kvs[0]) if kvs else None)
    if isinstance(op, Range):
        ranged = pb.response_range
        return RangeResult(tuple(map(_kv, ranged.kvs)), revision, ranged.count, ranged.more)
    return DeleteResult(pb.response_delete_range.deleted)


class _KeepAliveStream:
    """One lease's long-lived ``LeaseKeepAlive`` stream: one ping in flight at a time."""

    __slots__ = ("call", "channel", "lock")

    def __init__(self) -> None:
        self.call: Any = None
        self.channel: Any = None
        self.lock = asyncio.Lock()

    def drop(self) -> None:
        call, self.call = self.call, None
        if call is not None:
            call.cancel()


class EtcdStore(Store):
    """A :class:`~aioelastic.store.Store` on an etcd v3 cluster, spoken to over gRPC.

    ``endpoints``: ``["host:2379", ...]`` (or one comma-separated string); calls go to one
    member and fail over to the next when it cannot be reached. ``tls``: a :class:`TLSConfig`
    (CA bundle, optional client certificate) or None for plaintext. ``username``/``password``:
    etcd auth; the token is refreshed transparently when etcd invalidates it. ``timeout``: every
    call's deadline in seconds. ``watch_reconnect_timeout``: how long a watch keeps trying to
    re-establish itself after losing its stream before raising ``StoreConnectionError``.
    ``ping_after``/``ping_timeout``: a member that stays silent for ``ping_after`` seconds while
    a call, watch or keep-alive waits on it is pinged; no answer within ``ping_timeout`` and it
    is taken as hung: reads and watches move to another member, a write waiting on it raises
    ``WriteOutcomeUnknownError`` (docs/etcd.md, "A hung member").
    """

    features = frozenset({"compaction"})

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        *,
        tls: TLSConfig | None = None,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 10.0,
        connect_timeout: float = 3.0,
        watch_reconnect_timeout: float = 60.0,
        ping_after: float = 0.75,
        ping_timeout: float = 0.75,
    ) -> None:
        super().__init__()
        self.client = EtcdClient(
            [endpoints] if isinstance(endpoints, str) else endpoints,
            tls=tls,
            username=username,
            password=password,
            timeout=timeout,
            connect_timeout=connect_timeout,
            ping_after=ping_after,
            ping_timeout=ping_timeout,
        )
        if (
            isinstance(watch_reconnect_timeout, bool)
            or not isinstance(watch_reconnect_timeout, (int, float))
            or not watch_reconnect_timeout >= 0
        ):
            raise ValueError(
                f"watch_reconnect_timeout must be a number of seconds >= 0, "
                f"got {watch_reconnect_timeout!r}"
            )
        self.watch_reconnect_timeout = float(watch_reconnect_timeout)
        self._keepalives: dict[int, _KeepAliveStream] = {}
        self._watches: set[_EtcdWatch] = set()

    def __repr__(self) -> str:
        scheme = "etcds" if self.client.tls is not None else "etcd"
        state = " closed" if self._closed else ""
        return f"<EtcdStore {scheme}://{','.join(map(str, self.client.endpoints))}{state}>"

    async def connect(self) -> None:
        """Check that the cluster answers (and authenticate): fail fast on a bad URL or password."""
        self._check_open()
        await self.client.authenticate()
        await self._current_revision()

    # -- reads

    async def _get(self, key: str) -> KeyValue | None:
        response = await self.client.call("Range", rpc_pb2.RangeRequest(key=_enc(key)), write=False)
        return _kv(response.kvs[0]) if response.kvs else None

    async def _range(self, prefix: str, limit: int | None) -> RangeResult:
        key, end = _prefix_range(prefix)
        request = rpc_pb2.RangeRequest(key=key, range_end=end, limit=limit or 0)
        response = await self.client.call("Range", request, write=False)
        return RangeResult(
            tuple(_kv(kv) for kv in response.kvs),
            response.header.revision,
            response.count,
            response.more,
        )

    async def _current_revision(self) -> int:
        request = rpc_pb2.RangeRequest(key=_ALL, count_only=True)
        response = await self.client.call("Range", request, write=False)
        revision: int = response.header.revision
        return revision

    # -- writes

    async def _put(self, key: str, value: bytes, lease: int) -> int:
        request = rpc_pb2.PutRequest(key=_enc(key), value=value, lease=lease)
        try:
            response = await self.client.call("Put", request, write=True)
        except StoreError as exc:
            raise _lease_error(exc, lease) from None
        revision: int = response.header.revision
        return revision

    async def _delete(self, key: str, prefix: bool) -> int:
        if prefix:
            start, end = _prefix_range(key)
            request = rpc_pb2.DeleteRangeRequest(key=start, range_end=end)
        else:
            request = rpc_pb2.DeleteRangeRequest(key=_enc(key))
        response = await self.client.call("DeleteRange", request, write=True)
        deleted: int = response.deleted
        return deleted

    async def _compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, lease: int
    ) -> CasResult:
        raw = _enc(key)
        request = rpc_pb2.TxnRequest(
            compare=[
                rpc_pb2.Compare(
                    result=rpc_pb2.Compare.EQUAL,
                    target=rpc_pb2.Compare.MOD,
                    key=raw,
                    mod_revision=expected_mod_revision,
                )
            ],
            success=[
                rpc_pb2.RequestOp(
                    request_put=rpc_pb2.PutRequest(key=raw, value=value, lease=lease, prev_kv=True)
                )
            ],
            failure=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=raw))],
        )
        try:
            response = await self.client.call("Txn", request, write=True)
        except StoreError as exc:
            raise _lease_error(exc, lease) from None
        revision = response.header.revision
        if not response.succeeded:
            kvs = response.responses[0].response_range.kvs
            return CasResult(False, revision, _kv(kvs[0]) if kvs else None)
        put = response.responses[0].response_put
        if put.HasField("prev_kv"):
            prev = put.prev_kv
            kv = KeyValue(key, value, prev.create_revision, revision, prev.version + 1, lease)
        else:
            kv = KeyValue(key, value, revision, revision, 1, lease)
        return CasResult(True, revision, kv)

    async def _compare_and_delete(self, key: str, expected_mod_revision: int) -> CasResult:
        raw = _enc(key)
        request = rpc_pb2.TxnRequest(
            compare=[
                rpc_pb2.Compare(
                    result=rpc_pb2.Compare.EQUAL,
                    target=rpc_pb2.Compare.MOD,
                    key=raw,
                    mod_revision=expected_mod_revision,
                )
            ],
            success=[rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=raw))],
            failure=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=raw))],
        )
        response = await self.client.call("Txn", request, write=True)
        revision = response.header.revision
        if not response.succeeded:
            kvs = response.responses[0].response_range.kvs
            return CasResult(False, revision, _kv(kvs[0]) if kvs else None)
        return CasResult(True, revision, None)

    async def _txn(self, txn: Txn) -> TxnResult:
        request = rpc_pb2.TxnRequest(
            compare=[_compare_pb(c) for c in txn.compare],
            success=[_op_pb(op) for op in txn.success],
            failure=[_op_pb(op) for op in txn.failure],
        )
        # only reads in both branches: a read (moved to another member on failure); else a write
        write = not all(isinstance(op, (Get, Range)) for op in (*txn.success, *txn.failure))
        try:
            response = await self.client.call("Txn", request, write=write)
        except StoreError as exc:
            leases = [op.lease for op in (*txn.success, *txn.failure) if isinstance(op, Put)]
            if "lease not found" in str(exc):
                raise LeaseNotFoundError(next((lease for lease in leases if lease), 0)) from None
            raise
        revision: int = response.header.revision
        ops = txn.success if response.succeeded else txn.failure
        results = tuple(
            _op_result(op, pb, revision) for op, pb in zip(ops, response.responses, strict=True)
        )
        return TxnResult(bool(response.succeeded), revision, results)

    # -- history

    async def _compact(self, revision: int) -> None:
        request = rpc_pb2.CompactionRequest(revision=revision)
        try:
            await self.client.call("Compact", request, write=True)
        except StoreError as exc:
            text = str(exc)
            if "future revision" in text:
                current = await self._current_revision()
                raise ValueError(
                    f"revision {revision} is in the future (current revision {current})"
                ) from None
            if "compacted" in text:
                raise CompactedError(revision, await self._compact_revision()) from None
            raise

    async def _compact_revision(self) -> int:
        """The cluster's compact revision, learnt from a watch that asks for revision 1."""
        watch = _EtcdWatch(self, "\0aioelastic-compact-probe", 1)
        try:
            await watch.start()
            await watch._next()
        except CompactedError as exc:
            return exc.compact_revision
        finally:
            await watch.aclose()
        return 0  # pragma: no cover - nothing was compacted after all

    def _watch(self, prefix: str, start_revision: int | None) -> Watch:
        return _EtcdWatch(self, prefix, start_revision)

    # -- leases

    async def _lease_grant(self, ttl: float) -> LeaseGrant:
        # etcd grants whole seconds: round up, so a lease never lives shorter than asked.
        request = rpc_pb2.LeaseGrantRequest(TTL=max(1, math.ceil(ttl)))
        response = await self.client.call("LeaseGrant", request, write=True)
        if response.error:
            raise StoreError(f"etcd LeaseGrant: {response.error}")
        return LeaseGrant(response.ID, float(response.TTL))

    async def _lease_keep_alive(self, lease_id: int) -> float:
        stream = self._keepalives.get(lease_id)
        if stream is None:
            stream = self._keepalives[lease_id] = _KeepAliveStream()
        request = rpc_pb2.LeaseKeepAliveRequest(ID=lease_id)
        async with stream.lock:
            for attempt in range(2):  # a keep-alive is idempotent: one retry on a fresh stream
                read: asyncio.Future[Any] | None = None
                try:
                    if stream.call is not None and stream.call.done():
                        stream.drop()  # ended while idle (its channel was replaced: hung)
                    if stream.call is None:
                        stream.call, stream.channel = await self.client.open_stream(
                            "LeaseKeepAlive"
                        )
                    with anyio.fail_after(self.client.timeout):
                        await stream.call.write(request)
                        read = asyncio.ensure_future(stream.call.read())
                        read.add_done_callback(_retrieve)
                        await self.client.wait_answer(stream.channel, read, leader_bound=True)
                        response = read.result()
                except CallAbandonedError as exc:
                    stream.drop()
                    if attempt == 0:
                        continue  # a fresh stream on another member
                    raise StoreConnectionError(f"etcd LeaseKeepAlive: {exc}") from None
                except grpc.aio.AioRpcError as exc:
                    stream.drop()
                    if self._closed:
                        raise StoreClosedError("the etcd store is closed") from None
                    if exc.code() is grpc.StatusCode.UNAVAILABLE and stream.channel is not None:
                        self.client.rotate(stream.channel)
                    if attempt == 0 and exc.code() is not grpc.StatusCode.DEADLINE_EXCEEDED:
                        continue
                    raise StoreConnectionError(
                        f"etcd LeaseKeepAlive: {exc.code().name}: {exc.details()}"
                    ) from None
                except TimeoutError:
                    stream.drop()
                    raise StoreTimeoutError(
                        f"etcd LeaseKeepAlive: no answer within {self.client.timeout:g}s"
                    ) from None
                except asyncio.CancelledError:
                    stream.drop()  # an answer may still be on its way: never reuse the stream
                    if read is not None and read.cancelled() and not self._closed:
                        if attempt == 0:  # the stream was cancelled under us (channel replaced)
                            continue
                        raise StoreConnectionError(
                            "etcd LeaseKeepAlive: the stream ended"
                        ) from None
                    raise
                except BaseException:
                    stream.drop()  # an answer may still be on its way: never reuse the stream
                    raise
                if response is grpc.aio.EOF:
                    stream.drop()
                    if attempt == 0:
                        continue
                    raise StoreConnectionError("etcd LeaseKeepAlive: the stream ended")
                if response.TTL <= 0:
                    self._drop_keepalive(lease_id)
                    raise LeaseNotFoundError(lease_id)
                return float(response.TTL)
        raise AssertionError("unreachable")  # pragma: no cover

    def _drop_keepalive(self, lease_id: int) -> None:
        stream = self._keepalives.pop(lease_id, None)
        if stream is not None:
            stream.drop()

    async def _lease_revoke(self, lease_id: int) -> None:
        self._drop_keepalive(lease_id)
        request = rpc_pb2.LeaseRevokeRequest(ID=lease_id)
        try:
            await self.client.call("LeaseRevoke", request, write=True)
        except StoreError as exc:
            raise _lease_error(exc, lease_id) from None

    async def _lease_time_to_live(self, lease_id: int) -> LeaseStatus:
        request = rpc_pb2.LeaseTimeToLiveRequest(ID=lease_id, keys=True)
        try:
            response = await self.client.call("LeaseTimeToLive", request, write=False)
        except StoreError as exc:
            raise _lease_error(exc, lease_id) from None
        if response.TTL < 0:
            raise LeaseNotFoundError(lease_id)
        keys = tuple(sorted(_dec(k) for k in response.keys))
        return LeaseStatus(lease_id, float(response.grantedTTL), float(response.TTL), keys)

    # -- lifecycle

    async def _aclose(self) -> None:
        for lease_id in list(self._keepalives):
            self._drop_keepalive(lease_id)
        for watch in list(self._watches):
            watch._fail(StoreClosedError("the store was closed"))
        await self.client.aclose()


def _auth_refusal(response: Any) -> bool:
    reason: str = response.cancel_reason.lower()
    return any(
        word in reason
        for word in ("permission denied", "invalid auth token", "user name is empty", "auth")
    )


def _lease_error(exc: StoreError, lease_id: int) -> StoreError:
    if lease_id and "lease not found" in str(exc):
        return LeaseNotFoundError(lease_id)
    return exc


class _EtcdWatch(Watch):
    """One etcd watch on its own gRPC stream; resumes from the last event's revision + 1."""

    def __init__(self, store: EtcdStore, prefix: str, start_revision: int | None) -> None:
        super().__init__(prefix, start_revision)
        self._store = store
        self._key, self._end = _prefix_range(prefix)
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
        try:
            with anyio.fail_after(client.timeout):
                await call.write(rpc_pb2.WatchRequest(create_request=create))
                while True:
                    read = asyncio.ensure_future(call.read())
                    read.add_done_callback(_retrieve)
                    await client.wait_answer(channel, read)  # MemberHungError: try the next
                    if read.cancelled():  # the channel was replaced: its member hung
                        raise StoreConnectionError(f"etcd Watch at {channel.endpoint}: hung")
                    response = read.result()
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
            event = _event(pb)
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
                read.add_done_callback(_retrieve)
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
                if not read.done():
                    raise  # our caller was cancelled: the read goes on for the next call
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


def _retrieve(read: asyncio.Future[Any]) -> None:
    """Retrieve a finished read's outcome (one dropped with its stream is never awaited)."""
    if not read.cancelled():
        read.exception()


async def open_etcd_store(parts: SplitResult, options: dict[str, Any]) -> EtcdStore:
    """Opener for ``etcd://[user@]host:port[,host:port...][?option=value...]``.

    ``etcds://`` uses TLS. Options (keyword arguments of ``open_store`` or query parameters):
    ``timeout``, ``connect_timeout``, ``watch_reconnect_timeout``, ``ping_after``,
    ``ping_timeout``, ``username``, ``password``, ``password_file``, ``ca_file``, ``cert_file``,
    ``key_file``, ``server_name``, ``tls`` (force TLS on ``etcd://``). A user without a password
    takes it from ``password_file``, else ``$AIOELASTIC_ETCD_PASSWORD``, else the file named by
    ``$AIOELASTIC_ETCD_PASSWORD_FILE`` (a password in the URL works too, but shows in ``ps``
    wherever the URL is an argument). Messages never show the password.
    """
    shown = redact_url(parts.geturl())
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if parts.path not in ("", "/") or parts.fragment:
        raise ValueError(f"etcd URL must be etcd://host:port[,host:port...], got {shown!r}")
    endpoints = [h for h in hosts.split(",") if h.strip()]
    if not endpoints:
        raise ValueError(f"etcd URL must name at least one host:port, got {shown!r}")
    opts: dict[str, Any] = dict(
        parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False)
    )
    opts.update(options)
    if at:
        user, colon, password = userinfo.partition(":")
        opts.setdefault("username", unquote(user))
        if colon:
            opts.setdefault("password", unquote(password))
    unknown = set(opts) - _OPTIONS
    if unknown:
        raise TypeError(f"unknown option(s) for the etcd store: {sorted(unknown)}")
    _resolve_password(opts)
    tls_flag = opts.pop("tls", parts.scheme == "etcds")
    if isinstance(tls_flag, str):
        tls_flag = tls_flag.lower() in ("1", "true", "yes", "on")
    tls_fields = {
        k: opts.pop(k) for k in ("ca_file", "cert_file", "key_file", "server_name") if k in opts
    }
    tls = TLSConfig(**tls_fields) if (tls_flag or tls_fields) else None
    for name in _SECONDS:
        if isinstance(opts.get(name), str):
            try:
                opts[name] = float(opts[name])
            except ValueError:
                raise ValueError(
                    f"option {name} must be a number of seconds, got {opts[name]!r}"
                ) from None
    store = EtcdStore(endpoints, tls=tls, **opts)
    if store.client.username is not None:
        try:
            await store.client.authenticate()
        except BaseException:
            await store.aclose()
            raise
    return store


_SECONDS = ("timeout", "connect_timeout", "watch_reconnect_timeout", "ping_after", "ping_timeout")
_OPTIONS = frozenset(
    {
        *_SECONDS,
        "username",
        "password",
        "password_file",
        "ca_file",
        "cert_file",
        "key_file",
        "server_name",
        "tls",
    }
)


def _resolve_password(opts: dict[str, Any]) -> None:
    """Fill in ``password`` for a ``username`` from ``password_file`` or the environment."""
    password_file = opts.pop("password_file", None)
    if password_file is not None:
        if opts.get("password") is not None:
            raise ValueError("give the etcd password or password_file, not both")
        opts["password"] = read_secret_file(password_file, "etcd password")
    if opts.get("username") is None or opts.get("password") is not None:
        return
    env_password = os.environ.get(ETCD_PASSWORD_ENV)
    env_file = os.environ.get(ETCD_PASSWORD_FILE_ENV)
    if env_password:
        opts["password"] = env_password
    elif env_file:
        opts["password"] = read_secret_file(env_file, f"etcd password (${ETCD_PASSWORD_FILE_ENV})")
    else:
        raise ValueError(
            f"etcd user {opts['username']!r} needs a password: give password_file= (the "
            f"command-line tools: --password-file), or set ${ETCD_PASSWORD_ENV} or "
            f"${ETCD_PASSWORD_FILE_ENV}"
        )
