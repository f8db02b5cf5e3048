"""``POST /v1/txn`` on the real server over loopback: the JSON form as curl or another language
would send it, the limits and errors (4xx JSON, nothing changed, never a 5xx), and durability."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from helpers.http import ServerThread
from helpers.session_wire import session_wire
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioelastic.errors import LeaseNotFoundError, ValueTooLargeError
from aioelastic.store import Compare, Delete, Get, Put, open_store
from aioelastic.store.http.server import HttpStoreServer


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def _post(url: str, body: object) -> tuple[int, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/txn", data=raw) as r:
        return r.status, json.loads(await r.read())


@pytest.mark.asyncio
async def test_a_txn_in_plain_json(server: HttpStoreServer) -> None:
    status, out = await _post(
        server.url,
        {
            "compare": [{"key": "state", "target": "version", "op": "==", "operand": 0}],
            "success": [
                {"op": "put", "key": "state", "value_b64": _b64(b"ready")},
                {"op": "get", "key": "state"},
                {"op": "range", "prefix": "", "limit": 5},
            ],
            "failure": [{"op": "get", "key": "state"}],
        },
    )
    assert status == 200
    assert out["succeeded"] is True
    assert out["revision"] == 1
    put, got, ranged = out["results"]
    assert put["op"] == "put"
    assert put["prev_kv"] is None
    assert base64.b64decode(got["kv"]["value_b64"]) == b"ready"
    assert (ranged["count"], ranged["more"], len(ranged["kvs"])) == (1, False, 1)
    status, out = await _post(
        server.url,
        {
            "compare": [{"key": "state", "target": "value", "op": "==", "value_b64": _b64(b"x")}],
            "failure": [{"op": "delete_prefix", "prefix": "st"}],
        },
    )
    assert (status, out["succeeded"], out["revision"], out["results"]) == (
        200,
        False,
        2,
        [{"op": "delete", "deleted": 1}],
    )


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "status", "code", "word"),
    [
        (b"{not json", 400, "bad_request", "JSON"),
        ([], 400, "bad_request", "object"),
        ({"compare": {}}, 400, "bad_request", "compare"),
        ({"extra": []}, 400, "bad_request", "unknown field"),
        ({"success": [{"op": "frob", "key": "k"}]}, 400, "bad_request", "frob"),
        ({"success": [{"op": "put", "key": "k", "value_b64": "!!"}]}, 400, "bad_request", "b64"),
        ({"success": [{"op": "put", "key": 5, "value_b64": ""}]}, 400, "bad_request", "key"),
        ({"success": [{"op": "put", "key": "k", "lease": -1}]}, 400, "bad_request", "lease"),
        (
            {"compare": [{"key": "k", "target": "version", "op": ">=", "operand": 1}]},
            400,
            "bad_request",
            "op",
        ),
        (
            {"success": [{"op": "put", "key": "k"}, {"op": "delete", "key": "k"}]},
            400,
            "bad_request",
            "both put and deleted",
        ),
        ({"success": [{"op": "get", "key": "k"}] * 129}, 413, "txn_too_large", "max_txn_ops"),
        (
            {"success": [{"op": "put", "key": "k", "value_b64": _b64(b"x" * 1001)}]},
            413,
            "value_too_large",
            "1000",
        ),
        ({"success": [{"op": "get", "key": "k" * 101}]}, 413, "key_too_large", "100"),
        ({"success": [{"op": "put", "key": "k", "lease": 99}]}, 404, "lease_not_found", "0x63"),
    ],
)
async def test_bad_txns_get_a_json_4xx_and_change_nothing(
    server: HttpStoreServer, body: object, status: int, code: str, word: str
) -> None:
    got, out = await _post(server.url, body)
    assert (got, out["error"]) == (status, code), out
    assert word in out["message"]
    if code == "txn_too_large":
        assert (out["limit"], out["maximum"], out["size"]) == ("ops", 128, 129)
    assert server.engine.revision == 0


@pytest.mark.asyncio
async def test_the_client_maps_server_limits_and_lease_errors(server: HttpStoreServer) -> None:
    async with open_store(server.url) as store:
        with pytest.raises(ValueTooLargeError):
            await store.txn(success=[Put("k", b"x" * 1001)])
        with pytest.raises(LeaseNotFoundError):
            await store.txn(success=[Put("k", b"x", lease=12345)])
        result = await store.txn(
            compare=[Compare.version("k") == 0], success=[Put("k", b"v"), Get("k")]
        )
        assert result.succeeded
        assert await store.current_revision() == 1


@pytest.mark.asyncio
async def test_a_txn_survives_a_restart_with_a_data_dir(tmp_path: Path) -> None:
    async with (
        HttpStoreServer(port=0, data_dir=str(tmp_path)) as srv,
        open_store(srv.url) as store,
    ):
        await store.put("gone", b"x")
        result = await store.txn(success=[Put("a", b"1"), Put("b", b"2"), Delete("gone")])
        revision = result.revision
    async with (
        HttpStoreServer(port=0, data_dir=str(tmp_path)) as srv,
        open_store(srv.url) as store,
    ):
        kvs = await store.range("")
        assert [(kv.key, kv.value, kv.mod_revision) for kv in kvs] == [
            ("a", b"1", revision),
            ("b", b"2", revision),
        ]
        assert await store.current_revision() == revision


# -- fuzz: structured but wrong transactions never get a 5xx --------------------------------------


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[ServerThread]:
    with ServerThread(max_value_bytes=200, max_key_bytes=50) as srv:
        yield srv


_ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=8),
    st.sampled_from(["", "AA==", "k", "value", "==", "<", "!", "put", "version"]),
    st.lists(st.integers(), max_size=2),
)
_OP_ITEM = st.fixed_dictionaries(
    {"op": st.sampled_from(["put", "get", "range", "delete", "delete_prefix", "x"])},
    optional={
        "key": _ANY,
        "prefix": _ANY,
        "value_b64": _ANY,
        "lease": _ANY,
        "limit": _ANY,
    },
)
_COMPARE_ITEM = st.fixed_dictionaries(
    {},
    optional={
        "key": _ANY,
        "target": st.sampled_from(["value", "version", "create_revision", "mod_revision", "x"]),
        "op": st.sampled_from(["==", "!=", "<", ">", "="]),
        "operand": _ANY,
        "value_b64": _ANY,
    },
)
_BODIES = st.fixed_dictionaries(
    {},
    optional={
        "compare": st.one_of(st.lists(_COMPARE_ITEM, max_size=3), _ANY),
        "success": st.one_of(st.lists(_OP_ITEM, max_size=3), _ANY),
        "failure": st.one_of(st.lists(_OP_ITEM, max_size=3), _ANY),
    },
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=_BODIES)
def test_fuzzed_txns_never_get_a_5xx(fuzz_server: ServerThread, body: dict[str, Any]) -> None:
    import http.client

    assert fuzz_server.server is not None
    engine = fuzz_server.server.engine
    before = engine.revision
    conn = http.client.HTTPConnection("127.0.0.1", fuzz_server.server.port, timeout=10)
    try:
        conn.request("POST", "/v1/txn", body=json.dumps(body).encode())
        resp = conn.getresponse()
        status, payload = resp.status, resp.read()
    finally:
        conn.close()
    assert status < 500, (body, payload[:300])
    answer = json.loads(payload)
    if status >= 400:
        assert answer["error"]
        assert answer["message"]
        assert engine.revision == before
    else:
        assert isinstance(answer["succeeded"], bool)


# -- the session's txn operation -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_session_txn_op_answers_and_refuses_cleanly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from aioelastic.store.http._frames import ERROR, REQUEST, RESULT

    async with (
        HttpStoreServer(port=0, max_value_bytes=1000, max_key_bytes=100) as srv,
        session_wire(srv.url) as wire,
    ):

        async def exchange(*frames: list[Any]) -> list[list[Any]]:
            await wire.send(list(frames))
            return await wire.recv()

        await wire.hello()
        bad_args: list[Any] = [
            ["not", "three"],
            [[], [["frob", "k"]], []],
            [[["k", "size", "==", 1]], [], []],
            [[["k", "value", "==", "text"]], [], []],
            [[], [["put", "k", b"v", 0], ["put", "k", b"w", 0]], []],
            [[], [["get", "k"]] * 129, []],
            [[], [["put", "k", b"x" * 1001, 0]], []],
            [[], [["get", "k" * 101]], []],
            [[], [["put", "k", b"v", 99]], []],
        ]
        frames = await exchange(
            *([REQUEST, i + 1, "txn", args] for i, args in enumerate(bad_args)),
            [REQUEST, 99, "txn", [[["k", "version", "==", 0]], [["put", "k", b"v", 0]], []]],
        )
        assert [f[2] for f in frames[:-1]] == [
            "bad_request",
            "bad_request",
            "bad_request",
            "bad_request",
            "bad_request",
            "txn_too_large",
            "value_too_large",
            "key_too_large",
            "lease_not_found",
        ]
        assert frames[5][4] == {"limit": "ops", "maximum": 128, "size": 129}
        assert frames[-1][:2] == [RESULT, 99]
        assert frames[-1][2][:2] == [True, 1]  # only the good one applied
        assert srv.engine.revision == 1
        assert frames[0][0] == ERROR
    assert "Traceback" not in caplog.text
