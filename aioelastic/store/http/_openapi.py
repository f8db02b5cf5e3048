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
                **_kv_schemas(),
                **txn_schemas(),
                **_lease_schemas(),
                **_service_schemas(),
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            **_service_paths(),
            **_kv_paths(max_value_bytes),
            "/v1/txn": txn_path({**_COMMON, **_WRITE}, _error),
            "/v1/watch/{prefix}": _watch_path(),
            **_history_paths(),
            **_lease_paths(),
            **_ui_paths(),
        },
    }


def _object(required: list[str] | None = None, **properties: Any) -> dict[str, Any]:
    """An object schema with these properties (and these required ones, when given)."""
    if required is None:
        return {"type": "object", "properties": properties}
    return {"type": "object", "required": required, "properties": properties}


def _kv_schemas() -> dict[str, Any]:
    """The answers of the key-value routes: a record, a write, a range, a delete, a failed CAS."""
    key_value = _object(
        ["key", "create_revision", "mod_revision", "version", "lease"],
        key={"type": "string"},
        create_revision=_int(),
        mod_revision=_int(),
        version=_int(),
        lease=_int(),
        value_b64={"type": "string", "contentEncoding": "base64"},
    )
    kv_ref = {"$ref": "#/components/schemas/KeyValue"}
    return {
        "KeyValue": key_value,
        "Write": _object(revision=_int(), kv=kv_ref),
        "Added": _object(["value", "revision"], value={"type": "integer"}, revision=_int()),
        "Deleted": _object(deleted=_int(), revision=_int()),
        "Range": _object(
            revision=_int(),
            count=_int(),
            more={"type": "boolean"},
            kvs={"type": "array", "items": kv_ref},
        ),
        "PreconditionFailed": _object(
            error={"const": "precondition_failed"},
            message={"type": "string"},
            revision=_int(),
            kv={"oneOf": [kv_ref, {"type": "null"}]},
        ),
    }


def _lease_schemas() -> dict[str, Any]:
    """The answers of the lease routes."""
    return {
        "Lease": _object(id=_int(1), ttl={"type": "number"}),
        "LeaseStatus": _object(
            id=_int(1),
            granted_ttl={"type": "number"},
            remaining={"type": "number"},
            keys={"type": "array", "items": {"type": "string"}},
        ),
        "Leases": _object(
            ["leases"],
            leases={
                "type": "array",
                "items": _object(
                    id=_int(1), granted_ttl={"type": "number"}, remaining={"type": "number"}
                ),
            },
        ),
        "KeepAlive": _object(["ttl"], ttl={"type": "number"}),
        "Revoked": _object(["revoked", "revision"], revoked={"const": True}, revision=_int()),
    }


def _service_schemas() -> dict[str, Any]:
    """Every route's error, the health answer and the store's revisions."""
    return {
        "Error": _object(
            ["error", "message"], error={"type": "string"}, message={"type": "string"}
        ),
        "Health": _object(["status"], status={"enum": ["ok", "stopping"]}),
        "Revision": _object(
            ["revision", "compact_revision"], revision=_int(), compact_revision=_int()
        ),
        "Compacted": _object(["compact_revision"], compact_revision=_int()),
    }


def _service_paths() -> dict[str, Any]:
    """Liveness, metrics, this document and the session's upgrade."""
    return {
        "/healthz": {
            "get": {
                "summary": "liveness (never needs the token)",
                "security": [],
                "responses": {
                    "200": _ok("Health", "serving"),
                    "503": {
                        "description": "stopping",
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Health"}}
                        },
                    },
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {"description": "text exposition format", "content": {"text/plain": {}}},
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
        "/v1/session": _session_path(),
    }


def _session_path() -> dict[str, Any]:
    """The session's upgrade (the protocol after it is in docs/http-api.md)."""
    return {
        "get": {
            "summary": "open a session: an HTTP Upgrade to aioelastic-session/1, then "
            "length-prefixed messages of msgpack frames (requests, watches, keep-alives; "
            "see docs/http-api.md, 'The session protocol')",
            "parameters": [
                {
                    "name": "Upgrade",
                    "in": "header",
                    "required": True,
                    "schema": {"const": "aioelastic-session/1"},
                }
            ],
            "responses": {
                "101": {"description": "switching to the session stream"},
                "426": _error("no upgrade, or not to aioelastic-session/1 (a WebSocket included)"),
                "503": _error("the server is shutting down"),
                **_COMMON,
            },
        }
    }


#: The compare-and-swap headers of a write to one key.
_CAS_HEADERS = [
    {"name": "If-Match", "in": "header", "schema": {"type": "string"}},
    {"name": "If-None-Match", "in": "header", "schema": {"const": "*"}},
]
_CAS_FAILED = _ok("PreconditionFailed", "the compare failed; kv = current")


def _kv_paths(max_value_bytes: int) -> dict[str, Any]:
    """One key (read, write, delete, add) and a prefix's range."""
    return {
        "/v1/kv/{key}": {
            "parameters": [_KEY],
            "get": _key_read(),
            "put": _key_write(max_value_bytes),
            "delete": {
                "summary": "delete a key; If-Match: compare-and-delete; If-None-Match: * "
                "deletes nothing (412 when the key exists)",
                "parameters": _CAS_HEADERS,
                "responses": {"200": _ok("Deleted"), "412": _CAS_FAILED, **_KEYED, **_WRITE},
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
    }


def _key_read() -> dict[str, Any]:
    """``GET /v1/kv/{key}``: the raw value, or ``{revision, kv}`` with ``format=json``."""
    return {
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
                    "application/json": {"schema": {"$ref": "#/components/schemas/Write"}},
                },
            },
            "404": _error("no such key"),
            **_KEYED,
        },
    }


def _key_write(max_value_bytes: int) -> dict[str, Any]:
    """``PUT /v1/kv/{key}``: the body is the raw value."""
    etag = {
        "description": "the write's revision, quoted (\"R\"): the key's new mod_revision, the "
        "same number as the body's revision",
        "schema": {"type": "string"},
    }
    return {
        "summary": "write a key (body = raw value); If-Match / If-None-Match: * = CAS",
        "parameters": [{"name": "lease", "in": "query", "schema": _int()}, *_CAS_HEADERS],
        "requestBody": {
            "content": {
                "application/octet-stream": {
                    "schema": {"type": "string", "maxLength": max_value_bytes}
                }
            }
        },
        "responses": {
            "200": {**_ok("Write"), "headers": {"ETag": etag}},
            "404": _error("lease not found"),
            "412": _CAS_FAILED,
            **_BODIED,
            **_WRITE,
            "413": _error("key or value too large"),
        },
    }


def _watch_path() -> dict[str, Any]:
    """``GET /v1/watch/{prefix}``: an NDJSON stream of a prefix's changes."""
    return {
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
                "200": {"description": "the stream", "content": {"application/x-ndjson": {}}},
                "410": _error("start_revision was compacted"),
                "503": _error("too many watch streams, or the server is stopping"),
                **_KEYED,
            },
        },
    }


def _json_body(required: str, schema: dict[str, Any]) -> dict[str, Any]:
    """A request body of one JSON object with one required field."""
    return {"content": {"application/json": {"schema": _object([required], **{required: schema})}}}


def _history_paths() -> dict[str, Any]:
    """The store's revisions, and discarding old ones."""
    return {
        "/v1/revision": {
            "get": {
                "summary": "current and compacted revisions",
                "responses": {"200": _ok("Revision"), **_COMMON},
            }
        },
        "/v1/compact": {
            "post": {
                "summary": "discard history before revision",
                "requestBody": _json_body("revision", _int(1)),
                "responses": {
                    "200": _ok("Compacted"),
                    "410": _error("already compacted past it"),
                    **_BODIED,
                    **_WRITE,
                },
            }
        },
    }


def _lease_paths() -> dict[str, Any]:
    """Granting, listing, reading, revoking and keeping alive leases."""
    not_found = _error("lease not found")
    ttl = {"type": "number", "exclusiveMinimum": 0, "maximum": 1e9}
    return {
        "/v1/lease": {
            "post": {
                "summary": "grant a lease",
                "requestBody": _json_body("ttl", ttl),
                "responses": {"200": _ok("Lease"), **_BODIED, **_WRITE},
            }
        },
        "/v1/leases": {
            "get": {
                "summary": "every live lease",
                "responses": {"200": _ok("Leases"), **_COMMON},
            }
        },
        "/v1/lease/{lease}": {
            "parameters": [_LEASE],
            "get": {
                "summary": "granted TTL, time left and keys",
                "responses": {"200": _ok("LeaseStatus"), "404": not_found, **_COMMON},
            },
            "delete": {
                "summary": "revoke (deletes its keys)",
                "responses": {"200": _ok("Revoked"), "404": not_found, **_COMMON, **_WRITE},
            },
        },
        "/v1/lease/{lease}/keepalive": {
            "parameters": [_LEASE],
            "post": {
                "summary": "restart the lease's TTL",
                "responses": {"200": _ok("KeepAlive"), "404": not_found, **_COMMON},
            },
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
