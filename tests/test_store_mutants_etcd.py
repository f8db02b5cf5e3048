"""Gaps that mutation testing of the etcd backend found (``scripts/mutants store-etcd``): each test
here fails on a realistic bug of the shape of a mutant the rest of the suite let through.

The wire mapping (``_etcd_codec``) is pure: its tests build etcd's messages directly and need no
etcd. The others run against a real etcd (the ``etcd`` fixture)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
from helpers import free_port

from aioelastic.errors import (
    CompactedError,
    LeaseNotFoundError,
    StoreAuthError,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
    WriteOutcomeUnknownError,
)
from aioelastic.store import (
    Compare,
    Delete,
    DeletePrefix,
    DeleteResult,
    EventType,
    Get,
    GetResult,
    KeyValue,
    LeaseStatus,
    Put,
    PutResult,
    Range,
    RangeResult,
    WatchEvent,
)

pytestmark = pytest.mark.etcd

grpc = pytest.importorskip("grpc")

from aioelastic._etcd._rpc import _types as message_types  # noqa: E402
from aioelastic._etcd._rpc import kv_pb2, rpc_pb2  # noqa: E402
from aioelastic._etcd.client import TLSConfig  # noqa: E402
from aioelastic._secrets import ETCD_PASSWORD_ENV, ETCD_PASSWORD_FILE_ENV  # noqa: E402
from aioelastic.etcd_server import EtcdServer  # noqa: E402
from aioelastic.store._etcd_codec import (  # noqa: E402
    ALL_KEYS,
    compare_pb,
    decode_key,
    encode_key,
    op_pb,
    op_result,
    prefix_range,
    to_event,
    to_kv,
)
from aioelastic.store.etcd import EtcdStore, _resolve_password, open_etcd_store  # noqa: E402

# -- the wire mapping (no etcd) --------------------------------------------------------------------


def test_a_key_that_utf8_cannot_encode_is_refused_by_its_name() -> None:
    """A lone surrogate outside surrogateescape's range: a ValueError naming the argument."""
    with pytest.raises(ValueError, match=r"^key '\\ud800' cannot be encoded as UTF-8$"):
        encode_key("\ud800")
    with pytest.raises(ValueError, match=r"^prefix 'a\\ud800' cannot be encoded as UTF-8$"):
        encode_key("a\ud800", "prefix")
    with pytest.raises(ValueError, match=r"^prefix '\\ud800' cannot be encoded"):
        prefix_range("\ud800")


def test_keys_round_trip_as_utf8_with_undecodable_bytes_escaped() -> None:
    assert encode_key("k/é") == "k/é".encode()
    assert encode_key("k\udcff") == b"k\xff"  # surrogateescape: a byte that is not UTF-8
    assert decode_key(b"k\xff") == "k\udcff"
    assert decode_key("k/é".encode()) == "k/é"


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("", (b"\0", b"\0")),
        ("a", (b"a", b"b")),
        ("a/\udcfe", (b"a/\xfe", b"a/\xff")),
        ("a\udcff", (b"a\xff", b"b")),  # a last byte of 0xFF carries into the one before
        ("a\udcff\udcff", (b"a\xff\xff", b"b")),
        ("\udcff", (b"\xff", b"\0")),  # every byte 0xFF: to the end of the key space
        ("\udcff\udcff", (b"\xff\xff", b"\0")),
    ],
)
def test_prefix_range_is_etcds_rule(prefix: str, expected: tuple[bytes, bytes]) -> None:
    assert prefix_range(prefix) == expected
    assert ALL_KEYS == b"\0"


def _kv(key: bytes = b"k", **fields: Any) -> Any:
    values = {"value": b"v", "create_revision": 3, "mod_revision": 7, "version": 2, "lease": 11}
    return kv_pb2.KeyValue(key=key, **{**values, **fields})


def test_a_key_value_keeps_every_field() -> None:
    assert to_kv(_kv(b"k\xff")) == KeyValue("k\udcff", b"v", 3, 7, 2, 11)
    assert type(to_kv(_kv()).value) is bytes


def test_events_put_with_their_key_value_delete_with_key_and_revision_only() -> None:
    put = kv_pb2.Event(type=kv_pb2.Event.PUT, kv=_kv())
    assert to_event(put) == WatchEvent(EventType.PUT, KeyValue("k", b"v", 3, 7, 2, 11))
    # etcd's DELETE event carries the key and the delete's revision (and may carry more)
    delete = kv_pb2.Event(type=kv_pb2.Event.DELETE, kv=_kv(b"d\xff", mod_revision=9))
    assert to_event(delete) == WatchEvent(EventType.DELETE, KeyValue("d\udcff", b"", 0, 9, 0, 0))


@pytest.mark.parametrize(
    ("op", "result"),
    [
        ("==", rpc_pb2.Compare.EQUAL),
        ("!=", rpc_pb2.Compare.NOT_EQUAL),
        ("<", rpc_pb2.Compare.LESS),
        (">", rpc_pb2.Compare.GREATER),
    ],
)
@pytest.mark.parametrize(
    ("target", "operand", "wire"),
    [
        ("value", b"x", rpc_pb2.Compare.VALUE),
        ("version", 4, rpc_pb2.Compare.VERSION),
        ("create_revision", 5, rpc_pb2.Compare.CREATE),
        ("mod_revision", 6, rpc_pb2.Compare.MOD),
        ("lease", 7, rpc_pb2.Compare.LEASE),
    ],
)
def test_a_compare_maps_its_op_target_key_and_operand(
    op: Any, result: int, target: Any, operand: int | bytes, wire: int
) -> None:
    pb = compare_pb(Compare("c\udcff", target, op, operand))
    assert (pb.result, pb.target, pb.key) == (result, wire, b"c\xff")
    assert pb.WhichOneof("target_union") == target
    assert getattr(pb, target) == operand


def test_each_operation_maps_to_its_request() -> None:
    put = op_pb(Put("p\udcff", b"v", lease=9)).request_put
    assert (put.key, put.value, put.lease, put.prev_kv) == (b"p\xff", b"v", 9, True)
    get = op_pb(Get("g\udcff")).request_range
    assert (get.key, get.range_end, get.limit) == (b"g\xff", b"", 0)
    ranged = op_pb(Range("r/", limit=3)).request_range
    assert (ranged.key, ranged.range_end, ranged.limit) == (b"r/", b"r0", 3)
    unlimited = op_pb(Range("r/")).request_range
    assert (unlimited.key, unlimited.range_end, unlimited.limit) == (b"r/", b"r0", 0)
    delete = op_pb(Delete("d\udcff")).request_delete_range
    assert (delete.key, delete.range_end) == (b"d\xff", b"")
    prefix = op_pb(DeletePrefix("x/")).request_delete_range
    assert (prefix.key, prefix.range_end) == (b"x/", b"x0")
    everything = op_pb(DeletePrefix("")).request_delete_range
    assert (everything.key, everything.range_end) == (b"\0", b"\0")


def test_each_operations_result_is_read_from_its_response() -> None:
    def response(**fields: Any) -> Any:
        return rpc_pb2.ResponseOp(**fields)

    prev = _kv(b"p", value=b"old", create_revision=4, mod_revision=6, version=3, lease=0)
    updated = op_result(
        Put("p", b"new", lease=5), response(response_put=rpc_pb2.PutResponse(prev_kv=prev)), 20
    )
    assert updated == PutResult(
        KeyValue("p", b"new", 4, 20, 4, 5), KeyValue("p", b"old", 4, 6, 3, 0)
    )
    created = op_result(Put("p", b"new", lease=5), response(response_put=rpc_pb2.PutResponse()), 20)
    assert created == PutResult(KeyValue("p", b"new", 20, 20, 1, 5), None)
    found = op_result(Get("k"), response(response_range=rpc_pb2.RangeResponse(kvs=[_kv()])), 20)
    assert found == GetResult(KeyValue("k", b"v", 3, 7, 2, 11))
    missing = op_result(Get("k"), response(response_range=rpc_pb2.RangeResponse()), 20)
    assert missing == GetResult(None)
    page = rpc_pb2.RangeResponse(kvs=[_kv(b"r/a"), _kv(b"r/b")], count=5, more=True)
    ranged = op_result(Range("r/", limit=2), response(response_range=page), 20)
    assert ranged == RangeResult(
        (KeyValue("r/a", b"v", 3, 7, 2, 11), KeyValue("r/b", b"v", 3, 7, 2, 11)), 20, 5, True
    )
    deleted = rpc_pb2.DeleteRangeResponse(deleted=3)
    assert op_result(Delete("k"), response(response_delete_range=deleted), 20) == DeleteResult(3)
    assert op_result(
        DeletePrefix("x/"), response(response_delete_range=deleted), 20
    ) == DeleteResult(3)


# -- the store's options and URL (no etcd: channels open on first use) ---------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("bad", [True, "5", -1, -0.5, float("nan"), None])
async def test_watch_reconnect_timeout_must_be_seconds_at_least_zero(bad: Any) -> None:
    expected = f"watch_reconnect_timeout must be a number of seconds >= 0, got {bad!r}"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        EtcdStore(["127.0.0.1:1"], watch_reconnect_timeout=bad)


@pytest.mark.asyncio
@pytest.mark.parametrize(("given", "kept"), [(0, 0.0), (7, 7.0), (2.5, 2.5)])
async def test_watch_reconnect_timeout_is_kept_as_float_seconds(given: float, kept: float) -> None:
    async with EtcdStore(["127.0.0.1:1"], watch_reconnect_timeout=given) as store:
        assert store.watch_reconnect_timeout == kept
        assert type(store.watch_reconnect_timeout) is float


@pytest.mark.asyncio
async def test_repr_names_scheme_members_and_whether_closed() -> None:
    store = EtcdStore("127.0.0.1:1,127.0.0.1:2")
    assert repr(store) == "<EtcdStore etcd://127.0.0.1:1,127.0.0.1:2>"
    await store.aclose()
    assert repr(store) == "<EtcdStore etcd://127.0.0.1:1,127.0.0.1:2 closed>"
    async with EtcdStore(["127.0.0.1:1"], tls=TLSConfig()) as secure:
        assert repr(secure) == "<EtcdStore etcds://127.0.0.1:1>"


async def _opened(url: str, **options: Any) -> EtcdStore:
    store = await open_etcd_store(urlsplit(url), options)
    await store.aclose()
    return store


@pytest.mark.asyncio
async def test_url_refusals_name_the_url_with_its_password_hidden() -> None:
    shown = "'etcd://u:***@127.0.0.1:1/x'"
    with pytest.raises(
        ValueError,
        match=re.escape(f"etcd URL must be etcd://host:port[,host:port...], got {shown}"),
    ):
        await _opened("etcd://u:secret@127.0.0.1:1/x")
    with pytest.raises(ValueError, match=r"^etcd URL must be etcd://host:port"):
        await _opened("etcd://127.0.0.1:1#frag")
    with pytest.raises(
        ValueError, match=re.escape("etcd URL must name at least one host:port, got 'etcd://,'")
    ):
        await _opened("etcd://,")
    with pytest.raises(
        TypeError, match=re.escape("unknown option(s) for the etcd store: ['colour', 'size']")
    ):
        await _opened("etcd://127.0.0.1:1?size=1", colour="blue")
    with pytest.raises(
        ValueError, match=re.escape("option ping_after must be a number of seconds, got 'soon'")
    ):
        await _opened("etcd://127.0.0.1:1?ping_after=soon")
    for path in ("", "/"):
        assert (await _opened(f"etcd://127.0.0.1:1{path}")).client.tls is None


@pytest.mark.asyncio
async def test_url_members_blank_ones_skipped() -> None:
    store = await _opened("etcd://127.0.0.1:1,,127.0.0.1:2,")
    assert [str(e) for e in store.client.endpoints] == ["127.0.0.1:1", "127.0.0.1:2"]


@pytest.mark.asyncio
async def test_url_query_empty_fields_are_skipped() -> None:
    """A query joined carelessly (a stray ``&``) opens as the same options, as ``parse_qsl``
    reads it by default, not refused as malformed."""
    store = await _opened("etcd://127.0.0.1:1?&timeout=2.5&&ping_after=0.5&")
    assert (store.client.timeout, store.client.ping_after) == (2.5, 0.5)


@pytest.mark.asyncio
async def test_url_seconds_are_numbers_and_an_argument_wins_over_the_query() -> None:
    query = (
        "timeout=2.5&connect_timeout=1.5&ping_after=0.5&ping_timeout=0.25&watch_reconnect_timeout=7"
    )
    store = await _opened(f"etcd://127.0.0.1:1?{query}", timeout=4)
    client = store.client
    assert (client.timeout, client.connect_timeout, client.ping_after, client.ping_timeout) == (
        4.0,
        1.5,
        0.5,
        0.25,
    )
    assert store.watch_reconnect_timeout == 7.0
    # a blank value is kept (and refused), not dropped for the default
    with pytest.raises(
        ValueError, match="option connect_timeout must be a number of seconds, got ''"
    ):
        await _opened("etcd://127.0.0.1:1?connect_timeout=")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("url", "options", "tls"),
    [
        ("etcd://127.0.0.1:1", {}, None),
        ("etcds://127.0.0.1:1", {}, TLSConfig()),
        *[(f"etcd://127.0.0.1:1?tls={on}", {}, TLSConfig()) for on in ("1", "true", "Yes", "ON")],
        *[(f"etcds://127.0.0.1:1?tls={off}", {}, None) for off in ("0", "false", "no", "")],
        ("etcd://127.0.0.1:1", {"tls": True}, TLSConfig()),
        ("etcds://127.0.0.1:1", {"tls": False}, None),
        # a TLS file or name alone asks for TLS
        ("etcd://127.0.0.1:1?ca_file=/ca.pem", {}, TLSConfig(ca_file="/ca.pem")),
        (
            "etcd://127.0.0.1:1?cert_file=/c.pem&key_file=/k.pem",
            {"server_name": "etcd-0"},
            TLSConfig(cert_file="/c.pem", key_file="/k.pem", server_name="etcd-0"),
        ),
    ],
)
async def test_url_tls_settings(url: str, options: dict[str, Any], tls: TLSConfig | None) -> None:
    assert (await _opened(url, **options)).client.tls == tls


# -- the password: from the URL, a file or the environment ----------------------------------------


@pytest.fixture
def no_password_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(ETCD_PASSWORD_ENV, raising=False)
    monkeypatch.delenv(ETCD_PASSWORD_FILE_ENV, raising=False)
    return monkeypatch


def _resolved(**opts: Any) -> dict[str, Any]:
    _resolve_password(opts)
    return opts


def test_a_password_file_is_read_and_never_given_with_a_password(
    tmp_path: Path, no_password_env: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "pw"
    secret.write_text(" s3cret\n")
    assert _resolved(username="u", password_file=str(secret)) == {
        "username": "u",
        "password": "s3cret",
    }
    with pytest.raises(ValueError, match=r"^give the etcd password or password_file, not both$"):
        _resolved(username="u", password="p", password_file=str(secret))
    with pytest.raises(ValueError, match=r"^etcd password file '.*nothing' cannot be read"):
        _resolved(username="u", password_file=str(tmp_path / "nothing"))
    # a password file with no user: read (a user may come from elsewhere), kept
    assert _resolved(password_file=str(secret)) == {"password": "s3cret"}


def test_a_user_without_a_password_takes_the_environments(
    tmp_path: Path, no_password_env: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    no_password_env.setenv(ETCD_PASSWORD_FILE_ENV, str(secret))
    assert _resolved(username="u") == {"username": "u", "password": "from-file"}
    no_password_env.setenv(ETCD_PASSWORD_ENV, "from-env")  # the variable wins over the file
    assert _resolved(username="u") == {"username": "u", "password": "from-env"}
    assert _resolved(username="u", password="given") == {"username": "u", "password": "given"}
    assert _resolved() == {}  # no user: no password from the environment
    assert _resolved(username=None) == {"username": None}
    no_password_env.setenv(ETCD_PASSWORD_ENV, "")  # empty: as if unset
    assert _resolved(username="u") == {"username": "u", "password": "from-file"}
    no_password_env.setenv(ETCD_PASSWORD_FILE_ENV, str(tmp_path / "nothing"))
    with pytest.raises(
        ValueError, match=re.escape(f"etcd password (${ETCD_PASSWORD_FILE_ENV}) file")
    ):
        _resolved(username="u")


def test_a_user_with_no_password_anywhere_is_told_where_to_put_one(
    no_password_env: pytest.MonkeyPatch,
) -> None:
    expected = (
        "etcd user 'bob' needs a password: give password_file= (the command-line tools: "
        f"--password-file), or set ${ETCD_PASSWORD_ENV} or ${ETCD_PASSWORD_FILE_ENV}"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        _resolved(username="bob")
    no_password_env.setenv(ETCD_PASSWORD_FILE_ENV, "")
    with pytest.raises(ValueError, match="needs a password"):
        _resolved(username="bob")


# -- a scripted etcd for the streams (keep-alive, watch): each outcome exact ----------------------

Stream = Callable[[Any, Any], AsyncIterator[Any]]
Unary = Callable[[Any, Any], Awaitable[Any]]
_SERVICES = {
    "Range": "KV",
    "Txn": "KV",
    "Compact": "KV",
    "DeleteRange": "KV",
    "LeaseGrant": "Lease",
    "LeaseRevoke": "Lease",
    "LeaseTimeToLive": "Lease",
    "Authenticate": "Auth",
}


class Script:
    """A scripted etcd's endpoint and the streams opened on it (each one's first request, as it
    comes; ``arrived`` is set at each)."""

    def __init__(self) -> None:
        self.endpoint = ""
        self.opened: list[Any] = []
        self.arrived = asyncio.Event()


@contextlib.asynccontextmanager
async def scripted_etcd(
    *,
    keep_alive: Stream | None = None,
    watch: Stream | None = None,
    unary: dict[str, Unary] | None = None,
    revision: int = 10,
) -> AsyncIterator[Script]:
    """A gRPC server whose ``LeaseKeepAlive`` and ``Watch`` streams run the given async
    generators (``(requests, context)``), whose ``unary`` methods answer with
    ``unary[method](request, context)``, and whose ``Range`` (unless given) answers at
    ``revision``."""
    script = Script()

    def stream(fn: Stream) -> Any:
        async def handler(requests: Any, context: Any) -> AsyncIterator[Any]:
            async for response in fn(_Recording(requests, script), context):
                yield response

        return handler

    async def range_(request: Any, context: Any) -> Any:
        return rpc_pb2.RangeResponse(header=rpc_pb2.ResponseHeader(revision=revision))

    def methods(service: str, table: dict[str, Any]) -> Any:
        handlers = {}
        for method, (kind, fn) in table.items():
            request_type, response_type = message_types(service, method)
            make = getattr(grpc, f"{kind}_rpc_method_handler")
            handlers[method] = make(
                fn,
                request_deserializer=request_type.FromString,
                response_serializer=response_type.SerializeToString,
            )
        return grpc.method_handlers_generic_handler(f"etcdserverpb.{service}", handlers)

    tables: dict[str, dict[str, Any]] = {"KV": {"Range": ("unary_unary", range_)}}
    for method, fn in (unary or {}).items():
        tables.setdefault(_SERVICES[method], {})[method] = ("unary_unary", fn)
    if keep_alive is not None:
        tables.setdefault("Lease", {})["LeaseKeepAlive"] = ("stream_stream", stream(keep_alive))
    if watch is not None:
        tables["Watch"] = {"Watch": ("stream_stream", stream(watch))}
    server = grpc.aio.server()
    generic = [methods(service, table) for service, table in tables.items()]
    server.add_generic_rpc_handlers(generic)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    script.endpoint = f"127.0.0.1:{port}"
    try:
        yield script
    finally:
        await server.stop(None)


@contextlib.asynccontextmanager
async def scripted_store(
    timeout: float = 10.0, **streams: Any
) -> AsyncIterator[tuple[EtcdStore, Script]]:
    async with (
        scripted_etcd(**streams) as script,
        EtcdStore([script.endpoint], timeout=timeout) as store,
    ):
        yield store, script


class _Recording:
    """A stream's requests, its first one recorded in ``script`` when it arrives."""

    def __init__(self, requests: Any, script: Script) -> None:
        self._requests = requests.__aiter__()
        self._script = script
        self._first = True

    def __aiter__(self) -> _Recording:
        return self

    async def __anext__(self) -> Any:
        request = await self._requests.__anext__()
        if self._first:
            self._script.opened.append(request)
            self._script.arrived.set()
            self._first = False
        return request


def _pings(answers: Callable[[int], Any]) -> Stream:
    """A keep-alive stream answering its ``n``-th ping (from 0, over all streams) with
    ``answers(n)``: a TTL, or a status code to end the stream with (None: end it, no status)."""
    count = itertools.count()

    async def run(requests: Any, context: Any) -> AsyncIterator[Any]:
        async for request in requests:
            answer = answers(next(count))
            if isinstance(answer, grpc.StatusCode):
                await context.abort(answer, "scripted")
            if answer is None:
                return
            if answer == "hang":
                await asyncio.Event().wait()
            yield rpc_pb2.LeaseKeepAliveResponse(ID=request.ID, TTL=answer)

    return run


@pytest.mark.asyncio
async def test_a_keep_alive_stream_that_ends_is_retried_once_on_a_fresh_one() -> None:
    async with scripted_store(keep_alive=_pings(lambda n: None if n == 0 else 7)) as (
        store,
        script,
    ):
        assert await store.lease_keep_alive(5) == 7.0
        assert [request.ID for request in script.opened] == [5, 5]  # the same ping, resent
        first = store._keepalives[5].call
        assert await store.lease_keep_alive(5) == 7.0  # the fresh stream is kept
        assert store._keepalives[5].call is first
        assert len(script.opened) == 2
    async with scripted_store(keep_alive=_pings(lambda n: None)) as (store, script):
        with pytest.raises(StoreConnectionError, match=r"^etcd LeaseKeepAlive: the stream ended$"):
            await store.lease_keep_alive(5)
        assert len(script.opened) == 2  # one retry, not more
        assert store._keepalives[5].call is None


@pytest.mark.asyncio
async def test_a_keep_alive_stream_ended_while_idle_is_replaced_before_the_next_ping() -> None:
    """etcd ends the stream after answering: the next ping opens a fresh one at once (its
    first try), not after failing on the ended one."""
    answers = itertools.count(1)

    async def one_answer_a_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
        async for request in requests:
            yield rpc_pb2.LeaseKeepAliveResponse(ID=request.ID, TTL=next(answers))
            return

    async with scripted_store(keep_alive=one_answer_a_stream) as (store, script):
        assert await store.lease_keep_alive(5) == 1.0
        with anyio.fail_after(10):
            await store._keepalives[5].call.code()  # the call has ended
        assert await store.lease_keep_alive(5) == 2.0  # answered on the second stream
        assert len(script.opened) == 2


@pytest.mark.asyncio
@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL])
async def test_a_keep_alive_refused_twice_names_the_status(code: Any) -> None:
    async with scripted_store(keep_alive=_pings(lambda n: code)) as (store, script):
        expected = f"etcd LeaseKeepAlive: {code.name}: scripted"
        with pytest.raises(StoreConnectionError, match=f"^{re.escape(expected)}$"):
            await store.lease_keep_alive(5)
        assert len(script.opened) == 2
        assert store._keepalives[5].call is None
    async with scripted_store(keep_alive=_pings(lambda n: code if n == 0 else 3)) as (
        store,
        script,
    ):
        assert await store.lease_keep_alive(5) == 3.0
        assert len(script.opened) == 2


@pytest.mark.asyncio
async def test_a_keep_alive_past_its_deadline_is_not_retried() -> None:
    late = _pings(lambda n: grpc.StatusCode.DEADLINE_EXCEEDED if n == 0 else 3)
    async with scripted_store(keep_alive=late) as (store, script):
        expected = "etcd LeaseKeepAlive: DEADLINE_EXCEEDED: scripted"
        with pytest.raises(StoreConnectionError, match=f"^{re.escape(expected)}$"):
            await store.lease_keep_alive(5)
        assert len(script.opened) == 1


@pytest.mark.asyncio
async def test_an_unanswered_keep_alive_times_out_and_drops_its_stream() -> None:
    async with scripted_store(timeout=0.3, keep_alive=_pings(lambda n: "hang")) as (store, script):
        expected = r"^etcd LeaseKeepAlive: no answer within 0.3s$"
        with anyio.fail_after(10), pytest.raises(StoreTimeoutError, match=expected):
            await store.lease_keep_alive(5)
        assert len(script.opened) == 1
        assert store._keepalives[5].call is None


@pytest.mark.asyncio
async def test_a_keep_alive_cancelled_by_its_caller_drops_its_stream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")
    async with scripted_store(keep_alive=_pings(lambda n: "hang")) as (store, script):
        with anyio.move_on_after(0.3) as scope:
            await store.lease_keep_alive(5)
        assert scope.cancelled_caught
        assert store._keepalives[5].call is None  # an answer may still come: never reused
        assert len(script.opened) == 1
        for _ in range(3):
            await asyncio.sleep(0)
    # the dropped read, cancelled with its stream: retrieved without a word from the loop
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


@pytest.mark.asyncio
async def test_a_keep_alive_refused_as_unavailable_moves_to_the_next_member_only() -> None:
    unavailable = _pings(lambda n: grpc.StatusCode.UNAVAILABLE)
    async with (
        scripted_etcd(keep_alive=unavailable) as first,
        scripted_etcd(keep_alive=_pings(lambda n: 3)) as second,
        EtcdStore([first.endpoint, second.endpoint]) as store,
    ):
        assert await store.lease_keep_alive(5) == 3.0  # the retry went to the next member
        assert (len(first.opened), len(second.opened)) == (1, 1)
    internal_once = _pings(lambda n: grpc.StatusCode.INTERNAL if n == 0 else 4)
    async with (
        scripted_etcd(keep_alive=internal_once) as first,
        scripted_etcd(keep_alive=_pings(lambda n: 3)) as second,
        EtcdStore([first.endpoint, second.endpoint]) as store,
    ):
        assert await store.lease_keep_alive(5) == 4.0  # another refusal: the same member
        assert (len(first.opened), len(second.opened)) == (2, 0)


@pytest.mark.asyncio
async def test_a_keep_alive_cancelled_while_its_stream_opens_is_a_cancellation() -> None:
    async def hang(request: Any, context: Any) -> Any:
        await asyncio.Event().wait()

    unary: dict[str, Unary] = {"Authenticate": hang}
    async with (
        scripted_etcd(unary=unary, keep_alive=_pings(lambda n: 1)) as script,
        EtcdStore([script.endpoint], username="u", password="p") as store,
    ):
        with anyio.move_on_after(0.3) as scope:
            await store.lease_keep_alive(5)  # authenticating before it opens the stream
        assert scope.cancelled_caught
        assert store._keepalives[5].call is None
        assert script.opened == []


@pytest.mark.asyncio
async def test_keep_alives_leave_the_loop_nothing_to_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each read's outcome is retrieved (a callback on it), so the loop never logs a callback
    that failed or an exception nobody retrieved."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    async with scripted_store(keep_alive=_pings(lambda n: None if n % 2 else 4)) as (store, _):
        for _ in range(4):
            assert await store.lease_keep_alive(5) == 4.0
        for _ in range(3):
            await asyncio.sleep(0)
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


@pytest.mark.asyncio
async def test_a_keep_alive_waiting_through_a_leader_change_is_retried_then_fails() -> None:
    """A keep-alive needs the leader: a ping showing a newer raft term than the one it was sent
    in gives it up (tried once more on a fresh stream), rather than waiting on a member that
    may have lost the lease's leader."""
    terms = itertools.count(1)

    async def range_(request: Any, context: Any) -> Any:
        header = rpc_pb2.ResponseHeader(revision=10, raft_term=next(terms))
        return rpc_pb2.RangeResponse(header=header)

    dead = f"127.0.0.1:{free_port()}"  # a second endpoint: a client with one never pings
    unary: dict[str, Unary] = {"Range": range_}
    async with scripted_etcd(unary=unary, keep_alive=_pings(lambda n: "hang")) as script:
        async with EtcdStore([script.endpoint, dead], ping_after=0.05, ping_timeout=2) as store:
            with anyio.fail_after(10), pytest.raises(StoreConnectionError) as info:
                await store.lease_keep_alive(5)
        assert str(info.value).startswith("etcd LeaseKeepAlive: etcd elected a new leader")
        assert len(script.opened) == 2


@pytest.mark.asyncio
async def test_a_keep_alive_pending_when_the_store_closes_raises_closed() -> None:
    async with scripted_etcd(keep_alive=_pings(lambda n: "hang")) as script:
        store = EtcdStore([script.endpoint])
        ping = asyncio.ensure_future(store.lease_keep_alive(5))
        with anyio.fail_after(10):
            await script.arrived.wait()
            await store.aclose()
            with pytest.raises(StoreClosedError, match=r"^the etcd store is closed$"):
                await ping
        assert store._keepalives == {}


# -- the watch stream, scripted --------------------------------------------------------------------

CREATED = rpc_pb2.WatchResponse(created=True)


def _events(*revisions: int, key: bytes = b"w/k") -> Any:
    return rpc_pb2.WatchResponse(
        events=[
            kv_pb2.Event(type=kv_pb2.Event.PUT, kv=_kv(key, mod_revision=r, value=b"%d" % r))
            for r in revisions
        ]
    )


def _watches(*streams: list[Any]) -> Stream:
    """Watch streams that play ``streams[i]`` on the ``i``-th one opened: responses to send,
    ``"end"`` to end it, a status code to abort it with; after the last step it stays open
    (as do the streams past the last list)."""
    opened = itertools.count()

    async def run(requests: Any, context: Any) -> AsyncIterator[Any]:
        await requests.__anext__()  # the create request
        index = next(opened)
        for step in streams[index] if index < len(streams) else []:
            if step == "end":
                return
            if isinstance(step, grpc.StatusCode):
                await context.abort(step, "scripted")
            yield step
        await asyncio.Event().wait()

    return run


def _revisions(events: list[WatchEvent]) -> list[int]:
    return [e.revision for e in events]


async def _take(watch: Any, count: int) -> list[WatchEvent]:
    with anyio.fail_after(10):
        return [await watch.__anext__() for _ in range(count)]


@pytest.mark.asyncio
async def test_a_watch_resumes_after_its_last_event_skipping_what_it_had() -> None:
    streams = _watches(
        [CREATED, _events(11), _events(12, 13), "end"],
        # etcd may send again what the last stream delivered: dropped, not repeated
        [CREATED, _events(13), rpc_pb2.WatchResponse(), _events(14)],
    )
    async with scripted_store(watch=streams) as (store, script):
        async with store.watch("w/") as watch:
            assert watch.start_revision == 11  # the current revision (10) + 1
            got = await _take(watch, 4)
        assert _revisions(got) == [11, 12, 13, 14]
        assert got[0] == WatchEvent(EventType.PUT, KeyValue("w/k", b"11", 3, 11, 2, 11))
        first, second = (request.create_request for request in script.opened)
        assert (first.key, first.range_end, first.start_revision) == (b"w/", b"w0", 11)
        assert (second.key, second.range_end, second.start_revision) == (b"w/", b"w0", 14)


@pytest.mark.asyncio
async def test_a_watch_from_a_revision_asks_for_it_and_resumes_past_progress_reports() -> None:
    streams = _watches(
        [CREATED, rpc_pb2.WatchResponse(header=rpc_pb2.ResponseHeader(revision=30)), "end"],
        [CREATED, _events(5)],
    )
    async with scripted_store(watch=streams) as (store, script):
        async with store.watch("w/", start_revision=4) as watch:
            assert watch.start_revision == 4
            assert _revisions(await _take(watch, 1)) == [5]
        starts = [request.create_request.start_revision for request in script.opened]
        assert starts == [4, 4]  # a progress report delivers nothing: resume where it was


@pytest.mark.asyncio
async def test_a_watch_cancelled_for_compaction_names_both_revisions() -> None:
    compacted = rpc_pb2.WatchResponse(created=True, canceled=True, compact_revision=8)
    async with scripted_store(watch=_watches([compacted])) as (store, _):
        with pytest.raises(CompactedError) as info:
            await store.watch("w/", start_revision=3).start()
        assert (info.value.requested_revision, info.value.compact_revision) == (3, 8)
    later = rpc_pb2.WatchResponse(canceled=True, compact_revision=12)
    async with scripted_store(watch=_watches([CREATED, _events(11), later])) as (store, _):
        async with store.watch("w/") as watch:
            assert _revisions(await _take(watch, 1)) == [11]
            with pytest.raises(CompactedError) as info:
                await _take(watch, 1)
        assert (info.value.requested_revision, info.value.compact_revision) == (12, 12)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "reason",
    [
        "etcdserver: permission denied",
        "auth: invalid auth token",
        "etcdserver: user name is empty",
        "etcdserver: Invalid Auth Token",
        "auth: revision in header is old",
    ],
)
async def test_a_watch_refused_by_auth_raises_auth_error(reason: str) -> None:
    refused = rpc_pb2.WatchResponse(created=True, canceled=True, cancel_reason=reason)
    async with scripted_store(watch=_watches([refused])) as (store, script):
        with pytest.raises(StoreAuthError, match=f"^{re.escape('etcd Watch: ' + reason)}$"):
            await store.watch("w/").start()
        assert len(script.opened) == 1  # no user to authenticate as: no second try


@pytest.mark.asyncio
async def test_a_watch_cancelled_for_another_reason_is_created_again() -> None:
    gone = rpc_pb2.WatchResponse(canceled=True, cancel_reason="etcdserver: no leader")
    streams = _watches([CREATED, _events(11), gone], [CREATED, _events(12)])
    async with scripted_store(watch=streams) as (store, script):
        async with store.watch("w/") as watch:
            assert _revisions(await _take(watch, 2)) == [11, 12]
        assert [r.create_request.start_revision for r in script.opened] == [11, 12]


@pytest.mark.asyncio
async def test_a_watch_refused_with_unavailable_is_created_again() -> None:
    streams = _watches([CREATED, _events(11), grpc.StatusCode.UNAVAILABLE], [CREATED, _events(12)])
    async with scripted_store(watch=streams) as (store, script):
        async with store.watch("w/") as watch:
            assert _revisions(await _take(watch, 2)) == [11, 12]
        assert len(script.opened) == 2


@pytest.mark.asyncio
async def test_a_watch_whose_stream_ends_before_it_is_created_says_so() -> None:
    async with scripted_store(watch=_watches(["end"])) as (store, script):
        expected = f"etcd Watch at {script.endpoint}: EOF"
        with pytest.raises(StoreConnectionError, match=f"^{re.escape(expected)}$"):
            await store.watch("w/").start()


@pytest.mark.asyncio
async def test_a_watch_never_created_times_out() -> None:
    async with scripted_store(timeout=0.3, watch=_watches([])) as (store, script):
        expected = f"etcd Watch at {script.endpoint}: not created within 0.3s"
        with (
            anyio.fail_after(10),
            pytest.raises(StoreTimeoutError, match=f"^{re.escape(expected)}$"),
        ):
            await store.watch("w/").start()


@pytest.mark.asyncio
async def test_a_watch_being_created_is_cancelled_by_its_callers_scope_or_task() -> None:
    """grpc.aio replaces the cancellation of a stream read with a message-less CancelledError:
    an anyio scope must still see its own (a TimeoutError), a cancelled task a cancellation."""
    async with scripted_store(watch=_watches([])) as (store, script):
        with pytest.raises(TimeoutError), anyio.fail_after(0.3):
            await store.watch("w/").start()
        with anyio.move_on_after(0.3) as scope:
            await store.watch("w/").start()
        assert scope.cancelled_caught
        script.arrived.clear()
        task = asyncio.ensure_future(store.watch("w/").start())
        with anyio.fail_after(10):
            await script.arrived.wait()  # its create request is at the server: it waits
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert store._watches == set()


@pytest.mark.asyncio
async def test_a_lost_watch_gives_up_after_its_reconnect_timeout_naming_its_resume_point() -> None:
    streams = _watches([CREATED, _events(11), "end"], *[["end"]] * 100)
    async with (
        scripted_etcd(watch=streams) as script,
        EtcdStore([script.endpoint], watch_reconnect_timeout=0.3) as store,
    ):
        async with store.watch("w/") as watch:
            assert _revisions(await _take(watch, 1)) == [11]
            with pytest.raises(StoreConnectionError) as info:
                await _take(watch, 1)
        expected = (
            "etcd watch on 'w/' lost and not re-established within 0.3s (resume from revision "
            f"12): etcd Watch at {script.endpoint}: EOF"
        )
        assert str(info.value) == expected
        assert 3 <= len(script.opened) <= 8  # backing off from 50 ms, doubling


@pytest.mark.asyncio
async def test_a_watch_not_started_has_no_start_revision_and_a_closed_store_fails_it() -> None:
    async with scripted_store(watch=_watches([CREATED])) as (store, _):
        watch = store.watch("w/")
        with pytest.raises(RuntimeError, match=r"^the watch has not started$"):
            watch.start_revision  # noqa: B018
        await watch.start()
        await store.aclose()
        with pytest.raises(StoreClosedError, match=r"^the store was closed$"):
            await _take(watch, 1)
        await watch.aclose()


# -- a real etcd: the errors etcd.py maps ------------------------------------------------------


@pytest.mark.asyncio
async def test_compaction_errors_name_the_revisions(etcd: EtcdServer) -> None:
    async with EtcdStore(etcd.endpoints) as store:
        kept = await store.put(f"compact/{uuid.uuid4().hex}", b"v")
        current = await store.current_revision()
        expected = f"revision {current + 100} is in the future (current revision {current})"
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            await store.compact(current + 100)
        await store.compact(kept)
        for below in (kept - 1, kept):
            with pytest.raises(CompactedError) as info:
                await store.compact(below)
            assert (info.value.requested_revision, info.value.compact_revision) == (below, kept)


@pytest.mark.asyncio
async def test_compacting_again_at_compact_revision_1_names_it_without_waiting() -> None:
    """etcd cancels a watch from revision 1 for compaction only once revision 1 is gone: at
    compact revision 1 (a fresh cluster compacted at once) the probe of the compact revision
    that a refused compaction names waited forever."""
    async with EtcdServer() as server, EtcdStore(server.endpoints) as store:
        assert await store.current_revision() == 1
        await store.compact(1)
        with anyio.fail_after(10), pytest.raises(CompactedError) as info:
            await store.compact(1)
        assert (info.value.requested_revision, info.value.compact_revision) == (1, 1)
        await store.put("k", b"v")
        await store.compact(2)
        with anyio.fail_after(10), pytest.raises(CompactedError) as info:
            await store.compact(1)
        assert (info.value.requested_revision, info.value.compact_revision) == (1, 2)


@pytest.mark.asyncio
async def test_lease_errors_name_the_unknown_lease(etcd: EtcdServer) -> None:
    async with EtcdStore(etcd.endpoints) as store:
        grant = await store.lease_grant(5)
        await store.lease_revoke(grant.id)
        gone = grant.id
        key = f"lease/{uuid.uuid4().hex}"
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: store.put(key, b"v", lease=gone),
            lambda: store.compare_and_swap(key, 0, b"v", lease=gone),
            lambda: store.txn(success=[Put(key, b"1"), Put(key + "/2", b"2", lease=gone)]),
            lambda: store.txn(
                compare=[Compare.version(key) == 1], failure=[Put(key, b"1", lease=gone)]
            ),
            lambda: store.lease_revoke(gone),
            lambda: store.lease_time_to_live(gone),
            lambda: store.lease_keep_alive(gone),
        ]
        for call in calls:
            with pytest.raises(LeaseNotFoundError) as info:
                await call()
            assert info.value.lease_id == gone
        assert gone not in store._keepalives
        assert await store.get(key) is None


@pytest.mark.asyncio
async def test_a_leases_time_to_live_lists_its_keys_sorted(etcd: EtcdServer) -> None:
    async with EtcdStore(etcd.endpoints) as store:
        grant = await store.lease_grant(2.5)
        assert grant.ttl == 3.0
        base = f"ttl/{uuid.uuid4().hex}/"
        for name in ("b", "a", "\udcff", "c"):
            await store.put(base + name, b"v", lease=grant.id)
        status = await store.lease_time_to_live(grant.id)
        assert status.keys == tuple(base + name for name in ("a", "b", "c", "\udcff"))
        assert (status.id, status.granted_ttl) == (grant.id, 3.0)
        assert 0 < status.remaining <= 3.0
        assert type(status.remaining) is float
        await store.lease_revoke(grant.id)
        whole = await store.lease_grant(1)
        assert whole.ttl == 1.0
        await store.lease_revoke(whole.id)


@pytest.mark.asyncio
async def test_closing_the_store_ends_its_keep_alive_streams_and_fails_its_watches(
    etcd: EtcdServer,
) -> None:
    store = EtcdStore(etcd.endpoints)
    grants = [await store.lease_grant(5) for _ in range(2)]
    for grant in grants:
        await store.lease_keep_alive(grant.id)
    calls = [store._keepalives[grant.id].call for grant in grants]
    watches = [store.watch(f"closing/{uuid.uuid4().hex}/") for _ in range(2)]
    for watch in watches:
        await watch.start()
    await store.aclose()
    assert store._keepalives == {}
    assert all(call.cancelled() for call in calls)
    for watch in watches:
        with pytest.raises(StoreClosedError, match=r"^the store was closed$"):
            await _take(watch, 1)
        await watch.aclose()
    with pytest.raises(StoreClosedError):
        await store.connect()
    async with EtcdStore(etcd.endpoints) as cleanup:
        for grant in grants:
            await cleanup.lease_revoke(grant.id)


@pytest.mark.asyncio
async def test_compare_and_swap_reports_the_written_key_value(etcd: EtcdServer) -> None:
    async with EtcdStore(etcd.endpoints) as store:
        key = f"cas/{uuid.uuid4().hex}"
        grant = await store.lease_grant(5)
        created = await store.compare_and_swap(key, 0, b"1", lease=grant.id)
        assert created.succeeded
        revision = created.revision
        assert created.kv == KeyValue(key, b"1", revision, revision, 1, grant.id)
        updated = await store.compare_and_swap(key, revision, b"2")
        assert updated.kv == KeyValue(key, b"2", revision, updated.revision, 2, 0)
        refused = await store.compare_and_swap(key, revision, b"3")
        assert not refused.succeeded
        assert refused.kv == KeyValue(key, b"2", revision, updated.revision, 2, 0)
        assert refused.revision == updated.revision
        absent = await store.compare_and_swap(key + "/none", 5, b"x")
        assert (absent.succeeded, absent.kv) == (False, None)
        deleted = await store.compare_and_delete(key, updated.revision)
        assert (deleted.succeeded, deleted.kv) == (True, None)
        assert deleted.revision == updated.revision + 1
        again = await store.compare_and_delete(key, updated.revision)
        assert (again.succeeded, again.kv, again.revision) == (False, None, deleted.revision)
        await store.lease_revoke(grant.id)


# -- scripted answers to unary calls -----------------------------------------------------------


def _answer(response: Any) -> Unary:
    async def answer(request: Any, context: Any) -> Any:
        return response

    return answer


def _abort(code: Any) -> Unary:
    async def abort(request: Any, context: Any) -> Any:
        await context.abort(code, "scripted")

    return abort


@pytest.mark.asyncio
async def test_a_transaction_of_reads_only_is_a_read_any_other_a_write() -> None:
    """A lost connection after sending: a read may be retried (a connection error), a write's
    outcome is unknown; a transaction is a read when both its branches only read."""
    lost = _abort(grpc.StatusCode.UNAVAILABLE)
    async with scripted_store(unary={"Txn": lost, "Compact": lost}) as (store, _):
        with pytest.raises(StoreConnectionError) as read:
            await store.txn(success=[Get("k"), Range("p/")], failure=[Get("k")])
        assert not isinstance(read.value, WriteOutcomeUnknownError)
        for failure in ([Put("k", b"v")], [Delete("k")], [DeletePrefix("p/")]):
            with pytest.raises(WriteOutcomeUnknownError):
                await store.txn(success=[Get("k")], failure=failure)
        with pytest.raises(WriteOutcomeUnknownError):
            await store.txn(success=[Put("k", b"v", lease=7)])
        with pytest.raises(WriteOutcomeUnknownError):
            await store.compact(3)


@pytest.mark.asyncio
async def test_a_delete_whose_connection_is_lost_is_sent_once_its_outcome_unknown() -> None:
    """A delete, a compare-and-delete or a lease's revocation is a write: after a lost
    connection it may have been applied, so it is neither retried nor reported as a plain
    connection error (the issue-22 shape: a write taken for a read is sent again)."""
    sent: list[Any] = []

    async def lost(request: Any, context: Any) -> Any:
        sent.append(request)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "scripted")

    unary: dict[str, Unary] = {"DeleteRange": lost, "Txn": lost, "LeaseRevoke": lost}
    async with scripted_store(unary=unary) as (store, _):
        with pytest.raises(WriteOutcomeUnknownError):
            await store.delete("k")
        with pytest.raises(WriteOutcomeUnknownError):
            await store.delete_prefix("p/")
        with pytest.raises(WriteOutcomeUnknownError):
            await store.compare_and_delete("k", 5)
        with pytest.raises(WriteOutcomeUnknownError):
            await store.lease_revoke(7)
    deletes = [(r.key, r.range_end) for r in sent[:2]]
    assert deletes == [(b"k", b""), (b"p/", b"p0")]
    assert len(sent) == 4  # the compare-and-delete's transaction and the revoke, once each
    assert sent[3].ID == 7


@pytest.mark.asyncio
async def test_a_range_whose_connection_is_lost_fails_as_a_read() -> None:
    """A range only reads: after a lost connection it may be sent again (to another member),
    and fails as a connection error, not as a write whose outcome is unknown."""
    ranges: list[Any] = []

    async def range_(request: Any, context: Any) -> Any:
        if request.key != b"p/":  # the store's own reads (its current revision) are answered
            return rpc_pb2.RangeResponse(header=rpc_pb2.ResponseHeader(revision=10))
        ranges.append(request)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "scripted")

    async with scripted_store(unary={"Range": range_}) as (store, _):
        with pytest.raises(StoreConnectionError) as info:
            await store.range("p/")
    assert not isinstance(info.value, WriteOutcomeUnknownError)
    assert ranges  # it reached etcd: lost after sending, not before


@pytest.mark.asyncio
async def test_a_lease_grant_etcd_refuses_names_its_reason() -> None:
    refused = rpc_pb2.LeaseGrantResponse(error="etcdserver: too many leases")
    async with scripted_store(unary={"LeaseGrant": _answer(refused)}) as (store, _):
        with pytest.raises(StoreError, match=r"^etcd LeaseGrant: etcdserver: too many leases$"):
            await store.lease_grant(5)


@pytest.mark.asyncio
async def test_a_lease_with_no_time_left_is_alive_until_etcd_says_it_is_gone() -> None:
    """etcd answers TTL -1 for a lease it does not know, 0 for one expiring now (still there);
    a keep-alive's TTL 0 is a lost lease."""
    ttls = iter([0, -1])

    async def time_to_live(request: Any, context: Any) -> Any:
        return rpc_pb2.LeaseTimeToLiveResponse(
            ID=request.ID, TTL=next(ttls), grantedTTL=5, keys=[b"b", b"a\xff"]
        )

    unary = {"LeaseTimeToLive": time_to_live}
    async with scripted_store(unary=unary, keep_alive=_pings(lambda n: 0)) as (store, _):
        status = await store.lease_time_to_live(9)
        assert status == LeaseStatus(9, 5.0, 0.0, ("a\udcff", "b"))
        with pytest.raises(LeaseNotFoundError):
            await store.lease_time_to_live(9)
        with pytest.raises(LeaseNotFoundError) as info:
            await store.lease_keep_alive(9)
        assert info.value.lease_id == 9
        assert store._keepalives == {}  # its stream closed


@pytest.mark.asyncio
async def test_the_urls_user_and_password_are_sent_to_etcd_and_an_option_wins() -> None:
    sent: list[tuple[str, str]] = []

    async def authenticate(request: Any, context: Any) -> Any:
        sent.append((request.name, request.password))
        if request.password == "wrong":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "authentication failed")
        return rpc_pb2.AuthenticateResponse(token="t")

    async with scripted_etcd(unary={"Authenticate": authenticate}) as script:
        host = script.endpoint
        for url, options in [
            (f"etcd://b%40b:s%3Acret@{host}", {}),
            (f"etcd://ann@{host}", {"password": "given"}),
            (f"etcd://ann:url@{host}", {"username": "cy", "password": "opt"}),
        ]:
            store = await open_etcd_store(urlsplit(url), options)
            await store.aclose()
        assert sent == [("b@b", "s:cret"), ("ann", "given"), ("cy", "opt")]
        closed: list[EtcdStore] = []
        aclose = EtcdStore.aclose

        async def recording_aclose(self: EtcdStore) -> None:
            closed.append(self)
            await aclose(self)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(EtcdStore, "aclose", recording_aclose)
            with pytest.raises(StoreAuthError):
                await open_etcd_store(urlsplit(f"etcd://ann:wrong@{host}"), {})
        assert len(closed) == 1  # a refused open closes what it opened
        assert closed[0].closed


@pytest.mark.asyncio
async def test_a_watch_refused_while_being_created_raises_and_is_forgotten() -> None:
    async with scripted_store(watch=_watches([grpc.StatusCode.UNAVAILABLE])) as (store, script):
        expected = f"etcd Watch at {script.endpoint}: scripted"
        with pytest.raises(StoreConnectionError, match=f"^{re.escape(expected)}$"):
            await store.watch("w/").start()
        assert store._watches == set()
    refused = rpc_pb2.WatchResponse(created=True, canceled=True, cancel_reason="permission denied")
    async with scripted_store(watch=_watches([refused])) as (store, script):
        with pytest.raises(StoreAuthError):
            await store.watch("w/").start()
        assert store._watches == set()


@pytest.mark.asyncio
async def test_a_lost_watch_keeps_trying_past_a_failed_attempt() -> None:
    streams = _watches(
        [CREATED, _events(11), "end"],
        [grpc.StatusCode.UNAVAILABLE],
        ["end"],
        [CREATED, _events(12)],
    )
    async with scripted_store(watch=streams) as (store, script):
        async with store.watch("w/") as watch:
            assert _revisions(await _take(watch, 2)) == [11, 12]
            assert store._watches == {watch}
        assert store._watches == set()
        starts = [request.create_request.start_revision for request in script.opened]
        assert starts == [11, 12, 12, 12]


@pytest.mark.asyncio
async def test_a_watch_refused_for_its_token_authenticates_again_once() -> None:
    tokens = itertools.count(1)
    seen: list[str] = []

    async def authenticate(request: Any, context: Any) -> Any:
        return rpc_pb2.AuthenticateResponse(token=f"t{next(tokens)}")

    expired = rpc_pb2.WatchResponse(created=True, canceled=True, cancel_reason="invalid auth token")

    def watching(*streams: list[Any]) -> Stream:
        play = _watches(*streams)

        async def run(requests: Any, context: Any) -> AsyncIterator[Any]:
            seen.append(dict(context.invocation_metadata())["token"])
            async for response in play(requests, context):
                yield response

        return run

    script_kw: dict[str, Any] = {"unary": {"Authenticate": authenticate}}
    async with scripted_etcd(
        watch=watching([expired], [CREATED, _events(11)]), **script_kw
    ) as script:
        async with (
            EtcdStore([script.endpoint], username="u", password="p") as store,
            store.watch("w/") as watch,
        ):
            assert _revisions(await _take(watch, 1)) == [11]
        assert seen == ["t1", "t2"]
    seen.clear()
    tokens = itertools.count(1)
    async with scripted_etcd(watch=watching([expired], [expired]), **script_kw) as script:
        async with EtcdStore([script.endpoint], username="u", password="p") as store:
            with pytest.raises(StoreAuthError, match=r"^etcd Watch: invalid auth token$"):
                await store.watch("w/").start()
        assert seen == ["t1", "t2"]  # once more, not again and again


@pytest.mark.asyncio
async def test_the_current_revision_is_a_count_only_read_of_every_key() -> None:
    """Without ``count_only`` etcd would send every key-value in the cluster to learn one
    number; a watch from now asks it too."""
    asked: list[Any] = []

    async def range_(request: Any, context: Any) -> Any:
        asked.append(request)
        return rpc_pb2.RangeResponse(header=rpc_pb2.ResponseHeader(revision=42))

    unary: dict[str, Unary] = {"Range": range_}
    async with scripted_store(unary=unary) as (store, _):
        assert await store.current_revision() == 42
        await store.connect()  # checks that the cluster answers: the same read
    assert [(r.key, r.range_end, r.count_only, r.limit) for r in asked] == [
        (b"\0", b"", True, 0)
    ] * 2


@pytest.mark.asyncio
async def test_connect_authenticates_and_fails_fast_on_an_unreachable_cluster() -> None:
    sent: list[str] = []

    async def authenticate(request: Any, context: Any) -> Any:
        sent.append(request.name)
        return rpc_pb2.AuthenticateResponse(token="t")

    unary: dict[str, Unary] = {"Authenticate": authenticate}
    async with (
        scripted_etcd(unary=unary) as script,
        EtcdStore([script.endpoint], username="u", password="p") as store,
    ):
        await store.connect()
        assert sent == ["u"]
    async with EtcdStore([f"127.0.0.1:{free_port()}"], connect_timeout=0.5) as unreachable:
        with anyio.fail_after(10), pytest.raises(StoreConnectionError):
            await unreachable.connect()


@pytest.mark.asyncio
async def test_a_lost_watch_backs_off_doubling_up_to_a_second() -> None:
    """Tries at 0, 0.05, 0.15, 0.35 and 0.75 s after the loss; gives up at the try whose next
    wait (0.8 s) would end past the 1.2 s allowed."""
    streams = _watches([CREATED, _events(11), "end"], *[["end"]] * 100)
    async with (
        scripted_etcd(watch=streams) as script,
        EtcdStore([script.endpoint], watch_reconnect_timeout=1.2) as store,
        store.watch("w/") as watch,
    ):
        assert _revisions(await _take(watch, 1)) == [11]
        with pytest.raises(StoreConnectionError, match=re.escape("not re-established within 1.2s")):
            await _take(watch, 1)
        assert len(script.opened) == 1 + 5


@pytest.mark.asyncio
async def test_a_lost_watch_refused_by_auth_gives_up_at_once_without_a_user() -> None:
    streams = _watches(
        [CREATED, _events(11), "end"], [grpc.StatusCode.PERMISSION_DENIED], [CREATED, _events(12)]
    )
    async with scripted_store(watch=streams) as (store, script), store.watch("w/") as watch:
        assert _revisions(await _take(watch, 1)) == [11]
        with pytest.raises(StoreAuthError):
            await _take(watch, 1)
        assert len(script.opened) == 2


@pytest.mark.asyncio
async def test_a_lost_watch_refused_by_auth_tries_again_with_a_user_until_its_deadline() -> None:
    tokens = itertools.count(1)

    async def authenticate(request: Any, context: Any) -> Any:
        return rpc_pb2.AuthenticateResponse(token=f"t{next(tokens)}")

    unary: dict[str, Unary] = {"Authenticate": authenticate}
    refused = [grpc.StatusCode.PERMISSION_DENIED]
    once = _watches([CREATED, _events(11), "end"], refused, [CREATED, _events(12)])
    async with (
        scripted_etcd(watch=once, unary=unary) as script,
        EtcdStore([script.endpoint], username="u", password="p") as store,
        store.watch("w/") as watch,
    ):
        assert _revisions(await _take(watch, 2)) == [11, 12]
        assert len(script.opened) == 3
    always = _watches([CREATED, _events(11), "end"], *[refused] * 100)
    async with (
        scripted_etcd(watch=always, unary=unary) as script,
        EtcdStore(
            [script.endpoint], username="u", password="p", watch_reconnect_timeout=0.5
        ) as store,
        store.watch("w/") as watch,
    ):
        assert _revisions(await _take(watch, 1)) == [11]
        with pytest.raises(StoreAuthError):
            await _take(watch, 1)
        assert len(script.opened) == 1 + 4  # tries at 0, 0.05, 0.15 and 0.35 s


@pytest.mark.asyncio
async def test_a_watch_resumes_on_the_next_member_when_its_own_goes_silent() -> None:
    """A member that stops answering (pings too) is left: the watch is created again on the next
    one from its resume point, nothing skipped."""

    async def silent(request: Any, context: Any) -> Any:
        await asyncio.Event().wait()

    first_streams = _watches([CREATED, _events(5)])
    async with (
        scripted_etcd(watch=first_streams, unary={"Range": silent}) as first,
        scripted_etcd(watch=_watches([CREATED, _events(6)])) as second,
        EtcdStore([first.endpoint, second.endpoint], ping_after=0.1, ping_timeout=0.3) as store,
        store.watch("w/", start_revision=5) as watch,
    ):
        assert _revisions(await _take(watch, 2)) == [5, 6]
        assert [r.create_request.start_revision for r in second.opened] == [6]


@pytest.mark.asyncio
async def test_a_watch_refused_as_unavailable_moves_to_the_next_member(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")
    first_streams = _watches(
        [CREATED, _events(11), grpc.StatusCode.UNAVAILABLE], *[[CREATED, _events(99)]] * 5
    )
    async with (
        scripted_etcd(watch=first_streams) as first,
        scripted_etcd(watch=_watches([CREATED, _events(12)])) as second,
        EtcdStore([first.endpoint, second.endpoint]) as store,
        store.watch("w/") as watch,
    ):
        assert _revisions(await _take(watch, 2)) == [11, 12]
        assert (len(first.opened), len(second.opened)) == (1, 1)
    # every read's outcome retrieved: nothing for the loop to report
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


@pytest.mark.asyncio
async def test_a_watch_whose_token_expires_authenticates_again_and_stays() -> None:
    tokens = itertools.count(1)
    seen: list[str] = []

    async def authenticate(request: Any, context: Any) -> Any:
        return rpc_pb2.AuthenticateResponse(token=f"t{next(tokens)}")

    play = _watches([CREATED, _events(11), grpc.StatusCode.UNAUTHENTICATED], [CREATED, _events(12)])

    async def watching(requests: Any, context: Any) -> AsyncIterator[Any]:
        seen.append(dict(context.invocation_metadata())["token"])
        async for response in play(requests, context):
            yield response

    unary: dict[str, Unary] = {"Authenticate": authenticate}
    async with (
        scripted_etcd(watch=watching, unary=unary) as script,
        EtcdStore(
            [script.endpoint, f"127.0.0.1:{free_port()}"], username="u", password="p"
        ) as store,
        store.watch("w/") as watch,
    ):
        assert _revisions(await _take(watch, 2)) == [11, 12]
    assert seen == ["t1", "t2"]  # on the same member, with a fresh token


@pytest.mark.asyncio
async def test_a_watch_being_created_on_a_silent_member_is_created_on_the_next() -> None:
    async def silent(request: Any, context: Any) -> Any:
        await asyncio.Event().wait()

    async with (
        scripted_etcd(watch=_watches([]), unary={"Range": silent}) as first,
        scripted_etcd(watch=_watches([CREATED, _events(5)])) as second,
        EtcdStore([first.endpoint, second.endpoint], ping_after=0.1, ping_timeout=0.3) as store,
        store.watch("w/", start_revision=5) as watch,
    ):
        assert _revisions(await _take(watch, 1)) == [5]
        assert (len(first.opened), len(second.opened)) == (1, 1)


@pytest.mark.asyncio
async def test_a_reader_waiting_on_a_watch_closed_by_another_task_stops() -> None:
    async with scripted_store(watch=_watches([CREATED])) as (store, _):
        watch = store.watch("w/")
        await watch.start()
        reader = asyncio.ensure_future(watch.__anext__())
        for _ in range(5):
            await asyncio.sleep(0)  # the reader waits on the stream
        await watch.aclose()
        with anyio.fail_after(10), pytest.raises(StopAsyncIteration):
            await reader


@pytest.mark.asyncio
async def test_a_cancelled_watch_creation_ends_without_waiting() -> None:
    async with scripted_store(watch=_watches([])) as (store, script):
        task = asyncio.ensure_future(store.watch("w/").start())
        with anyio.fail_after(10):
            await script.arrived.wait()
        task.cancel()
        for _ in range(50):  # loop turns, not time: a cancellation takes a few
            if task.done():
                break
            await asyncio.sleep(0)
        assert task.cancelled()


@pytest.mark.asyncio
async def test_a_watch_not_started_or_refused_before_creation_closes_quietly() -> None:
    """A caller closes a watch whose start failed (or that it never started) in a ``finally``:
    with no stream to cancel, closing it does nothing."""
    async with scripted_store(watch=_watches([grpc.StatusCode.UNAVAILABLE])) as (store, _):
        await store.watch("w/").aclose()
        watch = store.watch("w/")
        with pytest.raises(StoreConnectionError):
            await watch.start()
        await watch.aclose()
        assert store._watches == set()


@pytest.mark.asyncio
async def test_a_watch_being_created_whose_channel_is_replaced_fails_as_its_member_hung() -> None:
    """Another call's verdict that the member hung replaces its channel (closing the old one
    cancels every stream on it): a watch being created there fails as a lost connection to that
    member (a reconnect's caller tries again), not as a cancellation nobody asked for."""
    async with scripted_store(watch=_watches([])) as (store, script):
        task = asyncio.ensure_future(store.watch("w/").start())
        with anyio.fail_after(10):
            await script.arrived.wait()  # its create request is at the server: it waits
        channels = store.client._channels
        member = channels.current()
        channels.mark_hung(member, member.generation)
        expected = f"etcd Watch at {script.endpoint}: hung"
        with (
            anyio.fail_after(10),
            pytest.raises(StoreConnectionError, match=f"^{re.escape(expected)}$"),
        ):
            await task
        assert store._watches == set()


@pytest.mark.asyncio
async def test_a_watchs_creation_answer_is_heard_from_its_member_with_its_raft_term() -> None:
    """The answer that creates a watch tells the member is alive and in which raft term: a later
    call bound to the leader compares its term with it."""
    created = rpc_pb2.WatchResponse(created=True, header=rpc_pb2.ResponseHeader(raft_term=7))
    async with scripted_store(watch=_watches([created])) as (store, _):
        member = store.client._channels.current()
        async with store.watch("w/"):
            assert member.liveness.term == 7


@pytest.mark.asyncio
async def test_a_watch_being_created_through_a_leader_change_is_still_created() -> None:
    """A watch is not bound to the leader (any member serves it): a silent member whose ping
    answers from a newer raft term is alive, and the creation goes on waiting for its answer
    (a call bound to the leader would be given up there)."""
    ranges = itertools.count(1)
    pinged = asyncio.Event()

    async def range_(request: Any, context: Any) -> Any:
        n = next(ranges)  # 1: the current revision, then the pings, each from a newer term
        if n >= 4:
            pinged.set()
        header = rpc_pb2.ResponseHeader(revision=10, raft_term=n)
        return rpc_pb2.RangeResponse(header=header)

    async def late(requests: Any, context: Any) -> AsyncIterator[Any]:
        await requests.__anext__()  # the create request
        await pinged.wait()  # created only after three pings, each from a newer term
        yield CREATED
        yield _events(11)
        await asyncio.Event().wait()

    async with (
        scripted_etcd(watch=late, unary={"Range": range_}) as script,
        EtcdStore(
            [script.endpoint, f"127.0.0.1:{free_port()}"], ping_after=0.1, ping_timeout=2
        ) as store,
        store.watch("w/") as watch,
    ):
        assert _revisions(await _take(watch, 1)) == [11]
        assert len(script.opened) == 1


@pytest.mark.asyncio
async def test_a_watch_creation_refused_for_auth_takes_a_new_token_and_nothing_else_does() -> None:
    """Re-creating a lost watch: a creation refused as unauthenticated gets a fresh token for the
    next try; one refused for another reason (unavailable) keeps the token it had."""
    tokens = itertools.count(1)
    seen: list[str] = []

    async def authenticate(request: Any, context: Any) -> Any:
        return rpc_pb2.AuthenticateResponse(token=f"t{next(tokens)}")

    play = _watches(
        [CREATED, _events(11), "end"],
        [grpc.StatusCode.UNAVAILABLE],
        [grpc.StatusCode.UNAUTHENTICATED],
        [CREATED, _events(12)],
    )

    async def watching(requests: Any, context: Any) -> AsyncIterator[Any]:
        seen.append(dict(context.invocation_metadata())["token"])
        async for response in play(requests, context):
            yield response

    unary: dict[str, Unary] = {"Authenticate": authenticate}
    async with (
        scripted_etcd(watch=watching, unary=unary) as script,
        EtcdStore([script.endpoint], username="u", password="p") as store,
        store.watch("w/") as watch,
    ):
        assert _revisions(await _take(watch, 2)) == [11, 12]
    assert seen == ["t1", "t1", "t1", "t2"]


@pytest.mark.asyncio
@pytest.mark.parametrize("refusal", ["unavailable", "not created in time"])
async def test_a_lost_watch_refused_or_not_created_moves_to_the_next_member(refusal: str) -> None:
    """Re-creating a lost watch: a member that refuses the creation as unavailable, or does not
    create it within the store's timeout, is left for the next one on the next try."""
    refused: list[Any] = [grpc.StatusCode.UNAVAILABLE] if refusal == "unavailable" else []
    first_streams = _watches([CREATED, _events(11), "end"], refused, *[[CREATED, _events(99)]] * 5)
    async with (
        scripted_etcd(watch=first_streams) as first,
        scripted_etcd(watch=_watches([CREATED, _events(12)])) as second,
        EtcdStore([first.endpoint, second.endpoint], timeout=0.5) as store,
        store.watch("w/") as watch,
    ):
        assert _revisions(await _take(watch, 2)) == [11, 12]
        assert (len(first.opened), len(second.opened)) == (2, 1)


# -- session 11: etcd.py's survivors -----------------------------------------------------------


@pytest.mark.asyncio
async def test_a_lease_grant_whose_connection_is_lost_is_sent_once_its_outcome_unknown() -> None:
    """A grant is a write: after a lost connection etcd may have granted the lease (one nobody
    holds, alive for its TTL), so it is not sent again, nor reported as a plain connection
    error (a grant taken for a read is retried, granting a lease each time)."""
    sent: list[Any] = []

    async def lost(request: Any, context: Any) -> Any:
        sent.append(request)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "scripted")

    async with scripted_store(unary={"LeaseGrant": lost}) as (store, _):
        with pytest.raises(WriteOutcomeUnknownError):
            await store.lease_grant(5)
    assert [request.TTL for request in sent] == [5]


@pytest.mark.asyncio
async def test_a_leases_time_to_live_whose_connection_is_lost_fails_as_a_read() -> None:
    """A lease's time-to-live only reads: a lost connection is a plain connection error (it may
    be asked again), not a write whose outcome is unknown, and the error is the call's own."""
    asked: list[int] = []

    async def lost(request: Any, context: Any) -> Any:
        asked.append(request.ID)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "scripted")

    async with scripted_store(unary={"LeaseTimeToLive": lost}) as (store, _):
        with pytest.raises(StoreConnectionError, match=r"etcd LeaseTimeToLive at ") as info:
            await store.lease_time_to_live(9)
    assert not isinstance(info.value, WriteOutcomeUnknownError)
    assert asked  # it reached etcd: lost after sending, not before
    assert set(asked) == {9}


@pytest.mark.asyncio
async def test_a_time_to_live_refused_as_lease_not_found_names_the_lease() -> None:
    """etcd's own word for an unknown lease (TTL -1 from its gRPC layer, or the error
    `requested lease not found` from the layer below it) is a LeaseNotFoundError naming it."""

    async def refused(request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found")

    async with scripted_store(unary={"LeaseTimeToLive": refused}) as (store, _):
        with pytest.raises(LeaseNotFoundError) as info:
            await store.lease_time_to_live(9)
    assert info.value.lease_id == 9


@pytest.mark.asyncio
async def test_a_compare_and_swap_of_a_key_onto_a_lease_reports_that_lease(
    etcd: EtcdServer,
) -> None:
    """The key-value a swap of an existing key returns carries the lease it was written with,
    as etcd stores it (not the key's old lease, nor none)."""
    async with EtcdStore(etcd.endpoints) as store:
        key = f"cas-lease/{uuid.uuid4().hex}"
        grant = await store.lease_grant(5)
        created = await store.compare_and_swap(key, 0, b"1")
        moved = await store.compare_and_swap(key, created.revision, b"2", lease=grant.id)
        assert moved.kv == KeyValue(key, b"2", created.revision, moved.revision, 2, grant.id)
        stored = await store.get(key)
        assert stored == moved.kv
        await store.lease_revoke(grant.id)


@pytest.mark.asyncio
async def test_the_stores_defaults_are_the_documented_ones() -> None:
    """docs/etcd.md's option table: a call's deadline 10 s, a member's connection 3 s, a watch's
    reconnection 60 s, a silent member pinged after 0.75 s and taken as hung 0.75 s later."""
    async with EtcdStore(["127.0.0.1:1"]) as store:
        client = store.client
        assert (client.timeout, client.connect_timeout) == (10.0, 3.0)
        assert store.watch_reconnect_timeout == 60.0
        assert (client.ping_after, client.ping_timeout) == (0.75, 0.75)


@pytest.mark.asyncio
async def test_the_current_revision_whose_connection_is_lost_fails_as_a_read() -> None:
    """The current revision is a read (connect's check): a lost connection is a plain
    connection error, not a write whose outcome is unknown."""
    asked: list[Any] = []

    async def lost(request: Any, context: Any) -> Any:
        asked.append(request)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "scripted")

    async with scripted_store(unary={"Range": lost}) as (store, _):
        with pytest.raises(StoreConnectionError, match=r"etcd Range at ") as info:
            await store.connect()
    assert not isinstance(info.value, WriteOutcomeUnknownError)
    assert asked  # it reached etcd: lost after sending, not before
    assert all((r.key, r.count_only) == (ALL_KEYS, True) for r in asked)


@pytest.mark.asyncio
async def test_a_refused_compaction_whose_probe_is_lost_fails_as_a_read() -> None:
    """A compaction etcd refused (its revision compacted already) changed nothing; the read of
    the compact revision that follows is a read: its lost connection is a plain connection
    error, not a write whose outcome is unknown."""
    probes: list[Any] = []

    async def compact(request: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted"
        )

    async def range_(request: Any, context: Any) -> Any:
        if request.revision != 1:
            return rpc_pb2.RangeResponse(header=rpc_pb2.ResponseHeader(revision=10))
        probes.append(request)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "scripted")

    async with scripted_store(unary={"Compact": compact, "Range": range_}) as (store, _):
        with pytest.raises(StoreConnectionError, match=r"etcd Range at ") as info:
            await store.compact(3)
    assert not isinstance(info.value, WriteOutcomeUnknownError)
    assert probes  # it reached etcd: lost after sending, not before
