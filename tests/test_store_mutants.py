"""Gaps that mutation testing of ``store/`` found (``scripts/mutants store``): each test here fails
on a realistic bug of the shape of a mutant the rest of the suite let through. Memory store,
virtual time where anything waits."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.errors import (
    CompactedError,
    StoreConnectionError,
    TxnConflictError,
    TxnTooLargeError,
)
from aioelastic.store import (
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    Compare,
    Delete,
    DeletePrefix,
    DeleteResult,
    EventType,
    Get,
    GetResult,
    KeyValue,
    LeaseStatus,
    MemoryEngine,
    MemoryStore,
    Put,
    Range,
    Txn,
    TxnOp,
    TxnResult,
    WatchEvent,
)
from aioelastic.store._add import CounterAdder
from aioelastic.store._args import check_int, check_key, check_prefix, check_value, prefix_end
from aioelastic.store._stm import StmTxn
from aioelastic.store._txn import check_txn
from aioelastic.store.memory import Commit
from aioelastic.testing import FaultInjectingStore, virtual_test

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
    compares = [Compare.value("c") == filler]  # 1 + len(filler) bytes
    for extra, fits in ((b"", True), (b"x", True), (b"xy", False)):
        item = op[kind]
        ops = [Put("v", extra)] if kind == "compare" else [item, Put("v", extra)]
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
