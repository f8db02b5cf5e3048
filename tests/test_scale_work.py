"""White-box tests of scaling: the work of a rendezvous round grows linearly in N.

Work is counted, not timed: the memory engine's counters (:class:`EngineWork`: events delivered,
watchers visited, keys scanned, writes) and the members scanned through a round record's
member list. Each test runs the same thing at two sizes, N and 4N, and fails when the work grows
faster than linearly (a per-join scan of every member or watcher makes it grow 16-fold).
"""

from __future__ import annotations

import asyncio
import gc
import json
from pathlib import Path

import pytest

from aioelastic.errors import CompactedError
from aioelastic.rendezvous import DynamicRendezvousHandler, StaticRendezvousHandler
from aioelastic.store import EventType, KeyValue, MemoryEngine, MemoryStore, RangeResult, WatchEvent
from aioelastic.store.memory import Commit
from aioelastic.testing import run_virtual
from benchmarks.scale import RoundFigures, memory_rounds, newcomer_round
from benchmarks.scale import main as scale_main
from benchmarks.scale_loss import lost_member

SMALL, LARGE = 100, 400
#: linear growth is LARGE / SMALL = 4 (plus constant terms); quadratic is 16
LINEAR = LARGE / SMALL * 1.25


def rounds(n: int) -> list[RoundFigures]:
    """A first round of N new nodes, then a second one in which every member rejoins."""
    return run_virtual(memory_rounds(n, rounds=2))


@pytest.fixture(scope="module")
def measured() -> dict[int, list[RoundFigures]]:
    return {n: rounds(n) for n in (SMALL, LARGE)}


@pytest.mark.parametrize("which", [0, 1], ids=["first round", "every member rejoins"])
@pytest.mark.parametrize(
    "counter", ["events", "event_bytes", "writes", "watcher_visits", "keys_scanned"]
)
def test_round_work_grows_linearly(
    measured: dict[int, list[RoundFigures]], which: int, counter: str
) -> None:
    small, large = (getattr(measured[n][which], counter) for n in (SMALL, LARGE))
    assert small > 0
    assert large <= LINEAR * small, (counter, small, large)


@pytest.mark.parametrize("which", [0, 1], ids=["first round", "every member rejoins"])
def test_round_work_per_node_is_small(measured: dict[int, list[RoundFigures]], which: int) -> None:
    for n, figures in measured.items():
        f = figures[which]
        assert f.events is not None
        assert f.writes is not None
        assert f.event_bytes is not None
        assert f.roster_bytes is not None
        # each node: the driver claim and the round record; and to the driver alone, each
        # registration written after its count started (a put, and a rejoin's old one removed)
        assert f.events <= 4 * n
        assert f.event_bytes <= 120 * f.events  # each event is small: no member list in any
        assert f.writes <= 2 * n + 4  # each node: its registration (and its old one's removal)
        assert f.record_bytes <= 100  # every node receives it: a few constant fields
        assert f.roster_bytes <= 20 * n  # the members' ids, in chunks
        # node records, the members' records (this round's and the last's) and the roster
        assert f.state_bytes <= 300 * n


class _ReadBytes(MemoryStore):
    """A memory store client that counts the bytes (keys and values) its reads return."""

    read = 0

    async def _get(self, key: str) -> KeyValue | None:
        kv = await super()._get(key)
        if kv is not None:
            _ReadBytes.read += len(kv.key) + len(kv.value)
        return kv

    async def _range(self, prefix: str, limit: int | None) -> RangeResult:
        result = await super()._range(prefix, limit)
        _ReadBytes.read += sum(len(kv.key) + len(kv.value) for kv in result.kvs)
        return result


async def _bytes_read(n: int, participants: bool) -> int:
    """Bytes N nodes read while a round of N forms and every member finds its rank."""
    engine = MemoryEngine()
    hs = [
        DynamicRendezvousHandler(
            _ReadBytes(engine), "job", n, n, local_addr="h", owns_store=True,
            participants=participants,
        )
        for _ in range(n)
    ]  # fmt: skip
    _ReadBytes.read = 0
    results = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    read = _ReadBytes.read
    assert sorted(r.rank for r in results) == list(range(n))
    await asyncio.gather(*(h.aclose() for h in hs))
    return read


def test_members_find_their_rank_without_reading_the_roster() -> None:
    """Each member reads its member record (O(1) bytes), not the whole roster: the bytes read
    in a round grow linearly; with ``participants`` every member reads all N (N^2)."""
    small, large = (run_virtual(_bytes_read(n, participants=False)) for n in (SMALL, LARGE))
    assert small > 0
    assert large <= LINEAR * small, (small, large)
    assert large <= 200 * LARGE  # a member record each, and the driver's reads
    # the check can fail: the whole roster to every member grows 16-fold
    whole = [run_virtual(_bytes_read(n, participants=True)) for n in (SMALL, LARGE)]
    assert whole[1] > 10 * whole[0], whole


async def _closing_stores_visits(n: int) -> int:
    """Watcher visits to close N stores of one engine, each with a watch of its own."""
    engine = MemoryEngine()
    stores = [MemoryStore(engine) for _ in range(n)]
    watches = [store.watch(f"k/{i}") for i, store in enumerate(stores)]
    for watch in watches:
        await watch.start()
    before = engine.work().watcher_visits
    for store in stores:
        await store.aclose()  # fails its own watch (fail_watchers_of)
    for watch in watches:
        await watch.aclose()
    return engine.work().watcher_visits - before


def test_closing_a_store_visits_its_own_watchers_only() -> None:
    small, large = (run_virtual(_closing_stores_visits(n)) for n in (SMALL, LARGE))
    assert small == SMALL
    assert large == LARGE  # one each: a scan of every watcher per close would be LARGE**2


async def _compaction_visits(idle: int) -> tuple[int, int]:
    """Watcher visits of 400 writes that compact the log many times, with ``idle`` watchers
    (tracked, nothing unread) of another prefix; and the compactions."""
    engine = MemoryEngine(history_limit=8)
    store = MemoryStore(engine)
    watches = [store.watch("idle/") for _ in range(idle)]
    for watch in watches:
        await watch.start()
    before = engine.work().watcher_visits
    for i in range(400):
        await store.put(f"busy/{i % 4}", b"x")
    visits = engine.work().watcher_visits - before
    compactions = engine.compact_revision
    await store.aclose()
    return visits, compactions


def test_compaction_does_not_visit_idle_watchers() -> None:
    (small, compacted), (large, _) = (run_virtual(_compaction_visits(n)) for n in (SMALL, LARGE))
    assert compacted > 300  # the log was compacted over and over
    assert small == large == 0  # every idle watcher per compaction would be 30,000 and more


async def _compacted_under_a_tracked_watcher() -> None:
    engine = MemoryEngine(history_limit=4)
    store = MemoryStore(engine)
    async with store.watch("w/") as behind, store.watch("w/") as current:
        await store.put("w/a", b"1")  # both have it unread
        rev = await store.put("w/b", b"2")
        assert [e.kv.key for e in [await anext(current), await anext(current)]] == ["w/a", "w/b"]
        for i in range(12):  # compacts past w/a and w/b
            await store.put(f"other/{i}", b"x")
        with pytest.raises(CompactedError) as caught:
            await anext(behind)
        assert caught.value.requested_revision == rev - 1  # its first unread revision
        await store.put("w/c", b"3")  # the one that had read everything lost nothing
        assert (await asyncio.wait_for(anext(current), 1)).kv.key == "w/c"
    await store.aclose()


def test_compaction_fails_a_tracked_watcher_whose_unread_event_goes() -> None:
    run_virtual(_compacted_under_a_tracked_watcher())


async def _keeper_tasks() -> tuple[int, int, int]:
    engine = MemoryEngine()
    store = MemoryStore(engine)
    async with store.lease(ttl=3.0) as keeper:
        tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("aioelastic-lease")]
        await asyncio.sleep(10.5)  # virtual: renewals at 1, 2, ... 10 s, none at 10.5
        idle_tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("aioelastic-lease")]
        renewals = keeper.statistics().renewals
        assert not keeper.lost
    await store.aclose()
    return len(tasks), len(idle_tasks), renewals


def test_lease_keeper_holds_a_timer_not_a_task_between_renewals() -> None:
    tasks, idle_tasks, renewals = run_virtual(_keeper_tasks())
    assert (tasks, idle_tasks) == (0, 0)
    assert renewals >= 9


def test_a_newcomer_round_delivers_linearly_many_events() -> None:
    """N members in wait_for_change, a newcomer, every member rejoins: events read are O(N)."""
    small, large = (run_virtual(newcomer_round(n)) for n in (SMALL, LARGE))
    assert small.events is not None
    assert large.events is not None
    assert large.events <= LINEAR * small.events
    assert large.events <= 8 * large.n


def test_a_newcomer_round_fans_out_linearly() -> None:
    """N members in wait_for_change all rejoin at a newcomer: a member's re-registration is
    sent to the driver alone (members watch their round's m/ prefix, not n/), so the watchers
    visited grow linearly (they were O(N^2): 10,502 at N = 100, 162,002 at 400)."""
    small, large = (run_virtual(newcomer_round(n)) for n in (SMALL, LARGE))
    assert small.watcher_visits is not None
    assert large.watcher_visits is not None
    assert large.watcher_visits <= LINEAR * small.watcher_visits
    assert large.watcher_visits <= 8 * LARGE
    assert small.event_bytes is not None
    assert large.event_bytes is not None
    assert large.event_bytes <= LINEAR * small.event_bytes


async def _restored_under_a_watcher() -> list[str]:
    engine = MemoryEngine()
    store = MemoryStore(engine)
    async with store.watch("w/") as watch:
        await store.put("w/a", b"1")  # unread when the commit is restored
        revision = engine.revision + 1
        kv = KeyValue("w/b", b"2", revision, revision, 1, 0)
        engine.restore_commit(Commit(revision, (WatchEvent(EventType.PUT, kv),)))
        keys = [(await anext(watch)).kv.key for _ in range(2)]
    await store.aclose()
    return keys


def test_a_watcher_tracked_before_a_restored_commit_reads_it_after_what_it_had() -> None:
    assert run_virtual(_restored_under_a_watcher()) == ["w/a", "w/b"]


def test_the_scale_benchmark_runs_and_writes_its_figures(tmp_path: Path) -> None:
    """``python -m benchmarks.scale`` at tiny sizes: the JSON has every round, with its work."""
    out = tmp_path / "scale.json"
    for mode in ("memory", "simulate"):
        assert (
            scale_main(["--mode", mode, "--sizes", "10,20", "--repeat", "2", "--json", str(out)])
            == 0
        )
        data = json.loads(out.read_text())
        assert data["mode"] == mode
        assert data["failures"] == {}
        for n, figures in data["runs"].items():
            assert len(figures) == 2
            for f in figures:
                assert f["n"] == int(n)
                assert f["seconds"] > 0
                # the claim and the round record to each node; to the driver, the registrations
                # written after its count started (the claim is in the first registration)
                assert 2 * f["n"] <= f["events"] < 3 * f["n"]
                assert f["record_bytes"] > 0


def test_the_scale_benchmark_prints_frozen_rows_apart(capsys: pytest.CaptureFixture[str]) -> None:
    """``--also-frozen``: the normal rows first (the targets' figures), then the same sizes with
    ``gc.freeze()`` after set-up, labelled as extra; the collector's settings are left as they
    were (frozen objects unfrozen, collection enabled)."""
    assert scale_main(["--sizes", "10,20", "--also-frozen"]) == 0
    out = capsys.readouterr().out
    normal, _, frozen = out.partition("extra rows, NOT the target's figure: gc.freeze()")
    assert frozen
    for part in (normal, frozen):
        rows = [
            line.split()[0] for line in part.splitlines() if line.split()[:1] in (["10"], ["20"])
        ]
        assert rows == ["10", "20"], part
        assert "N=20: cpu" in part
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


async def _static_round(n: int) -> tuple[int, int]:
    """Events delivered and watchers visited while a static round of N forms."""
    engine = MemoryEngine()
    hs = [
        StaticRendezvousHandler(
            MemoryStore(engine), "static", rank, n, local_addr="127.0.0.1", owns_store=True
        )
        for rank in reversed(range(n))  # rank 0 last: the others wait for its round record
    ]
    before = engine.work()
    results = await asyncio.gather(*(h.next_rendezvous() for h in hs))
    after = engine.work()
    assert sorted(r.rank for r in results) == list(range(n))
    assert {r.participants for r in results} == {tuple(f"rank{r}" for r in range(n))}
    await asyncio.gather(*(h.aclose() for h in hs))
    return (
        after.events_delivered - before.events_delivered,
        after.watcher_visits - before.watcher_visits,
    )


def test_a_static_round_delivers_linearly_many_events() -> None:
    """Rank 0 watches the registrations; the others wait for its one round record."""
    (events, visits), (large_events, large_visits) = (
        run_virtual(_static_round(n)) for n in (SMALL, LARGE)
    )
    assert large_events <= LINEAR * events
    assert large_visits <= LINEAR * visits  # every rank watching every registration: 16-fold
    assert large_visits <= 3 * LARGE


def test_a_lost_member_costs_each_survivor_one_event() -> None:
    """One member of N lost (its lease revoked, as the server does after a session's grace):
    each survivor reads one event (the deleted member record) and is visited once, whatever N
    (a scan of every member, or an event per member to each, would grow with N); the round of
    N - 1 after it is linear too."""
    small, large = (run_virtual(lost_member(n)) for n in (SMALL, LARGE))
    for f in (small, large):
        assert f.seen_events == f.n - 1
        assert f.seen_visits == f.n - 1
        assert 2 * (f.n - 1) <= f.again_events <= 8 * f.n
    assert large.again_events <= LINEAR * small.again_events
    assert large.again_visits <= LINEAR * small.again_visits
    assert large.again_writes <= LINEAR * small.again_writes


def test_the_scale_benchmark_times_a_lost_member_in_process(tmp_path: Path) -> None:
    """``--kill`` on the memory store: the loss and the round after it, per run, in the JSON."""
    out = tmp_path / "loss.json"
    argv = ["--mode", "simulate", "--kill", "--sizes", "5,10", "--repeat", "2"]
    assert scale_main([*argv, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["kill"] is True
    assert {n: len(figures) for n, figures in data["runs"].items()} == {"5": 2, "10": 2}
    for f in data["runs"]["10"]:
        assert f["seen_events"] == 9
        assert f["again_seconds"] > 0
