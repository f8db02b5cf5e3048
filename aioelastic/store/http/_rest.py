"""The unary REST routes: key-values, ranges, transactions, compaction, leases and the service
routes (``/healthz``, ``/metrics``, ``/openapi.json``, ``/v1/revision``).

The semantics are the engine's; this maps HTTP onto it: raw value bytes in bodies, ``ETag`` =
``mod_revision``, ``If-Match`` / ``If-None-Match: *`` = compare-and-swap.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from ...errors import TxnTooLargeError
from .._txn import DeletePrefix, Put, Range, Txn
from ._encoding import json_response, kv_json, precondition_failed, written
from ._errors import ApiError, bad, error_response
from ._limits import MAX_TXN_BODY
from ._parsing import (
    DECIMAL,
    etag_revision,
    int_param,
    json_int,
    json_number,
    parse_int,
    read_json_body,
)
from ._state import ServerState
from ._txn_wire import result_to_json, txn_from_json

__all__ = ["RestRoutes"]


class RestRoutes:
    """The handlers of the unary routes of one server (see ``make_app`` for the table)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.engine = state.engine
        self.limits = state.limits

    # -- service routes

    async def healthz(self, request: web.Request) -> web.Response:
        if self.state.closing:
            return json_response({"status": "stopping"}, status=503)
        return json_response({"status": "ok"})

    async def metrics(self, request: web.Request) -> web.Response:
        body, content_type = self.state.metrics.render()
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    async def openapi(self, request: web.Request) -> web.Response:
        from ._openapi import openapi_document

        limits = self.limits
        return json_response(openapi_document(limits.max_key_bytes, limits.max_value_bytes))

    async def revision(self, request: web.Request) -> web.Response:
        engine = self.engine
        return json_response(
            {"revision": engine.revision, "compact_revision": engine.compact_revision}
        )

    # -- key-values

    async def get_key(self, request: web.Request) -> web.Response:
        return await self.get_raw_key(request, request.match_info["key"])

    async def get_raw_key(self, request: web.Request, key: str) -> web.Response:
        """GET /v1/kv/{key}, ``key`` taken from the path (the fast path calls it directly)."""
        key = self.state.check_key(key)
        kv = self.engine.get(key)
        revision = str(self.engine.revision)
        if kv is None:
            return error_response(
                404, "key_not_found", f"no key {key[:200]!r}", {"X-Revision": revision}
            )
        if request.query.get("format") == "json":
            return json_response({"revision": self.engine.revision, "kv": kv_json(kv)})
        return web.Response(
            body=kv.value,
            content_type="application/octet-stream",
            headers={
                "ETag": f'"{kv.mod_revision}"',
                "X-Revision": revision,
                "X-Create-Revision": str(kv.create_revision),
                "X-Mod-Revision": str(kv.mod_revision),
                "X-Version": str(kv.version),
                "X-Lease": str(kv.lease),
            },
        )

    async def put_key(self, request: web.Request) -> web.Response:
        return await self.put_raw_key(request, request.match_info["key"])

    async def put_raw_key(self, request: web.Request, key: str) -> web.Response:
        """PUT /v1/kv/{key}, ``key`` taken from the path (the fast path calls it directly)."""
        key = self.state.check_key(key)
        lease = int_param(request, "lease", minimum=0, default=0)
        expected = _put_condition(request)
        value = await self._value(request)
        if expected is None:
            revision = self.engine.put(key, value, lease)
            kv = self.engine.get(key)
            assert kv is not None
            await self.state.durable()
            return written(revision, kv)
        result = self.engine.compare_and_swap(key, expected, value, lease)
        if not result.succeeded:
            return precondition_failed(key, result.revision, result.kv)
        assert result.kv is not None
        await self.state.durable()
        return written(result.revision, result.kv)

    async def _value(self, request: web.Request) -> bytes:
        """The body of a PUT, within the value limit."""
        length = request.content_length
        if length is not None and length > self.limits.max_value_bytes:
            raise self._value_too_large()
        if length is not None:
            # Take what has arrived in one call (a small write's whole body comes with its
            # headers, though aiohttp may not have seen its end yet), then wait for the rest:
            # cheaper than ``read()``'s loop of ``readany()``s.
            content = request.content
            value = content.read_nowait()
            if len(value) < length:
                try:
                    value += await content.readexactly(length - len(value))
                except asyncio.IncompleteReadError:
                    raise bad("the request body ended before its Content-Length") from None
        else:
            value = await request.read()
        if len(value) > self.limits.max_value_bytes:
            raise self._value_too_large()
        return value

    def _value_too_large(self) -> ApiError:
        limit = self.limits.max_value_bytes
        return ApiError(413, "value_too_large", f"values are at most {limit} bytes")

    async def delete_key(self, request: web.Request) -> web.Response:
        key = self.state.check_key(request.match_info["key"])
        if_match = request.headers.get("If-Match")
        if_none_match = request.headers.get("If-None-Match")
        if if_none_match is not None:
            if if_match is not None:
                raise bad("give If-Match or If-None-Match, not both")
            if if_none_match.strip() != "*":
                raise bad("If-None-Match must be '*' (delete only if the key is absent)")
            # RFC 9110: the condition holds only while no key exists, so nothing is deleted.
            kv = self.engine.get(key)
            if kv is not None:
                return precondition_failed(key, self.engine.revision, kv)
            return json_response({"deleted": 0, "revision": self.engine.revision})
        if if_match is None:
            deleted = self.engine.delete(key, False)
            if deleted:
                await self.state.durable()
            return json_response({"deleted": deleted, "revision": self.engine.revision})
        expected = etag_revision(if_match, "If-Match")
        if expected < 1:
            raise bad("If-Match on DELETE must name a revision >= 1")
        result = self.engine.compare_and_delete(key, expected)
        if not result.succeeded:
            return precondition_failed(key, result.revision, result.kv)
        await self.state.durable()
        return json_response({"deleted": 1, "revision": result.revision})

    async def add(self, request: web.Request) -> web.Response:
        key = self.state.check_key(request.match_info["key"])
        raw = request.query.get("delta", "1").strip()
        if not DECIMAL.fullmatch(raw):
            raise bad(
                f"query parameter 'delta' must be a decimal integer (at most 19 digits), "
                f"got {raw[:40]!r}"
            )
        total = self.engine.add(key, int(raw))
        revision = self.engine.revision
        await self.state.durable()
        return json_response({"value": total, "revision": revision})

    async def txn(self, request: web.Request) -> web.Response:
        """POST /v1/txn: one transaction (the JSON forms are in ``_txn_wire``)."""
        txn = await _read_txn(request)
        self._check_txn_sizes(txn)
        before = self.engine.revision
        result = self.engine.txn(txn)  # LeaseNotFoundError -> 404
        if result.revision != before:
            await self.state.durable()
        return json_response(result_to_json(result))

    def _check_txn_sizes(self, txn: Txn) -> None:
        for item in (*txn.compare, *txn.success, *txn.failure):
            if isinstance(item, (Range, DeletePrefix)):
                self.state.check_key(item.prefix, allow_empty=True)
            else:
                self.state.check_key(item.key)
            if isinstance(item, Put) and len(item.value) > self.limits.max_value_bytes:
                raise self._value_too_large()

    async def range(self, request: web.Request) -> web.Response:
        prefix = self.state.check_key(request.match_info["prefix"], allow_empty=True)
        limit: int | None = None
        if "limit" in request.query:
            limit = int_param(request, "limit", minimum=1)
        result = self.engine.range(prefix, limit)
        return json_response(
            {
                "revision": result.revision,
                "count": result.count,
                "more": result.more,
                "kvs": [kv_json(kv) for kv in result.kvs],
            }
        )

    async def delete_range(self, request: web.Request) -> web.Response:
        prefix = self.state.check_key(request.match_info["prefix"], allow_empty=True)
        deleted = self.engine.delete(prefix, True)
        if deleted:
            await self.state.durable()
        return json_response({"deleted": deleted, "revision": self.engine.revision})

    async def compact(self, request: web.Request) -> web.Response:
        body = await read_json_body(request)
        revision = json_int(body, "revision", 1)
        self.engine.compact(revision)
        await self.state.durable()
        return json_response({"compact_revision": self.engine.compact_revision})

    # -- leases

    async def lease_grant(self, request: web.Request) -> web.Response:
        body = await read_json_body(request)
        ttl = json_number(body, "ttl")
        grant = self.engine.lease_grant(ttl)
        await self.state.durable()
        return json_response({"id": grant.id, "ttl": grant.ttl})

    async def lease_keep_alive(self, request: web.Request) -> web.Response:
        ttl = self.engine.lease_keep_alive(_lease_id(request))
        return json_response({"ttl": ttl})

    async def lease_revoke(self, request: web.Request) -> web.Response:
        self.engine.lease_revoke(_lease_id(request))
        await self.state.durable()
        return json_response({"revoked": True, "revision": self.engine.revision})

    async def lease_status(self, request: web.Request) -> web.Response:
        status = self.engine.lease_time_to_live(_lease_id(request))
        return json_response(
            {
                "id": status.id,
                "granted_ttl": status.granted_ttl,
                "remaining": status.remaining,
                "keys": list(status.keys),
            }
        )

    async def leases(self, request: web.Request) -> web.Response:
        leases = [
            {"id": s.id, "granted_ttl": s.granted_ttl, "remaining": s.remaining}
            for s in self.engine.leases()
        ]
        return json_response({"leases": leases})


def _put_condition(request: web.Request) -> int | None:
    """The mod revision a PUT's ``If-Match`` expects (0: ``If-None-Match: *``), or None."""
    if_match = request.headers.get("If-Match")
    if_none_match = request.headers.get("If-None-Match")
    if if_match is not None and if_none_match is not None:
        raise bad("give If-Match or If-None-Match, not both")
    if if_none_match is not None:
        if if_none_match.strip() != "*":
            raise bad("If-None-Match must be '*' (write only if the key is absent)")
        return 0
    if if_match is not None:
        return etag_revision(if_match, "If-Match")
    return None


async def _read_txn(request: web.Request) -> Txn:
    # a txn's base64 values may exceed the body limit of other routes: read to its own
    raw = bytearray()
    while chunk := await request.content.read(MAX_TXN_BODY + 1 - len(raw)):
        raw += chunk
        if len(raw) > MAX_TXN_BODY:
            raise ApiError(413, "txn_too_large", f"txn bodies are at most {MAX_TXN_BODY} bytes")
    try:
        body = json.loads(raw) if raw else {}
    except (ValueError, RecursionError):
        raise bad("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        return txn_from_json(body)
    except TxnTooLargeError as exc:
        raise ApiError(
            413, "txn_too_large", str(exc), limit=exc.limit, maximum=exc.maximum, size=exc.size
        ) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise bad(f"txn: {exc}"[:300]) from None


def _lease_id(request: web.Request) -> int:
    return parse_int(request.match_info["lease"], "the lease id in the path", 1)
