"""Gaps that mutation testing of ``store/`` found (``scripts/mutants store``): each test here fails
on a realistic bug of the shape of a mutant the rest of the suite let through. Memory store,
virtual time where anything waits."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import SplitResult

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.errors import (
    CompactedError,
    LeaseExpiredError,
    LeaseNotFoundError,
    StoreClosedError,
    StoreConnectionError,
    StoreTimeoutError,
    TxnConflictError,
    TxnTooLargeError,
)
from aioelastic.store import (
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    CasResult,
    Compare,
    Delete,
    DeletePrefix,
    DeleteResult,
    EventType,
    Get,
    GetResult,
    KeyValue,
    LeaseGrant,
    LeaseStatus,
    MemoryEngine,
    MemoryStore,
    Put,
    PutResult,
    Range,
    RangeResult,
    Store,
    Txn,
    TxnOp,
    TxnResult,
    Watch,
    WatchEvent,
    open_store,
    register_backend,
    supported_schemes,
)
from aioelastic.store._add import CounterAdder
from aioelastic.store._args import check_int, check_key, check_prefix, check_value, prefix_end
from aioelastic.store._keeper import LeaseKeeper, LeaseKeeperStatistics
from aioelastic.store._stm import StmTxn
from aioelastic.store._txn import check_txn
from aioelastic.store._url import parse_store_url
from aioelastic.store.memory import Commit, EngineState, LeaseChange
from aioelastic.testing import FaultInjectingStore, VirtualTimeLoop, virtual_test

# Keys from a few interesting code points: around the surrogate block and the top of Unicode.
EDGE_CHARS = st.sampled_from(["a", "b", "\x00", "\x7f", "\ud7ff", "\ue000", "\U0010ffff", "\uffff"])
EDGE_KEYS = st.lists(EDGE_CHARS, max_size=4).map("".join)


@given(EDGE_KEYS, EDGE_KEYS)
def test_prefix_end_bounds_exactly_the_keys_with_the_prefix(prefix: str, key: str) -> None:
    """A key starts with the prefix if and only if it sorts in [prefix, prefix_end(prefix))."""
    end = prefix_end(prefix)
    inside = prefix <= key and (end is None or key < end)
    assert inside == key.startswith(prefix)


def test_prefix_end_skips_the_surrogates_and_drops_maximal_code_points() -> None:
    assert prefix_end("a") == "b"
    assert prefix_end("\ud7ff") == "\ue000"  # surrogates are not valid UTF-8
    assert prefix_end("\ud7fe") == "\ud7ff"
    assert prefix_end("\udffe") == "\ue000"  # a lone surrogate (surrogateescape) in a key
    assert prefix_end("a\U0010ffff") == "b"
    assert prefix_end("\U0010ffff\U0010ffff") is None
    assert prefix_end("") is None


def test_argument_checks_name_the_argument_and_the_type() -> None:
    with pytest.raises(TypeError, match=r"^k must be a str, got int$"):
        check_key(1, "k")
    with pytest.raises(ValueError, match=r"^k must not be empty$"):
        check_key("", "k")
    with pytest.raises(TypeError, match=r"^p must be a str, got bytes$"):
        check_prefix(b"x", "p")
    assert check_prefix("", "p") == ""
    with pytest.raises(TypeError, match=r"^v must be bytes, got str; encode it first"):
        check_value("x", "v")
    with pytest.raises(TypeError, match=r"^v must be bytes, got int$"):
        check_value(1, "v")
    assert check_value(bytearray(b"ab")) == b"ab"
    assert type(check_value(memoryview(b"ab"))) is bytes
    with pytest.raises(TypeError, match=r"^n must be an int, got bool$"):
        check_int(True, "n", minimum=0)
    with pytest.raises(ValueError, match=r"^n must be >= 1, got 0$"):
        check_int(0, "n", minimum=1)
    assert check_int(1, "n", minimum=1) == 1


# -- the memory engine's leases


@virtual_test
async def test_lease_status_is_exact_and_never_negative() -> None:
    """``lease_time_to_live``: its id, TTL, keys (sorted) and the time left, to the virtual
    second; past its deadline while its end is vetoed (a log that cannot be written), 0."""
    engine = MemoryEngine()
    lease = engine.lease_grant(10.0)
    engine.put("b", b"1", lease.id)
    engine.put("a", b"1", lease.id)
    await asyncio.sleep(3.5)
    status = engine.lease_time_to_live(lease.id)
    assert status == LeaseStatus(lease.id, 10.0, 6.5, ("a", "b"))
    await asyncio.sleep(6.0)
    assert engine.lease_time_to_live(lease.id).remaining == 0.5

    def veto(commit: Commit) -> None:
        raise OSError("disk full")

    engine.on_commit.append(veto)
    await asyncio.sleep(0.7)  # past the deadline: the end is vetoed, the lease stays
    status = engine.lease_time_to_live(lease.id)
    assert status.remaining == 0.0
    assert status.keys == ("a", "b")
    assert [s.id for s in engine.leases()] == [lease.id]
    engine.on_commit.remove(veto)
    await asyncio.sleep(1.0)  # tried again a second later
    assert engine.leases() == []
    assert len(engine) == 0
    engine.close()


# -- the memory engine's watchers


@virtual_test
async def test_failing_an_owners_watchers_fails_each_of_them_and_no_other() -> None:
    engine = MemoryEngine()
    owner, other = object(), object()
    mine = [engine.add_watcher(p, None, owner) for p in ("a/", "b/", "c/")]
    theirs = engine.add_watcher("a/", None, other)
    before = engine.work().watcher_visits
    engine.fail_watchers_of(owner, StoreConnectionError("gone"))
    assert engine.work().watcher_visits == before + 3
    for watcher in mine:
        with pytest.raises(StoreConnectionError):
            engine.read_events(watcher)
    engine.put("a/1", b"x")
    assert [e.kv.key for e in engine.read_events(theirs)] == ["a/1"]
    engine.fail_watchers_of(object(), StoreConnectionError("nobody's"))  # owns none: no-op
    engine.remove_watcher(mine[0])
    engine.remove_watcher(mine[1])  # the owner is left with one watcher (no set)
    engine.fail_watchers_of(owner, StoreConnectionError("again"))
    # the put visited both a/ watchers (a failed one stays registered), then c/'s alone
    assert engine.work().watcher_visits == before + 3 + 2 + 1
    engine.close()


# -- the memory engine's undo (a vetoing hook)


@virtual_test
async def test_a_vetoed_transaction_puts_back_every_key_and_lease() -> None:
    """A transaction creating several keys, rewriting one and moving another to a lease,
    vetoed by its commit hook: the engine is exactly as before (keys, order, lease keys)."""
    engine = MemoryEngine()
    lease = engine.lease_grant(100.0)
    engine.put("k/2", b"old", lease.id)
    engine.put("k/4", b"old")
    before = (engine.export_state(), engine.lease_time_to_live(lease.id))

    def veto(commit: Commit) -> None:
        raise OSError("disk full")

    engine.on_commit.append(veto)
    ops = (Put("k/1", b"n"), Put("k/2", b"n"), Put("k/3", b"n"), Put("k/4", b"n", lease.id))
    with pytest.raises(OSError, match="disk full"):
        engine.txn(Txn(success=ops))
    with pytest.raises(OSError, match="disk full"):
        engine.txn(Txn(success=(Delete("k/2"), Put("k/0", b"n"), DeletePrefix("k/"))))
    assert (engine.export_state(), engine.lease_time_to_live(lease.id)) == before
    assert [kv.key for kv in engine.range("k/").kvs] == ["k/2", "k/4"]
    engine.on_commit.remove(veto)
    engine.lease_revoke(lease.id)  # it still holds k/2, and only k/2
    assert [kv.key for kv in engine.range("k/").kvs] == ["k/4"]
    engine.close()


# -- the memory engine's history: automatic compaction and replay


@virtual_test
async def test_auto_compaction_keeps_exactly_the_newest_history_limit_events() -> None:
    """history_limit 8 compacts once the log is 9 + 1 events long, down to the newest 8: after
    ten single-key writes, revisions 3 to 10 are kept (a watch can start at 3, not at 2)."""
    engine = MemoryEngine(history_limit=8)
    for i in range(9):
        engine.put(f"k/{i}", b"x")
    assert engine.compact_revision == 0  # 9 events: not over 8 + 8 // 8 yet
    engine.put("k/9", b"x")
    assert engine.compact_revision == 3
    assert len(engine.export_state().history) == 8
    with pytest.raises(CompactedError):
        engine.add_watcher("k/", 2, owner=None)
    watcher = engine.add_watcher("k/", 3, owner=None)
    assert [e.revision for e in engine.read_events(watcher)] == list(range(3, 11))
    engine.close()


@virtual_test
async def test_replay_takes_a_lease_logged_twice_as_the_later_and_ignores_old_compactions() -> None:
    engine = MemoryEngine()
    engine.restore_lease(5, 10.0)
    engine.restore_lease(5, 20.0)  # logged twice (granted again after a restart): the later
    assert engine.lease_time_to_live(5).granted_ttl == 20.0
    assert engine.lease_count == 1
    for revision in range(1, 5):
        engine.restore_commit(Commit(revision, (WatchEvent(EventType.PUT, _kv("k", revision)),)))
    engine.restore_compact(3)
    assert engine.compact_revision == 3
    watcher = engine.add_watcher("k", 3, owner=None)  # a scanning watcher (it starts back)
    before = engine.work()
    engine.restore_compact(3)  # at (or below) the compact revision: nothing to do, no work
    engine.restore_compact(2)
    assert engine.work() == before
    assert engine.compact_revision == 3
    assert [e.revision for e in engine.read_events(watcher)] == [3, 4]
    engine.close()


def _kv(key: str, revision: int) -> KeyValue:
    return KeyValue(key, b"v", 1, revision, revision, 0)


@virtual_test
async def test_wait_returns_at_once_for_a_watcher_with_history_to_read() -> None:
    """A watcher starting in the past has events to read before any new write: ``wait``
    returns at once (as the http server's watch loops rely on), not at the next write."""
    engine = MemoryEngine()
    engine.put("k", b"1")
    watcher = engine.add_watcher("k", 1, owner=None)
    await asyncio.wait_for(engine.wait(watcher), 1.0)
    assert [e.revision for e in engine.read_events(watcher)] == [1]
    with pytest.raises(TimeoutError):  # caught up: now it waits for a write
        await asyncio.wait_for(engine.wait(watcher), 1.0)
    engine.close()


@virtual_test
async def test_wait_returns_at_once_for_a_failed_or_removed_watcher() -> None:
    engine = MemoryEngine()
    owner = object()
    failed = engine.add_watcher("a", None, owner)
    removed = engine.add_watcher("b", None, object())
    engine.fail_watchers_of(owner, StoreConnectionError("gone"))  # before it waits
    engine.remove_watcher(removed)
    await asyncio.wait_for(engine.wait(failed), 1.0)
    await asyncio.wait_for(engine.wait(removed), 1.0)
    with pytest.raises(StoreConnectionError):
        engine.read_events(failed)
    engine.close()


# -- transactions: the rules every backend enforces (check_txn), and the meaning of a compare


def test_txn_errors_say_exactly_what_is_wrong() -> None:
    cases: list[tuple[type[Exception], str, Callable[[], object]]] = [
        (
            ValueError,
            "compare target must be one of ('value', 'version', 'create_revision', "
            "'mod_revision', 'lease'), got 'size'",
            lambda: Compare("k", "size", "==", 0),  # type: ignore[arg-type]
        ),
        (
            ValueError,
            "compare op must be one of ('==', '!=', '<', '>'), got '<='",
            lambda: Compare("k", "version", "<=", 0),  # type: ignore[arg-type]
        ),
        (ValueError, "compare key must not be empty", lambda: Compare.version("") == 0),
        (TypeError, "compare operand must be bytes, got int", lambda: Compare.value("k") == 1),
        (
            ValueError,
            "compare operand of mod_revision must be >= 0, got -1",
            lambda: Compare.mod_revision("k") == -1,
        ),
        (ValueError, "lease must be >= 0, got -1", lambda: Put("k", b"", -1)),
        (ValueError, "limit must be >= 1, got 0", lambda: Range("p", 0)),
        (TypeError, "prefix must be a str, got NoneType", lambda: DeletePrefix(None)),  # type: ignore[arg-type]
        (TypeError, "key must be a str, got int", lambda: Get(1)),  # type: ignore[arg-type]
        (TypeError, "key must be a str, got int", lambda: Delete(1)),  # type: ignore[arg-type]
        (TypeError, "compare must be a list, got str", lambda: check_txn("k", [], [])),  # type: ignore[arg-type]
        (TypeError, "success must be a list, got bytes", lambda: check_txn([], b"", [])),  # type: ignore[arg-type]
        (TypeError, "failure must be a list, got int", lambda: check_txn([], [], 1)),  # type: ignore[arg-type]
        (
            TypeError,
            "compare[] must be Compare, got Get",
            lambda: check_txn([Get("k")], [], []),  # type: ignore[list-item]
        ),
        (
            TypeError,
            "failure[] must be Put | Get | Range | Delete | DeletePrefix, got str",
            lambda: check_txn([], [], ["k"]),  # type: ignore[list-item]
        ),
        (
            ValueError,
            "txn success: key 'k' is put twice (one write per key)",
            lambda: check_txn([], [Put("k", b"1"), Put("k", b"2")], []),
        ),
        (
            ValueError,
            "txn failure: key 'p/k' is both put and deleted",
            lambda: check_txn([], [], [DeletePrefix("p/"), Put("p/k", b"1")]),
        ),
        (
            ValueError,
            "txn success: key 'k' is both put and deleted",
            lambda: check_txn([], [Put("k", b"1"), Delete("k")], []),
        ),
        (
            TxnTooLargeError,
            "transaction too large: its compare list has 129 operations, the limit is 128 "
            "(max_txn_ops); split it into smaller transactions",
            lambda: check_txn([Compare.version(f"k{i}") == 0 for i in range(129)], [], []),
        ),
        (
            TxnTooLargeError,
            "transaction too large: its success list has 129 operations, the limit is 128 "
            "(max_txn_ops); split it into smaller transactions",
            lambda: check_txn([], [Get(f"k{i}") for i in range(MAX_TXN_OPS + 1)], []),
        ),
    ]
    for error, message, call in cases:
        with pytest.raises(error) as info:
            call()
        assert type(info.value) is error
        assert str(info.value) == message


def test_txn_rules_allow_what_etcd_allows() -> None:
    """One put per key, a put beside a delete of another key or prefix, reads of anything."""
    txn = check_txn(
        [Compare.value("c") == bytearray(b"x")],
        [
            Put("a", bytearray(b"1")),  # type: ignore[arg-type]
            Delete("b"),
            DeletePrefix("c/"),
            Get("a"),
            Range("a"),
        ],
        [Put("a", b"1"), Put("b", b"2"), Get("a"), Get("a")],
    )
    assert txn.compare[0].operand == b"x"
    assert type(txn.compare[0].operand) is bytes
    put = txn.success[0]
    assert isinstance(put, Put)
    assert type(put.value) is bytes
    check_txn([], [Put("a", b"1"), Delete("ab"), DeletePrefix("b")], [])
    check_txn([], [Delete("k"), Delete("k"), DeletePrefix("k")], [])  # deletes may repeat
    kinds: list[Callable[[int], TxnOp]] = [
        lambda i: Get(f"k{i}"),
        lambda i: Range(f"k{i}"),
        lambda i: Delete(f"k{i}"),
        lambda i: DeletePrefix(f"k{i}"),
        lambda i: Put(f"k{i}", b""),
    ]
    for make in kinds:
        ops = [make(i) for i in range(MAX_TXN_OPS + 1)]
        assert check_txn([], ops[:-1], ops[:1]).success == tuple(ops[:-1])
        with pytest.raises(TxnTooLargeError, match=r"^transaction too large: its failure list "):
            check_txn([], [], ops)


@pytest.mark.parametrize("kind", ["compare", "put", "get", "range", "delete", "prefix"])
def test_txn_bytes_count_every_key_in_utf8_and_every_value(kind: str) -> None:
    """The byte limit is exact: MAX_TXN_BYTES of keys (UTF-8) and values pass, one more fails."""
    key = "é" * 10  # 20 bytes in UTF-8
    filler = b"x" * (MAX_TXN_BYTES - 20 - 1 - 2)
    op: dict[str, Compare | TxnOp] = {
        "compare": Compare.value(key) == b"",
        "put": Put(key, b""),
        "get": Get(key),
        "range": Range(key),
        "delete": Delete(key),
        "prefix": DeletePrefix(key),
    }
    # 1 + len(filler) bytes, and a compare of a number: its key's byte only
    compares = [Compare.value("c") == filler[1:], Compare.version("n") == 0]
    for extra, fits in ((b"", True), (b"x", True), (b"xy", False)):
        item = op[kind]
        ops = [Put("v", extra)] if kind == "compare" else [Put("v", extra), item]
        all_compares = [*compares, item] if kind == "compare" else compares
        if fits:
            check_txn(all_compares, ops, [])  # type: ignore[arg-type]
            continue
        with pytest.raises(TxnTooLargeError) as info:
            check_txn(all_compares, ops, [])  # type: ignore[arg-type]
        assert (info.value.limit, info.value.size) == ("bytes", MAX_TXN_BYTES + 1)
        assert str(info.value) == (
            f"transaction too large: its keys and values has {MAX_TXN_BYTES + 1} bytes, "
            f"the limit is {MAX_TXN_BYTES} (max_txn_bytes); split it into smaller transactions"
        )


def test_compares_hold_as_in_etcd() -> None:
    kv = KeyValue("k", b"m", create_revision=2, mod_revision=5, version=3, lease=7)
    for target, actual in (
        ("version", 3),
        ("create_revision", 2),
        ("mod_revision", 5),
        ("lease", 7),
    ):
        for op, below, at, above in (
            ("==", False, True, False),
            ("!=", True, False, True),
            ("<", False, False, True),
            (">", True, False, False),
        ):
            got = [Compare("k", target, op, n).holds(kv) for n in (actual - 1, actual, actual + 1)]  # type: ignore[arg-type]
            assert got == [below, at, above], (target, op)
            assert Compare("k", target, op, 0).holds(None) == (op in ("==",)), (target, op)  # type: ignore[arg-type]
    for op, results in (
        ("==", [False, True, False]),
        ("!=", [True, False, True]),
        ("<", [False, False, True]),
        (">", [True, False, False]),
    ):
        got = [Compare("k", "value", op, v).holds(kv) for v in (b"l", b"m", b"n")]  # type: ignore[arg-type]
        assert got == results, op
        assert not Compare("k", "value", op, b"").holds(None)  # type: ignore[arg-type]
    field = Compare.lease("k")
    assert repr(field) == "Compare.lease('k')"
    assert (field == 1, field != 1, field < 1, field > 1) == (
        Compare("k", "lease", "==", 1),
        Compare("k", "lease", "!=", 1),
        Compare("k", "lease", "<", 1),
        Compare("k", "lease", ">", 1),
    )
    assert Compare.create_revision("k").target == "create_revision"
    assert Compare.value("k").key == "k"


def test_a_txn_result_reads_as_its_branch_and_results() -> None:
    results = (GetResult(None), DeleteResult(2))
    ok, failed = TxnResult(True, 4, results), TxnResult(False, 4)
    assert ok
    assert not failed
    assert (len(ok), list(ok), ok[1], len(failed)) == (2, list(results), DeleteResult(2), 0)


# -- the STM on transactions


@virtual_test
async def test_stm_round_trips_prefetch_retry_and_read_only_functions() -> None:
    """``keys=`` are read in one transaction (each named once), others on first use; a retry
    reads back every key of the failed attempt in its failure branch (no extra get); a
    function that only reads is still validated (its commit compares what it read)."""
    async with FaultInjectingStore(MemoryStore()) as store:
        await store.put("a", b"1")
        await store.put("b", b"2")
        runs: list[tuple[bytes | None, ...]] = []

        async def body(tx: StmTxn) -> tuple[bytes | None, ...]:
            seen = (await tx.get("a"), await tx.get("b"), await tx.get("c"), await tx.get("a"))
            runs.append(seen)
            if len(runs) == 1:
                await store.put("b", b"3")  # another writer, after this attempt read b
                assert await tx.get("b") == b"2"  # repeatable: as read, not as now
                assert await tx.rev("b") == 2
            return seen

        store.calls.clear()
        assert await store.stm(body, keys=["a", "b", "a"]) == (b"1", b"3", None, b"1")
        assert runs == [(b"1", b"2", None, b"1"), (b"1", b"3", None, b"1")]
        # prefetch, c on first use, the failed commit, its put of b, the commit: nothing else
        assert dict(store.calls) == {"txn": 3, "get": 1, "put": 1}
        assert await store.current_revision() == 3  # read only: nothing written by the STM
        with pytest.raises(ValueError, match=r"^keys\[\] must not be empty$"):
            await store.stm(body, keys=[""])
        store.calls.clear()

        async def nothing(tx: StmTxn) -> int:
            return 7

        assert await store.stm(nothing) == 7
        assert dict(store.calls) == {}  # no keys, no reads, no writes: no round trip


@virtual_test
async def test_stm_gives_up_naming_the_keys_of_its_last_attempt() -> None:
    async with MemoryStore() as store:
        calls = 0

        async def interfered(tx: StmTxn) -> None:
            nonlocal calls
            calls += 1
            await tx.get("x")
            await tx.get(f"k{calls}")
            await store.put("x", b"%d" % calls)
            tx.put("y", b"1")

        with pytest.raises(TxnConflictError) as info:
            await store.stm(interfered, max_attempts=2)
        assert (info.value.attempts, info.value.keys, calls) == (2, ("x", "k2"), 2)
        assert await store.get("y") is None


@virtual_test
async def test_a_replay_under_a_registered_watcher_is_seen_by_it_or_reported_lost() -> None:
    """Replay normally runs before anyone watches; a watcher registered already scans the
    replayed log (woken), and if that log is compacted before it read it, it gets the exact
    CompactedError (the revision it missed)."""
    engine = MemoryEngine()
    seen = engine.add_watcher("k", None, owner=None)
    lost = engine.add_watcher("k", None, owner=None)
    waiting = asyncio.ensure_future(engine.wait(seen))
    await asyncio.sleep(0)
    engine.restore_commit(Commit(5, (WatchEvent(EventType.PUT, _kv("k", 5)),)))
    await asyncio.wait_for(waiting, 1.0)  # woken by the replay
    assert [e.revision for e in engine.read_events(seen)] == [5]
    engine.restore_compact(6)
    with pytest.raises(CompactedError) as info:
        engine.read_events(lost)
    assert (info.value.requested_revision, info.value.compact_revision) == (5, 6)
    engine.restore_commit(Commit(7, (WatchEvent(EventType.PUT, _kv("k", 7)),)))
    assert [e.revision for e in engine.read_events(seen)] == [7]
    engine.close()


@virtual_test
async def test_replay_checks_revisions_and_compacts_on_the_same_schedule_as_writes() -> None:
    engine = MemoryEngine(history_limit=8)
    engine.restore_commit(Commit(1, (WatchEvent(EventType.PUT, _kv("k", 1)),)))
    with pytest.raises(ValueError, match=r"^commit revision 1 is not after the engine's 1$"):
        engine.restore_commit(Commit(1, (WatchEvent(EventType.PUT, _kv("k", 1)),)))
    for revision in range(2, 10):
        engine.restore_commit(Commit(revision, (WatchEvent(EventType.PUT, _kv("k", revision)),)))
    assert engine.compact_revision == 0  # 9 events: not over 8 + 8 // 8 yet
    engine.restore_commit(Commit(10, (WatchEvent(EventType.PUT, _kv("k", 10)),)))
    assert engine.compact_revision == 3
    engine.close()


@virtual_test
async def test_replayed_rewrites_and_deletes_move_keys_off_their_leases() -> None:
    """A key rewritten without its lease, or deleted, in a replayed log no longer belongs to
    the lease: revoking the lease then leaves it alone."""
    engine = MemoryEngine()
    engine.restore_lease(1, 100.0)
    leased = KeyValue("k", b"v", 1, 1, 1, lease=1)
    other = KeyValue("j", b"v", 2, 2, 1, lease=1)
    engine.restore_commit(Commit(1, (WatchEvent(EventType.PUT, leased),)))
    engine.restore_commit(Commit(2, (WatchEvent(EventType.PUT, other),)))
    assert engine.lease_time_to_live(1).keys == ("j", "k")
    engine.restore_commit(Commit(3, (WatchEvent(EventType.PUT, KeyValue("k", b"w", 1, 3, 2)),)))
    gone = WatchEvent(EventType.DELETE, KeyValue("j", b"", 0, 4, 0, 0))
    engine.restore_commit(Commit(4, (gone,)))
    assert engine.lease_time_to_live(1).keys == ()
    engine.lease_revoke(1)
    assert engine.get("k") == KeyValue("k", b"w", 1, 3, 2)
    assert engine.revision == 4  # the revoke deleted nothing
    engine.close()


@virtual_test
async def test_a_scanning_watcher_that_caught_up_survives_compaction_of_other_keys() -> None:
    """A watch that started in the past, once it has read up to now, loses nothing when the
    history of other keys is compacted (it is tracked from then on, not scanning)."""
    engine = MemoryEngine()
    engine.put("a", b"1")
    watcher = engine.add_watcher("a", 1, owner=None)
    assert [e.revision for e in engine.read_events(watcher)] == [1]
    for i in range(5):
        engine.put(f"b/{i}", b"x")
    engine.compact(engine.revision)
    engine.put("a", b"2")
    assert [e.revision for e in engine.read_events(watcher)] == [7]
    engine.close()


@virtual_test
async def test_a_removed_watcher_is_forgotten_and_reads_nothing_twice() -> None:
    engine = MemoryEngine()
    engine.put("a", b"1")
    engine.put("a", b"2")
    watcher = engine.add_watcher("a", 1, owner=None)  # scanning (starts in the past)
    engine.remove_watcher(watcher)
    assert [e.revision for e in engine.read_events(watcher)] == [1, 2]  # what it had left
    assert engine.read_events(watcher) == []
    before = engine.work()
    engine.compact(engine.revision)  # looks at no watcher: it was removed
    assert engine.work() == before
    engine.close()


@virtual_test
async def test_reads_count_the_events_delivered_and_the_log_scanned() -> None:
    engine = MemoryEngine()
    for i in range(3):
        engine.put(f"a/{i}", b"x")
        engine.put(f"b/{i}", b"x")
    start = engine.work()
    watcher = engine.add_watcher("a/", 1, owner=None)  # scans the 6 events logged, once
    assert len(engine.read_events(watcher)) == 3
    work = engine.work()
    assert (work.events_delivered, work.keys_scanned) == (
        start.events_delivered + 3,
        start.keys_scanned + 6,
    )
    late = engine.add_watcher("b/", 3, owner=None)  # from the 2nd event on: scans 4
    assert len(engine.read_events(late)) == 2
    work = engine.work()
    assert (work.events_delivered, work.keys_scanned) == (
        start.events_delivered + 5,
        start.keys_scanned + 10,
    )
    engine.put("a/9", b"x")
    engine.put("a/8", b"x")
    engine.put("b/9", b"x")
    assert len(engine.read_events(watcher)) == 2  # tracked: its own events only
    work = engine.work()
    assert (work.events_delivered, work.keys_scanned) == (
        start.events_delivered + 7,
        start.keys_scanned + 10,
    )
    engine.close()


@virtual_test
async def test_stm_rev_of_an_absent_key_is_zero() -> None:
    async with MemoryStore() as store:

        async def body(tx: StmTxn) -> tuple[int, int]:
            return await tx.rev("missing"), await tx.rev("missing")

        assert await store.stm(body) == (0, 0)


@virtual_test
async def test_a_watch_below_the_compacted_revision_names_both_revisions() -> None:
    engine = MemoryEngine()
    for _ in range(4):
        engine.put("k", b"x")
    engine.compact(3)
    with pytest.raises(CompactedError) as info:
        engine.add_watcher("k", 2, owner=None)
    assert (info.value.requested_revision, info.value.compact_revision) == (2, 3)
    engine.close()


# -- add on transactions (CounterAdder)


def _collect_loop_errors() -> list[dict[str, object]]:
    errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
    return errors


@virtual_test
async def test_adds_leave_no_failed_background_task() -> None:
    """The flusher ends cleanly when no add waits (no 'exception was never retrieved')."""
    errors = _collect_loop_errors()
    async with MemoryStore() as store:
        adder = CounterAdder(store)
        assert list(await asyncio.gather(adder.add("n", 1), adder.add("n", 2))) == [1, 3]
        assert await adder.add("m", 5) == 5
        await asyncio.sleep(0)
    gc.collect()
    assert errors == []


@virtual_test
async def test_an_add_queued_behind_a_failed_transaction_still_goes_on() -> None:
    errors = _collect_loop_errors()
    async with FaultInjectingStore(MemoryStore()) as store:
        adder = CounterAdder(store)
        store.hang("txn")
        first = asyncio.ensure_future(adder.add("n", 1))
        await asyncio.sleep(0.01)  # its transaction is in flight (hung)
        second = asyncio.ensure_future(adder.add("n", 10))  # waits behind it
        await asyncio.sleep(0.01)
        store.fail_next("txn", StoreConnectionError("injected"))
        store.release()
        with pytest.raises(StoreConnectionError, match="injected"):
            await first
        assert await second == 10
    gc.collect()
    assert errors == []


@virtual_test
async def test_a_cancelled_flusher_cancels_every_add_waiting_for_it() -> None:
    """When the flusher itself is cancelled (its loop is closing), the adds in its batch and
    those queued behind it are cancelled, none left waiting forever."""
    async with FaultInjectingStore(MemoryStore()) as store:
        adder = CounterAdder(store)
        store.hang("txn")
        first = asyncio.ensure_future(adder.add("n", 1))
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(adder.add("n", 10))
        await asyncio.sleep(0.01)
        adder._flushers["n"].cancel()
        _, pending = await asyncio.wait([first, second], timeout=1.0)
        assert pending == set()
        assert first.cancelled()
        assert second.cancelled()
        store.release()


@virtual_test
async def test_an_add_on_a_non_integer_names_the_key_and_value() -> None:
    async with MemoryStore() as store:
        await store.put("text", b"hello")
        with pytest.raises(
            ValueError, match=r"^add: the value at 'text' is not a decimal integer: b'hello'$"
        ):
            await CounterAdder(store).add("text", 1)


@virtual_test
async def test_an_add_remembers_the_last_1024_keys_it_wrote() -> None:
    """The memo of key-values written is emptied when it holds 1024: an add to one of the
    forgotten keys guesses again (a conflict), one to the key written last does not."""
    async with MemoryStore() as store:
        adder = CounterAdder(store)
        for i in range(1024):
            await adder.add(f"k{i}", 1)
        assert (adder.transactions, adder.conflicts) == (1024, 0)
        await adder.add("k0", 1)  # remembered
        assert (adder.transactions, adder.conflicts) == (1025, 0)
        await adder.add("new", 1)  # the memo was full: emptied, then this one remembered
        await adder.add("new", 1)
        assert (adder.transactions, adder.conflicts) == (1027, 0)
        await adder.add("k1", 1)  # forgotten: guessed absent, read back, then committed
        assert (adder.transactions, adder.conflicts) == (1029, 1)


@virtual_test
async def test_stm_writes_keep_their_lease() -> None:
    async with MemoryStore() as store:
        lease = await store.lease_grant(60)

        async def body(tx: StmTxn) -> None:
            tx.put("k", b"v", lease=lease.id)

        await store.stm(body)
        kv = await store.get("k")
        assert kv is not None
        assert kv.lease == lease.id


# -- namespaces (PrefixedStore)


def _under(prefix: str, kv: KeyValue | None) -> KeyValue | None:
    """``kv`` of the parent as the view under ``prefix`` shows it."""
    if kv is None:
        return None
    return KeyValue(
        kv.key[len(prefix) :], kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease
    )


@virtual_test
async def test_a_namespace_shows_exactly_the_parents_records_under_its_prefix() -> None:
    """Every call through a (nested) namespace: the parent's result with the prefix taken off
    the keys, every other field as the parent has it."""
    async with MemoryStore() as parent:
        await parent.put("other", b"o")
        await parent.put("ns/sub/zzz", b"z")
        view = parent.namespace("ns/").namespace("sub/")
        assert repr(view) == f"<PrefixedStore 'ns/sub/' of {parent!r}>"
        lease = await view.lease_grant(30)
        await view.put("a", b"1", lease=lease.id)
        await view.put("b", b"2")
        assert await view.get("a") == _under("ns/sub/", await parent.get("ns/sub/a"))
        assert await view.get("missing") is None
        found = await view.range("", limit=2)
        expected = await parent.range("ns/sub/", limit=2)
        assert found == RangeResult(
            tuple(_under("ns/sub/", kv) for kv in expected.kvs),  # type: ignore[misc]
            expected.revision,
            3,
            True,
        )
        assert [kv.key for kv in found.kvs] == ["a", "b"]
        status = await view.lease_time_to_live(lease.id)
        await parent.put("elsewhere", b"x", lease=lease.id)  # the view sees its own keys only
        assert (await view.lease_time_to_live(lease.id)).keys == status.keys == ("a",)
        assert status.id == lease.id
        assert status.granted_ttl == 30
        b = await view.get("b")
        assert b is not None
        won = await view.compare_and_swap("b", b.mod_revision, b"3")
        assert won == CasResult(True, won.revision, await view.get("b"))
        lost = await view.compare_and_swap("b", b.mod_revision, b"4")
        assert lost == CasResult(False, won.revision, await view.get("b"))
        assert lost.kv is not None
        assert lost.kv.key == "b"
        gone = await view.compare_and_delete("a", 1)
        assert gone.kv is not None
        assert (gone.succeeded, gone.kv.key) == (False, "a")
        assert await view.add("n", 5) == 5
        assert (await parent.get("ns/sub/n")).value == b"5"  # type: ignore[union-attr]
        assert await view.delete("n") == 1
        assert await view.delete_prefix("") == 3  # a, b and zzz
        assert [kv.key for kv in (await parent.range("")).kvs] == ["elsewhere", "other"]


@virtual_test
async def test_a_namespace_maps_every_transaction_operation_and_result() -> None:
    async with MemoryStore() as parent:
        view = parent.namespace("ns/")
        await view.put("k", b"1")
        await parent.put("k", b"outside")
        result = await view.txn(
            compare=[Compare.value("k") == b"1"],
            success=[
                Put("k", b"2"),
                Get("k"),
                Range("", limit=1),
                Delete("gone"),
                DeletePrefix("p/"),
                Put("p2", b"x"),
            ],
        )
        assert result.succeeded
        revision = result.revision
        kv = _under("ns/", await parent.get("ns/k"))
        assert kv is not None
        assert result.results == (
            PutResult(kv, KeyValue("k", b"1", 1, 1, 1, 0)),
            GetResult(kv),
            RangeResult((kv,), revision, 1, False),
            DeleteResult(0),
            DeleteResult(0),
            PutResult(KeyValue("p2", b"x", revision, revision, 1, 0)),
        )
        failed = await view.txn(compare=[Compare.version("k") == 9], failure=[Get("absent")])
        assert failed == TxnResult(False, revision, (GetResult(None),))
        assert (await parent.get("k")).value == b"outside"  # type: ignore[union-attr]


@virtual_test
async def test_a_namespace_watch_and_range_and_watch_strip_the_prefix() -> None:
    async with MemoryStore() as parent:
        view = parent.namespace("ns/")
        await view.put("a", b"1")
        result, watch = await view.range_and_watch("")
        async with watch, view.watch("", start_revision=1) as since:
            assert [kv.key for kv in result.kvs] == ["a"]
            assert watch.start_revision == result.revision + 1
            assert since.start_revision == 1
            lease = await parent.lease_grant(10)
            await parent.put("ns/b", b"2", lease=lease.id)
            event = await watch.__anext__()
            kv = await parent.get("ns/b")
            assert kv is not None
            assert event == WatchEvent(EventType.PUT, _under("ns/", kv))  # type: ignore[arg-type]
            assert [(await since.__anext__()).kv.key for _ in range(2)] == ["a", "b"]


@virtual_test
async def test_a_restored_snapshot_gives_known_leases_their_keys_and_ignores_unknown_ones() -> None:
    kvs = (
        KeyValue("a", b"1", 1, 1, 1, lease=7),
        KeyValue("b", b"1", 2, 2, 1, lease=9),  # its lease ended after the snapshot was cut
        KeyValue("c", b"1", 3, 3, 1, lease=0),
        KeyValue("d", b"1", 4, 4, 1, lease=7),
    )
    state = EngineState(4, 0, kvs, (), {7: 30.0}, 9)
    engine = MemoryEngine()
    engine.restore(state)
    assert engine.lease_time_to_live(7).keys == ("a", "d")
    assert [kv.key for kv in engine.range("").kvs] == ["a", "b", "c", "d"]
    engine.close()
    busy = MemoryEngine()
    busy.lease_grant(5)  # a lease and nothing else: not fresh
    with pytest.raises(RuntimeError, match=r"^restore\(\) needs a fresh engine$"):
        busy.restore(state)
    busy.close()


@virtual_test
async def test_ranges_count_the_keys_they_read() -> None:
    engine = MemoryEngine()
    for key in ("a/1", "a/2", "a/3", "b/1"):
        engine.put(key, b"x")
    start = engine.work().keys_scanned
    assert engine.range("a/", limit=2).count == 3
    assert engine.work().keys_scanned == start + 2  # the keys taken, not the count
    engine.range("a/")
    engine.range("b/")
    assert engine.work().keys_scanned == start + 6
    engine.close()


# -- LeaseKeeper


def _record_keep_alives(store: Store) -> list[float]:
    """The loop times at which ``store.lease_keep_alive`` is called (before faults apply)."""
    times: list[float] = []
    keep_alive = store.lease_keep_alive

    async def recording(lease_id: int) -> float:
        times.append(asyncio.get_running_loop().time())
        return await keep_alive(lease_id)

    store.lease_keep_alive = recording  # type: ignore[method-assign]
    return times


@virtual_test
async def test_a_keeper_retries_at_a_quarter_of_the_time_left_then_renews_on_schedule() -> None:
    async with FaultInjectingStore(MemoryStore()) as store:
        times = _record_keep_alives(store)
        start = asyncio.get_running_loop().time()
        async with LeaseKeeper(store, 12) as keeper:  # renews every 4 s
            await asyncio.sleep(3.9)
            store.partition()
            await asyncio.sleep(3.0)
            store.heal()
            await asyncio.sleep(5.0)
            stats = keeper.statistics()
            # 4: fails (8 s left: retry in 2), 6: fails (6 left: in 1.5), 7.5: renewed, 11.5
            assert [t - start for t in times] == [4.0, 6.0, 7.5, 11.5]
            assert stats == LeaseKeeperStatistics(keeper.id, 12.0, 2, 2, start + 11.5, False)


async def _lost(keeper: LeaseKeeper, within: float) -> str:
    with anyio.fail_after(within):
        error = await keeper.wait_lost()
    assert keeper.lost
    assert keeper.error is error
    return str(error)


@virtual_test
async def test_a_keeper_says_exactly_why_its_lease_was_lost() -> None:
    async with FaultInjectingStore(MemoryStore()) as store:
        async with LeaseKeeper(store, 3) as keeper:
            await store.expire_lease(keeper.id)
            assert await _lost(keeper, 2) == f"lease {keeper.id:#x} lost: expired or revoked"
        async with LeaseKeeper(store, 3) as keeper:
            store.hang("lease_keep_alive")
            reason = await _lost(keeper, 4)
            assert reason == f"lease {keeper.id:#x} lost: store unreachable for the whole TTL (3s)"
            store.release()
        async with LeaseKeeper(store, 3) as keeper:
            store.partition()
            reason = await _lost(keeper, 4)
            assert reason == (
                f"lease {keeper.id:#x} lost: store unreachable for the whole TTL "
                "(injected partition (client: lease_keep_alive))"
            )
            store.heal()
        async with LeaseKeeper(store, 6, renew_deadline=2.5) as keeper:
            store.hang("lease_keep_alive")
            reason = await _lost(keeper, 3)
            expected = f"lease {keeper.id:#x} lost: not renewed within the renew deadline (2.5s)"
            assert reason == expected
            assert asyncio.get_running_loop().time() - keeper.statistics().last_renewal == 2.5
            store.release()
        async with LeaseKeeper(store, 9, keep_alive_interval=1, renew_deadline=2.5) as keeper:
            store.partition()
            reason = await _lost(keeper, 3)
            assert reason.startswith(
                f"lease {keeper.id:#x} lost: store unreachable for the whole renew deadline ("
            )
            store.heal()
        async with LeaseKeeper(store, 3) as keeper:
            store.fail_next("lease_keep_alive", RuntimeError("boom"))
            reason = await _lost(keeper, 2)
            assert reason == f"lease {keeper.id:#x} lost: keep-alive failed: RuntimeError: boom"
            assert isinstance(keeper.error.__cause__, RuntimeError)  # type: ignore[union-attr]
            assert keeper.statistics().failed_renewals == 1
        async with LeaseKeeper(store, 3) as keeper:
            store.hang("lease_keep_alive")
            await asyncio.sleep(1.5)  # the first renewal is in flight, hung
            assert keeper._task is not None
            keeper._task.cancel()
            reason = await _lost(keeper, 1)
            assert reason == f"lease {keeper.id:#x} lost: the keep-alive task was cancelled"
            store.release()
    async with MemoryStore() as closing:
        keeper = LeaseKeeper(closing, 3)
        await keeper.start()
        closing.engine.close()
        assert await _lost(keeper, 2) == f"lease {keeper.id:#x} lost: the store was closed"
        await keeper.aclose()


def test_a_keeper_refuses_intervals_that_cannot_work() -> None:
    store = MemoryStore()
    cases = [
        (
            {"keep_alive_interval": 5},
            "keep_alive_interval (5.0s) must be shorter than the ttl (5.0s)",
        ),
        ({"renew_deadline": 6}, "renew_deadline (6.0s) must be shorter than the ttl (5.0s)"),
        (
            {"keep_alive_interval": 2, "renew_deadline": 2},
            "renew_deadline (2.0s) must be longer than the keep_alive_interval (2.0s)",
        ),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            LeaseKeeper(store, 5, **options)
    LeaseKeeper(store, 5, keep_alive_interval=4.9, renew_deadline=4.95)
    with pytest.raises(ValueError, match=r"^renew_deadline must be a finite number"):
        LeaseKeeper(store, 5, renew_deadline=0)


@virtual_test
async def test_a_keeper_once_lost_reports_it_at_once_to_late_callers() -> None:
    async with MemoryStore() as store:
        keeper = LeaseKeeper(store, 3)
        with pytest.raises(RuntimeError, match=r"^the lease keeper has not started$"):
            _ = keeper.id
        async with keeper:
            with pytest.raises(RuntimeError, match=r"^the lease keeper has already started$"):
                await keeper.start()
            await store.lease_revoke(keeper.id)
            error = await _lost(keeper, 2)
            seen: list[LeaseExpiredError] = []
            keeper.on_lost(seen.append)
            assert [str(e) for e in seen] == [error]
            assert str(await keeper.wait_lost()) == error
            ran = False

            async def guarded() -> None:
                nonlocal ran
                with keeper.guard():
                    await asyncio.sleep(0)
                    ran = True

            with pytest.raises(LeaseExpiredError):
                await guarded()
            assert not ran


@virtual_test
async def test_a_keeper_closed_without_revoking_leaves_the_lease_to_its_ttl() -> None:
    async with FaultInjectingStore(MemoryStore()) as store:
        keeper = LeaseKeeper(store, 30)
        await keeper.start()
        await store.put("k", b"v", lease=keeper.id)
        await keeper.aclose(revoke=False)
        await keeper.aclose()  # closing twice does nothing
        assert (await store.lease_time_to_live(keeper.id)).keys == ("k",)
        other = LeaseKeeper(store, 30)
        await other.start()
        store.fail_next("lease_revoke", StoreConnectionError("down"))
        await other.aclose()  # the revoke failed: logged, not raised; the lease expires later
        assert (await store.lease_time_to_live(other.id)).id == other.id


def test_a_keeper_names_the_interval_it_refuses_and_not_yet_started_reads_as_nothing() -> None:
    store = MemoryStore()
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError, match=r"^keep_alive_interval must be a finite number"):
            LeaseKeeper(store, 5, keep_alive_interval=bad)
    with pytest.raises(ValueError, match=r"^renew_deadline \(5\.0s\) must be shorter than"):
        LeaseKeeper(store, 5, renew_deadline=5)  # as long as the TTL: no margin at all
    keeper = LeaseKeeper(store, 5)
    assert keeper.statistics() == LeaseKeeperStatistics(0, 5.0, 0, 0, 0.0, False)


@virtual_test
async def test_a_keeper_closed_before_it_started_does_nothing() -> None:
    async with FaultInjectingStore(MemoryStore()) as store:
        keeper = LeaseKeeper(store, 3)
        await keeper.aclose()
        assert store.calls == {}
        assert not keeper.lost


@virtual_test
async def test_a_keeper_retries_until_the_ttl_is_all_but_gone() -> None:
    """Renewals fail from 1 s on, with a TTL of 3: retries at 1.5, 1.875, 2.15625 (0.84 s
    left) and 2.3671875 (0.63 s left), which the healed store answers: the lease is kept."""
    async with FaultInjectingStore(MemoryStore()) as store:
        times = _record_keep_alives(store)
        start = asyncio.get_running_loop().time()
        async with LeaseKeeper(store, 3, keep_alive_interval=1) as keeper:
            store.partition()
            await asyncio.sleep(2.2)
            store.heal()
            await asyncio.sleep(0.5)
            assert not keeper.lost
            assert [t - start for t in times] == [1.0, 1.5, 1.875, 2.15625, 2.3671875]
            stats = keeper.statistics()
            assert (stats.renewals, stats.failed_renewals) == (1, 4)


@virtual_test
async def test_a_renewal_failing_at_the_very_end_of_the_ttl_is_the_loss() -> None:
    """A keep-alive that takes the whole TTL left and then fails to connect: the lease is lost
    then, with that error, not retried once more after its TTL."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop)
    async with MemoryStore() as store:

        async def slow_refusal(lease_id: int) -> float:
            loop.advance(max(0.0, start + 12.0 - loop.time()))  # the TTL's end, exactly
            raise StoreConnectionError("refused")

        start = loop.time()
        async with LeaseKeeper(store, 12) as keeper:
            store.lease_keep_alive = slow_refusal  # type: ignore[method-assign]
            error = await _lost(keeper, 13)
            assert loop.time() == start + 12.0
            assert error == (
                f"lease {keeper.id:#x} lost: store unreachable for the whole TTL (refused)"
            )
            assert keeper.statistics().failed_renewals == 1


@virtual_test
async def test_a_failed_renewal_counts_with_the_outages_before_it() -> None:
    # renews every 4 s
    async with FaultInjectingStore(MemoryStore()) as store, LeaseKeeper(store, 12) as keeper:
        store.partition()
        await asyncio.sleep(4.5)  # failed at 4: retry at 6
        store.heal()
        store.fail_next("lease_keep_alive", RuntimeError("bug"))
        await _lost(keeper, 2)
        assert keeper.statistics().failed_renewals == 2


@virtual_test
async def test_a_loss_is_reported_once_even_if_a_callback_cancels_the_renewal() -> None:
    """The lost callbacks run in the renewal task; one that cancels the task it runs in (its
    ``current_task``) does not make a second loss out of the first."""
    async with MemoryStore() as store, LeaseKeeper(store, 3) as keeper:
        reasons: list[str] = []

        def cancel_current(error: LeaseExpiredError) -> None:
            reasons.append(str(error))
            task = asyncio.current_task()
            assert task is not None
            task.cancel()

        keeper.on_lost(cancel_current)
        await store.lease_revoke(keeper.id)
        error = await _lost(keeper, 2)
        await asyncio.sleep(2)
        assert reasons == [error]
        assert str(keeper.error) == error == f"lease {keeper.id:#x} lost: expired or revoked"
        assert keeper.statistics().failed_renewals == 0


@virtual_test
async def test_a_keeper_lets_go_of_the_renewal_that_failed() -> None:
    """The failed renewal (its exception, traceback and frames) is not kept by the keeper,
    which lives as long as its lease."""
    async with FaultInjectingStore(MemoryStore()) as store, LeaseKeeper(store, 3) as keeper:
        store.hang("lease_keep_alive")
        await asyncio.sleep(1.5)  # the renewal is in flight, hung
        task = keeper._task
        assert task is not None
        store.fail_next("lease_keep_alive", RuntimeError("bug"))
        store.release()
        await _lost(keeper, 1)
        assert keeper._task is None


@virtual_test
async def test_closing_a_keeper_ends_its_renewal_in_flight_and_reports_no_loss() -> None:
    async with FaultInjectingStore(MemoryStore()) as store:
        keeper = LeaseKeeper(store, 3)
        await keeper.start()
        lost: list[LeaseExpiredError] = []
        keeper.on_lost(lost.append)
        store.hang("lease_keep_alive")
        await asyncio.sleep(1.5)  # the renewal is in flight, hung
        renewal = keeper._task
        assert renewal is not None
        store.hang("lease_revoke")  # (the revoke must not overtake the renewal either)
        closing = asyncio.create_task(keeper.aclose())
        await asyncio.sleep(0.1)
        assert renewal.done()
        store.release()
        await closing
        await asyncio.sleep(5)  # a renewal left running would now find the lease revoked
        assert (lost, keeper.lost) == ([], False)
        with pytest.raises(LeaseNotFoundError):
            await store.lease_time_to_live(keeper.id)


@virtual_test
async def test_closing_a_keeper_gives_a_hung_revoke_five_seconds() -> None:
    async with FaultInjectingStore(MemoryStore()) as store:
        keeper = LeaseKeeper(store, 30)
        await keeper.start()
        store.hang("lease_revoke")
        loop = asyncio.get_running_loop()
        before = loop.time()
        with anyio.fail_after(60):
            await keeper.aclose()
        assert loop.time() - before == 5.0
        store.release()
        assert (await store.lease_time_to_live(keeper.id)).id == keeper.id  # left to expire


@virtual_test
async def test_a_keeper_left_by_a_cancellation_still_revokes_its_lease() -> None:
    """``async with store.lease(...)`` in work that is cancelled: the revoke (here a slow one)
    runs to its end, shielded from the cancellation that closes the keeper."""
    async with FaultInjectingStore(MemoryStore()) as store:
        leases: list[int] = []
        with anyio.move_on_after(1.0):
            async with LeaseKeeper(store, 30) as keeper:
                leases.append(keeper.id)
                await store.put("k", b"v", lease=keeper.id)
                store.latency = 0.5  # every call from now on takes half a second
                await asyncio.sleep(3600)
        assert await store.get("k") is None
        with pytest.raises(LeaseNotFoundError):
            await store.inner.lease_time_to_live(leases[0])


@virtual_test
async def test_compaction_fails_only_watchers_that_had_not_read_what_it_drops() -> None:
    """A compaction up to a watcher's first unread event (kept), or past events it has read,
    loses it nothing: scanning or tracked, it reads on. Past an unread one, it fails."""
    engine = MemoryEngine()
    for i in range(3):
        engine.put("a", b"%d" % i)
    scanning = engine.add_watcher("a", 2, owner=None)  # its first unread event is revision 2
    tracked = engine.add_watcher("a", None, owner=None)
    caught_up = engine.add_watcher("a", None, owner=None)
    engine.put("a", b"3")  # revision 4: the first unread event of both tracked watchers
    assert [e.revision for e in engine.read_events(caught_up)] == [4]
    engine.compact(2)  # up to (not past) the scanning watcher's first unread event
    assert [e.revision for e in engine.read_events(scanning)] == [2, 3, 4]
    engine.compact(4)  # up to the tracked watcher's first unread event; caught_up read it
    assert [e.revision for e in engine.read_events(tracked)] == [4]
    engine.put("a", b"5")
    assert [e.revision for e in engine.read_events(caught_up)] == [5]
    engine.compact(5)
    for watcher in (scanning, tracked):
        assert [e.revision for e in engine.read_events(watcher)] == [5]
    engine.put("a", b"6")
    engine.put("b", b"7")
    assert [e.revision for e in engine.read_events(caught_up)] == [6]
    engine.compact(7)  # tracked had not read 6
    with pytest.raises(CompactedError) as info:
        engine.read_events(tracked)
    assert (info.value.requested_revision, info.value.compact_revision) == (6, 7)
    engine.close()


@virtual_test
async def test_restore_refuses_any_engine_that_is_not_fresh() -> None:
    state = EngineState(0, 0, (KeyValue("k", b"v", 1, 1, 1),), (), {}, 0)
    loaded = MemoryEngine()
    loaded.restore(state)  # keys and nothing else (a snapshot of revision 0, oddly)
    replayed = MemoryEngine()
    replayed.restore_commit(Commit(5, ()))  # a revision and nothing else
    for engine in (loaded, replayed):
        with pytest.raises(RuntimeError, match=r"^restore\(\) needs a fresh engine$"):
            engine.restore(state)
        engine.close()


@virtual_test
async def test_a_lost_watcher_is_told_its_first_unread_revision_and_counted() -> None:
    """A tracked watcher's error names the first event under its prefix it had not read, not
    the end of the log when it last read; the compaction counts the watchers it looked at."""
    engine = MemoryEngine()
    engine.put("a", b"0")
    tracked = engine.add_watcher("a", None, owner=None)
    scanning = engine.add_watcher("a", 1, owner=None)
    engine.put("b", b"1")  # revision 2, not under "a"
    engine.put("a", b"2")  # revision 3: the tracked watcher's first unread event
    engine.put("b", b"3")
    before = engine.work().watcher_visits
    engine.compact(4)
    # one scanning watcher, and both it and the tracked one lost
    assert engine.work().watcher_visits == before + 1 + 2
    with pytest.raises(CompactedError) as info:
        engine.read_events(tracked)
    assert (info.value.requested_revision, info.value.compact_revision) == (3, 4)
    with pytest.raises(CompactedError) as info:
        engine.read_events(scanning)
    assert info.value.requested_revision == 1
    engine.close()


@virtual_test
async def test_a_write_reaches_every_watcher_of_its_prefixes_when_more_prefixes_than_chars() -> (
    None
):
    """With more distinct watched prefixes than the key has characters, a write looks its own
    prefixes up (the whole key and the empty prefix included): each such watcher gets it once,
    the others nothing."""
    engine = MemoryEngine()
    watchers = {p: engine.add_watcher(p, None, owner=None) for p in ("", "k", "kx", "x", "y")}
    engine.put("k", b"1")
    got = {p: [e.kv.key for e in engine.read_events(w)] for p, w in watchers.items()}
    assert got == {"": ["k"], "k": ["k"], "kx": [], "x": [], "y": []}
    engine.close()


_REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="none")


@virtual_test
async def test_a_lease_expires_in_no_callers_context() -> None:
    """The expiry's hooks (a log, metrics) do not run in the context of whoever granted it."""
    engine = MemoryEngine()
    seen: list[str] = []
    engine.on_lease.append(lambda change: seen.append(_REQUEST.get()))
    _REQUEST.set("grant-request")
    lease = engine.lease_grant(1.0)
    engine.put("k", b"v", lease.id)
    await asyncio.sleep(1.5)
    assert engine.leases() == []
    assert seen == ["grant-request", "none"]  # the grant's own hook, then the expiry's
    engine.close()


@virtual_test
async def test_a_closed_engine_says_so_and_expires_nothing_after() -> None:
    engine = MemoryEngine()
    ended: list[LeaseChange] = []
    engine.on_lease.append(ended.append)
    lease = engine.lease_grant(1.0)
    assert lease.id == 1  # ids count from 1 (0 is "no lease")
    engine.put("k", b"v", lease.id)
    engine.close()
    await asyncio.sleep(2.0)  # past the TTL: the timer was stopped with the engine
    assert ended == [LeaseChange(1, 1.0)]  # the grant only
    for call in (lambda: engine.get("k"), lambda: engine.export_state()):
        with pytest.raises(StoreClosedError, match=r"^the memory store engine is closed$"):
            call()


@virtual_test
async def test_an_empty_namespace_is_the_parent_and_says_what_it_watches() -> None:
    async with MemoryStore() as parent:
        view = parent.namespace("")
        assert view.features == parent.features
        for key in ("a", "b", "c"):
            await view.put(key, b"x")
        assert await view.range("", limit=2) == await parent.range("", limit=2)
        lease = await view.lease_grant(10)
        kv = await view.get("a")
        assert kv is not None
        swapped = await view.compare_and_swap("a", kv.mod_revision, b"y", lease=lease.id)
        assert swapped.kv is not None
        assert swapped.kv.lease == lease.id
        nested = parent.namespace("n/")
        watch = nested.watch("p/", start_revision=2)
        assert (watch.prefix, watch.requested_revision) == ("p/", 2)
        _, following = await nested.range_and_watch("q/")
        async with following:
            assert following.prefix == "q/"


@virtual_test
async def test_a_guard_left_while_the_first_is_held_leaves_the_first_guarded() -> None:
    """The first guard held and a second entered and left: the loss cancels the first, and
    not the one already left (which the keeper no longer holds)."""
    async with MemoryStore() as store, LeaseKeeper(store, 3) as keeper:
        raised: list[BaseException] = []

        async def first() -> None:
            try:
                with keeper.guard():
                    await asyncio.sleep(3600)
            except LeaseExpiredError as exc:
                raised.append(exc)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                await asyncio.sleep(0.1)
                with keeper.guard() as second:
                    await asyncio.sleep(0.1)
                await store.lease_revoke(keeper.id)
        assert raised == [keeper.error]
        assert not second.cancel_called


@virtual_test
async def test_a_guard_is_an_ordinary_cancel_scope_and_masks_no_error() -> None:
    async with MemoryStore() as store, LeaseKeeper(store, 3) as keeper:
        loop = asyncio.get_running_loop()
        before = loop.time()
        with keeper.guard() as scope:
            scope.deadline = before + 1.0  # its own deadline: it moves on, as move_on_after does
            await asyncio.sleep(3600)
        assert scope.cancelled_caught
        assert loop.time() - before == 1.0
        guard = keeper.guard()
        with guard:
            pass
        with pytest.raises(RuntimeError, match=r"^a lease guard can be entered only once$"):
            guard.__enter__()
        await store.lease_revoke(keeper.id)
        await _lost(keeper, 2)
        with pytest.raises(ValueError, match=r"^its own error$"), keeper.guard():
            raise ValueError("its own error")  # before any checkpoint: not the loss's error


# -- open_store's URLs and backends


def _schemes() -> str:
    return ", ".join(supported_schemes())


def test_a_bad_store_url_is_named_redacted_with_the_schemes_supported() -> None:
    cases: list[tuple[str, str]] = [
        ("", f"url must look like scheme://..., got '' (supported schemes: {_schemes()})"),
        (
            "memory:x",
            f"url must look like scheme://..., got 'memory:x' (supported schemes: {_schemes()})",
        ),
        (
            "://host",
            f"url must look like scheme://..., got '://host' (supported schemes: {_schemes()})",
        ),
        (
            "gopher://u:secret@x",
            f"url 'gopher://u:***@x' has an unsupported scheme 'gopher' (supported: {_schemes()})",
        ),
        ("http://u:secret@[::1", "url is malformed: 'http://u:***@[::1' (Invalid IPv6 URL)"),
    ]
    for url, message in cases:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            parse_store_url(url)
    with pytest.raises(TypeError, match=r"^url must be a str, got bytes$"):
        parse_store_url(b"memory://")  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_backend_registered_at_run_time_gets_the_url_and_a_copy_of_the_options() -> None:
    calls: list[tuple[SplitResult, dict[str, Any]]] = []

    async def opener(parts: SplitResult, options: dict[str, Any]) -> Store:
        calls.append((parts, dict(options)))
        options.clear()  # the opener's own copy
        return MemoryStore()

    register_backend("Mutants6Test", opener)  # schemes are case-insensitive, as in URLs
    assert "mutants6test" in supported_schemes()
    opening = open_store("MUTANTS6TEST://host:1/p", depth=2)
    store = await opening
    assert isinstance(store, MemoryStore)
    assert not store.closed
    await store.aclose()
    async with opening as again:
        assert not again.closed
    assert again.closed  # leaving the block closes what it opened
    assert [(p.scheme, p.netloc, p.path, o) for p, o in calls] == [
        ("mutants6test", "host:1", "/p", {"depth": 2}),
        ("mutants6test", "host:1", "/p", {"depth": 2}),
    ]
    bad: object
    for bad in (42, "", "two words", "a-b"):
        with pytest.raises(
            ValueError,
            match=f"^scheme must be a plain word such as 'redis', got {re.escape(repr(bad))}$",
        ):
            register_backend(bad, opener)


@pytest.mark.asyncio
async def test_an_opener_left_before_it_opened_closes_nothing() -> None:
    opening = open_store("memory://")
    await opening.__aexit__(None, None, None)


# -- the protocol's records


def test_the_records_defaults_and_views() -> None:
    kv = KeyValue("k", "é".encode(), 1, 2, 1)
    assert kv.lease == 0
    assert kv.text() == "é"
    assert WatchEvent(EventType.DELETE, kv).revision == 2
    assert [EventType("PUT"), EventType("DELETE")] == [EventType.PUT, EventType.DELETE]
    other = KeyValue("l", b"w", 3, 3, 1, lease=7)
    result = RangeResult((kv, other), 3, 5)
    assert result.more is False
    assert (len(result), list(result), result[1], result[-1]) == (2, [kv, other], other, other)
    assert result.to_dict() == {"k": "é".encode(), "l": b"w"}
    assert LeaseStatus(1, 2.0, 1.5).keys == ()
    assert bool(CasResult(True, 1, kv))
    assert not CasResult(False, 1, None)
    assert LeaseGrant(5, 2.0) == LeaseGrant(id=5, ttl=2.0)


# -- the conveniences: stm, add, range_and_watch, wait_for


@virtual_test
async def test_stm_and_add_refuse_bad_arguments_by_name_and_try_32_times_by_default() -> None:
    async with MemoryStore() as store:

        async def noop(tx: StmTxn) -> None:
            await tx.get("x")

        with pytest.raises(ValueError, match=r"^max_attempts must be >= 1, got 0$"):
            await store.stm(noop, max_attempts=0)
        with pytest.raises(TypeError, match=r"^keys must be a list of keys, not a str$"):
            await store.stm(noop, keys="xy")
        with pytest.raises(TypeError, match=r"^delta must be an int, got float$"):
            await store.add("n", 1.5)  # type: ignore[arg-type]
        runs = 0

        async def once(tx: StmTxn) -> int:
            nonlocal runs
            runs += 1
            tx.put("y", b"1")
            return runs

        assert await store.stm(once, max_attempts=1) == 1  # one attempt is allowed

        async def interfered(tx: StmTxn) -> None:
            nonlocal runs
            runs += 1
            await tx.get("x")
            await store.put("x", b"%d" % runs)
            tx.put("y", b"2")

        runs = 0
        with pytest.raises(TxnConflictError):
            await store.stm(interfered)
        assert runs == 32


class _RoundTripStore(MemoryStore):
    """A memory store whose watches take a round trip (``delay`` s) to start and to close, as
    they do over a network, and whose next range may be followed by ``after_range``."""

    delay = 0.0
    after_range: Callable[[], object] | None = None

    async def _range(self, prefix: str, limit: int | None) -> RangeResult:
        result = await super()._range(prefix, limit)
        hook, self.after_range = self.after_range, None
        if hook is not None:
            await hook()  # type: ignore[misc]
        return result

    def _watch(self, prefix: str, start_revision: int | None) -> Watch:
        watch = super()._watch(prefix, start_revision)
        start, close = watch._start, watch._aclose
        delay = self.delay

        async def slow_start() -> None:
            await start()
            await asyncio.sleep(delay)  # (the store's answer)

        async def slow_close() -> None:
            await asyncio.sleep(delay)
            await close()

        watch._start = slow_start  # type: ignore[method-assign]
        watch._aclose = slow_close  # type: ignore[method-assign]
        return watch


@virtual_test
async def test_range_and_watch_sees_writes_after_its_range_and_rereads_after_a_compaction() -> None:
    async with _RoundTripStore() as store:
        await store.put("p/a", b"1")

        async def write() -> None:
            await store.put("p/b", b"2")

        store.after_range = write  # a write between the range and the watch
        result, watch = await store.range_and_watch("p/")
        async with watch:
            assert [kv.key for kv in result] == ["p/a"]
            event = await watch.__anext__()
            assert (event.kv.key, event.revision) == ("p/b", result.revision + 1)

        async def write_and_compact() -> None:
            await store.put("p/c", b"3")
            await store.put("p/c", b"4")
            await store.compact(await store.current_revision())

        store.after_range = write_and_compact  # the range's history is gone before the watch
        result, watch = await store.range_and_watch("p/")
        async with watch:
            assert [kv.key for kv in result] == ["p/a", "p/b", "p/c"]  # read again
            assert watch.start_revision == result.revision + 1


@virtual_test
async def test_range_and_watch_cancelled_while_its_watch_starts_still_closes_it() -> None:
    async with _RoundTripStore() as store:
        store.delay = 1.0
        with anyio.move_on_after(0.5):
            await store.range_and_watch("p/")
        await asyncio.sleep(0.1)
        assert store.engine.watcher_count == 0


@virtual_test
async def test_wait_for_names_bad_keys_takes_only_puts_of_its_keys_and_times_out_exactly() -> None:
    async with _RoundTripStore() as store:
        with pytest.raises(ValueError, match=r"^keys\[\] must not be empty$"):
            await store.wait_for(["a", ""])
        with pytest.raises(TypeError, match=r"^keys\[\] must be a str, got int$"):
            await store.wait_for([1])  # type: ignore[list-item]
        await store.put("a/x", b"0")

        async def writes() -> None:
            await asyncio.sleep(0.1)
            await store.put("a/z", b"other")  # under the keys' common prefix, not waited for
            await store.delete("a/x")
            await store.put("a/y", b"1")

        async with anyio.create_task_group() as tg:
            tg.start_soon(writes)
            found = await store.wait_for(["a/x", "a/y"], timeout=5)
        assert {k: kv.value for k, kv in found.items()} == {"a/x": b"0", "a/y": b"1"}
        with pytest.raises(
            StoreTimeoutError, match=r"^timed out after 0\.5s waiting for keys \['b/1', 'b/2'\]$"
        ):
            await store.wait_for(["b/2", "b/1"], timeout=0.5)

        store.delay = 0.5  # the watch's close takes half a second

        async def late_write() -> None:
            await asyncio.sleep(0.7)
            await store.put("c", b"1")

        async with anyio.create_task_group() as tg:
            tg.start_soon(late_write)
            # the key comes at 0.7 s; the timeout passes while the watch closes: found all the same
            found = await store.wait_for(["c"], timeout=1.0)
        assert list(found) == ["c"]


# -- Store's argument checks and closed state


@virtual_test
async def test_every_store_call_names_its_bad_argument_exactly() -> None:
    async with MemoryStore() as store:
        lease = await store.lease_grant(10)
        cases: list[tuple[Callable[[], Awaitable[object]], type[Exception], str]] = [
            (lambda: store.range("", limit=0), ValueError, "limit must be >= 1, got 0"),
            (lambda: store.range("", limit=1.0), TypeError, "limit must be an int, got float"),  # type: ignore[arg-type]
            (
                lambda: store.compare_and_delete("k", 0),
                ValueError,
                "expected_mod_revision must be >= 1, got 0",
            ),
            (
                lambda: store.compare_and_delete("k", "1"),  # type: ignore[arg-type]
                TypeError,
                "expected_mod_revision must be an int, got str",
            ),
            (
                lambda: store.compare_and_swap("k", -1, b"v"),
                ValueError,
                "expected_mod_revision must be >= 0, got -1",
            ),
            (lambda: store.put("k", b"v", lease=-1), ValueError, "lease must be >= 0, got -1"),
            (
                lambda: store.put("k", b"v", lease="1"),  # type: ignore[arg-type]
                TypeError,
                "lease must be an int, got str",
            ),
            (
                lambda: store.put("k", "v"),  # type: ignore[arg-type]
                TypeError,
                "value must be bytes, got str; encode it first (e.g. value.encode())",
            ),
            (lambda: store.get(1), TypeError, "key must be a str, got int"),  # type: ignore[arg-type]
            (lambda: store.compact(0), ValueError, "revision must be >= 1, got 0"),
            (lambda: store.lease_keep_alive(0), ValueError, "lease_id must be >= 1, got 0"),
            (lambda: store.lease_keep_alive("1"), TypeError, "lease_id must be an int, got str"),  # type: ignore[arg-type]
            (lambda: store.lease_keep_alive(True), TypeError, "lease_id must be an int, got bool"),
            (lambda: store.lease_revoke(0), ValueError, "lease_id must be >= 1, got 0"),
            (lambda: store.lease_time_to_live(0), ValueError, "lease_id must be >= 1, got 0"),
            (
                lambda: store.lease_grant(0),
                ValueError,
                "ttl must be a finite number of seconds > 0, got 0",
            ),
        ]
        for call, error, message in cases:
            with pytest.raises(error, match=f"^{re.escape(message)}$"):
                await call()
        with pytest.raises(ValueError, match=r"^start_revision must be >= 1, got 0$"):
            store.watch("", start_revision=0)
        assert await store.lease_keep_alive(lease.id) == 10.0
        assert (await store.lease_time_to_live(lease.id)).id == lease.id
        watch = store.watch("")
        await watch.aclose()
        with pytest.raises(StoreClosedError, match=r"^watch is closed$"):
            await watch.start()
    closed: list[Callable[[], Awaitable[object]]] = [
        lambda: store.get("k"),
        lambda: store.range(""),
        lambda: store.put("k", b"v"),
        lambda: store.delete("k"),
        lambda: store.compare_and_swap("k", 0, b"v"),
        lambda: store.compare_and_delete("k", 1),
        lambda: store.txn(),
        lambda: store.lease_keep_alive(1),
        lambda: store.lease_revoke(1),
        lambda: store.lease_time_to_live(1),
        lambda: store.compact(1),
        lambda: store.current_revision(),
    ]
    for call in closed:
        with pytest.raises(StoreClosedError, match=r"^MemoryStore is closed$"):
            await call()


class _CasAddStore(MemoryStore):
    """A memory store whose ``add`` is the protocol's default, on transactions (as etcd's)."""

    _add = Store._add


@virtual_test
async def test_the_default_add_counts_exactly_on_one_adder_per_store() -> None:
    async with _CasAddStore() as store:
        assert [await store.add("n"), await store.add("n", 4), await store.add("m", -2)] == [
            1,
            5,
            -2,
        ]
        adder = store._adder
        assert adder is not None
        await store.put("x", b"1")  # a store keeps one adder (and its memo) for all its adds
        results = await asyncio.gather(*(store.add("n") for _ in range(10)))
        assert sorted(results) == list(range(6, 16))
        assert store._adder is adder
        assert (await store.get("n")).value == b"15"  # type: ignore[union-attr]
    async with _CasAddStore() as bare:
        del bare._adder  # as in a backend whose __init__ does not call Store's
        assert await bare.add("n", 2) == 2


# -- session 14: the conditional writes' own argument checks (a fast path of type tests before
# the shared checkers), and a watch read before it was started


@virtual_test
async def test_the_conditional_writes_name_each_bad_argument_exactly_and_write_nothing() -> None:
    async with MemoryStore() as store:
        cases: list[tuple[Callable[[], Awaitable[object]], type[Exception], str]] = [
            (lambda: store.compare_and_swap(1, 0, b"v"), TypeError, "key must be a str, got int"),  # type: ignore[arg-type]
            (lambda: store.compare_and_swap("", 0, b"v"), ValueError, "key must not be empty"),
            (
                lambda: store.compare_and_swap("k", "1", b"v"),  # type: ignore[arg-type]
                TypeError,
                "expected_mod_revision must be an int, got str",
            ),
            (
                lambda: store.compare_and_swap("k", 0, "v"),  # type: ignore[arg-type]
                TypeError,
                "value must be bytes, got str; encode it first (e.g. value.encode())",
            ),
            (
                lambda: store.compare_and_swap("k", 0, b"v", lease=-1),
                ValueError,
                "lease must be >= 0, got -1",
            ),
            (
                lambda: store.compare_and_swap("k", 0, b"v", lease="1"),  # type: ignore[arg-type]
                TypeError,
                "lease must be an int, got str",
            ),
            (lambda: store.compare_and_delete(1, 1), TypeError, "key must be a str, got int"),  # type: ignore[arg-type]
            (lambda: store.compare_and_delete("", 1), ValueError, "key must not be empty"),
        ]
        for call, error, message in cases:
            with pytest.raises(error, match=f"^{re.escape(message)}$"):
                await call()
        assert store.engine.revision == 0
        # the fast path lets the valid forms through: a bytes-like value is taken as bytes
        swapped = await store.compare_and_swap("k", 0, bytearray(b"v"))  # type: ignore[arg-type]
        assert swapped.succeeded
        assert (await store.get("k")) == swapped.kv
        assert type(swapped.kv.value) is bytes  # type: ignore[union-attr]
        assert (await store.compare_and_delete("k", swapped.revision)).succeeded


@virtual_test
async def test_a_watch_read_before_it_was_started_starts_it_through_its_store() -> None:
    """``__anext__`` on a watch never started starts it (the store's own start: a partitioned
    client refuses it at once), and never starts a started watch twice."""
    async with FaultInjectingStore(MemoryStore()) as store:
        store.partition()
        with pytest.raises(StoreConnectionError):
            with anyio.fail_after(5):
                await anext(store.watch("k"))
        store.heal()
        watch = store.watch("k")
        await store.put("a", b"0")
        reader = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0)
        assert store.calls["watch"] == 2  # started once, by the read
        await store.put("k", b"1")
        event = await reader
        assert (event.kv.key, event.revision) == ("k", 2)
        await store.put("k", b"2")
        assert (await anext(watch)).revision == 3
        assert store.calls["watch"] == 2
        await watch.aclose()


@virtual_test
async def test_the_default_add_to_a_value_that_is_no_integer_names_its_first_40_bytes() -> None:
    async with _CasAddStore() as store:
        value = b"0123456789" * 4 + b"not an integer"
        await store.put("k", value)
        message = f"add: the value at 'k' is not a decimal integer: {value[:40]!r}"
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            await store.add("k", 1)
        assert (await store.get("k")).value == value  # type: ignore[union-attr]


def test_both_branches_count_toward_the_byte_limit_and_any_iterable_is_a_branch() -> None:
    half = b"x" * (MAX_TXN_BYTES // 2)
    check_txn([], [Put("a", half[:-1])], [Put("b", half[:-1])])  # exactly the limit: fits
    with pytest.raises(TxnTooLargeError) as info:
        check_txn([], [Put("a", half)], [Put("b", half)])
    assert (info.value.limit, info.value.size) == ("bytes", MAX_TXN_BYTES + 2)
    with pytest.raises(TxnTooLargeError) as info:
        check_txn([], [], [Put("b", b"x" * MAX_TXN_BYTES)])  # the failure branch alone
    assert info.value.size == MAX_TXN_BYTES + 1
    ops: list[TxnOp] = [Put("a", b"1"), Get("b")]
    txn = check_txn(iter([Compare.version("a") == 0]), (op for op in ops), {Delete("c")})
    assert (txn.compare, txn.success, txn.failure) == (
        (Compare.version("a") == 0,),
        tuple(ops),
        (Delete("c"),),
    )


@virtual_test
async def test_a_watch_without_a_waker_says_so_when_asked_for_an_event() -> None:
    async with FaultInjectingStore(MemoryStore()) as store, store.watch("k") as watch:
        assert watch._set_waker(lambda: None) is False
        for take in (watch._take_event, watch._event_ready):
            with pytest.raises(
                NotImplementedError, match=r"^this watch has no waker \(read it with __anext__\)$"
            ):
                take()
