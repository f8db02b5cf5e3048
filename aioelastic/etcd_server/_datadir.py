"""The members' data directory: the caller's (kept), or a throwaway one under the temporary
directory, named after its owner's pid so that the next owner removes one a SIGKILLed owner left
(60+ MB) once no etcd holds it."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

from .. import _tmpdirs

__all__ = ["TMP_PREFIX", "open_root", "remove_root", "wal_locked"]

TMP_PREFIX = "aioelastic-etcd-"  # + the owner's pid: see _tmpdirs


def wal_locked(directory: str) -> bool:
    """Whether an etcd still holds one of its WAL files under ``directory`` (etcd locks them;
    its OFD locks conflict with the POSIX lock tried here)."""
    for wal in Path(directory).glob("member-*/member/wal/*.wal"):
        try:
            fd = os.open(wal, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)  # releases the lock we may have taken
    return False


def open_root(given: Path | None) -> tuple[Path, bool]:
    """``(directory, owned)``: ``given`` (created if need be; not owned), else a new throwaway
    directory (owned: :func:`remove_root` removes it)."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        return given, False
    # a SIGKILLed owner cannot remove its throwaway dir (60+ MB): the next one does
    _tmpdirs.clean_stale_dirs(TMP_PREFIX, wal_locked)
    return Path(_tmpdirs.make_dir(TMP_PREFIX)), True


def remove_root(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
