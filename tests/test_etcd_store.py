"""The etcd backend beyond the conformance suite: URLs, failover, error mapping, cancellation,
leases, auth with token refresh, and a real etcdctl reading what we write.

Error mapping and cancellation use an in-process gRPC server that plays etcd badly (hangs, drops,
refuses) so each outcome is exact; everything else runs against a real etcd.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
from helpers import free_port

from aioelastic import (
    LeaseNotFoundError,
    StoreAuthError,
    StoreConnectionError,
    StoreTimeoutError,
    WriteOutcomeUnknownError,
    WriteTimeoutError,
    open_store,
)
from aioelastic.etcd_server import EtcdServer, find_etcdctl_binary
from aioelastic.testing.etcd import running_etcd, skip_without_etcd

pytestmark = pytest.mark.etcd

grpc = pytest.importorskip("grpc")

from aioelastic._etcd._rpc import rpc_pb2  # noqa: E402
from aioelastic._etcd.client import Endpoint, parse_endpoint  # noqa: E402
from aioelastic.store.etcd import EtcdStore, open_etcd_store  # noqa: E402


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with running_etcd(metrics=True) as server:
        yield server


@contextlib.asynccontextmanager
async def fresh_store(server: EtcdServer, **options: Any) -> AsyncIterator[EtcdStore]:
    async with EtcdStore(server.endpoints, **options) as store:
        yield store


# -- endpoints and URLs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:2379", Endpoint("127.0.0.1", 2379)),
        ("localhost", Endpoint("localhost", 2379)),
        ("http://etcd-0.example:12379", Endpoint("etcd-0.example", 12379)),
        ("[::1]:2380", Endpoint("::1", 2380)),
    ],
)
def test_parse_endpoint(text: str, expected: Endpoint) -> None:
    assert parse_endpoint(text) == expected


@pytest.mark.parametrize("text", ["", "host:port", "host:70000", "[::1", "user@host:1"])
def test_parse_endpoint_rejects_bad_input(text: str) -> None:
    with pytest.raises(ValueError, match="endpoint"):
        parse_endpoint(text)


@pytest.mark.asyncio
async def test_the_client_is_an_async_resource() -> None:
    """``async with EtcdClient(...)`` closes it, as every long-lived object (no etcd needed:
    channels open on first use)."""
    from anyio.abc import AsyncResource

    from aioelastic._etcd.client import EtcdClient
    from aioelastic.errors import StoreClosedError

    async with EtcdClient(["127.0.0.1:1"]) as client:
        assert isinstance(client, AsyncResource)
        assert not client.closed
    assert client.closed
    with pytest.raises(StoreClosedError):
        await client.call("Range", rpc_pb2.RangeRequest(key=b"k"), write=False)


@pytest.mark.asyncio
async def test_url_options_and_errors() -> None:
    store = await open_etcd_store(urlsplit("etcd://127.0.0.1:1,127.0.0.1:2?timeout=2.5"), {})
    try:
        assert [str(e) for e in store.client.endpoints] == ["127.0.0.1:1", "127.0.0.1:2"]
        assert store.client.username is None
        assert store.client.timeout == 2.5
        assert store.client.tls is None
    finally:
        await store.aclose()
    tls = await open_etcd_store(urlsplit("etcds://127.0.0.1:1"), {})
    assert tls.client.tls is not None
    await tls.aclose()
    with pytest.raises(ValueError, match="host:port"):
        await open_store("etcd://")
    with pytest.raises(ValueError, match="etcd URL"):
        await open_store("etcd://127.0.0.1:1/some/path")
    with pytest.raises(TypeError, match="unknown option"):
        await open_store("etcd://127.0.0.1:1", colour="blue")
    with pytest.raises(ValueError, match="timeout"):
        await open_store("etcd://127.0.0.1:1?timeout=soon")
    with pytest.raises(ValueError, match="ca_file"):
        await (await open_store("etcds://127.0.0.1:1", ca_file="/nonexistent/ca.pem")).get("k")
    # credentials in the URL are checked at once: an unreachable cluster fails the open
    with pytest.raises(StoreConnectionError, match="Authenticate"):
        await open_store("etcd://bob:s%3Acret@127.0.0.1:1", connect_timeout=0.5)


@pytest.mark.asyncio
async def test_open_store_by_url(etcd: EtcdServer) -> None:
    async with open_store(etcd.url) as store:
        assert isinstance(store, EtcdStore)
        key = f"url/{uuid.uuid4().hex}"
        revision = await store.put(key, b"v")
        kv = await store.get(key)
        assert kv is not None
        assert kv.mod_revision == revision


# -- connections and failover --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_unreachable_store_raises_connection_error_not_unknown_outcome() -> None:
    async with EtcdStore([f"127.0.0.1:{free_port()}"], timeout=5, connect_timeout=2) as store:
        with anyio.fail_after(10):
            with pytest.raises(StoreConnectionError) as read_error:
                await store.get("k")
            # a write that never left the client failed; it is not "unknown"
            with pytest.raises(StoreConnectionError) as write_error:
                await store.put("k", b"v")
    assert not isinstance(read_error.value, WriteOutcomeUnknownError)
    assert not isinstance(write_error.value, WriteOutcomeUnknownError)
    assert "cannot connect" in str(write_error.value)


@pytest.mark.asyncio
async def test_fails_over_to_a_live_endpoint_for_reads_and_writes(etcd: EtcdServer) -> None:
    dead = f"127.0.0.1:{free_port()}"
    async with EtcdStore([dead, *etcd.endpoints], connect_timeout=2) as store:
        key = f"failover/{uuid.uuid4().hex}"
        with anyio.fail_after(10):
            await store.put(key, b"written")
            assert (await store.get(key)).value == b"written"  # type: ignore[union-attr]


# -- a misbehaving etcd: exact error mapping and cancellation --------------------------------------


Behaviour = Callable[[Any, Any], Awaitable[Any]]


@contextlib.asynccontextmanager
async def fake_etcd(behaviour: Mapping[str, Behaviour]) -> AsyncIterator[str]:
    """A gRPC server answering etcd's KV methods with ``behaviour[method](request, context)``."""
    handlers = {}
    for method, fn in behaviour.items():
        request_type = getattr(rpc_pb2, f"{method}Request")
        response_type = getattr(rpc_pb2, f"{method}Response")
        handlers[method] = grpc.unary_unary_rpc_method_handler(
            fn,
            request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString,
        )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("etcdserverpb.KV", handlers)]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def hang(request: Any, context: Any) -> Any:
    await asyncio.Event().wait()


def abort_with(code: Any, details: str) -> Behaviour:
    async def abort(request: Any, context: Any) -> Any:
        await context.abort(code, details)

    return abort


@pytest.mark.asyncio
async def test_anyio_scopes_cancel_a_pending_unary_call() -> None:
    async with fake_etcd({"Range": hang}) as endpoint, EtcdStore([endpoint]) as store:
        with anyio.move_on_after(0.2) as scope:
            await store.get("k")
        assert scope.cancelled_caught
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.2):
                await store.get("k")
        task = asyncio.ensure_future(store.get("k"))
        await asyncio.sleep(0.1)  # deliberate: the call is pending inside grpc when cancelled
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.asyncio
async def test_deadlines_read_timeout_write_unknown() -> None:
    behaviour = {"Range": hang, "Put": hang, "Txn": hang}
    async with fake_etcd(behaviour) as endpoint, EtcdStore([endpoint], timeout=0.3) as store:
        with pytest.raises(StoreTimeoutError) as read:
            await store.get("k")
        assert not isinstance(read.value, WriteOutcomeUnknownError)
        with pytest.raises(WriteTimeoutError):
            await store.put("k", b"v")
        with pytest.raises(WriteOutcomeUnknownError, match="may or may not"):
            await store.compare_and_swap("k", 0, b"v")


@pytest.mark.asyncio
async def test_connection_lost_after_send_is_unknown_outcome_for_writes_only() -> None:
    lost = abort_with(grpc.StatusCode.UNAVAILABLE, "error reading from server: EOF")
    rejected = abort_with(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: request is too large")
    behaviour = {"Range": lost, "Txn": lost, "Put": rejected}
    async with fake_etcd(behaviour) as endpoint, EtcdStore([endpoint]) as store:
        with pytest.raises(StoreConnectionError) as read:
            await store.get("k")
        assert not isinstance(read.value, WriteOutcomeUnknownError)
        with pytest.raises(WriteOutcomeUnknownError):
            await store.compare_and_swap("k", 0, b"v")
        with pytest.raises(ValueError, match="too large"):
            await store.put("k", b"v")


@pytest.mark.asyncio
async def test_no_leader_write_moves_to_the_next_member(etcd: EtcdServer) -> None:
    refused = abort_with(grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader")
    async with fake_etcd({"Put": refused, "Range": refused}) as endpoint:
        async with EtcdStore([endpoint, *etcd.endpoints]) as store:
            key = f"noleader/{uuid.uuid4().hex}"
            await store.put(key, b"v")  # refused up front by the first: safe to send elsewhere
            assert (await store.get(key)).value == b"v"  # type: ignore[union-attr]
        async with EtcdStore([endpoint]) as alone:
            with pytest.raises(StoreConnectionError, match="no leader") as info:
                await alone.put("k", b"v")
            assert not isinstance(info.value, WriteOutcomeUnknownError)


# -- liveness: a busy member is not a hung one ----------------------------------------------------


def slow_member(ping: Behaviour, read_delay: float, write_delay: float) -> dict[str, Behaviour]:
    """A member whose pings (serializable count-only ranges) get ``ping``, whose other reads
    answer after ``read_delay`` and whose writes after ``write_delay``."""

    async def range_(request: Any, context: Any) -> Any:
        if request.serializable and request.count_only:
            return await ping(request, context)
        await asyncio.sleep(read_delay)
        return rpc_pb2.RangeResponse()

    async def put(request: Any, context: Any) -> Any:
        await asyncio.sleep(write_delay)
        return rpc_pb2.PutResponse()

    return {"Range": range_, "Put": put}


def quick_pinging(endpoint: str, dead: str) -> EtcdStore:
    """A store that pings its member after 0.1 s of silence, hung 0.5 s later without answer."""
    return EtcdStore([endpoint, dead], ping_after=0.1, ping_timeout=0.5)


async def _reads_until(store: EtcdStore, done: asyncio.Future[Any]) -> int:
    """Reads one after another (each answered in 0.15 s) until ``done``; how many."""
    count = 0
    while not done.done():
        await store.get("other")
        count += 1
    return count


@pytest.mark.asyncio
async def test_a_member_answering_other_calls_while_a_ping_waits_is_busy_not_hung() -> None:
    # A slow write (queued behind others, as when thousands join at once): its ping is
    # queued too and misses its deadline, but the member answers the same client's reads
    # meanwhile. It used to be taken as hung and the write reported unknown.
    dead = f"127.0.0.1:{free_port()}"  # a second endpoint: a client with one never pings
    async with (
        fake_etcd(slow_member(hang, 0.15, 1.5)) as endpoint,
        quick_pinging(endpoint, dead) as store,
    ):
        write = asyncio.ensure_future(store.put("k", b"v"))
        reads = await _reads_until(store, write)
        await write  # applied, not WriteOutcomeUnknownError
        assert reads >= 3
        assert store.client.current().endpoint == parse_endpoint(endpoint)


@pytest.mark.asyncio
async def test_clients_of_one_loop_share_what_they_hear_from_a_member() -> None:
    # One process, many participants (a store each): a member answering any of them is alive
    # for all, so none pings it for its own slow call, or takes it as hung.
    dead = f"127.0.0.1:{free_port()}"
    async with (
        fake_etcd(slow_member(hang, 0.15, 1.5)) as endpoint,
        quick_pinging(endpoint, dead) as writer,
        quick_pinging(endpoint, dead) as reader,
    ):
        write = asyncio.ensure_future(writer.put("k", b"v"))
        reads = await _reads_until(reader, write)
        await write
        assert reads >= 3
        assert writer.client.current().liveness is reader.client.current().liveness


@pytest.mark.asyncio
async def test_a_member_silent_to_everyone_is_still_taken_as_hung() -> None:
    dead = f"127.0.0.1:{free_port()}"
    async with (
        fake_etcd(slow_member(hang, 0.0, 30.0)) as endpoint,
        quick_pinging(endpoint, dead) as store,
    ):
        await store.get("warm")  # connected, and heard once
        with anyio.fail_after(5), pytest.raises(WriteOutcomeUnknownError, match="stopped"):
            await store.put("k", b"v")
        assert store.client.current().endpoint == parse_endpoint(dead)


async def answer_at_once(request: Any, context: Any) -> Any:
    return rpc_pb2.RangeResponse()


@pytest.mark.asyncio
async def test_an_answered_call_costs_no_task_and_one_timer_for_its_watching(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A unary call is awaited directly, watched by one timer (cancelled once answered): the
    only task is grpc.aio's own. It had a wrapper task and an ``asyncio.wait`` with a timer of
    its own: two tasks a call, about a sixth of a join's client CPU on etcd."""
    dead = f"127.0.0.1:{free_port()}"  # a second endpoint: a lone one is never watched
    loop = asyncio.get_running_loop()
    created: list[object] = []
    timers: list[object] = []
    call_at = loop.call_at

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        created.append(coro)
        return asyncio.Task(coro, loop=loop, **kwargs)

    def counting_call_at(when: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
        timers.append(callback)
        return call_at(when, callback, *args, **kwargs)

    async with (
        fake_etcd({"Range": answer_at_once}) as endpoint,
        EtcdStore([endpoint, dead]) as store,
    ):
        await store.get("warm")  # connected
        loop.set_task_factory(factory)
        monkeypatch.setattr(loop, "call_at", counting_call_at)
        try:
            for _ in range(20):
                await store.get("k")
        finally:
            loop.set_task_factory(None)
            monkeypatch.undo()
    # the fake server's own tasks run Cython coroutines; the client's are Python ones
    client = [getattr(c, "__qualname__", c) for c in created if "cython" not in type(c).__module__]
    assert client == ["UnaryUnaryCall._invoke"] * 20, client[:4]  # grpc.aio's own task only
    watching = [t for t in timers if getattr(t, "__name__", "") == "_due"]
    assert len(watching) == 20, timers[:6]


@pytest.mark.asyncio
async def test_a_watched_call_is_cancelled_with_its_caller() -> None:
    """With failover (two endpoints) as with one: an anyio scope or a task's cancellation
    ends a pending call, and it is a cancellation, not a hung member."""
    dead = f"127.0.0.1:{free_port()}"
    async with (
        fake_etcd({"Range": hang}) as endpoint,
        EtcdStore([endpoint, dead], ping_after=0.05, ping_timeout=5.0) as store,
    ):
        await store.client.ensure_ready(store.client.current())
        with anyio.move_on_after(0.2) as scope:
            await store.get("k")  # its watch is pinging by then (pings hang too)
        assert scope.cancelled_caught
        task = asyncio.ensure_future(store.get("k"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert store.client.current().endpoint == parse_endpoint(endpoint)  # not left


@pytest.mark.asyncio
async def test_a_watch_is_created_without_a_read_task(etcd: EtcdServer) -> None:
    """Until etcd says the watch is created, its stream is read directly (a failure cancels
    the stream anyway); only a created watch keeps a read task (whose cancellation must not
    cancel the stream). It made one per handshake read: a task per join's control view."""
    dead = f"127.0.0.1:{free_port()}"  # failover: the handshake is watched for a hung member
    loop = asyncio.get_running_loop()
    created: list[str] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        created.append(getattr(coro, "__qualname__", type(coro).__name__))
        return asyncio.Task(coro, loop=loop, **kwargs)

    async with EtcdStore([etcd.endpoints[0], dead]) as store:
        await store.get("warm")  # connected
        loop.set_task_factory(factory)
        try:
            watch = store.watch(f"created/{uuid.uuid4().hex}/", start_revision=1)
            await watch.start()
        finally:
            loop.set_task_factory(None)
        await watch.aclose()
    assert not [name for name in created if name.endswith(".read")], created


@pytest.mark.asyncio
async def test_a_client_opens_a_channel_to_the_member_it_uses_only(etcd: EtcdServer) -> None:
    dead = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    async with EtcdStore([*etcd.endpoints, *dead]) as store:
        await store.put(f"lazy/{uuid.uuid4().hex}", b"v")
        channels = store.client._channels.members()
        assert [ch.opened for ch in channels] == [True, False, False]


# -- leases ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_fractional_ttl_is_rounded_up_and_reported(etcd: EtcdServer) -> None:
    async with fresh_store(etcd) as store:
        grant = await store.lease_grant(0.3)
        assert grant.ttl == 1.0
        grant2 = await store.lease_grant(2.2)
        assert grant2.ttl == 3.0
        status = await store.lease_time_to_live(grant2.id)
        assert status.granted_ttl == 3.0
        assert 0 < status.remaining <= 3.0
        for lease_id in (grant.id, grant2.id):
            await store.lease_revoke(lease_id)


@pytest.mark.asyncio
async def test_keep_alives_share_one_long_lived_stream_per_lease(etcd: EtcdServer) -> None:
    async with fresh_store(etcd) as store:
        one, two = await store.lease_grant(5), await store.lease_grant(5)
        await store.lease_keep_alive(one.id)
        stream = store._keepalives[one.id].call
        for _ in range(5):
            assert await store.lease_keep_alive(one.id) == 5.0
            assert await store.lease_keep_alive(two.id) == 5.0
        assert store._keepalives[one.id].call is stream
        assert len(store._keepalives) == 2
        await store.lease_revoke(one.id)
        assert one.id not in store._keepalives
        with pytest.raises(LeaseNotFoundError):
            await store.lease_keep_alive(one.id)
        assert one.id not in store._keepalives  # a lost lease's stream is closed
        await store.lease_revoke(two.id)


@pytest.mark.asyncio
async def test_an_expired_lease_is_reported_on_its_keep_alive_stream(etcd: EtcdServer) -> None:
    async with fresh_store(etcd) as store:
        grant = await store.lease_grant(1)
        key = f"expiring/{uuid.uuid4().hex}"
        await store.put(key, b"v", lease=grant.id)
        assert await store.lease_keep_alive(grant.id) == 1.0  # the stream is open
        async with store.watch(key) as events:  # no more keep-alives: it expires
            with anyio.fail_after(10):
                event = await events.__anext__()
        assert event.type.name == "DELETE"
        with pytest.raises(LeaseNotFoundError):
            await store.lease_keep_alive(grant.id)
        with pytest.raises(LeaseNotFoundError):
            await store.put(key, b"v", lease=grant.id)


# -- a real peer reads what we write ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_etcdctl_reads_what_we_write(etcd: EtcdServer) -> None:
    try:
        etcdctl = find_etcdctl_binary()
    except FileNotFoundError as exc:
        skip_without_etcd(str(exc))
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    store = await etcd.open_store(run_id)
    async with store:
        await store.put("nodes/0", b'{"host": "n0"}')
        await store.put("nodes/1", "значение".encode())
    result = await anyio.run_process(
        [etcdctl, "--endpoints", etcd.client_urls[0], "get", "--prefix", f"/aioelastic/{run_id}/"],
        check=False,
        stderr=subprocess.STDOUT,
    )
    text = result.stdout.decode()
    assert result.returncode == 0, text
    assert text.splitlines() == [
        f"/aioelastic/{run_id}/nodes/0",
        '{"host": "n0"}',
        f"/aioelastic/{run_id}/nodes/1",
        "значение",
    ]


# -- auth ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def etcd_auth() -> Iterator[EtcdServer]:
    with running_etcd(auth=("root", "rootpw"), extra_args=["--auth-token-ttl", "1"]) as server:
        yield server


@pytest.mark.asyncio
async def test_auth_wrong_or_missing_credentials(etcd_auth: EtcdServer) -> None:
    with pytest.raises(StoreAuthError, match="authentication failed"):
        await open_store(etcd_auth.url, username="root", password="wrong")
    async with EtcdStore(etcd_auth.endpoints) as anonymous:
        with pytest.raises(StoreAuthError):
            await anonymous.get("k")
        with pytest.raises(StoreAuthError):
            await anonymous.put("k", b"v")


@pytest.mark.asyncio
async def test_auth_token_is_refreshed_transparently(etcd_auth: EtcdServer) -> None:
    url = etcd_auth.url.replace("etcd://", "etcd://root:rootpw@")
    async with open_store(url) as store:
        assert isinstance(store, EtcdStore)
        key = f"auth/{uuid.uuid4().hex}"
        await store.put(key, b"1")
        first = store.client._token
        assert first
        async with store.watch(key) as events:
            await anyio.sleep(2.5)  # --auth-token-ttl 1: the token expires
            await store.put(key, b"2")
            assert store.client._token != first  # re-authenticated, once
            with anyio.fail_after(10):
                event = await events.__anext__()
        assert event.kv.value == b"2"
        assert (await store.get(key)).value == b"2"  # type: ignore[union-attr]
        await anyio.sleep(2.5)  # expired again; a watch is now the first call to notice
        before = store.client._token
        async with store.watch(key, start_revision=event.revision) as replay:
            with anyio.fail_after(10):
                again = await replay.__anext__()
        assert (again.kv.value, again.revision) == (b"2", event.revision)
        assert store.client._token != before
        namespaced = await etcd_auth.open_store("auth-run")
        async with namespaced:
            await namespaced.put("k", b"v")
            assert (await namespaced.get("k")).value == b"v"  # type: ignore[union-attr]


# -- watches release their server-side watcher ----------------------------------------------------


async def _server_watchers(server: EtcdServer) -> int:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(server.metrics_urls[0]) as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith("etcd_debugging_mvcc_watcher_total "):
            return int(float(line.split()[1]))
    raise AssertionError("etcd_debugging_mvcc_watcher_total not in the metrics")


@pytest.mark.asyncio
async def test_cancelled_or_closed_watches_release_the_server_watcher(etcd: EtcdServer) -> None:
    async def settled(expected: int) -> None:
        with anyio.fail_after(10):
            # etcd's gauge has no push notification: read it until it settles
            while await _server_watchers(etcd) != expected:  # noqa: ASYNC110
                await anyio.sleep(0.02)

    async with fresh_store(etcd) as store:
        before = await _server_watchers(etcd)
        started = asyncio.Event()

        async def consume() -> None:
            async with store.watch("leak/") as events:
                started.set()
                await events.__anext__()

        task = asyncio.ensure_future(consume())
        await started.wait()
        await settled(before + 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await settled(before)
        with anyio.move_on_after(0.1):  # an anyio scope around a watch
            async with store.watch("leak/") as events:
                await events.__anext__()
        await settled(before)
        lingering = store.watch("leak/")
        await lingering.start()
        await settled(before + 1)
    await settled(before)  # closing the store releases what its watches held


@pytest.mark.asyncio
async def test_a_read_cancelled_while_pending_keeps_the_stream(etcd: EtcdServer) -> None:
    # grpc.aio cancels a whole stream when a read on it is cancelled: the watch reads in a task
    # of its own, so a caller that races a read against something else and cancels it (as the
    # rendezvous does on every join) does not break the watch.
    async with fresh_store(etcd) as store, store.watch("pend/") as events:
        for i in range(3):
            reader = asyncio.ensure_future(events.__anext__())
            await asyncio.sleep(0.05)  # pending inside grpc
            reader.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reader
            written = await store.put(f"pend/{i}", b"x")
            with anyio.fail_after(5):
                event = await events.__anext__()
            assert (event.kv.key, event.revision) == (f"pend/{i}", written)


def test_missing_grpc_names_the_extra() -> None:
    code = (
        "import sys, asyncio; sys.modules['grpc'] = None\n"
        "import aioelastic, aioelastic.cli\n"
        "aioelastic.cli.build_parser()\n"
        "from aioelastic import open_store\n"
        "async def main():\n"
        "    try:\n"
        "        await open_store('etcd://127.0.0.1:1')\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
        "asyncio.run(main())\n"
    )
    import os
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert "pip install 'aioelastic[etcd]'" in result.stdout, result.stdout + result.stderr


def test_importing_aioelastic_does_not_import_grpc() -> None:
    import sys

    code = (
        "import sys, aioelastic, aioelastic.cli\n"
        "aioelastic.cli.build_parser()\n"
        "print('grpc' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
