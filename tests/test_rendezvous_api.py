"""Tests of the rendezvous API surface: parameters, torchrun config parsing, the registry, records,
rank assignment and the static handler."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import aioelastic.rendezvous as rdzv
from aioelastic.errors import (
    ConfigError,
    RendezvousClosedError,
    RendezvousError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from aioelastic.rendezvous import (
    DynamicRendezvousHandler,
    RendezvousEventKind,
    RendezvousHandlerRegistry,
    RendezvousParameters,
    StaticRendezvousHandler,
    assign_ranks,
    create_handler,
    parse_rdzv_conf,
    store_url_for,
)
from aioelastic.rendezvous._state import (
    ROSTER_CHUNK,
    ClosedRecord,
    DriverRecord,
    NodeRecord,
    RosterChunk,
    RoundRecord,
    RunKeys,
    read_rank,
    read_roster,
    roster_chunks,
    roster_members,
)
from aioelastic.store import KeyValue, MemoryEngine, MemoryStore
from aioelastic.testing import run_virtual


def test_every_public_name_is_exported() -> None:
    for name in rdzv.__all__:
        assert hasattr(rdzv, name), name
    # "@py_builtins" & co.: pytest rewrites the package's asserts (it ships a pytest11 plugin)
    public = {n for n in dir(rdzv) if not n.startswith(("_", "@"))} - {"api", "dynamic", "static"}
    assert public <= set(rdzv.__all__) | {"annotations"}


# -- parameters and config ------------------------------------------------------------------------


def test_parse_rdzv_conf_like_torchrun() -> None:
    assert parse_rdzv_conf("join_timeout=60, last_call_timeout=5,,is_host=1") == {
        "join_timeout": "60",
        "last_call_timeout": "5",
        "is_host": "1",
    }
    assert parse_rdzv_conf("key=a=b") == {"key": "a=b"}  # split on the first '='
    assert parse_rdzv_conf("") == {}
    for bad in ("novalue", "=v", "k="):
        with pytest.raises(ConfigError, match="rdzv_conf"):
            parse_rdzv_conf(bad)


def test_parameters_validate_like_torch() -> None:
    with pytest.raises(ValueError, match="backend"):
        RendezvousParameters("", "", "job", 1, 1)
    with pytest.raises(ValueError, match="min_nodes"):
        RendezvousParameters("memory", "", "job", 0, 1)
    with pytest.raises(ValueError, match="max_nodes"):
        RendezvousParameters("memory", "", "job", 2, 1)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("TRUE", True), ("t", True), ("Yes", True), ("y", True), (1, True),
     (True, True), ("0", False), ("false", False), ("F", False), ("no", False), ("N", False),
     (0, False), (False, False)],
)  # fmt: skip
def test_get_as_bool(value: Any, expected: bool) -> None:
    params = RendezvousParameters("memory", "", "job", 1, 1, flag=value)
    assert params.get_as_bool("flag") is expected


@pytest.mark.parametrize("value", ["maybe", 2, "", 1.5])
def test_get_as_bool_rejects_with_the_key_named(value: Any) -> None:
    params = RendezvousParameters("memory", "", "job", 1, 1, flag=value)
    with pytest.raises(ConfigError, match="'flag'"):
        params.get_as_bool("flag")


def test_get_as_int_and_seconds() -> None:
    params = RendezvousParameters("memory", "", "job", 1, 1, n="12", t="0.5", z="0", bad="x")
    assert params.get_as_int("n") == 12
    assert params.get_as_int("missing", 7) == 7
    assert params.get_as_seconds("t") == 0.5
    assert params.get_as_seconds("z", allow_zero=True) == 0.0
    with pytest.raises(ConfigError, match=r"'z'.*> 0"):
        params.get_as_seconds("z")
    with pytest.raises(ConfigError, match=r"'bad'.*integer"):
        params.get_as_int("bad")
    with pytest.raises(ConfigError, match=r"'bad'.*seconds"):
        params.get_as_seconds("bad")


def test_from_rdzv_conf() -> None:
    params = RendezvousParameters.from_rdzv_conf(
        "c10d", "host:1234", "job", 1, 2, "join_timeout=5,last_call_timeout=1"
    )
    assert params.config == {"join_timeout": "5", "last_call_timeout": "1"}


@pytest.mark.parametrize(
    ("backend", "endpoint", "url"),
    [
        ("memory", "shared", "memory://shared"),
        ("memory", "", "memory://rdzv-job"),
        ("c10d", "", "http://localhost:29400"),
        ("c10d", "node1", "http://node1:29400"),
        ("http", "node1:8000", "http://node1:8000"),
        ("https", "[::1]:8443", "https://[::1]:8443"),
        ("c10d", "::1", "http://[::1]:29400"),
        ("etcd", "e1,e2:2380", "etcd://e1:2379,e2:2380"),
        ("static", "", "memory://rdzv-job"),
        ("static", "node0:29500", "http://node0:29500"),
    ],
)
def test_store_url_for(backend: str, endpoint: str, url: str) -> None:
    assert store_url_for(RendezvousParameters(backend, endpoint, "job", 1, 1)) == url


def test_store_url_override_and_bad_endpoints() -> None:
    params = RendezvousParameters("c10d", "x", "job", 1, 1, store_url="https://h:1")
    assert store_url_for(params) == "https://h:1"
    for endpoint in ("host:port", "host:0", "[::1", "host:99999"):
        with pytest.raises(ConfigError, match="endpoint"):
            store_url_for(RendezvousParameters("c10d", endpoint, "job", 1, 1))
    with pytest.raises(ConfigError, match="store_url"):
        store_url_for(RendezvousParameters("c10d", "", "job", 1, 1, store_url="nope"))


# -- registry -------------------------------------------------------------------------------------


def test_registry_conflicts_like_torch() -> None:
    registry = RendezvousHandlerRegistry()

    async def creator(params: RendezvousParameters) -> DynamicRendezvousHandler:
        return DynamicRendezvousHandler(MemoryStore(), params.run_id, 1, 1)

    async def other(params: RendezvousParameters) -> DynamicRendezvousHandler:
        raise AssertionError

    registry.register("x", creator)
    registry.register("x", creator)  # the same again: nothing happens
    with pytest.raises(ValueError, match="already registered"):
        registry.register("x", other)

    async def body() -> None:
        with pytest.raises(ValueError, match="unknown rendezvous backend 'y'"):
            await registry.create_handler(RendezvousParameters("y", "", "job", 1, 1))
        with pytest.raises(RendezvousError, match="reports backend 'memory'"):
            await registry.create_handler(RendezvousParameters("x", "", "job", 1, 1))

    asyncio.run(body())


def test_builtin_backends_are_registered() -> None:
    assert set(rdzv.handler_registry.backends()) >= {
        "memory",
        "http",
        "https",
        "c10d",
        "etcd",
        "static",
    }


def test_create_handler_from_torchrun_config() -> None:
    async def body() -> None:
        params = RendezvousParameters.from_rdzv_conf(
            "memory",
            "shared-test",
            "job",
            2,
            2,
            "join_timeout=50,last_call_timeout=0,keep_alive_interval=2,keep_alive_max_attempt=4,"
            "timeout=900,is_host=1",
        )
        handlers = [await create_handler(params) for _ in range(2)]
        assert all(isinstance(h, DynamicRendezvousHandler) for h in handlers)
        results = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
        assert sorted(r.rank for r in results) == [0, 1]
        first = handlers[0]
        assert isinstance(first, DynamicRendezvousHandler)
        assert first.lease is not None
        assert first.lease.ttl == 8.0  # 2 s x 4 attempts
        assert first.get_backend() == "memory"
        assert first.get_run_id() == "job"
        for h in handlers:
            await h.aclose()

    run_virtual(body())


def test_the_participants_key_turns_the_roster_read_off() -> None:
    async def body() -> list[tuple[str, ...]]:
        params = RendezvousParameters.from_rdzv_conf(
            "memory", "pjob", "pjob", 2, 2, "participants=0,last_call_timeout=0"
        )
        handlers = [await create_handler(params) for _ in range(2)]
        results = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
        for h in handlers:
            await h.aclose()
        return [r.participants for r in results]

    assert run_virtual(body()) == [(), ()]


@pytest.mark.parametrize(
    ("conf", "key"),
    [
        ("join_timeout=soon", "join_timeout"),
        ("last_call_timeout=-1", "last_call_timeout"),
        ("keep_alive_max_attempt=0", "keep_alive_max_attempt"),
        ("reopen_closed=perhaps", "reopen_closed"),
        ("participants=some", "participants"),
        ("lease_ttl=inf", "lease_ttl"),
    ],
)
def test_create_handler_names_the_bad_key(conf: str, key: str) -> None:
    params = RendezvousParameters.from_rdzv_conf("memory", "", "job", 1, 1, conf)
    with pytest.raises(ConfigError, match=f"'{key}'"):
        asyncio.run(create_handler(params))


# -- records --------------------------------------------------------------------------------------


def test_records_round_trip_and_are_small() -> None:
    node = NodeRecord("abc", "host.example", 29500)
    assert NodeRecord.decode("x/n/0/abc", node.encode()) == node
    members = tuple(f"{i:012x}" for i in range(3000))
    chunks = roster_chunks(members)
    record = RoundRecord(7, len(members), "host.example", 29500, len(chunks))
    assert RoundRecord.decode("k", record.encode()) == record
    assert len(record.encode()) <= 100  # what every node receives: no member list
    assert [len(c.members) for c in chunks] == [ROSTER_CHUNK, ROSTER_CHUNK, 3000 - 2 * ROSTER_CHUNK]
    keys = RunKeys("job")
    kvs = [KeyValue(keys.chunk(7, i), c.encode(), 1, 1, 1, 0) for i, c in enumerate(chunks)]
    assert roster_members(keys, record, reversed(kvs)) == members
    assert sum(len(kv.value) for kv in kvs) / len(members) <= 14  # the roster, for who reads it
    # a roster that lacks a member, or has a rank twice, is corrupt
    with pytest.raises(RendezvousStateError, match="distinct ids"):
        roster_members(keys, record, kvs[1:])
    with pytest.raises(RendezvousStateError, match="taken twice"):
        roster_members(keys, record, [*kvs, kvs[0]])
    # an id at two ranks
    twice = RosterChunk(2 * ROSTER_CHUNK, (members[0],)).encode()
    last = KeyValue(keys.chunk(7, 2), twice, 1, 1, 1, 0)
    short = RoundRecord(7, 2 * ROSTER_CHUNK + 1, "h", 1, 3)
    with pytest.raises(RendezvousStateError, match="distinct ids"):
        roster_members(keys, short, [*kvs[:2], last])
    assert DriverRecord.decode("k", DriverRecord(3, "a").encode()) == DriverRecord(3, "a")
    closed = ClosedRecord(-1, reopened=True)
    assert ClosedRecord.decode("k", closed.encode()) == closed


@pytest.mark.parametrize(
    ("record", "value"),
    [
        (NodeRecord, b'{"v":1,"kind":"node","id":"abc","a":"h","p":70000}'),
        (NodeRecord, b'{"v":1,"kind":"node","id":"zzz","a":"h","p":1}'),  # names another node
        (NodeRecord, b'{"v":1,"kind":"node","id":"abc","a":3,"p":1}'),
        (DriverRecord, b'{"v":1,"kind":"driver","r":true,"id":"a"}'),
        (ClosedRecord, b'{"v":1,"kind":"closed","r":0,"o":2}'),
        (ClosedRecord, b"\xff\xfe"),
        # schema 1 listed the members: a clear error, not a round without them
        (RoundRecord, b'{"v":1,"kind":"round","r":0,"m":["a"],"ma":"h","mp":1}'),
        (RoundRecord, b'{"v":2,"kind":"round","r":0,"w":1,"ma":"h","mp":1,"c":2}'),
        (RosterChunk, b'{"v":1,"kind":"roster","k":-1,"m":"a"}'),
        (RosterChunk, b'{"v":1,"kind":"roster","k":0,"m":"a/b"}'),
        (RosterChunk, b'{"v":1,"kind":"roster","k":0,"m":""}'),
        (RosterChunk, b'{"v":1,"kind":"roster","k":0,"m":["a"]}'),
    ],
)
def test_bad_records_are_state_errors(record: Any, value: bytes) -> None:
    with pytest.raises(RendezvousStateError, match="x/n/0/abc"):
        record.decode("x/n/0/abc", value)


# -- rank assignment ------------------------------------------------------------------------------


def test_assign_ranks_examples() -> None:
    assert assign_ranks([("b", 2), ("a", 1)], (), 4) == ("a", "b")  # registration order
    assert assign_ranks([("new", 1), ("x", 5), ("y", 6)], ("y", "x"), 4) == ("y", "x", "new")
    # a previous member whose rank no longer fits gets a free one
    assert assign_ranks([("c", 9), ("n", 1)], ("a", "b", "c"), 4) == ("c", "n")
    # previous members are chosen before newcomers when there are too many
    assert assign_ranks([("n", 1), ("a", 8)], ("a",), 1) == ("a",)


@given(
    st.lists(st.integers(0, 40), unique=True, max_size=30),
    st.lists(st.integers(0, 40), unique=True, max_size=30),
    st.integers(1, 30),
)
def test_assign_ranks_properties(
    candidates: list[int], previous: list[int], max_nodes: int
) -> None:
    cands = [(f"n{c}", 100 - c) for c in candidates]
    prev = tuple(f"n{p}" for p in previous)
    members = assign_ranks(cands, prev, max_nodes)
    assert len(members) == min(len(cands), max_nodes)
    assert len(set(members)) == len(members)
    assert set(members) <= {c for c, _ in cands}
    assert assign_ranks(list(reversed(cands)), prev, max_nodes) == members  # deterministic
    for rank, node in enumerate(prev):
        if node in members and rank < len(members):
            assert members[rank] == node  # stayed and kept its rank
    names = {c for c, _ in cands}
    kept = [p for p in prev if p in names]  # in previous-rank order
    assert set(members) >= set(kept[: len(members)])  # previous members first


# -- the static handler ---------------------------------------------------------------------------


def test_static_handler_waits_for_every_rank() -> None:
    async def body() -> None:
        engine = MemoryEngine()
        hs = [
            StaticRendezvousHandler(MemoryStore(engine), "static-job", rank, 3, lease_ttl=5)
            for rank in (2, 0, 1)
        ]
        first = asyncio.ensure_future(hs[0].next_rendezvous())
        await asyncio.sleep(100)
        assert not first.done()
        results = await asyncio.gather(first, *(h.next_rendezvous() for h in hs[1:]))
        assert [r.rank for r in results] == [2, 0, 1]
        assert {r.world_size for r in results} == {3}
        assert {r.participants for r in results} == {("rank0", "rank1", "rank2")}
        assert len({r.bootstrap_store_info for r in results}) == 1
        assert await hs[0].num_nodes_waiting() == 0
        # a rank is taken while its holder lives
        dup = StaticRendezvousHandler(MemoryStore(engine), "static-job", 1, 3)
        with pytest.raises(RendezvousError, match="already taken"):
            await dup.next_rendezvous()
        await hs[2].aclose()
        event = await hs[0].wait_for_change()
        assert event.kind is RendezvousEventKind.PARTICIPANT_LOST
        assert event.node_id == "rank1"
        await hs[1].set_closed()
        assert (await hs[0].wait_for_change()).kind is RendezvousEventKind.CLOSED
        with pytest.raises(RendezvousClosedError):
            await hs[0].next_rendezvous()
        for h in [*hs, dup]:
            await h.aclose()

    run_virtual(body())


def test_static_handler_timeout_and_validation() -> None:
    async def body() -> None:
        h = StaticRendezvousHandler(MemoryStore(), "job", 0, 2, join_timeout=30)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(RendezvousTimeoutError, match=r"ranks \['rank1'\]"):
            await h.next_rendezvous()
        assert loop.time() - start == pytest.approx(30)
        await h.aclose()

    run_virtual(body())
    with pytest.raises(ValueError, match="rank"):
        StaticRendezvousHandler(MemoryStore(), "job", 2, 2)
    with pytest.raises(ValueError, match="world_size"):
        StaticRendezvousHandler(MemoryStore(), "job", 0, 0)


def test_static_from_parameters() -> None:
    async def body() -> None:
        params = [
            RendezvousParameters("static", "", "sjob", 2, 2, rank=str(r), master_port="29500")
            for r in range(2)
        ]
        hs = [await create_handler(p) for p in params]
        results = await asyncio.gather(*(h.next_rendezvous() for h in hs))
        assert [r.rank for r in results] == [0, 1]
        assert results[0].bootstrap_store_info.master_port == 29500
        for h in hs:
            await h.aclose()
        with pytest.raises(ConfigError, match="'rank'"):
            await create_handler(RendezvousParameters("static", "", "sjob", 2, 2))
        with pytest.raises(ValueError, match="min_nodes == max_nodes"):
            await create_handler(RendezvousParameters("static", "", "sjob", 1, 2, rank=0))

    run_virtual(body())


def test_a_superseded_roster_reads_as_none() -> None:
    """The roster of a round that a later one replaced is gone (its driver deleted it): a node
    whose view is behind reads no members, not a corrupt state."""

    async def scenario() -> tuple[tuple[str, ...], int | None]:
        store = MemoryStore()
        keys = RunKeys("job")
        record = RoundRecord(4, 2, "h", 1, chunks=1)
        members = await read_roster(store, keys, record)
        rank = await read_rank(store, keys, record, "a")
        await store.aclose()
        return members, rank

    assert asyncio.run(scenario()) == ((), None)
