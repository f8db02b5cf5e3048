"""The data directory when its disk fails (``_persist.DataDir``), in process: the log's writes
and fsyncs fail as a full or failing disk makes them (the module's ``os`` calls replaced by ones
that fail on cue). A refused write is not made and leaves no part of it; short writes are
completed; a record cut short is cut off, or, when it cannot be, every later write is refused;
an fsync failure refuses every write after it; a snapshot that fails leaves no temporary file
and is tried again a full interval later; closing fsyncs and releases the directory. Nothing
acknowledged is lost: each test reloads the directory."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
import types
from pathlib import Path
from typing import Any

import pytest
from helpers.waiting import eventually

from aioelastic.errors import LeaseNotFoundError, WriteOutcomeUnknownError
from aioelastic.store import MemoryEngine, open_store
from aioelastic.store.http import _persist
from aioelastic.store.http._persist import CorruptDataDirError, DataDir, LogWriteError
from aioelastic.store.http._persist_codec import SNAPSHOT, WAL
from aioelastic.store.http._persist_files import replace_file
from aioelastic.store.http.server import HttpStoreServer


class Disk:
    """``_persist``'s ``os``, with ``write``, ``ftruncate`` and ``fsync`` failing on cue."""

    def __init__(self) -> None:
        self.write_error: int | None = None  # errno of the next writes
        self.write_at_most: int | None = None  # bytes per write call (short writes)
        self.fail_after: int | None = None  # bytes a write takes before failing
        self.truncate_error: int | None = None
        self.fsync_error: int | None = None
        self.fsync_delay = 0.0  # seconds each fsync takes (in the flusher's thread)
        self.fstat_error: int | None = None
        self.fsyncs = 0
        self.fsyncing = False  # an fsync is running (in the flusher's thread)

    def module(self) -> types.SimpleNamespace:
        fake = types.SimpleNamespace(
            **{n: getattr(os, n) for n in dir(os) if not n.startswith("__")}
        )
        fake.write, fake.ftruncate, fake.fsync = self.write, self.ftruncate, self.fsync
        fake.fstat = self.fstat
        return fake

    def write(self, fd: int, data: Any) -> int:
        if self.fail_after is not None:
            taken = os.write(fd, bytes(data[: self.fail_after]))
            self.fail_after = None
            self.write_error = errno.ENOSPC
            return taken
        if self.write_error is not None:
            raise OSError(self.write_error, os.strerror(self.write_error))
        if self.write_at_most is not None:
            data = data[: self.write_at_most]
        return os.write(fd, data)

    def ftruncate(self, fd: int, size: int) -> None:
        if self.truncate_error is not None:
            raise OSError(self.truncate_error, os.strerror(self.truncate_error))
        os.ftruncate(fd, size)

    def fstat(self, fd: int) -> os.stat_result:
        if self.fstat_error is not None:
            raise OSError(self.fstat_error, os.strerror(self.fstat_error))
        return os.fstat(fd)

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        self.fsyncing = True
        time.sleep(self.fsync_delay)
        self.fsyncing = False
        if self.fsync_error is not None:
            raise OSError(self.fsync_error, os.strerror(self.fsync_error))
        os.fsync(fd)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    failing = Disk()
    monkeypatch.setattr(_persist, "os", failing.module())
    return failing


async def _open(path: Path, **kwargs: Any) -> tuple[MemoryEngine, DataDir]:
    engine = MemoryEngine()
    data = DataDir(path, **kwargs)
    data.open(engine)
    return engine, data


async def _close(engine: MemoryEngine, data: DataDir) -> None:
    await data.aclose()
    engine.close()


async def _reloaded(path: Path) -> dict[str, bytes]:
    """The keys and values the directory holds, loaded afresh (damage would raise)."""
    engine, data = await _open(path)
    try:
        return {kv.key: kv.value for kv in engine.range("", None).kvs}
    finally:
        await data.aclose()
        engine.close()


@pytest.mark.asyncio
async def test_a_full_disk_refuses_the_write_whole_and_says_so_once(
    tmp_path: Path, disk: Disk, caplog: pytest.LogCaptureFixture
) -> None:
    engine, data = await _open(tmp_path, fsync="never")
    engine.put("a", b"1")
    disk.write_error = errno.ENOSPC
    caplog.set_level(logging.WARNING, logger="aioelastic.serve")
    for value in (b"2", b"3"):
        with pytest.raises(LogWriteError) as refused:
            engine.put("a", value)
        assert refused.value.errno == errno.ENOSPC
        assert refused.value.full
        wal = str(tmp_path / "wal.log")
        assert str(refused.value) == (
            f"[Errno {errno.ENOSPC}] the log {wal!r} cannot be written: {os.strerror(errno.ENOSPC)}"
        )
    assert engine.get("a").value == b"1"  # type: ignore[union-attr]  # not made
    said = [r.getMessage() for r in caplog.records]
    assert sum("refusing writes until it can" in m for m in said) == 1
    disk.write_error = None
    engine.put("b", b"4")
    engine.put("c", b"5")
    said = [r.getMessage() for r in caplog.records]
    assert sum("can be written again" in m for m in said) == 1
    assert data.last_sequence == 3
    await _close(engine, data)
    assert await _reloaded(tmp_path) == {"a": b"1", "b": b"4", "c": b"5"}


@pytest.mark.asyncio
async def test_short_writes_are_completed(tmp_path: Path, disk: Disk) -> None:
    engine, data = await _open(tmp_path, fsync="never")
    disk.write_at_most = 7
    for i in range(5):
        engine.put(f"k{i}", b"value %d" % i)
    await _close(engine, data)
    assert await _reloaded(tmp_path) == {f"k{i}": b"value %d" % i for i in range(5)}


@pytest.mark.asyncio
async def test_a_record_cut_short_is_cut_off_and_the_log_goes_on(
    tmp_path: Path, disk: Disk
) -> None:
    engine, data = await _open(tmp_path, fsync="never")
    for i in range(3):
        engine.put(f"k{i}", b"kept")
    size = (tmp_path / "wal.log").stat().st_size
    disk.fail_after = 5  # five bytes of the record, then the disk is full
    with pytest.raises(LogWriteError):
        engine.put("lost", b"never acknowledged")
    assert (tmp_path / "wal.log").stat().st_size == size
    disk.write_error = None
    engine.put("k3", b"kept")
    await _close(engine, data)
    assert await _reloaded(tmp_path) == {f"k{i}": b"kept" for i in range(4)}


@pytest.mark.asyncio
async def test_a_partial_record_that_cannot_be_cut_off_refuses_every_later_write(
    tmp_path: Path, disk: Disk
) -> None:
    engine, data = await _open(tmp_path, fsync="never")
    engine.put("a", b"1")
    disk.fail_after = 5
    disk.truncate_error = errno.EIO
    with pytest.raises(LogWriteError):
        engine.put("b", b"2")
    disk.write_error = disk.truncate_error = None  # the disk is back: the log is still torn
    wal = str(tmp_path / "wal.log")
    with pytest.raises(LogWriteError) as refused:
        engine.put("c", b"3")
    assert refused.value.errno == errno.ENOSPC
    assert str(refused.value) == (
        f"[Errno {errno.ENOSPC}] the log {wal!r} ends in a partial record that cannot be cut off "
        f"([Errno {errno.EIO}] {os.strerror(errno.EIO)}): writes are refused until the server "
        "restarts"
    )
    assert engine.get("c") is None
    await _close(engine, data)


@pytest.mark.asyncio
async def test_an_fsync_that_fails_fails_its_waiters_and_refuses_every_write_after(
    tmp_path: Path, disk: Disk
) -> None:
    engine, data = await _open(tmp_path, fsync="always")
    engine.put("a", b"1")
    await data.wait_durable()
    disk.fsync_error = errno.EIO
    engine.put("b", b"2")
    waiters = [asyncio.ensure_future(data.wait_durable()) for _ in range(3)]
    done = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 10)
    for error in done:
        assert isinstance(error, OSError)
        assert error.errno == errno.EIO
    with pytest.raises(OSError, match="Input/output error"):
        await data.wait_durable()
    with pytest.raises(LogWriteError) as refused:
        engine.put("c", b"3")
    assert refused.value.errno == errno.EIO
    assert str(refused.value) == (
        f"[Errno {errno.EIO}] an fsync of the log failed ([Errno {errno.EIO}] "
        f"{os.strerror(errno.EIO)}): writes are refused until the server restarts"
    )
    disk.fsync_error = None
    await _close(engine, data)


@pytest.mark.asyncio
async def test_the_interval_policy_fsyncs_only_what_was_written(tmp_path: Path, disk: Disk) -> None:
    """Each interval: an fsync when something was written since the last, none otherwise; and
    a write is durable at once for the waiter (the policy promises no more)."""
    engine, data = await _open(tmp_path, fsync="interval", fsync_interval=0.02)
    await asyncio.sleep(0.2)
    assert disk.fsyncs == 0  # nothing written: nothing synced
    engine.put("a", b"1")
    await asyncio.wait_for(data.wait_durable(), 1)  # at once: not waiting for the flush
    await eventually(lambda: data._synced == data.last_sequence, 10, "the interval's fsync")
    assert "aioelastic-wal-flusher" in {task.get_name() for task in asyncio.all_tasks()}
    synced = disk.fsyncs
    assert synced >= 1
    await asyncio.sleep(0.2)
    assert disk.fsyncs == synced
    engine.put("b", b"2")
    await eventually(lambda: disk.fsyncs > synced, 10, "the next interval's fsync")
    await _close(engine, data)


@pytest.mark.parametrize("failing", [SNAPSHOT, WAL], ids=["snapshot", "new-log"])
@pytest.mark.asyncio
async def test_a_failed_snapshot_leaves_no_temporary_file_and_waits_a_full_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """The snapshot's file, or the new log after it (the snapshot's temporary file renamed
    already), cannot be written: the write that was due it stands, no temporary file is left,
    and the next snapshot is a full interval later."""
    engine, data = await _open(tmp_path, fsync="never", snapshot_every=3)
    broken = [True]

    def replace(path: Path, name: str, content: bytes) -> None:
        if broken[0] and name == failing:
            (path / (name + ".tmp")).write_bytes(content[:3])  # (as a full disk leaves it)
            raise OSError(errno.ENOSPC, "no space for the snapshot")
        replace_file(path, name, content)

    monkeypatch.setattr(_persist, "replace_file", replace)
    for i in range(3):
        engine.put(f"k{i}", b"v")  # the third is due a snapshot: it fails, the write stands
    assert [name for name in os.listdir(tmp_path) if name.endswith(".tmp")] == []
    assert data.snapshots == 0
    broken[0] = False
    engine.put("k3", b"v")
    engine.put("k4", b"v")
    assert data.snapshots == 0  # the interval starts again after the failure
    engine.put("k5", b"v")
    assert data.snapshots == 1
    await _close(engine, data)
    assert await _reloaded(tmp_path) == {f"k{i}": b"v" for i in range(6)}


@pytest.mark.asyncio
async def test_a_snapshot_that_fails_before_writing_anything_fails_no_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, data = await _open(tmp_path, fsync="never", snapshot_every=1)

    def refuse(path: Path, name: str, content: bytes) -> None:
        raise OSError(errno.EACCES, "not allowed")  # (no temporary file made)

    monkeypatch.setattr(_persist, "replace_file", refuse)
    engine.put("a", b"1")  # acknowledged: the record is in the log
    monkeypatch.undo()
    await _close(engine, data)
    assert await _reloaded(tmp_path) == {"a": b"1"}


@pytest.mark.asyncio
async def test_a_compaction_due_a_snapshot_waits_for_the_next_record(tmp_path: Path) -> None:
    """The compaction is logged before the engine makes it: a snapshot then would miss it."""
    engine, data = await _open(tmp_path, fsync="never", snapshot_every=2)
    engine.put("a", b"1")
    engine.put("a", b"2")  # a snapshot here (2 records)
    assert data.snapshots == 1
    engine.put("a", b"3")
    engine.compact(3)  # the second record since: due, but not taken
    assert data.snapshots == 1
    engine.put("a", b"4")
    assert data.snapshots == 2
    await _close(engine, data)


@pytest.mark.asyncio
async def test_closing_fsyncs_releases_the_directory_and_fails_no_waiter(
    tmp_path: Path, disk: Disk
) -> None:
    engine, data = await _open(tmp_path, fsync="never")
    engine.put("a", b"1")
    before = disk.fsyncs
    await data.aclose()
    assert disk.fsyncs == before + 1
    assert data._fd == -1
    assert data._lock_fd == -1
    engine.put("b", b"2")  # no longer logged (the hooks are gone)
    await data.aclose()  # twice: nothing more
    assert disk.fsyncs == before + 1
    engine.close()
    assert await _reloaded(tmp_path) == {"a": b"1"}


@pytest.mark.asyncio
async def test_a_data_dir_whose_parents_do_not_exist_yet_is_made(tmp_path: Path) -> None:
    nested = tmp_path / "not" / "yet"
    engine, data = await _open(nested, fsync="never")
    engine.put("a", b"1")
    await _close(engine, data)
    assert await _reloaded(nested) == {"a": b"1"}


@pytest.mark.asyncio
async def test_the_options_defaults_and_their_refusals(tmp_path: Path) -> None:
    data = DataDir(tmp_path)
    assert (data.fsync, data.fsync_interval, data.snapshot_every) == ("always", 0.05, 10_000)
    assert data.accept_data_loss is False
    await data.aclose()  # never opened: closes nothing
    with pytest.raises(
        ValueError, match=r"^fsync must be one of always, interval, never, got 'x'$"
    ):
        DataDir(tmp_path, fsync="x")  # type: ignore[arg-type]
    for interval in (0, -1.0):
        with pytest.raises(
            ValueError, match=rf"^fsync_interval must be > 0 seconds, got {interval}$"
        ):
            DataDir(tmp_path, fsync_interval=interval)
    with pytest.raises(ValueError, match=r"^snapshot_every must be >= 1, got 0$"):
        DataDir(tmp_path, snapshot_every=0)
    assert DataDir(tmp_path, fsync_interval=0.001, snapshot_every=1).snapshot_every == 1


@pytest.mark.asyncio
async def test_a_damaged_directory_refused_at_open_leaves_no_descriptor_and_no_lock(
    tmp_path: Path,
) -> None:
    engine, data = await _open(tmp_path, fsync="never")
    for i in range(3):
        engine.put(f"k{i}", b"v")
    await _close(engine, data)
    lines = (tmp_path / WAL).read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b"k0", b"kX")  # a checksum that no longer matches, mid-log
    (tmp_path / WAL).write_bytes(b"".join(lines))
    before = sorted(os.listdir("/proc/self/fd"))
    refused = DataDir(tmp_path)
    with pytest.raises(CorruptDataDirError):
        refused.open(MemoryEngine())
    assert sorted(os.listdir("/proc/self/fd")) == before
    await refused.aclose()  # nothing left to close
    engine, data = await _open(tmp_path, accept_data_loss=True)  # the lock is free
    assert data.data_loss is not None
    await _close(engine, data)


@pytest.mark.asyncio
async def test_a_lease_granted_then_revoked_stays_ended_after_a_reload(tmp_path: Path) -> None:
    engine, data = await _open(tmp_path, fsync="never")
    first = engine.lease_grant(60).id
    engine.lease_revoke(first)  # (no keys: its end is a record of its own)
    second = engine.lease_grant(60).id
    engine.put("k", b"v", second)
    engine.lease_revoke(second)  # (its key's delete and its end in one record)
    await _close(engine, data)
    restored, data = await _open(tmp_path)
    try:
        assert restored.lease_count == 0
        assert restored.get("k") is None
    finally:
        await data.aclose()
        restored.close()


@pytest.mark.asyncio
async def test_waiters_are_released_past_a_cancelled_one_and_kept_past_a_flush(
    tmp_path: Path, disk: Disk
) -> None:
    """A waiter cancelled before the flush does not hold up the ones after it; a write made
    while an fsync runs waits for the next one."""
    engine, data = await _open(tmp_path, fsync="always")
    engine.put("a", b"1")
    cancelled = asyncio.ensure_future(data.wait_durable())
    waiting = asyncio.ensure_future(data.wait_durable())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.wait_for(waiting, 10)
    disk.fsync_delay = 0.2
    engine.put("b", b"2")
    during = asyncio.ensure_future(data.wait_durable())
    await eventually(lambda: disk.fsyncing, 10, "the fsync for b running")
    engine.put("c", b"3")
    after = asyncio.ensure_future(data.wait_durable())
    await asyncio.wait_for(asyncio.gather(during, after), 10)
    assert data._synced == data.last_sequence
    await _close(engine, data)


@pytest.mark.asyncio
async def test_durability_costs_no_fsync_when_there_is_nothing_new(
    tmp_path: Path, disk: Disk
) -> None:
    engine, data = await _open(tmp_path, fsync="always")
    engine.put("a", b"1")
    await data.wait_durable()
    synced = disk.fsyncs
    for _ in range(3):
        await data.wait_durable()
    await asyncio.sleep(0.05)
    assert disk.fsyncs == synced
    await _close(engine, data)


@pytest.mark.asyncio
async def test_the_interval_policy_never_makes_a_writer_wait_for_the_flush(
    tmp_path: Path,
) -> None:
    engine, data = await _open(tmp_path, fsync="interval", fsync_interval=30)
    engine.put("a", b"1")
    await asyncio.wait_for(data.wait_durable(), 2)  # not 30 s: the policy promises no more
    await _close(engine, data)


@pytest.mark.asyncio
async def test_a_lease_restored_from_disk_and_then_revoked_stays_ended(tmp_path: Path) -> None:
    """(The first lease change after a restart is that lease's end: it is logged too.)"""
    engine, data = await _open(tmp_path, fsync="never")
    lease = engine.lease_grant(60).id
    await _close(engine, data)
    engine, data = await _open(tmp_path, fsync="never")
    engine.lease_revoke(lease)
    await _close(engine, data)
    engine, data = await _open(tmp_path)
    assert engine.lease_count == 0
    await _close(engine, data)


def _damage_line(path: Path, index: int) -> None:
    """Change one byte of the log's line ``index``: its checksum no longer matches."""
    lines = (path / WAL).read_bytes().splitlines(keepends=True)
    lines[index] = lines[index].replace(b'"', b"'", 1)
    (path / WAL).write_bytes(b"".join(lines))


@pytest.mark.asyncio
async def test_accepting_a_loss_ends_the_lease_ids_lost_and_keeps_the_live_ones(
    tmp_path: Path,
) -> None:
    engine, data = await _open(tmp_path, fsync="never")
    kept = engine.lease_grant(60).id
    engine.put("kept", b"v", kept)
    lost = engine.lease_grant(60).id  # its grant is in the damaged part: lost
    for i in range(3):
        engine.put(f"after{i}", b"v")
    await _close(engine, data)
    lines = (tmp_path / WAL).read_bytes().splitlines()
    grant = next(i for i, line in enumerate(lines) if b'"g":%d' % lost in line)
    _damage_line(tmp_path, grant)
    engine, data = await _open(tmp_path, fsync="never", accept_data_loss=True)
    try:
        assert engine.lease_time_to_live(kept).keys == ("kept",)  # alive, with its key
        with pytest.raises(LeaseNotFoundError):
            engine.lease_time_to_live(lost)  # its id is used up, and not alive
        assert engine.lease_grant(5).id == lost + 1
    finally:
        await data.aclose()
        engine.close()


@pytest.mark.asyncio
async def test_a_closed_directory_is_durable_and_closes_only_its_own_descriptors(
    tmp_path: Path,
) -> None:
    before = sorted(os.listdir("/proc/self/fd"))
    never = DataDir(tmp_path / "never")
    assert never.data_loss is None
    await never.aclose()  # never opened: closes no descriptor of anyone's
    assert sorted(os.listdir("/proc/self/fd")) == before
    engine, data = await _open(tmp_path, fsync="always")
    engine.put("a", b"1")
    await data.aclose()
    await data.wait_durable()  # closed: everything written was fsynced
    await data.aclose()  # twice: nothing more (its flusher is gone)
    engine.close()
    assert sorted(os.listdir("/proc/self/fd")) == before


@pytest.mark.asyncio
async def test_accepting_a_loss_that_holds_no_lease_keeps_the_newest_lease_alive(
    tmp_path: Path,
) -> None:
    engine, data = await _open(tmp_path, fsync="never")
    for i in range(3):
        engine.put(f"before{i}", b"v")
    newest = engine.lease_grant(60).id
    engine.put("kept", b"v", newest)
    for i in range(3):
        engine.put(f"after{i}", b"v")
    await _close(engine, data)
    _damage_line(tmp_path, -2)  # a plain put's record, after the lease's
    engine, data = await _open(tmp_path, fsync="never", accept_data_loss=True)
    try:
        assert engine.lease_time_to_live(newest).keys == ("kept",)  # not ended by the skip
        assert engine.lease_grant(5).id > newest
    finally:
        await data.aclose()
        engine.close()


@pytest.mark.asyncio
async def test_an_open_that_fails_after_opening_the_log_closes_it_and_the_lock(
    tmp_path: Path, disk: Disk
) -> None:
    engine, data = await _open(tmp_path, fsync="never")
    engine.put("a", b"1")
    await _close(engine, data)
    before = sorted(os.listdir("/proc/self/fd"))
    disk.fstat_error = errno.EIO  # (the log opened, then its size cannot be read)
    failed = DataDir(tmp_path, fsync="never")
    with pytest.raises(OSError, match="Input/output error"):
        failed.open(MemoryEngine())
    assert sorted(os.listdir("/proc/self/fd")) == before
    await failed.aclose()  # nothing left to close
    assert sorted(os.listdir("/proc/self/fd")) == before
    disk.fstat_error = None
    assert await _reloaded(tmp_path) == {"a": b"1"}  # the lock is free


@pytest.mark.asyncio
async def test_a_session_write_is_answered_only_once_durable(tmp_path: Path, disk: Disk) -> None:
    """Over the session, a write to a server with a data directory waits for its fsync: when
    the fsync fails, the write's outcome is unknown (it was applied, not made durable)."""
    async with (
        HttpStoreServer(port=0, data_dir=str(tmp_path)) as server,
        open_store(server.url) as store,
    ):
        await store.put("a", b"1")
        disk.fsync_error = errno.EIO
        with pytest.raises(WriteOutcomeUnknownError, match="the data directory failed"):
            await store.put("b", b"2")
        disk.fsync_error = None
