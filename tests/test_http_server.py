"""The HTTP store server on 127.0.0.1: the routes as curl and raw HTTP see them, bad input,
auth, TLS, metrics, and a hypothesis fuzz that demands 4xx JSON errors and untouched data."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import socket
import ssl
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from helpers.http import ServerThread, self_signed_cert, watcher_removed
from helpers.waiting import eventually
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict
from yarl import URL

from aioelastic.errors import (
    StoreAuthError,
    StoreConnectionError,
    ValueTooLargeError,
)
from aioelastic.store import open_store
from aioelastic.store.http.server import HttpStoreServer
from aioelastic.testing.strategies import any_keys


async def _raw(
    method: str, url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes, CIMultiDict[str]]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, URL(url, encoded=True), data=data, headers=headers) as resp,
    ):
        return resp.status, await resp.read(), CIMultiDict(resp.headers)


# -- a real peer: curl ---------------------------------------------------------------------------


async def _curl(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-w", "\n%{http_code}", *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    body, _, code = out.decode().rpartition("\n")
    return int(code), body


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.asyncio
async def test_curl_reads_and_writes_keys(server: HttpStoreServer) -> None:
    url = server.url
    code, body = await _curl("-X", "PUT", "--data-binary", "hello from curl", f"{url}/v1/kv/job/a")
    assert code == 200
    written = json.loads(body)
    assert written["kv"]["key"] == "job/a"
    async with open_store(url) as store:
        kv = await store.get("job/a")
        assert kv is not None
        assert kv.value == b"hello from curl"
        await store.put("job/b", b"from python")
    code, body = await _curl(f"{url}/v1/kv/job/b")
    assert (code, body) == (200, "from python")
    # compare-and-swap with If-Match on the ETag; a stale one gets 412 and the current value
    rev = written["revision"]
    code, _ = await _curl("-X", "PUT", "-H", f'If-Match: "{rev}"', "-d", "v2", f"{url}/v1/kv/job/a")
    assert code == 200
    code, body = await _curl(
        "-X", "PUT", "-H", f'If-Match: "{rev}"', "-d", "v3", f"{url}/v1/kv/job/a"
    )
    assert code == 412
    assert json.loads(body)["kv"]["value_b64"] == "djI="
    code, body = await _curl("-X", "POST", f"{url}/v1/add/job/counter?delta=41")
    code, body = await _curl("-X", "POST", f"{url}/v1/add/job/counter")
    assert json.loads(body)["value"] == 42
    code, body = await _curl(f"{url}/v1/range/job/")
    assert [kv["key"] for kv in json.loads(body)["kvs"]] == ["job/a", "job/b", "job/counter"]
    code, body = await _curl("-X", "DELETE", f"{url}/v1/range/job/")
    assert json.loads(body)["deleted"] == 3
    code, body = await _curl(f"{url}/v1/kv/job/a")
    assert code == 404
    assert json.loads(body)["error"] == "key_not_found"


# -- routes and headers --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_get_headers_carry_revisions(server: HttpStoreServer) -> None:
    async with open_store(server.url) as store:
        grant = await store.lease_grant(30)
        r1 = await store.put("dir/with/slashes", b"\x00\xffraw", lease=grant.id)
        r2 = await store.put("dir/with/slashes", b"\x00\xffraw2", lease=grant.id)
    status, body, headers = await _raw("GET", f"{server.url}/v1/kv/dir/with/slashes")
    assert status == 200
    assert body == b"\x00\xffraw2"
    assert headers["ETag"] == f'"{r2}"'
    assert headers["X-Create-Revision"] == str(r1)
    assert headers["X-Version"] == "2"
    assert headers["X-Lease"] == str(grant.id)
    status, body, _ = await _raw("GET", f"{server.url}/v1/kv/dir%2Fwith%2Fslashes?format=json")
    assert json.loads(body)["kv"]["mod_revision"] == r2


@pytest.mark.asyncio
async def test_keys_with_url_special_characters_round_trip(server: HttpStoreServer) -> None:
    keys = ["a/../b", "./x", "a//b", "%2F", "sp ace?#&=", "ünï/κλειδί", "..", "a/", "/lead"]
    async with open_store(server.url) as store:
        for i, key in enumerate(keys):
            await store.put(key, str(i).encode())
        for i, key in enumerate(keys):
            kv = await store.get(key)
            assert kv is not None, key
            assert kv.value == str(i).encode(), key
        listed = await store.range("")
        assert sorted(kv.key for kv in listed) == sorted(keys)


@pytest.mark.asyncio
async def test_openapi_healthz_and_metrics(server: HttpStoreServer) -> None:
    status, body, _ = await _raw("GET", f"{server.url}/openapi.json")
    document = json.loads(body)
    assert status == 200
    assert document["openapi"].startswith("3.")
    for path in ("/v1/kv/{key}", "/v1/watch/{prefix}", "/v1/lease/{lease}/keepalive"):
        assert path in document["paths"]
    status, body, _ = await _raw("GET", f"{server.url}/healthz")
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    async with open_store(server.url) as store:
        await store.put("m", b"1")
        await store.lease_grant(30)
        async with store.watch("m"):
            status, body, headers = await _raw("GET", f"{server.url}/metrics")
    text = body.decode()
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert 'aioelastic_requests_total{code="200",op="put"} 1.0' in text
    assert "aioelastic_request_duration_seconds_bucket" in text
    assert "aioelastic_keys 1.0" in text
    assert "aioelastic_leases 1.0" in text
    assert "aioelastic_watch_streams 1.0" in text
    assert "aioelastic_connections " in text


@pytest.mark.asyncio
async def test_a_watch_the_client_closed_is_not_a_server_error(server: HttpStoreServer) -> None:
    # the server learns of the close asynchronously: wait until its stream removes its watcher
    removed = watcher_removed(server.engine)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.url}/v1/watch/w/?progress_interval=0.1") as stream:
            assert json.loads(await stream.content.readline())["type"] == "created"
            server.engine.put("w/1", b"1")
            assert json.loads(await stream.content.readline())["type"] == "events"
        await asyncio.wait_for(removed.wait(), 10)
    _, body, _ = await _raw("GET", f"{server.url}/metrics")
    text = body.decode()
    assert 'aioelastic_requests_total{code="499",op="watch"} 1.0' in text
    assert 'code="500"' not in text


# -- bad input -----------------------------------------------------------------------------------


BAD_REQUESTS: list[tuple[str, str, bytes | None, dict[str, str], int, str]] = [
    ("GET", "/v1/nope", None, {}, 404, "not_found"),
    ("PATCH", "/v1/kv/a", None, {}, 405, "method_not_allowed"),
    ("PUT", "/v1/kv/", b"v", {}, 400, "empty"),
    ("GET", "/v1/kv/", None, {}, 400, "empty"),
    ("PUT", "/v1/kv/" + "k" * 101, b"v", {}, 413, "keys are at most 100"),
    ("PUT", "/v1/kv/big", b"x" * 1001, {}, 413, "at most 1000"),
    ("PUT", "/v1/kv/a?lease=abc", b"v", {}, 400, "lease"),
    ("PUT", "/v1/kv/a?lease=-3", b"v", {}, 400, "lease"),
    ("PUT", "/v1/kv/a?lease=99", b"v", {}, 404, "lease"),
    ("PUT", "/v1/kv/a", b"v", {"If-Match": "yesterday"}, 400, "If-Match"),
    ("PUT", "/v1/kv/a", b"v", {"If-None-Match": "abc"}, 400, "If-None-Match"),
    ("PUT", "/v1/kv/a", b"v", {"If-Match": '"1"', "If-None-Match": "*"}, 400, "not both"),
    ("DELETE", "/v1/kv/a", None, {"If-Match": '"0"'}, 400, "If-Match"),
    ("POST", "/v1/add/a?delta=1.5", None, {}, 400, "delta"),
    ("POST", "/v1/add/a?delta=--5", None, {}, 400, "delta"),
    ("POST", "/v1/add/a?delta=%C2%B2", None, {}, 400, "delta"),
    ("GET", "/v1/lease/%EF%BC%95", None, {}, 400, "lease id"),
    ("POST", "/v1/add/text", None, {}, 400, "not a decimal integer"),
    ("GET", "/v1/range/?limit=0", None, {}, 400, "limit"),
    ("GET", "/v1/range/?limit=" + "9" * 30, None, {}, 400, "limit"),
    ("GET", "/v1/watch/?start_revision=0", None, {}, 400, "start_revision"),
    ("GET", "/v1/watch/?progress_interval=nan", None, {}, 400, "progress_interval"),
    ("GET", "/v1/watch/?progress_interval=0", None, {}, 400, "progress_interval"),
    ("GET", "/v1/watch/?snapshot=yes", None, {}, 400, "snapshot"),
    ("GET", "/v1/watch/?snapshot=1&start_revision=1", None, {}, 400, "start_revision"),
    ("POST", "/v1/lease", b"{", {}, 400, "not valid JSON"),
    ("POST", "/v1/lease", b"[1]", {}, 400, "JSON object"),
    ("POST", "/v1/lease", b'{"ttl": "5"}', {}, 400, "ttl"),
    ("POST", "/v1/lease", b'{"ttl": -1}', {}, 400, "ttl"),
    ("POST", "/v1/lease", b'{"ttl": 1e999}', {}, 400, "ttl"),
    ("POST", "/v1/lease", b'{"ttl": true}', {}, 400, "ttl"),
    ("POST", "/v1/lease", b"[" * 50_000, {}, 400, "JSON"),
    ("POST", "/v1/lease", b" " * 100_000, {}, 413, "too large"),
    ("POST", "/v1/lease", b"\xff\xfe", {}, 400, "JSON"),
    ("GET", "/v1/lease/abc", None, {}, 400, "lease id"),
    ("GET", "/v1/lease/0", None, {}, 400, "lease id"),
    ("GET", "/v1/lease/12345", None, {}, 404, "lease"),
    ("POST", "/v1/lease/12345/keepalive", None, {}, 404, "lease"),
    ("DELETE", "/v1/lease/12345", None, {}, 404, "lease"),
    ("POST", "/v1/compact", b'{"revision": 1000}', {}, 400, "future"),
    ("POST", "/v1/compact", b'{"revision": "1"}', {}, 400, "revision"),
    ("POST", "/v1/compact", b"", {}, 400, "revision"),
]


@pytest.mark.asyncio
async def test_bad_input_gets_a_4xx_json_error_and_changes_nothing(
    server: HttpStoreServer,
) -> None:
    async with open_store(server.url) as store:
        await store.put("text", b"not a number")
        await store.put("a", b"original")
        before = (await store.range("")).to_dict()
        revision = await store.current_revision()
        for method, path, data, headers, status, words in BAD_REQUESTS:
            got, body, resp_headers = await _raw(
                method, server.url + path, data=data, headers=headers
            )
            assert got == status, (method, path, body)
            error = json.loads(body)
            assert resp_headers["Content-Type"].startswith("application/json")
            said = f"{error['error']} {error['message']}".lower()
            assert words.lower() in said, (path, error)
            assert isinstance(error["error"], str)
        assert (await store.range("")).to_dict() == before
        assert await store.current_revision() == revision


def _raw_socket_exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(payload)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
    return b"".join(chunks)


@pytest.mark.asyncio
async def test_huge_and_malformed_http_gets_json_4xx(server: HttpStoreServer) -> None:
    port = server.port
    cases = [
        b"GET /v1/revision HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
        b"GET /v1/revision HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-H%d: v\r\n" % i for i in range(200))
        + b"\r\n",
        b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03garbage that is not HTTP\r\n\r\n",
        b"GET /v1/revision HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    ]
    for payload in cases:
        answer = await asyncio.to_thread(_raw_socket_exchange, port, payload)
        head, _, body = answer.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        assert 400 <= status < 500, answer[:300]
        assert b"application/json" in head
        error = json.loads(body)
        assert error["message"]
    status, body, _ = await _raw("GET", f"{server.url}/healthz")
    assert status == 200  # still serving


@pytest.mark.asyncio
async def test_compressed_bodies_are_refused_with_415_and_store_nothing(
    server: HttpStoreServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Content codings are refused (415), never decoded in part or stored compressed; an
    undecodable body is a 415 too, not a 500 with a traceback."""
    import gzip
    import zlib

    value = b"0123456789" * 90  # 900 bytes: under the 1000-byte limit
    cases = [
        ("gzip", gzip.compress(value)),
        ("deflate", zlib.compress(value)),
        ("gzip", b"this is not gzip at all"),
        ("deflate", b"\x78\x9c not deflate"),
        ("br", b"\x00\x01"),
        ("x-unknown", value),
        ("gzip, identity", gzip.compress(value)),
    ]
    for i, (coding, body) in enumerate(cases):
        headers = {"Content-Encoding": coding}
        status, answer, got = await _raw(
            "PUT", f"{server.url}/v1/kv/c{i}", data=body, headers=headers
        )
        assert status == 415, (coding, answer)
        assert json.loads(answer)["error"] == "unsupported_content_encoding"
        assert got["Accept-Encoding"] == "identity"
        assert server.engine.get(f"c{i}") is None
    status, answer, _ = await _raw(
        "POST",
        f"{server.url}/v1/lease",
        data=gzip.compress(b'{"ttl": 5}'),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert status == 415, answer
    assert server.engine.lease_count == 0
    status, answer, _ = await _raw(
        "PUT", f"{server.url}/v1/kv/plain", data=value, headers={"Content-Encoding": "identity"}
    )
    assert status == 200, answer
    # A transfer coding besides chunked: refused, not stored compressed.
    compressed = gzip.compress(value)
    request = (
        b"PUT /v1/kv/te HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(compressed), compressed)
    )
    raw = await asyncio.to_thread(_raw_socket_exchange, server.port, request)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert int(head.split(b" ", 2)[1]) == 415, raw[:300]
    assert json.loads(body)["error"] == "unsupported_transfer_encoding"
    assert server.engine.get("te") is None
    assert (await _raw("GET", f"{server.url}/healthz"))[0] == 200
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


@pytest.mark.asyncio
async def test_client_maps_limits_to_value_too_large(server: HttpStoreServer) -> None:
    async with open_store(server.url) as store:
        with pytest.raises(ValueTooLargeError):
            await store.put("big", b"x" * 1001)
        with pytest.raises(ValueTooLargeError):
            await store.put("k" * 101, b"v")
        assert await store.current_revision() == 0


# -- security ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_token_required_everywhere_but_healthz(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    async with HttpStoreServer(port=0, token="s3cret-token") as srv:
        for method, path in [
            ("GET", "/v1/kv/a"),
            ("PUT", "/v1/kv/a"),
            ("GET", "/metrics"),
            ("GET", "/openapi.json"),
            ("GET", "/v1/nope"),
            ("GET", "/v1/watch/"),
        ]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
                status, body, resp_headers = await _raw(method, srv.url + path, headers=headers)
                assert status == 401, (path, headers)
                assert json.loads(body)["error"] == "unauthorized"
                assert resp_headers["WWW-Authenticate"].startswith("Bearer")
        status, _, _ = await _raw("GET", f"{srv.url}/healthz")
        assert status == 200
        async with open_store(srv.url, token="wrong") as bad:
            with pytest.raises(StoreAuthError):
                await bad.get("a")
            with pytest.raises(StoreAuthError):
                await bad.put("a", b"v")
            with pytest.raises(StoreAuthError):
                await bad.watch("").start()
        async with open_store(srv.url, token_file=str(token_file)) as good:
            await good.put("a", b"v")
            async with good.watch("a", start_revision=1) as events:
                assert (await events.__anext__()).kv.value == b"v"
        assert srv.engine.revision == 1


@pytest.mark.asyncio
async def test_tls_with_a_self_signed_certificate(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    with self_signed_cert(tmp_path) as (cert, key):
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        async with HttpStoreServer(port=0, ssl_context=context) as srv:
            assert srv.url.startswith("https://127.0.0.1:")
            async with open_store(srv.url, cafile=str(cert)) as store:
                await store.put("tls", b"ok")
                async with store.watch("tls", start_revision=1) as events:
                    assert (await events.__anext__()).kv.value == b"ok"
            async with open_store(srv.url) as untrusting:
                with pytest.raises(StoreConnectionError, match="ertificate"):
                    await untrusting.get("tls")
            plain = srv.url.replace("https://", "http://")
            # the server hangs up on it: retried (it may be a busy server) within the deadline
            async with open_store(plain, read_retries=0, timeout=1.0) as confused:
                with pytest.raises(StoreConnectionError):
                    await confused.get("tls")


def test_the_server_binds_loopback_by_default() -> None:
    assert HttpStoreServer().host == "127.0.0.1"
    from aioelastic.cli import build_parser

    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port) == ("127.0.0.1", 29400)


# -- fuzz ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[ServerThread]:
    with ServerThread(max_value_bytes=2000, max_key_bytes=200) as srv:
        yield srv


_PATHS = st.sampled_from(
    [
        "/v1/kv/",
        "/v1/range/",
        "/v1/watch/",
        "/v1/add/",
        "/v1/lease/",
        "/v1/lease",
        "/v1/leases",
        "/v1/compact",
        "/v1/txn",
        "/v1/revision",
        "/healthz",
        "/metrics",
        "/",
        "/v2/",
    ]
)
_TEXT = st.text(max_size=40)
_QUERY_NAMES = st.sampled_from(
    ["lease", "limit", "delta", "start_revision", "progress_interval", "snapshot", "format", "x"]
)
_QUERY_VALUES = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["", "nan", "inf", "-0", "1e3", "json", "0x10", " 5 ", "\uff10"]),
    _TEXT,
)
_HEADERS = st.dictionaries(
    st.sampled_from(["If-Match", "If-None-Match", "Content-Type", "Authorization"]),
    st.one_of(st.sampled_from(['"1"', "*", 'W/"2"', '"-1"', "", '""']), _TEXT).map(
        lambda v: "".join(c for c in v if 32 <= ord(c) < 127)
    ),
    max_size=2,
)
_BODIES = st.one_of(
    st.none(),
    st.binary(max_size=3000),
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), _TEXT),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(st.sampled_from(["ttl", "revision", "x"]), inner, max_size=3),
        ),
        max_leaves=6,
    ).map(lambda obj: json.dumps(obj).encode()),
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    method=st.sampled_from(["GET", "PUT", "POST", "DELETE", "PATCH", "HEAD"]),
    path=_PATHS,
    tail=_TEXT,
    query=st.dictionaries(_QUERY_NAMES, _QUERY_VALUES, max_size=3),
    headers=_HEADERS,
    body=_BODIES,
)
def test_fuzzed_requests_never_get_a_5xx(
    fuzz_server: ServerThread,
    method: str,
    path: str,
    tail: str,
    query: dict[str, str],
    headers: dict[str, str],
    body: bytes | None,
) -> None:
    import http.client

    assert fuzz_server.server is not None
    engine = fuzz_server.server.engine
    if "progress_interval" not in query and path == "/v1/watch/":
        query["progress_interval"] = "0.05"
    target = path + urllib.parse.quote(tail, safe="/") + "?" + urllib.parse.urlencode(query)
    before = (engine.revision, len(engine), engine.lease_count)
    conn = http.client.HTTPConnection("127.0.0.1", fuzz_server.server.port, timeout=10)
    try:
        conn.request(method, target, body=body, headers=headers)
        resp = conn.getresponse()
        if resp.getheader("Content-Type", "").startswith("application/x-ndjson"):
            first = resp.readline()  # a watch stream: its first frame, then hang up
            assert json.loads(first)["type"] == "created"
            status, payload = resp.status, b""
        else:
            status, payload = resp.status, resp.read()
    finally:
        conn.close()
    assert status < 500, (method, target, payload[:300])
    if status >= 400 and method != "HEAD":
        error = json.loads(payload)
        assert error["error"]
        assert error["message"]
        after = (engine.revision, len(engine), engine.lease_count)
        if after[2] >= before[2]:  # (unless a fuzzed short lease expired meanwhile)
            assert after == before, (method, target, payload[:300])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=any_keys(max_size=20))
def test_any_key_round_trips_over_http(fuzz_server: ServerThread, key: str) -> None:
    """Every key the protocol allows (newlines included: once a 404 "no route") is written,
    read, listed, watched, added to and deleted through the real client."""

    async def main() -> None:
        async with open_store(fuzz_server.url, read_retries=0) as store:
            space = store.namespace(f"any-{uuid.uuid4().hex}/")
            written = await space.put(key, b"v")
            assert (await space.get(key)) is not None
            assert [kv.key for kv in await space.range(key)] == [key]
            async with space.watch(key, start_revision=written) as events:
                event = await asyncio.wait_for(events.__anext__(), 10)
            assert event.kv.key == key
            assert (await space.compare_and_delete(key, written)).succeeded
            assert await space.add(key, 3) == 3
            assert await space.delete_prefix("") == 1

    asyncio.run(main())


def test_the_openapi_document_describes_every_route() -> None:
    from aioelastic.store import MemoryEngine
    from aioelastic.store.http._openapi import openapi_document
    from aioelastic.store.http.server import make_app

    app = make_app(MemoryEngine())
    document = openapi_document(4096, 1024)
    described = {
        (path, method.upper())
        for path, item in document["paths"].items()
        for method in item
        if method != "parameters"
    }
    served = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter", "")
        served.add((path, route.method))
    assert served == described


@pytest.mark.asyncio
async def test_watch_streams_are_limited() -> None:
    async with (
        HttpStoreServer(port=0, max_watch_streams=3) as srv,
        open_store(srv.url, read_retries=0) as store,
    ):
        watches = [store.watch(f"w{i}/") for i in range(3)]
        for watch in watches:
            await watch.start()
        status, body, _ = await _raw("GET", f"{srv.url}/v1/watch/x?progress_interval=0.1")
        assert status == 503
        assert json.loads(body)["error"] == "too_many_watches"
        with pytest.raises(StoreConnectionError, match="at most 3"):
            await store.watch("x").start()
        await watches[0].aclose()
        # the server notices the closed stream at its next progress frame
        await eventually(lambda: srv.statistics()["watch_streams"] < 3, 5, "a stream kept")
        async with store.watch("y/"):
            pass
        for watch in watches[1:]:
            await watch.aclose()


@pytest.mark.asyncio
async def test_server_runs_without_prometheus_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """A base install (no `server` extra) still serves; only /metrics says what is missing."""
    import sys

    import aiohttp

    from aioelastic.store.http.server import HttpStoreServer

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import now raises ImportError
    async with HttpStoreServer(port=0) as server, aiohttp.ClientSession() as session:
        async with session.put(f"{server.url}/v1/kv/a", data=b"1") as response:
            assert response.status == 200
        async with session.get(f"{server.url}/metrics") as response:
            assert response.status == 501
            body = await response.json()
        assert body["error"] == "metrics_unavailable"
        assert "aioelastic[server]" in body["message"]


@pytest.mark.asyncio
async def test_the_fast_path_answers_as_the_routed_path(server: HttpStoreServer) -> None:
    """GET/PUT /v1/kv/ skip aiohttp's router; a request with ``Expect`` takes the routed way.
    Both must cut the same key from the path and answer the same."""
    base = f"{server.url}/v1/kv/"
    for raw_key, key in (
        ("a%2Fb%25c", "a/b%c"),
        ("x/y", "x/y"),
        ("%C3%A9t%C3%A9", "été"),
        ("sp%20ace", "sp ace"),
        ("lit%252F", "lit%2F"),
    ):
        for expect in (False, True):
            headers = {"Expect": "100-continue"} if expect else None
            value = f"{key}/{expect}".encode()
            status, body, _ = await _raw("PUT", base + raw_key, data=value, headers=headers)
            assert status == 200, body
            assert json.loads(body)["kv"]["key"] == key
            kv = server.engine.get(key)
            assert kv is not None
            assert kv.value == value
            status, body, got = await _raw("GET", base + raw_key, headers=headers)
            assert (status, body) == (200, value)
            assert got["X-Mod-Revision"] == str(kv.mod_revision)
    for path, expected in (("", 400), ("%0A", 404), ("k", 404)):
        for headers in (None, {"Expect": "100-continue"}):
            status, body, _ = await _raw("GET", base + path, headers=headers)
            assert status == expected, (path, body)
            assert "error" in json.loads(body)
    status, body, _ = await _raw("PUT", base + "big", data=b"x" * 1001)
    assert (status, json.loads(body)["error"]) == (413, "value_too_large")


# -- the read deadline (slowloris) ---------------------------------------------------------------

READ_TIMEOUT = 0.3


async def _stalled_exchange(port: int, payload: bytes) -> tuple[bytes, float]:
    """Send ``payload`` and stay silent; (everything answered until the server closed the
    connection, seconds it took). Bounded: a server that never closes fails the test."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        start = loop.time()
        writer.write(payload)
        try:
            answer = await asyncio.wait_for(reader.read(), 10)  # until the server closes
        except ConnectionResetError:
            answer = b""
        return answer, loop.time() - start
    finally:
        writer.close()


def _answers(raw: bytes) -> list[tuple[int, bytes]]:
    """The (status, body) of each Content-Length-framed answer in ``raw``."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(
            int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length")
        )
        out.append((int(lines[0].split(b" ")[1]), rest[:length]))
        raw = rest[length:]
    return out


STALLED_REQUESTS = [
    # (what, bytes sent, expected statuses, the op the 408 is counted as)
    ("half a request line", b"GET /v1/kv/a HT", [408], "other"),
    ("headers without the blank line", b"GET /v1/kv/a HTTP/1.1\r\nHost: x\r\n", [408], "other"),
    (
        "a short body (fast path)",
        b"PUT /v1/kv/a HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc",
        [408],
        "put",
    ),
    (
        "a short JSON body (routed)",
        b"POST /v1/lease HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{",
        [408],
        "lease_grant",
    ),
    (
        "a request, then half of the next",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/kv/a HTTP/1.1\r\nHo",
        [200, 408],
        "other",
    ),
]


@pytest.mark.asyncio
async def test_a_stalled_request_is_closed_with_408_within_the_read_timeout() -> None:
    async with HttpStoreServer(port=0, read_timeout=READ_TIMEOUT) as srv:
        for what, payload, statuses, op in STALLED_REQUESTS:
            answer, took = await _stalled_exchange(srv.port, payload)
            answers = _answers(answer)
            assert [status for status, _ in answers] == statuses, (what, answer)
            error = json.loads(answers[-1][1])
            assert error["error"] == "request_timeout", what
            assert "read timeout" in error["message"]
            # closed at the deadline: not before, and not much after
            assert READ_TIMEOUT * 0.9 <= took < READ_TIMEOUT + 2, (what, took)
            _, body, _ = await _raw("GET", f"{srv.url}/metrics")
            assert f'aioelastic_requests_total{{code="408",op="{op}"}}' in body.decode(), what
        assert srv.engine.get("a") is None
        assert srv.engine.lease_count == 0
        _, body, _ = await _raw("GET", f"{srv.url}/metrics")
        assert 'aioelastic_requests_total{code="408",op="other"} 3.0' in body.decode()


async def _read_answer(reader: asyncio.StreamReader) -> int:
    """Read one Content-Length-framed answer; its status."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await asyncio.wait_for(reader.readexactly(length), 10)
    return int(head.split(b" ")[1])


@pytest.mark.asyncio
async def test_the_read_timeout_spares_idle_connections_and_silent_watches() -> None:
    async with HttpStoreServer(port=0, read_timeout=READ_TIMEOUT) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        watch_reader, watch_writer = await asyncio.open_connection("127.0.0.1", srv.port)
        try:
            # a keep-alive connection idle between requests for longer than the deadline
            put = b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nv"
            writer.write(put)
            assert await _read_answer(reader) == 200
            # a watch whose stream stays silent for longer than the deadline
            watch_writer.write(
                b"GET /v1/watch/w/?progress_interval=300 HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            head = await asyncio.wait_for(watch_reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200"), head
            await asyncio.sleep(READ_TIMEOUT * 4)  # under test: idle past the read timeout
            writer.write(put)
            assert await _read_answer(reader) == 200
            srv.engine.put("w/1", b"x")
            seen = b""
            while b'"type":"events"' not in seen:
                chunk = await asyncio.wait_for(watch_reader.read(65536), 10)
                assert chunk, "the watch stream was closed"
                seen += chunk
            # a body that arrives in pieces, within the deadline, is read
            writer.write(b"PUT /v1/kv/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n")
            await asyncio.sleep(READ_TIMEOUT / 3)  # deliberate: the body's pieces apart
            writer.write(b"a")
            await asyncio.sleep(READ_TIMEOUT / 3)
            writer.write(b"b")
            assert await _read_answer(reader) == 200
            assert srv.statistics()["watch_streams"] == 1
        finally:
            writer.close()
            watch_writer.close()
        kv = srv.engine.get("slow")
        assert kv is not None
        assert kv.value == b"ab"
        _, body, _ = await _raw("GET", f"{srv.url}/metrics")
        assert 'code="408"' not in body.decode()


def test_the_read_timeout_is_checked() -> None:
    for bad in (0, -1.0, float("nan"), float("inf"), "5", True):
        with pytest.raises(ValueError, match="read_timeout must be"):
            HttpStoreServer(port=0, read_timeout=bad)  # type: ignore[arg-type]
    HttpStoreServer(port=0, read_timeout=None)


@pytest.mark.asyncio
async def test_an_idle_keep_alive_connection_is_closed_after_the_keepalive_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aioelastic.store.http import server as server_module

    monkeypatch.setattr(server_module, "KEEPALIVE_TIMEOUT", 0.3)
    async with HttpStoreServer(port=0) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        try:
            writer.write(b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nv")
            assert await _read_answer(reader) == 200
            # then silence: the server hangs up (an hour later without a keep-alive timeout)
            assert await asyncio.wait_for(reader.read(), 5) == b""
        finally:
            writer.close()


# -- conditional deletes, Expect: 100-continue, body limits ---------------------------------------


@pytest.mark.asyncio
async def test_delete_with_if_none_match_star_deletes_nothing(server: HttpStoreServer) -> None:
    """``If-None-Match: *`` holds only while the key is absent (RFC 9110): 412 and the key kept
    when it exists, ``deleted: 0`` when it does not; it was ignored (the key deleted)."""
    base = f"{server.url}/v1/kv/"
    revision = server.engine.put("kept", b"v", 0)
    status, body, _ = await _raw("DELETE", base + "kept", headers={"If-None-Match": "*"})
    assert status == 412, body
    assert json.loads(body)["kv"]["mod_revision"] == revision
    assert server.engine.get("kept") is not None
    status, body, _ = await _raw("DELETE", base + "absent", headers={"If-None-Match": "*"})
    assert (status, json.loads(body)["deleted"]) == (200, 0)
    for headers in ({"If-None-Match": '"3"'}, {"If-None-Match": "*", "If-Match": f'"{revision}"'}):
        status, body, _ = await _raw("DELETE", base + "kept", headers=headers)
        assert status == 400, (headers, body)
    assert server.engine.revision == revision


async def _expect_exchange(port: int, head: bytes) -> tuple[bytes, bytes]:
    """Send a request head with ``Expect: 100-continue`` and no body; (the first answer's status
    line, everything read within a second)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        first = await asyncio.wait_for(reader.readline(), 10)
        try:
            rest = await asyncio.wait_for(reader.read(65536), 1)
        except TimeoutError:
            rest = b""
        return first, rest
    finally:
        writer.close()


@pytest.mark.asyncio
async def test_100_continue_only_after_auth_and_length_are_checked() -> None:
    """A client waiting for ``100 Continue`` learns of a wrong token, an oversized body or a
    coding at once, before it sends the body (aiohttp sent 100 before any check)."""
    async with HttpStoreServer(port=0, token="t0ken", max_value_bytes=1000) as srv:

        def head(method: str, path: str, length: int, extra: str = "") -> bytes:
            return (
                f"{method} {path} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                f"Content-Length: {length}\r\n{extra}\r\n"
            ).encode()

        good = "Authorization: Bearer t0ken\r\n"
        for request, status in (
            (head("PUT", "/v1/kv/a", 10), b"401"),
            (head("PUT", "/v1/kv/a", 10, "Authorization: Bearer nope\r\n"), b"401"),
            (head("PUT", "/v1/kv/a", 1001, good), b"413"),
            (head("POST", "/v1/lease", 70_000, good), b"413"),
            (head("PUT", "/v1/kv/a", 10, good + "Content-Encoding: gzip\r\n"), b"415"),
            (head("PUT", "/v1/kv/a", 10, good).replace(b"100-continue", b"x-other"), b"417"),
        ):
            first, rest = await _expect_exchange(srv.port, request)
            assert first.split(b" ")[1] == status, (request, first, rest)
            assert b"100 Continue" not in first + rest
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        try:
            writer.write(head("PUT", "/v1/kv/a", 5, good))
            assert await asyncio.wait_for(reader.readline(), 10) == b"HTTP/1.1 100 Continue\r\n"
            assert await asyncio.wait_for(reader.readline(), 10) == b"\r\n"
            writer.write(b"hello")
            assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"HTTP/1.1 200")
        finally:
            writer.close()
        kv = srv.engine.get("a")
        assert kv is not None
        assert kv.value == b"hello"
        assert srv.engine.revision == 1


@pytest.mark.asyncio
async def test_json_bodies_are_bounded_by_their_own_limit_and_values_by_theirs() -> None:
    """JSON bodies (lease grant, compact) at most 64 KiB whatever the value limit (they were
    taken up to the value limit + 64 KiB); a value exactly at the limit passes, chunked too."""
    from aioelastic.store.http._limits import MAX_JSON_BODY_BYTES

    async with HttpStoreServer(port=0, max_value_bytes=200_000) as srv:
        grant = b'{"ttl": 5}'
        at_limit = grant + b" " * (MAX_JSON_BODY_BYTES - len(grant))
        status, body, _ = await _raw("POST", f"{srv.url}/v1/lease", data=at_limit)
        assert status == 200, body
        for data in (at_limit + b" ", grant + b" " * 150_000):
            status, body, _ = await _raw("POST", f"{srv.url}/v1/lease", data=data)
            assert (status, json.loads(body)["error"]) == (413, "body_too_large")

        async def chunks(size: int) -> AsyncIterator[bytes]:
            for _ in range(size // 1000):
                yield b"x" * 1000

        for size, expected in ((200_000, 200), (201_000, 413)):
            async with (
                aiohttp.ClientSession() as session,
                session.put(f"{srv.url}/v1/kv/v{size}", data=chunks(size)) as resp,
            ):
                assert resp.status == expected, await resp.read()
        assert srv.engine.lease_count == 1
        kv = srv.engine.get("v200000")
        assert kv is not None
        assert len(kv.value) == 200_000
        assert srv.engine.get("v201000") is None


def test_a_client_gone_mid_answer_is_not_a_storage_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A connection error while answering (a write to a closed socket) is the client's leaving:
    counted as 499 and logged at debug, never ``storage_error`` 500 with an error line."""
    from aiohttp.test_utils import make_mocked_request

    from aioelastic.store.http._limits import Limits
    from aioelastic.store.http._metrics import NoMetrics
    from aioelastic.store.http._state import ServerState
    from aioelastic.store.memory import MemoryEngine

    state = ServerState(
        MemoryEngine(), token=None, limits=Limits(64, 64, 4), data=None, metrics=NoMetrics()
    )
    request = make_mocked_request("GET", "/v1/session")
    gone = aiohttp.ClientConnectionResetError("Cannot write to closing transport")
    with caplog.at_level(logging.DEBUG, logger="aioelastic"):
        answer = state._error_answer(request, gone)
    assert answer is not None
    assert answer.status == 499
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    failed = state._error_answer(request, OSError(5, "Input/output error"))  # the data dir's
    assert failed is not None
    assert failed.status == 500
