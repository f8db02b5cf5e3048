"""The OpenAPI description of ``POST /v1/txn`` (merged into the document by ``_openapi``)."""

from __future__ import annotations

from typing import Any

from .._txn import MAX_TXN_BYTES, MAX_TXN_OPS

__all__ = ["txn_path", "txn_schemas"]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(name: str) -> dict[str, Any]:
    return {"oneOf": [_ref(name), {"type": "null"}]}


_KEY = {"type": "string", "minLength": 1}
_B64 = {"type": "string", "contentEncoding": "base64"}


def txn_schemas() -> dict[str, Any]:
    """The request and answer schemas of a transaction."""
    ops: list[tuple[str, dict[str, Any]]] = [
        ("put", {"key": _KEY, "value_b64": _B64, "lease": {"type": "integer", "minimum": 0}}),
        ("get", {"key": _KEY}),
        ("range", {"prefix": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}}),
        ("delete", {"key": _KEY}),
        ("delete_prefix", {"prefix": {"type": "string"}}),
    ]
    branch = {
        "type": "array",
        "maxItems": MAX_TXN_OPS,
        "items": {
            "oneOf": [
                {
                    "type": "object",
                    "required": ["op", *(name for name in fields if name != "limit")],
                    "properties": {"op": {"const": op}, **fields},
                }
                for op, fields in ops
            ]
        },
    }
    return {
        "TxnCompare": {
            "type": "object",
            "required": ["key", "target", "op"],
            "description": "value targets compare value_b64 (bytewise); the others operand. "
            "Every compare of an absent key's value is false; its other fields are 0.",
            "properties": {
                "key": _KEY,
                "target": {
                    "enum": ["value", "version", "create_revision", "mod_revision", "lease"]
                },
                "op": {"enum": ["==", "!=", "<", ">"]},
                "value_b64": _B64,
                "operand": {"type": "integer", "minimum": 0},
            },
        },
        "TxnRequest": {
            "type": "object",
            "description": f"at most {MAX_TXN_OPS} compares and operations per branch, and "
            f"{MAX_TXN_BYTES} bytes of keys and values in all; a branch writes a key at most "
            "once",
            "properties": {
                "compare": {"type": "array", "maxItems": MAX_TXN_OPS, "items": _ref("TxnCompare")},
                "success": branch,
                "failure": branch,
            },
        },
        "TxnResult": _txn_result(),
    }


def _txn_result() -> dict[str, Any]:
    """The answer of a transaction: which branch ran and each operation's result."""
    return {
        "type": "object",
        "required": ["succeeded", "revision", "results"],
        "properties": {
            "succeeded": {"type": "boolean"},
            "revision": {"type": "integer"},
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["op"],
                    "description": "put: kv, prev_kv; get: kv; range: kvs, count, more; "
                    "delete (and delete_prefix): deleted",
                    "properties": {
                        "op": {"enum": ["put", "get", "range", "delete"]},
                        "kv": _nullable("KeyValue"),
                        "prev_kv": _nullable("KeyValue"),
                        "kvs": {"type": "array", "items": _ref("KeyValue")},
                        "count": {"type": "integer"},
                        "more": {"type": "boolean"},
                        "deleted": {"type": "integer"},
                    },
                },
            },
        },
    }


def txn_path(common: dict[str, Any], error: Any) -> dict[str, Any]:
    """The ``/v1/txn`` path item (``common``: the shared error answers; ``error(text)``)."""
    return {
        "post": {
            "summary": "a transaction: if every compare holds apply success, else failure, "
            "all at one revision (etcd's Txn)",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("TxnRequest")}},
            },
            "responses": {
                "200": {
                    "description": "which branch ran and each operation's result",
                    "content": {"application/json": {"schema": _ref("TxnResult")}},
                },
                "404": error("a put's lease does not exist (nothing applied)"),
                "413": error("a key, value or the transaction over a limit (txn_too_large)"),
                **common,
            },
        }
    }
