"""The --data-dir log and snapshots: replay restores the engine exactly (keys, revisions,
history, compaction, leases with their TTL restarted); torn tails are cut, damage is refused."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioelastic.errors import CompactedError, LeaseNotFoundError
from aioelastic.store import MemoryEngine
from aioelastic.store.http._persist import CorruptDataDirError, DataDir
from aioelastic.store.memory import EngineState


def _comparable(state: EngineState) -> tuple[object, ...]:
    return (
        state.revision,
        state.compact_revision,
        state.kvs,
        state.history,
        state.leases,
        state.last_lease_id,
    )


async def _reopen(path: Path, **kwargs: Any) -> tuple[MemoryEngine, DataDir]:
    engine = MemoryEngine()
    data = DataDir(path, **kwargs)
    data.open(engine)
    return engine, data


@pytest.mark.asyncio
async def test_replay_restores_everything(tmp_path: Path) -> None:
    engine, data = await _reopen(tmp_path)
    lease = engine.lease_grant(30).id
    short = engine.lease_grant(0.05).id
    engine.put("a", b"1")
    engine.put("b", b"\x00\xff", lease)
    engine.put("c", b"gone soon", short)
    engine.put("a", b"2")
    engine.add("n", 5)
    engine.compare_and_swap("a", 999, b"no")  # a failed CAS changes nothing
    engine.delete("nothing")
    engine.put("p/1", b"x")
    engine.put("p/2", b"y")
    engine.delete("p/", prefix=True)
    engine.compact(3)
    await asyncio.sleep(0.2)  # the short lease expires: its key is deleted
    assert engine.get("c") is None
    await data.wait_durable()
    expected = engine.export_state()
    await data.aclose()
    engine.close()

    restored, data = await _reopen(tmp_path)
    try:
        assert _comparable(restored.export_state()) == _comparable(expected)
        status = restored.lease_time_to_live(lease)
        assert status.keys == ("b",)
        assert status.remaining > 29  # the TTL restarted on load
        with pytest.raises(LeaseNotFoundError):
            restored.lease_time_to_live(short)
        with pytest.raises(CompactedError):
            restored.add_watcher("", 2, owner=None)
        # a watch from the compacted revision on still sees the history
        watcher = restored.add_watcher("p/", 3, owner=None)
        assert [e.kv.key for e in restored.read_events(watcher)] == ["p/1", "p/2", "p/1", "p/2"]
        # new writes continue the revision counter and the lease ids
        assert restored.put("z", b"1") == expected.revision + 1
        assert restored.lease_grant(5).id == short + 1
    finally:
        await data.aclose()
        restored.close()


@pytest.mark.asyncio
async def test_snapshots_bound_the_log(tmp_path: Path) -> None:
    engine, data = await _reopen(tmp_path, snapshot_every=10)
    lease = engine.lease_grant(60).id
    for i in range(95):
        engine.put(f"k{i % 7}", str(i).encode(), lease if i % 3 == 0 else 0)
    expected = engine.export_state()
    assert data.snapshots >= 9
    assert (tmp_path / "snapshot.json").exists()
    assert len((tmp_path / "wal.log").read_bytes().splitlines()) < 10
    await data.aclose()
    engine.close()
    restored, data = await _reopen(tmp_path)
    assert _comparable(restored.export_state()) == _comparable(expected)
    await data.aclose()
    restored.close()


@pytest.mark.asyncio
async def test_a_torn_last_record_is_cut_off(tmp_path: Path) -> None:
    engine, data = await _reopen(tmp_path)
    engine.put("a", b"1")
    engine.put("b", b"2")
    await data.aclose()
    engine.close()
    wal = tmp_path / "wal.log"
    intact = wal.read_bytes()
    wal.write_bytes(intact + b'0badc0de {"c":3,"e":[["P","c"')  # a crash mid-write
    restored, data = await _reopen(tmp_path)
    assert restored.revision == 2
    assert wal.read_bytes() == intact
    restored.put("c", b"3")
    await data.aclose()
    restored.close()
    again, data = await _reopen(tmp_path)
    assert again.get("c") is not None
    await data.aclose()
    again.close()


@pytest.mark.asyncio
async def test_damage_before_intact_records_is_refused(tmp_path: Path) -> None:
    engine, data = await _reopen(tmp_path)
    for i in range(3):
        engine.put("a", str(i).encode())
    await data.aclose()
    engine.close()
    wal = tmp_path / "wal.log"
    lines = wal.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"a"', b'"b"')  # checksum no longer matches
    wal.write_bytes(b"".join(lines))
    with pytest.raises(CorruptDataDirError, match="damaged"):
        await _reopen(tmp_path)


@pytest.mark.asyncio
async def test_one_server_per_data_dir(tmp_path: Path) -> None:
    engine, data = await _reopen(tmp_path)
    with pytest.raises(RuntimeError, match="in use"):
        await _reopen(tmp_path)
    await data.aclose()
    engine.close()


@pytest.mark.asyncio
async def test_fsync_always_waits_for_the_flush(tmp_path: Path) -> None:
    engine, data = await _reopen(tmp_path, fsync="always")
    engine.put("a", b"1")
    assert data._synced < data.last_sequence
    await asyncio.gather(*(data.wait_durable() for _ in range(10)))
    assert data._synced == data.last_sequence
    await data.aclose()
    engine.close()


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from("abcde"), st.binary(max_size=8), st.booleans()),
        st.tuples(st.just("delete"), st.sampled_from("abcde")),
        st.tuples(st.just("delete_prefix"), st.sampled_from(["", "a", "b"])),
        st.tuples(st.just("cas"), st.sampled_from("abcde"), st.integers(0, 30)),
        st.tuples(st.just("add"), st.sampled_from(["n", "m"]), st.integers(-5, 5)),
        st.tuples(st.just("grant")),
        st.tuples(st.just("revoke")),
        st.tuples(st.just("compact")),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS, snapshot_every=st.integers(1, 12))
def test_any_history_replays_to_the_same_state(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[Any, ...]], snapshot_every: int
) -> None:
    path = tmp_path_factory.mktemp("data")

    async def run() -> None:
        engine, data = await _reopen(path, snapshot_every=snapshot_every, fsync="never")
        leases: list[int] = []
        for op in ops:
            kind = op[0]
            if kind == "put":
                _, key, value, leased = op
                engine.put(str(key), bytes(value), leases[-1] if leased and leases else 0)
            elif kind == "delete":
                engine.delete(str(op[1]))
            elif kind == "delete_prefix":
                engine.delete(str(op[1]), prefix=True)
            elif kind == "cas":
                engine.compare_and_swap(str(op[1]), int(op[2]), b"cas")
            elif kind == "add":
                engine.add(str(op[1]), int(op[2]))
            elif kind == "grant":
                leases.append(engine.lease_grant(60).id)
            elif kind == "revoke" and leases:
                engine.lease_revoke(leases.pop())
            elif kind == "compact" and engine.revision > engine.compact_revision:
                engine.compact(engine.revision)
        expected = engine.export_state()
        await data.aclose()
        engine.close()
        restored, data = await _reopen(path)
        assert _comparable(restored.export_state()) == _comparable(expected)
        await data.aclose()
        restored.close()

    asyncio.run(run())
