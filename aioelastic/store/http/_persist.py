"""Durability for ``aioelastic serve --data-dir``: an append-only log plus snapshots.

Every change of the served :class:`~aioelastic.store.MemoryEngine` (a commit, a lease granted or
ended, an explicit compaction) is appended to ``wal.log`` by the engine's hooks, synchronously,
before the request that caused it is answered: after ``kill -9`` the kernel still has every
acknowledged record. When the log holds ``snapshot_every`` records, the whole engine is written to
``snapshot.json`` (atomically: temporary file, fsync, rename) and the log starts again.

Each log line is ``<crc32 hex> <json>``; a torn last line (a crash mid-write) is cut off on load,
a damaged line elsewhere stops the load with :class:`CorruptDataDirError`.

fsync policy (``fsync=``): ``"always"`` (default) — a write is answered only after an fsync covers
it, several concurrent writes sharing one fsync (group commit): nothing acknowledged is lost even
to a power cut. ``"interval"`` — fsync at most every ``fsync_interval`` seconds in the background:
a crash of the process loses nothing, a power cut loses at most that window. ``"never"`` — leave
it to the OS (fsync only at snapshots and on close).
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import json
import logging
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from .._types import EventType, KeyValue, WatchEvent
from ..memory import Commit, EngineState, LeaseChange, MemoryEngine

__all__ = ["FSYNC_POLICIES", "CorruptDataDirError", "DataDir", "FsyncPolicy"]

log = logging.getLogger("aioelastic.serve")

FsyncPolicy = Literal["always", "interval", "never"]
FSYNC_POLICIES: tuple[FsyncPolicy, ...] = ("always", "interval", "never")
FORMAT = 1
WAL = "wal.log"
SNAPSHOT = "snapshot.json"
LOCK = "LOCK"


class CorruptDataDirError(RuntimeError):
    """The data directory cannot be loaded: a damaged log line or snapshot (names the file)."""


# -- encoding ------------------------------------------------------------------------------------


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _kv_out(kv: KeyValue) -> list[Any]:
    return [kv.key, _b64(kv.value), kv.create_revision, kv.mod_revision, kv.version, kv.lease]


def _kv_in(row: list[Any]) -> KeyValue:
    key, value, create, mod, version, lease = row
    return KeyValue(key, base64.b64decode(value), create, mod, version, lease)


def _event_out(event: WatchEvent) -> list[Any]:
    if event.type is EventType.PUT:
        return ["P", *_kv_out(event.kv)]
    return ["D", event.kv.key, event.kv.mod_revision]


def _event_in(row: list[Any]) -> WatchEvent:
    if row[0] == "P":
        return WatchEvent(EventType.PUT, _kv_in(row[1:]))
    return WatchEvent(EventType.DELETE, KeyValue(row[1], b"", 0, row[2], 0, 0))


def _line(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _parse_line(line: bytes) -> dict[str, Any] | None:
    """The record on ``line``, or None if it is damaged (bad checksum, torn, not JSON)."""
    if len(line) < 10 or line[8:9] != b" " or not line.endswith(b"\n"):
        return None
    body = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return None
        record = json.loads(body)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("q"), int) else None


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
        self._engine: MemoryEngine | None = None
        self._lock_fd = -1
        self._fd = -1
        self._seq = 0  # sequence number of the last record written
        self._records = 0  # records in the current log
        self._synced = 0  # the last sequence number covered by an fsync
        self._dirty = asyncio.Event()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self.snapshots = 0

    # -- lifecycle

    def open(self, engine: MemoryEngine) -> None:
        """Lock the directory, load it into the fresh ``engine`` and log its changes from now."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise RuntimeError(
                f"data directory {str(self.path)!r} is in use by another server"
            ) from None
        try:
            self._load(engine)
            self._fd = os.open(self.path / WAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except BaseException:
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

    def _append(self, record: dict[str, Any]) -> None:
        if self._fd < 0:
            return
        self._seq += 1
        record["q"] = self._seq
        os.write(self._fd, _line(record))
        self._records += 1
        if self._records >= self.snapshot_every and self._engine is not None:
            self._snapshot(self._engine)

    def _on_commit(self, commit: Commit) -> None:
        self._append({"c": commit.revision, "e": [_event_out(e) for e in commit.events]})

    def _on_lease(self, change: LeaseChange) -> None:
        if change.ttl is None:
            self._append({"x": change.id})
        else:
            self._append({"g": change.id, "ttl": change.ttl})

    def _on_compact(self, revision: int) -> None:
        self._append({"k": revision})

    # -- snapshots

    def _snapshot(self, engine: MemoryEngine) -> None:
        """Write the whole engine to ``snapshot.json`` atomically, then empty the log."""
        state = engine.export_state()
        document = {
            "format": FORMAT,
            "q": self._seq,
            "revision": state.revision,
            "compact_revision": state.compact_revision,
            "last_lease_id": state.last_lease_id,
            "leases": [[lease_id, ttl] for lease_id, ttl in state.leases.items()],
            "kvs": [_kv_out(kv) for kv in state.kvs],
            "history": [_event_out(e) for e in state.history],
        }
        tmp = self.path / (SNAPSHOT + ".tmp")
        with open(tmp, "wb") as f:
            f.write(json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path / SNAPSHOT)
        self._fsync_dir()
        # The snapshot covers every record so far: records of the old log are skipped on load
        # (by sequence number) even if a crash comes before this truncation.
        os.ftruncate(self._fd, 0)
        os.fsync(self._fd)
        self._synced = self._seq
        self._records = 0
        self.snapshots += 1
        self._release_waiters()

    def _fsync_dir(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- loading

    def _load(self, engine: MemoryEngine) -> None:
        snapshot_seq = 0
        snapshot_path = self.path / SNAPSHOT
        if snapshot_path.exists():
            try:
                document = json.loads(snapshot_path.read_bytes())
                if document.get("format") != FORMAT:
                    raise ValueError(f"unknown format {document.get('format')!r}")
                state = EngineState(
                    revision=document["revision"],
                    compact_revision=document["compact_revision"],
                    kvs=tuple(_kv_in(row) for row in document["kvs"]),
                    history=tuple(_event_in(row) for row in document["history"]),
                    leases={int(i): float(t) for i, t in document["leases"]},
                    last_lease_id=document["last_lease_id"],
                )
                snapshot_seq = int(document["q"])
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise CorruptDataDirError(
                    f"snapshot {str(snapshot_path)!r} is damaged: {exc}"
                ) from None
            engine.restore(state)
        self._seq = snapshot_seq
        wal_path = self.path / WAL
        if not wal_path.exists():
            return
        for record in self._read_wal(wal_path):
            seq = record["q"]
            if seq <= snapshot_seq:
                continue
            try:
                self._replay(engine, record)
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise CorruptDataDirError(
                    f"log {str(wal_path)!r}: record {seq} cannot be replayed: {exc}"
                ) from None
            self._seq = seq
            self._records += 1

    def _read_wal(self, wal_path: Path) -> Iterator[dict[str, Any]]:
        with open(wal_path, "rb") as f:
            data = f.read()
        offset = 0
        lines = data.splitlines(keepends=True)
        for index, line in enumerate(lines):
            record = _parse_line(line)
            if record is None:
                rest = lines[index + 1 :]
                if any(_parse_line(other) is not None for other in rest):
                    raise CorruptDataDirError(
                        f"log {str(wal_path)!r} is damaged at byte {offset} (a later record is "
                        "intact, so this is not a torn write)"
                    )
                log.warning("cutting a torn record off the end of %s at byte %d", wal_path, offset)
                with open(wal_path, "r+b") as f:
                    f.truncate(offset)
                    f.flush()
                    os.fsync(f.fileno())
                return
            offset += len(line)
            yield record

    @staticmethod
    def _replay(engine: MemoryEngine, record: dict[str, Any]) -> None:
        if "c" in record:
            events = tuple(_event_in(row) for row in record["e"])
            engine.restore_commit(Commit(int(record["c"]), events))
        elif "g" in record:
            engine.restore_lease(int(record["g"]), float(record["ttl"]))
        elif "x" in record:
            engine.restore_lease_end(int(record["x"]))
        elif "k" in record:
            engine.restore_compact(int(record["k"]))
        else:
            raise ValueError(f"unknown record {sorted(record)}")
