"""Opening a ``serve --data-dir`` directory: its lock, and what to do with what loading found.

Damage is refused with :class:`CorruptDataDirError` (saying what, and how many records), or with
``accept_data_loss`` kept aside and accepted, revisions and lease ids moved past any on disk; a
torn last record (a write cut short by a crash) is kept aside and cut off.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from ..memory import Commit, MemoryEngine
from ._persist_codec import LOCK, SNAPSHOT, WAL
from ._persist_files import cut_file, keep_aside, write_aside
from ._persist_load import Recovery

__all__ = ["CorruptDataDirError", "lock_dir", "settle"]

log = logging.getLogger("aioelastic.serve")


class CorruptDataDirError(RuntimeError):
    """The data directory is damaged: the message says what, and how many records it affects."""


def lock_dir(path: Path) -> int:
    """Create ``path`` if needed and hold its lock file; the lock's descriptor.

    :class:`RuntimeError` when another server holds it.
    """
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise RuntimeError(f"data directory {str(path)!r} is in use by another server") from None
    return fd


def settle(
    path: Path, found: Recovery, engine: MemoryEngine, *, accept_data_loss: bool
) -> str | None:
    """Refuse damage, or keep it aside and accept the loss; cut a torn record.

    Returns what was lost (``None``: nothing). ``engine`` holds what was loaded.
    """
    if not found.damage:
        if found.torn_at is not None:
            _cut_torn(path, found)
        return None
    message = _damage_message(path, found, engine)
    if not accept_data_loss:
        raise CorruptDataDirError(
            f"{message} Nothing on disk was changed. Restore the damaged files from a "
            "copy, or start with accept_data_loss (serve --accept-data-loss) to go on "
            "from that state, the damaged files kept aside."
        )
    kept = [
        str(keep_aside(path, name, "damaged")) for name in (WAL, SNAPSHOT) if (path / name).exists()
    ]
    _skip_used_ids(engine, found)
    log.error(
        "ACCEPTING DATA LOSS (--accept-data-loss): %s The damaged files are kept as %s; "
        "the server goes on from there, at revision %d.",
        message,
        ", ".join(kept) or "(none)",
        engine.revision,
    )
    return message


def _cut_torn(path: Path, found: Recovery) -> None:
    """Keep a partial last record (a write cut short by a crash) aside, then cut it off."""
    assert found.torn_at is not None
    wal = path / WAL
    kept = write_aside(path, WAL, "torn", found.torn)
    log.warning(
        "cut a torn record (%d bytes, never acknowledged) off the end of %s at byte %d; "
        "the bytes are kept in %s",
        len(found.torn),
        wal,
        found.torn_at,
        kept,
    )
    cut_file(wal, found.torn_at)


def _records(n: int) -> str:
    return f"{n} record" if n == 1 else f"{n} records"


def _damage_message(path: Path, found: Recovery, engine: MemoryEngine) -> str:
    if found.count_known:
        verb = "is" if found.affected == 1 else "are"
        count = f"{_records(found.affected)} {verb} affected"
    elif found.affected:
        count = f"An unknown number of records (at least {found.affected}) are affected"
    else:
        count = "An unknown number of records are affected"
    return (
        f"data directory {str(path)!r} is damaged: {'; '.join(found.damage)}. {count}; the "
        f"last consistent state is record {found.sequence} (revision {engine.revision})."
    )


def _skip_used_ids(engine: MemoryEngine, found: Recovery) -> None:
    """After a loss, move the revision and lease ids past any on disk: none is handed out twice
    (a watcher or a lease holder may have seen the lost ones)."""
    if found.high_revision > engine.revision:
        engine.restore_commit(Commit(found.high_revision, ()))
    if found.high_lease > engine.export_state().last_lease_id:
        engine.restore_lease(found.high_lease, 1.0)
        engine.restore_lease_end(found.high_lease)
