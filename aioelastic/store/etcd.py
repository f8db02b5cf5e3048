"""The etcd backend: the store protocol over etcd's native v3 gRPC API.

``etcd://host:2379[,host2:2379...]`` (``etcds://`` for TLS). The semantics are etcd's own (the
store protocol is modelled on them), so this module is a thin mapping: a compare-and-swap is one
``Txn`` (compare ``mod_revision``, put on success, read on failure); a watch is one gRPC watch
stream that resumes from the last delivered revision + 1 after a reconnect; a kept lease has one
long-lived ``LeaseKeepAlive`` stream. Writes whose outcome is unknown raise
:class:`~aioelastic.errors.WriteOutcomeUnknownError` and are never retried.

The pieces: the wire mapping (keys, key-values, events, transaction operations) is
``_etcd_codec``, the watch ``_etcd_watch``, a kept lease's stream ``_etcd_streams``; this module
holds the store and its URL opener.

Differences from the memory backend a user may notice: a fresh etcd starts at revision 1, not 0;
lease TTLs are whole seconds (fractional TTLs are rounded up, and etcd may raise very short ones to
its minimum), and ``remaining`` is whole seconds too.

Needs grpcio and protobuf: ``pip install 'aioelastic[etcd]'``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote

from .._etcd._rpc import rpc_pb2
from .._etcd.client import EtcdClient, TLSConfig
from .._secrets import ETCD_PASSWORD_ENV, ETCD_PASSWORD_FILE_ENV, read_secret_file, redact_url
from ..errors import (
    CompactedError,
    LeaseNotFoundError,
    StoreClosedError,
    StoreError,
)
from ._base import Store, Watch
from ._etcd_codec import (
    ALL_KEYS,
    compare_pb,
    decode_key,
    encode_key,
    op_pb,
    op_result,
    prefix_range,
    to_kv,
)
from ._etcd_streams import KeepAliveStream
from ._etcd_watch import EtcdWatch
from ._txn import Get, Put, Range, Txn, TxnResult
from ._types import CasResult, KeyValue, LeaseGrant, LeaseStatus, RangeResult

__all__ = ["EtcdStore", "TLSConfig", "open_etcd_store"]


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
        if isinstance(endpoints, str):  # "host:port,host:port"
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        self.client = EtcdClient(
            endpoints,
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
        self._keepalives: dict[int, KeepAliveStream] = {}
        self._watches: set[EtcdWatch] = set()

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
        response = await self.client.call(
            "Range", rpc_pb2.RangeRequest(key=encode_key(key)), write=False
        )
        return to_kv(response.kvs[0]) if response.kvs else None

    async def _range(self, prefix: str, limit: int | None) -> RangeResult:
        key, end = prefix_range(prefix)
        request = rpc_pb2.RangeRequest(key=key, range_end=end, limit=limit or 0)
        response = await self.client.call("Range", request, write=False)
        return RangeResult(
            tuple(to_kv(kv) for kv in response.kvs),
            response.header.revision,
            response.count,
            response.more,
        )

    async def _current_revision(self) -> int:
        request = rpc_pb2.RangeRequest(key=ALL_KEYS, count_only=True)
        response = await self.client.call("Range", request, write=False)
        revision: int = response.header.revision
        return revision

    # -- writes

    async def _put(self, key: str, value: bytes, lease: int) -> int:
        request = rpc_pb2.PutRequest(key=encode_key(key), value=value, lease=lease)
        try:
            response = await self.client.call("Put", request, write=True)
        except StoreError as exc:
            raise _lease_error(exc, lease) from None
        revision: int = response.header.revision
        return revision

    async def _delete(self, key: str, prefix: bool) -> int:
        if prefix:
            start, end = prefix_range(key)
            request = rpc_pb2.DeleteRangeRequest(key=start, range_end=end)
        else:
            request = rpc_pb2.DeleteRangeRequest(key=encode_key(key))
        response = await self.client.call("DeleteRange", request, write=True)
        deleted: int = response.deleted
        return deleted

    async def _compare_and_swap(
        self, key: str, expected_mod_revision: int, value: bytes, lease: int
    ) -> CasResult:
        raw = encode_key(key)
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
            return CasResult(False, revision, to_kv(kvs[0]) if kvs else None)
        put = response.responses[0].response_put
        if put.HasField("prev_kv"):
            prev = put.prev_kv
            kv = KeyValue(key, value, prev.create_revision, revision, prev.version + 1, lease)
        else:
            kv = KeyValue(key, value, revision, revision, 1, lease)
        return CasResult(True, revision, kv)

    async def _compare_and_delete(self, key: str, expected_mod_revision: int) -> CasResult:
        raw = encode_key(key)
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
            return CasResult(False, revision, to_kv(kvs[0]) if kvs else None)
        return CasResult(True, revision, None)

    async def _txn(self, txn: Txn) -> TxnResult:
        request = rpc_pb2.TxnRequest(
            compare=[compare_pb(c) for c in txn.compare],
            success=[op_pb(op) for op in txn.success],
            failure=[op_pb(op) for op in txn.failure],
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
            op_result(op, pb, revision) for op, pb in zip(ops, response.responses, strict=True)
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
        """The cluster's compact revision (called once etcd said a revision is compacted: at
        least 1), learnt from a watch that asks for revision 1. etcd cancels that watch only when
        revision 1 is compacted away, not at compact revision 1 itself (it would wait forever):
        a read at revision 1, refused unless the compact revision is 1, tells that case."""
        try:
            await self.client.call(
                "Range",
                rpc_pb2.RangeRequest(key=ALL_KEYS, count_only=True, revision=1),
                write=False,
            )
        except StoreError as exc:
            if "compacted" not in str(exc):
                raise
        else:
            return 1
        watch = EtcdWatch(self, "\0aioelastic-compact-probe", 1)
        try:
            await watch.start()
            await watch._next()
        except CompactedError as exc:
            return exc.compact_revision
        finally:
            await watch.aclose()
        return 0  # pragma: no cover - nothing was compacted after all

    def _watch(self, prefix: str, start_revision: int | None) -> Watch:
        return EtcdWatch(self, prefix, start_revision)

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
            stream = self._keepalives[lease_id] = KeepAliveStream()
        async with stream.lock:
            ttl = await stream.ping(self.client, lease_id, lambda: self._closed)
            if ttl <= 0:
                self._drop_keepalive(lease_id)
                raise LeaseNotFoundError(lease_id)
            return ttl

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
        keys = tuple(sorted(decode_key(k) for k in response.keys))
        return LeaseStatus(lease_id, float(response.grantedTTL), float(response.TTL), keys)

    # -- lifecycle

    async def _aclose(self) -> None:
        for lease_id in list(self._keepalives):
            self._drop_keepalive(lease_id)
        for watch in list(self._watches):
            watch._fail(StoreClosedError("the store was closed"))
        await self.client.aclose()


def _lease_error(exc: StoreError, lease_id: int) -> StoreError:
    if lease_id and "lease not found" in str(exc):
        return LeaseNotFoundError(lease_id)
    return exc


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
