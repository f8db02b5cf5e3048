"""The etcd backend's wire mapping: keys and prefix ranges as etcd's bytes, etcd's key-values and
events as the store's types, and transaction operations both ways."""

from __future__ import annotations

from typing import Any

from .._etcd._rpc import kv_pb2, rpc_pb2
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
    TxnOp,
)
from ._types import EventType, KeyValue, RangeResult, WatchEvent

__all__ = [
    "ALL_KEYS",
    "compare_pb",
    "decode_key",
    "encode_key",
    "op_pb",
    "op_result",
    "prefix_range",
    "to_event",
    "to_kv",
]

ALL_KEYS = b"\0"  # as key and range_end: every key


def encode_key(key: str, name: str = "key") -> bytes:
    try:
        return key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ValueError(f"{name} {key!r} cannot be encoded as UTF-8") from None


def decode_key(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def prefix_range(prefix: str) -> tuple[bytes, bytes]:
    """``(key, range_end)`` covering every key that starts with ``prefix`` (etcd's rule)."""
    if not prefix:
        return ALL_KEYS, ALL_KEYS
    raw = bytearray(encode_key(prefix, "prefix"))
    key = bytes(raw)
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return key, bytes(raw)
        raw.pop()
    return key, ALL_KEYS


def to_kv(pb: Any) -> KeyValue:
    return KeyValue(
        decode_key(pb.key),
        bytes(pb.value),
        pb.create_revision,
        pb.mod_revision,
        pb.version,
        pb.lease,
    )


def to_event(pb: Any) -> WatchEvent:
    if pb.type == kv_pb2.Event.DELETE:
        return WatchEvent(
            EventType.DELETE, KeyValue(decode_key(pb.kv.key), b"", 0, pb.kv.mod_revision, 0)
        )
    return WatchEvent(EventType.PUT, to_kv(pb.kv))


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


def compare_pb(compare: Compare) -> Any:
    fields: dict[str, Any] = {compare.target: compare.operand}  # the oneof field: our name
    return rpc_pb2.Compare(
        result=_COMPARE_OPS[compare.op],
        target=_COMPARE_TARGETS[compare.target],
        key=encode_key(compare.key),
        **fields,
    )


def op_pb(op: TxnOp) -> Any:
    if isinstance(op, Put):
        put = rpc_pb2.PutRequest(
            key=encode_key(op.key), value=op.value, lease=op.lease, prev_kv=True
        )
        return rpc_pb2.RequestOp(request_put=put)
    if isinstance(op, Get):
        return rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=encode_key(op.key)))
    if isinstance(op, Range):
        key, end = prefix_range(op.prefix)
        ranged = rpc_pb2.RangeRequest(key=key, range_end=end, limit=op.limit or 0)
        return rpc_pb2.RequestOp(request_range=ranged)
    if isinstance(op, Delete):
        delete = rpc_pb2.DeleteRangeRequest(key=encode_key(op.key))
    else:
        start, end = prefix_range(op.prefix)
        delete = rpc_pb2.DeleteRangeRequest(key=start, range_end=end)
    return rpc_pb2.RequestOp(request_delete_range=delete)


def op_result(op: TxnOp, pb: Any, revision: int) -> OpResult:
    """One operation's result from its ``ResponseOp``; ``revision``: the transaction's."""
    if isinstance(op, Put):
        put = pb.response_put
        if put.HasField("prev_kv"):
            prev = to_kv(put.prev_kv)
            version = prev.version + 1
            kv = KeyValue(op.key, op.value, prev.create_revision, revision, version, op.lease)
            return PutResult(kv, prev)
        return PutResult(KeyValue(op.key, op.value, revision, revision, 1, op.lease))
    if isinstance(op, Get):
        kvs = pb.response_range.kvs
        return GetResult(to_kv(kvs[0]) if kvs else None)
    if isinstance(op, Range):
        ranged = pb.response_range
        return RangeResult(tuple(map(to_kv, ranged.kvs)), revision, ranged.count, ranged.more)
    return DeleteResult(pb.response_delete_range.deleted)
