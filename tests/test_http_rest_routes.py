"""Each unary REST route's answer, field by field, on a real server (127.0.0.1, aiohttp's
client): the key-values with their headers and conditions, add, ranges, transactions with their
limits, compaction and leases; every refusal's status, code and words. What curl and tools see
(``docs/http-api.md``); the fast path and the routed path answer alike
(``tests/test_http_server.py``)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from helpers.http import server_state

from aioelastic.store.http._limits import MAX_JSON_BODY_BYTES, MAX_TXN_BODY
from aioelastic.store.http.server import HttpStoreServer

MAX_KEY = 16
MAX_VALUE = 32


class Rest:
    """A server with small limits, and a client for it."""

    def __init__(self, server: HttpStoreServer, http: aiohttp.ClientSession) -> None:
        self.server = server
        self.http = http
        self.url = server.url

    async def call(
        self, method: str, path: str, data: Any = None, **headers: str
    ) -> tuple[int, Any, Any]:
        """(status, JSON body or raw bytes, headers)."""
        if isinstance(data, bytes) and len(data) > 1 << 20:
            data = io.BytesIO(data)  # (aiohttp warns of a large bytes body)
        async with self.http.request(method, self.url + path, data=data, headers=headers) as r:
            raw = await r.read()
            body: Any = raw
            if r.content_type == "application/json":
                body = json.loads(raw)
            return r.status, body, r.headers

    async def put(self, key: str, value: bytes, **headers: str) -> tuple[int, Any, Any]:
        return await self.call("PUT", f"/v1/kv/{key}", value, **headers)


@pytest_asyncio.fixture
async def rest() -> AsyncIterator[Rest]:
    async with (
        HttpStoreServer(port=0, max_key_bytes=MAX_KEY, max_value_bytes=MAX_VALUE) as server,
        aiohttp.ClientSession() as http,
    ):
        yield Rest(server, http)


def _error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": code, "message": message, **extra}


# -- the service routes ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_revision_route_says_the_revision_and_the_compaction(rest: Rest) -> None:
    assert (await rest.call("GET", "/v1/revision"))[:2] == (
        200,
        {"revision": 0, "compact_revision": 0},
    )
    for i in range(3):
        await rest.put(f"k{i}", b"v")
    await rest.call("POST", "/v1/compact", json.dumps({"revision": 2}))
    assert (await rest.call("GET", "/v1/revision"))[1] == {"revision": 3, "compact_revision": 2}


@pytest.mark.asyncio
async def test_healthz_and_metrics(rest: Rest) -> None:
    assert (await rest.call("GET", "/healthz"))[:2] == (200, {"status": "ok"})
    status, body, headers = await rest.call("GET", "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert b"aioelastic" in body


# -- key-values -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_get_is_the_value_with_its_revisions_in_headers(rest: Rest) -> None:
    await rest.put("other", b"x")
    await rest.put("k", b"v1")
    status, body, headers = await rest.put("k", b"\x00v2")
    assert status == 200
    assert body == {
        "revision": 3,
        "kv": {"key": "k", "create_revision": 2, "mod_revision": 3, "version": 2, "lease": 0},
    }
    assert headers["ETag"] == '"3"'
    await rest.put("later", b"y")
    status, body, headers = await rest.call("GET", "/v1/kv/k")
    assert (status, body) == (200, b"\x00v2")
    assert headers["Content-Type"] == "application/octet-stream"
    assert {name: headers[name] for name in ("ETag", "X-Revision", "X-Create-Revision")} == {
        "ETag": '"3"',
        "X-Revision": "4",
        "X-Create-Revision": "2",
    }
    assert (headers["X-Mod-Revision"], headers["X-Version"], headers["X-Lease"]) == ("3", "2", "0")
    status, body, _ = await rest.call("GET", "/v1/kv/k?format=json")
    assert (status, body) == (
        200,
        {
            "revision": 4,
            "kv": {
                "key": "k",
                "create_revision": 2,
                "mod_revision": 3,
                "version": 2,
                "lease": 0,
                "value_b64": base64.b64encode(b"\x00v2").decode(),
            },
        },
    )
    status, body, _ = await rest.call("GET", "/v1/kv/k?format=raw")
    assert body == b"\x00v2"


@pytest.mark.asyncio
async def test_a_missing_key_is_a_404_that_names_it_and_the_revision(rest: Rest) -> None:
    await rest.put("a", b"1")
    status, body, headers = await rest.call("GET", "/v1/kv/nope")
    assert (status, body) == (404, _error("key_not_found", "no key 'nope'"))
    assert headers["X-Revision"] == "1"


@pytest.mark.asyncio
async def test_a_put_on_a_lease_is_held_by_it(rest: Rest) -> None:
    _, grant, _ = await rest.call("POST", "/v1/lease", json.dumps({"ttl": 30}))
    lease = grant["id"]
    status, body, _ = await rest.put(f"k?lease={lease}", b"v")
    assert (status, body["kv"]["lease"]) == (200, lease)
    assert (await rest.call("GET", "/v1/kv/k"))[2]["X-Lease"] == str(lease)
    status, body, _ = await rest.put("k?lease=-1", b"v")
    assert (status, body["error"]) == (400, "bad_request")
    assert body["message"] == "query parameter 'lease' must be an integer in [0, 2**63), got -1"
    status, body, _ = await rest.put("k?lease=999", b"v")
    assert (status, body["error"]) == (404, "lease_not_found")


@pytest.mark.asyncio
async def test_a_conditional_put_swaps_only_on_its_revision(rest: Rest) -> None:
    assert (await rest.put("k", b"1", **{"If-None-Match": "*"}))[0] == 200
    status, body, _ = await rest.put("k", b"2", **{"If-None-Match": " * "})
    assert status == 412
    assert body["error"] == "precondition_failed"
    assert body["message"] == "compare failed for 'k': its mod_revision is 1"
    assert (body["revision"], body["kv"]["value_b64"]) == (1, base64.b64encode(b"1").decode())
    status, body, _ = await rest.put("k", b"3", **{"If-Match": '"5"'})
    assert (status, body["message"]) == (412, "compare failed for 'k': its mod_revision is 1")
    status, body, headers = await rest.put("k", b"4", **{"If-Match": 'W/"1"'})
    assert status == 200
    assert (body["revision"], body["kv"]["version"], headers["ETag"]) == (2, 2, '"2"')
    status, body, _ = await rest.put("new", b"5", **{"If-Match": '"3"'})
    assert (status, body["message"], body["kv"]) == (
        412,
        "compare failed for 'new': it is absent",
        None,
    )
    assert (await rest.call("GET", "/v1/kv/k"))[1] == b"4"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"If-Match": '"1"', "If-None-Match": "*"}, "give If-Match or If-None-Match, not both"),
        ({"If-None-Match": '"1"'}, "If-None-Match must be '*' (write only if the key is absent)"),
        ({"If-Match": "one"}, "header If-Match must be a decimal integer >= 0, got 'one'"),
    ],
)
async def test_a_put_with_a_bad_condition_is_a_400_and_writes_nothing(
    rest: Rest, headers: dict[str, str], message: str
) -> None:
    status, body, _ = await rest.put("k", b"v", **headers)
    assert (status, body) == (400, _error("bad_request", message))
    assert rest.server.engine.revision == 0


@pytest.mark.asyncio
async def test_values_and_keys_at_their_limits(rest: Rest) -> None:
    assert (await rest.put("k" * MAX_KEY, b"v" * MAX_VALUE))[0] == 200
    status, body, _ = await rest.put("k", b"v" * (MAX_VALUE + 1))
    assert (status, body) == (
        413,
        _error("value_too_large", f"values are at most {MAX_VALUE} bytes"),
    )

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: found by reading
        yield b"v" * MAX_VALUE
        yield b"v"

    status, body, _ = await rest.put("k", chunks())  # type: ignore[arg-type]
    assert (status, body["error"]) == (413, "value_too_large")

    async def exact() -> AsyncIterator[bytes]:
        yield b"w" * (MAX_VALUE - 1)
        yield b"w"

    assert (await rest.put("c", exact()))[0] == 200  # type: ignore[arg-type]
    assert (await rest.call("GET", "/v1/kv/c"))[1] == b"w" * MAX_VALUE
    status, body, _ = await rest.put("k" * (MAX_KEY + 1), b"v")
    assert (status, body) == (
        413,
        _error("key_too_large", f"keys are at most {MAX_KEY} bytes (UTF-8)"),
    )
    assert rest.server.engine.revision == 2


@pytest.mark.asyncio
async def test_a_delete_says_how_many_and_the_revision(rest: Rest) -> None:
    await rest.put("k", b"1")
    await rest.put("j", b"1")
    assert (await rest.call("DELETE", "/v1/kv/k"))[:2] == (200, {"deleted": 1, "revision": 3})
    assert (await rest.call("DELETE", "/v1/kv/k"))[:2] == (200, {"deleted": 0, "revision": 3})
    status, body, _ = await rest.call("DELETE", "/v1/kv/j", **{"If-Match": '"9"'})
    assert (status, body["message"], body["revision"]) == (
        412,
        "compare failed for 'j': its mod_revision is 2",
        3,
    )
    status, body, _ = await rest.call("DELETE", "/v1/kv/j", **{"If-Match": '"2"'})
    assert (status, body) == (200, {"deleted": 1, "revision": 4})
    status, body, _ = await rest.call("DELETE", "/v1/kv/j", **{"If-Match": '"4"'})
    assert (status, body["message"]) == (412, "compare failed for 'j': it is absent")


@pytest.mark.asyncio
async def test_a_delete_if_none_match_deletes_nothing_either_way(rest: Rest) -> None:
    await rest.put("k", b"1")
    status, body, _ = await rest.call("DELETE", "/v1/kv/k", **{"If-None-Match": "*"})
    assert (status, body["message"], body["revision"]) == (
        412,
        "compare failed for 'k': its mod_revision is 1",
        1,
    )
    status, body, _ = await rest.call("DELETE", "/v1/kv/gone", **{"If-None-Match": " * "})
    assert (status, body) == (200, {"deleted": 0, "revision": 1})
    assert rest.server.engine.get("k") is not None


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"If-Match": '"1"', "If-None-Match": "*"}, "give If-Match or If-None-Match, not both"),
        ({"If-None-Match": "x"}, "If-None-Match must be '*' (delete only if the key is absent)"),
        ({"If-Match": '"0"'}, "If-Match on DELETE must name a revision >= 1"),
        ({"If-Match": "x"}, "header If-Match must be a decimal integer >= 0, got 'x'"),
    ],
)
async def test_a_delete_with_a_bad_condition_is_a_400_and_deletes_nothing(
    rest: Rest, headers: dict[str, str], message: str
) -> None:
    await rest.put("k", b"1")
    status, body, _ = await rest.call("DELETE", "/v1/kv/k", **headers)
    assert (status, body) == (400, _error("bad_request", message))
    assert rest.server.engine.get("k") is not None


@pytest.mark.asyncio
async def test_an_empty_key_is_refused_by_the_key_routes(rest: Rest) -> None:
    message = "the key (the URL path after the route) must not be empty"
    for method, path in [("GET", "/v1/kv/"), ("DELETE", "/v1/kv/"), ("POST", "/v1/add/")]:
        assert (await rest.call(method, path))[:2] == (400, _error("bad_request", message))


# -- add ------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_add_counts_by_its_delta(rest: Rest) -> None:
    assert (await rest.call("POST", "/v1/add/n"))[:2] == (200, {"value": 1, "revision": 1})
    assert (await rest.call("POST", "/v1/add/n?delta=%2041%20"))[1] == {"value": 42, "revision": 2}
    assert (await rest.call("POST", "/v1/add/n?delta=-50"))[1] == {"value": -8, "revision": 3}
    status, body, _ = await rest.call("POST", "/v1/add/n?delta=1.5")
    assert (status, body) == (
        400,
        _error(
            "bad_request",
            "query parameter 'delta' must be a decimal integer (at most 19 digits), got '1.5'",
        ),
    )
    status, body, _ = await rest.call("POST", "/v1/add/n?delta=" + "7" * 50)
    assert body["message"].endswith(f"got {'7' * 40!r}")
    assert rest.server.engine.revision == 3


# -- ranges ---------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_range_lists_its_prefix_up_to_its_limit(rest: Rest) -> None:
    for key in ("p/a", "p/b", "p/c", "q/a"):
        await rest.put(key, key.encode())
    status, body, _ = await rest.call("GET", "/v1/range/p/?limit=2")
    assert status == 200
    assert (body["revision"], body["count"], body["more"]) == (4, 3, True)
    assert [kv["key"] for kv in body["kvs"]] == ["p/a", "p/b"]
    assert body["kvs"][0]["value_b64"] == base64.b64encode(b"p/a").decode()
    status, body, _ = await rest.call("GET", "/v1/range/p/")
    assert (body["count"], body["more"], len(body["kvs"])) == (3, False, 3)
    assert (await rest.call("GET", "/v1/range/"))[1]["count"] == 4
    status, body, _ = await rest.call("GET", "/v1/range/p/?limit=0")
    assert (status, body["message"]) == (
        400,
        "query parameter 'limit' must be an integer in [1, 2**63), got 0",
    )
    status, body, _ = await rest.call("GET", "/v1/range/" + "p" * (MAX_KEY + 1))
    assert (status, body["error"]) == (413, "key_too_large")


@pytest.mark.asyncio
async def test_a_range_delete_says_how_many(rest: Rest) -> None:
    for key in ("p/a", "p/b", "q/a"):
        await rest.put(key, b"v")
    assert (await rest.call("DELETE", "/v1/range/p/"))[:2] == (200, {"deleted": 2, "revision": 4})
    assert (await rest.call("DELETE", "/v1/range/p/"))[:2] == (200, {"deleted": 0, "revision": 4})
    assert rest.server.engine.get("q/a") is not None


# -- transactions ---------------------------------------------------------------------------------


def _txn(*success: dict[str, Any], compare: list[Any] | None = None) -> str:
    return json.dumps({"compare": compare or [], "success": list(success), "failure": []})


def _put(key: str, value: bytes) -> dict[str, Any]:
    return {"op": "put", "key": key, "value_b64": base64.b64encode(value).decode()}


@pytest.mark.asyncio
async def test_a_txn_within_the_limits_is_applied(rest: Rest) -> None:
    status, body, _ = await rest.call(
        "POST",
        "/v1/txn",
        _txn(_put("k" * MAX_KEY, b"v" * MAX_VALUE), {"op": "range", "prefix": ""}),
    )
    assert status == 200
    assert (body["succeeded"], body["revision"]) == (True, 1)
    assert rest.server.engine.get("k" * MAX_KEY) is not None


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("op", "status", "code"),
    [
        (_put("k", b"v" * (MAX_VALUE + 1)), 413, "value_too_large"),
        (_put("k" * (MAX_KEY + 1), b"v"), 413, "key_too_large"),
        ({"op": "range", "prefix": "p" * (MAX_KEY + 1)}, 413, "key_too_large"),
        ({"op": "delete_prefix", "prefix": "p" * (MAX_KEY + 1)}, 413, "key_too_large"),
        ({"op": "delete", "key": ""}, 400, "bad_request"),
    ],
)
async def test_a_txn_over_a_limit_is_refused_whole(
    rest: Rest, op: dict[str, Any], status: int, code: str
) -> None:
    got, body, _ = await rest.call("POST", "/v1/txn", _txn(_put("a", b"1"), op))
    assert (got, body["error"]) == (status, code)
    assert rest.server.engine.revision == 0


@pytest.mark.asyncio
async def test_a_txn_compare_on_a_key_over_the_limit_is_refused(rest: Rest) -> None:
    compare = [{"key": "k" * (MAX_KEY + 1), "target": "version", "op": "==", "operand": 0}]
    got, body, _ = await rest.call("POST", "/v1/txn", _txn(_put("a", b"1"), compare=compare))
    assert (got, body["error"]) == (413, "key_too_large")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{", "the request body is not valid JSON"),
        (b"[]", "the request body must be a JSON object, got list"),
        (b"[" * 50_000 + b"]" * 50_000, "the request body is not valid JSON"),
    ],
)
async def test_a_txn_body_that_is_no_json_object_is_a_400(
    rest: Rest, data: bytes, message: str
) -> None:
    assert (await rest.call("POST", "/v1/txn", data))[:2] == (400, _error("bad_request", message))


@pytest.mark.asyncio
async def test_an_empty_txn_body_is_an_empty_txn(rest: Rest) -> None:
    status, body, _ = await rest.call("POST", "/v1/txn", b"")
    assert (status, body["succeeded"], body["revision"]) == (200, True, 0)


@pytest.mark.asyncio
async def test_a_malformed_txn_says_why_in_short(rest: Rest) -> None:
    status, body, _ = await rest.call("POST", "/v1/txn", json.dumps({"success": [{"op": "x"}]}))
    assert (status, body["error"]) == (400, "bad_request")
    assert body["message"].startswith("txn: ")
    long = json.dumps({"success": [{"op": "x" * 1000}]})
    status, body, _ = await rest.call("POST", "/v1/txn", long)
    assert status == 400
    assert len(body["message"]) <= 300


@pytest.mark.asyncio
async def test_a_txn_body_over_its_limit_is_a_413(rest: Rest) -> None:
    data = b" " * (MAX_TXN_BODY + 1)
    assert (await rest.call("POST", "/v1/txn", data))[:2] == (
        413,
        _error("txn_too_large", f"txn bodies are at most {MAX_TXN_BODY} bytes"),
    )
    status, body, _ = await rest.call("POST", "/v1/txn", b" " * (MAX_TXN_BODY - 2) + b"{}")
    assert (status, body["succeeded"]) == (200, True)


@pytest.mark.asyncio
async def test_a_txn_of_too_many_operations_is_a_413_with_its_figures(rest: Rest) -> None:
    ops = [{"op": "get", "key": f"k{i}"} for i in range(5000)]
    status, body, _ = await rest.call("POST", "/v1/txn", _txn(*ops))
    assert (status, body["error"]) == (413, "txn_too_large")
    assert set(body) >= {"limit", "maximum", "size"}
    assert body["size"] > body["maximum"]


# -- compaction and leases ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_compact_says_the_compaction(rest: Rest) -> None:
    for i in range(3):
        await rest.put(f"k{i}", b"v")
    assert (await rest.call("POST", "/v1/compact", json.dumps({"revision": 2})))[:2] == (
        200,
        {"compact_revision": 2},
    )
    status, body, _ = await rest.call("POST", "/v1/compact", json.dumps({"revision": 0}))
    assert (status, body["message"]) == (
        400,
        "field 'revision' must be an integer in [1, 2**63), got 0",
    )


@pytest.mark.asyncio
async def test_a_lease_from_grant_to_revoke(rest: Rest) -> None:
    status, grant, _ = await rest.call("POST", "/v1/lease", json.dumps({"ttl": 30}))
    assert status == 200
    assert set(grant) == {"id", "ttl"}
    assert grant["ttl"] == 30
    lease = grant["id"]
    await rest.put(f"held?lease={lease}", b"v")
    status, body, _ = await rest.call("GET", f"/v1/lease/{lease}")
    assert status == 200
    assert (body["id"], body["granted_ttl"], body["keys"]) == (lease, 30, ["held"])
    assert 0 < body["remaining"] <= 30
    status, body, _ = await rest.call("GET", "/v1/leases")
    assert status == 200
    [listed] = body["leases"]
    assert (listed["id"], listed["granted_ttl"]) == (lease, 30)
    assert 0 < listed["remaining"] <= 30
    status, body, _ = await rest.call("POST", f"/v1/lease/{lease}/keepalive")
    assert (status, body) == (200, {"ttl": 30})
    status, body, _ = await rest.call("DELETE", f"/v1/lease/{lease}")
    assert (status, body) == (200, {"revoked": True, "revision": 2})
    assert rest.server.engine.get("held") is None
    assert (await rest.call("GET", "/v1/leases"))[1] == {"leases": []}
    status, body, _ = await rest.call("POST", f"/v1/lease/{lease}/keepalive")
    assert (status, body["error"]) == (404, "lease_not_found")


@pytest.mark.asyncio
@pytest.mark.parametrize("lease", ["0", "x", "-1"])
async def test_a_lease_id_in_the_path_is_an_integer_of_at_least_1(rest: Rest, lease: str) -> None:
    status, body, _ = await rest.call("GET", f"/v1/lease/{lease}")
    assert (status, body["error"]) == (400, "bad_request")
    assert body["message"].startswith("the lease id in the path must be ")


@pytest.mark.asyncio
async def test_a_lease_grant_needs_a_ttl(rest: Rest) -> None:
    status, body, _ = await rest.call("POST", "/v1/lease", b"")
    assert (status, body["message"]) == (
        400,
        "field 'ttl' must be a number of seconds > 0, got None",
    )


# -- found by mutation testing (scripts/mutants store-http-rest) ----------------------------------


@pytest.mark.asyncio
async def test_a_stopping_server_says_so_on_healthz_and_refuses_new_watches(rest: Rest) -> None:
    state = server_state(rest.server)
    state.closing = True  # (what the shutdown sets first)
    try:
        assert (await rest.call("GET", "/healthz"))[:2] == (503, {"status": "stopping"})
        assert (await rest.call("GET", "/v1/watch/p/"))[:2] == (
            503,
            _error("unavailable", "the server is shutting down"),
        )
    finally:
        state.closing = False
    assert (await rest.call("GET", "/healthz"))[:2] == (200, {"status": "ok"})


@pytest.mark.asyncio
async def test_a_missing_long_key_is_named_to_200_characters() -> None:
    async with (
        HttpStoreServer(port=0) as server,
        aiohttp.ClientSession() as http,
        http.get(f"{server.url}/v1/kv/{'k' * 300}") as response,
    ):
        assert response.status == 404
        assert (await response.json())["message"] == f"no key {'k' * 200!r}"


@pytest.mark.asyncio
async def test_a_delete_of_a_key_leaves_the_keys_it_prefixes(rest: Rest) -> None:
    for key in ("k", "k2", "k/x"):
        await rest.put(key, b"v")
    assert (await rest.call("DELETE", "/v1/kv/k"))[1] == {"deleted": 1, "revision": 4}
    assert rest.server.engine.get("k2") is not None
    assert rest.server.engine.get("k/x") is not None


@pytest.mark.asyncio
async def test_a_delete_if_match_revision_1_is_taken(rest: Rest) -> None:
    await rest.put("k", b"v")
    status, body, _ = await rest.call("DELETE", "/v1/kv/k", **{"If-Match": '"1"'})
    assert (status, body) == (200, {"deleted": 1, "revision": 2})


@pytest.mark.asyncio
async def test_a_range_delete_of_the_empty_prefix_deletes_every_key(rest: Rest) -> None:
    for key in ("a", "b/c"):
        await rest.put(key, b"v")
    assert (await rest.call("DELETE", "/v1/range/"))[:2] == (200, {"deleted": 2, "revision": 3})


@pytest.mark.asyncio
async def test_a_conditional_put_keeps_its_lease(rest: Rest) -> None:
    _, grant, _ = await rest.call("POST", "/v1/lease", json.dumps({"ttl": 30}))
    status, body, _ = await rest.put(f"k?lease={grant['id']}", b"v", **{"If-None-Match": "*"})
    assert (status, body["kv"]["lease"]) == (200, grant["id"])


@pytest.mark.asyncio
async def test_a_long_txn_error_is_cut_at_300_characters(rest: Rest) -> None:
    unknown = {name * 100: 1 for name in "vwxyz"}  # five unknown fields, named in full
    status, body, _ = await rest.call("POST", "/v1/txn", json.dumps(unknown))
    assert (status, len(body["message"])) == (400, 300)
    assert body["message"].startswith("txn: unknown field(s) ")


@pytest.mark.asyncio
async def test_the_openapi_document_states_the_servers_key_limit(rest: Rest) -> None:
    status, body, _ = await rest.call("GET", "/openapi.json")
    assert status == 200
    assert f"keys at most {MAX_KEY} bytes of UTF-8" in json.dumps(body)


async def _raw_put(server: HttpStoreServer, head: bytes, *parts: bytes) -> tuple[int, Any]:
    """A request written by hand (its parts a moment apart, then the end of the sending side):
    the answer's status and JSON body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(head)
        for part in parts:
            await writer.drain()
            await asyncio.sleep(0.05)
            if part == b"EOF":
                writer.write_eof()
            else:
                writer.write(part)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        [length] = [
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ]
        body = await asyncio.wait_for(reader.readexactly(length), 10)
    finally:
        writer.close()
    return int(head.split(b" ", 2)[1]), json.loads(body)


def _head(path: str, length: int, method: str = "PUT") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()


@pytest.mark.asyncio
async def test_a_value_in_several_reads_is_stored_whole(rest: Rest) -> None:
    status, _ = await _raw_put(rest.server, _head("/v1/kv/k", 10) + b"abc", b"defg", b"hij")
    assert status == 200
    assert rest.server.engine.get("k").value == b"abcdefghij"  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_a_value_that_ends_before_its_length_stores_nothing(rest: Rest) -> None:
    """The client's end of sending before its Content-Length: aiohttp ends the connection
    (the 400 the route answers is never read); nothing is stored, the server serves on."""
    with pytest.raises(asyncio.IncompleteReadError):
        await _raw_put(rest.server, _head("/v1/kv/k", 10) + b"abc", b"EOF")
    assert rest.server.engine.get("k") is None
    assert (await rest.put("k", b"v"))[0] == 200


@pytest.mark.asyncio
async def test_a_length_over_the_limit_is_refused_before_the_body_arrives(rest: Rest) -> None:
    """The Content-Length says it: no byte of the body is waited for."""
    status, body = await _raw_put(rest.server, _head("/v1/kv/k", MAX_VALUE + 1))
    assert (status, body["error"]) == (413, "value_too_large")
    status, body = await _raw_put(
        rest.server, _head("/v1/compact", MAX_JSON_BODY_BYTES + 1, "POST")
    )
    assert (status, body["error"]) == (413, "body_too_large")


@pytest.mark.asyncio
async def test_a_txn_that_writes_is_answered_once_durable_and_a_read_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a data dir, a txn that wrote is answered after its fsync (fsync held here); one
    that wrote nothing waits for none."""
    gate = threading.Event()
    real = os.fsync

    def held(fd: int) -> None:
        gate.wait(10)
        real(fd)

    async with (
        HttpStoreServer(port=0, data_dir=str(tmp_path / "data")) as server,
        aiohttp.ClientSession() as http,
    ):
        monkeypatch.setattr(os, "fsync", held)
        try:
            url = f"{server.url}/v1/txn"
            read = await asyncio.wait_for(http.post(url, data=_txn({"op": "get", "key": "a"})), 5)
            assert read.status == 200
            read.release()
            write = asyncio.ensure_future(http.post(url, data=_txn(_put("a", b"1"))))
            await asyncio.sleep(0.3)
            assert not write.done()  # logged, not yet durable: no answer
        finally:
            gate.set()
        response = await asyncio.wait_for(write, 10)
        assert response.status == 200
        assert (await response.json())["revision"] == 1
        response.release()
