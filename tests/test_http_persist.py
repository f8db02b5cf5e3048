"""The --data-dir log and snapshots: replay restores the engine exactly (keys, revisions,
history, compaction, leases with their TTL restarted); only a partial last record is cut as torn
(kept aside first); any other damage is refused with what and how many records, or accepted
explicitly; format 1 data dirs still load and are rewritten."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import re
import stat
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioelastic.errors import CompactedError, LeaseNotFoundError
from aioelastic.store import EventType, KeyValue, MemoryEngine, MemoryStore
from aioelastic.store.http._persist import CorruptDataDirError, DataDir
from aioelastic.store.http._persist_codec import LOCK, decode_line, encode_line, event_out, kv_out
from aioelastic.store.http._persist_load import load
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


@contextlib.asynccontextmanager
async def _opened(path: Path, **kwargs: Any) -> AsyncIterator[MemoryEngine]:
    """:func:`_reopen`'s engine, its data directory closed after the block, then the engine."""
    engine, data = await _reopen(path, **kwargs)
    try:
        yield engine
    finally:
        await data.aclose()
        engine.close()


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
    store = MemoryStore(engine)  # shares the engine: closing it leaves the engine open
    async with store, store.watch("c", start_revision=engine.revision + 1) as events:
        # the short lease expires: its key is deleted (a watch sees it, or the get sees it gone)
        if engine.get("c") is not None:
            event = await asyncio.wait_for(events.__anext__(), 10)
            assert (event.type, event.kv.key) == (EventType.DELETE, "c")
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
async def test_one_server_per_data_dir(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="aioelastic.serve"):
        engine, data = await _reopen(tmp_path)
    assert "rewriting" not in caplog.text  # (a new directory: nothing to rewrite)
    assert stat.S_IMODE((tmp_path / LOCK).stat().st_mode) == 0o600
    words = f"^data directory {str(tmp_path)!r} is in use by another server$"
    with pytest.raises(RuntimeError, match=re.escape(words[1:-1])):
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


# -- the damage matrix ---------------------------------------------------------------------------
# A data dir of 70 puts (key k<i>, value str(i), revision i+1... i.e. record i+1), snapshot after
# record 50: snapshot.json holds records 1-50, wal.log a header line and records 51-70.

_RECORDS = 70


async def _written(path: Path) -> None:
    engine, data = await _reopen(path, snapshot_every=50)
    for i in range(_RECORDS):
        engine.put(f"k{i}", str(i).encode())
    assert data.snapshots == 1
    await data.aclose()
    engine.close()


def _log_lines(path: Path) -> list[bytes]:
    return (path / "wal.log").read_bytes().splitlines(keepends=True)


def _write_log(path: Path, lines: list[bytes]) -> None:
    (path / "wal.log").write_bytes(b"".join(lines))


def _edit_line(line: bytes, old: bytes, new: bytes) -> bytes:
    assert old in line
    return line.replace(old, new)


def _delete_snapshot(path: Path) -> None:
    (path / "snapshot.json").unlink()


def _edit_snapshot_value(path: Path) -> None:
    snapshot = path / "snapshot.json"
    raw = snapshot.read_bytes()
    assert raw.count(b'["k1","MQ=="') == 1  # k1's value "1" becomes "2"
    snapshot.write_bytes(raw.replace(b'["k1","MQ=="', b'["k1","Mg=="'))


def _truncate_snapshot(path: Path) -> None:
    snapshot = path / "snapshot.json"
    snapshot.write_bytes(snapshot.read_bytes()[:-100])


def _delete_middle_line(path: Path) -> None:
    lines = _log_lines(path)
    del lines[10]  # record 60
    _write_log(path, lines)


def _reorder_lines(path: Path) -> None:
    lines = _log_lines(path)
    lines[5], lines[6] = lines[6], lines[5]  # records 55 and 56
    _write_log(path, lines)


def _convert_to_crlf(path: Path) -> None:
    wal = path / "wal.log"
    wal.write_bytes(wal.read_bytes().replace(b"\n", b"\r\n"))


def _bad_checksum_on_last_line(path: Path) -> None:
    lines = _log_lines(path)
    lines[-1] = _edit_line(lines[-1], b'"k69"', b'"k96"')  # a complete line: not a torn write
    _write_log(path, lines)


def _several_damaged_lines(path: Path) -> None:
    lines = _log_lines(path)
    lines[5] = _edit_line(lines[5], b'"k54"', b'"K54"')
    lines[15] = _edit_line(lines[15], b'"k64"', b'"K64"')
    _write_log(path, lines)


def _delete_log(path: Path) -> None:
    (path / "wal.log").unlink()


def _empty_log(path: Path) -> None:
    (path / "wal.log").write_bytes(b"")


# (damage, what the message must say, records affected, the last consistent record)
_REFUSED: list[tuple[Callable[[Path], None], str, str, int]] = [
    (_delete_snapshot, r"snapshot\.json is missing: it held records 1-50", "70 records", 0),
    (_edit_snapshot_value, r"snapshot\.json is damaged \(bad checksum\)", "70 records", 0),
    (_truncate_snapshot, r"snapshot\.json is damaged \(cut short", "70 records", 0),
    (_delete_middle_line, r"record 60 is absent", "11 records", 59),
    (_reorder_lines, r"record 56 where 55 should follow.*out of order", "16 records", 54),
    (_convert_to_crlf, r"20 damaged lines: lines 2-21: CRLF line ending", "20 records", 50),
    (_bad_checksum_on_last_line, r"1 damaged line: line 21 .*bad checksum", "1 record is", 69),
    (_several_damaged_lines, r"2 damaged lines: line 6 .*line 16 .*bad checksum", "16 rec", 54),
    (_delete_log, r"wal\.log is missing", "An unknown number of records", 50),
    (_empty_log, r"wal\.log is empty", "An unknown number of records", 50),
]


def _matching(path: Path, pattern: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.glob(pattern)}


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != "LOCK"}


@pytest.mark.parametrize(
    ("damage", "what", "count", "last"), _REFUSED, ids=[case[0].__name__ for case in _REFUSED]
)
@pytest.mark.asyncio
async def test_damage_is_refused_with_what_and_how_many(
    tmp_path: Path, damage: Callable[[Path], None], what: str, count: str, last: int
) -> None:
    await _written(tmp_path)
    damage(tmp_path)
    before = _files(tmp_path)
    with pytest.raises(CorruptDataDirError) as raised:
        await _reopen(tmp_path)
    message = str(raised.value)
    assert re.search(what, message), message
    assert count in message, message
    assert f"the last consistent state is record {last} " in message, message
    assert "accept-data-loss" in message
    assert _files(tmp_path) == before  # nothing cut, moved or rewritten


@pytest.mark.parametrize("damage", [case[0] for case in _REFUSED], ids=lambda f: f.__name__)
@pytest.mark.asyncio
async def test_accepting_the_loss_keeps_the_damage_aside_and_reuses_no_revision(
    tmp_path: Path, damage: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    await _written(tmp_path)
    damage(tmp_path)
    before = _files(tmp_path)
    with caplog.at_level(logging.ERROR, logger="aioelastic.serve"):
        engine, data = await _reopen(tmp_path, accept_data_loss=True)
    try:
        assert "ACCEPTING DATA LOSS" in caplog.text
        assert data.data_loss is not None
        assert "is damaged" in data.data_loss
        # what was kept aside is exactly what was there
        aside = _matching(tmp_path, "*.damaged-*")
        assert sorted(aside.values()) == sorted(before.values())
        # every key left is one that was written, with its value
        for kv in engine.range("").kvs:
            assert kv.value == kv.key[1:].encode()
        assert engine.revision >= min(_RECORDS, len(engine))
        revision = engine.put("new", b"x")
        assert revision > _RECORDS or damage in (_delete_log, _empty_log)
    finally:
        await data.aclose()
        engine.close()
    again, data = await _reopen(tmp_path)  # the directory is consistent again
    assert again.get("new") is not None
    assert again.revision == revision
    await data.aclose()
    again.close()


@pytest.mark.asyncio
async def test_a_log_cut_short_mid_record_is_a_torn_write_kept_aside(tmp_path: Path) -> None:
    await _written(tmp_path)
    wal = tmp_path / "wal.log"
    whole = wal.read_bytes()
    wal.write_bytes(whole[:-20])  # the last record (70) is cut short: a crash mid-write
    engine, data = await _reopen(tmp_path)
    try:
        assert engine.revision == _RECORDS - 1
        assert [kv.key for kv in engine.range("").kvs] == sorted(f"k{i}" for i in range(69))
        (torn,) = _matching(tmp_path, "wal.log.torn-*").values()
        assert wal.read_bytes() + torn == whole[:-20]
    finally:
        await data.aclose()
        engine.close()


@pytest.mark.asyncio
async def test_a_torn_write_after_converted_line_endings_is_damage(tmp_path: Path) -> None:
    # CR-only line endings leave one "line" with no newline: not one record cut short
    await _written(tmp_path)
    wal = tmp_path / "wal.log"
    wal.write_bytes(wal.read_bytes().replace(b"\n", b"\r"))
    before = wal.read_bytes()
    with pytest.raises(CorruptDataDirError, match="20 records without a newline") as raised:
        await _reopen(tmp_path)
    assert "20 records are affected" in str(raised.value)  # each of them, not one line's worth
    assert wal.read_bytes() == before


@pytest.mark.asyncio
async def test_a_format_1_data_dir_loads_and_is_rewritten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # written as the 0.x server did: bare-JSON snapshot with no checksum, log with no header
    source, data = await _reopen(tmp_path / "source", fsync="never")
    lease = source.lease_grant(60).id
    for i in range(12):
        source.put(f"k{i}", str(i).encode(), lease if i % 2 else 0)
    state = source.export_state()
    await data.aclose()
    source.close()
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    document = {
        "format": 1,
        "q": 9,
        "revision": 8,
        "compact_revision": 0,
        "last_lease_id": lease,
        "leases": [[lease, 60]],
        "kvs": [kv_out(kv) for kv in state.kvs if kv.mod_revision <= 8],
        "history": [event_out(e) for e in state.history if e.revision <= 8],
    }
    (legacy / "snapshot.json").write_text(json.dumps(document))
    records = [{"c": r, "e": [event_out(state.history[r - 1])], "q": r + 1} for r in range(7, 13)]
    (legacy / "wal.log").write_bytes(b"".join(encode_line(r) for r in records))  # 8-9: covered
    with caplog.at_level(logging.INFO, logger="aioelastic.serve"):
        engine, data = await _reopen(legacy)
    assert f"rewriting data directory {legacy} in format 2" in caplog.text
    assert _comparable(engine.export_state())[:3] == _comparable(state)[:3]
    await data.aclose()
    engine.close()
    assert (legacy / "snapshot.json").read_bytes()[8:9] == b" "  # framed, checksummed
    assert b'"log":2' in (legacy / "wal.log").read_bytes().splitlines()[0]
    again, data = await _reopen(legacy)
    assert _comparable(again.export_state())[:3] == _comparable(state)[:3]
    await data.aclose()
    again.close()


@pytest.mark.asyncio
async def test_serve_refuses_a_damaged_dir_unless_told_to_accept_the_loss(tmp_path: Path) -> None:
    import subprocess
    import sys

    from helpers.http import ROOT, ServerProcess

    await _written(tmp_path)
    _delete_middle_line(tmp_path)
    command = [sys.executable, "-m", "aioelastic", "serve", "--port", "0"]
    done = await asyncio.to_thread(
        subprocess.run,
        [*command, "--data-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "cannot start" in done.stderr
    assert "record 60 is absent" in done.stderr
    assert "11 records are affected" in done.stderr
    server = ServerProcess("--data-dir", str(tmp_path), "--accept-data-loss")
    await asyncio.to_thread(server.start)
    try:
        banner = "".join(server.banner)
        assert "ACCEPTING DATA LOSS" in banner
        assert "ACCEPTED DATA LOSS" in banner
        assert "revision 70" in banner  # moved past every revision on disk
    finally:
        server.kill()


@pytest.mark.asyncio
async def test_a_record_the_log_refuses_leaves_no_trace(tmp_path: Path) -> None:
    import os

    from aioelastic.store.http._persist import LogWriteError

    engine, data = await _reopen(tmp_path, fsync="never")
    lease = engine.lease_grant(60).id
    engine.put("a", b"1", lease)
    log_before = (tmp_path / "wal.log").read_bytes()
    state_before = _comparable(engine.export_state())
    writable, data._fd = data._fd, os.open(tmp_path / "wal.log", os.O_RDONLY)  # writes: EBADF
    try:
        with pytest.raises(LogWriteError) as raised:
            engine.put("b", b"2")
        assert not raised.value.full
        with pytest.raises(LogWriteError):
            engine.lease_revoke(lease)  # its keys' deletion and its end: one record, or neither
        assert _comparable(engine.export_state()) == state_before
        assert engine.lease_time_to_live(lease).keys == ("a",)
    finally:
        os.close(data._fd)
        data._fd = writable
    assert (tmp_path / "wal.log").read_bytes() == log_before
    engine.lease_revoke(lease)
    last = json.loads((tmp_path / "wal.log").read_bytes().splitlines()[-1][9:])
    assert last["c"] == 2  # the deletion of its key and the lease's end are one record
    assert last["x"] == lease
    assert engine.put("c", b"3") == 3  # the revoke was revision 2: nothing was skipped or reused
    await data.aclose()
    engine.close()
    again, data = await _reopen(tmp_path)
    assert again.lease_count == 0
    assert [kv.key for kv in again.range("").kvs] == ["c"]
    assert again.revision == 3
    await data.aclose()
    again.close()


@pytest.mark.asyncio
async def test_accepting_a_loss_that_cannot_be_written_changes_nothing(tmp_path: Path) -> None:
    await _written(tmp_path)
    _delete_middle_line(tmp_path)
    before = _files(tmp_path)
    (tmp_path / "snapshot.json.tmp").mkdir()  # the fresh snapshot cannot be written
    with pytest.raises(IsADirectoryError):
        await _reopen(tmp_path, accept_data_loss=True)
    (tmp_path / "snapshot.json.tmp").rmdir()
    after = _files(tmp_path)
    assert {name: after[name] for name in before} == before  # the damaged files are in place
    with pytest.raises(CorruptDataDirError, match="record 60 is absent"):
        await _reopen(tmp_path)  # refused again: not an empty directory that starts silently


def _set_event_type(record: dict[str, Any]) -> None:
    record["e"][0][0] = "Q"


def _set_unknown_kind(record: dict[str, Any]) -> None:
    del record["c"], record["e"]
    record["z"] = 1


def _set_bad_base64(record: dict[str, Any]) -> None:
    record["e"][0][2] = "NT$="  # "NTQ=" with a character base64 does not have


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (_set_event_type, "unknown event type 'Q'"),
        (_set_unknown_kind, "unknown record ['q', 'z']"),
        (_set_bad_base64, "Only base64 data is allowed"),
    ],
    ids=["event type", "record kind", "base64"],
)
@pytest.mark.asyncio
async def test_a_record_with_a_good_checksum_that_cannot_be_replayed_is_damage(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], why: str
) -> None:
    """A line whose checksum holds but whose record cannot be applied (written by another
    version, or edited by hand and re-summed) is refused like any damage, named with why."""
    await _written(tmp_path)
    lines = _log_lines(tmp_path)
    record = decode_line(lines[5][:-1])  # record 55
    assert isinstance(record, dict)
    edit(record)
    lines[5] = encode_line(record)
    _write_log(tmp_path, lines)
    offset = sum(len(line) for line in lines[:5])
    with pytest.raises(CorruptDataDirError) as raised:
        await _reopen(tmp_path)
    message = str(raised.value)
    assert (
        f"wal.log has 1 damaged line: line 6 (byte {offset}): record 55 cannot be replayed ({why}"
        in message
    ), message
    assert "the last consistent state is record 54 " in message, message


@pytest.mark.asyncio
async def test_leases_replay_with_their_own_ids_and_a_keyless_lease_ends_as_logged(
    tmp_path: Path,
) -> None:
    engine, data = await _reopen(tmp_path)
    chosen = engine.lease_grant(30, lease_id=0x7F00).id  # an id the granter chose
    keyless = engine.lease_grant(30).id  # the next one; ended with no keys: a record of its own
    kept = engine.lease_grant(30).id
    engine.put("k", b"v", kept)
    engine.lease_revoke(keyless)
    await data.wait_durable()
    await data.aclose()
    engine.close()
    async with _opened(tmp_path) as restored:
        assert [s.id for s in restored.leases()] == [chosen, kept]
        assert restored.lease_time_to_live(kept).keys == ("k",)
        assert restored.lease_grant(5).id == kept + 1


@pytest.mark.parametrize("named_by", ["grant", "end"])
@pytest.mark.asyncio
async def test_accepting_a_loss_hands_out_no_lease_id_an_unusable_record_named(
    tmp_path: Path, named_by: str
) -> None:
    """After a loss is accepted, the next lease id is past every id the log names, in a lease's
    grant or in its end, even where the record could not be applied."""
    engine, data = await _reopen(tmp_path)
    engine.put("a", b"1")  # line 1
    if named_by == "grant":  # 500 only in its (intact) grant; line 1 damaged below
        engine.lease_grant(30, lease_id=100)
        engine.lease_grant(30, lease_id=500)
        engine.lease_revoke(100)
        damaged = 1
    else:  # 500 only in its end: its grant's line is damaged
        engine.lease_grant(30, lease_id=500)
        engine.lease_revoke(500)
        damaged = 2
    engine.put("b", b"2")
    await data.wait_durable()
    await data.aclose()
    engine.close()
    lines = _log_lines(tmp_path)
    lines[damaged] = lines[damaged].replace(b"}", b" }", 1)  # its checksum fails
    _write_log(tmp_path, lines)
    async with _opened(tmp_path, accept_data_loss=True) as engine:
        assert engine.lease_grant(5).id > 500


def _five_damaged_lines(path: Path) -> None:
    lines = _log_lines(path)
    for index in (3, 4, 5, 9, 12):  # records 53-55, 59, 62
        lines[index] = lines[index].replace(b"}", b" }", 1)
    _write_log(path, lines)


def _three_missing_records(path: Path) -> None:
    lines = _log_lines(path)
    del lines[8:11]  # records 58-60
    _write_log(path, lines)


def _three_damaged_lines(path: Path) -> None:
    lines = _log_lines(path)
    for index in (3, 4, 5):
        lines[index] = lines[index].replace(b"}", b" }", 1)
    _write_log(path, lines)


def _four_damaged_lines(path: Path) -> None:
    lines = _log_lines(path)
    for index in (3, 4, 5, 6):
        lines[index] = lines[index].replace(b"}", b" }", 1)
    _write_log(path, lines)


def _next_to_last_record_missing(path: Path) -> None:
    lines = _log_lines(path)
    del lines[-2]  # record 69
    _write_log(path, lines)


def _damaged_snapshot_and_no_log(path: Path) -> None:
    _edit_snapshot_value(path)
    _delete_log(path)


def _unknown_log_header(path: Path) -> None:
    lines = _log_lines(path)
    lines[0] = encode_line({"log": 3, "after": 50})
    _write_log(path, lines)


def _format_1_snapshot_cut_short(path: Path) -> None:
    (path / "snapshot.json").write_bytes(b'{"format": 1, "revision": 5')


def _snapshot_of_an_unknown_format(path: Path) -> None:
    (path / "snapshot.json").write_bytes(encode_line({"format": 9}))


def _two_records_without_newline(path: Path) -> None:
    lines = _log_lines(path)
    _write_log(path, [*lines[:-2], lines[-2][:-1] + lines[-1][:-1]])


def _a_last_record_ending_in_cr(path: Path) -> None:
    lines = _log_lines(path)
    _write_log(path, [*lines[:-1], lines[-1][:-1] + b"\r"])


def _snapshot_deleted_and_only_the_log_header_left(path: Path) -> None:
    _delete_snapshot(path)
    _write_log(path, _log_lines(path)[:1])


def _a_byte_appended_to_a_line(path: Path) -> None:
    lines = _log_lines(path)
    lines[-1] = lines[-1][:-1] + b"x\n"  # what is left without it is a good line: not a CR
    _write_log(path, lines)


def _one_crlf_line_and_one_bad_checksum(path: Path) -> None:
    lines = _log_lines(path)
    lines[3] = lines[3][:-1] + b"\r\n"
    lines[5] = lines[5].replace(b"}", b" }", 1)
    _write_log(path, lines)


def _resummed(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    """Record 55 edited and given a good checksum again (another version wrote it, or a hand)."""

    def damage(path: Path) -> None:
        lines = _log_lines(path)
        record = decode_line(lines[5][:-1])
        assert isinstance(record, dict)
        edit(record)
        lines[5] = encode_line(record)
        _write_log(path, lines)

    damage.__name__ = f"_resummed{edit.__name__}"
    return damage


def _drop_sequence(record: dict[str, Any]) -> None:
    del record["q"]


_RESUMMED = {edit: _resummed(edit) for edit in (_set_event_type, _drop_sequence)}


# The whole report of each kind of damage, between "data directory '...' is damaged: " and what
# to do about it: what an operator reads first, so every word of it is pinned here.
_WHOLE_REPORTS: dict[Callable[[Path], None], str] = {
    _delete_snapshot: (
        "snapshot.json is missing: it held records 1-50 (so says wal.log's header); wal.log "
        "breaks off after record 0 (its snapshot is missing or damaged), 20 intact records "
        "after the break cannot be applied. 70 records are affected; the last consistent "
        "state is record 0 (revision 0)."
    ),
    _edit_snapshot_value: (
        "snapshot.json is damaged (bad checksum): it held records 1-50 (so says wal.log's "
        "header); wal.log breaks off after record 0 (its snapshot is missing or damaged), 20 "
        "intact records after the break cannot be applied. 70 records are affected; the last "
        "consistent state is record 0 (revision 0)."
    ),
    _truncate_snapshot: (
        "snapshot.json is damaged (cut short (no final newline)): it held records 1-50 (so "
        "says wal.log's header); wal.log breaks off after record 0 (its snapshot is missing "
        "or damaged), 20 intact records after the break cannot be applied. 70 records are "
        "affected; the last consistent state is record 0 (revision 0)."
    ),
    _delete_middle_line: (
        "wal.log breaks off after record 59 (line 11: record 61 where 60 should follow), "
        "record 60 is absent or unreadable, 10 intact records after the break cannot be "
        "applied. 11 records are affected; the last consistent state is record 59 (revision "
        "59)."
    ),
    _reorder_lines: (
        "wal.log breaks off after record 54 (line 6: record 56 where 55 should follow), "
        "records are out of order or repeated, 16 intact records after the break cannot be "
        "applied. 16 records are affected; the last consistent state is record 54 (revision "
        "54)."
    ),
    _convert_to_crlf: (
        "wal.log's header line: CRLF line ending (the line endings were converted); wal.log "
        "has 20 damaged lines: lines 2-21: CRLF line ending (the line endings were "
        "converted). 20 records are affected; the last consistent state is record 50 "
        "(revision 50)."
    ),
    _bad_checksum_on_last_line: (
        "wal.log has 1 damaged line: line 21 (byte 1194): bad checksum. 1 record is affected; "
        "the last consistent state is record 69 (revision 69)."
    ),
    _several_damaged_lines: (
        "wal.log has 2 damaged lines: line 6 (byte 294): bad checksum; line 16 (byte 894): "
        "bad checksum; wal.log breaks off after record 54 (line 6: bad checksum), records 55, "
        "65 are absent or unreadable, 14 intact records after the break cannot be applied. 16 "
        "records are affected; the last consistent state is record 54 (revision 54)."
    ),
    _delete_log: (
        "wal.log is missing: the records written after the snapshot (record 50, revision 50) "
        "are gone. An unknown number of records are affected; the last consistent state is "
        "record 50 (revision 50)."
    ),
    _empty_log: (
        "wal.log is empty: its header and every record after 50. An unknown number of records "
        "are affected; the last consistent state is record 50 (revision 50)."
    ),
    _five_damaged_lines: (
        "wal.log has 5 damaged lines: line 4 (byte 174): bad checksum; line 5 (byte 235): bad "
        "checksum; line 6 (byte 296): bad checksum; and 2 more; wal.log breaks off after "
        "record 52 (line 4: bad checksum), records 53-55, 59, 62 are absent or unreadable, 13 "
        "intact records after the break cannot be applied. 18 records are affected; the last "
        "consistent state is record 52 (revision 52)."
    ),
    _three_missing_records: (
        "wal.log breaks off after record 57 (line 9: record 61 where 58 should follow), "
        "records 58-60 are absent or unreadable, 10 intact records after the break cannot be "
        "applied. 13 records are affected; the last consistent state is record 57 (revision "
        "57)."
    ),
    _three_damaged_lines: (
        "wal.log has 3 damaged lines: line 4 (byte 174): bad checksum; line 5 (byte 235): bad "
        "checksum; line 6 (byte 296): bad checksum; wal.log breaks off after record 52 (line "
        "4: bad checksum), records 53-55 are absent or unreadable, 15 intact records after "
        "the break cannot be applied. 18 records are affected; the last consistent state is "
        "record 52 (revision 52)."
    ),
    _four_damaged_lines: (
        "wal.log has 4 damaged lines: line 4 (byte 174): bad checksum; line 5 (byte 235): bad "
        "checksum; line 6 (byte 296): bad checksum; and 1 more; wal.log breaks off after "
        "record 52 (line 4: bad checksum), records 53-56 are absent or unreadable, 14 intact "
        "records after the break cannot be applied. 18 records are affected; the last "
        "consistent state is record 52 (revision 52)."
    ),
    _next_to_last_record_missing: (
        "wal.log breaks off after record 68 (line 20: record 70 where 69 should follow), "
        "record 69 is absent or unreadable, 1 intact record after the break cannot be "
        "applied. 2 records are affected; the last consistent state is record 68 (revision "
        "68)."
    ),
    _damaged_snapshot_and_no_log: (
        "snapshot.json is damaged (bad checksum); wal.log is missing: the records written "
        "after the snapshot (record 0, revision 0) are gone. An unknown number of records are "
        "affected; the last consistent state is record 0 (revision 0)."
    ),
    _unknown_log_header: (
        "wal.log has an unknown header {'log': 3, 'after': 50}. An unknown number of records "
        "are affected; the last consistent state is record 70 (revision 70)."
    ),
    _format_1_snapshot_cut_short: (
        "snapshot.json is damaged (not valid JSON (cut short?)): it held records 1-50 (so "
        "says wal.log's header); wal.log breaks off after record 0 (its snapshot is missing "
        "or damaged), 20 intact records after the break cannot be applied. 70 records are "
        "affected; the last consistent state is record 0 (revision 0)."
    ),
    _snapshot_of_an_unknown_format: (
        "snapshot.json is damaged (unknown format 9): it held records 1-50 (so says wal.log's "
        "header); wal.log breaks off after record 0 (its snapshot is missing or damaged), 20 "
        "intact records after the break cannot be applied. 70 records are affected; the last "
        "consistent state is record 0 (revision 0)."
    ),
    _two_records_without_newline: (
        "wal.log has 1 damaged line: line 20 (byte 1134): 2 records without a newline. 2 "
        "records are affected; the last consistent state is record 68 (revision 68)."
    ),
    _a_last_record_ending_in_cr: (
        "wal.log has 1 damaged line: line 21 (byte 1194): a last line ending in CR, not LF. 1 "
        "record is affected; the last consistent state is record 69 (revision 69)."
    ),
    _RESUMMED[_set_event_type]: (
        "wal.log has 1 damaged line: line 6 (byte 294): record 55 cannot be replayed (unknown "
        "event type 'Q'); wal.log breaks off after record 54 (line 6: record 55 cannot be "
        "replayed (unknown event type 'Q')), record 55 is absent or unreadable, 15 intact "
        "records after the break cannot be applied. 16 records are affected; the last "
        "consistent state is record 54 (revision 54)."
    ),
    _RESUMMED[_drop_sequence]: (
        "wal.log has 1 damaged line: line 6 (byte 294): not a record; wal.log breaks off "
        "after record 54 (line 6: not a record), record 55 is absent or unreadable, 15 intact "
        "records after the break cannot be applied. 16 records are affected; the last "
        "consistent state is record 54 (revision 54)."
    ),
    _snapshot_deleted_and_only_the_log_header_left: (
        "snapshot.json is missing: it held records 1-50 (so says wal.log's header). 50 "
        "records are affected; the last consistent state is record 0 (revision 0)."
    ),
    _a_byte_appended_to_a_line: (
        "wal.log has 1 damaged line: line 21 (byte 1194): bad checksum. 1 record is affected; "
        "the last consistent state is record 69 (revision 69)."
    ),
    _one_crlf_line_and_one_bad_checksum: (
        "wal.log has 2 damaged lines: line 4 (byte 174): CRLF line ending (the line endings "
        "were converted); line 6 (byte 295): bad checksum; wal.log breaks off after record 52 "
        "(line 4: CRLF line ending (the line endings were converted)), records 53, 55 are "
        "absent or unreadable, 16 intact records after the break cannot be applied. 18 "
        "records are affected; the last consistent state is record 52 (revision 52)."
    ),
}

_ADVICE = (
    " Nothing on disk was changed. Restore the damaged files from a copy, or start with"
    " accept_data_loss (serve --accept-data-loss) to go on from that state, the damaged files"
    " kept aside."
)


@pytest.mark.parametrize("damage", list(_WHOLE_REPORTS), ids=lambda f: f.__name__)
@pytest.mark.asyncio
async def test_the_whole_damage_report_says_what_where_and_how_many(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    await _written(tmp_path)
    damage(tmp_path)
    with pytest.raises(CorruptDataDirError) as raised:
        await _reopen(tmp_path)
    assert str(raised.value) == (
        f"data directory {str(tmp_path)!r} is damaged: {_WHOLE_REPORTS[damage]}{_ADVICE}"
    )


def test_what_is_kept_aside_is_named_by_its_utc_time_and_never_overwrites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aioelastic.store.http import _persist_files

    moment = time.struct_time((2026, 12, 3, 7, 5, 30, 3, 337, 0))
    monkeypatch.setattr(time, "gmtime", lambda: moment)  # (the module reads time.gmtime)
    first = _persist_files.write_aside(tmp_path, "wal.log", "damaged", b"one")
    second = _persist_files.write_aside(tmp_path, "wal.log", "damaged", b"two")
    assert (first.name, second.name) == (
        "wal.log.damaged-20261203T070530Z",
        "wal.log.damaged-20261203T070530Z.1",
    )
    assert (first.read_bytes(), second.read_bytes()) == (b"one", b"two")
    for n in range(2, 1000):
        (tmp_path / f"wal.log.damaged-20261203T070530Z.{n}").touch()
    with pytest.raises(RuntimeError, match=r"^too many wal\.log\.damaged-\* files in "):
        _persist_files.write_aside(tmp_path, "wal.log", "damaged", b"three")


def test_the_data_dirs_files_are_private_and_kept_aside_by_copy_where_links_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aioelastic.store.http import _persist_files

    _persist_files.replace_file(tmp_path, "snapshot.json", b"state")
    assert (tmp_path / "snapshot.json").stat().st_mode & 0o777 == 0o600  # values are secrets
    assert not (tmp_path / "snapshot.json.tmp").exists()
    (tmp_path / "wal.log").write_bytes(b"records")

    def no_hard_links(source: object, target: object) -> None:
        raise OSError(errno.EPERM, "no hard links on this file system")

    monkeypatch.setattr(os, "link", no_hard_links)
    aside = _persist_files.keep_aside(tmp_path, "wal.log", "damaged")
    assert aside.parent == tmp_path
    assert aside.name.startswith("wal.log.damaged-")
    assert aside.read_bytes() == b"records"
    assert aside.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "wal.log").read_bytes() == b"records"  # the original stays


@pytest.mark.asyncio
async def test_accepting_a_loss_of_everything_but_the_log_header_reuses_no_revision_or_lease(
    tmp_path: Path,
) -> None:
    """The snapshot and every record gone, the log's header alone says how far revisions and
    lease ids went: after the loss is accepted, neither is handed out again."""
    engine, data = await _reopen(tmp_path, snapshot_every=50)
    engine.lease_grant(30, lease_id=500)
    for i in range(60):
        engine.put(f"k{i}", b"x")  # the snapshot after record 50 (revision 49, lease 500)
    await data.wait_durable()
    await data.aclose()
    engine.close()
    header = _log_lines(tmp_path)[0]
    assert decode_line(header[:-1]) == {"log": 2, "after": 50, "revision": 49, "lease": 500}
    _delete_snapshot(tmp_path)
    _write_log(tmp_path, [header])
    async with _opened(tmp_path, accept_data_loss=True) as engine:
        assert engine.put("new", b"x") > 49
        assert engine.lease_grant(5).id > 500


@pytest.mark.asyncio
async def test_loading_says_how_many_records_it_replayed_after_the_snapshot(tmp_path: Path) -> None:
    await _written(tmp_path)
    found = load(tmp_path, MemoryEngine())
    assert (found.sequence, found.records, found.damage, found.legacy) == (70, 20, [], False)
    assert (found.affected, found.torn_at, found.log_exists) == (0, None, True)


@pytest.mark.asyncio
async def test_accepting_the_loss_of_a_line_of_several_records_reuses_none_of_their_revisions(
    tmp_path: Path,
) -> None:
    await _written(tmp_path)
    _two_records_without_newline(tmp_path)  # records 69 and 70 (revisions 69, 70) on one line
    async with _opened(tmp_path, accept_data_loss=True) as engine:
        assert engine.get("k68") is None  # the state of record 68 (keys k0..k67), and
        assert engine.put("new", b"x") > 70  # revisions 69 and 70 may have been acknowledged


@pytest.mark.asyncio
async def test_a_log_header_without_high_water_marks_loads(tmp_path: Path) -> None:
    """A header of only the format and the snapshot it follows (as the first format-2 servers
    wrote it) is not damage: the marks default to nothing beyond what the records say."""
    await _written(tmp_path)
    lines = _log_lines(tmp_path)
    lines[0] = encode_line({"log": 2, "after": 50})
    _write_log(tmp_path, lines)
    async with _opened(tmp_path) as engine:
        assert (engine.revision, len(engine)) == (70, 70)
        assert engine.put("new", b"x") == 71


@pytest.mark.asyncio
async def test_a_snapshot_older_than_the_one_the_log_follows_is_damage(tmp_path: Path) -> None:
    engine, data = await _reopen(tmp_path, snapshot_every=20)
    for i in range(30):
        engine.put(f"k{i}", b"x")  # a snapshot after record 20
    old = (tmp_path / "snapshot.json").read_bytes()
    for i in range(30, 45):
        engine.put(f"k{i}", b"x")  # and after 40: the log now follows that one
    await data.wait_durable()
    await data.aclose()
    engine.close()
    (tmp_path / "snapshot.json").write_bytes(old)  # a backup's older snapshot put back
    with pytest.raises(CorruptDataDirError) as raised:
        await _reopen(tmp_path)
    assert (
        "snapshot.json holds records up to 20 only, but wal.log follows a snapshot of records "
        "up to 40"
    ) in str(raised.value)


@pytest.mark.asyncio
async def test_a_new_data_dir_whose_log_is_empty_opens(tmp_path: Path) -> None:
    """A crash between creating the log and writing its header leaves an empty log and no
    snapshot: nothing was ever acknowledged, so that is no damage."""
    (tmp_path / "wal.log").write_bytes(b"")
    async with _opened(tmp_path) as engine:
        assert engine.put("k", b"v") == 1


def _format_1_snapshot(path: Path) -> None:
    """A format 1 snapshot (bare JSON, no checksum) of one key ``k`` at revision 2."""
    document = {
        "format": 1,
        "q": 3,
        "revision": 2,
        "compact_revision": 0,
        "last_lease_id": 0,
        "leases": [],
        "kvs": [kv_out(KeyValue("k", b"v", 2, 2, 1, 0))],
        "history": [],
    }
    (path / "snapshot.json").write_text(json.dumps(document))


@pytest.mark.asyncio
async def test_a_format_1_snapshot_beside_an_empty_log_loads(tmp_path: Path) -> None:
    """A format 1 log has no header, so an empty one beside a format 1 snapshot is a log with
    no records since the snapshot (as the 0.x server left it after a snapshot), not damage."""
    _format_1_snapshot(tmp_path)
    (tmp_path / "wal.log").write_bytes(b"")
    async with _opened(tmp_path) as engine:
        assert engine.get("k") == KeyValue("k", b"v", 2, 2, 1, 0)
        assert engine.put("n", b"x") == 3
    assert (tmp_path / "snapshot.json").read_bytes()[8:9] == b" "  # rewritten in format 2


@pytest.mark.asyncio
async def test_a_damaged_format_1_snapshot_leaves_the_count_unknown(tmp_path: Path) -> None:
    """Beside a format 1 log (no header to say what the snapshot held), a damaged snapshot's
    loss cannot be counted, and the report says so rather than give the log's count."""
    (tmp_path / "snapshot.json").write_bytes(b'{"format": 1, "q": 9, "revision"')
    records = [{"c": r, "e": [["P", f"k{r}", "eA==", r, r, 1, 0]], "q": r + 1} for r in (9, 10)]
    (tmp_path / "wal.log").write_bytes(b"".join(encode_line(r) for r in records))
    with pytest.raises(CorruptDataDirError) as raised:
        await _reopen(tmp_path)
    assert "An unknown number of records (at least 11) are affected;" in str(raised.value)


@pytest.mark.asyncio
async def test_a_header_without_marks_adds_nothing_to_an_accepted_loss(tmp_path: Path) -> None:
    """A header without high-water marks and one damaged line, nothing else: the line may have
    taken revision 1 and lease id 1, so the server goes on from 2, no further."""
    damaged = encode_line({"c": 1, "e": [["P", "k", "eA==", 1, 1, 1, 0]], "q": 1})
    damaged = damaged.replace(b"}", b" }", 1)
    (tmp_path / "wal.log").write_bytes(encode_line({"log": 2, "after": 0}) + damaged)
    async with _opened(tmp_path, accept_data_loss=True) as engine:
        assert engine.put("k", b"v") == 2
        assert engine.lease_grant(5).id == 2


@pytest.mark.asyncio
async def test_a_format_1_snapshot_whose_log_is_lost_is_not_said_rewritten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rewriting "in format 2" is said for an intact format 1 directory; one whose log is
    missing is damage, and when the loss is accepted, the loss is what is said."""
    _format_1_snapshot(tmp_path)
    with caplog.at_level(logging.INFO, logger="aioelastic.serve"):
        async with _opened(tmp_path, accept_data_loss=True) as engine:
            assert engine.get("k") == KeyValue("k", b"v", 2, 2, 1, 0)
    assert "rewriting data directory" not in caplog.text
