"""The JSON form of a transaction and of its result (``POST /v1/txn``), for client and server.

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

__all__ = ["result_from_json", "result_to_json", "txn_from_json", "txn_to_json"]


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


def kv_from_json(obj: Any) -> KeyValue | None:
    if obj is None:
        return None
    return KeyValue(
        obj["key"],
        _unb64(obj, "value_b64"),
        int(obj["create_revision"]),
        int(obj["mod_revision"]),
        int(obj["version"]),
        int(obj["lease"]),
    )


# -- requests ------------------------------------------------------------------------------------


def _compare_to_json(c: Compare) -> dict[str, Any]:
    out: dict[str, Any] = {"key": c.key, "target": c.target, "op": c.op}
    if isinstance(c.operand, bytes):
        out["value_b64"] = _b64(c.operand)
    else:
        out["operand"] = c.operand
    return out


def _op_to_json(op: TxnOp) -> dict[str, Any]:
    if isinstance(op, Put):
        return {"op": "put", "key": op.key, "value_b64": _b64(op.value), "lease": op.lease}
    if isinstance(op, Get):
        return {"op": "get", "key": op.key}
    if isinstance(op, Range):
        out: dict[str, Any] = {"op": "range", "prefix": op.prefix}
        if op.limit is not None:
            out["limit"] = op.limit
        return out
    if isinstance(op, Delete):
        return {"op": "delete", "key": op.key}
    return {"op": "delete_prefix", "prefix": op.prefix}


def txn_to_json(txn: Txn) -> dict[str, Any]:
    return {
        "compare": [_compare_to_json(c) for c in txn.compare],
        "success": [_op_to_json(op) for op in txn.success],
        "failure": [_op_to_json(op) for op in txn.failure],
    }


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


def _result_from_json(obj: Mapping[str, Any], revision: int) -> OpResult:
    kind = obj["op"]
    if kind == "put":
        kv = kv_from_json(obj["kv"])
        assert kv is not None
        return PutResult(kv, kv_from_json(obj["prev_kv"]))
    if kind == "get":
        return GetResult(kv_from_json(obj["kv"]))
    if kind == "range":
        kvs = tuple(kv for kv in map(kv_from_json, obj["kvs"]) if kv is not None)
        return RangeResult(kvs, revision, int(obj["count"]), bool(obj["more"]))
    if kind == "delete":
        return DeleteResult(int(obj["deleted"]))
    raise ValueError(f"unknown result op {str(kind)[:40]!r}")


def result_from_json(obj: Mapping[str, Any]) -> TxnResult:
    """The :class:`TxnResult` of an answer; ``KeyError``/``TypeError``/``ValueError`` if it is
    malformed (the client maps those to ``StoreConnectionError``)."""
    revision = int(obj["revision"])
    results = tuple(_result_from_json(r, revision) for r in obj["results"])
    return TxnResult(bool(obj["succeeded"]), revision, results)
