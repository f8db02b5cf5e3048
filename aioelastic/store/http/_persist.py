"""Durability for ``aioelastic serve --data-dir``: an append-only log plus snapshots.

Every change of the served :class:`~aioelastic.store.MemoryEngine` (a commit, a lease granted or
ended, an explicit compaction) is appended to ``wal.log`` by the engine's hooks, synchronously,
before the request that caused it is answered: after ``kill -9`` the kernel still has every
acknowledged record. When the log holds ``snapshot_every`` records, the whole engine is written to
``snapshot.json`` and a new log is started after it (each file replaced atomically).

Lines are checksummed and records numbered (:mod:`._persist_codec`); opening (:mod:`._persist_load`
reads, :mod:`._persist_open` decides) cuts only a partial last record, as a torn write, after
keeping its bytes aside. Any other damage is refused with :class:`CorruptDataDirError`, saying
what and how many records, unless ``accept_data_loss`` (then the damaged files are kept aside and
the server goes on from the last consistent state, with revisions and lease ids moved past any
on disk).

fsync policy (``fsync=``): ``"always"`` (default) — a write is answered only after an fsync covers
it, several concurrent writes sharing one fsync (group commit): nothing acknowledged is lost even
to a power cut. ``"interval"`` — fsync at most every ``fsync_interval`` seconds in the background:
a crash of the process loses nothing, a power cut loses at most that window. ``"never"`` — leave
it to the OS (fsync only at snapshots and on close).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from pathlib import Path
from typing import Any, Literal

from ..memory import Commit, LeaseChange, MemoryEngine
from ._persist_codec import (
    FORMAT,
    SNAPSHOT,
    WAL,
    encode_line,
    event_out,
    snapshot_document,
)
from ._persist_files import replace_file
from ._persist_load import Recovery, load
from ._persist_open import CorruptDataDirError, lock_dir, settle

__all__ = ["FSYNC_POLICIES", "CorruptDataDirError", "DataDir", "FsyncPolicy", "LogWriteError"]

log = logging.getLogger("aioelastic.serve")

FsyncPolicy = Literal["always", "interval", "never"]
FSYNC_POLICIES: tuple[FsyncPolicy, ...] = ("always", "interval", "never")


class LogWriteError(OSError):
    """The log could not be written, so the change it was to record was not made.

    ``full`` when the disk (or the file size limit) is full: ``ENOSPC``, ``EFBIG``, ``EDQUOT``.
    """

    @property
    def full(self) -> bool:
        return self.errno in _FULL


_FULL = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})


# -- the data directory --------------------------------------------------------------------------


class DataDir:
    """The data directory of one server: load it into an engine, then log every change.

    ``async with DataDir(path) as data: data.attach(engine)`` — or :meth:`open`, :meth:`attach`,
    :meth:`aclose`. Call :meth:`wait_durable` after a write and before acknowledging it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: FsyncPolicy = "always",
        fsync_interval: float = 0.05,
        snapshot_every: int = 10_000,
        accept_data_loss: bool = False,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, got {fsync!r}")
        if not fsync_interval > 0:
            raise ValueError(f"fsync_interval must be > 0 seconds, got {fsync_interval!r}")
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every!r}")
        self.path = Path(path)
        self.fsync = fsync
        self.fsync_interval = fsync_interval
        self.snapshot_every = snapshot_every
        self.accept_data_loss = accept_data_loss
        #: What was lost when a damaged directory was opened with ``accept_data_loss``.
        self.data_loss: str | None = None
        self._engine: MemoryEngine | None = None
        self._lock_fd = -1
        self._fd = -1
        self._seq = 0  # sequence number of the last record written
        self._records = 0  # records in the current log
        self._synced = 0  # the last sequence number covered by an fsync
        self._dirty = asyncio.Event()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None  # an fsync failed: nothing more is promised
        self._size = 0  # bytes in the log: where a record cut short by a full disk is cut off
        self._broken: LogWriteError | None = None  # the log ends in a partial record
        self._refusing = False  # the last write failed (logged once, until one succeeds)
        self._ended = 0  # the lease whose end the last commit record holds
        self.snapshots = 0

    # -- lifecycle

    def open(self, engine: MemoryEngine) -> None:
        """Lock the directory, load it into the fresh ``engine`` and log its changes from now."""
        self._lock_fd = lock_dir(self.path)
        try:
            self._recover(load(self.path, engine), engine)
        except BaseException:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise
        self._synced = self._seq
        self._engine = engine
        engine.on_commit.append(self._on_commit)
        engine.on_lease.append(self._on_lease)
        engine.on_compact.append(self._on_compact)
        if self.fsync != "never":
            self._task = asyncio.get_running_loop().create_task(
                self._flusher(), name="aioelastic-wal-flusher"
            )

    async def aclose(self) -> None:
        """Stop logging, fsync what was written and release the directory."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.on_commit.remove(self._on_commit)
            engine.on_lease.remove(self._on_lease)
            engine.on_compact.remove(self._on_compact)
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None
        if self._fd >= 0:
            os.fsync(self._fd)
            self._synced = self._seq
            os.close(self._fd)
            self._fd = -1
        self._release_waiters()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    @property
    def last_sequence(self) -> int:
        return self._seq

    # -- durability

    async def wait_durable(self) -> None:
        """Return once everything logged so far is as durable as the fsync policy promises."""
        if self._error is not None:
            raise self._error
        if self.fsync != "always" or self._synced >= self._seq:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((self._seq, future))
        self._dirty.set()
        await future

    async def _flusher(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.fsync == "interval":
                await asyncio.sleep(self.fsync_interval)
                if self._synced >= self._seq:
                    continue
            else:
                await self._dirty.wait()
                self._dirty.clear()
            target = self._seq
            try:
                await loop.run_in_executor(None, os.fsync, self._fd)
            except OSError as exc:  # a failing disk: refuse to acknowledge anything more
                log.error("fsync of %s failed: %s", self.path / WAL, exc)
                self._error = exc
                self._release_waiters(exc)
                return
            self._synced = max(self._synced, target)
            self._release_waiters()

    def _release_waiters(self, error: BaseException | None = None) -> None:
        keep: list[tuple[int, asyncio.Future[None]]] = []
        for seq, future in self._waiters:
            if future.done():
                continue
            if error is not None:
                future.set_exception(error)
            elif seq <= self._synced:
                future.set_result(None)
            else:
                keep.append((seq, future))
        self._waiters = keep

    # -- the hooks (synchronous: the record reaches the kernel before the reply is sent)

    def _append(self, record: dict[str, Any], *, snapshot: bool = True) -> None:
        """Write one whole record, or raise :class:`LogWriteError` leaving no part of it.

        ``snapshot=False``: the engine does not hold the change yet (a compaction is recorded
        before it is made), so a snapshot due now waits for the next record.
        """
        if self._fd < 0:
            return
        self._check_writable()
        record["q"] = self._seq + 1
        line = encode_line(record)
        written = 0
        try:
            while written < len(line):  # a short write (the disk filled up) goes on, or raises
                written += os.write(self._fd, memoryview(line)[written:])
        except OSError as exc:
            self._cut_back(written, exc)
            if not self._refusing:
                self._refusing = True
                log.error("%s cannot be written (%s): refusing writes until it can", WAL, exc)
            raise LogWriteError(
                exc.errno, f"the log {str(self.path / WAL)!r} cannot be written: {exc.strerror}"
            ) from exc
        if self._refusing:
            self._refusing = False
            log.warning("%s can be written again: taking writes", WAL)
        self._seq += 1
        self._size += written
        self._records += 1
        if snapshot and self._records >= self.snapshot_every and self._engine is not None:
            try:
                self._snapshot(self._engine)
            except OSError as exc:  # the record is safe in the log; try again later
                log.error("snapshot of %s failed (the log goes on): %s", self.path, exc)
                self._records = 0
                for name in (SNAPSHOT, WAL):  # each: the snapshot's may be renamed already
                    with contextlib.suppress(OSError):
                        os.unlink(self.path / (name + ".tmp"))
            else:
                self.snapshots += 1

    def _check_writable(self) -> None:
        if self._broken is not None:
            raise self._broken
        if self._error is not None:
            raise LogWriteError(
                errno.EIO,
                f"an fsync of the log failed ({self._error}): writes are refused until the "
                "server restarts",
            )

    def _cut_back(self, written: int, exc: OSError) -> None:
        """Cut a record that did not fit off the log (it was never acknowledged)."""
        if not written:
            return
        try:
            os.ftruncate(self._fd, self._size)
        except OSError as cut:  # appending after a partial record would make it damage
            log.error("cannot cut a partial record off %s: %s", self.path / WAL, cut)
            self._broken = LogWriteError(
                exc.errno,
                f"the log {str(self.path / WAL)!r} ends in a partial record that cannot be cut "
                f"off ({cut}): writes are refused until the server restarts",
            )

    def _on_commit(self, commit: Commit) -> None:
        record: dict[str, Any] = {"c": commit.revision, "e": [event_out(e) for e in commit.events]}
        if commit.ended_lease:  # one record: a lease's keys deleted and its end, or neither
            record["x"] = commit.ended_lease
        self._append(record)
        self._ended = commit.ended_lease

    def _on_lease(self, change: LeaseChange) -> None:
        ended, self._ended = self._ended, 0
        if change.ttl is None:
            if change.id != ended:  # (else its end is in the commit just written)
                self._append({"x": change.id})
        else:
            self._append({"g": change.id, "ttl": change.ttl})

    def _on_compact(self, revision: int) -> None:
        self._append({"k": revision}, snapshot=False)

    # -- snapshots

    def _snapshot(self, engine: MemoryEngine) -> None:
        """Write the whole engine to ``snapshot.json``, then start a new log after it.

        Each file is replaced atomically (temporary file, fsync, rename, directory fsync), the
        snapshot first: a crash in between leaves the old log, whose records the snapshot covers
        (they are skipped on load by sequence number).
        """
        state = engine.export_state()
        replace_file(self.path, SNAPSHOT, encode_line(snapshot_document(state, self._seq)))
        header = {
            "log": FORMAT,
            "after": self._seq,
            "revision": state.revision,
            "lease": state.last_lease_id,
        }
        replace_file(self.path, WAL, encode_line(header))
        fd = os.open(self.path / WAL, os.O_WRONLY | os.O_APPEND)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._size = os.fstat(fd).st_size
        self._synced = self._seq
        self._records = 0
        self._release_waiters()

    # -- opening (:mod:`._persist_open`): start from the last consistent state

    def _recover(self, found: Recovery, engine: MemoryEngine) -> None:
        self.data_loss = settle(self.path, found, engine, accept_data_loss=self.accept_data_loss)
        self._seq = found.sequence
        self._records = found.records
        if found.damage or found.legacy or not found.log_exists:
            if found.legacy and found.log_exists and not found.damage:
                log.info("rewriting data directory %s in format %d", self.path, FORMAT)
            self._snapshot(engine)
        else:
            self._fd = os.open(self.path / WAL, os.O_WRONLY | os.O_APPEND)
            self._size = os.fstat(self._fd).st_size
