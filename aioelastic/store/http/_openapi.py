"""The OpenAPI 3.1 document of the HTTP store API, served at ``/openapi.json``."""

from __future__ import annotations

from typing import Any

from ._openapi_txn import txn_path, txn_schemas

__all__ = ["openapi_document"]


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _ok(schema: str, description: str = "OK") -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }


_KEY = {
    "name": "key",
    "in": "path",
    "required": True,
    "description": "the key, percent-encoded; '/' may appear as itself or as %2F",
    "schema": {"type": "string"},
}
_PREFIX = {**_KEY, "description": "the key prefix, percent-encoded (empty: every key)"}
_LEASE = {
    "name": "lease",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 1},
}
_COMMON = {
    "400": _error("malformed request (the message says what was wrong)"),
    "401": _error("missing or wrong bearer token"),
}


def openapi_document(max_key_bytes: int, max_value_bytes: int) -> dict[str, Any]:
    """The API description, with this server's size limits filled in."""
    kv_meta = {
        "type": "object",
        "required": ["key", "create_revision", "mod_revision", "version", "lease"],
        "properties": {
            "key": {"type": "string"},
            "create_revision": {"type": "integer"},
            "mod_revision": {"type": "integer"},
            "version": {"type": "integer"},
            "lease": {"type": "integer"},
            "value_b64": {"type": "string", "contentEncoding": "base64"},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "aioelastic store",
            "version": "1",
            "description": (
                "An etcd-v3-like key-value store: one global revision, compare-and-swap on "
                "mod_revision, watches as NDJSON streams, leases. Values travel as raw bytes "
                f"(at most {max_value_bytes}); keys at most {max_key_bytes} bytes of UTF-8. "
                "See docs/http-api.md."
            ),
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error", "message"],
                    "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
                },
                "KeyValue": kv_meta,
                "Write": {
                    "type": "object",
                    "properties": {
                        "revision": {"type": "integer"},
                        "kv": {"$ref": "#/components/schemas/KeyValue"},
                    },
                },
                "Deleted": {
                    "type": "object",
                    "properties": {"deleted": {"type": "integer"}, "revision": {"type": "integer"}},
                },
                "Range": {
                    "type": "object",
                    "properties": {
                        "revision": {"type": "integer"},
                        "count": {"type": "integer"},
                        "more": {"type": "boolean"},
                        "kvs": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/KeyValue"},
                        },
                    },
                },
                **txn_schemas(),
                "PreconditionFailed": {
                    "type": "object",
                    "properties": {
                        "error": {"const": "precondition_failed"},
                        "message": {"type": "string"},
                        "revision": {"type": "integer"},
                        "kv": {
                            "oneOf": [{"$ref": "#/components/schemas/KeyValue"}, {"type": "null"}]
                        },
                    },
                },
                "Lease": {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}, "ttl": {"type": "number"}},
                },
                "LeaseStatus": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "granted_ttl": {"type": "number"},
                        "remaining": {"type": "number"},
                        "keys": {"type": "array", "items": {"type": "string"}},
                    },
                },
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {
                "get": {
                    "summary": "liveness (never needs the token)",
                    "security": [],
                    "responses": {"200": {"description": "serving"}, "503": _error("stopping")},
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {"200": {"description": "text exposition format"}, **_COMMON},
                }
            },
            "/openapi.json": {
                "get": {"summary": "this document", "responses": {"200": {"description": "OK"}}}
            },
            "/v1/revision": {
                "get": {
                    "summary": "current and compacted revisions",
                    "responses": {"200": {"description": "OK"}, **_COMMON},
                }
            },
            "/v1/kv/{key}": {
                "parameters": [_KEY],
                "get": {
                    "summary": "read a key: raw value, revisions in headers (ETag = mod_revision)",
                    "parameters": [
                        {
                            "name": "format",
                            "in": "query",
                            "schema": {"enum": ["json"]},
                            "description": "json: answer {revision, kv} instead of raw bytes",
                        }
                    ],
                    "responses": {
                        "200": {
                            "description": "the value",
                            "content": {"application/octet-stream": {}},
                        },
                        "404": _error("no such key"),
                        **_COMMON,
                    },
                },
                "put": {
                    "summary": "write a key (body = raw value); If-Match / If-None-Match: * = CAS",
                    "parameters": [
                        {
                            "name": "lease",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 0},
                        },
                        {"name": "If-Match", "in": "header", "schema": {"type": "string"}},
                        {"name": "If-None-Match", "in": "header", "schema": {"const": "*"}},
                    ],
                    "requestBody": {
                        "content": {
                            "application/octet-stream": {
                                "schema": {"type": "string", "maxLength": max_value_bytes}
                            }
                        }
                    },
                    "responses": {
                        "200": {
                            **_ok("Write"),
                            "headers": {
                                "ETag": {
                                    "description": 'the write\'s revision, quoted ("R"): the '
                                    "key's new mod_revision, the same number as the body's "
                                    "revision",
                                    "schema": {"type": "string"},
                                }
                            },
                        },
                        "404": _error("lease not found"),
                        "412": _ok("PreconditionFailed", "the compare failed; kv = current"),
                        "413": _error("key or value too large"),
                        **_COMMON,
                    },
                },
                "delete": {
                    "summary": "delete a key; with If-Match: compare-and-delete",
                    "parameters": [
                        {"name": "If-Match", "in": "header", "schema": {"type": "string"}}
                    ],
                    "responses": {
                        "200": _ok("Deleted"),
                        "412": _ok("PreconditionFailed", "the compare failed; kv = current"),
                        **_COMMON,
                    },
                },
            },
            "/v1/add/{key}": {
                "parameters": [_KEY],
                "post": {
                    "summary": "atomically add delta to the decimal integer at key",
                    "parameters": [{"name": "delta", "in": "query", "schema": {"type": "integer"}}],
                    "responses": {"200": {"description": "{value, revision}"}, **_COMMON},
                },
            },
            "/v1/txn": txn_path(_COMMON, _error),
            "/v1/range/{prefix}": {
                "parameters": [_PREFIX],
                "get": {
                    "summary": "every key under prefix, in key order",
                    "parameters": [
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1},
                        }
                    ],
                    "responses": {"200": _ok("Range"), **_COMMON},
                },
                "delete": {
                    "summary": "delete every key under prefix at one revision",
                    "responses": {"200": _ok("Deleted"), **_COMMON},
                },
            },
            "/v1/watch/{prefix}": {
                "parameters": [_PREFIX],
                "get": {
                    "summary": "NDJSON stream: created, events (one line per revision), progress",
                    "parameters": [
                        {
                            "name": "start_revision",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1},
                        },
                        {
                            "name": "progress_interval",
                            "in": "query",
                            "schema": {"type": "number", "minimum": 0.05, "maximum": 300},
                        },
                        {
                            "name": "snapshot",
                            "in": "query",
                            "description": "1: the created frame carries the prefix's range "
                            "(count, kvs) at its revision; not with start_revision",
                            "schema": {"type": "integer", "enum": [0, 1]},
                        },
                    ],
                    "responses": {
                        "200": {
                            "description": "the stream",
                            "content": {"application/x-ndjson": {}},
                        },
                        "410": _error("start_revision was compacted"),
                        **_COMMON,
                    },
                },
            },
            "/v1/compact": {
                "post": {
                    "summary": "discard history before revision",
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["revision"],
                                    "properties": {"revision": {"type": "integer", "minimum": 1}},
                                }
                            }
                        }
                    },
                    "responses": {
                        "200": {"description": "{compact_revision}"},
                        "410": _error("already compacted past it"),
                        **_COMMON,
                    },
                }
            },
            "/v1/lease": {
                "post": {
                    "summary": "grant a lease",
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["ttl"],
                                    "properties": {
                                        "ttl": {"type": "number", "exclusiveMinimum": 0}
                                    },
                                }
                            }
                        }
                    },
                    "responses": {"200": _ok("Lease"), **_COMMON},
                }
            },
            "/v1/leases": {
                "get": {"summary": "every live lease", "responses": {"200": {"description": "OK"}}}
            },
            "/v1/session": {
                "get": {
                    "summary": "open a session: a WebSocket carrying msgpack frames (requests, "
                    "watches, keep-alives; see docs/http-api.md, 'The session protocol')",
                    "responses": {
                        "101": {"description": "switching to the WebSocket protocol"},
                        "503": _error("the server is shutting down"),
                        **_COMMON,
                    },
                }
            },
            "/v1/lease/{lease}": {
                "parameters": [_LEASE],
                "get": {
                    "summary": "granted TTL, time left and keys",
                    "responses": {
                        "200": _ok("LeaseStatus"),
                        "404": _error("lease not found"),
                        **_COMMON,
                    },
                },
                "delete": {
                    "summary": "revoke (deletes its keys)",
                    "responses": {
                        "200": {"description": "revoked"},
                        "404": _error("lease not found"),
                        **_COMMON,
                    },
                },
            },
            "/v1/lease/{lease}/keepalive": {
                "parameters": [_LEASE],
                "post": {
                    "summary": "restart the lease's TTL",
                    "responses": {
                        "200": {"description": "{ttl}"},
                        "404": _error("lease not found"),
                        **_COMMON,
                    },
                },
            },
        },
    }
