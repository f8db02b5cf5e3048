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


#: An integer as the server takes it: at least ``minimum``, below 2**63 (etcd's int64).
def _int(minimum: int = 0) -> dict[str, Any]:
    return {"type": "integer", "format": "int64", "minimum": minimum, "maximum": 2**63 - 1}


_KEY = {
    "name": "key",
    "in": "path",
    "required": True,
    "description": "the key, percent-encoded; '/' may appear as itself or as %2F",
    "schema": {"type": "string"},
}
_PREFIX = {
    **_KEY,
    "name": "prefix",
    "description": "the key prefix, percent-encoded (empty: every key)",
}
_LEASE = {
    "name": "lease",
    "in": "path",
    "required": True,
    "schema": _int(1),
}
_COMMON = {
    "400": _error("malformed request (the message says what was wrong)"),
    "401": _error("missing or wrong bearer token"),
    "408": _error("the request's head or body came too slowly (the connection is closed)"),
    "431": _error("the request line or headers are too large"),
}
#: The answers of a route with a key or prefix in its path.
_KEYED = {**_COMMON, "413": _error("key too large")}
#: The answers of a route with a JSON body.
_BODIED = {
    **_COMMON,
    "413": _error("body too large"),
    "415": _error("a content or transfer coding (the body must be sent as it is)"),
}
#: The answers a write adds with a data directory: the log could not take it, so it was not made.
_WRITE = {
    "503": _error("the server is stopping, or its data directory cannot take writes now"),
    "507": _error("the data directory's disk is full"),
}


def openapi_document(max_key_bytes: int, max_value_bytes: int) -> dict[str, Any]:
    """The API description, with this server's size limits filled in."""
    kv_meta = {
        "type": "object",
        "required": ["key", "create_revision", "mod_revision", "version", "lease"],
        "properties": {
            "key": {"type": "string"},
            "create_revision": _int(),
            "mod_revision": _int(),
            "version": _int(),
            "lease": _int(),
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
                        "revision": _int(),
                        "kv": {"$ref": "#/components/schemas/KeyValue"},
                    },
                },
                "Revision": {
                    "type": "object",
                    "required": ["revision", "compact_revision"],
                    "properties": {"revision": _int(), "compact_revision": _int()},
                },
                "Added": {
                    "type": "object",
                    "required": ["value", "revision"],
                    "properties": {"value": {"type": "integer"}, "revision": _int()},
                },
                "Compacted": {
                    "type": "object",
                    "required": ["compact_revision"],
                    "properties": {"compact_revision": _int()},
                },
                "Revoked": {
                    "type": "object",
                    "required": ["revoked", "revision"],
                    "properties": {"revoked": {"const": True}, "revision": _int()},
                },
                "KeepAlive": {
                    "type": "object",
                    "required": ["ttl"],
                    "properties": {"ttl": {"type": "number"}},
                },
                "Leases": {
                    "type": "object",
                    "required": ["leases"],
                    "properties": {
                        "leases": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "id": _int(1),
                                    "granted_ttl": {"type": "number"},
                                    "remaining": {"type": "number"},
                                },
                            },
                        }
                    },
                },
                "Health": {
                    "type": "object",
                    "required": ["status"],
                    "properties": {"status": {"enum": ["ok", "stopping"]}},
                },
                "Deleted": {
                    "type": "object",
                    "properties": {"deleted": _int(), "revision": _int()},
                },
                "Range": {
                    "type": "object",
                    "properties": {
                        "revision": _int(),
                        "count": _int(),
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
                        "revision": _int(),
                        "kv": {
                            "oneOf": [{"$ref": "#/components/schemas/KeyValue"}, {"type": "null"}]
                        },
                    },
                },
                "Lease": {
                    "type": "object",
                    "properties": {"id": _int(1), "ttl": {"type": "number"}},
                },
                "LeaseStatus": {
                    "type": "object",
                    "properties": {
                        "id": _int(1),
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
                    "responses": {
                        "200": _ok("Health", "serving"),
                        "503": {
                            "description": "stopping",
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/Health"}
                                }
                            },
                        },
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {
                        "200": {
                            "description": "text exposition format",
                            "content": {"text/plain": {}},
                        },
                        "501": _error("prometheus-client is not installed"),
                        **_COMMON,
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "this document",
                    "responses": {
                        "200": {"description": "OK", "content": {"application/json": {}}},
                        **_COMMON,
                    },
                }
            },
            "/v1/revision": {
                "get": {
                    "summary": "current and compacted revisions",
                    "responses": {"200": _ok("Revision"), **_COMMON},
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
                            "description": "the value (raw bytes; with format=json, JSON)",
                            "content": {
                                "application/octet-stream": {},
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/Write"}
                                },
                            },
                        },
                        "404": _error("no such key"),
                        **_KEYED,
                    },
                },
                "put": {
                    "summary": "write a key (body = raw value); If-Match / If-None-Match: * = CAS",
                    "parameters": [
                        {"name": "lease", "in": "query", "schema": _int()},
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
                        **_BODIED,
                        **_WRITE,
                        "413": _error("key or value too large"),
                    },
                },
                "delete": {
                    "summary": "delete a key; If-Match: compare-and-delete; If-None-Match: * "
                    "deletes nothing (412 when the key exists)",
                    "parameters": [
                        {"name": "If-Match", "in": "header", "schema": {"type": "string"}},
                        {"name": "If-None-Match", "in": "header", "schema": {"const": "*"}},
                    ],
                    "responses": {
                        "200": _ok("Deleted"),
                        "412": _ok("PreconditionFailed", "the compare failed; kv = current"),
                        **_KEYED,
                        **_WRITE,
                    },
                },
            },
            "/v1/add/{key}": {
                "parameters": [_KEY],
                "post": {
                    "summary": "atomically add delta to the decimal integer at key",
                    "parameters": [
                        {
                            "name": "delta",
                            "in": "query",
                            "schema": {
                                "type": "integer",
                                "minimum": -(10**19 - 1),
                                "maximum": 10**19 - 1,
                            },
                        }
                    ],
                    "responses": {"200": _ok("Added"), **_KEYED, **_WRITE},
                },
            },
            "/v1/txn": txn_path({**_COMMON, **_WRITE}, _error),
            "/v1/range/{prefix}": {
                "parameters": [_PREFIX],
                "get": {
                    "summary": "every key under prefix, in key order",
                    "parameters": [{"name": "limit", "in": "query", "schema": _int(1)}],
                    "responses": {"200": _ok("Range"), **_KEYED},
                },
                "delete": {
                    "summary": "delete every key under prefix at one revision",
                    "responses": {"200": _ok("Deleted"), **_KEYED, **_WRITE},
                },
            },
            "/v1/watch/{prefix}": {
                "parameters": [_PREFIX],
                "get": {
                    "summary": "NDJSON stream: created, events (one line per revision), progress",
                    "parameters": [
                        {"name": "start_revision", "in": "query", "schema": _int(1)},
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
                        "503": _error("too many watch streams, or the server is stopping"),
                        **_KEYED,
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
                                    "properties": {"revision": _int(1)},
                                }
                            }
                        }
                    },
                    "responses": {
                        "200": _ok("Compacted"),
                        "410": _error("already compacted past it"),
                        **_BODIED,
                        **_WRITE,
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
                                        "ttl": {
                                            "type": "number",
                                            "exclusiveMinimum": 0,
                                            "maximum": 1e9,
                                        }
                                    },
                                }
                            }
                        }
                    },
                    "responses": {"200": _ok("Lease"), **_BODIED, **_WRITE},
                }
            },
            "/v1/leases": {
                "get": {
                    "summary": "every live lease",
                    "responses": {"200": _ok("Leases"), **_COMMON},
                }
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
                        "200": _ok("Revoked"),
                        "404": _error("lease not found"),
                        **_COMMON,
                        **_WRITE,
                    },
                },
            },
            "/v1/lease/{lease}/keepalive": {
                "parameters": [_LEASE],
                "post": {
                    "summary": "restart the lease's TTL",
                    "responses": {
                        "200": _ok("KeepAlive"),
                        "404": _error("lease not found"),
                        **_COMMON,
                    },
                },
            },
            **_ui_paths(),
        },
    }


_RUN_QUERY = {
    "name": "run",
    "in": "query",
    "schema": {"type": "string"},
    "description": "the run to show (default: the first run, by id)",
}


def _ui_paths() -> dict[str, Any]:
    """The web page (docs/ui.md) and the JSON it reads."""
    page = {"security": [], "responses": {"200": {"description": "HTML, JS or CSS"}}}
    return {
        "/": {"get": {"summary": "links to the page and the service routes", **page}},
        "/ui": {"get": {"summary": "the live page (no token needed: it holds no data)", **page}},
        "/ui/ui.js": {"get": {"summary": "the page's script", **page}},
        "/ui/ui.css": {"get": {"summary": "the page's style", **page}},
        "/v1/status/{run_id}": {
            "parameters": [
                {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "get": {
                "summary": "a run's status: the object `aioelastic status --json` prints",
                "parameters": [
                    {"name": "timers_prefix", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": {"description": "RunStatus JSON (docs/ui.md)"},
                    "404": _error("run_not_found: no records for the run"),
                    "422": _error("rendezvous_state: a record is corrupt or foreign"),
                    **_COMMON,
                },
            },
        },
        "/v1/ui/snapshot": {
            "get": {
                "summary": "the page's overview: runs, one run's status, locks and elections",
                "parameters": [_RUN_QUERY],
                "responses": {"200": {"description": "overview JSON (docs/ui.md)"}, **_COMMON},
            }
        },
        "/v1/ui/events": {
            "get": {
                "summary": "server-sent events: an overview after every change in the store",
                "parameters": [_RUN_QUERY],
                "responses": {
                    "200": {
                        "description": "text/event-stream",
                        "content": {"text/event-stream": {}},
                    },
                    "503": _error("shutting down, or too many watch streams"),
                    **_COMMON,
                },
            }
        },
    }
