"""The wire forms of a transaction and of its result: JSON for the REST route ``POST /v1/txn``
(read and answered by the server; the client speaks only the session), msgpack arrays for the
session's ``txn`` operation (below).

Request::

    {"compare": [{"key": "k", "target": "value", "op": "==", "value_b64": "..."},
                 {"key": "k", "target": "version", "op": ">", "operand": 0}],
     "success": [{"op": "put", "key": "k", "value_b64": "...", "lease": 0},
                 {"op": "get", "key": "k"}, {"op": "range", "prefix": "p/", "limit": 10},
                 {"op": "delete", "key": "k"}, {"op": "delete_prefix", "prefix": "p/"}],
     "failure": [...]}

Answer: ``{"succeeded": bool, "revision": R, "results": [...]}``, one result per operation of
the branch that ran: ``{"op": "put", "kv": KV, "prev_kv": KV | null}``, ``{"op": "get", "kv":
KV | null}``, ``{"op": "range", "kvs": [KV...], "count": N, "more": bool}``, ``{"op":
"delete", "deleted": N}`` (``delete_prefix`` answers ``"delete"`` too). ``KV`` is the key-value
object of the other routes, value included (``value_b64``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from .._records import new_get_result, new_kv, new_put_result, new_txn_result
from .._txn import (
    Compare,
    Delete,
    DeletePrefix,
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
    check_txn,
)
from .._types import KeyValue, RangeResult

__all__ = [
    "result_from_frame",
    "result_to_frame",
    "result_to_json",
    "txn_from_frame",
    "txn_from_json",
    "txn_to_frame",
]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(obj: Mapping[str, Any], name: str) -> bytes:
    raw = obj.get(name, "")
    if not isinstance(raw, str):
        raise ValueError(f"{name} must be a base64 string")
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{name} is not valid base64") from None


def kv_to_json(kv: KeyValue) -> dict[str, Any]:
    return {
        "key": kv.key,
        "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision,
        "version": kv.version,
        "lease": kv.lease,
        "value_b64": _b64(kv.value),
    }


# -- requests ------------------------------------------------------------------------------------


def _object(item: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(item, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(item).__name__}")
    return item


def _compare_from_json(item: Any) -> Compare:
    obj = _object(item, "compare[]")
    if obj.get("target") == "value":
        operand: Any = _unb64(obj, "value_b64")
    else:
        operand = obj.get("operand")
    return Compare(obj.get("key"), obj.get("target"), obj.get("op"), operand)  # type: ignore[arg-type]


def _op_from_json(item: Any, what: str) -> TxnOp:
    obj = _object(item, what)
    kind = obj.get("op")
    if kind == "put":
        return Put(obj.get("key"), _unb64(obj, "value_b64"), obj.get("lease", 0))  # type: ignore[arg-type]
    if kind == "get":
        return Get(obj.get("key"))  # type: ignore[arg-type]
    if kind == "range":
        return Range(obj.get("prefix"), obj.get("limit"))  # type: ignore[arg-type]
    if kind == "delete":
        return Delete(obj.get("key"))  # type: ignore[arg-type]
    if kind == "delete_prefix":
        return DeletePrefix(obj.get("prefix"))  # type: ignore[arg-type]
    raise ValueError(
        f"{what}.op must be put, get, range, delete or delete_prefix, got {str(kind)[:40]!r}"
    )


def _list(body: Mapping[str, Any], name: str) -> list[Any]:
    items = body.get(name, [])
    if not isinstance(items, list):
        raise ValueError(f"field {name!r} must be a list")
    return items


def txn_from_json(body: Mapping[str, Any]) -> Txn:
    """The checked :class:`Txn` of a request body. Raises ``ValueError`` (``TypeError`` too, for
    a field of the wrong type) or :class:`~aioelastic.errors.TxnTooLargeError`."""
    unknown = set(body) - {"compare", "success", "failure"}
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)[:5]}: compare, success, failure")
    return check_txn(
        [_compare_from_json(item) for item in _list(body, "compare")],
        [_op_from_json(item, "success[]") for item in _list(body, "success")],
        [_op_from_json(item, "failure[]") for item in _list(body, "failure")],
    )


# -- results -------------------------------------------------------------------------------------


def _result_to_json(result: OpResult) -> dict[str, Any]:
    if isinstance(result, PutResult):
        prev = None if result.prev_kv is None else kv_to_json(result.prev_kv)
        return {"op": "put", "kv": kv_to_json(result.kv), "prev_kv": prev}
    if isinstance(result, GetResult):
        return {"op": "get", "kv": None if result.kv is None else kv_to_json(result.kv)}
    if isinstance(result, RangeResult):
        kvs = [kv_to_json(kv) for kv in result.kvs]
        return {"op": "range", "kvs": kvs, "count": result.count, "more": result.more}
    return {"op": "delete", "deleted": result.deleted}


def result_to_json(result: TxnResult) -> dict[str, Any]:
    return {
        "succeeded": result.succeeded,
        "revision": result.revision,
        "results": [_result_to_json(r) for r in result.results],
    }


# -- the session frame (msgpack: values stay raw bytes) -----------------------------------------
#
# args of the ``txn`` op: ``[compares, success, failure]``; a compare ``[key, target, op,
# operand]``; an operation ``["put", key, value, lease]``, ``["get", key]``, ``["range", prefix,
# limit]``, ``["delete", key]`` or ``["delete_prefix", prefix]``. The answer: ``[succeeded,
# revision, results]``, a result ``["put", kv, prev_kv]``, ``["get", kv]``, ``["range", count,
# more, kvs]`` or ``["delete", deleted]`` (a kv as the session's other answers carry it).


def _op_to_frame(op: TxnOp) -> list[Any]:
    if isinstance(op, Put):
        return ["put", op.key, op.value, op.lease]
    if isinstance(op, Get):
        return ["get", op.key]
    if isinstance(op, Range):
        return ["range", op.prefix, op.limit]
    if isinstance(op, Delete):
        return ["delete", op.key]
    return ["delete_prefix", op.prefix]


def txn_to_frame(txn: Txn) -> list[Any]:
    return [
        [[c.key, c.target, c.op, c.operand] for c in txn.compare],
        [_op_to_frame(op) for op in txn.success],
        [_op_to_frame(op) for op in txn.failure],
    ]


_FRAME_OPS: dict[str, tuple[type, int]] = {
    "put": (Put, 3),
    "get": (Get, 1),
    "range": (Range, 2),
    "delete": (Delete, 1),
    "delete_prefix": (DeletePrefix, 1),
}


def _op_from_frame(item: Any, what: str) -> TxnOp:
    if not isinstance(item, list) or not item or not isinstance(item[0], str):
        raise ValueError(f"{what} must be an array [op, ...]")
    kind = _FRAME_OPS.get(item[0])
    if kind is None:
        raise ValueError(f"{what}: unknown op {item[0][:40]!r}")
    cls, arity = kind
    if len(item) != arity + 1:
        raise ValueError(f"{what}: {item[0]} takes {arity} argument(s)")
    op: TxnOp = cls(*item[1:])
    return op


def txn_from_frame(args: list[Any]) -> Txn:
    """The checked :class:`Txn` of a ``txn`` op's arguments (errors as :func:`txn_from_json`)."""
    if len(args) != 3 or not all(isinstance(part, list) for part in args):
        raise ValueError("txn takes [compares, success, failure], three arrays")
    compares, success, failure = args
    for c in compares:
        if not isinstance(c, list) or len(c) != 4:
            raise ValueError("a compare is [key, target, op, operand]")
    return check_txn(
        [Compare(*c) for c in compares],
        [_op_from_frame(item, "success[]") for item in success],
        [_op_from_frame(item, "failure[]") for item in failure],
    )


def _kv_frame(kv: KeyValue | None) -> list[Any] | None:
    if kv is None:
        return None
    return [kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease]


def _kv_unframe(item: Any) -> KeyValue | None:
    return None if item is None else new_kv(*item)


def result_to_frame(result: TxnResult) -> list[Any]:
    out: list[Any] = []
    for r in result.results:
        if isinstance(r, PutResult):  # (the key-values' frames inline: most results are puts)
            kv, prev = r.kv, r.prev_kv
            kv_frame = [kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease]
            out.append(["put", kv_frame, None if prev is None else _kv_frame(prev)])
        elif isinstance(r, GetResult):
            out.append(["get", _kv_frame(r.kv)])
        elif isinstance(r, RangeResult):
            out.append(["range", r.count, r.more, [_kv_frame(kv) for kv in r.kvs]])
        else:
            out.append(["delete", r.deleted])
    return [result.succeeded, result.revision, out]


def result_from_frame(value: Any) -> TxnResult:
    """The :class:`TxnResult` of a ``txn`` answer (``ValueError``/``TypeError`` if malformed)."""
    succeeded, revision, items = value
    results: list[OpResult] = []
    for item in items:
        kind = item[0]
        if kind == "put":
            kv = _kv_unframe(item[1])
            if kv is None:
                raise ValueError("a put result without its key-value")
            results.append(new_put_result(kv, _kv_unframe(item[2])))
        elif kind == "get":
            results.append(new_get_result(_kv_unframe(item[1])))
        elif kind == "range":
            kvs = tuple(kv for kv in map(_kv_unframe, item[3]) if kv is not None)
            results.append(RangeResult(kvs, int(revision), int(item[1]), bool(item[2])))
        elif kind == "delete":
            results.append(DeleteResult(int(item[1])))
        else:
            raise ValueError(f"unknown result op {str(kind)[:40]!r}")
    return new_txn_result(bool(succeeded), int(revision), tuple(results))
